"""The stream stage in a ``DataLoader``: :class:`BucketedStream` wraps any ``IterableDataset``
of samples, :class:`StreamCollate` pads each :class:`~tokenbucket.stream.bucketer.StreamBatch`
to its shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.stream.bucketer import StreamBatch, StreamBucketer, StreamOptions
from tokenbucket.tokens.spec import TokenSpec
from tokenbucket.train.batch import pad_rows

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["BucketedStream", "StreamCollate"]


class StreamCollate:
    """Pads a :class:`~tokenbucket.stream.bucketer.StreamBatch` to its shape, as
    :class:`~tokenbucket.train.collate.BucketCollate` does: ``tokens`` ``[rows, length, ...]``,
    ``attention_mask``, ``row_mask``, ``keys`` and ``info`` (a ``BatchInfo``). For
    ``DataLoader(..., batch_size=None, collate_fn=StreamCollate())``.

    Each sample's ``tokens_key`` entry (tensor or array ``[L_i, ...]``) must have the length its
    metadata gives. ``feature_shape`` / ``dtype`` shape the tokens of a batch without samples
    when no sample has been seen yet (default: the first sample's).
    """

    def __init__(
        self,
        tokens_key: str = "tokens",
        *,
        pad_value: float = 0,
        feature_shape: tuple[int, ...] = (),
        dtype: torch.dtype | None = None,
    ) -> None:
        self.tokens_key, self.pad_value = tokens_key, pad_value
        self.feature_shape, self.dtype = tuple(feature_shape), dtype

    def __call__(self, batch: StreamBatch) -> dict[str, Any]:
        seqs = []
        for sample, key, length in zip(batch.samples, batch.keys, batch.lengths, strict=True):
            t = torch.as_tensor(sample[self.tokens_key])
            if t.shape[0] != length:
                raise ConfigError(
                    f"stream sample {key!r}: its metadata says {length} tokens but its "
                    f"{self.tokens_key!r} has shape {tuple(t.shape)}"
                )
            seqs.append(t)
        if seqs:
            self.feature_shape, self.dtype = tuple(seqs[0].shape[1:]), seqs[0].dtype
        template = torch.empty((0, *self.feature_shape), dtype=self.dtype or torch.float32)
        tokens, attention, row_mask, _ = pad_rows(  # one padding routine for every collate
            seqs, range(len(seqs)), batch.rows, batch.length, template, self.pad_value
        )
        return {
            "tokens": tokens,
            "attention_mask": attention,
            "row_mask": row_mask,
            "keys": list(batch.keys),
            "info": batch.info(),
        }


class BucketedStream(IterableDataset[StreamBatch]):
    """Any ``IterableDataset`` of samples, bucketed: yields
    :class:`~tokenbucket.stream.bucketer.StreamBatch` es (use ``DataLoader(BucketedStream(...),
    batch_size=None)``; keyword arguments as :class:`~tokenbucket.stream.bucketer.StreamBucketer`).
    Each DataLoader worker runs its own stage over its share of the source; ``state_dict`` works
    with torchdata's ``StatefulDataLoader``, per worker."""

    def __init__(
        self, source: Iterable[object], plan: BucketPlan, spec: TokenSpec, **kwargs: Unpack[StreamOptions]
    ) -> None:
        self.source = source
        self.bucketer = StreamBucketer(plan, spec, **kwargs)

    def __iter__(self) -> Iterator[StreamBatch]:
        return self.bucketer(self.source)

    def state_dict(self) -> dict[str, object]:
        return self.bucketer.state_dict()

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        self.bucketer.load_state_dict(state)
