"""When a stream emits its batches: the per-bucket buffers and their emission rules (shared by the
stage and its simulation), the equal-steps filler's shape, and the batch counts the simulation
gives each ``(rank, worker)`` stream (NOTE [ Stream bucketing ] in :mod:`tokenbucket.stream.bucketer`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Generic, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import SupportsCost
from tokenbucket.plan.bucket_plan import BucketPlan

__all__ = ["BucketBuffers", "Member", "Taken", "bucket_index", "stream_batch_counts"]

ItemT = TypeVar("ItemT")
#: a buffered sample: what the caller keeps of it, its key and its length
Member: TypeAlias = tuple[ItemT, str, int]
#: a batch taken from the buffers: its bucket, its members and why (``full``, ``early``, ``flush``)
Taken: TypeAlias = tuple[int, list[Member[ItemT]], str]


def bucket_index(plan: BucketPlan, bounds: list[int], length: int, vision: int) -> int:
    """The bucket of one sample (``bounds``: ``plan.bounds`` as a list), ``-1`` when none holds it:
    the first bound at least its length; in a 2D plan the first bucket holding both its counts
    (NOTE [ Two-dimensional buckets ])."""
    if not plan.two_d:
        k = bisect.bisect_left(bounds, length)
        return k if k < len(bounds) else -1
    for k, b in enumerate(plan.buckets):
        if length <= b.bound and vision <= (b.vision_bound or 0):
            return k
    return -1


class BucketBuffers(Generic[ItemT]):
    """The per-bucket buffers and the emission rules (shared by the stage and the simulation).

    A static bucket emits when it holds its batch size; a dynamic one when the next sample would
    no longer fit the budget at the batch's longest length; past ``max_buffered`` samples the
    fullest bucket (relative to its batch size) is emitted early.
    """

    def __init__(self, plan: BucketPlan, cost_model: SupportsCost | None, max_buffered: int | None) -> None:
        self.plan, self.cost, self.max_buffered = plan, cost_model, max_buffered
        self.static = plan.mode == "static"
        if not self.static and cost_model is None:
            raise ConfigError("a dynamic plan needs cost_model= to fill stream batches to the budget")
        self.budget = int(plan.budget_bytes)
        self.items: list[list[Member[ItemT]]] = [[] for _ in plan.buckets]
        self.longest = [0] * len(plan.buckets)
        self.count = 0
        self._caps: dict[int, int] = {}
        self._peaks: dict[tuple[int, int, int | None], int] = {}

    def _cap(self, length: int) -> int:
        cap = self._caps.get(length)
        if cap is None:
            assert self.cost is not None  # a dynamic plan has one (checked above); a static one never asks
            cap = self._caps[length] = self.cost.max_batch(length, self.budget)
        return cap

    def peak(self, k: int, rows: int, length: int) -> int:
        """The predicted peak of bucket ``k``'s batch of ``rows`` x ``length``: the cost model's (at
        the bucket's image-token bound too, in a 2D plan), else the plan's for the bucket."""
        b = self.plan.buckets[k]
        if self.cost is None:
            return int(b.predicted_peak_bytes)
        key = (rows, length, b.vision_bound)
        p = self._peaks.get(key)
        if p is None:
            if b.vision_bound is None:
                p = int(self.cost.memory(rows, length).total)
            else:  # a 2D plan's cost model takes vision= (NOTE [ Two-dimensional buckets ])
                p = int(self.cost.memory(rows, length, b.vision_bound).total)  # type: ignore[call-arg]
            self._peaks[key] = p
        return p

    def add(self, k: int, item: ItemT, key: str, length: int) -> list[Taken[ItemT]]:
        """Place one sample; return the batches that are complete now."""
        out = []
        if self.static:
            self.items[k].append((item, key, length))
            self.count += 1
            if len(self.items[k]) == self.plan.buckets[k].batch_size:
                out.append(self._take(k, "full"))
        else:
            longest = max(self.longest[k], length)
            if self.items[k] and len(self.items[k]) + 1 > self._cap(longest):
                out.append(self._take(k, "full"))  # a new list: the sample starts the next batch
                longest = length
            self.items[k].append((item, key, length))
            self.longest[k] = longest
            self.count += 1
        while self.max_buffered is not None and self.count > self.max_buffered:
            out.append(self._take(self._fullest(), "early"))
        return out

    def _fullest(self) -> int:
        def fill(k: int) -> float:
            if self.static:
                return len(self.items[k]) / int(self.plan.buckets[k].batch_size)
            return len(self.items[k]) / max(1, self._cap(self.longest[k])) if self.items[k] else 0.0

        return max(range(len(self.items)), key=fill)

    def _take(self, k: int, reason: str) -> Taken[ItemT]:
        buf = self.items[k]
        self.items[k] = []
        self.longest[k] = 0
        self.count -= len(buf)
        return k, buf, reason

    def flush(self) -> list[Taken[ItemT]]:
        return [self._take(k, "flush") for k in range(len(self.items)) if self.items[k]]

    def shape(self, k: int, members: Sequence[Member[ItemT]]) -> tuple[int, int]:
        if self.static:
            b = self.plan.buckets[k]
            return b.batch_size, b.bound
        return max(1, len(members)), max((m[2] for m in members), default=1)

    def cheapest(self) -> tuple[int, int, int]:
        """Bucket, rows and length of an equal-steps filler."""
        # the cheapest shape: an empty batch costs a step but as little memory and time as possible
        b = self.plan.buckets
        k = min(range(len(b)), key=lambda j: (b[j].batch_size * b[j].bound) if self.static else b[j].bound)
        rows, length = (b[k].batch_size, b[k].bound) if self.static else (1, 1)
        return k, rows, length


def stream_batch_counts(
    shard_lengths: Sequence[Sequence[int]],
    plan: BucketPlan,
    *,
    world_size: int = 1,
    num_workers: int = 1,
    cost_model: SupportsCost | None = None,
    max_buffered: int | None = None,
    shard_vision: Sequence[Sequence[int]] | None = None,
) -> npt.NDArray[np.int64]:
    """Batches each ``(rank, worker)`` stream emits, ``[world_size, max(1, num_workers)]``.

    ``shard_lengths[s]`` holds the token counts of shard ``s``'s valid samples, in order (see
    :func:`tokenbucket.stream.wds.index_shards`); a 2D plan also needs their image tokens,
    ``shard_vision`` (``ShardIndex.vision``). Shards are dealt as webdataset's ``split_by_node``
    and ``split_by_worker`` deal them (``shards[rank::world_size][worker::num_workers]``), in
    the given order. Pass ``batches=counts.max()`` to every stage, and with ``num_workers``
    workers each rank takes ``num_workers * counts.max()`` steps, the same on every rank, with
    every sample emitted once.

    Example:
        >>> from tokenbucket.plan.buckets import Bucket, BucketPlan
        >>> b = Bucket(bound=10, batch_size=2, samples=0, batches=0, tokens=0, padded_tokens=0,
        ...            predicted_peak_bytes=1, fill=0.5, padding_efficiency=1.0, step_seconds=0.0)
        >>> plan = BucketPlan(mode="static", budget_bytes=2, buckets=(b,))
        >>> stream_batch_counts([[5, 5, 5], [5], [5, 5]], plan, world_size=2).tolist()
        [[3], [1]]
    """
    workers = max(1, num_workers)
    out = np.zeros((world_size, workers), dtype=np.int64)
    bounds = plan.bounds.tolist()  # bisect on a list: this loop visits every sample of the index
    if plan.two_d and (shard_vision is None or [len(v) for v in shard_vision] != [len(s) for s in shard_lengths]):
        raise ConfigError(
            "a 2D plan places samples by their image tokens too: pass shard_vision= (ShardIndex.vision), one "
            "count per sample of shard_lengths"
        )
    vision = list(shard_vision) if shard_vision is not None else [[0] * len(s) for s in shard_lengths]
    shards = list(zip(shard_lengths, vision, strict=True))
    for rank in range(world_size):
        mine = shards[rank::world_size]
        for w in range(workers):
            buffers: BucketBuffers[None] = BucketBuffers(plan, cost_model, max_buffered)
            n = 0
            for lengths, images in mine[w::workers]:
                for length, v in zip(lengths, images, strict=True):
                    k = bucket_index(plan, bounds, int(length), int(v))
                    if k >= 0:
                        n += len(buffers.add(k, None, "", int(length)))
            out[rank, w] = n + len(buffers.flush())
    return out
