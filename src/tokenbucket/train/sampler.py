"""``BucketBatchSampler``: batches of dataset indices, one bucket per batch, for
``DataLoader(batch_sampler=...)`` — deterministic, DDP-correct and exactly resumable.

Each epoch is a pure function of ``(seed, epoch, plan id, world_size)``; a rank takes its slice:

1. every bucket's samples are shuffled (``numpy`` generator seeded with ``seed``, ``epoch`` and
   the plan id) and cut into batches — static mode: ``batch_size`` of the bucket; dynamic mode:
   filled to the budget (shuffled pools sorted by length, as the planner predicted);
2. batches are grouped into *steps* of ``world_size`` batches; with ``sync_buckets`` a step's
   batches all come from one bucket, so no rank waits on a bigger shape;
3. steps are shuffled, and rank ``r`` takes batch ``r`` of every step.

NOTE [ Nothing lost, equal steps ]
A bucket whose last step has fewer batches than ranks gives the missing ranks a batch with one
*empty row* (index ``num_samples + bucket``, see :func:`empty_row`): every rank takes the same
number of steps, every sample appears exactly once per epoch across ranks, and the collate pads
the empty row like any other (static mode keeps the bucket's shape). With ``drop_last=True``
those incomplete last steps are dropped instead and their samples counted in ``dropped``.

State (``state_dict``, torchdata's ``StatefulDataLoader`` protocol): ``epoch``, ``step``
(batches this rank has yielded this epoch), and ``plan_id``, ``world_size``, ``seed``,
``mode``, ``drop_last``, ``sync_buckets`` to refuse a resume that would not continue exactly.
"""

from __future__ import annotations

import hashlib
import inspect
import numbers
import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from tokenbucket._exceptions import ConfigError, StateError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.plan.buckets_2d import SupportsCost2D
from tokenbucket.plan.dynamic_manifest import dynamic_plan_of, is_dynamic_2d
from tokenbucket.plan.manifest import Manifest
from tokenbucket.plan.packed_manifest import is_two_cap
from tokenbucket.train._dynamic import DynamicFill, DynamicFill2D, cut_dynamic, dynamic_mode
from tokenbucket.train.batch import BatchInfo

if TYPE_CHECKING:  # typing_extensions comes with torch; Unpack is in typing from 3.11
    from typing_extensions import Unpack

__all__ = [
    "BucketBatchSampler",
    "DynamicFill",
    "DynamicFill2D",
    "Epoch",
    "EpochPosition",
    "RankAware",
    "SamplerOptions",
    "StepIndices",
    "empty_row",
    "epoch_steps",
    "members_by_bucket",
    "resplit_error",
    "rows_of",
    "state_count",
]


# NOTE [ Sampler state keys ]
# A sampler's state is where it is (POSITION_KEYS: the epoch and the batches this rank has
# yielded in it) plus what makes that position mean the same batches (the rest of its class's
# STATE_KEYS, each an attribute of the same name). Both samplers build and check their state
# here, so a key exists once.
EPOCH_KEY, STEP_KEY = "epoch", "step"
POSITION_KEYS = (EPOCH_KEY, STEP_KEY)


def empty_row(num_samples: int, bucket: int) -> int:
    """The index that stands for one empty row of ``bucket`` (NOTE [ Nothing lost, equal steps ])."""
    return num_samples + bucket


def _rng(seed: int, epoch: int, plan_id: str) -> np.random.Generator:
    # the plan id enters the seed, so two plans never share an order by accident
    return np.random.default_rng([seed, epoch, int(plan_id[:15], 16)])


def members_by_bucket(buckets: np.ndarray, num_buckets: int) -> list[np.ndarray]:
    """Each bucket's sample indices in index order (int32 where they fit: half the memory)."""
    dtype = np.int32 if len(buckets) < 2**31 else np.int64
    return [np.flatnonzero(buckets == k).astype(dtype) for k in range(num_buckets)]


class SamplerOptions(TypedDict, total=False):
    """The :class:`BucketBatchSampler` arguments that :meth:`~BucketBatchSampler.from_manifest` and
    ``TokenBucketDataset.sampler`` pass on."""

    shuffle: bool
    seed: int
    drop_last: bool
    rank: int | None
    world_size: int | None
    sync_buckets: bool
    dynamic: DynamicFill | DynamicFill2D | None


