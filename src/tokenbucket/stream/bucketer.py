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
  ``over_epoch``. :func:`stream_batch_counts` computes, from a shard index, the ``N`` at which
  every rank and worker emits every sample: equal steps on every rank, nothing cut.
* The stage has no randomness of its own: its batches are a function of the order samples
  arrive in (shuffle shards and samples upstream, with a seed, as webdataset does).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset

from tokenbucket._exceptions import ConfigError, MetadataError
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.tokens.breakdown import breakdown_sample, breakdown_table
from tokenbucket.tokens.metadata import table_from_rows
from tokenbucket.tokens.spec import MODALITY_COLUMNS
from tokenbucket.train.batch import BatchInfo

__all__ = ["BucketedStream", "PlanEstimate", "StreamBatch", "StreamBucketer", "StreamCollate", "StreamStats",
           "estimate_plan", "read_rejected", "stream_batch_counts"]

ON_INVALID = ("reject", "error")
_END = object()
_DECODE = json.JSONDecoder().decode


@dataclass(frozen=True)
class StreamBatch:
    """One batch of the stream: its samples (as the stream gave them) and what the monitor reads.

    ``rows`` x ``length`` is the padded shape (static: the bucket's; dynamic: the samples and
    their longest); ``rows - len(samples)`` rows are empty. ``reason``: ``full``, ``early``
    (``max_buffered`` hit), ``flush`` (end of stream) or ``pad`` (an equal-steps filler).
    """

    bucket: int
    samples: tuple[Any, ...]
    keys: tuple[str, ...]
    lengths: tuple[int, ...]
    rows: int
    length: int
    predicted_peak_bytes: int
    budget_bytes: int
    reason: str
    # per sample, its tokens by modality (MODALITY_COLUMNS), as the map-style collate reports them
    modality_tokens: tuple[tuple[int, ...], ...] = ()

    @property
    def empty_rows(self) -> int:
        return self.rows - len(self.samples)

    def info(self) -> Any:
        """A :class:`~tokenbucket.train.collate.BatchInfo` for the monitor: shape, keys, predicted peak
        and tokens by modality (the batch's and each row's)."""
        real = sum(self.lengths)
        rows = self.modality_tokens or tuple((0,) * len(MODALITY_COLUMNS) for _ in self.lengths)
        tokens = {name: sum(r[j] for r in rows) for j, name in enumerate(MODALITY_COLUMNS)}
        return BatchInfo(bucket=self.bucket, shape=(self.rows, self.length), keys=self.keys, tokens=tokens,
                         real_tokens=real, padded_tokens=self.rows * self.length,
                         predicted_peak_bytes=self.predicted_peak_bytes, risk=self.predicted_peak_bytes / self.budget_bytes,
                         lengths=self.lengths, row_tokens=rows)


@dataclass
class StreamStats:
    """Counters of one stream (one worker's): what came in, what left, and why."""

    samples: int = 0
    batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    early: int = 0
    flushed: int = 0
    padded_batches: int = 0
    over_epoch: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def get_report(self) -> str:
        eff = self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0
        rejected = ", ".join(f"{k} {v:,}" for k, v in sorted(self.rejected.items())) or "none"
        return (f"{self.samples:,} samples -> {self.batches:,} batches (padding efficiency {eff:.3f}); early "
                f"emits {self.early:,}, end-of-stream partials {self.flushed:,}, filler batches "
                f"{self.padded_batches:,}, over the epoch's batches {self.over_epoch:,}; rejected: {rejected}")


