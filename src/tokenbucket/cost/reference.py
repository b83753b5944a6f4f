"""The reference transformer: exactly the block :class:`~tokenbucket.cost.model.ModelSpec` describes.

It exists so that the analytic cost model can be checked against a real ``nn.Module`` — on
fake tensors on a CPU (``tokenbucket.cost.profile``) or on a GPU — and so that users have a
known-good model to compare their own against.

GPU behaviour is made explicit, since the profiler runs on CPU fake tensors (see NOTE [ Fake
CPU stands in for CUDA ] in ``profile.py``):

- ``flash``/``sdpa`` calls ``aten._scaled_dot_product_flash_attention`` with Q, K, V laid out
  ``[B, L, H, Dh]`` in memory, as CUDA's SDPA hands them to the kernel, so the output is laid
  out the same way and folding heads back is a view;
- ``mem_efficient`` calls ``aten._scaled_dot_product_efficient_attention``;
- ``eager`` computes ``softmax(QKᵀ·scale)`` in fp32 and casts the probabilities back;
- ``amp`` casts as CUDA autocast does: LayerNorm in fp32, matmuls and attention in bf16, the
  residual stream in fp32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from tokenbucket.cost.model import ModelSpec

__all__ = ["ReferenceBlock", "ReferenceTransformer"]


def _dtypes(spec: ModelSpec) -> tuple[torch.dtype, torch.dtype]:
    """``(parameter dtype, compute dtype)``."""
    if spec.precision == "bf16":
        return torch.bfloat16, torch.bfloat16
    if spec.precision == "amp":
        return torch.float32, torch.bfloat16
    return torch.float32, torch.float32


class ReferenceBlock(nn.Module):
    """One pre-norm block. ``kv_cache`` (a list) receives ``(k, v)`` in inference."""

    def __init__(self, spec: ModelSpec, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.spec = spec
        param_dtype, self.compute_dtype = _dtypes(spec)
        kw: dict[str, Any] = {"device": device, "dtype": param_dtype}
        d, kv, f = spec.hidden, spec.kv_dim, spec.ffn
        self.norm1 = nn.LayerNorm(d, **kw)
        self.q = nn.Linear(d, d, bias=False, **kw)
        self.k = nn.Linear(d, kv, bias=False, **kw)
        self.v = nn.Linear(d, kv, bias=False, **kw)
        self.o = nn.Linear(d, d, bias=False, **kw)
        self.norm2 = nn.LayerNorm(d, **kw)
        self.fc1 = nn.Linear(d, f, bias=False, **kw)
        self.fc3 = nn.Linear(d, f, bias=False, **kw) if spec.gated_mlp else None
        self.fc2 = nn.Linear(f, d, bias=False, **kw)

    def _linear(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        c = self.compute_dtype
        return F.linear(x.to(c), layer.weight.to(c))

    def _norm(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        # autocast runs layer_norm in fp32; in pure bf16 it runs in bf16 (fp32 statistics)
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        if spec.attention != "eager" and q.device.type == "cpu" and not is_fake(q):
            # a real CPU run (numerics, tests): the GPU kernels do not exist here
            groups = spec.heads // int(spec.kv_heads)  # type: ignore[arg-type]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            return F.scaled_dot_product_attention(q, k, v)
        if spec.attention in ("flash", "sdpa") and q.dtype != torch.float32:
            flash: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0]
            return flash
        groups = spec.heads // int(spec.kv_heads)  # type: ignore[arg-type]
        if groups > 1:  # only the flash kernel takes fewer K/V heads than Q heads
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        if spec.attention in ("flash", "sdpa", "mem_efficient"):
            # fp32 has no flash kernel: SDPA falls back to the memory-efficient one
            efficient: torch.Tensor = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[0]
            return efficient
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(spec.head_dim))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor, kv_cache: list[Any] | None = None) -> torch.Tensor:
        spec = self.spec
        b, length, d = x.shape
        h, dh, hkv = spec.heads, spec.head_dim, int(spec.kv_heads)  # type: ignore[arg-type]
        y = self._norm(x, self.norm1)
        q = self._linear(y, self.q).view(b, length, h, dh).transpose(1, 2)
        k = self._linear(y, self.k).view(b, length, hkv, dh).transpose(1, 2)
        v = self._linear(y, self.v).view(b, length, hkv, dh).transpose(1, 2)
        if kv_cache is not None:
            kv_cache.append((k, v))
        a = self._attention(q, k, v).transpose(1, 2).reshape(b, length, d)
        x = x + self._linear(a, self.o)
        y = self._norm(x, self.norm2)
        u = self._linear(y, self.fc1)
        if self.fc3 is not None:
            u = F.silu(u) * self._linear(y, self.fc3)
        else:
            u = F.gelu(u)
        return x + self._linear(u, self.fc2)


class ReferenceTransformer(nn.Module):
    """``spec.layers`` reference blocks on a ``[B, L, hidden]`` input (no embedding, no head).

    Example:
        >>> from tokenbucket.cost.model import ModelSpec
        >>> m = ReferenceTransformer(ModelSpec(hidden=64, layers=2, heads=4, precision="fp32"))
        >>> m(torch.zeros(1, 8, 64)).shape
        torch.Size([1, 8, 64])
    """

    def __init__(self, spec: ModelSpec, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.blocks = nn.ModuleList(ReferenceBlock(spec, device) for _ in range(spec.layers))
        self.kv_cache: list[Any] | None = None

    def extra_repr(self) -> str:
        # in the repr, so model_hash tells attention kinds and precisions apart
        m = self.spec
        return f"precision={m.precision}, attention={m.attention}, checkpointing={m.checkpointing}, mode={m.mode}"

    @property
    def input_dtype(self) -> torch.dtype:
        return _dtypes(self.spec)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.mode == "infer":
            self.kv_cache = []
        for block in self.blocks:
            if self.spec.checkpointing == "full" and self.spec.mode == "train" and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x, self.kv_cache)
        return x
