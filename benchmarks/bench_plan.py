"""Planner quality and speed, and manifest building throughput.

Command (what docs/benchmarks.md's tables come from):

    .venv/bin/python benchmarks/bench_plan.py                 # ~3 min
    .venv/bin/python benchmarks/bench_plan.py --rows 2000000  # quicker throughput rows

1. Quality, mixture A (200,000 samples, seed 0), the design document's 24-layer D=1024 model,
   bf16 training, on an H100-SXM budget, flash and eager attention: tokenbucket's static (≤ 32
   buckets) and dynamic plans against (a) equal-count quantile bounds and (b) equal-width
   bounds — both given the same cost model's batch sizes, which is already more than the
   peers' linear token budgets do — and (c) the sort-everything-then-fill-greedily oracle,
   which ignores shuffling and shape count. Samples that fit not even alone are rejected
   first, the same for every method.
2. Speed: histogram + plan of ``--rows`` lengths already in memory; building a manifest from a
   ``--rows``-row Parquet metadata file end to end (two passes, write, rename), with the
   process's peak resident memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes
from tokenbucket.plan._search import max_batch_table
from tokenbucket.plan.buckets import BucketPlan, plan_buckets
from tokenbucket.testing import mixture_a

DATA = Path(__file__).parent / "_data"


def fixed_bounds(lengths: np.ndarray, bounds: np.ndarray, cost: CostModel, budget: int) -> dict[str, float]:
    """Static batches for given bounds, batch sizes from the cost model at each bound."""
    bounds = np.unique(bounds)
    sizes = max_batch_table(cost, bounds, budget)
    pos = np.searchsorted(bounds, lengths, side="left")
    batches = padded = 0
    seconds = 0.0
    over = 0
    for k, (u, b) in enumerate(zip(bounds.tolist(), sizes.tolist(), strict=True)):
        n = int((pos == k).sum())
        if not n:
            continue
        nb = -(-n // b)
        batches += nb
        padded += nb * b * u
        seconds += nb * cost.step_seconds(b, u)
        over += nb if cost.memory(b, u).total > budget else 0
    return {
        "batches": batches,
        "padding_efficiency": float(lengths.sum()) / padded,
        "seconds": seconds,
        "over_budget": over,
        "shapes": len(bounds),
    }


def oracle(lengths: np.ndarray, cost: CostModel, budget: int) -> dict[str, float]:
    ordered = np.sort(lengths)
    caps = max_batch_table(cost, ordered, budget)
    batches, begin, padded = 0, 0, 0
    for i in range(len(ordered)):
        if i + 1 - begin > caps[i]:
            batches += 1
            padded += (i - begin) * int(ordered[i - 1])
            begin = i
    batches += 1
    padded += (len(ordered) - begin) * int(ordered[-1])
    return {"batches": batches, "padding_efficiency": float(ordered.sum()) / padded}


def quality() -> None:
    lengths = breakdown_table(mixture_a(200_000, seed=0), TokenSpec(patch=14)).totals
    budget = gpu_budget_bytes("H100-SXM")
    print(f"mixture A, 200,000 samples; design-24L-1024 bf16 training; H100-SXM budget {budget / 2**30:.1f} GiB\n")
    print(
        "| attention | method | shapes | batches | vs oracle | padding efficiency | predicted epoch h | over budget |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for attention in ("flash", "eager"):
        cost = CostModel(dataclasses.replace(ModelSpec.preset("design-24L-1024"), attention=attention), "H100-SXM")
        static = plan_buckets(lengths, cost, budget, max_buckets=32, on_oversize="reject")
        kept = lengths[static.assign(lengths) >= 0]
        orc = oracle(kept, cost, budget)
        dynamic = plan_buckets(lengths, cost, budget, max_buckets=32, mode="dynamic", on_oversize="reject")
        q = np.quantile(kept, np.linspace(0, 1, 33)[1:], method="higher").astype(np.int64)
        w = np.linspace(kept.min(), kept.max(), 33)[1:].astype(np.int64)
        w[-1] = kept.max()
        rows = [
            ("tokenbucket static", static.summary()),
            ("tokenbucket dynamic", dynamic.summary()),
            ("quantile bounds (32)", fixed_bounds(kept, q, cost, budget)),
            ("equal-width bounds (32)", fixed_bounds(kept, w, cost, budget)),
        ]
        for name, s in rows:
            seconds = s.get("predicted_epoch_seconds", s.get("seconds", 0.0))
            over = s.get("over_budget_batches", s.get("over_budget", 0))
            shapes = s["shapes"] if s["shapes"] is not None else "dynamic"
            print(
                f"| {attention} | {name} | {shapes} | {s['batches']:,} | {s['batches'] / orc['batches'] - 1:+.1%} | "
                f"{s['padding_efficiency']:.3f} | {seconds / 3600:,.2f} | {over} |"
            )
        print(
            f"| {attention} | sort-all oracle | — | {orc['batches']:,} | 0 | {orc['padding_efficiency']:.3f} | — | 0 |"
        )
        print(
            f"| {attention} | (rejected: fit not even alone) | | {static.oversize.get('count', 0):,} samples "
            f"> {static.oversize.get('longest_fitting', 0):,} tokens | | | | |"
        )


def speed(rows: int) -> None:
    DATA.mkdir(exist_ok=True)
    path = DATA / f"mixture_a_{rows}.parquet"
    if not path.exists():
        pq.write_table(mixture_a(rows, seed=0), path, row_group_size=1_000_000)
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    budget = gpu_budget_bytes("H100-SXM")
    lengths = breakdown_table(pq.read_table(path), TokenSpec(patch=14)).totals
    start = time.perf_counter()
    plan = plan_buckets(lengths, cost, budget, max_buckets=32, on_oversize="reject")
    t_plan = time.perf_counter() - start
    del lengths
    # The build runs in its own process, so its peak memory is its own (not this process's table).
    code = (
        "import time\n"
        "from tokenbucket import CostModel, ModelSpec, TokenSpec, gpu_budget_bytes\n"
        "from tokenbucket.plan.manifest import build_manifest\n"
        "start = time.perf_counter()\n"
        f"m = build_manifest({str(path)!r}, TokenSpec(patch=14), CostModel(ModelSpec.preset('design-24L-1024'), "
        f"'H100-SXM'), {str(DATA / 'manifest.parquet')!r}, budget_bytes=gpu_budget_bytes('H100-SXM'), "
        "on_oversize='reject', progress=False)\n"
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent that forked us
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print(time.perf_counter() - start, int(hwm) / 1024, m.plan.to_json())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    t_build_s, peak_s, plan_json = proc.stdout.split(" ", 2)
    t_build, peak_mib = float(t_build_s), float(peak_s)
    assert BucketPlan.from_json(plan_json) == plan, "the streamed build must plan what one pass plans"
    print("\n| step | rows | seconds | rows/s |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| histogram + plan (lengths in memory) | {rows:,} | {t_plan:.2f} | {rows / t_plan / 1e6:.1f} M |")
    print(
        f"| build manifest from Parquet (2 passes, write, rename) | {rows:,} | {t_build:.2f} | "
        f"{rows / t_build / 1e6:.2f} M |"
    )
    print(
        f"\npeak resident memory of the manifest build: {peak_mib:,.0f} MiB for {rows:,} rows "
        f"(input read in 1M-row batches; output {(DATA / 'manifest.parquet').stat().st_size / 2**20:,.0f} MiB)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args(argv)
    if not args.skip_quality:
        quality()
    speed(args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
