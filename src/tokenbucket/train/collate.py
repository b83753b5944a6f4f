"""The training side's two other halves: ``TokenBucketDataset`` (a map-style dataset plus every
sample's breakdown and bucket) and ``BucketCollate`` (pads a batch to its bucket's shape).

The batch's own types (:class:`BatchInfo`, :class:`Segment`, NOTE [ Token layout ]) are in
:mod:`tokenbucket.train.batch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.manifest import Manifest
from tokenbucket.tokens.breakdown import TokenBreakdown, breakdown_sample, breakdown_table
from tokenbucket.tokens.metadata import table_from_rows
from tokenbucket.tokens.spec import MODALITY_COLUMNS, TokenSpec
from tokenbucket.train.batch import BatchInfo, EmptyRow, pad_rows, token_layout
from tokenbucket.train.packing import PackedBatchSampler, PackedOptions
from tokenbucket.train.risk import apply_risk_policy, check_risk_options, static_split
from tokenbucket.train.sampler import BucketBatchSampler, SamplerOptions, plan_id_of

if TYPE_CHECKING:  # typing_extensions comes with torch; Unpack is in typing from 3.11
    from typing_extensions import Unpack

__all__ = ["BucketCollate", "MapDataset", "Metadata", "TokenBucketDataset"]


class MapDataset(Protocol):
    """A map-style dataset: a length and an item per index (a torch ``Dataset``, a list, a
    Hugging Face ``datasets.Dataset``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


Metadata: TypeAlias = pa.Table | Mapping[str, Any] | str | Callable[[int], Mapping[str, Any]]
"""What ``TokenBucketDataset(metadata=...)`` takes (see its arguments)."""

_PACKED_OPTIONS = frozenset(PackedOptions.__annotations__)


class TokenBucketDataset(Dataset[Any]):
    """A map-style dataset with every sample's token breakdown and bucket.

    Args:
        dataset: the user's map-style dataset.
        metadata: a ``pyarrow.Table`` (or mapping of columns) aligned with ``dataset``; a
            column name, for datasets that return a column by name (``dataset["meta"]``); or a
            callable ``index -> dict`` of the sample's metadata.
        spec: the token spec.
        plan: a :class:`~tokenbucket.plan.buckets.BucketPlan` to assign buckets with; or
        manifest: a :class:`~tokenbucket.plan.manifest.Manifest` (its breakdowns and buckets are
            used; it must match the dataset's length and keys, and have been planned for ``spec``).
        allow_mismatch: use a manifest planned for another token spec anyway, with a
            :class:`~tokenbucket._exceptions.ManifestMismatchWarning` instead of the error.

    Items are ``(index, item)``; an index ``>= len(dataset)`` is an empty row and gives
    ``(index, EmptyRow(bucket))``.
    """

    def __init__(
        self,
        dataset: MapDataset,
        *,
        spec: TokenSpec,
        metadata: Metadata | None = None,
        plan: BucketPlan | None = None,
        manifest: Manifest | None = None,
        allow_mismatch: bool = False,
    ) -> None:
        self.dataset, self.spec = dataset, spec
        n = len(dataset)
        table = _metadata_table(dataset, metadata, n, spec) if metadata is not None else None
        if manifest is not None:
            manifest.check_made_for(
                spec, allow_mismatch=allow_mismatch
            )  # planned for another token spec: its buckets would be wrong here
            mt = manifest.table
            if mt.num_rows != n:
                raise ConfigError(f"the manifest has {mt.num_rows:,} rows but the dataset has {n:,} samples")
            if table is not None and spec.columns.key is not None and spec.columns.key in table.column_names:
                mine = table.column(spec.columns.key).cast(pa.string()).to_numpy(zero_copy_only=False)
                theirs = mt.column("key").to_numpy(zero_copy_only=False)
                bad = np.flatnonzero(mine != theirs)
                if len(bad):
                    i = int(bad[0])
                    raise ConfigError(
                        f"the manifest does not match the dataset: index {i} has key {mine[i]!r} in the dataset "
                        f"but {theirs[i]!r} in the manifest"
                    )
            self.plan = manifest.plan
            self.plan_id = manifest.content_hash
            self.breakdowns = mt
            self.buckets = mt.column("bucket").to_numpy()
        else:
            if table is None or plan is None:
                raise ConfigError("TokenBucketDataset needs metadata= and plan=, or manifest=")
            result = breakdown_table(table, spec, on_invalid="reject")
            if result.rejected.num_rows:
                first = result.rejected.slice(0, 1).to_pylist()[0]
                raise ConfigError(f"{result.rejected.num_rows} invalid metadata rows; the first: {first['message']}")
            self.plan = plan
            self.plan_id = plan_id_of(plan.to_json())
            self.breakdowns = result.table
            self.buckets = plan.assign(result.totals)
        self.lengths = self.breakdowns.column("total").fill_null(0).to_numpy()
        # per-modality counts as arrays, once: the collate sums them for every batch
        self.modality_tokens = {name: self.breakdowns.column(name).fill_null(0).to_numpy() for name in MODALITY_COLUMNS}
        self._metadata = table
        self._meta_fn = metadata if callable(metadata) else None
        self._templates: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        n = len(self.dataset)
        if index >= n:
            return index, EmptyRow(index - n)
        return index, self.dataset[index]

    def breakdown(self, index: int) -> TokenBreakdown:
        """The full breakdown (per camera) of one sample, from its metadata."""
        if self._meta_fn is not None:
            row = dict(self._meta_fn(index))
        elif self._metadata is not None:
            row = self._metadata.slice(index, 1).to_pylist()[0]
        else:
            raise ConfigError("per-camera breakdowns need the metadata (pass metadata= with the manifest)")
        return breakdown_sample(row, self.spec, index=index)

    def key(self, index: int) -> str:
        return str(self.breakdowns.column("key")[index].as_py())

    def tokens_of(self, index: int, item: Mapping[str, Any], tokens_key: str) -> torch.Tensor:
        """Sample ``index``'s token tensor, refused when its length is not its metadata's count
        (a sample whose data disagrees with its metadata is how "impossible" OOMs happen)."""
        t: torch.Tensor = item[tokens_key]
        expected = int(self.lengths[index])
        if t.shape[0] != expected:
            raise ConfigError(
                f"sample {index} (key {self.key(index)!r}): its metadata says {expected} tokens "
                f"but its {tokens_key!r} tensor has shape {tuple(t.shape)}"
            )
        return t

    def token_template(self, tokens_key: str) -> torch.Tensor:
        """A real sample's ``tokens_key`` tensor: what a batch of empty rows only takes its
        per-token shape and dtype from, so that batch looks like every other (read once per key)."""
        if tokens_key not in self._templates:
            first = int(np.flatnonzero(self.buckets >= 0)[0])
            self._templates[tokens_key] = self.dataset[first][tokens_key]
        return self._templates[tokens_key]

    def batch_info(
        self, indices: Sequence[int], *, bucket: int, shape: tuple[int, int], predicted_peak_bytes: int
    ) -> BatchInfo:
        """The :class:`BatchInfo` of a batch holding ``indices`` (in row order) at ``shape``."""
        idx = list(indices)
        per_row = {name: values[idx].tolist() for name, values in self.modality_tokens.items()}
        lengths = tuple(int(n) for n in self.lengths[idx].tolist())
        return BatchInfo(
            bucket=bucket,
            shape=shape,
            keys=tuple(self.key(i) for i in idx),
            tokens={name: int(sum(v)) for name, v in per_row.items()},
            real_tokens=sum(lengths),
            padded_tokens=shape[0] * shape[1],
            predicted_peak_bytes=predicted_peak_bytes,
            risk=predicted_peak_bytes / self.plan.budget_bytes,
            indices=tuple(idx),
            lengths=lengths,
            row_tokens=tuple(zip(*per_row.values(), strict=True)) if idx else (),
        )

    def camera_tokens(self, indices: Sequence[int]) -> dict[str, int] | None:
        """Tokens per camera name summed over ``indices`` (``None`` without per-sample metadata)."""
        out: dict[str, int] = {}
        try:
            for i in indices:
                for cam in self.breakdown(i).cameras:
                    out[cam.name] = out.get(cam.name, 0) + cam.tokens
        except ConfigError:  # a manifest without the metadata: no per-camera counts
            return None
        return out

    def sampler(self, **kwargs: Unpack[SamplerOptions]) -> BucketBatchSampler | PackedBatchSampler:
        """A :class:`~tokenbucket.train.sampler.BucketBatchSampler` over this dataset's buckets (a
        :class:`~tokenbucket.train.packing.PackedBatchSampler` for a packed plan)."""
        if self.plan.mode == "packed":
            if kwargs.keys() - _PACKED_OPTIONS:
                raise ConfigError(
                    f"a packed plan's sampler takes only {sorted(_PACKED_OPTIONS)}, but got {sorted(kwargs)}"
                )
            return PackedBatchSampler.from_dataset(self, **cast("PackedOptions", kwargs))

        return BucketBatchSampler(self.buckets, self.plan.batch_sizes.tolist(), plan_id=self.plan_id, **kwargs)


def _metadata_table(dataset: MapDataset, metadata: Metadata, n: int, spec: TokenSpec) -> pa.Table | None:
    if isinstance(metadata, pa.Table):
        table = metadata
    elif isinstance(metadata, Mapping):
        table = pa.table(dict(metadata))
    elif isinstance(metadata, str):
        try:
            column = cast(Mapping[str, Any], dataset)[metadata]  # a dataset indexed by column name
        except (KeyError, TypeError, IndexError):
            raise ConfigError(f"the dataset has no column {metadata!r} to read metadata from") from None
        table = table_from_rows(list(column), spec.absent_as_zero())
    elif callable(metadata):
        table = table_from_rows([dict(metadata(i)) for i in range(n)], spec.absent_as_zero())
    else:
        raise ConfigError(f"metadata should be a table, a column name or a callable, but got {type(metadata).__name__}")
    if table.num_rows != n:
        raise ConfigError(f"the metadata has {table.num_rows:,} rows but the dataset has {n:,} samples")
    return table


class BucketCollate:
    """Pads a batch of ``(index, item)`` to its bucket's shape.

    Each item is a mapping whose ``tokens_key`` entry is the sample's token sequence, a tensor
    ``[L_i, ...]`` laid out as in NOTE [ Token layout ]; ``L_i`` must equal the breakdown's
    total, or the batch is refused (a sample whose data disagrees with its metadata is how
    "impossible" OOMs happen). Static plans pad to ``(batch_size, bound)``; dynamic ones to
    ``(len(batch), longest)``.

    Returns a dict: ``tokens`` ``[B, L, ...]``, ``attention_mask`` ``[B, L]`` (True on real
    tokens), ``row_mask`` ``[B]`` (False on empty rows), ``index`` ``[B]`` (-1 on empty rows),
    ``layout`` (a list per row of :class:`Segment`, with ``with_layout``) and ``info``
    (:class:`BatchInfo`). Real rows come first.

    A batch whose predicted peak (``cost_model``, else the plan's) is above ``risk_threshold``
    of the budget is reported here, before it reaches the GPU, by ``on_risk``: ``"warn"``,
    ``"raise"`` or ``"split"`` (see NOTE [ Risk before the GPU ] in :mod:`tokenbucket.train.risk`).
    """

    def __init__(
        self,
        data: TokenBucketDataset,
        *,
        tokens_key: str = "tokens",
        pad_value: float = 0,
        cost_model: PredictsMemory | None = None,
        with_layout: bool = False,
        risk_threshold: float = 1.0,
        on_risk: str = "warn",
    ) -> None:
        check_risk_options(risk_threshold, on_risk)
        self.data, self.tokens_key, self.pad_value = data, tokens_key, pad_value
        self.cost_model, self.with_layout = cost_model, with_layout
        self.risk_threshold, self.on_risk = float(risk_threshold), on_risk
        self._split_rows: list[int] | None = None
        if on_risk == "split":
            if cost_model is None:
                raise ConfigError("on_risk='split' needs cost_model= to predict the parts of a batch")
            if data.plan.mode == "static":  # the rows a static part is padded to (NOTE [ Risk before the GPU ])
                self._split_rows = [
                    static_split(data.plan, cost_model, k, self.risk_threshold)[1]
                    for k in range(len(data.plan.buckets))
                ]

    def __call__(self, batch: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        data = self.data
        plan = data.plan
        real = [(i, item) for i, item in batch if not isinstance(item, EmptyRow)]
        empties = [item for _, item in batch if isinstance(item, EmptyRow)]
        bucket = int(data.buckets[real[0][0]]) if real else empties[0].bucket
        seqs = [data.tokens_of(i, item, self.tokens_key) for i, item in real]
        if plan.mode == "static":
            rows, length = plan.buckets[bucket].batch_size, plan.buckets[bucket].bound
            if self._split_rows is not None:
                rows = self._split_rows[bucket]
        else:
            rows, length = len(batch), max((s.shape[0] for s in seqs), default=1)
        if len(batch) > rows:
            raise ConfigError(
                f"a batch of {len(batch)} samples for bucket {bucket}, whose batches hold {rows}: "
                f"the sampler and the collate disagree (a RiskSplitSampler without on_risk='split'?)"
            )
        template = seqs[0] if seqs else data.token_template(self.tokens_key)
        idx = [i for i, _ in real]
        tokens, attention, row_mask, index = pad_rows(seqs, idx, rows, length, template, self.pad_value)
        peak = (
            int(self.cost_model.memory(rows, length).total)
            if self.cost_model is not None
            else plan.buckets[bucket].predicted_peak_bytes
        )
        info = data.batch_info(idx, bucket=bucket, shape=(rows, length), predicted_peak_bytes=peak)
        if info.risk > self.risk_threshold:  # NOTE [ Risk before the GPU ]
            # per-camera counts need each sample's metadata: only for the rare flagged batch
            info = dataclasses.replace(info, cameras=data.camera_tokens(idx))
            apply_risk_policy(info, self.risk_threshold, self.on_risk, can_split=len(idx) > 1)
        out: dict[str, Any] = {
            "tokens": tokens,
            "attention_mask": attention,
            "row_mask": row_mask,
            "index": index,
            "info": info,
        }
        if self.with_layout:
            out["layout"] = [token_layout(data.breakdown(i), data.spec) for i in idx]
        return out
