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

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from tokenbucket._exceptions import ConfigError

__all__ = ["METADATA_FORMATS", "read_metadata"]

METADATA_FORMATS: dict[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
}


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


def _read_one(path: Path, fmt: str, columns: Sequence[str] | None) -> pa.Table:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        if columns is not None:
            present = set(pq.read_schema(path).names)
            columns = [c for c in columns if c in present]
        return pq.read_table(path, columns=columns)
    if fmt == "jsonl":
        import pyarrow.json as pj

        table = pj.read_json(path)
    else:
        import pyarrow.csv as pcsv

        table = pcsv.read_csv(path)
    if columns is not None:
        table = table.select([c for c in columns if c in table.column_names])
    return table


def read_metadata(
    source: str | Path | Sequence[str | Path],
    *,
    format: str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Read metadata from a file, a directory of part files, or a list of files.

    Args:
        source: a ``.parquet``/``.jsonl``/``.csv`` file, a directory of them, or a list.
        format: force ``parquet``, ``jsonl`` or ``csv`` instead of guessing from the suffix.
        columns: read only these columns (those absent are left for the breakdown's
            validation to report).

    Returns:
        One table, parts concatenated in order (schemas unified; a part missing a column
        gets nulls there, which validation then reports row by row).
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            paths = sorted(
                p for p in path.iterdir() if p.is_file() and p.suffix.lower() in METADATA_FORMATS
            )
            if not paths:
                raise ConfigError(f"directory {str(path)!r} holds no {sorted(METADATA_FORMATS)} files")
        elif path.exists():
            paths = [path]
        else:
            raise ConfigError(f"metadata source {str(path)!r} does not exist")
    else:
        paths = [Path(p) for p in source]
        if not paths:
            raise ConfigError("metadata source should name at least one file, but got an empty list")
    tables = []
    for p in paths:
        fmt = _format_of(p, format)
        try:
            tables.append(_read_one(p, fmt, columns))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            hint = " (JSON metadata must be one object per line)" if fmt == "jsonl" else ""
            raise ConfigError(f"cannot read {str(p)!r} as {fmt}{hint}: {exc}") from None
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")
