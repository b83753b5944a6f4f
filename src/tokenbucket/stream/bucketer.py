"""Bucketing for streams (webdataset shards, any ``IterableDataset``): samples arrive one at a
time, are counted from their metadata, wait in their bucket's buffer and leave as batches that
fit the plan.

NOTE [ Stream bucketing ]
* Each sample's metadata (a ``.json`` member, a dict, or what a callable returns) is counted
  with the same ``TokenSpec`` as offline, ``lookahead`` samples at a time (one vectorised
  :func:`~tokenbucket.tokens.breakdown.breakdown_table` call; one by one the breakdown alone would
  cost ~30 µs a sample, the whole stage costs ~15 µs: benchmarks/bench_stream.py), and the
  sample goes to the buffer of its plan bucket.
* A static bucket emits a batch when it holds its batch size; a dynamic bucket when the next
  sample would no longer fit the budget at the batch's longest length.
* ``max_buffered`` bounds the samples waiting in buffers: past it, the fullest bucket (relative
  to its batch size) is emitted early, as a partial batch; ``stats.early`` counts how often.
  At most ``max_buffered + lookahead`` samples are held.
* At the end of the stream every partial bucket is emitted (static: padded with empty rows
  to the bucket's shape; dynamic: a smaller batch). Nothing is dropped: a sample is in a batch
  or in the rejected sink with its reason (invalid metadata, ``oversize``, ``over_epoch``).
* ``batches=N`` makes the stream emit exactly ``N`` batches: fewer are padded with empty
  batches (of the cheapest bucket), more are cut and the samples not emitted recorded as
  ``over_epoch``. :func:`~tokenbucket.stream.emission.stream_batch_counts` computes, from a
  shard index, the ``N`` at which every rank and worker emits every sample: equal steps on
  every rank, nothing cut.
* The stage has no randomness of its own: its batches are a function of the order samples
  arrive in (shuffle shards and samples upstream, with a seed, as webdataset does).

This module is the stage itself; the counting is :mod:`~tokenbucket.stream.counting`, the
buffers and emission rules :mod:`~tokenbucket.stream.emission`, the resume state
:mod:`~tokenbucket.stream.state`, the ``IterableDataset`` and collate
:mod:`~tokenbucket.stream.dataset`, a plan from a sample of the stream
:mod:`~tokenbucket.stream.estimate`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, TypeAlias, TypedDict

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import SupportsCost
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.stream.counting import ChunkCounter, Meta
from tokenbucket.stream.emission import BucketBuffers, Member, bucket_index
from tokenbucket.stream.state import ShardProgress, StreamState, StreamStats, shard_of
from tokenbucket.tokens.spec import MODALITY_COLUMNS, TokenSpec
from tokenbucket.train.batch import BatchInfo

__all__ = ["RejectedSink", "StreamBatch", "StreamBucketer", "StreamOptions", "read_rejected"]

ON_INVALID = ("reject", "error")
_END = object()

#: where rejected samples go: a JSONL path (one record a line) or a callable taking each record
RejectedSink: TypeAlias = str | os.PathLike[str] | Callable[[dict[str, object]], object] | None
#: what the buffers hold of a sample: the sample and its tokens by modality
_Item: TypeAlias = tuple[object, tuple[int, ...]]


@dataclass(frozen=True)
class StreamBatch:
    """One batch of the stream: its samples (as the stream gave them) and what the monitor reads.

    ``rows`` x ``length`` is the padded shape (static: the bucket's; dynamic: the samples and
    their longest); ``rows - len(samples)`` rows are empty. ``reason``: ``full``, ``early``
    (``max_buffered`` hit), ``flush`` (end of stream) or ``pad`` (an equal-steps filler).
    """

    bucket: int
    samples: tuple[Any, ...]  # Any: whatever the source yields, for the collate to index
    keys: tuple[str, ...]
    lengths: tuple[int, ...]
    rows: int
    length: int
    predicted_peak_bytes: int
    budget_bytes: int
    reason: str
    # per sample, its tokens by modality (MODALITY_COLUMNS), as the map-style collate reports them
    modality_tokens: tuple[tuple[int, ...], ...] = ()
    vision_bound: int | None = None  # a 2D static bucket's image-token bound (NOTE [ Two-dimensional buckets ])

    @property
    def empty_rows(self) -> int:
        return self.rows - len(self.samples)

    def info(self) -> BatchInfo:
        """A :class:`~tokenbucket.train.batch.BatchInfo` for the monitor: shape, keys, predicted peak
        and tokens by modality (the batch's and each row's)."""
        real = sum(self.lengths)
        rows = self.modality_tokens or tuple((0,) * len(MODALITY_COLUMNS) for _ in self.lengths)
        tokens = {name: sum(r[j] for r in rows) for j, name in enumerate(MODALITY_COLUMNS)}
        return BatchInfo(
            bucket=self.bucket,
            shape=(self.rows, self.length),
            keys=self.keys,
            tokens=tokens,
            real_tokens=real,
            padded_tokens=self.rows * self.length,
            predicted_peak_bytes=self.predicted_peak_bytes,
            risk=self.predicted_peak_bytes / self.budget_bytes,
            lengths=self.lengths,
            row_tokens=rows,
            vision_bound=self.vision_bound,
        )


class StreamOptions(TypedDict, total=False):
    """:class:`StreamBucketer`'s keyword arguments, as the wrappers that make one pass them on."""

    cost_model: SupportsCost | None
    meta: Meta
    key: str
    max_buffered: int | None
    lookahead: int
    on_invalid: str
    rejected: RejectedSink
    batches: int | None
    shard_sizes: Mapping[str, int] | None


