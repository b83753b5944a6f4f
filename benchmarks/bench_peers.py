"""Side by side with the peers: one workload, one cost model, every strategy scored by the same code.

Command (what docs/benchmarks.md's peer table comes from; the peers come with the ``bench`` extra):

    .venv/bin/pip install -c requirements-dev.txt -e '.[bench]'
    .venv/bin/python benchmarks/bench_peers.py            # ~5 min on the 2-core VM

Workload: mixture A, 200,000 samples (seed 0), ``TokenSpec(patch=14)``; the design document's
24-layer D=1024 model, bf16 training, on an H100-SXM budget; once with flash attention and once
with eager. Samples that fit not even alone are removed first, the same for every strategy.

Strategies, each in its own process (build time, iteration time and peak memory above the
imports are that process's), each returning its batches as index lists:

* random: shuffled, fixed batch size B = the largest whose batch of p99-length samples fits;
* HF ``LengthGroupedSampler`` (transformers) with the same B (mega-batches sorted by length);
* both again with the B a user tunes for throughput: the largest whose batch of median-length
  samples fits (the other side of a fixed batch size: fewer steps, batches over the budget);
* lhotse ``DynamicBucketingSampler``, one dummy cut per sample with duration = tokens / 100,
  30 buckets, ``max_duration`` = the token budget a linear-in-tokens rule allows (fitted to the
  cost model: peak = static + a·tokens + b·tokens² per sample) and, where the attention term
  matters (eager), ``quadratic_duration`` = a / b; and again with an explicit per-bucket batch
  size (``FixedBucketBatchSizeConstraint``, the cost model's largest batch at each bucket's
  upper bound);
* the oracle: every sample sorted by length, batches filled greedily while they fit (best
  padding, no randomness, a new shape almost every batch);
* tokenbucket static (at most 32 shapes) and dynamic (``BucketBatchSampler``), and packed
  (``plan_buckets(mode="packed")`` + ``PackedBatchSampler``: whole samples packed into rows of
  one shape, attention kept within each sample).

Scored per batch at the shape it is padded to: the peers' and dynamic batches at
(samples, longest), static ones at their bucket's (batch size, bound), packed ones at
(rows per batch, pack length). Columns: batches per
epoch, padding efficiency (real tokens / padded), mean fill of the budget, batches predicted
over the budget (the OOM proxy), distinct shapes, build and iteration seconds, and the peak
resident memory above what the process held after its imports (lhotse's CutSet counts: it is
the form lhotse needs the data in).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes
from tokenbucket.cost.step_time import FixedCost
from tokenbucket.testing import mixture_a

NO_FIXED = FixedCost(0, 0, 0)

N = 200_000
GPU = "H100-SXM"

COMMON = """
import dataclasses, json, sys, time
import numpy as np
from tokenbucket import CostModel, ModelSpec, gpu_budget_bytes
lengths = np.load({lengths!r})
attention = {attention!r}
cost = CostModel(dataclasses.replace(ModelSpec.preset("design-24L-1024"), attention={attention!r}), {gpu!r})
budget = gpu_budget_bytes({gpu!r})
p99_batch = max(1, cost.max_batch(int(np.percentile(lengths, 99)), budget))
median_batch = max(1, cost.max_batch(int(np.median(lengths)), budget))
def hwm(key):
    return int([l for l in open("/proc/self/status") if l.startswith(key)][0].split()[1]) / 1024
base = hwm("VmRSS")
def finish(batches, shapes, t_build, t_iter):
    flat = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
    np.savez({out!r}, flat=flat, offsets=np.cumsum([0] + [len(b) for b in batches]),
             shapes=np.asarray(shapes, dtype=np.int64).reshape(-1, 2))
    print(json.dumps({{"build": t_build, "iterate": t_iter, "peak_mib": hwm("VmHWM") - base}}))
def natural(batches):
    return [(len(b), int(lengths[b].max())) for b in batches]
