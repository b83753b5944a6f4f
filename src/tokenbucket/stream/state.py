"""The stream stage's resume state: the counters of a stream (:class:`StreamStats`), what a
checkpoint holds (:class:`StreamState`, the plain dict of ``state_dict()`` and back) and the
bookkeeping of one pass that makes it (:class:`ShardProgress`, NOTE [ Stream state ]).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from tokenbucket._exceptions import StateError
from tokenbucket.train.sampler import state_count

__all__ = ["ShardProgress", "StreamState", "StreamStats", "shard_of"]


def shard_of(sample: object) -> str:
    """The shard URL a sample came from (webdataset's ``__url__``; ``""`` without one)."""
    # the type checks are by identity first: this runs three times a sample (benchmarks/bench_stream.py)
    if type(sample) is dict or isinstance(sample, Mapping):
        url = sample.get("__url__")
        return url if type(url) is str else ("" if url is None else str(url))
    return ""


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
        return (
            f"{self.samples:,} samples -> {self.batches:,} batches (padding efficiency {eff:.3f}); early "
            f"emits {self.early:,}, end-of-stream partials {self.flushed:,}, filler batches "
            f"{self.padded_batches:,}, over the epoch's batches {self.over_epoch:,}; rejected: {rejected}"
        )

    def to_dict(self) -> dict[str, object]:
        """The counters as a plain dict (a copy), as a checkpoint holds them."""
        return {**vars(self), "rejected": dict(self.rejected)}

    @classmethod
    def from_dict(cls, saved: Mapping[str, object]) -> StreamStats:
        """The counters of :meth:`to_dict`; an unknown name is the constructor's ``TypeError``."""
        counters: dict[str, Any] = dict(saved)  # taken as saved: the constructor checks the names only
        return cls(**counters)


@dataclass(frozen=True)
class StreamState:
    """A stream's checkpoint (NOTE [ Stream state ]); ``state_dict()`` is :meth:`to_dict`,
    ``load_state_dict()`` takes :meth:`from_dict`. The keys of the dict are the class constants.

    Example:
        >>> state = StreamState(done_shards=("a.tar",), emitted={"b.tar": ("k1",)}, counted={"b.tar": 1},
        ...                     buffered=(("b.tar", "k2"),), batches=1, ended=False, stats=StreamStats())
        >>> saved = state.to_dict()
        >>> saved["buffered"], saved["stats"]["batches"]
        ([['b.tar', 'k2']], 0)
        >>> StreamState.from_dict(saved) == state
        True
    """

    DONE_SHARDS: ClassVar[str] = "done_shards"
    EMITTED: ClassVar[str] = "emitted"
    COUNTED: ClassVar[str] = "counted"
    BUFFERED: ClassVar[str] = "buffered"
    BATCHES: ClassVar[str] = "batches"
    ENDED: ClassVar[str] = "ended"
    STATS: ClassVar[str] = "stats"
    KEYS: ClassVar[tuple[str, ...]] = (DONE_SHARDS, EMITTED, COUNTED, BUFFERED, BATCHES, ENDED, STATS)

    done_shards: tuple[str, ...]  # shards all of whose samples were handled
    emitted: Mapping[str, tuple[str, ...]]  # keys handled from each shard not yet done
    counted: Mapping[str, int]  # valid samples handled per such shard
    buffered: tuple[tuple[str, str], ...]  # (shard, key) of the samples waiting in buffers (not their data)
    batches: int  # batches emitted in this pass
    ended: bool  # the pass is over: a resume starts the next
    stats: StreamStats

    def to_dict(self) -> dict[str, object]:
        """The state as plain, JSON-ready values (the ``StatefulDataLoader`` protocol wants a dict)."""
        return {
            self.DONE_SHARDS: list(self.done_shards),
            self.EMITTED: {s: list(k) for s, k in self.emitted.items()},
            self.COUNTED: dict(self.counted),
            self.BUFFERED: [[s, k] for s, k in self.buffered],
            self.BATCHES: self.batches,
            self.ENDED: self.ended,
            self.STATS: self.stats.to_dict(),
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, object]) -> StreamState:
        """A saved state: every key of :attr:`KEYS` is popped and a leftover refused. The values are
        taken as :meth:`to_dict` wrote them (a JSON round trip keeps them), not checked again."""
        if not isinstance(state, Mapping):
            raise StateError(f"cannot resume: the saved stream state should be a dict, but got {type(state).__name__}")
        state = dict(state)
        missing = [k for k in cls.KEYS if k not in state]
        if missing:
            raise StateError(f"cannot resume: the stream state lacks {missing} (saved by another version?)")
        loaded = {k: state.pop(k) for k in cls.KEYS}
        if state:
            raise StateError(f"unexpected keys in the stream state: {sorted(state)}")
        ended = loaded[cls.ENDED]
        if not isinstance(ended, bool):
            raise StateError(
                f"cannot resume: the stream state's {cls.ENDED!r} should be true or false, but got {ended!r}"
            )
        stats = StreamStats.from_dict(cast("Mapping[str, object]", loaded[cls.STATS]))
        emitted = cast("Mapping[str, Iterable[str]]", loaded[cls.EMITTED])
        return cls(
            done_shards=tuple(cast("Iterable[str]", loaded[cls.DONE_SHARDS])),
            emitted={s: tuple(k) for s, k in emitted.items()},
            counted=dict(cast("Mapping[str, int]", loaded[cls.COUNTED])),
            buffered=tuple((s, k) for s, k in cast("Iterable[tuple[str, str]]", loaded[cls.BUFFERED])),
            batches=state_count(loaded, cls.BATCHES, "stream"),
            ended=ended,
            stats=stats,
        )


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


