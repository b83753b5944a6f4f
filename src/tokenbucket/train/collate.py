"""The training side's two other halves: ``TokenBucketDataset`` (a map-style dataset plus every
sample's breakdown and bucket) and ``BucketCollate`` (pads a batch to its bucket's shape).

The batch's own types (:class:`BatchInfo`, :class:`Segment`, NOTE [ Token layout ]) are in
:mod:`tokenbucket.train.batch`.

NOTE [ Arrow-backed datasets ]
A Hugging Face ``datasets.Dataset`` keeps its rows in ``ds.data.table`` (a ``pyarrow.Table``,
memory-mapped when it was loaded from disk) and applies ``.shuffle()`` / ``.select()`` lazily: it
keeps the table and adds ``ds._indices``, a one-column table of row numbers (``datasets`` has no
public accessor; ``flatten_indices()`` rewrites every column). The metadata is read from those two
directly: the columns the spec reads and the extra columns are selected (no copy), then taken
by the row numbers once (a copy of those columns' Arrow buffers, never of Python rows; none
at all for a dataset in its stored order). ``datasets`` is not imported: any object with a
``data.table`` that is a ``pyarrow.Table`` and an ``_indices`` attribute is read this way.

NOTE [ Extra metadata columns ]
The metadata columns the spec does not read (a ``label``, a ``uid``) are the dataset's
``meta_columns``: by default every such column holding one boolean, number or string per row
(list, struct and binary columns such as token or pixel data stay in the items), or the names
passed as ``meta_columns=``. A batch carries them as ``batch["meta"][name]``, one entry per row
in the batch's row order: a tensor for a numeric or boolean column without nulls (empty rows
hold 0 / False), else a list (empty rows hold ``None``); ``row_mask`` tells the rows apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from tokenbucket._exceptions import ConfigError, MissingColumnError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets_2d import DYNAMIC_2D_KEY
from tokenbucket.plan.dynamic_manifest import recorded_cut
from tokenbucket.plan.manifest import Manifest
from tokenbucket.tokens.breakdown import TokenBreakdown, breakdown_sample, breakdown_table
from tokenbucket.tokens.metadata import table_from_rows
from tokenbucket.tokens.spec import MODALITY_COLUMNS, TokenSpec
from tokenbucket.train._keys import ItemTemplates, Ragged, check_ragged, collate_keys
from tokenbucket.train.batch import BatchInfo, EmptyRow, pad_rows, token_layout
from tokenbucket.train.packing import PackedBatchSampler, PackedOptions
from tokenbucket.train.sampler import (
    BucketBatchSampler,
    DynamicFill2D,
    Fetched,
    SamplerOptions,
    StepIndices,
    plan_id_of,
    position_of,
)
from tokenbucket.train.shaping import BatchShape, MetaValues

if TYPE_CHECKING:  # typing_extensions comes with torch; Unpack is in typing from 3.11
    from typing_extensions import Unpack

__all__ = ["BucketCollate", "MapDataset", "Metadata", "TokenBucketDataset"]


class MapDataset(Protocol):
    """A map-style dataset: a length and an item per index (a torch ``Dataset``, a list, a
    Hugging Face ``datasets.Dataset``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


Metadata: TypeAlias = pa.Table | Mapping[str, Any] | str | Callable[[int], Mapping[str, Any]] | MapDataset
"""What ``TokenBucketDataset(metadata=...)`` takes (see its arguments)."""


_PACKED_OPTIONS = frozenset(PackedOptions.__annotations__)


class TokenBucketDataset(Dataset[Any]):
    """A map-style dataset with every sample's token breakdown and bucket.

    Args:
        dataset: the user's map-style dataset.
        metadata: a ``pyarrow.Table`` (or mapping of columns) aligned with ``dataset``; a
            Hugging Face ``datasets.Dataset`` aligned with it (read as Arrow, also after
            ``.shuffle()`` / ``.select()``: NOTE [ Arrow-backed datasets ]); a column name, for
            datasets that return a column by name (``dataset["meta"]``); or a callable
            ``index -> dict`` of the sample's metadata. Left out when ``dataset`` is itself a
            ``datasets.Dataset``: its own columns are the metadata (with a manifest, only when
            it holds the cameras column).
        spec: the token spec.
        plan: a :class:`~tokenbucket.plan.buckets.BucketPlan` to assign buckets with; or
        manifest: a :class:`~tokenbucket.plan.manifest.Manifest` (its breakdowns and buckets are
            used; it must match the dataset's length and keys, and have been planned for ``spec``).
            Kept as :attr:`manifest` (``None`` with ``plan=``): a collate's ``cost_model`` must be
            of the model it was planned for (NOTE [ A cost model beside its manifest ]).
        allow_mismatch: use a manifest planned for another token spec anyway, with a
            :class:`~tokenbucket._exceptions.ManifestMismatchWarning` instead of the error.
        meta_columns: the extra metadata columns batches carry (NOTE [ Extra metadata
            columns ]); ``None`` (default) takes every scalar column the spec does not read,
            ``()`` none.

    Raises:
        MissingColumnError: the metadata lacks a column the spec needs, or one of ``meta_columns``.

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
        meta_columns: Sequence[str] | None = None,
    ) -> None:
        self.dataset, self.spec = dataset, spec
        n = len(dataset)
        if metadata is None and _uses_own_columns(dataset, spec, with_manifest=manifest is not None):
            metadata = dataset  # NOTE [ Arrow-backed datasets ]
        table = _metadata_table(dataset, metadata, n, spec, meta_columns) if metadata is not None else None
        self.meta_columns: tuple[str, ...] = (
            tuple(_meta_names(table.schema, spec, meta_columns)) if table is not None else ()
        )
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
            # what it was planned for: a collate's cost model is checked against it
            # (NOTE [ A cost model beside its manifest ])
            self.manifest: Manifest | None = manifest
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
            self.manifest = None
            self.breakdowns = result.table
            # a 2D plan bounds the image tokens too (NOTE [ Two-dimensional buckets ])
            vision = result.table.column("vision").to_numpy() if plan.two_d else None
            self.buckets = plan.assign(result.totals, vision)
        self.lengths = self.breakdowns.column("total").fill_null(0).to_numpy()
        # per-modality counts as arrays, once: the collate sums them for every batch
        self.modality_tokens = {name: self.breakdowns.column(name).fill_null(0).to_numpy() for name in MODALITY_COLUMNS}
        self._metadata = table
        self._meta_fn = metadata if callable(metadata) else None
        self._templates: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> Fetched:
        """A batch's items, fetched at once (what a ``DataLoader`` asks for in its workers), with
        the sampler's position after it (NOTE [ Position through the workers ]) and its rows
        when the sampler chose them (NOTE [ Rows through the workers ])."""
        out = Fetched(self[i] for i in indices)
        if isinstance(indices, StepIndices):
            out.position = (indices.epoch, indices.step)
            out.rows = indices.rows  # NOTE [ Rows through the workers ]
        return out

    def __getitem__(self, index: int) -> tuple[int, Any]:
        n = len(self.dataset)
        if index >= n:
            return index, EmptyRow(index - n)
        return index, self.dataset[int(index)]

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
        t = _as_tensor(item[tokens_key], index, tokens_key)
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
            self._templates[tokens_key] = _as_tensor(self.dataset[first][tokens_key], first, tokens_key)
        return self._templates[tokens_key]

    def metadata_columns(self, indices: Sequence[int], rows: int | None = None) -> dict[str, MetaValues]:
        """The extra metadata columns (:attr:`meta_columns`) of ``indices``, in that order, padded
        to ``rows`` rows when given (NOTE [ Extra metadata columns ]). Only those rows are read.

        Example:
            >>> from tokenbucket import CostModel, ModelSpec, plan_buckets
            >>> meta = pa.table({"cameras": [1, 1], "frames": [1, 1], "height": [28, 28],
            ...                  "width": [28, 28], "key": ["a", "b"], "label": [3, 4]})
            >>> cost = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32"))
            >>> plan = plan_buckets([4, 4], cost, 2**24, multiple=4)
            >>> data = TokenBucketDataset([{}, {}], spec=TokenSpec(patch=14), metadata=meta, plan=plan)
            >>> data.metadata_columns([1, 0], rows=3)
            {'label': tensor([4, 3, 0])}
        """
        if not self.meta_columns or self._metadata is None:
            return {}
        idx = list(indices)
        part = self._metadata.select(list(self.meta_columns)).take(pa.array(idx, pa.int64()))
        pad = max(0, (len(idx) if rows is None else rows) - len(idx))
        return {name: _meta_values(part.column(name), pad) for name in self.meta_columns}

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
        if self.plan.mode == "dynamic" and self.plan.two_d and kwargs.get("dynamic") is None:
            fill, seed = self._dynamic_cut(kwargs.get("seed"))
            kwargs = {**kwargs, "dynamic": fill, "seed": seed}
        return BucketBatchSampler(self.buckets, self.plan.batch_sizes.tolist(), plan_id=self.plan_id, **kwargs)

    # NOTE [ A dynamic plan's sampler ]
    # A 2D dynamic plan's buckets carry static batch sizes (what the DP priced), but its batches
    # are cut each epoch to the budget at their own maxima (NOTE [ Two-dimensional dynamic
    # batches ]). Handing those static sizes to the sampler would run another plan than the one
    # printed, so ``sampler()`` on a 2D dynamic plan never falls back to them: a plan that records
    # its cost model (``meta["dynamic_2d"]``, NOTE [ A two-dimensional dynamic manifest ]) is cut
    # by it, at the recorded pools and seed (a ``seed=`` given wins); one that does not needs
    # ``dynamic=`` and is refused in one line without it. A 1D dynamic plan records no model: its
    # ``sampler()`` keeps the static sizes, each batch padded to its own longest, unless given
    # ``dynamic=DynamicFill(...)``, as before.
    def _dynamic_cut(self, seed: int | None) -> tuple[DynamicFill2D, int]:
        """A 2D dynamic plan's cut from the model it records (NOTE [ A dynamic plan's sampler ])."""
        record = self.plan.meta.get(DYNAMIC_2D_KEY)
        if not (isinstance(record, dict) and record.get("cost_model") is not None):
            raise ConfigError(
                "this dataset's plan is 2D dynamic (batches cut to the budget each epoch) but records no cost model "
                "to cut them with: pass dynamic=DynamicFill2D(lengths, vision, cost, budget, pool_batches) "
                "(tokenbucket.train.sampler)"
            )
        cost, pools, recorded_seed = recorded_cut("the dataset's plan", self.plan)
        vision = self.breakdowns.column("vision").to_numpy()
        fill = DynamicFill2D(self.lengths, vision, cost, self.plan.budget_bytes, pools)
        return fill, recorded_seed if seed is None else seed


def _arrow_source(obj: object) -> tuple[pa.Table, pa.ChunkedArray | None] | None:
    """``(table, row numbers or None)`` of an Arrow-backed dataset, else ``None``
    (NOTE [ Arrow-backed datasets ])."""
    table = getattr(getattr(obj, "data", None), "table", None)
    if not isinstance(table, pa.Table) or not hasattr(obj, "_indices"):
        return None
    mapping = getattr(obj, "_indices", None)
    if mapping is None:
        return table, None
    rows = getattr(mapping, "table", mapping)
    if not isinstance(rows, pa.Table) or rows.num_columns != 1:
        raise ConfigError(
            f"the dataset's indices mapping should be a one-column table of row numbers, but got {type(rows).__name__}"
        )
    return table, rows.column(0)


def _uses_own_columns(dataset: object, spec: TokenSpec, *, with_manifest: bool) -> bool:
    """Whether a dataset given without ``metadata=`` is its own metadata (an Arrow-backed one)."""
    source = _arrow_source(dataset)
    return source is not None and (not with_manifest or spec.columns.cameras in source[0].column_names)


def _spec_columns(spec: TokenSpec) -> set[str]:
    """The metadata columns the spec reads (those that exist; absent optional ones are fine)."""
    cols = spec.columns
    names = {cols.cameras, cols.frames, cols.height, cols.width}
    if cols.key is not None:
        names.add(cols.key)
    names.update(r.column for r in spec.rules().values() if r.column is not None)
    return names


def _is_scalar(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    )


def _meta_names(schema: pa.Schema, spec: TokenSpec, meta_columns: Sequence[str] | None) -> list[str]:
    """The extra metadata columns (NOTE [ Extra metadata columns ])."""
    if meta_columns is None:
        skip = _spec_columns(spec)
        return [f.name for f in schema if f.name not in skip and _is_scalar(f.type)]
    if isinstance(meta_columns, str):
        raise ConfigError(f"meta_columns should be a list of column names, but got meta_columns={meta_columns!r}")
    for name in meta_columns:
        if name not in schema.names:
            raise MissingColumnError(name, schema.names)
    return list(meta_columns)


def _meta_values(col: pa.ChunkedArray, pad: int) -> MetaValues:
    """One extra column of a batch, ``pad`` empty rows after (NOTE [ Extra metadata columns ])."""
    t = col.type
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and not col.null_count:
        values = col.to_numpy()
        if pa.types.is_unsigned_integer(t) and t.bit_width > 8:  # torch has no general uint16/32/64
            values = values.astype(np.int64)
        # a copy (Arrow's buffers are read-only), with the empty rows' zeros after
        return torch.from_numpy(np.concatenate([values, np.zeros(pad, values.dtype)]))
    out: list[object] = col.to_pylist()
    return out + [None] * pad


def _as_tensor(value: object, index: int, key: str) -> torch.Tensor:
    """An item's ``key`` entry as a tensor: a ``datasets.Dataset`` item holds lists (or NumPy
    arrays) unless it was given ``.with_format("torch")``."""
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"sample {index}: its {key!r} entry is not a tensor and cannot become one: {exc}") from None


def _metadata_table(
    dataset: MapDataset, metadata: Metadata, n: int, spec: TokenSpec, meta_columns: Sequence[str] | None = None
) -> pa.Table | None:
    source = _arrow_source(metadata)
    if source is not None:  # NOTE [ Arrow-backed datasets ]
        base, rows = source
        keep = _spec_columns(spec) | set(_meta_names(base.schema, spec, meta_columns))
        table = base.select([c for c in base.column_names if c in keep])
        if rows is not None:
            table = table.take(rows)
    elif isinstance(metadata, pa.Table):
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
        raise ConfigError(
            "metadata should be a table, a datasets.Dataset, a column name or a callable, "
            f"but got {type(metadata).__name__}"
        )
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
    ``meta`` (the extra metadata columns, one entry per row: NOTE [ Extra metadata columns ]),
    ``layout`` (a list per row of :class:`Segment`, with ``with_layout``) and ``info``
    (:class:`BatchInfo`); and every other key of the items, as
    :class:`~tokenbucket.train.modal.ModalityCollate` keeps them (NOTE [ Every item key reaches
    the batch ]): equal-shape tensors stacked ``[B, ...]`` (LeRobot's ``action`` ``[B, chunk,
    A]``), ragged ones padded with ``<key>_mask`` (``ragged="pad"``) or listed
    (``ragged="list"``), anything else (a ``label``, a ``uid``, a ``task``) a list with ``None``
    on empty rows; an item key named as one of the above is kept as ``item.<key>``. Real rows
    come first. A ``tokens_key`` entry that is not a tensor (a ``datasets.Dataset`` item's
    lists) is made one.

    A batch whose predicted peak (``cost_model``, else the plan's) is above ``risk_threshold``
    of the budget is reported here, before it reaches the GPU, by ``on_risk``: ``"warn"``,
    ``"raise"`` or ``"split"`` (see NOTE [ Risk before the GPU ] in :mod:`tokenbucket.train.risk`).
    A ``cost_model`` for another model than the one ``data``'s manifest was planned for is
    refused (NOTE [ A cost model beside its manifest ]).
    """

    RESERVED = ("tokens", "attention_mask", "row_mask", "index", "meta", "info", "layout")
    """The keys the collate fills itself: an item key among them is kept as ``item.<key>``."""

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
        ragged: Ragged = "pad",
    ) -> None:
        check_ragged(ragged)
        self.data, self.tokens_key, self.pad_value, self.ragged = data, tokens_key, pad_value, ragged
        self.cost_model, self.with_layout = cost_model, with_layout
        self.risk_threshold, self.on_risk = float(risk_threshold), on_risk
        self.shape = BatchShape(data, cost_model=cost_model, risk_threshold=risk_threshold, on_risk=on_risk)
        self._templates = ItemTemplates(data)

    def __call__(self, batch: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        data = self.data
        bucket = self.shape.bucket_of(batch)
        real = [(i, item) for i, item in batch if not isinstance(item, EmptyRow)]
        seqs = [data.tokens_of(i, item, self.tokens_key) for i, item in real]
        rows, length = self.shape.rows_and_length(bucket, len(batch), max((s.shape[0] for s in seqs), default=1))
        template = seqs[0] if seqs else data.token_template(self.tokens_key)
        idx = [i for i, _ in real]
        tokens, attention, row_mask, index = pad_rows(seqs, idx, rows, length, template, self.pad_value)
        info = self.shape.info(idx, bucket, rows, length, position_of(batch))
        out: dict[str, Any] = {
            "tokens": tokens,
            "attention_mask": attention,
            "row_mask": row_mask,
            "index": index,
            "meta": data.metadata_columns(idx, rows),
            "info": info,
        }
        if self.with_layout:
            out["layout"] = [token_layout(data.breakdown(i), data.spec) for i in idx]
        # NOTE [ Every item key reaches the batch ]: a batch of empty rows takes them from its bucket's sample
        items = [item for _, item in real] or [self._templates(bucket)[1]]
        mappings = [item if isinstance(item, Mapping) else {} for item in items]
        collate_keys(
            out, mappings, len(real), rows, ragged=self.ragged, used=(self.tokens_key,), reserved=self.RESERVED
        )
        return out
