"""Packing: whole samples laid end to end in rows of ``pack_length`` tokens, each sample attending
only to itself (block-diagonal / varlen attention).

NOTE [ Packed rows ]
* :func:`pack_rows` cuts a shuffled order of samples into pools and packs each pool best-fit
  decreasing: a sample goes to the fullest row it still fits, else opens a row. Samples stay
  whole; one longer than ``pack_length`` is refused (it is oversize). Rows are shuffled at the
  end. The result is a pure function of ``(lengths, pack_length, seed, epoch, pool)``; the pool
  bound keeps memory flat however many samples there are.
* :class:`PackedCollate` takes a batch's samples in row order (rows concatenated, as
  :func:`pack_rows` gives them) and refills rows next-fit. On a sequence whose rows are
  contiguous, next-fit never opens more rows than the packing it came from (each of its rows
  ends at or after the original row's end), so the batch's ``rows_per_batch`` always suffice.
* The packed batch says where each sample is: ``segment_ids`` (1, 2, ... per sample in a row,
  0 on padding), ``position_ids`` restarting at 0 for each sample, and ``cu_seqlens`` /
  ``max_seqlen`` over the real tokens in row order — what flash-attn's varlen kernels take.
* Masks: :func:`block_diagonal_mask` for ``scaled_dot_product_attention`` (True = attend), and
  :func:`flex_block_mask` for ``flex_attention`` where the installed torch has it. A padding
  token attends to itself only, so no attention row is empty (an all-masked row gives NaN).

With flash-attn on a GPU::

    real = batch["segment_ids"] > 0
    q, k, v = (t[real] for t in (q, k, v))          # [total_tokens, heads, head_dim]
    out = flash_attn_varlen_func(q, k, v, batch["cu_seqlens"], batch["cu_seqlens"],
                                 batch["max_seqlen"], batch["max_seqlen"])
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tokenbucket._exceptions import ConfigError

__all__ = ["PackedCollate", "block_diagonal_mask", "flex_block_mask", "pack_rows"]


def pack_rows(lengths: Sequence[int] | np.ndarray, pack_length: int, *, seed: int = 0, epoch: int = 0,
              pool: int = 4096, shuffle: bool = True) -> list[list[int]]:
    """Indices of ``lengths`` packed into rows of at most ``pack_length`` tokens (NOTE [ Packed rows ]).

    Example:
        >>> pack_rows([6, 5, 4, 3, 2], 8, shuffle=False)
        [[0, 4], [1, 3], [2]]
    """
    lens = np.asarray(lengths, dtype=np.int64)
    if pack_length < 1:
        raise ConfigError(f"pack_length should be a positive integer, but got pack_length={pack_length}")
    if pool < 1:
        raise ConfigError(f"pool should be a positive integer, but got pool={pool}")
    too_long = np.flatnonzero(lens > pack_length)
    if len(too_long):
        i = int(too_long[0])
        raise ConfigError(f"sample {i} has {int(lens[i]):,} tokens, more than pack_length={pack_length:,} "
                          f"({len(too_long):,} such samples): samples are never split; reject them when planning")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lens)) if shuffle else np.arange(len(lens))
    rows: list[list[int]] = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        chunk = chunk[np.argsort(-lens[chunk], kind="stable")]  # longest first
        free: list[tuple[int, int]] = []  # (free tokens, row), sorted: best fit = first with enough room
        for i, n in zip(chunk.tolist(), lens[chunk].tolist(), strict=True):
            at = bisect.bisect_left(free, (n, -1))
            if at < len(free):
                room, row = free.pop(at)
                rows[row].append(i)
                bisect.insort(free, (room - n, row))
            else:
                rows.append([i])
                bisect.insort(free, (pack_length - n, len(rows) - 1))
    if shuffle:
        rows = [rows[r] for r in rng.permutation(len(rows))]
    return rows


def block_diagonal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[R, 1, P, P]`` bool, True where token q may attend to token k: the same sample (or, for a
    padding token, itself). For ``scaled_dot_product_attention(..., attn_mask=mask)``.

    Example:
        >>> block_diagonal_mask(torch.tensor([[1, 1, 2, 0]]))[0, 0].int().tolist()
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    """
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids > 0)[:, :, None]
    eye = torch.eye(segment_ids.shape[1], dtype=torch.bool, device=segment_ids.device)
    return ((same & real) | eye)[:, None]


