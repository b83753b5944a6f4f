"""One short script for a machine with a CUDA GPU: the monitor's measured peak per bucket against
the plan's predicted peak.

    python benchmarks/gpu_check_monitor.py                  # prints a Markdown table
    python benchmarks/gpu_check_monitor.py --device cpu     # smoke test of the script (no measurement)

Plans 20,000 samples of mixture A (patch 14) for the reference model (hidden 1024, 8 layers,
bf16, flash attention, AdamW) under a ``--budget-gib`` budget, then trains ``--steps`` full
batches of every bucket (random ``[B, L, D]`` inputs at the bucket's shape) under a
``BucketMonitor`` reading ``torch.cuda.max_memory_allocated`` / ``_reserved`` each step, and
prints per bucket the predicted peak, the measured peaks and measured / predicted. Runtime on
an H100-class GPU: about a minute.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.cost.reference import ReferenceTransformer
from tokenbucket.monitor.hooks import BucketMonitor, CudaMemory
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.testing import mixture_a
from tokenbucket.train.collate import BatchInfo


def gib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--budget-gib", type=float, default=40.0)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=8)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    cpu = args.device == "cpu"
    spec = (
        ModelSpec(hidden=64, layers=2, heads=4, precision="fp32", attention="eager")
        if cpu
        else ModelSpec(hidden=1024, layers=8, heads=16, precision="bf16", attention="flash")
    )
    budget = int((0.05 if cpu else args.budget_gib) * 2**30)
    token_spec = TokenSpec(patch=112 if cpu else 14)
    cost = CostModel(spec)
    lengths = breakdown_table(mixture_a(20_000, seed=0), token_spec).totals
    plan = plan_buckets(lengths, cost, budget, max_buckets=args.buckets, on_oversize="reject")
    model = ReferenceTransformer(spec, device=args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = torch.float32 if cpu else torch.bfloat16
    monitor = BucketMonitor(
        plan,
        sinks=["gpu_check_monitor.jsonl"],
        memory=None if cpu else CudaMemory(),
        cost_model=cost,
        drift_margin=0.05,
    )
    device = "CPU" if cpu else torch.cuda.get_device_name()
    print(
        f"{device}, torch {torch.__version__}; hidden {spec.hidden}, {spec.layers} layers, {spec.precision}, "
        f"{spec.attention}; budget {budget / 2**30:.2f} GiB, {len(plan.buckets)} buckets\n"
    )
    start = time.perf_counter()
    for k, b in enumerate(plan.buckets):
        for _ in range(args.steps):
            x = torch.randn(b.batch_size, b.bound, spec.hidden, device=args.device, dtype=dtype)
            predicted = int(cost.memory(b.batch_size, b.bound).total)
            tokens = b.batch_size * b.bound
            info = BatchInfo(
                bucket=k,
                shape=(b.batch_size, b.bound),
                keys=(),
                tokens={},
                real_tokens=tokens,
                padded_tokens=tokens,
                predicted_peak_bytes=predicted,
                risk=predicted / budget,
            )
            with monitor.step(info, x):
                model(x).float().pow(2).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            del x
    monitor.close()
    print("| bucket | B | L | predicted GiB | measured GiB | reserved GiB | measured/predicted | p50 ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in monitor.summary():
        b = plan.buckets[row["bucket"]]
        pred, meas, res = row["predicted_peak_bytes"], row["measured_peak_bytes"], row["reserved_peak_bytes"]
        cells = [gib(pred), gib(meas), gib(res), "-" if meas is None else f"{meas / pred:.3f}"]
        print(
            f"| {row['bucket']} | {b.batch_size} | {b.bound} | {' | '.join(cells)} | {row['latency_p50_s'] * 1e3:.1f} |"
        )
    rec = monitor.recalibration()
    print(f"\nrecalibration: {rec}\n{time.perf_counter() - start:.0f} s; the run log is gpu_check_monitor.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