"""

RANDOM = """
start = time.perf_counter()
order = np.random.default_rng(0).permutation(len(lengths))
t_build = time.perf_counter() - start
start = time.perf_counter()
batches = [order[i:i + B] for i in range(0, len(order), B)]
t_iter = time.perf_counter() - start
finish(batches, natural(batches), t_build, t_iter)
"""

HF = """
import torch
from transformers.trainer_pt_utils import LengthGroupedSampler
base = hwm("VmRSS")
start = time.perf_counter()
sampler = LengthGroupedSampler(B, lengths=lengths.tolist(), generator=torch.Generator().manual_seed(0))
t_build = time.perf_counter() - start
start = time.perf_counter()
order = np.fromiter(iter(sampler), dtype=np.int64, count=len(lengths))
batches = [order[i:i + B] for i in range(0, len(order), B)]  # the Trainer's DataLoader
t_iter = time.perf_counter() - start
finish(batches, natural(batches), t_build, t_iter)
"""

STRATEGIES = {
    "random, fixed batch (fits p99)": "B = p99_batch" + RANDOM,
    "HF LengthGroupedSampler (fits p99)": "B = p99_batch" + HF,
    # the batch size a user tunes for throughput on typical samples: the other side of a fixed size
    "random, fixed batch (fits median)": "B = median_batch" + RANDOM,
    "HF LengthGroupedSampler (fits median)": "B = median_batch" + HF,
    "lhotse DynamicBucketingSampler": """
import warnings
warnings.simplefilter("ignore")
from lhotse import CutSet
from lhotse.dataset.sampling import DynamicBucketingSampler
from lhotse.testing.dummies import dummy_cut
base = hwm("VmRSS")
# the cost model as lhotse's per-cut rule: static + a*L + b*L^2 (exact for this model family)
L = np.array([2048, 4096, 8192])
f = np.array([cost.memory(1, int(x)).total for x in L], dtype=np.float64)
s, a, b = np.linalg.solve(np.stack([np.ones(3), L, L.astype(np.float64) ** 2], 1), f)
quadratic = a / b / 100 if b > 0 and attention == "eager" else None
cuts = CutSet.from_cuts(dummy_cut(i, duration=float(x) / 100) for i, x in enumerate(lengths.tolist()))
start = time.perf_counter()
sampler = DynamicBucketingSampler(cuts, max_duration=(budget - s) / a / 100, num_buckets=30, shuffle=True, seed=0,
                                  quadratic_duration=quadratic)
t_build = time.perf_counter() - start
start = time.perf_counter()
batches = [np.array([int(c.id.split("-")[-1]) if not c.id.isdigit() else int(c.id) for c in batch]) for batch in sampler]
t_iter = time.perf_counter() - start
finish(batches, natural(batches), t_build, t_iter)
""",
    "lhotse + per-bucket batch sizes": """
import warnings
warnings.simplefilter("ignore")
from lhotse import CutSet
from lhotse.dataset.sampling import DynamicBucketingSampler
from lhotse.dataset.sampling.dynamic_bucketing import FixedBucketBatchSizeConstraint, estimate_duration_buckets
from lhotse.testing.dummies import dummy_cut
base = hwm("VmRSS")
cuts = CutSet.from_cuts(dummy_cut(i, duration=float(x) / 100) for i, x in enumerate(lengths.tolist()))
start = time.perf_counter()
bins = list(estimate_duration_buckets(cuts, num_buckets=30))
uppers = bins + [float(lengths.max()) / 100]
sizes = [max(1, cost.max_batch(int(round(u * 100)), budget)) for u in uppers]
sampler = DynamicBucketingSampler(cuts, constraint=FixedBucketBatchSizeConstraint(uppers, sizes), duration_bins=bins,
                                  shuffle=True, seed=0)
t_build = time.perf_counter() - start
start = time.perf_counter()
batches = [np.array([int(c.id.split("-")[-1]) if not c.id.isdigit() else int(c.id) for c in batch]) for batch in sampler]
t_iter = time.perf_counter() - start
finish(batches, natural(batches), t_build, t_iter)
""",
    "oracle: sort all, fill greedily": """
