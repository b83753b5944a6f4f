"""Packing: whole samples laid end to end in rows of ``pack_length`` tokens, each sample attending
only to itself (block-diagonal / varlen attention).

NOTE [ Packed rows ]
* :func:`~tokenbucket.plan.packing.pack_rows` (the plan stage) packs samples into rows; the
  packed plan (``plan_buckets(mode="packed")``) fixes the row shape.
* :class:`PackedCollate` takes a batch's samples in row order (rows concatenated, as
  ``pack_rows`` gives them) and refills rows next-fit. On a sequence whose rows are
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

import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch
from torch.utils.data import Sampler

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.manifest import Manifest
from tokenbucket.plan.packing import pack_rows
from tokenbucket.train.batch import BatchInfo, BucketedData, EmptyRow, pad_rows, token_layout
from tokenbucket.train.risk import check_planned_model
from tokenbucket.train.sampler import (
    POSITION_KEYS,
    EpochPosition,
    RankAware,
    empty_row,
    pass_caller,
    position_of,
    resume_position,
    sampler_state,
)

if TYPE_CHECKING:  # typing_extensions comes with torch; Unpack is in typing from 3.11
    from typing_extensions import Unpack

__all__ = [
    "DENSE_MASK_WARN_BYTES",
    "PackedBatchSampler",
    "PackedCollate",
    "PackedOptions",
    "block_diagonal_mask",
    "cu_seqlens_of",
    "dense_mask_bytes",
    "flex_block_mask",
    "mask_size_warning",
    "next_fit_rows",
]

# NOTE [ Dense mask size ]
# block_diagonal_mask is R x P x P bools, one byte each: 256 MiB at one row of 16,384 tokens,
# 4 GiB at 65,536, none of it in the plan's flash / varlen prediction. PackedCollate warns once
# (per collate object: once per DataLoader worker) when a batch's dense mask would pass this.
DENSE_MASK_WARN_BYTES = 256 * 2**20


def dense_mask_bytes(rows: int, pack_length: int) -> int:
    """Bytes of :func:`block_diagonal_mask` for ``rows`` packed rows of ``pack_length`` tokens (bool: 1 B each).

    Example:
        >>> dense_mask_bytes(4, 8192) // 2**20  # MiB
        256
    """
    return int(rows) * int(pack_length) ** 2


def block_diagonal_mask(segment_ids: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """``[R, 1, P, P]`` bool, True where token q may attend to token k: the same sample (or, for a
    padding token, itself); with ``causal``, only k at or before q (a decoder's mask). For
    ``scaled_dot_product_attention(..., attn_mask=mask)``.

    The mask is dense: ``R x P²`` bytes (:func:`dense_mask_bytes`; and a masked SDPA computes
    every score), which the plan's flash / varlen cost does not include; at long rows use
    ``cu_seqlens`` with a varlen kernel or :func:`flex_block_mask` instead (NOTE [ Dense mask size ]).

    Example:
        >>> block_diagonal_mask(torch.tensor([[1, 1, 2, 0]]))[0, 0].int().tolist()
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
        >>> block_diagonal_mask(torch.tensor([[1, 1, 2, 2]]), causal=True)[0, 0].int().tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    """
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids > 0)[:, :, None]
    eye = torch.eye(segment_ids.shape[1], dtype=torch.bool, device=segment_ids.device)
    if causal:
        same = same & torch.ones_like(eye).tril()
    return ((same & real) | eye)[:, None]


def mask_size_warning(rows: int, pack_length: int) -> str | None:
    """The warning for a batch whose dense block mask passes 256 MiB (NOTE [ Dense mask size ]), else None."""
    nbytes = dense_mask_bytes(rows, pack_length)
    if nbytes <= DENSE_MASK_WARN_BYTES:
        return None
    return (
        f"packed batch of {rows} rows x {pack_length:,} tokens: a dense block_diagonal_mask "
        f"would take {nbytes / 2**20:,.0f} MiB (rows x pack_length² bytes), outside the plan's "
        "memory; use cu_seqlens with a varlen kernel or flex_block_mask instead"
    )


def next_fit_rows(
    sizes: Sequence[tuple[int, int]],
    pack_length: int,
    rows: int | None,
    key_of: Callable[[int], str] | None = None,
    *,
    patches: Sequence[int] | None = None,
    row_patches: int | None = None,
) -> list[list[int]]:
    """``(index, tokens)`` of a batch's samples, in order, into rows of ``pack_length`` tokens
    (and, given ``patches`` per sample and ``row_patches``, at most that many patches) next-fit
    (NOTE [ Packed rows ]): per row, the positions in ``sizes`` of its samples.

    Raises:
        ConfigError: a sample longer than ``pack_length`` or with more patches than
            ``row_patches`` (named by its index, and by ``key_of(index)`` when given), or more
            rows than ``rows`` (when given).

    Example:
        >>> next_fit_rows([(7, 3), (8, 4), (9, 2)], 6, None)
        [[0], [1, 2]]
        >>> next_fit_rows([(7, 3), (8, 1), (9, 2)], 6, None, patches=[4, 4, 0], row_patches=6)
        [[0], [1, 2]]
    """
    cap = None if patches is None or row_patches is None else int(row_patches)
    out: list[list[int]] = []
    used = used_patches = 0
    for n, (i, size) in enumerate(sizes):
        mine = int(patches[n]) if cap is not None and patches is not None else 0
        if size > pack_length or (cap is not None and mine > cap):
            named = f"sample {i}" if key_of is None else f"sample {i} (key {key_of(i)!r})"
            over = (
                f"{size:,} tokens, more than pack_length"
                if size > pack_length
                else f"{mine:,} patches, more than row_patches"
            )
            raise ConfigError(f"{named} has {over}={pack_length if size > pack_length else cap:,}")
        # (a first sample of 0 tokens still needs a row)
        if not out or used + size > pack_length or (cap is not None and used_patches + mine > cap):
            out.append([])
            used = used_patches = 0
        out[-1].append(n)
        used += size
        used_patches += mine
    if rows is not None and len(out) > rows:
        raise ConfigError(
            f"the batch needs {len(out)} rows of {pack_length:,} tokens but holds {rows}: the sampler's packing "
            f"and the collate's pack_length / rows_per_batch disagree"
        )
    return out


def cu_seqlens_of(seqlens: Sequence[int]) -> torch.Tensor:
    """int32 ``[len(seqlens) + 1]``: 0, then the running sums (flash-attn's varlen boundaries)."""
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    if seqlens:
        cu[1:] = torch.cumsum(torch.tensor(seqlens, dtype=torch.int32), 0)
    return cu


def flex_block_mask(segment_ids: torch.Tensor) -> Any:
    """A ``flex_attention`` block mask for the packed rows (needs ``torch.nn.attention.flex_attention``)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # optional: torch >= 2.5 only
    except ImportError as exc:  # pragma: no cover - torch >= 2.5 has it
        raise ConfigError("flex_block_mask needs torch.nn.attention.flex_attention (torch >= 2.5)") from exc
    seg = segment_ids

    def same_sample(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return ((seg[b, q] == seg[b, kv]) & (seg[b, q] > 0)) | (q == kv)

    rows, length = seg.shape
    return create_block_mask(same_sample, rows, None, length, length, device=str(seg.device))


class PackedCollate:
    """Packs a batch of ``(index, item)`` into ``rows_per_batch`` rows of ``pack_length`` tokens.

    Items are as for :class:`~tokenbucket.train.collate.BucketCollate` (a ``tokens_key`` tensor
    ``[L_i, ...]`` whose length is the sample's token count). Returns ``tokens`` ``[R, P, ...]``,
    ``segment_ids`` and ``position_ids`` ``[R, P]``, ``attention_mask`` ``[R, P]`` (True on real
    tokens), ``cu_seqlens`` (int32) and ``max_seqlen`` over the real tokens in row order,
    ``index`` (per row, the dataset indices in it), ``info`` (a ``BatchInfo`` whose shape is
    ``(R, P)``, predicted with ``cost_model`` when given) and, with ``with_layout``, ``layout``:
    per row the :class:`~tokenbucket.train.collate.Segment` s of its samples (camera / frame / modality
    slices) at their places in the row.

    Args:
        data: the :class:`~tokenbucket.train.collate.TokenBucketDataset` (lengths, keys, plan budget).
        pack_length: tokens per row.
        rows_per_batch: rows per batch (the batch's fixed shape); ``None``: as many as needed.
        cost_model: predicts each batch's peak; one for another model than ``data``'s manifest
            was planned for is refused (NOTE [ A cost model beside its manifest ]).

    Warns:
        UserWarning: once per collate object, the first time a batch's dense
            :func:`block_diagonal_mask` would take more than 256 MiB (NOTE [ Dense mask size ]).
    """

    def __init__(
        self,
        data: BucketedData,
        pack_length: int,
        rows_per_batch: int | None = None,
        *,
        tokens_key: str = "tokens",
        pad_value: float = 0,
        cost_model: PredictsMemory | None = None,
        with_layout: bool = False,
    ) -> None:
        check_planned_model(data, cost_model)  # NOTE [ A cost model beside its manifest ]
        self.data, self.pack_length, self.rows_per_batch = data, int(pack_length), rows_per_batch
        self.tokens_key, self.pad_value, self.cost_model = tokens_key, pad_value, cost_model
        self.with_layout = with_layout
        self._warned_mask = False

    def _check_mask_size(self, rows: int) -> None:
        """Warn once when this batch's dense block mask would pass 256 MiB (NOTE [ Dense mask size ])."""
        message = mask_size_warning(rows, self.pack_length)
        if self._warned_mask or message is None:
            return
        self._warned_mask = True
        warnings.warn(message, UserWarning, stacklevel=3)

    def __call__(self, batch: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        P = self.pack_length
        samples = [
            (i, self.data.tokens_of(i, item, self.tokens_key)) for i, item in batch if not isinstance(item, EmptyRow)
        ]
        fit = next_fit_rows([(i, int(t.shape[0])) for i, t in samples], P, self.rows_per_batch)
        rows = [[samples[n] for n in row] for row in fit]  # next-fit (NOTE [ Packed rows ])
        R = self.rows_per_batch if self.rows_per_batch is not None else max(1, len(rows))
        self._check_mask_size(R)
        template = samples[0][1] if samples else self.data.token_template(self.tokens_key)
        # a row is its samples end to end, padded like any collate's rows
        pieces = [[t for _, t in row] for row in rows]
        tokens, attention, _, _ = pad_rows(pieces, range(len(rows)), R, P, template, self.pad_value)
        segment = torch.zeros(R, P, dtype=torch.int32)
        position = torch.zeros(R, P, dtype=torch.long)
        seqlens: list[int] = []
        index: list[list[int]] = []
        for r, row in enumerate(rows):
            pos = 0
            index.append([i for i, _ in row])
            for s, (_, t) in enumerate(row, start=1):
                n = int(t.shape[0])
                segment[r, pos : pos + n] = s
                position[r, pos : pos + n] = torch.arange(n)
                seqlens.append(n)
                pos += n
        index += [[] for _ in range(R - len(rows))]
        cu = cu_seqlens_of(seqlens)
        peak = int(self.cost_model.memory(R, P).total) if self.cost_model is not None else 0
        info = self.data.batch_info([i for i, _ in samples], bucket=0, shape=(R, P), predicted_peak_bytes=peak)
        if position_of(batch) is not None:  # NOTE [ Position through the workers ]
            info = dataclasses.replace(info, position=position_of(batch))
        out = {
            "tokens": tokens,
            "segment_ids": segment,
            "position_ids": position,
            "attention_mask": attention,
            "cu_seqlens": cu,
            "max_seqlen": max(seqlens, default=0),
            "index": index,
            "info": info,
        }
        if self.with_layout:
            out["layout"] = self._layout(index)
        return out

    def _layout(self, index: list[list[int]]) -> list[list[Any]]:
        """Per row, each sample's :class:`~tokenbucket.train.collate.Segment` s (camera / frame / modality),
        shifted to where the sample starts in its row."""
        rows = []
        for row in index:
            start, segments = 0, []
            for i in row:
                bd = self.data.breakdown(i)
                segments += [
                    dataclasses.replace(g, start=g.start + start, stop=g.stop + start)
                    for g in token_layout(bd, self.data.spec)
                ]
                start += bd.total
            rows.append(segments)
        return rows


# -- the sampler ---------------------------------------------------------------------------------


def _refuse_two_cap(plan: BucketPlan) -> None:
    """A two-cap packed plan's rows need its patch cap too (NOTE [ Two-cap packing each epoch ])."""
    if "row_patches" in plan.meta:
        raise ConfigError(
            f"this packed plan also caps patches a row (row_patches={plan.meta['row_patches']}), which "
            f"PackedBatchSampler does not: use tokenbucket.train.packing_2d.PackedBatchSampler2D"
        )


class PackedOptions(TypedDict, total=False):
    """The :class:`PackedBatchSampler` arguments its ``from_*`` constructors pass on."""

    seed: int
    shuffle: bool
    rank: int | None
    world_size: int | None
    pool: int


class PackedBatchSampler(EpochPosition, RankAware, Sampler[list[int]]):
    """One rank's packed batches for ``DataLoader(batch_sampler=...)``, with
    :class:`PackedCollate`: each batch is its rows' indices, rows concatenated.

    Each epoch :func:`pack_rows` packs the samples (by ``(seed, epoch)``), ``rows_per_batch``
    rows make a batch, and rank ``r`` takes batches ``r, r + world_size, ...``; the last
    batches are filled up to a multiple of ``world_size`` with an empty batch (one empty row,
    see :func:`~tokenbucket.train.sampler.empty_row`), so every rank takes the same number of steps and
    every sample is in exactly one batch.

    State keys: ``epoch``, ``step``, ``plan_id``, ``world_size``, ``seed``, ``mode``.
    """

    STATE_KEYS = (*POSITION_KEYS, "plan_id", "world_size", "seed", "mode")

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        pack_length: int,
        rows_per_batch: int,
        *,
        plan_id: str,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        pool: int = 4096,
        valid: Sequence[bool] | np.ndarray | None = None,
    ) -> None:
        self._set_rank_world(rank, world_size)  # NOTE [ Rank at iteration ]
        if rows_per_batch < 1:
            raise ConfigError(f"rows_per_batch should be a positive integer, but got rows_per_batch={rows_per_batch}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        keep = self.lengths <= pack_length if valid is None else np.asarray(valid, dtype=bool)
        self.members = np.flatnonzero(keep)
        self.pack_length, self.rows_per_batch = int(pack_length), int(rows_per_batch)
        self.plan_id, self.seed, self.shuffle, self.pool = plan_id, int(seed), shuffle, pool
        self.mode = "packed"
        self._init_position()  # NOTE [ An epoch moves on by itself ]
        self._cache: tuple[tuple[int, int], list[list[int]]] | None = None  # (epoch, world size) → batches

    @classmethod
    def from_dataset(cls, data: BucketedData, **kwargs: Unpack[PackedOptions]) -> PackedBatchSampler:
        """For a :class:`~tokenbucket.train.collate.TokenBucketDataset` with a packed plan."""
        _refuse_two_cap(data.plan)
        b = data.plan.buckets[0]
        kwargs.setdefault("seed", data.plan.meta.get("pack_seed", 0))
        kwargs.setdefault("pool", data.plan.meta.get("pack_pool", 4096))
        return cls(data.lengths, b.bound, b.batch_size, plan_id=data.plan_id, valid=data.buckets >= 0, **kwargs)

    @classmethod
    def from_manifest(cls, manifest: Manifest, **kwargs: Unpack[PackedOptions]) -> PackedBatchSampler:
        """A sampler over a packed :class:`~tokenbucket.plan.manifest.Manifest` (rows in dataset order)."""
        plan = manifest.plan
        if plan.mode != "packed":
            raise ConfigError(
                f"this manifest's plan is {plan.mode!r}, not 'packed': use BucketBatchSampler.from_manifest"
            )
        _refuse_two_cap(plan)
        b = plan.buckets[0]
        kwargs.setdefault("seed", plan.meta.get("pack_seed", 0))
        kwargs.setdefault("pool", plan.meta.get("pack_pool", 4096))
        lengths = manifest.table.column("total").fill_null(0).to_numpy()
        valid = manifest.table.column("bucket").to_numpy() >= 0
        return cls(lengths, b.bound, b.batch_size, plan_id=manifest.content_hash, valid=valid, **kwargs)

    def _batches(self, epoch: int | None = None) -> list[list[int]]:
        key = (self.epoch if epoch is None else epoch, self.world_size)  # NOTE [ Rank at iteration ]
        if self._cache is None or self._cache[0] != key:
            rows = pack_rows(
                self.lengths[self.members],
                self.pack_length,
                seed=self.seed,
                epoch=key[0],
                pool=self.pool,
                shuffle=self.shuffle,
            )
            members = self.members.tolist()
            r = self.rows_per_batch
            batches = [[members[i] for row in rows[s : s + r] for i in row] for s in range(0, len(rows), r)]
            batches += [[empty_row(len(self.lengths), 0)]] * (-len(batches) % key[1])
            self._cache = (key, batches)
        return self._cache[1]

    def _epoch_length(self, epoch: int) -> int:
        return len(self._batches(epoch)) // self.world_size

    def __iter__(self) -> Iterator[list[int]]:
        start = self._begin_pass(pass_caller())  # NOTE [ An epoch moves on by itself ]
        batches = self._batches()
        rank, world = self.rank, self.world_size  # read once, as the epoch starts
        yield from self._pass(lambda s: batches[s * world + rank], len(batches) // world, start)

    def state_dict(self, *, after: BatchInfo | None = None) -> dict[str, Any]:
        """Where the sampler stands (``after``: as for :meth:`BucketBatchSampler.state_dict`)."""
        return self._state(self.STATE_KEYS, after)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = sampler_state(self, self.STATE_KEYS, identity_only=True)  # NOTE [ Sampler state keys ]
        self._load_position(*resume_position(state, mine, "packed sampler"))
