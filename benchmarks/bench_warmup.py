"""Compiles under a static plan (warmed up) and a dynamic plan, over two epochs of real training.

Command:

    .venv/bin/python benchmarks/bench_warmup.py [--samples 256] [--budget-mib 16] [--max-buckets 4]

On the CPU, with ``torch.compile(backend="aot_eager", dynamic=False)`` and a one-layer transformer
of width 32: the same lengths are planned static and dynamic; the static plan is warmed up
(:func:`tokenbucket.train.warmup.warm_up`: forward and backward once per bucket shape, largest
predicted peak first), then each plan trains two epochs through the real sampler,
``BucketCollate`` and ``DataLoader`` (forward, backward and an AdamW step). Compiles are
:func:`tokenbucket.train.warmup.compile_count` differences (TorchDynamo frames). A last row
trains the dynamic plan with ``dynamic=None`` (PyTorch's default: after a shape's first recompile
its sizes are compiled as symbols) for comparison; it has no warm-up either.

Columns: ``shapes``: distinct batch shapes the two epochs saw; ``warm-up compiles`` / ``warm-up
s``: frames compiled and seconds spent by the warm-up; ``compiles during 2 epochs``: frames compiled
while training; ``epoch-2 compiles``: those of them in the second epoch; ``train s``: seconds of the
two epochs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch._dynamo
from torch.utils.data import DataLoader

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.testing import RandomTokens, ToyDenoiser, metadata_of_lengths
from tokenbucket.train.collate import BucketCollate, TokenBucketDataset
from tokenbucket.train.warmup import compile_count, warm_up

HIDDEN = 32
SPEC = TokenSpec(patch=14)  # one 14 px frame is one token: a sample's L_total is 1 + its text tokens
COST = CostModel(ModelSpec(hidden=HIDDEN, layers=1, heads=4, precision="fp32", attention="eager"))

Batch = dict[str, Any]


def steps(dynamic: bool | None) -> tuple[Callable[[Batch], None], Callable[[Batch], None]]:
    """A fresh model's warm-up step (forward + backward) and train step (+ AdamW)."""
    torch.manual_seed(0)
    model = ToyDenoiser(HIDDEN)
    compiled = torch.compile(model, backend="aot_eager", dynamic=dynamic)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def warm(batch: Batch) -> None:
        compiled(batch["tokens"], batch["attention_mask"]).backward()
        model.zero_grad(set_to_none=True)

    def train(batch: Batch) -> None:
        compiled(batch["tokens"], batch["attention_mask"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return warm, train


def make_batch(batch_size: int, bound: int) -> Batch:
    return {
        "tokens": torch.randn(batch_size, bound, HIDDEN),
        "attention_mask": torch.ones(batch_size, bound, dtype=torch.bool),
    }


def run(label: str, plan: BucketPlan, table: pa.Table, lengths: np.ndarray, dynamic: bool | None) -> list[str]:
    torch._dynamo.reset()
    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=table, spec=SPEC, plan=plan)
    sampler = data.sampler(seed=0)
    loader: DataLoader[Batch] = DataLoader(data, batch_sampler=sampler, collate_fn=BucketCollate(data, cost_model=COST))
    warm, train = steps(dynamic)
    warm_compiles, warm_seconds = "—", "—"
    if plan.mode == "static":
        start = time.perf_counter()
        records = warm_up(warm, plan, make_batch)
        warm_seconds = f"{time.perf_counter() - start:.2f}"
        warm_compiles = str(sum(r.compiles for r in records))
    shapes: set[tuple[int, ...]] = set()
    per_epoch = []
    start = time.perf_counter()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        before = compile_count()
        for batch in loader:
            shapes.add(tuple(batch["tokens"].shape))
            train(batch)
        per_epoch.append(compile_count() - before)
    seconds = time.perf_counter() - start
    return [
        label,
        str(len(shapes)),
        warm_compiles,
        warm_seconds,
        str(sum(per_epoch)),
        str(per_epoch[1]),
        f"{seconds:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--budget-mib", type=int, default=16)
    parser.add_argument("--max-buckets", type=int, default=4)
    args = parser.parse_args()

    lengths = np.random.default_rng(0).integers(8, 400, args.samples)
    table = metadata_of_lengths(lengths)
    lengths = breakdown_table(table, SPEC).totals
    budget = args.budget_mib * 2**20
    plans = {
        mode: plan_buckets(
            lengths, COST, budget, max_buckets=args.max_buckets, multiple=32, on_oversize="reject", mode=mode
        )
        for mode in ("static", "dynamic")
    }
    batches = {mode: sum(b.batches for b in plan.buckets) for mode, plan in plans.items()}
    print(
        f"{args.samples} samples, lengths {int(lengths.min())}-{int(lengths.max())}, budget {args.budget_mib} MiB, "
        f"{len(plans['static'].buckets)} buckets; batches per epoch: static {batches['static']}, "
        f"dynamic {batches['dynamic']}; torch {torch.__version__}, CPU, aot_eager\n"
    )
    with torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=4096):
        rows = [
            run("static (warmed up), dynamic=False", plans["static"], table, lengths, False),
            run("dynamic, dynamic=False", plans["dynamic"], table, lengths, False),
            run("dynamic, dynamic=None (automatic)", plans["dynamic"], table, lengths, None),
        ]
    header = [
        "plan mode",
        "shapes",
        "warm-up compiles",
        "warm-up s",
        "compiles during 2 epochs",
        "epoch-2 compiles",
        "train s",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
