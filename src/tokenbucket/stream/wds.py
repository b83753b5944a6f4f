"""webdataset glue (the ``wds`` extra): the bucketing stage for a ``wds.WebDataset`` pipeline, and
a shard index that gives every rank the same number of steps.

    import webdataset as wds
    from tokenbucket.stream.dataset import StreamCollate
    from tokenbucket.stream.wds import index_shards

    index = index_shards(urls, spec)                       # reads only the .json members
    stage = index.bucketed(plan, spec, world_size=ws, num_workers=4, rejected="rejected.jsonl")
    data = (wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
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
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, TypeAlias

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
    from typing_extensions import Unpack

__all__ = ["ShardIndex", "bucketed", "bucketed_samples", "epoch_shards", "index_shards"]

#: the stage, made: samples in, batches out (what ``pipeline.compose`` takes)
Stage: TypeAlias = Callable[[Iterable[object]], Iterator[StreamBatch]]


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
class ShardIndex:
    """Per shard, in ``urls`` order: the keys and token counts of its samples with valid metadata."""

    urls: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]
    lengths: tuple[tuple[int, ...], ...]
    rejected: int

    @property
    def samples(self) -> int:
        return sum(len(k) for k in self.keys)

    def reorder(self, urls: Sequence[str]) -> ShardIndex:
        """The index in another shard order (e.g. :func:`epoch_shards`)."""
        where = {u: i for i, u in enumerate(self.urls)}
        missing = [u for u in urls if u not in where]
        if missing:
            raise ConfigError(f"shards not in the index: {missing[:3]}")
        return ShardIndex(
            tuple(urls),
            tuple(self.keys[where[u]] for u in urls),
            tuple(self.lengths[where[u]] for u in urls),
            self.rejected,
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


def index_shards(
    urls: Sequence[str | os.PathLike[str]],
    spec: TokenSpec,
    *,
    meta: str = "json",
    open_fn: Callable[[str], IO[bytes]] | None = None,
) -> ShardIndex:
    """Read every shard's ``.{meta}`` members (the others are skipped over, not read) and count them.

    ``open_fn(url)`` opens a shard as a binary file (default: ``open``), for shards elsewhere.
    Samples whose metadata is invalid are counted in ``rejected`` (the stage rejects them too).
    """
    counter = ChunkCounter(spec, meta=meta)
    opener: Callable[[str], IO[bytes]] = open_fn if open_fn is not None else (lambda u: open(u, "rb"))
    keys, lengths = [], []
    for url in urls:
        samples: list[tuple[object, str]] = []
        with opener(str(url)) as f, tarfile.open(fileobj=f, mode="r|*") as tar:
            for member in tar:
                parts = _key_and_ext(member.name) if member.isfile() else None
                if parts is None or parts[1].lower() != meta:  # webdataset lower-cases extensions too
                    continue
                data = tar.extractfile(member)
                if data is None:
                    continue
                samples.append(({"__key__": parts[0], meta: data.read(), "__url__": str(url)}, parts[0]))
        counted = counter.count(samples)
        keys.append(tuple(c[1] for c in counted))
        lengths.append(tuple(c[2] for c in counted))
    return ShardIndex(tuple(str(u) for u in urls), tuple(keys), tuple(lengths), counter.invalid)