from tokenbucket.plan._search import max_batch_table
base = hwm("VmRSS")
start = time.perf_counter()
order = np.argsort(lengths, kind="stable")
t_build = time.perf_counter() - start
start = time.perf_counter()
caps = max_batch_table(cost, lengths[order], budget).tolist()
batches, begin = [], 0
for i in range(len(order)):
    if i + 1 - begin > caps[i]:  # ascending: sample i is the batch's longest, its cap bounds the batch
        batches.append(order[begin:i])
        begin = i
batches.append(order[begin:])
t_iter = time.perf_counter() - start
finish(batches, natural(batches), t_build, t_iter)
""",
    "tokenbucket static (≤ 32 shapes)": """
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.train.sampler import BucketBatchSampler, plan_id_of
base = hwm("VmRSS")
start = time.perf_counter()
plan = plan_buckets(lengths, cost, budget, max_buckets=32)
buckets = plan.assign(lengths)
sampler = BucketBatchSampler(buckets, plan.batch_sizes.tolist(), plan_id=plan_id_of(plan.to_json()), seed=0)
n = len(sampler)
t_build = time.perf_counter() - start
start = time.perf_counter()
batches = [np.asarray(b) for b in sampler]
t_iter = time.perf_counter() - start
shapes = [(plan.buckets[buckets[b[0]]].batch_size, plan.buckets[buckets[b[0]]].bound) for b in batches]
finish(batches, shapes, t_build, t_iter)
""",
    "tokenbucket dynamic": """
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.train.sampler import BucketBatchSampler, plan_id_of
base = hwm("VmRSS")
start = time.perf_counter()
plan = plan_buckets(lengths, cost, budget, max_buckets=32, mode="dynamic")
sampler = BucketBatchSampler(plan.assign(lengths), plan.batch_sizes.tolist(), plan_id=plan_id_of(plan.to_json()),
                             seed=0, dynamic=(lengths, cost, budget, 32))
