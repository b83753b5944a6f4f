"""Step time you can trust: what the fixed costs change, and how well calibration recovers a run.

Command (docs/benchmarks.md's step-time tables; ~3 min on the 2-core VM):

    .venv/bin/python benchmarks/bench_step_time.py            # all three parts
    .venv/bin/python benchmarks/bench_step_time.py plans      # or one: plans | synthetic | demo

* ``plans`` — mixture A (200,000 samples, ``TokenSpec(patch=14)``), the design document's
  24-layer D=1024 model, bf16 training, flash and eager, on an H100-SXM and on an L4 (a quarter
  of the memory, a tenth of the bandwidth: small batches, a larger fixed cost): the plan the planner picks under the old flat model (FLOPs at 40 % of peak)
  and under the step-time model (NOTE [ Step time ]), and batch size 1 for every sample, each
  priced under both models.
* ``synthetic`` — a log of known parameters (fixed cost, mfu, T_knee), written by a real
  ``BucketMonitor`` whose clock advances by the model's time for each step with 2 % noise: 40
  steps at each of a 16-bucket plan's bounds (lengths 64..60,000, log-uniform), each of 1, B/8,
  B/2 or B rows, so the steps lie on both sides of the knee; the calibration
  of that log (``calibrate_log``) beside the truth.
* ``demo`` — the demo's CPU training run (``tokenbucket demo``'s step 5), in three pairs of runs
  of 1,536 samples each (the demo trains 384) on different seeds: calibrated on the first of a pair, scored per bucket on both (the same
  run and held out), beside step time proportional to FLOPs (the old model's form, its one
  constant fitted to the same run). CPU step times are noisy on a shared machine: run it alone.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes, plan_buckets
from tokenbucket.cost.step_time import FixedCost, StepTime
from tokenbucket.testing import mixture_a

N = 200_000
NO_FIXED = FixedCost(0, 0, 0)
SAMPLES = 1536  # the demo trains 384; four times that gives each bucket ~4x the steps to fit and score


def flat(cost: CostModel) -> CostModel:
    """The same model timed the old way: FLOPs at a flat ``mfu`` of peak, no fixed cost."""
    st = cost.step_time
    assert st is not None
    return CostModel(cost.model, cost.gpu, step_time=st.flat())


def epoch_hours(cost: CostModel, shapes: list[tuple[int, int, int]]) -> float:
    """``shapes``: (count, batch, length)."""
    return sum(c * cost.step_seconds(b, n) for c, b, n in shapes) / 3600


def plans() -> None:
    lengths_all = breakdown_table(mixture_a(N, seed=0), TokenSpec(patch=14)).totals
    print(f"mixture A, {N:,} samples; design-24L-1024 bf16 training\n")
    print(
        "| attention | GPU | plan chosen under | buckets | batches | mean fill | padding efficiency "
        "| epoch h (flat 40 %) | epoch h (step-time model) |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for attention in ("flash", "eager"):
        for gpu in ("H100-SXM", "L4"):
            model = dataclasses.replace(ModelSpec.preset("design-24L-1024"), attention=attention)
            cost = CostModel(model, gpu)
            old = flat(cost)
            budget = gpu_budget_bytes(gpu)
            longest = 1
            while cost.memory(1, longest * 2).total <= budget:
                longest *= 2
            lo, hi = longest, longest * 2
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if cost.memory(1, mid).total <= budget else (lo, mid)
            lengths = lengths_all[lengths_all <= lo]
            rows = []
            for label, planner in (("flat 40 %", old), ("step-time model", cost)):
                plan = plan_buckets(lengths, planner, budget, max_buckets=32, on_oversize="reject")
                shapes = [(b.batches, b.batch_size, b.bound) for b in plan.buckets]
                s = plan.summary()
                rows.append((label, len(plan.buckets), s["batches"], s["mean_fill"], s["padding_efficiency"], shapes))
            uniq, counts = np.unique(lengths, return_counts=True)
            ones = [(int(c), 1, int(n)) for n, c in zip(uniq, counts, strict=True)]
            for label, k, batches, fill, pad, shapes in rows:
                print(
                    f"| {attention} | {gpu} | {label} | {k} | {batches:,} | {fill:.3f} | {pad:.3f} | "
                    f"{epoch_hours(old, shapes):.2f} | {epoch_hours(cost, shapes):.2f} |"
                )
            print(
                f"| {attention} | {gpu} | batch size 1 (every sample alone) | — | {len(lengths):,} | — | 1.000 | "
                f"{epoch_hours(old, ones):.2f} | {epoch_hours(cost, ones):.2f} |",
                flush=True,
            )
    staged()
    print()


def staged() -> None:
    """Qwen2-VL-2B under FSDP over 8 H100-PCIe: its collectives are a large fixed cost per step."""
    from tokenbucket.cost.calibration import CalibratedCostModel, Calibration
    from tokenbucket.cost.hf_model import StagedModel
    from tokenbucket.cost.staged import StagedCostModel, TrainSetup
    from tokenbucket.cost.staged_length import StagedLengthModel

    gpu = "H100-PCIe"
    budget = gpu_budget_bytes(gpu)
    setup = TrainSetup(sharding="fsdp", world_size=8)
    cost = StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup, gpu=gpu), vision_share=0.5)
    st = cost.step_time
    assert st is not None
    old = CalibratedCostModel(cost, Calibration(st.flat()))
    lengths = breakdown_table(mixture_a(20_000, seed=0), TokenSpec(patch=14)).totals // 4  # merged 2x2
    uniq = np.unique(lengths)
    fits = np.array([cost.memory(1, int(n)).total <= budget for n in uniq])
    lengths = lengths[lengths <= int(uniq[fits].max())]  # the samples that fit alone, as for the block model
    fixed = cost.step_time_parts(1, 1024).fixed
    uniq, counts = np.unique(lengths, return_counts=True)
    ones = [(int(c), 1, int(n)) for n, c in zip(uniq, counts, strict=True)]
    for label, planner in (("flat 40 %", old), ("step-time model", cost)):
        plan = plan_buckets(lengths, planner, budget, max_buckets=16)
        shapes = [(b.batches, b.batch_size, b.bound) for b in plan.buckets]
        s = plan.summary()
        print(
            f"| Qwen2-VL-2B, FSDP-8 ({fixed * 1e3:.0f} ms fixed a step) | {gpu} | {label} | {len(plan.buckets)} | "
            f"{s['batches']:,} | {s['mean_fill']:.3f} | {s['padding_efficiency']:.3f} | "
            f"{sum(c * old.step_seconds(b, n) for c, b, n in shapes) / 3600:.2f} | "
            f"{sum(c * cost.step_seconds(b, n) for c, b, n in shapes) / 3600:.2f} |",
            flush=True,
        )
    print(
        f"| Qwen2-VL-2B, FSDP-8 | {gpu} | batch size 1 (every sample alone) | — | {len(lengths):,} | — | 1.000 | "
        f"{sum(c * old.step_seconds(b, n) for c, b, n in ones) / 3600:.2f} | "
        f"{sum(c * cost.step_seconds(b, n) for c, b, n in ones) / 3600:.2f} |"
    )


def synthetic() -> None:
    from tokenbucket.monitor.calibrate import calibrate_log
    from tokenbucket.monitor.hooks import BucketMonitor
    from tokenbucket.train.batch import BatchInfo

    truth = {"fixed_seconds": 0.012, "mfu": 0.37, "knee_tokens": 4096.0}
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    st = cost.step_time
    assert st is not None
    model = StepTime(peak_flops=st.peak_flops, **truth)
    rng = np.random.default_rng(0)
    lengths = np.exp(rng.uniform(np.log(64), np.log(60_000), 20_000)).astype(np.int64)
    plan = plan_buckets(lengths, cost, gpu_budget_bytes("H100-SXM"), max_buckets=16, on_oversize="reject")
    print("| parameter | truth | calibrated | error |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "run.jsonl"
        now = [0.0]
        monitor = BucketMonitor(plan, sinks=[log], cost_model=cost, memory=None, clock=lambda: now[0])
        order = rng.permutation([k for k in range(len(plan.buckets)) for _ in range(40)])
        for k in order.tolist():
            b = plan.buckets[k]
            # full batches and partial ones, so the steps lie on both sides of the knee
            rows = int(rng.choice([1, max(1, b.batch_size // 8), max(1, b.batch_size // 2), b.batch_size]))
            info = BatchInfo(bucket=k, shape=(rows, b.bound), keys=(), tokens={}, real_tokens=rows * b.bound,
                             padded_tokens=rows * b.bound, predicted_peak_bytes=b.predicted_peak_bytes, risk=0.5)  # fmt: skip
            monitor.on_batch_start(info)
            seconds = model.seconds(cost.flops(rows, b.bound).training, rows * b.bound, fixed=NO_FIXED).total
            now[0] += seconds * float(rng.normal(1.0, 0.02))
            monitor.on_batch_end()
        monitor.close()
        cal = calibrate_log(log).step_time
    got = {"fixed_seconds": cal.fixed_seconds, "mfu": cal.mfu, "knee_tokens": cal.knee_tokens}
    for name, value in truth.items():
        print(f"| {name} | {value:g} | {got[name]:.4g} | {got[name] / value - 1:+.1%} |")
    print()


def demo() -> None:
    from tokenbucket.cli.demo import train_under_monitor
    from tokenbucket.monitor.calibrate import calibrate_log, compare, plan_buckets_of, step_records
    from tokenbucket.monitor.report import read_events

    print(
        "| pair | calibrated on seed | fixed ms | FLOP/s saturated | knee | scored on | steps | buckets "
        "| FLOPs only: mean error per bucket | calibrated: mean error per bucket |"
    )
    print("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for pair, seeds in enumerate(((0, 1), (2, 3), (4, 5)), start=1):
        with tempfile.TemporaryDirectory() as tmp:
            logs = []
            for seed in seeds:
                out = Path(tmp) / f"run{seed}"
                out.mkdir()
                logs.append(train_under_monitor(mixture_a(2_000, seed=seed), out, samples=SAMPLES)["log"])
            cal = calibrate_log(logs[0])
            held_log = read_events(logs[1])
            bounds = {k: bound for k, bound, _ in plan_buckets_of(held_log)}
            held = compare(cal, step_records(held_log), bounds=bounds)
        st = cal.step_time
        fixed = st.fixed_seconds or 0.0
        for label, stats in ((f"the same run (seed {seeds[0]})", cal.stats), (f"held out (seed {seeds[1]})", held)):
            print(
                f"| {pair} | {seeds[0]} | {fixed * 1e3:.1f} | {st.peak_flops * st.mfu:.3g} | {st.knee_tokens:,.0f} | "
                f"{label} | {stats['steps_used']} | {len(stats['buckets'])} | {stats['error_flops_only']:.1%} | "
                f"{stats['error_calibrated']:.1%} |",
                flush=True,
            )
    print()


def main(argv: list[str]) -> int:
    parts = {"plans": plans, "synthetic": synthetic, "demo": demo}
    chosen = argv or list(parts)
    unknown = [p for p in chosen if p not in parts]
    if unknown:
        print(f"unknown part(s) {unknown}; choose from {list(parts)}", file=sys.stderr)
        return 2
    for name in chosen:
        parts[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
