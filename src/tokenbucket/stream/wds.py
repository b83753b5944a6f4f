"""webdataset glue (the ``wds`` extra): the bucketing stage for a ``wds.WebDataset`` pipeline, and
a shard index that gives every rank the same number of steps.

    import webdataset as wds
    from tokenbucket.stream.dataset import StreamCollate
    from tokenbucket.stream.wds import index_shards

    index = index_shards(urls, spec)                       # reads only the .json members
    stage = index.bucketed(plan, spec, world_size=ws, num_workers=4, rejected="rejected.jsonl")
    data = (wds.WebDataset(index.urls, shardshuffle=False, nodesplitter=wds.split_by_node)
            .decode(only=["tokens.npy"])          # the .json is the stage's to read (and reject)
            .compose(stage))
    loader = wds.WebLoader(data, batch_size=None, num_workers=4, collate_fn=StreamCollate())

NOTE [ Equal steps from a shard index ]
A rank that runs out of batches before the others hangs the next collective. The index holds
every shard's sample lengths (read from the ``.json`` members alone); simulating the stage on
them gives each ``(rank, worker)`` stream's batch count, and ``batches=`` set to the largest
makes every stream emit exactly that many (shorter ones end with empty batches): equal steps,
every sample once. It needs the shard order fixed before the epoch (``shardshuffle=False``;
shuffle the URL list yourself with the epoch's seed, e.g. :func:`epoch_shards`). Without an
index, ``.with_epoch(n)`` on the loader also gives equal steps, by cutting or repeating.

NOTE [ Leave the metadata to the stage ]
A ``.decode()`` upstream parses the ``.json`` member too, and a corrupt one raises there,
before the stage can reject it and go on. Decode the data members only
(``.decode(only=[...])``), or decode after bucketing in the collate; the stage accepts the
metadata as bytes, text or an already decoded dict.

NOTE [ Bad shards ]
A tar reader stops without a word at a shard cut at a member boundary, or cut inside a header
(or at a corrupt one): half a shard reads as a whole one. :func:`index_shards` reads every shard
to its end-of-archive marker instead, so a truncated, empty or foreign shard is found while
indexing, and named with the byte where it goes wrong. How: tarfile walks the members, reading
the (decompressed) stream once, as webdataset does; where the walk stops, the next 1,024 bytes
must be the marker, two zero 512-byte blocks. If they are not, the stream's length says where it
was cut: before the stop, inside the last member's data; at it, at a member boundary; past it,
inside a header (or the marker). A whole block there that is not zero is a corrupt header, or no
tar at all. Cheap: one pass over the shard, as before, and at most a record read past the marker.
With ``on_bad_shard="error"`` (the default) a bad shard is a :class:`~tokenbucket.ConfigError`;
with ``"skip"`` it is left out of the index whole, with a warning and a :class:`BadShard` in
``ShardIndex.skipped``. Build the ``wds.WebDataset`` from ``index.urls``: the skipped shards are
then not read at all (webdataset would read such a shard in part, or fail inside it).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import tarfile
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Literal, Protocol, TypeAlias, get_args

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import SupportsCost
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.stream.bucketer import StreamBatch, StreamBucketer, StreamOptions
from tokenbucket.stream.counting import ChunkCounter
from tokenbucket.stream.emission import stream_batch_counts
from tokenbucket.tokens.spec import TokenSpec

try:
    from webdataset.filters import pipelinefilter
except ImportError as exc:  # pragma: no cover - the extra is installed in dev
    raise ImportError("tokenbucket.stream.wds needs webdataset: pip install 'tokenbucket[wds]'") from exc

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from typing_extensions import Unpack

__all__ = ["BadShard", "ShardIndex", "bucketed", "bucketed_samples", "epoch_shards", "index_shards"]

#: the stage, made: samples in, batches out (what ``pipeline.compose`` takes)
Stage: TypeAlias = Callable[[Iterable[object]], Iterator[StreamBatch]]

#: what :func:`index_shards` does with a shard it cannot read to its end (NOTE [ Bad shards ])
OnBadShard: TypeAlias = Literal["error", "skip"]


def bucketed_samples(
    src: Iterable[object], plan: BucketPlan, spec: TokenSpec, **kwargs: Unpack[StreamOptions]
) -> Iterator[StreamBatch]:
    """The stage as a plain generator: samples in, :class:`~tokenbucket.stream.bucketer.StreamBatch` es out
    (keyword arguments as :class:`~tokenbucket.stream.bucketer.StreamBucketer`)."""
    yield from StreamBucketer(plan, spec, **kwargs)(src)


#: ``pipeline.compose(bucketed(plan, spec, ...))``: the stage, curried for a webdataset pipeline.
bucketed: Callable[..., Stage] = pipelinefilter(bucketed_samples)


def epoch_shards(urls: Sequence[str], *, seed: int, epoch: int) -> list[str]:
    """The shard list of one epoch, shuffled by ``(seed, epoch)`` (the same on every rank)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(urls))
    return [urls[i] for i in order]


