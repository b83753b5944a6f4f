"""Reading sample metadata into one Arrow table.

Parquet, JSONL and CSV, as one file or a directory of part files (read in sorted name order,
so row indices are stable). The per-camera schema — a ``cameras`` column holding a list of
``{name, frames, height, width}`` structs — comes through Parquet and JSONL as it is; CSV holds
the flat schema only. A file that cannot be parsed is a :class:`ConfigError` naming it.

Example:
    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "meta.parquet")
    >>> pq.write_table(pa.table({"key": ["a"], "cameras": [2], "frames": [8],
    ...                          "height": [224], "width": [224]}), path)
    >>> read_metadata(path).num_rows
    1
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pj
import pyarrow.parquet as pq

from tokenbucket._exceptions import ConfigError

__all__ = [
    "METADATA_FORMATS",
    "count_rows",
    "iter_metadata_batches",
    "metadata_paths",
    "read_metadata",
    "table_from_rows",
]

METADATA_FORMATS: dict[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
}


def table_from_rows(rows: Sequence[Mapping[str, Any]], absent: Mapping[str, Any] | None = None) -> pa.Table:
    """Metadata rows (dicts) as a table with a column for every key that any row has.

    ``pa.Table.from_pylist`` takes its columns from the first row alone: an optional column the
    first sample lacks would vanish for every sample, and a later sample's tokens be undercounted.
    A row without a key gets ``absent[key]`` (e.g. :meth:`TokenSpec.absent_as_zero`), else null;
    a key present with ``None`` stays null.
    """
    if not rows:
        return pa.table({})
    names = set().union(*rows)
    if all(len(row) == len(names) for row in rows):
        return pa.Table.from_pylist(list(rows))  # every row has every key: pyarrow's own path
    fill = absent or {}
    order = list(dict.fromkeys(k for row in rows for k in row))
    return pa.Table.from_pydict({name: [row.get(name, fill.get(name)) for row in rows] for name in order})


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in set(METADATA_FORMATS.values()):
            raise ConfigError(f"format should be one of parquet, jsonl, csv, but got format={fmt!r}")
        return fmt
    suffix = path.suffix.lower()
    if suffix not in METADATA_FORMATS:
        raise ConfigError(
            f"cannot tell the format of {str(path)!r} from its suffix {suffix!r}; "
            f"use one of {sorted(METADATA_FORMATS)} or pass format="
        )
    return METADATA_FORMATS[suffix]


def _csv_options(key: str | None) -> Any:
    # a CSV key is text: type inference would read "001" as the number 1 (and then as the key "1")
    return pcsv.ConvertOptions(column_types={key: pa.string()} if key else {})


def _read_one(
    path: Path,
    fmt: str,
    columns: Sequence[str] | None,
    key: str | None = "key",
    absent: Mapping[str, Any] | None = None,
) -> pa.Table:
    if fmt == "parquet":
        if columns is not None:
            present = set(pq.read_schema(path).names)
            columns = [c for c in columns if c in present]
        return pq.read_table(path, columns=columns)
    if fmt == "jsonl":
        try:
            table = pj.read_json(path)
        except pa.ArrowInvalid as exc:
            if "changed from" not in str(exc):
                raise
            table = _read_mixed_jsonl(path)  # NOTE [ Mixed JSONL columns ]
        table = _absent_lines(table, absent)
    else:
        table = pcsv.read_csv(path, convert_options=_csv_options(key))
    if columns is not None:
        table = table.select([c for c in columns if c in table.column_names])
    _column_names(table.schema)
    return table


def _column_names(schema: pa.Schema) -> list[str]:
    """The schema's column names, decoded now: a reader hands a header that is not UTF-8 on as
    it is, and it would fail (``UnicodeDecodeError``) wherever a name is first read."""
    return [str(name) for name in schema.names]


def metadata_paths(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """The files ``source`` names: itself, the metadata files of a directory (sorted), or a list."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            paths = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in METADATA_FORMATS)
            if not paths:
                raise ConfigError(f"directory {str(path)!r} holds no {sorted(METADATA_FORMATS)} files")
            return paths
        if not path.exists():
            raise ConfigError(f"metadata source {str(path)!r} does not exist")
        return [path]
    paths = []
    for item in source:
        paths.extend(metadata_paths(item))
    if not paths:
        raise ConfigError("metadata source should name at least one file, but got an empty list")
    return paths


def count_rows(paths: Sequence[Path], format: str | None = None) -> int | None:
    """Rows in the inputs when cheap to know (Parquet footers), else ``None``."""
    total = 0
    for p in paths:
        if _format_of(p, format) != "parquet":
            return None
        try:
            total += pq.ParquetFile(p).metadata.num_rows
        except (pa.ArrowInvalid, OSError) as exc:  # a 0-byte or cut file: the reader's words, with the file's name
            raise ConfigError(f"cannot read {str(p)!r} as parquet: {exc}") from None
    return total


