"""Collate throughput: batches per second of :class:`~tokenbucket.train.modal.ModalityCollate` on a
LeRobot-shaped batch (4 cameras x 16 frames x 224 px, float32, plus state, action chunk, task and
index keys), stacked and patches layouts, against ``torch.utils.data.default_collate`` of the same
items, in one run (ratios, since these machines are shared and absolute times drift).

Command (what docs/benchmarks.md's table comes from):

    .venv/bin/python benchmarks/bench_collate.py [--batch-size 4] [--batches 5] [--repeats 5]

Each configuration collates ``batches`` batches, ``repeats`` times, interleaved; the fastest
repeat counts (the least disturbed by other load). Target: the collate no slower than 1.5x
``default_collate`` (ratio = its seconds per batch / default_collate's).

Reference (2 CPU cores, torch 2.13 CPU, batch 4: 154 MB of float32 pixels a batch):

    | collate | batches / s | ms / batch | vs default_collate |
    |---|---:|---:|---:|
    | default_collate | 16.5 | 60.7 | 1.00x |
    | ModalityCollate stacked | 15.5 | 64.3 | 1.06x |
    | ModalityCollate patches | 12.8 | 77.9 | 1.28x |
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import torch
from torch.utils.data import Dataset, default_collate

from tokenbucket import CostModel, ModelSpec, TokenSpec
from tokenbucket.plan.buckets import plan_from_bounds
from tokenbucket.tokens.spec import CountRule
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.modal import ModalityCollate

CAMERAS, FRAMES, SIDE = 4, 16, 224
SPEC = TokenSpec(patch=14, tubelet=2, text=CountRule(count=0), proprio=CountRule(count=1), action=CountRule(count=50))


class Items(Dataset[dict[str, Any]]):
    """``n`` LeRobot-shaped items, built once (the benchmark times the collate, not the reads)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = [
            {
                **{
                    f"observation.images.cam{c}": torch.rand(FRAMES, 3, SIDE, SIDE, generator=g) for c in range(CAMERAS)
                },
                "observation.state": torch.rand(14, generator=g),
                "action": torch.rand(50, 14, generator=g),
                "action_is_pad": torch.zeros(50, dtype=torch.bool),
                "timestamp": torch.tensor(i / 30),
                "frame_index": torch.tensor(i),
                "episode_index": torch.tensor(0),
                "task": "fold the towel",
            }
            for i in range(n)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def dataset(batch_size: int) -> TokenBucketDataset:
    meta = pa.table(
        {
            "key": [f"s{i}" for i in range(batch_size)],
            "cameras": [CAMERAS] * batch_size,
            "frames": [FRAMES] * batch_size,
            "height": [SIDE] * batch_size,
            "width": [SIDE] * batch_size,
        }
    )
    length = CAMERAS * (FRAMES // 2) * (SIDE // 14) ** 2 + 51
    cost = CostModel(ModelSpec(hidden=64, layers=1, heads=4))
    plan = plan_from_bounds([length], [batch_size], [length] * batch_size, cost, 2**40)
    return TokenBucketDataset(Items(batch_size), metadata=meta, spec=SPEC, plan=plan)


def timed(fn: Callable[[], object], batches: int) -> float:
    start = time.perf_counter()
    for _ in range(batches):
        fn()
    return (time.perf_counter() - start) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = dataset(args.batch_size)
    pairs = [data[i] for i in range(args.batch_size)]
    items = [item for _, item in pairs]
    stacked, patches = ModalityCollate(data), ModalityCollate(data, layout="patches")
    configs: dict[str, Callable[[], object]] = {
        "default_collate": lambda: default_collate(items),
        "ModalityCollate stacked": lambda: stacked(pairs),
        "ModalityCollate patches": lambda: patches(pairs),
    }
    for fn in configs.values():  # warm up (allocator, first-call paths)
        fn()
    best = {name: float("inf") for name in configs}
    for _ in range(args.repeats):
        for name, fn in configs.items():
            best[name] = min(best[name], timed(fn, args.batches))
    nbytes = sum(v.numel() * v.element_size() for it in items for v in it.values() if isinstance(v, torch.Tensor))
    print(
        f"batch {args.batch_size} x {CAMERAS} cameras x {FRAMES} frames x {SIDE} px ({nbytes / 1e6:.0f} MB), "
        f"{torch.get_num_threads()} threads, best of {args.repeats} x {args.batches} batches\n"
    )
    print("| collate | batches / s | ms / batch | vs default_collate |")
    print("|---|---:|---:|---:|")
    base = best["default_collate"]
    for name, seconds in best.items():
        print(f"| {name} | {1 / seconds:.1f} | {seconds * 1e3:.1f} | {seconds / base:.2f}x |")


if __name__ == "__main__":
    main()
