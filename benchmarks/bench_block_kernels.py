"""The block cost model under the CPU attention kernels and under the CUDA ones' metas.

Command (no GPU; about two minutes on two cores):

    .venv/bin/python benchmarks/bench_block_kernels.py --kernels both

The truth of :mod:`tokenbucket.cost.profile` runs on fake CPU tensors, so
``F.scaled_dot_product_attention`` records what the CPU kernels save for backward;
``tokenbucket.cost._kernels.attention_kernels("cuda")`` routes it to the CUDA ops' meta
functions instead (flash for these bf16 causal blocks). The families are the held-out blocks of
``benchmarks/bench_qkv_layout.py`` (fused QKV split into views, permuted, separate, rotary,
contiguous; GELU MLP; pure bf16), each priced with its own ``qkv_layout``, over a grid of
width, head dim, length, batch and depth. The error is predicted / measured - 1.

Reference (torch 2.13.0+cpu, ``--kernels both``, 36 points per row, 104-145 s; NOTE [ CPU and CUDA
attention kernels ] in ``cost/memory.py``): the two kernels agree to 0.01 % everywhere.

| family | qkv_layout | error, cpu kernels | error, cuda kernels |
| --- | --- | ---: | ---: |
| fused-split | `views` | +0.01% … +0.08% | +0.01% … +0.08% |
| fused-permute | `views` | +0.01% … +0.08% | +0.01% … +0.08% |
| separate | `views` | +0.01% … +0.08% | +0.01% … +0.08% |
| separate-rotary | `views` | -1.18% … -0.00% | -1.18% … -0.00% |
| contiguous | `contiguous` | +0.01% … +0.08% | +0.01% … +0.07% |
| fused-rotary | `fused_rotary` | -1.07% … -0.00% | -1.07% … -0.00% |

The rotary families' worst (D=256, head dim 128, L=8192, B=1, 2 layers) is the model's one
rotary table, ``L x head_dim`` in bf16 (2 MiB), which the block model does not see.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if __name__ == "__main__":  # run as a script: the repository root holds the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_qkv_layout import FAMILIES, build

from tokenbucket.cost._kernels import KERNELS, attention_kernels
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import profile_memory

HIDDEN = (256, 512, 1024)
HEAD_DIM = (64, 128)
SHAPES = ((1024, 4), (4096, 1), (8192, 1))  # (L, B)
LAYERS = (2, 4)
MIB = 2**20


@dataclass(frozen=True)
class Point:
    family: str
    kernels: str
    hidden: int
    heads: int
    length: int
    batch: int
    layers: int
    predicted: int
    measured: int

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    def label(self) -> str:
        return f"D={self.hidden} H={self.heads} L={self.length} B={self.batch} N={self.layers}"


def measure(family: str, kernels: str, hidden: int, heads: int, length: int, batch: int, layers: int) -> Point:
    """The measured peak of two bf16 AdamW steps under ``kernels``, beside the block model's."""
    with attention_kernels(kernels):
        measured = profile_memory(
            lambda: build(hidden, layers, family, heads),
            lambda b, n: torch.empty(b, n, hidden, dtype=torch.bfloat16),
            batch,
            length,
        ).peak
    spec = ModelSpec(hidden=hidden, layers=layers, heads=heads, precision="bf16", qkv_layout=FAMILIES[family])
    predicted = CostModel(spec).memory(batch, length).total
    return Point(family, kernels, hidden, heads, length, batch, layers, predicted, measured)


def grid() -> list[tuple[int, int, int, int, int]]:
    """``(hidden, heads, length, batch, layers)`` over the grid."""
    return [(d, d // dh, n, b, layers) for d, dh, (n, b), layers in itertools.product(HIDDEN, HEAD_DIM, SHAPES, LAYERS)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", choices=(*KERNELS, "both"), default="both")
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    args = parser.parse_args(argv)
    kinds = KERNELS if args.kernels == "both" else (args.kernels,)
    start = time.perf_counter()
    rows: dict[tuple[str, str], list[Point]] = {}
    for family, kernels in itertools.product(args.families, kinds):
        rows[family, kernels] = [measure(family, kernels, *p) for p in grid()]
    seconds = time.perf_counter() - start
    print(
        f"D in {HIDDEN}, head dim in {HEAD_DIM}, (L, B) in {SHAPES}, layers in {LAYERS}; bf16, causal SDPA, "
        f"AdamW; torch {torch.__version__}, {seconds:.0f} s\n"
    )
    print("| family | qkv_layout | kernels | points | lowest: predicted / measured MiB (error) at | "
          "highest: predicted / measured MiB (error) at |")  # fmt: skip
    print("| --- | --- | --- | ---: | --- | --- |")
    for (family, kernels), points in rows.items():
        lo, hi = min(points, key=lambda p: p.error), max(points, key=lambda p: p.error)
        cells = [
            f"{p.predicted / MIB:,.1f} / {p.measured / MIB:,.1f} ({p.error:+.2%}) at {p.label()}" for p in (lo, hi)
        ]
        print(f"| {family} | `{FAMILIES[family]}` | {kernels} | {len(points)} | {cells[0]} | {cells[1]} |")
    every = [p for points in rows.values() for p in points]
    for kernels in kinds:
        mine = [p for p in every if p.kernels == kernels]
        lo, hi = min(mine, key=lambda p: p.error), max(mine, key=lambda p: p.error)
        print(
            f"\n{kernels}: worst under {lo.error:+.2%} ({lo.family}, {lo.label()}), "
            f"worst over {hi.error:+.2%} ({hi.family}, {hi.label()})",
            end="",
        )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