@dataclass(frozen=True)
class Epoch:
    """One epoch for all ranks, compact: batch ``b`` is ``perm[starts[b]:starts[b + 1]]``, and
    ``steps[s, r]`` is rank r's batch at step s (``-1 - k``: one empty row of bucket ``k``)."""

    perm: np.ndarray
    starts: np.ndarray
    batch_bucket: np.ndarray
    steps: np.ndarray
    dropped: int
    num_samples: int

    def batch(self, step: int, rank: int) -> list[int]:
        b = int(self.steps[step, rank])
        if b < 0:
            return [empty_row(self.num_samples, -1 - b)]
        return self.perm[self.starts[b] : self.starts[b + 1]].tolist()  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return int(self.steps.shape[0])


def epoch_steps(
    buckets: np.ndarray,
    batch_sizes: Sequence[int],
    *,
    seed: int,
    epoch: int,
    plan_id: str,
    world_size: int,
    sync_buckets: bool = True,
    drop_last: bool = False,
    shuffle: bool = True,
    dynamic: DynamicFill | DynamicFill2D | None = None,
    order: list[np.ndarray] | None = None,
) -> Epoch:
    """All ranks' batches of one epoch (see the module docstring).

    Args:
        buckets: bucket index of every sample (``-1``: not in the epoch).
        batch_sizes: static batch size per bucket.
        dynamic: a :class:`DynamicFill` ``(lengths, cost_model, budget_bytes, pool_batches)`` for dynamic
            batching, or a :class:`DynamicFill2D` (``vision`` after ``lengths``) for a 2D dynamic plan.
        order: :func:`members_by_bucket` of ``buckets``, when the caller keeps it between epochs.
    """
    n = len(buckets)
    rng = _rng(seed, epoch, plan_id)
    if order is None:
        order = members_by_bucket(buckets, len(batch_sizes))
    perms, starts, batch_bucket, groups = [], [], [], []
    first_batch = 0
    base = 0
    for k, members in enumerate(order):
        count = len(members)
        # a 2D fill shuffles its own pools by (seed, epoch) (NOTE [ Two-dimensional dynamic batches ])
        if shuffle and not (dynamic is not None and len(dynamic) == 5):
            members = members[rng.permutation(count)]
        if dynamic is not None:
            # NOTE [ Sorted pools ]: the same cut the planner simulated
            cut = cut_dynamic(dynamic, members, rng=rng, seed=seed, epoch=epoch)
            members = members[np.concatenate(cut)] if cut else members
            sizes = np.array([len(c) for c in cut], dtype=np.int64)
            local = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
        else:
            local = np.arange(0, count, int(batch_sizes[k]), dtype=np.int64)
        perms.append(members)
        starts.append(base + local)
        batch_bucket.append(np.full(len(local), k, dtype=np.int64))
        groups.append(np.arange(first_batch, first_batch + len(local), dtype=np.int64))
        first_batch += len(local)
        base += count
    perm = np.concatenate(perms) if perms else np.zeros(0, np.int64)
    starts_all = np.concatenate([*starts, [base]]).astype(np.int64)
    bucket_of = np.concatenate(batch_bucket) if batch_bucket else np.zeros(0, np.int64)

    def batch_len(ids: np.ndarray) -> int:
        return int((starts_all[ids + 1] - starts_all[ids]).sum())

    dropped = 0
    w = world_size
    if sync_buckets:
        rows = []
        for k, ids in enumerate(groups):
            tail = len(ids) % w
            if tail and drop_last:
                dropped += batch_len(ids[-tail:])
                ids = ids[:-tail]
            elif tail:
                ids = np.concatenate([ids, np.full(w - tail, -1 - k, dtype=np.int64)])
            rows.append(ids.reshape(-1, w))
        steps = np.concatenate(rows) if rows else np.zeros((0, w), np.int64)
        if shuffle:
            steps = steps[rng.permutation(len(steps))]
    else:
        ids = np.concatenate(groups) if groups else np.zeros(0, np.int64)
        if shuffle:
            ids = ids[rng.permutation(len(ids))]
        tail = len(ids) % w
        if tail and drop_last:
            dropped = batch_len(ids[-tail:])
            ids = ids[:-tail]
        elif tail:
            k_last = int(bucket_of[ids[-1]])
            ids = np.concatenate([ids, np.full(w - tail, -1 - k_last, dtype=np.int64)])
        steps = ids.reshape(-1, w)
    return Epoch(perm, starts_all, bucket_of, steps, dropped, n)


