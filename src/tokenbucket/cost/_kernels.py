"""Which attention kernel a fake-tensor step records: the CPU ones, or what a CUDA GPU would run.

On fake CPU tensors ``F.scaled_dot_product_attention`` dispatches to the CPU kernels, which save
other tensors for backward than the CUDA ones do. :func:`attention_kernels` with ``"cuda"``
routes every call of ``torch.nn.functional.scaled_dot_product_attention`` (the name the model's
code looks up when it runs, as transformers' ``sdpa_attention_forward`` does) to the CUDA ops,
whose meta functions run on fake CPU tensors. The kernel is picked as PyTorch's CUDA
dispatcher picks it (NOTE [ The CUDA kernel choice ]); nothing of the CUDA build is needed.

NOTE [ The CUDA kernel choice ]
PyTorch's CUDA dispatcher tries flash, then memory-efficient, then math:
- flash (``aten._scaled_dot_product_flash_attention``): bf16/fp16 only, no ``attn_mask`` (a
  causal mask is the ``is_causal`` flag), head dim at most 256, the same head dim for values;
  it takes fewer K/V heads than query heads (``enable_gqa``) without copying them. A head dim
  that is not a multiple of 8 is padded first (Q, K and V copied, the output a slice of a padded
  one). It saves Q, K, V, the output, a fp32 log-sum-exp of ``B x H x L`` and the two 8-byte
  philox seed and offset tensors.
- memory-efficient (``aten._scaled_dot_product_efficient_attention``): any float dtype, an
  additive ``attn_bias``; a boolean mask is first turned into an additive one of the query's
  dtype (a new ``... x L x L`` tensor, kept for backward), whose last dimension is padded to a
  multiple of 16. It needs as many K/V heads as query heads.
- math (``aten._scaled_dot_product_attention_math``): everything else; it materialises the
  ``L x L`` scores.
Each op's meta function gives the shapes, dtypes and layouts the CUDA kernel returns, so what
autograd keeps for backward is what a GPU keeps (for the bf16 flash case the same bytes as the
CPU kernel keeps: NOTE [ CPU and CUDA attention kernels ] in ``tokenbucket.cost.memory``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from tokenbucket._exceptions import ConfigError

__all__ = ["KERNELS", "attention_kernels", "cuda_sdpa"]

KERNELS = ("cpu", "cuda")
_PAD = 16  # the memory-efficient kernel's alignment of the bias's last dimension
_FLASH_PAD = 8  # the flash kernel's alignment of the head dim (the CUDA dispatcher pads to it)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as the additive bias the CUDA path makes of it."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))


def _padded(bias: torch.Tensor) -> torch.Tensor:
    last = bias.shape[-1]
    if last % _PAD == 0:
        return bias
    wide = F.pad(bias, (0, _PAD - last % _PAD))
    return wide[..., :last]


def _head_padded(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its last dimension padded to a multiple of 8: a copy, as the CUDA path makes it."""
    last = x.shape[-1]
    return x if last % _FLASH_PAD == 0 else F.pad(x, (0, _FLASH_PAD - last % _FLASH_PAD))


def cuda_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``F.scaled_dot_product_attention`` as a CUDA GPU runs it (NOTE [ The CUDA kernel choice ])."""
    head = query.shape[-1]
    low = query.dtype in (torch.float16, torch.bfloat16)
    four = query.dim() == 4 and key.dim() == 4
    same_heads = key.shape[-3] == query.shape[-3]
    if four and low and attn_mask is None and head <= 256 and value.shape[-1] == head and (same_heads or enable_gqa):
        # the scale is the unpadded head dim's
        scale = head**-0.5 if scale is None else scale
        q, k, v = _head_padded(query), _head_padded(key), _head_padded(value)
        flash: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale
        )[0]
        return flash if flash.shape[-1] == head else flash[..., :head]
    if four and same_heads and head % (8 if low else 4) == 0 and query.dtype != torch.float64:
        bias = None
        if attn_mask is not None:
            bias = _padded(_additive(attn_mask, query.dtype))
        needs_lse = query.requires_grad or key.requires_grad or value.requires_grad
        efficient: torch.Tensor = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_lse and torch.is_grad_enabled(), dropout_p, is_causal, scale=scale
        )[0]
        return efficient
    math: torch.Tensor = torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]
    return math


@contextlib.contextmanager
def attention_kernels(kind: str) -> Iterator[None]:
    """While active, ``F.scaled_dot_product_attention`` runs the ``kind`` kernels: ``cpu`` (as it
    is) or ``cuda`` (:func:`cuda_sdpa`)."""
    if kind not in KERNELS:
        raise ConfigError(f"kernels should be one of {list(KERNELS)}, but got kernels={kind!r}")
    if kind == "cpu":
        yield
        return
    orig: Any = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = cuda_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = orig