class _Buffers:
    """The per-bucket buffers and the emission rules (shared by the stage and the simulation)."""

    def __init__(self, plan: Any, cost_model: Any, max_buffered: int | None) -> None:
        self.plan, self.cost, self.max_buffered = plan, cost_model, max_buffered
        self.static = plan.mode == "static"
        if not self.static and cost_model is None:
            raise ConfigError("a dynamic plan needs cost_model= to fill stream batches to the budget")
        self.budget = int(plan.budget_bytes)
        self.items: list[list[tuple[Any, str, int]]] = [[] for _ in plan.buckets]
        self.longest = [0] * len(plan.buckets)
        self.count = 0
        self._caps: dict[int, int] = {}
        self._peaks: dict[tuple[int, int], int] = {}

    def _cap(self, length: int) -> int:
        cap = self._caps.get(length)
        if cap is None:
            cap = self._caps[length] = self.cost.max_batch(length, self.budget)
        return cap

    def peak(self, rows: int, length: int) -> int:
        if self.cost is None:
            return int(self.plan.buckets[self._bucket_of(length)].predicted_peak_bytes)
        key = (rows, length)
        p = self._peaks.get(key)
        if p is None:
            p = self._peaks[key] = int(self.cost.memory(rows, length).total)
        return p

    def _bucket_of(self, length: int) -> int:
        return int(np.searchsorted(self.plan.bounds, length, side="left"))

    def add(self, k: int, item: Any, key: str, length: int) -> list[tuple[int, list[tuple[Any, str, int]], str]]:
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

    def _take(self, k: int, reason: str) -> tuple[int, list[tuple[Any, str, int]], str]:
        buf = self.items[k]
        self.items[k] = []
        self.longest[k] = 0
        self.count -= len(buf)
        return k, buf, reason

    def flush(self) -> list[tuple[int, list[tuple[Any, str, int]], str]]:
        return [self._take(k, "flush") for k in range(len(self.items)) if self.items[k]]

    def shape(self, k: int, members: Sequence[tuple[Any, str, int]]) -> tuple[int, int]:
        if self.static:
            b = self.plan.buckets[k]
            return b.batch_size, b.bound
        return max(1, len(members)), max((m[2] for m in members), default=1)