n = len(sampler)
t_build = time.perf_counter() - start
start = time.perf_counter()
batches = [np.asarray(b) for b in sampler]
t_iter = time.perf_counter() - start
finish(batches, natural(batches), t_build, t_iter)
""",
    "tokenbucket packed (1 shape)": """
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.train.packing import PackedBatchSampler
from tokenbucket.train.sampler import plan_id_of
base = hwm("VmRSS")
start = time.perf_counter()
plan = plan_buckets(lengths, cost, budget, mode="packed")
b = plan.buckets[0]
sampler = PackedBatchSampler(lengths, b.bound, b.batch_size, plan_id=plan_id_of(plan.to_json()), seed=0)
n = len(sampler)
t_build = time.perf_counter() - start
start = time.perf_counter()
batches = [np.asarray(x) for x in sampler]
t_iter = time.perf_counter() - start
finish(batches, [(b.batch_size, b.bound)] * len(batches), t_build, t_iter)
""",
}

PEERS = {
    "HF LengthGroupedSampler (fits p99)": "transformers",
    "HF LengthGroupedSampler (fits median)": "transformers",
    "lhotse DynamicBucketingSampler": "lhotse",
    "lhotse + per-bucket batch sizes": "lhotse",
}


def run_strategy(code: str, lengths_path: Path, attention: str, out: Path) -> dict[str, float]:
    """Run one strategy in its own process; its batches land in ``out``, its timings come back."""
    program = COMMON.format(lengths=str(lengths_path), attention=attention, gpu=GPU, out=str(out)) + code
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1])
    timing: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return timing


def score(lengths: np.ndarray, npz: Path, cost: CostModel, budget: int) -> dict[str, float]:
    data = np.load(npz)
    flat, shapes = data["flat"], data["shapes"]
    if len(np.unique(flat)) != len(flat) or len(flat) != len(lengths):
        raise AssertionError(f"{npz.name}: the batches do not hold every sample exactly once")
    peaks = np.array([cost.memory(int(b), int(n)).total for b, n in shapes.tolist()], dtype=np.float64)
    # predicted epoch: every batch at its padded shape, under the step-time model (NOTE [ Step
    # time ]: a fixed cost per step, utilisation by tokens per step) and under the old flat one
    # (FLOPs at a flat 40 % of peak); summed per distinct shape
    unique, counts = np.unique(shapes, axis=0, return_counts=True)
    flat_model = cost.step_time.flat()
    epoch = flat_epoch = 0.0
    for (b, n), c in zip(unique.tolist(), counts.tolist(), strict=True):
        epoch += c * cost.step_seconds(int(b), int(n))
        flat_epoch += c * flat_model.seconds(cost.flops(int(b), int(n)).training, b * n, fixed=NO_FIXED).total
    return {
        "epoch_h": epoch / 3600,
        "flat_epoch_h": flat_epoch / 3600,
        "batches": len(shapes),
        "padding_efficiency": float(lengths.sum()) / float((shapes[:, 0] * shapes[:, 1]).sum()),
        "mean_fill": float((peaks / budget).mean()),
        "over_budget": int((peaks > budget).sum()),
        "shapes": len({tuple(s) for s in shapes.tolist()}),
    }


def main() -> int:
    import importlib.util

    all_lengths = breakdown_table(mixture_a(N, seed=0), TokenSpec(patch=14)).totals
    budget = gpu_budget_bytes(GPU)
    print(f"mixture A, {N:,} samples; design-24L-1024, bf16 training, {GPU} budget {budget / 2**30:.2f} GiB\n")
    print(
        "| attention | strategy | batches | padding efficiency | mean fill | over budget | shapes "
        "| epoch h (flat 40 %) | epoch h (step-time model) | build s | iterate s | peak MiB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for attention in ("flash", "eager"):
            cost = CostModel(dataclasses.replace(ModelSpec.preset("design-24L-1024"), attention=attention), GPU)
            fits = np.asarray(all_lengths <= _longest_fitting(cost, budget))
            lengths = all_lengths[fits]
            path = Path(tmp) / f"lengths_{attention}.npy"
            np.save(path, lengths)
            for number, (name, code) in enumerate(STRATEGIES.items()):
                needs = PEERS.get(name)
                if needs is not None and importlib.util.find_spec(needs) is None:
                    print(f"| {attention} | {name} | ({needs} not installed: pip install -e '.[bench]') |||||||||||")
                    continue
                out = Path(tmp) / f"{attention}_{number}.npz"
                try:
                    timing = run_strategy(code, path, attention, out)
                except RuntimeError as exc:
                    print(f"| {attention} | {name} | failed: {str(exc)[:120]} |||||||||||")
                    continue
                r = score(lengths, out, cost, budget)
                # a packed row attends within each sample, not over its whole length: its step is
                # not (rows, pack length) of the block model's attention, so no epoch is given here
                epochs = "— | —" if "packed" in name else f"{r['flat_epoch_h']:.2f} | {r['epoch_h']:.2f}"
                print(
                    f"| {attention} | {name} | {r['batches']:,} | {r['padding_efficiency']:.3f} | "
                    f"{r['mean_fill']:.3f} | {r['over_budget']:,} | {r['shapes']:,} | {epochs} | {timing['build']:.2f} | "
                    f"{timing['iterate']:.2f} | {timing['peak_mib']:,.0f} |",
                    flush=True,
                )
            print(
                f"| {attention} | (removed first: fit not even alone) | {int((~fits).sum()):,} samples |||||||||||",
                flush=True,
            )
            fixed = [max(1, cost.max_batch(int(q), budget)) for q in np.percentile(lengths, [99, 50])]
            print(
                f"| {attention} | (fixed batch sizes: fits p99 = {fixed[0]}, fits median = {fixed[1]}) |||||||||||",
                flush=True,
            )
    return 0


def _longest_fitting(cost: CostModel, budget: int) -> int:
    lo, hi = 1, 1 << 22
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost.memory(1, mid).total <= budget else (lo, mid)
    return lo


if __name__ == "__main__":
    sys.exit(main())
