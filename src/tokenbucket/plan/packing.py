"""Packing as a planning mode: whole samples laid end to end in rows of ``pack_length`` tokens
(NOTE [ Packed rows ] in :mod:`tokenbucket.train.packing` says how a batch is laid out).

:func:`pack_rows` cuts a shuffled order of samples into pools and packs each pool best-fit
decreasing: a sample goes to the fullest row it still fits, else opens a row. Samples stay
whole; one longer than ``pack_length`` is refused (it is oversize). Rows are shuffled at the
end. The result is a pure function of ``(lengths, pack_length, seed, epoch, pool)``; the pool
bound keeps memory flat however many samples there are.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket._search import grow_then_bisect, largest_fitting
from tokenbucket.cost.memory import CostModel
from tokenbucket.plan._search import SupportsCost, oversize_record, step_cost
from tokenbucket.plan.bucket_plan import Bucket, BucketPlan

__all__ = ["pack_rows", "packed_epoch_seconds", "plan_packing", "samples_attention_flops"]


def pack_rows(
    lengths: Sequence[int] | np.ndarray,
    pack_length: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    pool: int = 4096,
    shuffle: bool = True,
) -> list[list[int]]:
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
        raise ConfigError(
            f"sample {i} has {int(lens[i]):,} tokens, more than pack_length={pack_length:,} "
            f"({len(too_long):,} such samples): samples are never split; reject them when planning"
        )
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lens)) if shuffle else np.arange(len(lens))
    rows: list[list[int]] = []
    for start in range(0, len(order), pool):
        chunk = order[start : start + pool]
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


def _longest_row(cost_model: SupportsCost, budget_bytes: int, start: int) -> int:
    """The longest row (in tokens) whose single-row batch fits the budget (0 if none)."""

    def fits(n: int) -> bool:
        return bool(cost_model.memory(1, n).total <= budget_bytes)

    start = max(1, start)
    if not fits(start):
        return largest_fitting(fits, 0, start)
    return grow_then_bisect(fits, start, what="the longest row search")


def packed_epoch_seconds(
    cost_model: CostModel, rows_per_batch: int, pack_length: int, batches: int, sample_attention_flops: float
) -> float:
    """Predicted epoch seconds of ``batches`` packed batches of ``rows_per_batch x pack_length``.

    NOTE [ Packed FLOPs ]
    The dense part (projections, MLP) runs on every token of the row, padding included. Attention
    differs by kernel: a varlen / flash kernel computes each sample against itself only, so the
    epoch's attention is the cost model's training attention of each sample alone, summed
    (``sample_attention_flops``, from :func:`samples_attention_flops`: local windows included);
    an eager (or masked SDPA) kernel computes the whole ``pack_length²`` score matrix of every
    row and masks it.
    """
    flops = cost_model.flops(rows_per_batch, pack_length)
    step = step_cost(cost_model, rows_per_batch, pack_length)
    if cost_model.model.attention == "eager" or not flops.training:
        return batches * step
    seconds_per_flop = step / flops.training
    dense_share = 1 - flops.training_attention / flops.training
    return float(batches * step * dense_share + sample_attention_flops * seconds_per_flop)


def samples_attention_flops(cost_model: SupportsCost, lengths: np.ndarray) -> float:
    """Σ over samples of the cost model's training attention FLOPs of each sample alone (one
    call per distinct length; a sample of no tokens costs none)."""
    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    values, counts = values[values > 0], counts[values > 0]
    return float(
        sum(
            int(c) * cost_model.flops(1, int(v)).training_attention
            for v, c in zip(values.tolist(), counts.tolist(), strict=True)
        )
    )


def plan_packing(
    lengths: Sequence[int] | np.ndarray,
    cost_model: CostModel,
    budget_bytes: int,
    *,
    pack_length: int | None = None,
    on_oversize: str = "error",
    seed: int = 0,
    pool: int = 4096,
    multiple: int = 64,
    candidates: int = 6,
    meta: dict[str, Any] | None = None,
) -> BucketPlan:
    """A packed plan (``mode="packed"``): one row shape ``(rows_per_batch, pack_length)``.

    ``pack_length`` is given, or chosen among ``candidates`` lengths from the longest sample up
    to the longest row that fits the budget alone, by the predicted epoch time (NOTE [ Packed
    FLOPs ]) of the rows :func:`pack_rows` makes; ``rows_per_batch`` is the cost model's largest
    batch at ``pack_length``. Samples longer than ``pack_length`` are oversize (``on_oversize``:
    ``error`` or ``reject``); none is ever split.
    """
    if on_oversize not in ("error", "reject"):
        raise ConfigError(f"on_oversize should be 'error' or 'reject', but got on_oversize={on_oversize!r}")
    raw = np.asarray(lengths, dtype=np.int64)
    if not len(raw):
        raise ConfigError("there are no samples to plan")
    top = _longest_row(cost_model, budget_bytes, int(raw.max()))
    if pack_length is not None:
        if cost_model.memory(1, pack_length).total > budget_bytes:
            raise ConfigError(
                f"pack_length={pack_length:,} does not fit the budget even as one row "
                f"(the longest that fits is {top:,} tokens)"
            )
        top = pack_length
    over = raw > top
    oversize: dict[str, int] = {}
    if over.any():
        oversize = oversize_record(
            cost_model,
            int(over.sum()),
            int(raw.max()),
            top,
            budget_bytes,
            on_oversize,
            why="are longer than the longest row",
            fix="Samples are never split",
        )
        raw = raw[~over]
        if not len(raw):  # nothing fits: an empty plan that says why, as the other modes give
            return BucketPlan("packed", budget_bytes, (), oversize, dict(meta or {}))
    longest = int(raw.max())
    if pack_length is not None:
        options = [pack_length]
    else:  # rounded up to `multiple`, capped at the longest row that fits
        grid = np.geomspace(longest, top, candidates) if top > longest else np.array([top])
        options = sorted({min(top, -(-int(g) // multiple) * multiple) for g in grid} | {top})
    attention_flops = samples_attention_flops(cost_model, raw)
    best: tuple[float, int, int, int] | None = None
    for length in options:
        rows_per_batch = cost_model.max_batch(length, budget_bytes)
        rows = len(pack_rows(raw, length, seed=seed, pool=pool))
        batches = -(-rows // rows_per_batch)
        # NOTE [ Packed FLOPs ]
        seconds = packed_epoch_seconds(cost_model, rows_per_batch, length, batches, attention_flops)
        if best is None or seconds <= best[0]:
            best = (seconds, length, rows_per_batch, batches)
    assert best is not None
    seconds, length, rows_per_batch, batches = best
    peak = int(cost_model.memory(rows_per_batch, length).total)
    tokens, padded = int(raw.sum()), batches * rows_per_batch * length
    bucket = Bucket(
        bound=length,
        batch_size=rows_per_batch,
        samples=len(raw),
        batches=batches,
        tokens=tokens,
        padded_tokens=padded,
        predicted_peak_bytes=peak,
        fill=peak / budget_bytes,
        padding_efficiency=tokens / padded,
        step_seconds=seconds / batches,
    )
    return BucketPlan(
        "packed", budget_bytes, (bucket,), oversize, {**dict(meta or {}), "pack_pool": pool, "pack_seed": seed}
    )