class StreamBucketer:
    """The stream stage: ``StreamBucketer(plan, spec)(samples)`` yields :class:`StreamBatch` es
    (NOTE [ Stream bucketing ]).

    Args:
        plan: the :class:`~tokenbucket.plan.bucket_plan.BucketPlan` (from a manifest built offline, or
            :func:`~tokenbucket.stream.estimate.estimate_plan` on a sample of the stream).
        spec: the token spec the plan was made with.
        cost_model: needed for dynamic plans (and gives exact predicted peaks).
        meta: where a sample's metadata is: a key of the sample (default ``"json"``: bytes,
            str or dict) or a callable ``sample -> dict``.
        key: the sample's key field (webdataset's ``__key__``).
        max_buffered: the most samples waiting in bucket buffers (``None``: unbounded).
        lookahead: samples counted per vectorised breakdown call.
        on_invalid: ``"reject"`` (default: record and go on) or ``"error"`` (raise).
        rejected: a JSONL path (one line per rejected sample: key, shard, column, value,
            reason, message) or a callable taking that dict.
        batches: emit exactly this many batches (see
            :func:`~tokenbucket.stream.emission.stream_batch_counts`).
        shard_sizes: samples with valid metadata per shard URL (``ShardIndex.bucketed`` passes
            them): a shard is then done exactly when all of them are handled, so a resume is
            exact even when the source interleaves shards (a shuffle buffer across shard ends).

    State keys (``state_dict``, :class:`~tokenbucket.stream.state.StreamState`): ``done_shards``,
    ``emitted`` (keys already handled from shards not yet done), ``counted`` (valid samples
    handled per such shard), ``buffered`` (``[shard, key]`` of samples waiting), ``batches``
    (emitted in this pass), ``ended`` (the pass is over: a resume starts the next), ``stats``.
    """

    STATE_KEYS: ClassVar[tuple[str, ...]] = StreamState.KEYS

    def __init__(
        self,
        plan: BucketPlan,
        spec: TokenSpec,
        *,
        cost_model: SupportsCost | None = None,
        meta: Meta = "json",
        key: str = "__key__",
        max_buffered: int | None = None,
        lookahead: int = 512,
        on_invalid: str = "reject",
        rejected: RejectedSink = None,
        batches: int | None = None,
        shard_sizes: Mapping[str, int] | None = None,
    ) -> None:
        if on_invalid not in ON_INVALID:
            raise ConfigError(f"on_invalid should be one of {ON_INVALID}, but got on_invalid={on_invalid!r}")
        for name, value in (("max_buffered", max_buffered), ("batches", batches)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name} should be a non-negative integer or None, but got {name}={value!r}")
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
            raise ConfigError(f"lookahead should be a positive integer, but got lookahead={lookahead!r}")
        if not plan.buckets:
            raise ConfigError("the plan has no buckets")
        self.plan, self.spec, self.cost_model = plan, spec, cost_model
        self.meta, self.key, self.max_buffered, self.lookahead = meta, key, max_buffered, lookahead
        self.on_invalid, self.batches = on_invalid, batches
        self.rejected = rejected
        self.shard_sizes = dict(shard_sizes) if shard_sizes is not None else None
        self._counter = ChunkCounter(spec, meta=meta, key=key, reject=self._invalid)
        self.stats = StreamStats()
        self._loaded: StreamState | None = None  # a loaded state, until the resumed pass starts
        self._progress = ShardProgress(self.shard_sizes, self._reopened)
        self._warned_reopen = False

    # -- rejects ---------------------------------------------------------------------------------

    def _invalid(self, sample: object, key: str, message: str, column: str | None, value: object) -> None:
        self._reject(sample, key, "invalid", message, column, value)

    def _reject(
        self, sample: object, key: str, reason: str, message: str, column: str | None = None, value: object = None
    ) -> None:
        if self.on_invalid == "error" and reason != "over_epoch":
            raise ConfigError(f"stream sample {key!r}: {message}")
        self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
        self._progress.handled(sample, key, valid=reason != "invalid")
        record: dict[str, object] = {
            "key": key,
            "shard": shard_of(sample),
            "column": column,
            "value": _jsonable(value),
            "reason": reason,
            "message": message,
        }
        if callable(self.rejected):
            self.rejected(record)
        elif self.rejected is not None:
            with open(self.rejected, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    # -- the stage -----------------------------------------------------------------------------

    def __call__(self, samples: Iterable[object]) -> Iterator[StreamBatch]:
        # a resumed pass skips what the loaded state says was handled, and carries it in its state
        loaded, self._loaded = self._loaded, None
        if loaded is None or loaded.ended:  # a fresh pass (after an ended one: the next)
            self._progress = ShardProgress(self.shard_sizes, self._reopened)
        else:
            self.stats.samples -= len(loaded.buffered)  # read again by this pass, and counted again
            self._progress = ShardProgress(self.shard_sizes, self._reopened, resumed=loaded)
        buffers: BucketBuffers[_Item] = BucketBuffers(self.plan, self.cost_model, self.max_buffered)
        bounds = self.plan.bounds.tolist()
        largest = bounds[-1]
        two_d = self.plan.two_d
        target = self.batches
        progress = self._progress
        it = iter(samples)

        def place(chunk: list[tuple[object, str]]) -> list[StreamBatch]:
            out = []
            for sample, key, length, modal in self._counter.count(chunk):
                k = bucket_index(self.plan, bounds, length, modal[0])  # modal[0]: vision (MODALITY_COLUMNS)
                if k < 0:
                    why = (
                        f"{length:,} tokens ({modal[0]:,} of them image tokens), held by no bucket of the 2D plan"
                        if two_d
                        else f"{length:,} tokens, more than the plan's largest bucket ({largest:,})"
                    )
                    self._reject(sample, key, "oversize", why, "total", length)
                    continue
                # the buffers hold (sample, its modality counts) as the item
                out += [self._batch(buffers, *b) for b in buffers.add(k, (sample, modal), key, length)]
            return out

        chunk: list[tuple[object, str]] = []
        ended = False
        i = 0
        while not ended:
            sample = next(it, _END)
            ended = sample is _END
            if not ended:
                key = self._counter.key(sample, i)
                i += 1
                if self._progress.skipped(sample, key):
                    continue
                self.stats.samples += 1
                self._progress.read(sample, key)
                chunk.append((sample, key))
                if len(chunk) < self.lookahead:
                    continue
            ready = place(chunk)
            chunk = []
            if ended:
                ready += [self._batch(buffers, *b) for b in buffers.flush()]
            for j, batch in enumerate(ready):
                if target is not None and progress.batches >= target:
                    self._over_epoch(buffers, ready[j:], it)
                    progress.ended = True
                    return
                self._emitted(batch)  # before the yield: a state taken after it counts this batch
                yield batch
        self._check_short_shards()
        while target is not None and progress.batches < target:
            batch = self._filler(buffers)
            self._emitted(batch)
            yield batch
        progress.ended = True

    def _batch(self, buffers: BucketBuffers[_Item], k: int, members: list[Member[_Item]], reason: str) -> StreamBatch:
        rows, length = buffers.shape(k, members)
        return StreamBatch(
            bucket=k,
            samples=tuple(m[0][0] for m in members),
            keys=tuple(m[1] for m in members),
            lengths=tuple(m[2] for m in members),
            rows=rows,
            length=length,
            predicted_peak_bytes=buffers.peak(k, rows, length),
            budget_bytes=buffers.budget,
            reason=reason,
            modality_tokens=tuple(m[0][1] for m in members),
            vision_bound=self.plan.buckets[k].vision_bound if buffers.static else None,
        )

    def _emitted(self, batch: StreamBatch) -> None:
        stats = self.stats
        stats.batches += 1
        self._progress.batches += 1
        stats.early += batch.reason == "early"
        stats.flushed += batch.reason == "flush"
        stats.padded_batches += batch.reason == "pad"
        stats.real_tokens += sum(batch.lengths)
        stats.padded_tokens += batch.rows * batch.length
        for sample, key in zip(batch.samples, batch.keys, strict=True):
            self._progress.handled(sample, key)

    def _filler(self, buffers: BucketBuffers[_Item]) -> StreamBatch:
        k, rows, length = buffers.cheapest()
        return StreamBatch(
            bucket=k,
            samples=(),
            keys=(),
            lengths=(),
            rows=rows,
            length=length,
            predicted_peak_bytes=buffers.peak(k, rows, length),
            budget_bytes=buffers.budget,
            reason="pad",
            vision_bound=self.plan.buckets[k].vision_bound if buffers.static else None,
        )

    def _over_epoch(self, buffers: BucketBuffers[_Item], pending: list[StreamBatch], rest: Iterator[object]) -> None:
        """The epoch's batch count is reached: record every sample not emitted, and read the rest."""
        leftovers = [(s, k) for batch in pending for s, k in zip(batch.samples, batch.keys, strict=True)]
        leftovers += [(item[0], k) for _, members, _ in buffers.flush() for item, k, _ in members]
        for sample in rest:
            key = self._counter.key(sample, -1)
            if not self._progress.skipped(sample, key):  # handled before a resume: not this pass's to record
                leftovers.append((sample, key))
        for sample, key in leftovers:
            self.stats.over_epoch += 1
            self._reject(
                sample,
                key,
                "over_epoch",
                "the epoch's batch count was reached before this sample was "
                "emitted (raise batches=, see stream_batch_counts)",
            )

    def _check_short_shards(self) -> None:
        """At the stream's end, a shard begun but short of its indexed count lost samples on the way
        (cut after it was indexed, or the reader stopped inside it): say which and how many. A shard
        never begun is another worker's or rank's."""
        if self.shard_sizes is None:
            return
        short = {
            shard: (got, self.shard_sizes[shard])
            for shard, got in self._progress.counted.items()
            if shard in self.shard_sizes and got < self.shard_sizes[shard]
        }
        if short:
            lost = sum(size - got for got, size in short.values())
            named = ", ".join(f"{s!r} gave {g} of {n}" for s, (g, n) in sorted(short.items())[:5])
            warnings.warn(
                f"{lost} indexed sample(s) never arrived from {len(short)} shard(s) the stream began: {named} "
                "(a shard cut or changed since it was indexed? index it again)",
                stacklevel=3,
            )

    # -- resume (NOTE [ Stream state ] in tokenbucket.stream.state) ------------------------------

    def _reopened(self, shard: str) -> None:
        if not self._warned_reopen:
            self._warned_reopen = True
            # stacklevel: this, ShardProgress.read, the stage's loop
            warnings.warn(
                f"shard {shard!r} gave a sample after the stream had moved past it (a source that "
                "interleaves shards, e.g. a shuffle buffer across shard ends): a resume may repeat some of "
                "its samples; pass shard_sizes= (ShardIndex.bucketed does) for an exact resume",
                stacklevel=3,
            )

    def state_dict(self) -> dict[str, object]:
        """Where the stream is (NOTE [ Stream state ]): shards done, keys emitted from shards in
        progress, keys buffered (not their data), and the counters."""
        if self._loaded is not None:  # loaded, not yet iterated: hand the loaded state on
            return replace(self._loaded, stats=self.stats).to_dict()
        return self._progress.snapshot(self.stats).to_dict()

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Resume: samples of done shards and emitted keys are skipped; buffered ones are read again."""
        loaded = StreamState.from_dict(state)
        self.stats = loaded.stats
        self._loaded = loaded


def _jsonable(value: object) -> bool | int | float | str | None:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return repr(value)


def read_rejected(path: str | Path) -> list[dict[str, object]]:
    """The rejected sink's records (``key``, ``shard``, ``column``, ``value``, ``reason``, ``message``)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