class StepIndices(list[int]):
    """One step's indices, and where the sampler stands once they are trained.

    NOTE [ Position through the workers ]
    A plain ``DataLoader`` with workers draws batches from the sampler ahead of training
    (``prefetch_factor`` per worker), so the sampler's own count runs ahead of the steps trained,
    and a state taken from it would skip the prefetched batches. So each batch of indices carries
    its ``(epoch, step)``: the dataset's ``__getitems__`` (which the DataLoader's fetcher calls with
    this very list, in the worker) hands it to the collate, the collate puts it into
    ``BatchInfo.position``, and ``sampler.state_dict(after=batch["info"])`` is exact at any step.
    ``StatefulDataLoader`` users need none of this: it accounts for prefetch itself.

    NOTE [ Rows through the workers ]
    A two-cap packed batch (NOTE [ Two-cap packed rows ]) is rows the sampler chose under two
    caps, and a collate that refilled them next-fit by tokens alone could merge two rows and
    break the patch cap. So such a batch also carries ``rows``: how many of its indices each row
    holds, in order (rows concatenated). It travels as the position does: the dataset's
    ``__getitems__`` copies it into ``Fetched.rows`` and :func:`rows_of` reads it in the collate.
    ``None`` (every other sampler) leaves the collate to lay the rows out itself.
    """

    epoch: int = 0
    step: int = 0
    rows: tuple[int, ...] | None = None

    @classmethod
    def of(cls, indices: list[int], epoch: int, step: int, rows: tuple[int, ...] | None = None) -> StepIndices:
        out = cls(indices)
        out.epoch, out.step, out.rows = epoch, step, rows
        return out


class Fetched(list[tuple[int, object]]):
    """A batch's ``(index, item)`` pairs, the sampler ``position`` after it (``None``: unknown)
    and its ``rows`` (NOTE [ Rows through the workers ]; ``None``: not chosen by the sampler)."""

    position: tuple[int, int] | None = None
    rows: tuple[int, ...] | None = None


def position_of(batch: object) -> tuple[int, int] | None:
    """The sampler position a collate's input carries (NOTE [ Position through the workers ])."""
    position = getattr(batch, "position", None)
    return position if isinstance(position, tuple) else None


def rows_of(batch: object) -> tuple[int, ...] | None:
    """How many of a collate's input items each row holds, when the sampler chose the rows
    (NOTE [ Rows through the workers ]), else ``None``."""
    rows = getattr(batch, "rows", None)
    return rows if isinstance(rows, tuple) else None


class RankAware:
    """``rank`` and ``world_size`` read when asked, not when built.

    NOTE [ Rank at iteration ]
    User code often builds the dataset and its sampler before ``init_process_group`` (or before
    a launcher such as Accelerate or Lightning sets the group up). A sampler that fixed its rank
    and world size at construction would then act as rank 0 of 1 on every process, and each
    sample would be trained once per process. So an explicit ``rank`` / ``world_size`` is kept
    as given, and a missing one is read from ``torch.distributed`` each time the sampler needs it
    (an epoch's batches, its length, its state); the epoch cache is keyed on the world size.
    """

    _rank_arg: int | None = None
    _world_arg: int | None = None

    def _set_rank_world(self, rank: int | None, world_size: int | None) -> None:
        if world_size is not None:
            _dist_defaults(0, world_size)  # the type and range of what was given, now
        if rank is not None:
            _dist_defaults(rank, world_size if world_size is not None else rank + 1)
        self._rank_arg, self._world_arg = rank, world_size

    @property
    def rank(self) -> int:
        return _dist_defaults(self._rank_arg, self._world_arg)[0]

    @rank.setter
    def rank(self, value: int | None) -> None:
        self._set_rank_world(value, self._world_arg)

    @property
    def world_size(self) -> int:
        return _dist_defaults(self._rank_arg, self._world_arg)[1]

    @world_size.setter
    def world_size(self, value: int | None) -> None:
        self._set_rank_world(self._rank_arg, value)