@dataclass(frozen=True)
class BadShard:
    """A shard that :func:`index_shards` could not read to its end (NOTE [ Bad shards ]).

    Attributes:
        url: the shard.
        offset: the byte where it goes wrong (in the decompressed tar stream for a compressed shard).
        reason: what is wrong there, one line that names the byte.
        samples: the samples (``.{meta}`` members) read whole before ``offset``; skipping the
            shard leaves them out. What followed ``offset`` is unknown, and lost.
    """

    url: str
    offset: int
    reason: str
    samples: int


@dataclass(frozen=True)
class ShardIndex:
    """Per shard, in ``urls`` order: the keys and token counts of its samples with valid metadata,
    and their image tokens (``vision``: what a 2D plan places them by too, NOTE [ Two-dimensional
    buckets ]). ``skipped``: the shards left out under ``on_bad_shard="skip"`` (not in ``urls``)."""

    urls: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]
    lengths: tuple[tuple[int, ...], ...]
    rejected: int
    skipped: tuple[BadShard, ...] = ()
    vision: tuple[tuple[int, ...], ...] = ()

    @property
    def samples(self) -> int:
        return sum(len(k) for k in self.keys)

    @property
    def lost_samples(self) -> int:
        """Samples read from the skipped shards before their cut, left out with them (a lower
        bound of the loss: what followed each cut is unknown)."""
        return sum(bad.samples for bad in self.skipped)

    def reorder(self, urls: Sequence[str]) -> ShardIndex:
        """The index in another shard order (e.g. :func:`epoch_shards`)."""
        bad = {b.url: b for b in self.skipped}
        for u in urls:
            if u in bad:
                raise ConfigError(
                    f"shard {u!r} was skipped by index_shards ({bad[u].reason}); order index.urls instead"
                )
        where = {u: i for i, u in enumerate(self.urls)}
        missing = [u for u in urls if u not in where]
        if missing:
            raise ConfigError(f"shards not in the index: {missing[:3]}")
        return ShardIndex(
            tuple(urls),
            tuple(self.keys[where[u]] for u in urls),
            tuple(self.lengths[where[u]] for u in urls),
            self.rejected,
            self.skipped,
            tuple(self.vision[where[u]] for u in urls) if self.vision else (),
        )

    def batches_per_worker(
        self,
        plan: BucketPlan,
        *,
        world_size: int = 1,
        num_workers: int = 0,
        cost_model: SupportsCost | None = None,
        max_buffered: int | None = None,
    ) -> int:
        """``batches=`` for every stage: the largest stream's batch count (NOTE [ Equal steps from a
        shard index ]). Each rank then takes ``max(1, num_workers)`` times this many steps."""
        counts = stream_batch_counts(
            self.lengths,
            plan,
            world_size=world_size,
            num_workers=num_workers,
            cost_model=cost_model,
            max_buffered=max_buffered,
            shard_vision=self.vision or None,
        )
        return int(counts.max()) if counts.size else 0

    # NOTE [ Equal steps from a shard index ]
    def bucketed(
        self,
        plan: BucketPlan,
        spec: TokenSpec,
        *,
        world_size: int = 1,
        num_workers: int = 0,
        **kwargs: Unpack[StreamOptions],
    ) -> Stage:
        """The stage with ``batches=`` set for these shards: every worker of every rank emits the
        same number of batches, every sample once. The count is simulated with the stage's own
        ``max_buffered`` and ``cost_model``, so the two cannot disagree. The shards' sizes go to
        the stage too (``shard_sizes``): its resume is exact even across a shuffle buffer."""
        kwargs["batches"] = self.batches_per_worker(
            plan,
            world_size=world_size,
            num_workers=num_workers,
            cost_model=kwargs.get("cost_model"),
            max_buffered=kwargs.get("max_buffered"),
        )
        kwargs.setdefault("shard_sizes", dict(zip(self.urls, (len(k) for k in self.keys), strict=True)))
        return bucketed(plan, spec, **kwargs)


def _key_and_ext(name: str) -> tuple[str, str] | None:
    # webdataset's convention: the key is the path up to the first dot of the file name
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot:
        return None
    return (f"{head}/{stem}" if head else stem), ext