def iter_metadata_batches(
    source: str | Path | Sequence[str | Path],
    *,
    batch_rows: int = 1_000_000,
    format: str | None = None,
    columns: Sequence[str] | None = None,
    key: str | None = "key",
    absent: Mapping[str, Any] | None = None,
) -> Iterator[pa.Table]:
    """Tables of at most ``batch_rows`` rows, in input order, with bounded memory (``absent``:
    as for :func:`read_metadata`).

    Parquet is read a record batch at a time and CSV through Arrow's streaming reader; a JSONL
    file is read whole (split large JSONL inputs into part files). A CSV's ``key`` column is
    read as text.
    """
    for path in metadata_paths(source):
        fmt = _format_of(path, format)
        try:
            if fmt == "parquet":
                pf = pq.ParquetFile(path)
                cols = None if columns is None else [c for c in columns if c in _column_names(pf.schema_arrow)]
                for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
                    yield pa.Table.from_batches([batch])
            elif fmt == "csv":
                reader = pcsv.open_csv(
                    path, read_options=pcsv.ReadOptions(block_size=64 << 20), convert_options=_csv_options(key)
                )
                _column_names(reader.schema)
                pending: list[pa.RecordBatch] = []
                rows = 0
                for batch in reader:
                    pending.append(batch)
                    rows += batch.num_rows
                    if rows >= batch_rows:
                        yield pa.Table.from_batches(pending)
                        pending, rows = [], 0
                if pending:
                    yield pa.Table.from_batches(pending)
            else:
                table = _read_one(path, fmt, columns, key, absent)
                for start in range(0, table.num_rows, batch_rows):
                    yield table.slice(start, batch_rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {str(path)!r} as {fmt}: {exc}") from None


def read_metadata(
    source: str | Path | Sequence[str | Path],
    *,
    format: str | None = None,
    columns: Sequence[str] | None = None,
    key: str | None = "key",
    absent: Mapping[str, Any] | None = None,
) -> pa.Table:
    """Read metadata from a file, a directory of part files, or a list of files.

    Args:
        source: a ``.parquet``/``.jsonl``/``.csv`` file, a directory of them, or a list.
        format: force ``parquet``, ``jsonl`` or ``csv`` instead of guessing from the suffix.
        columns: read only these columns (those absent are left for the breakdown's
            validation to report).
        key: the key column, read from a CSV as text (so ``001`` stays ``"001"``).
        absent: values for columns a part file lacks while others have them (e.g.
            :meth:`TokenSpec.absent_as_zero`): the part then reads as it does alone, where an
            absent optional column counts 0, instead of as nulls. In JSONL, a line without the
            field (null to Arrow's reader) counts as absent too.

    Returns:
        One table, parts concatenated in order (schemas unified; a part missing a column
        gets nulls there, which validation then reports row by row).
    """
    paths = metadata_paths(source)
    tables = []
    for p in paths:
        fmt = _format_of(p, format)
        try:
            tables.append(_read_one(p, fmt, columns, key, absent))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, UnicodeDecodeError) as exc:
            hint = " (JSON metadata must be one object per line)" if fmt == "jsonl" else ""
            raise ConfigError(f"cannot read {str(p)!r} as {fmt}{hint}: {exc}") from None
    if len(tables) == 1:
        return tables[0]
    if absent:
        names = {n for t in tables for n in t.column_names}
        tables = [_fill_absent(t, names, absent) for t in tables]
    return pa.concat_tables(tables, promote_options="permissive")


def _read_mixed_jsonl(path: Path) -> pa.Table:
    """A JSONL file whose column changes type between lines, read line by line.

    NOTE [ Mixed JSONL columns ]
    Arrow's JSON reader refuses a whole file when one line's value has another type than the
    lines before (``"cameras": "two"`` among numbers), which would lose every sample for one
    bad row. Such a file is read again with ``json`` one line at a time, and a column whose
    values do not make one Arrow type is kept as text: the breakdown's validation then refuses
    just the bad rows, naming row, key and column, and keeps the others.
    """
    rows: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise ConfigError(f"{str(path)!r} line {number} is not one JSON object: {exc}") from None
            if not isinstance(row, dict):
                raise ConfigError(
                    f"{str(path)!r} line {number} should be one JSON object (JSON metadata is one object per "
                    f"line), but got {type(row).__name__}"
                )
            rows.append(row)
    columns: dict[str, pa.Array] = {}
    for name in dict.fromkeys(k for row in rows for k in row):
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            text = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
            columns[name] = pa.array(text, pa.string())
    return pa.table(columns)


def _absent_lines(table: pa.Table, absent: Mapping[str, Any] | None) -> pa.Table:
    """A JSONL line that leaves a field out reads as null (Arrow's reader cannot tell it from an
    explicit null); for the columns in ``absent`` it counts as absent, as in a Parquet part
    without the column, so a field that first appears on a late line does not refuse the lines
    before it."""
    for name, value in (absent or {}).items():
        if name in table.column_names and table.column(name).null_count:
            column = table.column(name)
            table = table.set_column(
                table.schema.get_field_index(name), name, column.fill_null(pa.scalar(value, column.type))
            )
    return table


def _fill_absent(table: pa.Table, names: set[str], absent: Mapping[str, Any]) -> pa.Table:
    for name in sorted(names - set(table.column_names)):
        if name in absent:
            table = table.append_column(name, pa.array([absent[name]] * table.num_rows))
    return table