def resplit_error(processes: int) -> ConfigError:
    """The error for an ``accelerator.prepare`` that splits a tokenbucket batch sampler again
    (NOTE [ Accelerate shards twice ] in train/accelerate.py)."""
    return ConfigError(
        f"accelerator.prepare split the tokenbucket batch sampler again over {processes} processes (it already "
        f"yields only this rank's batches: half the samples would be lost and ranks would train different "
        f"buckets): prepare the loader with tokenbucket.train.accelerate.prepare_loader(accelerator, loader)"
    )


def pass_caller() -> FrameType | None:
    """The frame that advanced the generator this is called from (its first ``next``)."""
    frame = inspect.currentframe()
    return frame.f_back.f_back if frame is not None and frame.f_back is not None else None


def _drawn_by(frame: FrameType | None) -> _BaseDataLoaderIter | None:
    """The torch DataLoader iterator a pass is drawn by, when it draws from the sampler directly
    (``frame``: the pass's caller); refuses a wrapper that splits the batches again by process.

    NOTE [ Who draws the batches ]
    Two silent failures are decided by what iterates the sampler, which only the caller's frame
    tells: accelerate's ``BatchSamplerShard`` (``accelerator.prepare(loader)``) keeps every n-th of
    this rank's batches, and a plain ``DataLoader`` with workers draws batches ahead of training. So a
    pass looks at the few frames above it once, as it starts: a ``BatchSamplerShard`` over more than
    one process is refused at the first batch, naming ``prepare_loader``; a torch
    ``_MultiProcessingDataLoaderIter`` that draws from the sampler itself (no wrapper between that
    could drop batches) is remembered, weakly, so ``state_dict()`` counts the batches it has *handed
    out* (its ``_num_yielded``) rather than the batches drawn (NOTE [ Position through the workers ]).
    Any other caller (torchdata's ``StatefulDataLoader``, which saves the sampler's own count and
    accounts for prefetch itself; a loop; a wrapper) leaves the sampler's own count in place.
    """
    shard_type = getattr(sys.modules.get("accelerate.data_loader"), "BatchSamplerShard", None)
    direct = True
    for _ in range(8):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, _BaseDataLoaderIter):
            return owner if direct and type(owner) is _MultiProcessingDataLoaderIter else None
        if shard_type is not None and isinstance(owner, shard_type) and int(owner.num_processes) > 1:
            raise resplit_error(int(owner.num_processes))
        direct = False
        frame = frame.f_back
    return None