_BLOCK = tarfile.BLOCKSIZE  # a tar header, and each of the two end-of-archive blocks
_KEEP = 4 * tarfile.RECORDSIZE  # stream bytes kept for the end check (tarfile reads a record ahead)
# what a failing read or decompressor raises: the stream ends there, and the shard is bad
_READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)


class _Readable(Protocol):
    def read1(self, size: int = -1, /) -> bytes: ...


class _Chain(io.RawIOBase):
    """``head`` (the bytes read to tell the compression), then the rest of ``rest``: buffered
    (``io.BufferedReader``), the binary file the decompressors and tarfile read."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        super().__init__()
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        view = memoryview(buffer).cast("B")
        if self.head:
            data, self.head = self.head[: len(view)], self.head[len(view) :]
        else:
            data = self.rest.read(len(view))
        view[: len(data)] = data
        return len(data)


# the compressions tarfile's "r|*" (so webdataset) reads: magic bytes, name, reader
_COMPRESSED: tuple[tuple[bytes, str, Callable[[IO[bytes]], _Readable]], ...] = (
    (b"\x1f\x8b", "gzip", lambda f: gzip.GzipFile(fileobj=f, mode="rb")),
    (b"BZh", "bzip2", lambda f: bz2.BZ2File(f)),
    (b"\xfd7zXZ\x00", "xz", lambda f: lzma.LZMAFile(f)),
)


class _Tap(io.RawIOBase):
    """A shard's tar stream (decompressed), read forward only: counts the bytes handed out, keeps
    the last ones for the end check, and turns a failing read into the end of the stream
    (``error`` says why)."""

    def __init__(self, source: _Readable) -> None:
        super().__init__()
        self.source = source
        self.pos = 0  # bytes handed out so far
        self.ended = False
        self.error: str | None = None
        self._tail = bytearray()  # the stream's bytes [pos - len(_tail), pos)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        if self.ended or size == 0:
            return b""
        try:
            # read1: a decompressor's read(n) loops, and drops what it had when the data ends early
            data = self.source.read1(size)
        except _READ_ERRORS as exc:
            self.error, data = f"{type(exc).__name__}: {exc}", b""
        self.ended = not data
        self.pos += len(data)
        self._tail += data
        if len(self._tail) > 2 * _KEEP:
            del self._tail[: len(self._tail) - _KEEP]
        return data

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def window(self, start: int, size: int) -> bytes:
        """The stream's bytes ``[start, start + size)``, fewer where it ends first."""
        while self.pos < start + size and self.read(tarfile.RECORDSIZE):
            pass
        first = self.pos - len(self._tail)
        if start < first:
            raise AssertionError(f"the tar walk ended at byte {start}, before the kept bytes (from {first})")
        return bytes(self._tail[start - first : start - first + size])


def _open_stream(url: str, f: IO[bytes]) -> tuple[_Tap, str]:
    """The shard's tar stream, decompressed as tarfile's ``"r|*"`` would, and the compression ("" for none)."""
    try:
        head = f.read(6)
    except OSError as exc:
        raise ConfigError(f"cannot read shard {url!r}: {exc}") from None
    chained = io.BufferedReader(_Chain(head, f), buffer_size=_KEEP)
    for magic, kind, reader in _COMPRESSED:
        if head.startswith(magic):
            return _Tap(reader(chained)), kind
    return _Tap(chained), ""


def _end_problem(tap: _Tap, end: int, last: tarfile.TarInfo | None, kind: str) -> tuple[int, str] | None:
    """Where and why the tar stream does not end cleanly at ``end`` (where the member walk
    stopped): ``None`` when the two zero blocks of the end-of-archive marker are there."""
    marker = tap.window(end, 2 * _BLOCK)
    if tap.error is not None:
        return tap.pos, f"its {kind or 'file'} data ends early or is corrupt at byte {tap.pos}: {tap.error}"
    if last is None and end == 0:
        if not marker:
            return 0, "empty (0 bytes), not a tar archive"
        if any(marker):
            return 0, f"not a tar archive (no valid tar header at byte 0; it starts with {marker[:12]!r})"
    if len(marker) == 2 * _BLOCK:
        if not any(marker):
            return None
        if any(marker[:_BLOCK]):
            return end, f"no valid tar header at byte {end} (corrupt, or not tar data)"
        return end + _BLOCK, f"a lone zero block at byte {end}, then data at byte {end + _BLOCK}"
    cut = tap.pos  # the stream ended before the marker was whole
    if last is not None and cut < end:
        data_end = last.offset_data + last.size
        if cut >= data_end:
            return cut, f"truncated at byte {cut}, in the padding after the data of member {last.name!r}"
        return (
            cut,
            f"truncated at byte {cut}, inside the data of member {last.name!r} (bytes {last.offset_data}-{data_end})",
        )
    if cut == end:
        after = f" after member {last.name!r}" if last is not None else ""
        return cut, f"truncated at byte {cut}{after}: no end-of-archive marker (two zero blocks)"
    if cut < end + _BLOCK and any(marker):
        return cut, f"truncated at byte {cut}, inside the tar header at byte {end}"
    return cut, f"truncated at byte {cut}, inside the end-of-archive marker at byte {end}"