def flex_block_mask(segment_ids: torch.Tensor) -> Any:
    """A ``flex_attention`` block mask for the packed rows (needs ``torch.nn.attention.flex_attention``)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as exc:  # pragma: no cover - torch >= 2.5 has it
        raise ConfigError("flex_block_mask needs torch.nn.attention.flex_attention (torch >= 2.5)") from exc
    seg = segment_ids

    def same_sample(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return ((seg[b, q] == seg[b, kv]) & (seg[b, q] > 0)) | (q == kv)

    rows, length = seg.shape
    return create_block_mask(same_sample, rows, None, length, length, device=str(seg.device))


class PackedCollate:
    """Packs a batch of ``(index, item)`` into ``rows_per_batch`` rows of ``pack_length`` tokens.

    Items are as for :class:`~tokenbucket.collate.BucketCollate` (a ``tokens_key`` tensor
    ``[L_i, ...]`` whose length is the sample's token count). Returns ``tokens`` ``[R, P, ...]``,
    ``segment_ids`` and ``position_ids`` ``[R, P]``, ``attention_mask`` ``[R, P]`` (True on real
    tokens), ``cu_seqlens`` (int32) and ``max_seqlen`` over the real tokens in row order,
    ``index`` (per row, the dataset indices in it) and ``info`` (a ``BatchInfo`` whose shape is
    ``(R, P)``, predicted with ``cost_model`` when given).

    Args:
        data: the :class:`~tokenbucket.collate.TokenBucketDataset` (lengths, keys, plan budget).
        pack_length: tokens per row.
        rows_per_batch: rows per batch (the batch's fixed shape); ``None``: as many as needed.
    """

    def __init__(self, data: Any, pack_length: int, rows_per_batch: int | None = None, *, tokens_key: str = "tokens",
                 pad_value: float = 0, cost_model: Any = None, budget_bytes: int | None = None) -> None:
        self.data, self.pack_length, self.rows_per_batch = data, int(pack_length), rows_per_batch
        self.tokens_key, self.pad_value, self.cost_model = tokens_key, pad_value, cost_model
        self.budget_bytes = budget_bytes if budget_bytes is not None else int(data.plan.budget_bytes)

    def __call__(self, batch: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        from tokenbucket.collate import BatchInfo, EmptyRow

        P = self.pack_length
        samples = [(i, item[self.tokens_key]) for i, item in batch if not isinstance(item, EmptyRow)]
        rows: list[list[tuple[int, torch.Tensor]]] = []
        used = P  # next-fit (NOTE [ Packed rows ])
        for i, t in samples:
            n = int(t.shape[0])
            if n != int(self.data.lengths[i]):
                raise ConfigError(f"sample {i} (key {self.data.key(i)!r}): its metadata says {int(self.data.lengths[i])} "
                                  f"tokens but its {self.tokens_key!r} tensor has shape {tuple(t.shape)}")
            if n > P:
                raise ConfigError(f"sample {i} has {n:,} tokens, more than pack_length={P:,}")
            if used + n > P:
                rows.append([])
                used = 0
            rows[-1].append((i, t))
            used += n
        R = self.rows_per_batch if self.rows_per_batch is not None else max(1, len(rows))
        if len(rows) > R:
            raise ConfigError(f"the batch needs {len(rows)} rows of {P:,} tokens but holds {R}: the sampler's packing "
                              f"and the collate's pack_length / rows_per_batch disagree")
        template = samples[0][1] if samples else torch.zeros(1)
        tokens = torch.full((R, P, *template.shape[1:]), self.pad_value, dtype=template.dtype)
        segment = torch.zeros(R, P, dtype=torch.int32)
        position = torch.zeros(R, P, dtype=torch.long)
        seqlens: list[int] = []
        index: list[list[int]] = []
        for r, row in enumerate(rows):
            pos = 0
            index.append([i for i, _ in row])
            for s, (_, t) in enumerate(row, start=1):
                n = int(t.shape[0])
                tokens[r, pos:pos + n] = t
                segment[r, pos:pos + n] = s
                position[r, pos:pos + n] = torch.arange(n)
                seqlens.append(n)
                pos += n
        index += [[] for _ in range(R - len(rows))]
        cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
        if seqlens:
            cu[1:] = torch.cumsum(torch.tensor(seqlens, dtype=torch.int32), 0)
        idx = [i for i, _ in samples]
        per_row = {name: values[idx].tolist() for name, values in self.data.modality_tokens.items()}
        peak = (int(self.cost_model.memory(R, P).total) if self.cost_model is not None else 0)
        info = BatchInfo(bucket=0, shape=(R, P), keys=tuple(self.data.key(i) for i in idx),
                         tokens={name: int(sum(v)) for name, v in per_row.items()}, real_tokens=sum(seqlens),
                         padded_tokens=R * P, predicted_peak_bytes=peak, risk=peak / self.budget_bytes,
                         indices=tuple(idx), lengths=tuple(seqlens),
                         row_tokens=tuple(zip(*per_row.values(), strict=True)) if idx else ())
        return {"tokens": tokens, "segment_ids": segment, "position_ids": position, "attention_mask": segment > 0,
                "cu_seqlens": cu, "max_seqlen": max(seqlens, default=0), "index": index, "info": info}
