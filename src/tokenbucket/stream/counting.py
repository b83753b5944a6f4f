"""Counting a stream's samples: each sample's key and metadata read (a member of the sample, or
what a callable returns) and its tokens counted with the plan's ``TokenSpec``, a chunk of
samples per vectorised call (NOTE [ Stream bucketing ] in :mod:`tokenbucket.stream.bucketer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import pyarrow as pa

from tokenbucket._exceptions import MetadataError
from tokenbucket.tokens.breakdown import breakdown_sample, breakdown_table
from tokenbucket.tokens.metadata import table_from_rows
from tokenbucket.tokens.spec import MODALITY_COLUMNS, TokenSpec

__all__ = ["ChunkCounter", "Counted", "Meta", "RejectInvalid"]

#: where a sample's metadata is: a key of the sample (bytes, str or dict) or a callable ``sample -> dict``
#: (``Any``: the source's samples are whatever it yields)
Meta: TypeAlias = str | Callable[[Any], object]
#: a counted sample: the sample, its key, its total tokens and its tokens by modality (MODALITY_COLUMNS)
Counted: TypeAlias = tuple[object, str, int, tuple[int, ...]]
#: told of a sample with invalid metadata: ``(sample, key, message, column, value)``
RejectInvalid: TypeAlias = Callable[[object, str, str, str | None, object], None]

_DECODE = json.JSONDecoder().decode


class ChunkCounter:
    """Reads samples' keys and metadata and counts their tokens, a chunk at a time.

    Args:
        spec: the token spec.
        meta: where a sample's metadata is (:data:`Meta`).
        key: the sample's key field (webdataset's ``__key__``); a sample without one is ``#i``.
        reject: told of each sample whose metadata is invalid (``invalid`` counts them too).
    """

    def __init__(
        self, spec: TokenSpec, *, meta: Meta = "json", key: str = "__key__", reject: RejectInvalid | None = None
    ) -> None:
        self.spec, self.meta, self.key_field, self.reject = spec, meta, key, reject
        self.invalid = 0
        self._absent = spec.absent_as_zero()  # what a sample lacking an optional key counts

    def key(self, sample: object, i: int) -> str:
        """The sample's key (``#i``, its position in the stream, when it has none)."""
        if type(sample) is dict or isinstance(sample, Mapping):
            key = sample.get(self.key_field)
            if key is not None:
                return key if type(key) is str else str(key)
        return f"#{i}"

    def metadata(self, sample: object) -> dict[str, object]:
        """The sample's metadata as a dict; :class:`MetadataError` when it is missing or not a JSON object."""
        meta = self.meta
        if callable(meta):
            value = meta(sample)
        else:
            if not (type(sample) is dict or isinstance(sample, Mapping)) or meta not in sample:
                raise MetadataError("is missing from the sample", column=str(meta), value=None)
            value = sample[meta]
        if type(value) is bytes or isinstance(value, (bytearray, str)):
            try:
                # decode the text ourselves: json.loads would sniff the bytes' encoding every call
                # NOTE [ Leave the metadata to the stage ]: bytes, text or a decoded dict
                value = _DECODE(value if isinstance(value, str) else value.decode("utf-8"))
            except ValueError as exc:
                text = value[:60] if isinstance(value, str) else bytes(value[:60])
                raise MetadataError(f"is not valid JSON ({exc})", column=str(meta), value=text) from None
        if not isinstance(value, Mapping):
            raise MetadataError("should hold a JSON object", column=str(meta), value=type(value).__name__)
        return dict(value)

    def _invalid(self, sample: object, key: str, message: str, column: str | None, value: object) -> None:
        self.invalid += 1
        if self.reject is not None:
            self.reject(sample, key, message, column, value)

    def count(self, chunk: Sequence[tuple[object, str]]) -> list[Counted]:
        """The chunk's samples with their token counts (total, and by modality); the invalid ones
        rejected."""
        rows, kept = [], []
        key_column = self.spec.columns.key or "key"
        for sample, key in chunk:
            try:
                row = self.metadata(sample)
                row[key_column] = key  # the stream's key is the sample's identity
                rows.append(row)
                kept.append((sample, key))
            except MetadataError as exc:
                self._invalid(sample, key, str(exc), exc.column, exc.value)
        if not rows:
            return []
        try:
            # keys are the stream's: unique per shard (webdataset's identity is url + key), so not checked here
            result = breakdown_table(
                table_from_rows(rows, self._absent), self.spec, on_invalid="reject", check_keys=False
            )
        except (MetadataError, pa.ArrowException, OverflowError, TypeError):
            # a column absent from the whole chunk, mixed types, a value past int64, a schema
            # error of one sample: count one by one, for exact reasons
            out: list[Counted] = []
            for (sample, key), row in zip(kept, rows, strict=True):
                try:
                    bd = breakdown_sample(row, self.spec)
                    out.append((sample, key, bd.total, tuple(getattr(bd, name) for name in MODALITY_COLUMNS)))
                except MetadataError as exc:
                    self._invalid(sample, key, str(exc), exc.column, exc.value)
            return out
        table = result.table
        counts = zip(
            table.column("total").to_pylist(),
            zip(*(table.column(name).fill_null(0).to_pylist() for name in MODALITY_COLUMNS), strict=True),
            strict=True,
        )
        counted = dict(zip(table.column("index").to_pylist(), counts, strict=True))
        bad = {r["index"]: r for r in result.rejected.to_pylist()}
        out = []
        for i, (sample, key) in enumerate(kept):
            if i in bad:
                r = bad[i]
                self._invalid(sample, key, f"column {r['column']!r} {r['reason']}", r["column"], r["value"])
            else:
                total, modal = counted[i]
                out.append((sample, key, int(total), modal))
        return out