def _read_shard(url: str, f: IO[bytes], meta: str) -> tuple[list[tuple[object, str]], BadShard | None]:
    """The shard's ``.{meta}`` members as ``(sample, key)``, read whole, and what is wrong with the
    shard (``None``: it reads to its end-of-archive marker; NOTE [ Bad shards ])."""
    tap, kind = _open_stream(url, f)
    samples: list[tuple[object, str]] = []
    last: tarfile.TarInfo | None = None
    end, failure = 0, ""
    try:
        with tarfile.open(fileobj=tap, mode="r|") as tar:
            try:
                for member in tar:
                    last = member
                    parts = _key_and_ext(member.name) if member.isfile() else None
                    if parts is None or parts[1].lower() != meta:  # webdataset lower-cases extensions too
                        continue
                    data = tar.extractfile(member)
                    if data is None:
                        continue
                    samples.append(({"__key__": parts[0], meta: data.read(), "__url__": url}, parts[0]))
            finally:
                end = tar.offset  # where the next header (or the marker) should start
    except (tarfile.TarError, ValueError) as exc:  # located below, from the stream itself
        failure = f"{type(exc).__name__}: {exc}"
    problem = _end_problem(tap, end, last, kind)
    if problem is None and failure:  # the stream looks whole there, and yet the walk failed
        problem = end, f"unreadable at byte {end}: {failure}"
    if problem is None:
        return samples, None
    offset, reason = problem
    if kind:
        reason += f"; {kind}-compressed, so byte offsets are in the decompressed tar"
    return samples, BadShard(url, offset, reason, len(samples))


def index_shards(
    urls: Sequence[str | os.PathLike[str]],
    spec: TokenSpec,
    *,
    meta: str = "json",
    open_fn: Callable[[str], IO[bytes]] | None = None,
    on_bad_shard: OnBadShard = "error",
) -> ShardIndex:
    """Read every shard's ``.{meta}`` members (the others are skipped over, not read) and count them.

    ``open_fn(url)`` opens a shard as a binary file (default: ``open``), for shards elsewhere.
    Samples whose metadata is invalid are counted in ``rejected`` (the stage rejects them too).
    Each shard is read to its end-of-archive marker (NOTE [ Bad shards ]): a truncated, empty or
    foreign one is an error, or, with ``on_bad_shard="skip"``, left out whole, with a warning
    and a :class:`BadShard` in ``skipped`` (``lost_samples`` counts the samples left out).

    Raises:
        ConfigError: a shard that cannot be opened; a bad shard (``on_bad_shard="error"``), named
            with the byte where it goes wrong; an unknown ``on_bad_shard``.
    """
    if on_bad_shard not in get_args(OnBadShard):
        raise ConfigError(f"on_bad_shard should be 'error' or 'skip', but got on_bad_shard={on_bad_shard!r}")
    counter = ChunkCounter(spec, meta=meta)
    opener: Callable[[str], IO[bytes]] = open_fn if open_fn is not None else (lambda u: open(u, "rb"))
    good, keys, lengths, vision, skipped = [], [], [], [], []
    for url in map(str, urls):
        try:
            f = opener(url)
        except OSError as exc:
            raise ConfigError(f"cannot open shard {url!r}: {exc}") from None
        with f:
            samples, bad = _read_shard(url, f, meta)
        if bad is not None:
            if on_bad_shard == "error":
                raise ConfigError(
                    f"cannot read shard {url!r}: {bad.reason} ({bad.samples} samples read before that; pass "
                    "on_bad_shard='skip' to index the other shards without it)"
                )
            # stacklevel: this, the caller
            warnings.warn(
                f"skipped shard {url!r}: {bad.reason}; left out: its {bad.samples} samples read before byte "
                f"{bad.offset}, and whatever followed (build the WebDataset from index.urls)",
                stacklevel=2,
            )
            skipped.append(bad)
            continue
        counted = counter.count(samples)
        good.append(url)
        keys.append(tuple(c[1] for c in counted))
        lengths.append(tuple(c[2] for c in counted))
        vision.append(tuple(c[3][0] for c in counted))  # c[3][0]: vision (MODALITY_COLUMNS)
    return ShardIndex(tuple(good), tuple(keys), tuple(lengths), counter.invalid, tuple(skipped), tuple(vision))
