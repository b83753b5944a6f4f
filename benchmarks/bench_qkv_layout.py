"""The block cost model on blocks written the ways users write them: fused or separate QKV, rotary or not.

Command (no GPU; about a minute):

    .venv/bin/python benchmarks/bench_qkv_layout.py
    .venv/bin/python benchmarks/bench_qkv_layout.py --layers 8

Each family is a plain ``nn.Module`` written here, not the reference block: pre-norm LayerNorm,
attention through ``F.scaled_dot_product_attention(is_causal=True)`` in bf16, a GELU MLP. They
differ only in how Q, K and V reach the kernel (NOTE [ QKV layout ] in ``cost/memory.py``):

- ``fused-split``: one ``Linear(D, 3D)``, ``split``, view and transpose (nanoGPT);
- ``fused-permute``: one ``Linear(D, 3D)``, a 5-D view, ``permute`` and ``unbind``;
- ``separate``: three projections, view and transpose;
- ``separate-rotary``: three projections, a rotary embedding on Q and K (Llama);
- ``contiguous``: ``fused-split`` with ``.contiguous()`` on Q, K, V;
- ``fused-rotary``: ``fused-split`` with a rotary embedding on Q and K (GPT-NeoX).

The rotary tables are made once per forward and shared by the blocks, as Llama and GPT-NeoX do.

For each, the measured peak of two bf16 AdamW steps on fake tensors
(``tokenbucket.cost.profile.profile_memory``) against ``CostModel`` with the default
``qkv_layout`` and with the family's own; the error is predicted / measured - 1.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import profile_memory

# family -> the qkv_layout that describes it
FAMILIES = {
    "fused-split": "views",
    "fused-permute": "views",
    "separate": "views",
    "separate-rotary": "views",
    "contiguous": "contiguous",
    "fused-rotary": "fused_rotary",
}
SHAPES = [(256, 2048, 2), (256, 8192, 1), (1024, 2048, 2), (1024, 8192, 1)]  # (D, L, B)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class UserBlock(nn.Module):
    """One pre-norm block, its attention input laid out as ``family`` says."""

    def __init__(self, hidden: int, heads: int, family: str) -> None:
        super().__init__()
        self.heads, self.family = heads, family
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        if family.startswith("separate"):
            self.q, self.k, self.v = (nn.Linear(hidden, hidden, bias=False) for _ in range(3))
        else:
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.fc1 = nn.Linear(hidden, 4 * hidden, bias=False)
        self.fc2 = nn.Linear(4 * hidden, hidden, bias=False)

    def _qkv(self, y: torch.Tensor, rope: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        b, n, d = y.shape
        h, dh = self.heads, d // self.heads
        if self.family.startswith("separate"):
            q, k, v = (p(y).view(b, n, h, dh).transpose(1, 2) for p in (self.q, self.k, self.v))
        elif self.family == "fused-permute":
            q, k, v = self.qkv(y).view(b, n, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = (t.view(b, n, h, dh).transpose(1, 2) for t in self.qkv(y).split(d, dim=2))
        if rope is not None:
            cos = sin = rope
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.family == "contiguous":
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return q, k, v

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self._qkv(self.norm1(x), rope)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, d)
        x = x + self.out(a)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class UserModel(nn.Module):
    def __init__(self, hidden: int, layers: int, family: str, heads: int | None = None) -> None:
        super().__init__()
        self.head_dim, self.rotary = hidden // (heads or hidden // 64), family.endswith("rotary")
        self.blocks = nn.ModuleList(UserBlock(hidden, hidden // self.head_dim, family) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the rotary table (cos and sin alike on fake tensors), made once and shared by the blocks
        rope = torch.ones(1, 1, x.shape[1], self.head_dim, dtype=x.dtype) if self.rotary else None
        for block in self.blocks:
            x = block(x, rope)
        return x


def build(hidden: int, layers: int, family: str, heads: int | None = None) -> UserModel:
    """The model in bf16, built with bf16 as the default dtype (``.to()`` cannot swap fake weights)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return UserModel(hidden, layers, family, heads)
    finally:
        torch.set_default_dtype(old)


def errors(family: str, hidden: int, length: int, batch: int, layers: int) -> tuple[float, float]:
    """(error with the default layout, error with the family's own), as fractions."""
    measured = profile_memory(
        lambda: build(hidden, layers, family),
        lambda b, n: torch.empty(b, n, hidden, dtype=torch.bfloat16),
        batch,
        length,
    ).peak
    out = []
    for layout in (None, FAMILIES[family]):
        spec = ModelSpec(hidden=hidden, layers=layers, heads=hidden // 64, precision="bf16", qkv_layout=layout)
        out.append(CostModel(spec).memory(batch, length).total / measured - 1)
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    for family, layout in FAMILIES.items():
        errs = [errors(family, d, n, b, args.layers) for d, n, b in SHAPES]
        rows.append((family, layout, [e[0] for e in errs], [e[1] for e in errs]))
    seconds = time.perf_counter() - start
    print(f"(D, L, B) in {SHAPES}, {args.layers} layers, bf16 flash, torch {torch.__version__}, {seconds:.0f} s\n")
    print("| block family | qkv_layout | error, default layout (worst) | error, its layout (worst) |")
    print("| --- | --- | ---: | ---: |")
    for family, layout, default, own in rows:
        print(
            f"| {family} | `{layout}` | {min(default):+.1%} … {max(default):+.1%} | {min(own):+.1%} … {max(own):+.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