class ShardProgress:
    """One pass's bookkeeping (NOTE [ Stream state ]): what was read, handled and is done, per
    shard, and (on a resumed pass) what the checkpoint says was handled before.

    Args:
        shard_sizes: valid samples per shard URL (a shard is done when all are handled), or ``None``.
        on_reopen: called with a shard taken for done that gives another sample (no ``shard_sizes``).
        resumed: the checkpoint this pass resumes from (``None``: a fresh pass).
    """

    def __init__(
        self,
        shard_sizes: Mapping[str, int] | None,
        on_reopen: Callable[[str], None],
        resumed: StreamState | None = None,
    ) -> None:
        self.shard_sizes, self.on_reopen = shard_sizes, on_reopen
        done: tuple[str, ...] = resumed.done_shards if resumed is not None else ()
        emitted: Mapping[str, tuple[str, ...]] = resumed.emitted if resumed is not None else {}
        # done: a dict as an ordered set (a source that interleaves shards asks "done?" often)
        self.done: dict[str, None] = dict.fromkeys(sorted(done))
        self.emitted: dict[str, list[str]] = {s: list(k) for s, k in emitted.items()}
        self.counted: dict[str, int] = dict(resumed.counted) if resumed is not None else {}
        self.pending: dict[str, int] = {}  # samples read and not yet handled, per shard
        self.buffered: dict[tuple[str, str], bool] = {}  # (shard, key) read and not yet handled, in order
        self.batches = resumed.batches if resumed is not None else 0
        self.ended = False
        self.current: str | None = None  # the shard the last sample read came from
        # what this pass skips: the samples the checkpoint says were handled
        self._skip_shards: set[str] = set(done)
        self._skip_keys: dict[str, set[str]] = {s: set(k) for s, k in emitted.items()}

    def skipped(self, sample: object, key: str) -> bool:
        """Whether the sample was handled before the checkpoint this pass resumes from."""
        shards, keys = self._skip_shards, self._skip_keys
        if not shards and not keys:
            return False
        shard = shard_of(sample)
        return shard in shards or key in keys.get(shard, ())

    def read(self, sample: object, key: str) -> None:
        """The stage took the sample from the stream."""
        shard = shard_of(sample)
        if self.current != shard:
            previous = self.current
            self.current = shard
            if previous is not None and self.shard_sizes is None:
                self._maybe_done(previous)
            if shard in self.done and self.shard_sizes is None:
                del self.done[shard]
                self.on_reopen(shard)
        self.pending[shard] = self.pending.get(shard, 0) + 1
        self.buffered[(shard, key)] = True

    def handled(self, sample: object, key: str, valid: bool = True) -> None:
        """The sample left in a yielded batch or was rejected (``valid``: not for its metadata)."""
        shard = shard_of(sample)
        if self.buffered.pop((shard, key), None) is None:
            return  # not read by this stage (counting only)
        self.pending[shard] -= 1
        self.emitted.setdefault(shard, []).append(key)
        if valid:
            self.counted[shard] = self.counted.get(shard, 0) + 1
        if self.shard_sizes is not None or shard != self.current:
            self._maybe_done(shard)

    def _maybe_done(self, shard: str) -> None:
        if not shard:  # samples without a URL: no shard to finish, their keys are kept
            return
        if self.shard_sizes is not None:
            size = self.shard_sizes.get(shard)
            if size is None or self.counted.get(shard, 0) < size:
                return
        if self.pending.get(shard, 0) == 0:
            self.pending.pop(shard, None)
            self.emitted.pop(shard, None)
            self.counted.pop(shard, None)
            self.done[shard] = None

    def snapshot(self, stats: StreamStats) -> StreamState:
        """The checkpoint of where the pass is: shards done, keys handled from shards in progress,
        keys buffered, and the counters."""
        return StreamState(
            done_shards=tuple(sorted(self.done)),
            emitted={s: tuple(sorted(set(k))) for s, k in self.emitted.items()},
            counted=dict(self.counted),
            buffered=tuple(self.buffered),
            batches=self.batches,
            ended=self.ended,
            stats=stats,
        )
