"""The monitor's cost per training step: 10,000 steps of a trivial step function with the
monitor off, and on with each sink, in one run (ratios and per-step differences, since these
machines are shared and absolute times drift).

Command (what docs/benchmarks.md's table comes from):

    .venv/bin/python benchmarks/bench_monitor.py [--steps 10000] [--repeats 5]

Each configuration runs ``repeats`` times, interleaved, and the fastest run counts (the least
disturbed by other load). "on" means ``with monitor.step(info, batch): step(batch)`` on CPU
(``perf_counter`` timing, no memory reader): building the step event, the per-bucket aggregates
and the sink. The JSONL sink writes to a temporary file with its default buffering; the
``guard`` row is ``monitor.guard(step)(batch)`` with the JSONL sink. Target: under 20 us a step.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tokenbucket.monitor.hooks import BucketMonitor
from tokenbucket.monitor.sinks import LoggingSink
from tokenbucket.plan.buckets import Bucket, BucketPlan
from tokenbucket.train.collate import BatchInfo


def plan_and_batches(buckets: int = 8) -> tuple[BucketPlan, list[dict[str, Any]]]:
    plan = BucketPlan(
        mode="static",
        budget_bytes=80 * 2**30,
        buckets=tuple(
            Bucket(
                bound=1024 * (k + 1),
                batch_size=64 // (k + 1),
                samples=1000,
                batches=100,
                tokens=10**6,
                padded_tokens=10**6,
                predicted_peak_bytes=60 * 2**30,
                fill=0.75,
                padding_efficiency=0.97,
                step_seconds=0.1,
            )
            for k in range(buckets)
        ),
    )
    out = []
    for k, b in enumerate(plan.buckets):
        n = b.batch_size
        info = BatchInfo(
            bucket=k,
            shape=(n, b.bound),
            keys=tuple(f"ep{k}_{i}" for i in range(n)),
            tokens={"vision": n * b.bound // 2, "text": 100 * n},
            real_tokens=n * b.bound * 9 // 10,
            padded_tokens=n * b.bound,
            predicted_peak_bytes=60 * 2**30,
            risk=0.75,
        )
        out.append({"tokens": torch.zeros(1), "info": info})
    return plan, out


def run(steps: int, make: Callable[[], BucketMonitor | None], use_guard: bool = False) -> float:
    _, batches = plan_and_batches()
    acc = [0]

    def step(batch: dict[str, Any]) -> None:  # the "training step": as cheap as a call gets
        acc[0] += 1

    monitor = make()
    guarded = monitor.guard(step, policy="raise") if monitor is not None and use_guard else None
    start = time.perf_counter()
    if monitor is None:
        for i in range(steps):
            step(batches[i % len(batches)])
    elif guarded is not None:
        for i in range(steps):
            guarded(batches[i % len(batches)])
    else:
        for i in range(steps):
            batch = batches[i % len(batches)]
            with monitor.step(batch["info"], batch):
                step(batch)
    seconds = time.perf_counter() - start
    if monitor is not None:
        monitor.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    plan, _ = plan_and_batches()
    logging.getLogger("tokenbucket.monitor.hooks").setLevel(logging.INFO)  # steps at DEBUG: filtered
    with tempfile.TemporaryDirectory() as tmp:
        configs: dict[str, tuple[Callable[[], BucketMonitor | None], bool]] = {
            "off": (lambda: None, False),
            "on, no sink": (lambda: BucketMonitor(plan, sinks=[], memory=None), False),
            "on, JSONL": (lambda: BucketMonitor(plan, sinks=[Path(tmp) / "run.jsonl"], memory=None), False),
            "on, logging (INFO)": (lambda: BucketMonitor(plan, sinks=[LoggingSink()], memory=None), False),
            "guard, JSONL": (lambda: BucketMonitor(plan, sinks=[Path(tmp) / "g.jsonl"], memory=None), True),
        }
        best = {name: float("inf") for name in configs}
        for _ in range(args.repeats):
            for name, (make, use_guard) in configs.items():
                best[name] = min(best[name], run(args.steps, make, use_guard))
        lines = sum(1 for _ in open(Path(tmp) / "run.jsonl"))
    off = best["off"]
    print(f"{args.steps:,} steps, best of {args.repeats}; JSONL file: {lines // args.repeats:,} lines a run\n")
    print("| configuration | us / step | overhead us / step |")
    print("|---|---:|---:|")
    for name, seconds in best.items():
        per = seconds / args.steps * 1e6
        print(f"| {name} | {per:.2f} | {per - off / args.steps * 1e6:.2f} |")


if __name__ == "__main__":
    main()