class StreamBucketer:
    """The stream stage: ``StreamBucketer(plan, spec)(samples)`` yields :class:`StreamBatch` es
    (NOTE [ Stream bucketing ]).

    Args:
        plan: the :class:`~tokenbucket.plan.buckets.BucketPlan` (from a manifest built offline, or
            :func:`estimate_plan` on a sample of the stream).
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
        batches: emit exactly this many batches (see :func:`stream_batch_counts`).
        shard_sizes: samples with valid metadata per shard URL (``ShardIndex.bucketed`` passes
            them): a shard is then done exactly when all of them are handled, so a resume is
            exact even when the source interleaves shards (a shuffle buffer across shard ends).

    State keys (``state_dict``): ``done_shards``, ``emitted`` (keys already handled from shards
    not yet done), ``counted`` (valid samples handled per such shard), ``buffered``
    (``[shard, key]`` of samples waiting), ``batches`` (emitted in this pass), ``ended`` (the
    pass is over: a resume starts the next), ``stats``.
    """

    STATE_KEYS = ("done_shards", "emitted", "counted", "buffered", "batches", "ended", "stats")

    def __init__(self, plan: Any, spec: Any, *, cost_model: Any = None, meta: str | Callable[[Any], Any] = "json",
                 key: str = "__key__", max_buffered: int | None = None, lookahead: int = 512,
                 on_invalid: str = "reject", rejected: str | os.PathLike[str] | Callable[[dict[str, Any]], Any] | None = None,
                 batches: int | None = None, shard_sizes: Mapping[str, int] | None = None) -> None:
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
        self._absent = spec.absent_as_zero()  # what a sample lacking an optional key counts
        self.stats = StreamStats()
        self._loaded: dict[str, Any] | None = None  # a loaded state, until the resumed pass starts
        self._skipping: tuple[set[str], dict[str, set[str]]] = (set(), {})
        self._live: dict[str, Any] = self._fresh_live({}, {}, {}, 0)
        self._warned_reopen = False

    @staticmethod
    def _fresh_live(done: Iterable[str], emitted: Mapping[str, Iterable[str]], counted: Mapping[str, int],
                    batches: int) -> dict[str, Any]:
        # done: a dict as an ordered set (a source that interleaves shards asks "done?" often)
        return {"done": dict.fromkeys(sorted(done)), "emitted": {s: list(k) for s, k in emitted.items()}, "counted": dict(counted),
                "pending": {}, "buffered": {}, "batches": batches, "ended": False}

    # -- metadata ----------------------------------------------------------------------------

    def _metadata(self, sample: Any) -> dict[str, Any]:
        if callable(self.meta):
            value = self.meta(sample)
        else:
            if not (type(sample) is dict or isinstance(sample, Mapping)) or self.meta not in sample:
                raise MetadataError("is missing from the sample", column=str(self.meta), value=None)
            value = sample[self.meta]
        if type(value) is bytes or isinstance(value, (bytearray, str)):
            try:
                # decode the text ourselves: json.loads would sniff the bytes' encoding every call
                value = _DECODE(value if isinstance(value, str) else value.decode("utf-8"))
            except ValueError as exc:
                text = value[:60] if isinstance(value, str) else bytes(value[:60])
                raise MetadataError(f"is not valid JSON ({exc})", column=str(self.meta), value=text) from None
        if not isinstance(value, Mapping):
            raise MetadataError("should hold a JSON object", column=str(self.meta), value=type(value).__name__)
        return dict(value)

    def _key(self, sample: Any, i: int) -> str:
        if type(sample) is dict or isinstance(sample, Mapping):
            key = sample.get(self.key)
            if key is not None:
                return key if type(key) is str else str(key)
        return f"#{i}"

    def _reject(self, sample: Any, key: str, reason: str, message: str, column: str | None = None,
                value: Any = None) -> None:
        if self.on_invalid == "error" and reason != "over_epoch":
            raise ConfigError(f"stream sample {key!r}: {message}")
        self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
        self._track_handled(sample, key, valid=reason != "invalid")
        record = {"key": key, "shard": _shard(sample), "column": column, "value": _jsonable(value),
                  "reason": reason, "message": message}
        if callable(self.rejected):
            self.rejected(record)
        elif self.rejected is not None:
            with open(self.rejected, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def _count(self, chunk: list[tuple[Any, str]]) -> list[tuple[Any, str, int, tuple[int, ...]]]:
        """The chunk's samples with their token counts (total, and by modality); the invalid ones
        rejected."""
        rows, kept = [], []
        key_column = self.spec.columns.key or "key"
        for sample, key in chunk:
            try:
                row = self._metadata(sample)
                row[key_column] = key  # the stream's key is the sample's identity
                rows.append(row)
                kept.append((sample, key))
            except MetadataError as exc:
                self._reject(sample, key, "invalid", str(exc), exc.column, exc.value)
        if not rows:
            return []
        try:
            # keys are the stream's: unique per shard (webdataset's identity is url + key), so not checked here
            result = breakdown_table(table_from_rows(rows, self._absent), self.spec,
                                     on_invalid="reject", check_keys=False)
        except (MetadataError, pa.ArrowException, OverflowError, TypeError):
            # a column absent from the whole chunk, mixed types, a value past int64, a schema
            # error of one sample: count one by one, for exact reasons
            out = []
            for (sample, key), row in zip(kept, rows, strict=True):
                try:
                    bd = breakdown_sample(row, self.spec)
                    out.append((sample, key, bd.total, tuple(getattr(bd, name) for name in MODALITY_COLUMNS)))
                except MetadataError as exc:
                    self._reject(sample, key, "invalid", str(exc), exc.column, exc.value)
            return out
        table = result.table
        counts = zip(table.column("total").to_pylist(),
                     zip(*(table.column(name).fill_null(0).to_pylist() for name in MODALITY_COLUMNS), strict=True),
                     strict=True)
        counted = dict(zip(table.column("index").to_pylist(), counts, strict=True))
        bad = {r["index"]: r for r in result.rejected.to_pylist()}
        out = []
        for i, (sample, key) in enumerate(kept):
            if i in bad:
                r = bad[i]
                self._reject(sample, key, "invalid", f"column {r['column']!r} {r['reason']}", r["column"], r["value"])
            else:
                total, modal = counted[i]
                out.append((sample, key, int(total), modal))
        return out

    # -- the stage -----------------------------------------------------------------------------

    def __call__(self, samples: Iterable[Any]) -> Iterator[StreamBatch]:
        # a resumed pass skips what the loaded state says was handled, and carries it in its state
        loaded, self._loaded = self._loaded, None
        if loaded is None or loaded["ended"]:  # a fresh pass (after an ended one: the next)
            self._skipping = (set(), {})
            self._live = self._fresh_live({}, {}, {}, 0)
        else:
            self.stats.samples -= len(loaded["buffered"])  # read again by this pass, and counted again
            self._skipping = (set(loaded["done_shards"]), {s: set(k) for s, k in loaded["emitted"].items()})
            self._live = self._fresh_live(loaded["done_shards"], loaded["emitted"], loaded["counted"],
                                          loaded["batches"])
        buffers = _Buffers(self.plan, self.cost_model, self.max_buffered)
        bounds = self.plan.bounds.tolist()
        largest = bounds[-1]
        target = self.batches
        live = self._live
        it = iter(samples)

        def place(chunk: list[tuple[Any, str]]) -> list[StreamBatch]:
            out = []
            for sample, key, length, modal in self._count(chunk):
                if length > largest:
                    self._reject(sample, key, "oversize", f"{length:,} tokens, more than the plan's largest bucket "
                                 f"({largest:,})", "total", length)
                    continue
                k = bisect.bisect_left(bounds, length)
                # the buffers hold (sample, its modality counts) as the item
                out += [self._batch(buffers, *b) for b in buffers.add(k, (sample, modal), key, length)]
            return out

        chunk: list[tuple[Any, str]] = []
        ended = False
        i = 0
        while not ended:
            sample = next(it, _END)
            ended = sample is _END
            if not ended:
                key = self._key(sample, i)
                i += 1
                if self._skipped(sample, key):
                    continue
                self.stats.samples += 1
                self._track_read(sample, key)
                chunk.append((sample, key))
                if len(chunk) < self.lookahead:
                    continue
            ready = place(chunk)
            chunk = []
            if ended:
                ready += [self._batch(buffers, *b) for b in buffers.flush()]
            for j, batch in enumerate(ready):
                if target is not None and live["batches"] >= target:
                    self._over_epoch(buffers, ready[j:], it)
                    live["ended"] = True
                    return
                self._emitted(batch)  # before the yield: a state taken after it counts this batch
                yield batch
        while target is not None and live["batches"] < target:
            batch = self._filler(buffers)
            self._emitted(batch)
            yield batch
        live["ended"] = True

    def _batch(self, buffers: _Buffers, k: int, members: list[tuple[Any, str, int]], reason: str) -> StreamBatch:
        rows, length = buffers.shape(k, members)
        return StreamBatch(bucket=k, samples=tuple(m[0][0] for m in members), keys=tuple(m[1] for m in members),
                           lengths=tuple(m[2] for m in members), rows=rows, length=length,
                           predicted_peak_bytes=buffers.peak(rows, length), budget_bytes=buffers.budget, reason=reason,
                           modality_tokens=tuple(m[0][1] for m in members))

    def _emitted(self, batch: StreamBatch) -> None:
        stats = self.stats
        stats.batches += 1
        self._live["batches"] += 1
        stats.early += batch.reason == "early"
        stats.flushed += batch.reason == "flush"
        stats.padded_batches += batch.reason == "pad"
        stats.real_tokens += sum(batch.lengths)
        stats.padded_tokens += batch.rows * batch.length
        for sample, key in zip(batch.samples, batch.keys, strict=True):
            self._track_handled(sample, key)

    def _filler(self, buffers: _Buffers) -> StreamBatch:
        # the cheapest shape: an empty batch costs a step but as little memory and time as possible
        b = self.plan.buckets
        k = min(range(len(b)), key=lambda j: (b[j].batch_size * b[j].bound) if buffers.static else b[j].bound)
        rows, length = (b[k].batch_size, b[k].bound) if buffers.static else (1, 1)
        return StreamBatch(bucket=k, samples=(), keys=(), lengths=(), rows=rows, length=length,
                           predicted_peak_bytes=buffers.peak(rows, length), budget_bytes=buffers.budget, reason="pad")

    def _over_epoch(self, buffers: _Buffers, pending: list[StreamBatch], rest: Iterator[Any]) -> None:
        """The epoch's batch count is reached: record every sample not emitted, and read the rest."""
        leftovers = [(s, k) for batch in pending for s, k in zip(batch.samples, batch.keys, strict=True)]
        leftovers += [(item[0], k) for _, members, _ in buffers.flush() for item, k, _ in members]
        for sample in rest:
            key = self._key(sample, -1)
            if not self._skipped(sample, key):  # handled before a resume: not this pass's to record
                leftovers.append((sample, key))
        for sample, key in leftovers:
            self.stats.over_epoch += 1
            self._reject(sample, key, "over_epoch", "the epoch's batch count was reached before this sample was "
                         "emitted (raise batches=, see stream_batch_counts)")

    # -- resume bookkeeping -------------------------------------------------------------------

    def _skipped(self, sample: Any, key: str) -> bool:
        shards, keys = self._skipping
        if not shards and not keys:
            return False
        shard = _shard(sample)
        return shard in shards or key in keys.get(shard, ())

    # NOTE [ Stream state ]
    # A sample is *read* when the stage takes it from the stream and *handled* when it leaves in
    # a yielded batch or is rejected. Until its shard is done the keys handled from it are kept;
    # a done shard is one name. A resume skips done shards and handled keys, and reads the
    # buffered samples again from their shards: exact when the same shards are read in the same
    # order (webdataset's shardshuffle=False, or an explicit, seeded shard list), as far as the
    # shard reader can read a shard again.
    # When is a shard done? With ``shard_sizes`` (from the shard index): when all its valid
    # samples are handled — exact whatever the source interleaves. Without: when the stream has
    # moved past it and all its read samples are handled, which assumes a shard is read in one
    # go. A sample of a shard already taken for done breaks that assumption: the shard is
    # reopened and a warning says a resume may repeat its samples.

    def _track_read(self, sample: Any, key: str) -> None:
        shard = _shard(sample)
        live = self._live
        if live.get("current") != shard:
            previous = live.get("current")
            live["current"] = shard
            if previous is not None and self.shard_sizes is None:
                self._maybe_done(previous)
            if shard in live["done"] and self.shard_sizes is None:
                self._reopen(shard)
        live["pending"][shard] = live["pending"].get(shard, 0) + 1
        live["buffered"][(shard, key)] = True

    def _track_handled(self, sample: Any, key: str, valid: bool = True) -> None:
        shard = _shard(sample)
        live = self._live
        if live["buffered"].pop((shard, key), None) is None:
            return  # not read by this stage (counting only)
        live["pending"][shard] -= 1
        live["emitted"].setdefault(shard, []).append(key)
        if valid:
            live["counted"][shard] = live["counted"].get(shard, 0) + 1
        if self.shard_sizes is not None or shard != live.get("current"):
            self._maybe_done(shard)

    def _maybe_done(self, shard: str) -> None:
        live = self._live
        if not shard:  # samples without a URL: no shard to finish, their keys are kept
            return
        if self.shard_sizes is not None:
            size = self.shard_sizes.get(shard)
            if size is None or live["counted"].get(shard, 0) < size:
                return
        if live["pending"].get(shard, 0) == 0:
            live["pending"].pop(shard, None)
            live["emitted"].pop(shard, None)
            live["counted"].pop(shard, None)
            live["done"][shard] = None

    def _reopen(self, shard: str) -> None:
        del self._live["done"][shard]
        if not self._warned_reopen:
            self._warned_reopen = True
            warnings.warn(f"shard {shard!r} gave a sample after the stream had moved past it (a source that "
                          "interleaves shards, e.g. a shuffle buffer across shard ends): a resume may repeat some of "
                          "its samples; pass shard_sizes= (ShardIndex.bucketed does) for an exact resume",
                          stacklevel=3)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is (NOTE [ Stream state ]): shards done, keys emitted from shards in
        progress, keys buffered (not their data), and the counters."""
        stats = {**vars(self.stats), "rejected": dict(self.stats.rejected)}
        if self._loaded is not None:  # loaded, not yet iterated: hand the loaded state on
            return {**self._loaded, "stats": stats}
        live = self._live
        return {"done_shards": sorted(live["done"]),
                "emitted": {s: sorted(set(k)) for s, k in live["emitted"].items()},
                "counted": dict(live["counted"]),
                "buffered": [[s, k] for s, k in live["buffered"]],
                "batches": live["batches"], "ended": live["ended"], "stats": stats}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: samples of done shards and emitted keys are skipped; buffered ones are read again."""
        state = dict(state)
        missing = [k for k in self.STATE_KEYS if k not in state]
        if missing:
            raise ConfigError(f"the stream state lacks {missing} (saved by another version?)")
        loaded = {k: state.pop(k) for k in self.STATE_KEYS}
        if state:
            raise ConfigError(f"unexpected keys in the stream state: {sorted(state)}")
        self.stats = StreamStats(**dict(loaded.pop("stats")))
        self._loaded = loaded


def _shard(sample: Any) -> str:
    # the type checks are by identity first: this runs three times a sample (benchmarks/bench_stream.py)
    if type(sample) is dict or isinstance(sample, Mapping):
        url = sample.get("__url__")
        return url if type(url) is str else ("" if url is None else str(url))
    return ""


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return repr(value)


class StreamCollate:
    """Pads a :class:`StreamBatch` to its shape, as :class:`~tokenbucket.train.collate.BucketCollate` does:
    ``tokens`` ``[rows, length, ...]``, ``attention_mask``, ``row_mask``, ``keys`` and ``info``
    (a ``BatchInfo``). For ``DataLoader(..., batch_size=None, collate_fn=StreamCollate())``.

    Each sample's ``tokens_key`` entry (tensor or array ``[L_i, ...]``) must have the length its
    metadata gives. ``feature_shape`` / ``dtype`` shape the tokens of a batch without samples
    when no sample has been seen yet (default: the first sample's).
    """

    def __init__(self, tokens_key: str = "tokens", *, pad_value: float = 0, feature_shape: tuple[int, ...] = (),
                 dtype: Any = None) -> None:
        self.tokens_key, self.pad_value = tokens_key, pad_value
        self.feature_shape, self.dtype = tuple(feature_shape), dtype

    def __call__(self, batch: StreamBatch) -> dict[str, Any]:
        seqs = []
        for sample, key, length in zip(batch.samples, batch.keys, batch.lengths, strict=True):
            t = torch.as_tensor(sample[self.tokens_key])
            if t.shape[0] != length:
                raise ConfigError(f"stream sample {key!r}: its metadata says {length} tokens but its "
                                  f"{self.tokens_key!r} has shape {tuple(t.shape)}")
            seqs.append(t)
        if seqs:
            self.feature_shape, self.dtype = tuple(seqs[0].shape[1:]), seqs[0].dtype
        tokens = torch.full((batch.rows, batch.length, *self.feature_shape), self.pad_value,
                            dtype=self.dtype or torch.float32)
        attention = torch.zeros(batch.rows, batch.length, dtype=torch.bool)
        row_mask = torch.zeros(batch.rows, dtype=torch.bool)
        for r, t in enumerate(seqs):
            tokens[r, : t.shape[0]] = t
            attention[r, : t.shape[0]] = True
            row_mask[r] = True
        return {"tokens": tokens, "attention_mask": attention, "row_mask": row_mask, "keys": list(batch.keys),
                "info": batch.info()}


class BucketedStream(IterableDataset[StreamBatch]):
    """Any ``IterableDataset`` of samples, bucketed: yields :class:`StreamBatch` es (use
    ``DataLoader(BucketedStream(...), batch_size=None)``). Each DataLoader worker runs its own
    stage over its share of the source; ``state_dict`` works with torchdata's
    ``StatefulDataLoader``, per worker."""

    def __init__(self, source: Iterable[Any], plan: Any, spec: Any, **kwargs: Any) -> None:
        self.source = source
        self.bucketer = StreamBucketer(plan, spec, **kwargs)

    def __iter__(self) -> Iterator[StreamBatch]:
        return self.bucketer(self.source)

    def state_dict(self) -> dict[str, Any]:
        return self.bucketer.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.bucketer.load_state_dict(state)


# -- equal steps: how many batches each stream emits ------------------------------------------


def stream_batch_counts(shard_lengths: Sequence[Sequence[int]], plan: Any, *, world_size: int = 1,
                        num_workers: int = 1, cost_model: Any = None,
                        max_buffered: int | None = None) -> np.ndarray:
    """Batches each ``(rank, worker)`` stream emits, ``[world_size, max(1, num_workers)]``.

    ``shard_lengths[s]`` holds the token counts of shard ``s``'s valid samples, in order (see
    :func:`tokenbucket.stream.wds.index_shards`). Shards are dealt as webdataset's ``split_by_node``
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
    largest = bounds[-1]
    for rank in range(world_size):
        mine = list(shard_lengths)[rank::world_size]
        for w in range(workers):
            buffers = _Buffers(plan, cost_model, max_buffered)
            n = 0
            for shard in mine[w::workers]:
                for length in shard:
                    if length > largest:
                        continue
                    n += len(buffers.add(bisect.bisect_left(bounds, length), None, "", int(length)))
            out[rank, w] = n + len(buffers.flush())
    return out


# -- a plan from a sample of the stream --------------------------------------------------------


@dataclass(frozen=True)
class PlanEstimate:
    """A plan made from the first ``n`` samples of a stream, and how far to trust it.

    ``beyond_max_95``: with 95 % confidence, the share of the whole stream longer than the
    longest sample seen is below this (the rule of three, 3/n) — those samples will be
    rejected as ``oversize`` unless ``headroom`` covered them. ``bucket_share_95``: a 95 %
    (Wilson) interval on each bucket's share of samples; batch counts scale with it.
    """

    plan: Any
    n: int
    rejected: int
    max_seen: int
    beyond_max_95: float
    bucket_share_95: tuple[tuple[float, float], ...]

    def describe(self) -> str:
        lines = [f"plan estimated from {self.n:,} samples ({self.rejected:,} invalid); longest seen "
                 f"{self.max_seen:,} tokens; with 95 % confidence under {self.beyond_max_95:.2%} of the stream is "
                 f"longer. A sample of the first shards is only representative if the shards are shuffled."]
        for k, (lo, hi) in enumerate(self.bucket_share_95):
            lines.append(f"  bucket {k} (<= {self.plan.buckets[k].bound:,}): share {lo:.1%} .. {hi:.1%}")
        return "\n".join(lines)


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def estimate_plan(stream: Iterable[Any], n: int, spec: Any, cost_model: Any, budget_bytes: int, *,
                  meta: str | Callable[[Any], Any] = "json", headroom: float = 1.0, **plan_kwargs: Any) -> PlanEstimate:
    """Plan buckets from the first ``n`` samples of ``stream`` (their metadata only).

    ``headroom`` > 1 stretches the last bucket's bound so samples somewhat longer than any seen
    still fit (at the batch size the cost model allows there).
    """
    if n < 1:
        raise ConfigError(f"n should be a positive integer, but got n={n}")
    counter = StreamBucketer(_NoPlan(), spec, meta=meta, on_invalid="reject")
    taken: list[tuple[Any, str]] = []
    for sample in stream:
        taken.append((sample, counter._key(sample, len(taken))))
        if len(taken) == n:
            break
    seen = np.array([c[2] for c in counter._count(taken)], dtype=np.int64)
    if not len(seen):
        raise ConfigError(f"none of the first {len(taken)} samples had valid metadata")
    longest = int(seen.max())
    lengths = np.concatenate([seen, [math.ceil(longest * headroom)]]) if headroom > 1 else seen
    plan = plan_buckets(lengths, cost_model, budget_bytes, **plan_kwargs)
    buckets = plan.assign(seen)
    shares = tuple(_wilson(int((buckets == k).sum()), len(seen)) for k in range(len(plan.buckets)))
    return PlanEstimate(plan=plan, n=len(taken), rejected=sum(counter.stats.rejected.values()),
                        max_seen=longest, beyond_max_95=min(1.0, 3 / len(seen)), bucket_share_95=shares)


class _NoPlan:
    """Stands in for a plan where only the counting of :class:`StreamBucketer` is used."""

    mode = "static"
    buckets = (None,)
    budget_bytes = 1


def read_rejected(path: str | Path) -> list[dict[str, Any]]:
    """The rejected sink's records (``key``, ``shard``, ``column``, ``value``, ``reason``, ``message``)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
