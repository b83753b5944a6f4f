"""The manifest: one Parquet file, one row per sample, and the plan in its footer.

It is the contract between offline planning and training. Columns::

    key        string   the sample's key
    index      int64    the row in the metadata inputs (in input order)
    vision, text, proprio, action, memory, <extras>, total
               int64    the token breakdown (null for a row rejected as invalid)
    bucket     int32    the bucket index, or -1 when the sample is rejected
    reason     string   why it was rejected (null otherwise)

The Parquet key-value metadata holds, under ``tokenbucket``, a JSON object with the format
version, the plan (:meth:`BucketPlan.to_dict`), the token spec, the model and GPU target, the
row count, and a content hash (SHA-256 over the ``key``, ``total`` and ``bucket`` columns) that
:func:`load_manifest` checks.

Building reads the inputs twice, a record batch at a time (bounded memory): once for the
length histogram (merged across batches, so the plan is the one a single pass would give), once
to write. It writes to a temporary file and renames it, so an interrupted build leaves no
half manifest behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan.buckets import BucketPlan, LengthHistogram, plan_buckets
from tokenbucket.tokens.breakdown import R_DUPLICATE, breakdown_table, duplicate_rows
from tokenbucket.tokens.metadata import count_rows, iter_metadata_batches, metadata_paths
from tokenbucket.tokens.spec import TokenSpec

__all__ = ["MANIFEST_FORMAT", "Manifest", "build_manifest", "length_histogram", "load_manifest"]

MANIFEST_FORMAT = 1
META_KEY = b"tokenbucket"


class Manifest:
    """A manifest: the plan and recorded context at once, the per-sample table on first use."""

    def __init__(self, plan: BucketPlan, meta: dict[str, Any], path: Path, files: list[Path]) -> None:
        self.plan, self.meta, self.path, self.files = plan, meta, path, files
        self._table: pa.Table | None = None

    @property
    def table(self) -> pa.Table:
        """The per-sample columns, parts in order (read from disk the first time)."""
        if self._table is None:
            self._table = pa.concat_tables([pq.read_table(f) for f in self.files])
        return self._table

    @property
    def content_hash(self) -> str:
        return str(self.meta["content_hash"])

    def __len__(self) -> int:
        return int(self.meta["rows"])


class _Progress:
    """A one-line progress counter on a terminal (silent otherwise)."""

    def __init__(self, total: int | None, label: str, enabled: bool | None) -> None:
        self.total, self.label = total, label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.done, self.start = 0, time.perf_counter()

    def update(self, rows: int) -> None:
        self.done += rows
        if not self.enabled:
            return
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        of = f"/{self.total:,}" if self.total else ""
        print(f"\r{self.label}: {self.done:,}{of} rows ({rate:,.0f} rows/s)", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


class _ContentHash:
    """SHA-256 of the logical contents of ``key``, ``total`` and ``bucket``: one stream per
    column part, so neither the buffer layout nor the batch boundaries change the result."""

    def __init__(self) -> None:
        self.streams = [hashlib.sha256() for _ in range(4)]  # key lengths, key bytes, total, bucket

    def update(self, table: pa.Table) -> None:
        lengths, data, totals, buckets = self.streams
        keys = table.column("key")
        if keys.null_count:
            keys = keys.fill_null("")
        for chunk in keys.cast(pa.large_string()).chunks:
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int64)[chunk.offset : chunk.offset + len(chunk) + 1]
            lengths.update(np.diff(offsets).tobytes())
            data.update(memoryview(chunk.buffers()[2])[int(offsets[0]) : int(offsets[-1])])
        total = table.column("total")
        totals.update((total.fill_null(-1) if total.null_count else total).to_numpy().astype(np.int64).tobytes())
        buckets.update(table.column("bucket").to_numpy().astype(np.int32).tobytes())

    def hexdigest(self) -> str:
        return hashlib.sha256(b"".join(s.digest() for s in self.streams)).hexdigest()


def length_histogram(
    sources: str | Path | Sequence[str | Path], spec: TokenSpec, *, batch_rows: int = 1_000_000
) -> LengthHistogram:
    """The exact ``L_total`` histogram of some metadata, a record batch at a time.

    Histograms of parts merge exactly (:meth:`LengthHistogram.merge`), so a large input can be
    counted part by part — in parallel processes, on other machines — and planned once with
    :func:`~tokenbucket.plan.buckets.plan_buckets`; the plan equals a single pass's. Invalid rows are
    left out (they are rejected or raised, with their keys, when the manifest is written).
    """
    paths = metadata_paths(sources)
    hist, _ = _count(paths, spec, batch_rows, keep_lengths=False, progress=False, total_rows=None)
    return hist


def _count(
    paths: list[Path],
    spec: TokenSpec,
    batch_rows: int,
    *,
    keep_lengths: bool,
    progress: bool | None,
    total_rows: int | None,
) -> tuple[LengthHistogram, np.ndarray]:
    hist = LengthHistogram(np.zeros(0, np.int64), np.zeros(0, np.int64))
    raw: list[np.ndarray] = []
    bar = _Progress(total_rows, "counting", progress)
    # No keys needed here: invalid rows are left out of the histogram and reported (or
    # rejected) with their keys when the manifest is written.
    counting = replace(spec, columns=replace(spec.columns, key=None))
    needed = [spec.columns.cameras, spec.columns.frames, spec.columns.height, spec.columns.width]
    needed += [r.column for r in spec.rules().values() if r.column is not None]
    for table in iter_metadata_batches(paths, batch_rows=batch_rows, columns=needed, key=spec.columns.key):
        totals = breakdown_table(table, counting, on_invalid="reject").totals
        hist = hist.merge(LengthHistogram.from_lengths(totals))
        if keep_lengths:
            raw.append(totals)
        bar.update(table.num_rows)
    bar.close()
    return hist, (np.concatenate(raw) if raw else np.zeros(0, np.int64))


def build_manifest(
    sources: str | Path | Sequence[str | Path],
    spec: TokenSpec,
    plan_or_cost: BucketPlan | Any,
    out: str | Path,
    *,
    budget_bytes: int | None = None,
    max_buckets: int = 32,
    mode: str = "static",
    on_oversize: str = "error",
    on_invalid: str = "raise",
    batch_rows: int = 1_000_000,
    part_rows: int | None = None,
    progress: bool | None = None,
    meta: dict[str, Any] | None = None,
) -> Manifest:
    """Count, plan and write a manifest for the metadata in ``sources``.

    Args:
        sources: metadata files / directories (see :func:`tokenbucket.tokens.metadata.metadata_paths`).
        spec: the token spec.
        plan_or_cost: a :class:`BucketPlan` to apply as it is, or a cost model to plan with
            (then ``budget_bytes`` is required).
        out: the manifest to write: a ``.parquet`` file, or a directory of part files (any
            other name, or whenever ``part_rows`` is given).
        on_oversize: a sample longer than the last bound (or that fits not even alone):
            ``error`` or ``reject`` (bucket -1 with the reason).
        on_invalid: an invalid metadata row: ``raise`` or ``reject`` (bucket -1, the reason).
        batch_rows: rows per record batch (memory is bounded by this, not by the input).
        part_rows: with a directory, start a new part file after about this many rows.
        progress: show a progress line (default: when stderr is a terminal).
        meta: more JSON-ready context to record (e.g. the model and GPU).

    Returns:
        The written manifest, loaded.
    """
    out = Path(out)
    paths = metadata_paths(sources)
    total_rows = count_rows(paths)

    # Pass 1: lengths → histogram (mergeable), and the raw lengths for dynamic mode.
    if isinstance(plan_or_cost, BucketPlan):
        plan = plan_or_cost
    else:
        if budget_bytes is None:
            raise ConfigError("build_manifest with a cost model needs budget_bytes (or pass a BucketPlan)")
        hist, raw = _count(
            paths,
            spec,
            batch_rows,
            keep_lengths=mode in ("dynamic", "packed"),
            progress=progress,
            total_rows=total_rows,
        )
        lengths: Any = raw if mode in ("dynamic", "packed") else hist  # both simulate the samples themselves
        plan = plan_buckets(
            lengths,
            plan_or_cost,
            budget_bytes,
            max_buckets=max_buckets,
            mode=mode,  # type: ignore[arg-type]
            on_oversize=on_oversize,  # type: ignore[arg-type]
            meta=meta,
        )
    bounds = plan.bounds
    if not len(bounds):
        raise ConfigError("the plan has no buckets: every sample was oversize")

    # Pass 2: breakdown, assign, write.
    as_parts = part_rows is not None or out.suffix.lower() != ".parquet"
    target = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    if as_parts:
        target.mkdir()
    sink = _PartSink(target, as_parts, part_rows)
    last_key: str | None = None
    keys_sorted = True
    all_keys: list[pa.Array] = []  # NOTE [ Duplicate keys across batches ]
    bar = _Progress(total_rows, "writing", progress)
    offset = 0
    try:
        for table in iter_metadata_batches(paths, batch_rows=batch_rows, key=spec.columns.key):
            part = _manifest_part(table, spec, plan, offset, on_invalid, on_oversize)
            # with on_invalid="reject", rows refused as invalid take no part in the key check
            kept = _not_invalid(part) if on_invalid == "reject" else None
            keys = part.column("key") if kept is None else part.column("key").filter(pa.array(kept))
            was_sorted = keys_sorted
            if keys_sorted and len(keys):
                first_key = keys[0].as_py()
                if last_key is not None and (first_key is None or not first_key > last_key):
                    keys_sorted = False
                elif len(keys) > 1 and not pc.all(pc.greater(keys.slice(1), keys.slice(0, len(keys) - 1))).as_py():
                    keys_sorted = False
                last_key = keys[-1].as_py()
            if kept is not None and all_keys and not (was_sorted and keys_sorted):
                # NOTE [ Duplicate keys across batches ], reject: a key an earlier batch holds makes
                # this row a refused duplicate (sorted keys cannot repeat: no lookup then)
                dup = (
                    np.asarray(pc.is_in(part.column("key"), value_set=pa.concat_arrays(all_keys)).fill_null(False))
                    & kept
                )
                if dup.any():
                    part = _refuse_duplicates(part, dup)
                    keys = part.column("key").filter(pa.array(kept & ~dup))
            all_keys.append(keys.combine_chunks())
            sink.write(part)
            offset += table.num_rows
            bar.update(table.num_rows)
        bar.close()
        if not sink.rows:
            raise ConfigError("the metadata inputs hold no rows")
        if not keys_sorted and on_invalid != "reject":  # (rejected as they came, above)
            # NOTE [ Duplicate keys across batches ]
            # Keys sorted across the whole input are proven unique batch by batch; otherwise one
            # hash over all of them. That needs the key column in memory (about 20 bytes a row),
            # the one part of the build that grows with the input.
            _check_unique_keys(pa.concat_arrays(all_keys))
        del all_keys
        # record what the plan was made for (the caller's words win)
        model = getattr(plan_or_cost, "model", None)
        gpu = getattr(plan_or_cost, "gpu", None)
        made_for = {
            "model": model.to_dict() if model is not None and hasattr(model, "to_dict") else None,
            "gpu": getattr(gpu, "name", None),
        }
        info = {
            "format": MANIFEST_FORMAT,
            "plan": plan.to_dict(),
            "token_spec": spec.to_dict(),
            "meta": {**made_for, **(meta or {})},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        sink.close(info)
        _replace(target, out)
    finally:
        sink.abort()
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()
    return load_manifest(out, verify=False)  # just hashed what was written


class _PartSink:
    """Writes manifest rows to one file, or to ``part-NNNNN.parquet`` files of ``part_rows``.

    NOTE [ Overlapped writes ]
    Parquet encoding and hashing release the GIL, so a writer thread encodes batch i while the
    main thread counts batch i + 1; at most two batches are in memory at once.
    """

    def __init__(self, target: Path, as_parts: bool, part_rows: int | None) -> None:
        self.target, self.as_parts = target, as_parts
        self.part_rows = part_rows or (1 << 62)
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: Future[None] | None = None
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self.hasher = _ContentHash()
        self.part_rows_written = 0
        self.parts: list[tuple[pq.ParquetWriter, _ContentHash, int]] = []  # closed at the end
        self.rows = 0

    def _path(self) -> Path:
        return self.target / f"part-{len(self.parts):05d}.parquet" if self.as_parts else self.target

    def write(self, part: pa.Table) -> None:
        if self.schema is None:
            self.schema = part.schema
        if part.schema != self.schema:
            part = part.cast(self.schema)
        if self.pending is not None:
            self.pending.result()
        if self.writer is None or (self.as_parts and self.part_rows_written >= self.part_rows):
            self._rotate()
        writer, hasher = self.writer, self.hasher

        def job() -> None:
            assert writer is not None
            writer.write_table(part)
            hasher.update(part)

        self.pending = self.pool.submit(job)
        self.part_rows_written += part.num_rows
        self.rows += part.num_rows

    def _rotate(self) -> None:
        if self.writer is not None:
            self.parts.append((self.writer, self.hasher, self.part_rows_written))
        assert self.schema is not None
        # keys are unique: a dictionary would only cost time
        self.writer = pq.ParquetWriter(self._path(), self.schema, use_dictionary=["bucket", "reason"])
        self.hasher = _ContentHash()
        self.part_rows_written = 0

    def close(self, info: dict[str, Any]) -> None:
        """Finish every file with its footer: ``info`` plus its own rows and content hash."""
        if self.pending is not None:
            self.pending.result()
        if self.writer is not None:
            self.parts.append((self.writer, self.hasher, self.part_rows_written))
            self.writer = None
        # NOTE [ Overlapped writes ]: the writer thread's parts are closed here
        for i, (writer, hasher, rows) in enumerate(self.parts):
            stamp = {**info, "rows": rows, "content_hash": hasher.hexdigest(), "part": i, "parts": len(self.parts)}
            writer.add_key_value_metadata({META_KEY.decode(): json.dumps(stamp)})
            writer.close()
        self.parts = []

    def abort(self) -> None:
        self.pool.shutdown(wait=True)
        for writer, _, _ in self.parts:
            writer.close()
        if self.writer is not None:
            self.writer.close()
        self.parts, self.writer = [], None


def _replace(src: Path, dst: Path) -> None:
    """Move the finished manifest into place; an existing one is replaced only once the new one
    is complete."""
    if src.is_dir() and dst.exists():
        old = dst.with_name(f".{dst.name}.{os.getpid()}.old")
        os.replace(dst, old)
        os.replace(src, dst)
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        os.replace(src, dst)


def _manifest_part(
    table: pa.Table, spec: TokenSpec, plan: BucketPlan, offset: int, on_invalid: str, on_oversize: str
) -> pa.Table:
    """One input batch as manifest rows: breakdown, global index, bucket, reason."""
    bounds = plan.bounds
    result = breakdown_table(table, spec, on_invalid=on_invalid)  # type: ignore[arg-type]
    good = result.table
    idx = good.column("index").to_numpy() + offset
    bucket = plan.assign(good.column("total").to_numpy()).astype(np.int32)
    reason = pa.nulls(good.num_rows, pa.string())
    over = bucket < 0
    if over.any():
        first = int(np.flatnonzero(over)[0])
        if on_oversize == "error":
            key = good.column("key")[first].as_py()
            raise ConfigError(
                f"row {int(idx[first])} (key {key!r}) has {int(good.column('total')[first].as_py()):,} tokens, "
                f"above the plan's last bound {int(bounds[-1]):,}; pass on_oversize='reject' or replan"
            )
        text = pa.scalar(f"oversize: longer than the last bound {int(bounds[-1])}")
        reason = pc.if_else(pa.array(over), text, pa.scalar(None, pa.string()))
    part = good.set_column(good.schema.get_field_index("index"), "index", pa.array(idx))
    part = part.append_column("bucket", pa.array(bucket)).append_column("reason", reason)
    if result.rejected.num_rows:
        part = _with_rejected(part, result.rejected, offset)
    return part


def _with_rejected(part: pa.Table, rejected: pa.Table, offset: int) -> pa.Table:
    """Append invalid rows (bucket -1, breakdown null, the reason) and restore input order."""
    n = rejected.num_rows
    cols: dict[str, pa.Array] = {}
    for name in part.column_names:
        typ = part.schema.field(name).type
        if name == "key":
            cols[name] = rejected.column("key").cast(typ)
        elif name == "index":
            cols[name] = pa.array(rejected.column("index").to_numpy() + offset)
        elif name == "bucket":
            cols[name] = pa.array(np.full(n, -1, np.int32))
        elif name == "reason":
            cols[name] = pa.array([f"invalid: {m}" for m in rejected.column("message").to_pylist()], pa.string())
        else:
            cols[name] = pa.nulls(n, typ)
    merged = pa.concat_tables([part, pa.table(cols, schema=part.schema)])
    return merged.sort_by("index")


def _not_invalid(part: pa.Table) -> np.ndarray:
    """Rows not refused as invalid (kept, or oversize: their metadata is sound)."""
    reason = part.column("reason").fill_null("")
    return ~np.asarray(pc.starts_with(reason, "invalid"))


def _refuse_duplicates(part: pa.Table, dup: np.ndarray) -> pa.Table:
    """Rows ``dup`` become invalid rows (bucket -1, breakdown null) whose reason is the repeated key."""
    mask = pa.array(dup)
    keys, index = part.column("key").to_pylist(), part.column("index").to_pylist()
    text = [
        f"invalid: row {index[i]} key {keys[i]!r}: column 'key' {R_DUPLICATE}, but got key={keys[i]!r}"
        if dup[i]
        else None
        for i in range(len(dup))
    ]  # worded as the breakdown words one within a batch
    cols = []
    for name in part.column_names:
        col = part.column(name)
        if name == "bucket":
            col = pc.if_else(mask, pa.scalar(-1, col.type), col)
        elif name == "reason":
            col = pc.if_else(mask, pa.array(text, pa.string()), col)
        elif name not in ("key", "index"):
            col = pc.if_else(mask, pa.scalar(None, col.type), col)
        cols.append(col)
    return pa.table(cols, schema=part.schema)


def _part_number(path: Path) -> tuple[int, str]:
    digits = path.stem.removeprefix("part-")
    return (int(digits), path.name) if digits.isdigit() else (-1, path.name)


def _check_unique_keys(keys: pa.Array) -> None:
    # NOTE [ Duplicate keys ]: the later row of a repeated key is the one refused
    dup = duplicate_rows(keys)
    if len(dup):
        row = int(dup[0])
        raise ConfigError(f"row {row}: key {keys[row].as_py()!r} is used by an earlier row; keys must be unique")


def load_manifest(path: str | Path, *, verify: bool = True) -> Manifest:
    """Read a manifest (a file or a directory of parts), checking its format version and (with
    ``verify``) every file's content hash.

    Raises:
        ConfigError: not a Parquet file, not a tokenbucket manifest, another format version,
            parts of different plans, a missing part, or contents that do not match the
            recorded hash (truncated or edited).
    """
    path = Path(path)
    # by part number, not by name: part-100000 comes after part-99999
    files = sorted(path.glob("part-*.parquet"), key=_part_number) if path.is_dir() else [path]
    if not files:
        raise ConfigError(f"{str(path)!r} is a directory without part-*.parquet manifest files")
    infos = [_read_part(f, verify) for f in files]
    first = infos[0]
    if path.is_dir():
        if first.get("parts") != len(files):
            raise ConfigError(f"{str(path)!r} should hold {first.get('parts')} parts, but holds {len(files)}")
        for i, (f, info) in enumerate(zip(files, infos, strict=True)):
            if info["plan"] != first["plan"] or info["created"] != first["created"]:
                raise ConfigError(f"{str(f)!r} belongs to another manifest than {str(files[0])!r}")
            if info.get("part", i) != i:  # rows are indexed in part order: a renamed part would shift them
                raise ConfigError(f"{str(f)!r} holds part {info.get('part')} but sits at position {i}")
        combined = hashlib.sha256("".join(i["content_hash"] for i in infos).encode()).hexdigest()
        first = {**first, "rows": sum(i["rows"] for i in infos), "content_hash": combined}
        first.pop("part", None)
    return Manifest(BucketPlan.from_dict(first["plan"]), first, path, files)


def _read_part(path: Path, verify: bool) -> dict[str, Any]:
    try:
        pf = pq.ParquetFile(path)
        kv = pf.metadata.metadata or {}  # the file footer's key-value metadata
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"{str(path)!r} is not a readable Parquet file: {exc}") from None
    if META_KEY not in kv:
        raise ConfigError(
            f"{str(path)!r} is a Parquet file but not a tokenbucket manifest (no '{META_KEY.decode()}' metadata)"
        )
    info: dict[str, Any] = json.loads(kv[META_KEY])
    if info.get("format") != MANIFEST_FORMAT:
        raise ConfigError(
            f"{str(path)!r} has manifest format {info.get('format')!r}; this tokenbucket reads {MANIFEST_FORMAT}"
        )
    if pf.metadata.num_rows != info["rows"]:
        raise ConfigError(f"{str(path)!r} has {pf.metadata.num_rows} rows but its metadata says {info['rows']}")
    if verify:
        h = _ContentHash()
        try:
            for batch in pf.iter_batches(batch_size=1_000_000, columns=["key", "total", "bucket"]):
                h.update(pa.Table.from_batches([batch]))
        except (OSError, pa.ArrowInvalid) as exc:
            raise ConfigError(f"{str(path)!r} cannot be read (truncated?): {exc}") from None
        if h.hexdigest() != info["content_hash"]:
            raise ConfigError(f"{str(path)!r} does not match its content hash: it was changed after it was written")
    return info