class EpochPosition:
    """Where a batch sampler stands, and where its next pass starts: ``epoch``, ``step`` (batches
    yielded this epoch), ``set_epoch``, the position a state holds.

    NOTE [ An epoch moves on by itself ]
    ``DistributedSampler`` replays its epoch until ``set_epoch`` is called, and many loops never call
    it on a batch sampler: Lightning without ``BucketSamplerCallback`` (its own ``set_epoch`` reaches
    ``loader.sampler`` only), the HF ``Trainer`` or ``Trainer.fit`` handed a plain loader, a
    hand-written loop. Each would train epoch 0's order in every epoch. So a pass that starts with no
    ``set_epoch`` / ``load_state_dict`` since the previous pass began is the next epoch, from its
    first batch. An explicit ``set_epoch(e)`` wins: the next pass is epoch ``e`` (from the start, or
    from a loaded position in ``e``; a state saved at the end of an epoch resumes to an empty pass,
    and the pass after it is the next epoch).
    ``epoch`` and ``step`` always say where the sampler is, so its state and a resume stay exact;
    ``len()`` between passes is the length of the epoch the next pass will be.
    """

    epoch: int
    step: int

    def _init_position(self) -> None:
        self.epoch = self.step = 0
        self._resume_step = 0  # where the next pass starts in its epoch (a loaded position)
        self._armed = True  # the next pass is the epoch set (construction, set_epoch, load_state_dict)
        self._open = False  # a pass is under way
        self._feeder: weakref.ReferenceType[_BaseDataLoaderIter] | None = None  # NOTE [ Who draws the batches ]
        self._fed_from = 0  # the step the feeder's pass started at

    def _epoch_length(self, epoch: int) -> int:
        """Batches this rank yields in ``epoch`` (each sampler says)."""
        raise AssertionError(f"{type(self).__name__} does not say how long an epoch is")

    def _next_pass(self) -> tuple[int, int]:
        """The ``(epoch, step)`` the next pass starts at (NOTE [ An epoch moves on by itself ])."""
        return (self.epoch, self._resume_step) if self._armed else (self.epoch + 1, 0)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` with the next pass (call it before each epoch, as with
        ``DistributedSampler``; a sampler iterated again without it moves on to the next epoch)."""
        if epoch != self.epoch:
            self.step = self._resume_step = 0
        self.epoch, self._armed, self._feeder = int(epoch), True, None

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (between passes: the next one), the same on every rank."""
        return self._epoch_length(self.epoch if self._open else self._next_pass()[0])

    def _begin_pass(self, caller: FrameType | None) -> int:
        """Moves to where a starting pass begins and returns its first step."""
        feeder = _drawn_by(caller)
        self.epoch, start = self._next_pass()
        self.step, self._resume_step, self._armed, self._open = start, 0, False, True
        self._feeder, self._fed_from = (weakref.ref(feeder) if feeder is not None else None), start
        return start

    def _pass(self, batch: Any, length: int, start: int) -> Iterator[list[int]]:
        """Yields steps ``start..length`` of the current epoch (``batch(s)``: this rank's batch at step s)."""
        try:
            for s in range(start, length):
                self.step = s + 1
                indices = batch(s)
                rows = indices.rows if isinstance(indices, StepIndices) else None  # NOTE [ Rows through the workers ]
                yield StepIndices.of(indices, self.epoch, s + 1, rows)
        finally:
            self._open = False

    def _trained_step(self) -> int:
        """The batches of this epoch handed to training (NOTE [ Who draws the batches ])."""
        if self._feeder is None:
            return self.step
        loader = self._feeder()
        if loader is not None:
            return min(self.step, self._fed_from + int(loader._num_yielded))
        if self.step < self._epoch_length(self.epoch):
            raise StateError(
                "cannot tell which batches were trained: a DataLoader with workers drew this epoch's batches ahead "
                "of training and is gone; take sampler.state_dict() while it iterates, or "
                "sampler.state_dict(after=batch['info']) (the last batch trained), or use torchdata's StatefulDataLoader"
            )
        return self.step

    def _state(self, keys: Sequence[str], after: BatchInfo | None) -> dict[str, Any]:
        state = sampler_state(self, keys)
        if after is None:
            state[STEP_KEY] = self._trained_step()
        return with_position(state, after)

    def _load_position(self, epoch: int, step: int) -> None:
        self.epoch, self.step, self._resume_step = epoch, step, step
        self._armed, self._feeder = True, None


class BucketBatchSampler(EpochPosition, RankAware, Sampler[list[int]]):
    """Yields one rank's batches (lists of dataset indices) for ``DataLoader(batch_sampler=...)``.

    Args:
        buckets: bucket index per sample (``-1``: left out, e.g. rejected), as in a manifest.
        batch_sizes: the plan's batch size per bucket (static mode).
        plan_id: identifies the plan/manifest (its content hash); part of the seed and of the state.
        shuffle, seed, drop_last: as in ``torch.utils.data.DistributedSampler``.
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1.
        sync_buckets: every rank draws from the same bucket at the same step.
        dynamic: ``(lengths, cost_model, budget_bytes, pool_batches)`` for dynamic batches; a
            :class:`DynamicFill2D` ``(lengths, vision, cost_model, budget_bytes, pool_batches)``
            for a 2D dynamic plan (each batch at its own longest and most image tokens; state
            ``mode`` ``"dynamic_2d"``).

    State keys: ``epoch``, ``step``, ``plan_id``, ``world_size``, ``seed``, ``drop_last``,
    ``sync_buckets``, ``mode``.

    Example:
        >>> s = BucketBatchSampler([0, 0, 1, 1, 1], [2, 2], plan_id="ab" * 8, shuffle=False)
        >>> list(s)
        [[0, 1], [2, 3], [4]]
    """

    STATE_KEYS = (*POSITION_KEYS, "plan_id", "world_size", "seed", "drop_last", "sync_buckets", "mode")

    def __init__(
        self,
        buckets: Sequence[int] | np.ndarray,
        batch_sizes: Sequence[int],
        *,
        plan_id: str,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        sync_buckets: bool = True,
        dynamic: DynamicFill | DynamicFill2D | None = None,
    ) -> None:
        self._set_rank_world(rank, world_size)  # NOTE [ Rank at iteration ]
        if not isinstance(plan_id, str) or len(plan_id) < 15 or any(c not in "0123456789abcdef" for c in plan_id):
            raise ConfigError(f"plan_id should be a hex digest (the manifest's content hash), but got {plan_id!r}")
        self.buckets = np.asarray(buckets, dtype=np.int64)
        self.batch_sizes = [int(b) for b in batch_sizes]
        if self.buckets.size and self.buckets.max() >= len(self.batch_sizes):
            raise ConfigError(
                f"bucket {int(self.buckets.max())} has no batch size; the plan has {len(self.batch_sizes)} buckets"
            )
        for k, b in enumerate(self.batch_sizes):
            if b < 1:
                raise ConfigError(f"batch_size should be a positive integer, but got batch_sizes[{k}]={b}")
        self.plan_id, self.shuffle, self.seed, self.drop_last = plan_id, shuffle, int(seed), drop_last
        self.sync_buckets = sync_buckets
        self.dynamic = dynamic
        self.mode = dynamic_mode(dynamic)
        self._init_position()  # NOTE [ An epoch moves on by itself ]
        self._cache: Epoch | None = None
        self._cache_key: tuple[int, int] = (-1, 0)  # (epoch, world size) it was drawn for
        self._order: list[np.ndarray] | None = None
        self.dropped = 0

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        *,
        cost_model: PredictsMemory | SupportsCost2D | None = None,
        pool_batches: int | None = None,
        **kwargs: Unpack[SamplerOptions],
    ) -> BucketBatchSampler:
        """A sampler over a :class:`~tokenbucket.plan.manifest.Manifest` (rows in dataset order).

        A 1D dynamic-mode manifest needs the ``cost_model`` it was planned with, to fill batches
        (``pool_batches`` per pool, default 32). A 2D dynamic one (``tokenbucket plan --buckets 2d
        --mode dynamic``) needs nothing more: it stores its cost model, ``pool_batches`` and seed
        (NOTE [ A two-dimensional dynamic manifest ]), so epoch 0 is the plan's own batches and
        later epochs are the in-memory sampler's; ``cost_model``, ``pool_batches`` and ``seed``
        given replace the stored ones.

        Raises:
            ConfigError: a packed manifest (one line naming its sampler), a 1D dynamic one without
                ``cost_model``, or a 2D dynamic one whose stored model cannot cut its batches.
        """
        plan = manifest.plan
        if plan.mode == "packed":
            reader = "PackedBatchSampler2D" if is_two_cap(plan) else "PackedBatchSampler"
            raise ConfigError(f"a packed manifest is read by {reader}.from_manifest, not BucketBatchSampler's")
        buckets = manifest.table.column("bucket").to_numpy()
        if is_dynamic_2d(plan):  # NOTE [ A two-dimensional dynamic manifest ]
            two = dynamic_plan_of(manifest, cost_model=cast("SupportsCost2D | None", cost_model))
            pools = two.pool_batches if pool_batches is None else pool_batches
            kwargs["dynamic"] = DynamicFill2D(two.lengths, two.vision, two.cost_model, two.budget_bytes, pools)
            kwargs.setdefault("seed", two.seed)
        elif plan.mode == "dynamic":
            if cost_model is None:
                raise ConfigError("a dynamic-mode manifest needs cost_model= to fill its batches to the budget")
            totals = manifest.table.column("total").fill_null(0).to_numpy()
            pools = 32 if pool_batches is None else pool_batches
            kwargs["dynamic"] = DynamicFill(totals, cost_model, plan.budget_bytes, pools)
        return cls(buckets, plan.batch_sizes.tolist(), plan_id=manifest.content_hash, **kwargs)

    # -- the epoch ---------------------------------------------------------------------------

    def _epoch(self, epoch: int | None = None) -> Epoch:
        """All ranks' batches of ``epoch`` (default: the current one), kept until another is asked for."""
        key = (self.epoch if epoch is None else epoch, self.world_size)  # NOTE [ Rank at iteration ]
        if self._cache is None or self._cache_key != key:
            if self._order is None:  # the same every epoch: group once
                self._order = members_by_bucket(self.buckets, len(self.batch_sizes))
            self._cache = epoch_steps(
                self.buckets,
                self.batch_sizes,
                seed=self.seed,
                epoch=key[0],
                plan_id=self.plan_id,
                world_size=key[1],
                sync_buckets=self.sync_buckets,
                drop_last=self.drop_last,
                shuffle=self.shuffle,
                dynamic=self.dynamic,
                order=self._order,
            )
            self._cache_key = key
        self.dropped = self._cache.dropped
        return self._cache

    def _epoch_length(self, epoch: int) -> int:
        return len(self._epoch(epoch))

    def __iter__(self) -> Iterator[list[int]]:
        start = self._begin_pass(pass_caller())  # NOTE [ An epoch moves on by itself ]
        epoch = self._epoch()
        rank = self.rank  # read once, as the epoch starts (NOTE [ Rank at iteration ])
        yield from self._pass(lambda s: epoch.batch(s, rank), len(epoch), start)

    # -- state -------------------------------------------------------------------------------

    def state_dict(self, *, after: BatchInfo | None = None) -> dict[str, Any]:
        """Where the sampler stands: after the batches handed to training (NOTE [ Who draws the
        batches ]), or ``after`` the batch whose info is given (NOTE [ Position through the workers ])."""
        return self._state(self.STATE_KEYS, after)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_position(
            *resume_position(state, sampler_state(self, self.STATE_KEYS, identity_only=True), "sampler")
        )


def with_position(state: dict[str, Any], after: BatchInfo | None) -> dict[str, Any]:
    """``state`` at the position ``after`` carries, instead of the sampler's own count."""
    if after is None:
        return state
    if after.position is None:
        raise StateError(
            "this batch carries no sampler position: its collate did not get the indices from the sampler through "
            "TokenBucketDataset (NOTE [ Position through the workers ]); use torchdata's StatefulDataLoader instead"
        )
    state[EPOCH_KEY], state[STEP_KEY] = after.position
    return state


def sampler_state(sampler: object, keys: Sequence[str], *, identity_only: bool = False) -> dict[str, Any]:
    """``{key: sampler.key}`` for ``keys`` (without the position with ``identity_only``); NOTE [ Sampler state keys ]."""
    return {key: getattr(sampler, key) for key in keys if not (identity_only and key in POSITION_KEYS)}


def resume_position(state: Mapping[str, Any], mine: Mapping[str, Any], what: str) -> tuple[int, int]:
    """A saved sampler state's ``(epoch, step)``, once its identity (``mine``: plan id, world
    size, seed, ...) is this sampler's; else a StateError saying why the position means nothing here."""
    if not isinstance(state, Mapping):
        raise StateError(f"cannot resume: the saved {what} state should be a dict, but got {type(state).__name__}")
    state = dict(state)
    for key, value in mine.items():
        if key not in state:
            raise StateError(f"cannot resume: the saved {what} state has no {key!r} (it holds {sorted(state)})")
        theirs = state.pop(key)
        if theirs != value:
            why = {
                "plan_id": "the manifest changed, so the saved position means other batches; start a new epoch",
                "world_size": "the number of ranks changed, so every rank's slice changed",
            }.get(key, "the batches of the epoch would differ")
            raise StateError(f"cannot resume: saved {key}={theirs!r} but this sampler has {key}={value!r} ({why})")
    for key in POSITION_KEYS:
        if key not in state:
            raise StateError(f"cannot resume: the saved {what} state has no {key!r}")
    epoch, step = state_count(state, EPOCH_KEY, what), state_count(state, STEP_KEY, what)
    del state[EPOCH_KEY], state[STEP_KEY]
    if state:
        raise StateError(f"unexpected keys in the {what} state: {sorted(state)}")
    return epoch, step


def state_count(state: Mapping[str, object], key: str, what: str) -> int:
    """``state[key]`` as a count (an integer >= 0, as saved: ``2.7``, ``"3"``, ``True`` or ``None``
    are refused, never rounded), or a StateError naming the key."""
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise StateError(
            f"cannot resume: the saved {what} state's {key!r} should be an integer >= 0, but got {value!r}"
        )
    return int(value)


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size should be a positive integer, but got world_size={world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank should be in [0, world_size={world_size}), but got rank={rank!r}")
    return rank, world_size


def plan_id_of(text: str) -> str:
    """A plan id for ad-hoc use (tests, plans without a manifest): SHA-256 of ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()
