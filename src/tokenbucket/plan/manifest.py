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
row count, and a content hash (SHA-256 over every column, the plan and the token spec: NOTE
[ Content hash ]) that :func:`load_manifest` checks; given the spec and model it is used
with, it also checks that they are the ones it was planned for.

Building reads the inputs twice, a record batch at a time (bounded memory): once for the
length histogram (merged across batches, so the plan is the one a single pass would give), once
to write. It writes to a temporary file and renames it, so an interrupted build leaves no
half manifest behind, and it replaces nothing at ``out`` but a manifest (NOTE [ Safe output ],
in :mod:`tokenbucket.plan._manifest_io` with the rest of the on-disk side).

On a terminal each phase shows a bar on stderr (NOTE [ Progress on stderr ]): ``1/3 counting``
and ``3/3 writing`` move a record batch at a time; ``2/3 planning`` is one vectorised call, so
it is one step.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenbucket._exceptions import ConfigError, ManifestMismatchWarning, OversizeError
from tokenbucket._progress import progress as progress_bar
from tokenbucket.plan._manifest_io import (
    MANIFEST_FORMAT,
    META_KEY,
    ContentHash,
    Described,
    PartSink,
    RowAssignment,
    footer_info,
    json_ready,
    prepare_out,
    replace_out,
    temp_path,
)
from tokenbucket.plan._phases import make_plan
from tokenbucket.plan.buckets import BucketPlan, LengthHistogram
from tokenbucket.tokens.breakdown import R_DUPLICATE, breakdown_table, duplicate_rows
from tokenbucket.tokens.metadata import count_rows, iter_metadata_batches, metadata_paths
from tokenbucket.tokens.spec import TokenSpec

__all__ = [
    "MANIFEST_FORMAT",
    "Described",
    "Manifest",
    "ManifestMismatchWarning",
    "build_manifest",
    "length_histogram",
    "load_manifest",
]


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

    def summary(self) -> dict[str, Any]:
        """The plan's :meth:`~BucketPlan.summary` with every row the manifest refused:
        ``samples`` rows in a bucket, ``rejected`` rows with bucket -1 (oversize or invalid),
        ``invalid`` the rows among them refused as invalid metadata (a duplicate key, say)."""
        if self._table is not None:
            parts = [self._table.select(["bucket", "reason"])]
        else:
            parts = [pq.read_table(f, columns=["bucket", "reason"]) for f in self.files]
        bucket = np.concatenate([p.column("bucket").to_numpy() for p in parts])
        invalid = sum(int(pc.sum(pc.starts_with(p.column("reason"), "invalid")).as_py() or 0) for p in parts)
        return {
            **self.plan.summary(),
            "samples": int((bucket >= 0).sum()),
            "rejected": int((bucket < 0).sum()),
            "invalid": invalid,
        }

    def check_made_for(
        self, spec: TokenSpec | None = None, model: Described | None = None, *, allow_mismatch: bool = False
    ) -> None:
        """Check that the manifest was planned for ``spec`` and ``model`` (those given).

        The token spec is compared field by field, column names aside (they say where a count
        is read, not what it is); the model likewise, its ``name`` aside. A manifest that
        recorded no model (a plan handed to :func:`build_manifest`) has none to compare.

        Raises:
            ConfigError: a field differs (each differing field named with both values), unless
                ``allow_mismatch``; then a :class:`ManifestMismatchWarning` says the same.
        """
        found = self.differences(spec, model)
        if not found:
            return
        shown = "; ".join(found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")
        text = f"manifest {str(self.path)!r} was planned for another {' and '.join(_kinds(found))}: {shown}"
        if not allow_mismatch:
            raise ConfigError(f"{text}; plan again with these, or pass allow_mismatch=True to use it anyway")
        warnings.warn(text, ManifestMismatchWarning, stacklevel=3)

    def differences(self, spec: TokenSpec | None = None, model: Described | None = None) -> list[str]:
        """Where ``spec`` and ``model`` (those given) differ from what the manifest was planned
        for, one ``where.field: A in the manifest, B given`` each, compared as
        :meth:`check_made_for` does; empty when they match or nothing was recorded to compare."""
        found: list[str] = []
        if spec is not None:
            found += _differences("token_spec", self.meta.get("token_spec"), json_ready(spec.to_dict()))
        recorded = (self.meta.get("meta") or {}).get("model")
        if model is not None and recorded is not None:
            given = json_ready(model.to_dict())
            if isinstance(recorded, str):  # a caller recorded the model by name
                if given.get("name") is not None and given["name"] != recorded:
                    found.append(f"model: {recorded!r} in the manifest, {given['name']!r} given")
            else:
                found += _differences("model", recorded, given)
        return found


def _differences(where: str, recorded: object, given: object) -> list[str]:
    """``where.field: A in the manifest, B given`` for each differing leaf (column names and
    ``name`` aside: see :meth:`Manifest.check_made_for`)."""
    if isinstance(recorded, dict) and isinstance(given, dict):
        out: list[str] = []
        for k in sorted(set(recorded) | set(given), key=str):
            if k in ("columns", "column", "name"):
                continue
            out += _differences(f"{where}.{k}", recorded.get(k), given.get(k))
        return out
    return [] if recorded == given else [f"{where}: {recorded!r} in the manifest, {given!r} given"]


def _kinds(found: list[str]) -> list[str]:
    return [
        name
        for prefix, name in (("token_spec", "token spec"), ("model", "model"))
        if any(f.startswith(prefix) for f in found)
    ]


class _SeenKeys:
    """The keys of the rows kept so far, batch after batch.

    NOTE [ Duplicate keys across batches ]
    A key that an earlier batch holds is a duplicate the batch's own check cannot see. Keys
    sorted across the whole input are proven unique batch by batch (no lookup then); otherwise
    every kept key is held (about 20 bytes a row, the one part of a build that grows with the
    input) and each batch is looked up in them, or (``on_invalid="raise"``) hashed once at the
    end. The same check runs in both passes, so the plan counts exactly the rows the manifest
    puts in a bucket.
    """

    def __init__(self) -> None:
        self.arrays: list[pa.Array] = []
        self.sorted = True
        self.last: str | None = None

    def add(self, keys: pa.ChunkedArray, *, refuse: bool) -> np.ndarray | None:
        """Record a batch's keys (row order); with ``refuse``, the mask of those an earlier batch
        holds (they are refused, not recorded), or ``None`` when there are none."""
        was_sorted = self.sorted
        if self.sorted and len(keys):
            first = keys[0].as_py()
            if self.last is not None and (first is None or not first > self.last):
                self.sorted = False
            elif len(keys) > 1 and not pc.all(pc.greater(keys.slice(1), keys.slice(0, len(keys) - 1))).as_py():
                self.sorted = False
            self.last = keys[-1].as_py()
        dup = None
        if refuse and self.arrays and not (was_sorted and self.sorted):
            held = np.asarray(pc.is_in(keys, value_set=pa.concat_arrays(self.arrays)).fill_null(False))
            if held.any():
                dup, keys = held, keys.filter(pa.array(~held))
        self.arrays.append(keys.combine_chunks())
        return dup

    def check_unique(self) -> None:
        """Raise for the first repeated key (``on_invalid="raise"``: nothing was refused on the way)."""
        if not self.sorted:
            _check_unique_keys(pa.concat_arrays(self.arrays))
        self.arrays = []


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
    hist, _ = _count(paths, spec, batch_rows, keep_lengths=False, progress=False, total_rows=None, check_keys=False)
    return hist


def _count(
    paths: list[Path],
    spec: TokenSpec,
    batch_rows: int,
    *,
    keep_lengths: bool,
    progress: bool | None,
    total_rows: int | None,
    check_keys: bool,
    min_total: int = 0,
    desc: str = "counting",
    vision_out: list[np.ndarray] | None = None,
) -> tuple[LengthHistogram, np.ndarray]:
    """Pass 1: the lengths of the rows the write will put in a bucket (or find oversize).

    With ``check_keys`` (``on_invalid="reject"``) a row with a bad or repeated key is left out,
    as the write refuses it (NOTE [ Duplicate keys across batches ]); otherwise keys are not
    read: any such row makes the write raise. ``vision_out`` collects the same rows' image tokens
    (a 2D plan's second count, NOTE [ Two-dimensional buckets ]).
    """
    hist = empty_histogram()
    raw: list[np.ndarray] = []
    counting, columns = counting_spec(spec, check_keys)
    key = counting.columns.key
    seen = _SeenKeys()
    bar = progress_bar(total_rows, desc=desc, unit="rows", enabled=progress)
    try:
        for table in iter_metadata_batches(
            paths,
            batch_rows=batch_rows,
            columns=columns,
            key=spec.columns.key,
            absent=spec.absent_as_zero(),
        ):
            result = breakdown_table(table, counting, on_invalid="reject", min_total=min_total)
            totals = result.totals
            vision = result.table.column("vision").to_numpy() if vision_out is not None else None
            if key is not None:
                dup = seen.add(result.table.column("key"), refuse=True)
                if dup is not None:
                    totals = totals[~dup]
                    vision = vision[~dup] if vision is not None else None
            if vision_out is not None and vision is not None:
                vision_out.append(vision)
            hist = hist.merge(histogram_of(totals))
            if keep_lengths:
                raw.append(totals)
            bar.update(table.num_rows)
    finally:
        bar.close()  # a bar cut short by an error clears its line before the message
    return hist, (np.concatenate(raw) if raw else np.zeros(0, np.int64))


def empty_histogram() -> LengthHistogram:
    return LengthHistogram(np.zeros(0, np.int64), np.zeros(0, np.int64))


def histogram_of(totals: np.ndarray) -> LengthHistogram:
    """The histogram bins of a batch's counted totals."""
    # a packed plan keeps samples of 0 tokens (NOTE [ Samples without tokens ]): no bin for them
    return LengthHistogram.from_lengths(totals[totals > 0])


def counting_spec(spec: TokenSpec, check_keys: bool) -> tuple[TokenSpec, list[str]]:
    """The spec pass 1 counts with (keys read only with ``check_keys``) and the columns it reads."""
    key = spec.columns.key if check_keys else None
    counting = spec if key is not None else replace(spec, columns=replace(spec.columns, key=None))
    needed = [spec.columns.cameras, spec.columns.frames, spec.columns.height, spec.columns.width]
    needed += [r.column for r in spec.rules().values() if r.column is not None]
    return counting, needed + ([key] if key else [])


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
    force: bool = False,
    two_d: bool = False,
    multiple: int = 64,
    assigned: RowAssignment | None = None,
) -> Manifest:
    """Count, plan and write a manifest for the metadata in ``sources``.

    Args:
        sources: metadata files / directories (see :func:`tokenbucket.tokens.metadata.metadata_paths`).
        spec: the token spec.
        plan_or_cost: a :class:`BucketPlan` to apply as it is, or a cost model to plan with
            (then ``budget_bytes`` is required).
        out: the manifest to write: a ``.parquet`` file, or a directory of part files (any
            other name, or whenever ``part_rows`` is given). An existing ``out`` is replaced
            only when it is a manifest (NOTE [ Safe output ]).
        on_oversize: a sample longer than the last bound (or that fits not even alone):
            ``error`` or ``reject`` (bucket -1 with the reason).
        on_invalid: an invalid metadata row: ``raise`` or ``reject`` (bucket -1, the reason;
            the plan then counts only the rows kept).
        batch_rows: rows per record batch (memory is bounded by this, not by the input).
        part_rows: with a directory, start a new part file after about this many rows.
        progress: show a bar per phase on stderr (default: when stderr is a terminal; NOTE
            [ Progress on stderr ]).
        meta: more JSON-ready context to record (e.g. the model and GPU).
        force: also replace an existing ``out`` that is a regular file but not a manifest
            (never a directory, never a metadata input).
        two_d: plan 2D buckets, bounding every sample's image tokens as well as its length
            (:func:`~tokenbucket.plan.buckets_2d.plan_buckets_2d`; a cost model that takes
            ``vision=``: NOTE [ Two-dimensional buckets ]); ``mode="dynamic"`` stores what
            re-cuts each epoch's batches (NOTE [ A two-dimensional dynamic manifest ]).
        multiple: a 1D plan's bounds are multiples of this (64: tensor-core friendly shapes; 1:
            every bound a sample's own length, for a model that never pads, as a LeRobot policy).
        assigned: with a given plan, where each valid row goes and the columns it adds, decided
            by the caller (NOTE [ A two-cap packed manifest ]); default: ``plan.assign``.

    Returns:
        The written manifest, loaded.

    Raises:
        ConfigError: ``out`` may not be written (see ``force``), or the inputs / plan refuse.
    """
    out = Path(out)
    paths = metadata_paths(sources)
    prepare_out(out, paths, force=force)
    total_rows = count_rows(paths)

    # Pass 1: lengths → histogram (mergeable), and the raw lengths for dynamic mode.
    phases = 1 if isinstance(plan_or_cost, BucketPlan) else 3  # (a given plan is only written)
    if isinstance(plan_or_cost, BucketPlan):
        plan = plan_or_cost
    else:
        if budget_bytes is None:
            raise ConfigError("build_manifest with a cost model needs budget_bytes (or pass a BucketPlan)")
        if two_d and mode not in ("static", "dynamic"):
            why = " (two-cap packing: build_packed_manifest_2d)" if mode == "packed" else ""
            raise ConfigError(f"2D buckets are static or dynamic, but got mode={mode!r}{why}")
        vision: list[np.ndarray] | None = [] if two_d else None
        hist, raw = _count(
            paths,
            spec,
            batch_rows,
            keep_lengths=two_d or mode in ("dynamic", "packed"),
            progress=progress,
            total_rows=total_rows,
            check_keys=on_invalid == "reject",
            min_total=0 if mode == "packed" else 1,  # NOTE [ Samples without tokens ]
            desc="1/3 counting",
            vision_out=vision,
        )
        lengths = raw if two_d or mode in ("dynamic", "packed") else hist  # these plan the samples themselves
        plan = make_plan(
            lengths,
            plan_or_cost,
            budget_bytes,
            max_buckets=max_buckets,
            mode=mode,
            on_oversize=on_oversize,
            meta=meta,
            progress=progress,
            vision=None if vision is None else (np.concatenate(vision) if vision else np.zeros(0, np.int64)),
            multiple=multiple,
        )
    if not len(plan.bounds):
        raise ConfigError("the plan has no buckets: every sample was oversize")

    # Pass 2: breakdown, assign, write.
    as_parts = part_rows is not None or out.suffix.lower() != ".parquet"
    target = temp_path(out)  # NOTE [ Safe output ]
    if as_parts:
        target.mkdir()
    sink = PartSink(target, as_parts, part_rows)
    seen = _SeenKeys()  # NOTE [ Duplicate keys across batches ]
    bar = progress_bar(total_rows, desc=f"{phases}/{phases} writing", unit="rows", enabled=progress)
    offset = 0
    try:
        for table in iter_metadata_batches(
            paths, batch_rows=batch_rows, key=spec.columns.key, absent=spec.absent_as_zero()
        ):
            part = manifest_part(table, spec, plan, offset, on_invalid, on_oversize, assigned)
            # with on_invalid="reject", rows refused as invalid take no part in the key check
            kept = not_invalid(part) if on_invalid == "reject" else None
            keys = part.column("key") if kept is None else part.column("key").filter(pa.array(kept))
            dup = seen.add(keys, refuse=kept is not None)
            if dup is not None and kept is not None:
                part = refuse_kept(part, kept, dup)
            sink.write(part)
            offset += table.num_rows
            bar.update(table.num_rows)
        bar.close()  # (before the last hashing and renames: the rows are all written)
        if not sink.rows:
            raise ConfigError("the metadata inputs hold no rows")
        if on_invalid != "reject":  # (rejected as they came, above)
            seen.check_unique()
        del seen
        sink.close(footer_info(plan, spec, plan_or_cost, meta))
        replace_out(target, out)
    finally:
        bar.close()  # (closing twice is harmless)
        sink.abort()
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()
    return load_manifest(out, verify=False)  # just hashed what was written


def manifest_part(
    table: pa.Table, spec: TokenSpec, plan: BucketPlan, offset: int, on_invalid: str, on_oversize: str,
    assigned: RowAssignment | None = None,
) -> pa.Table:  # fmt: skip
    """One input batch as manifest rows: breakdown, global index, bucket, reason."""
    bounds = plan.bounds
    # NOTE [ Samples without tokens ]
    # A padded row of nothing but padding trains nothing (and an attention row with no key to
    # attend to is NaN in many kernels): in static and dynamic plans a sample of 0 tokens is an
    # invalid row, named under on_invalid="raise" and rejected with its reason under "reject".
    # Packing takes it (it adds no row), so packed plans keep it; a two-cap packed plan prices
    # every sample alone, and a sample of nothing is none (NOTE [ A two-cap packed manifest ]).
    min_total = 0 if plan.mode == "packed" and assigned is None else 1
    result = breakdown_table(table, spec, on_invalid=on_invalid, min_total=min_total, row_offset=offset)  # type: ignore[arg-type]
    good = result.table
    idx = good.column("index").to_numpy() + offset
    if assigned is not None:  # NOTE [ A two-cap packed manifest ]
        bucket, reason, extra = assigned.rows(idx)
        part = good.set_column(good.schema.get_field_index("index"), "index", pa.array(idx))
        part = part.append_column("bucket", pa.array(bucket.astype(np.int32))).append_column("reason", reason)
        for name, column in extra.items():
            part = part.append_column(name, column)
        return _with_rejected(part, result.rejected, offset) if result.rejected.num_rows else part
    vision = good.column("vision").to_numpy() if plan.two_d else None  # NOTE [ Two-dimensional buckets ]
    bucket = plan.assign(good.column("total").to_numpy(), vision).astype(np.int32)
    reason = pa.nulls(good.num_rows, pa.string())
    over = bucket < 0
    if over.any():
        first = int(np.flatnonzero(over)[0])
        if vision is not None:
            what = f"{int(good.column('total')[first].as_py()):,} tokens ({int(vision[first]):,} of them image tokens)"
            where = "no bucket of the 2D plan holds both"
            text = pa.scalar("oversize: no bucket of the 2D plan holds its tokens and image tokens")
        else:
            what = f"{int(good.column('total')[first].as_py()):,} tokens"
            where = f"above the plan's last bound {int(bounds[-1]):,}"
            text = pa.scalar(f"oversize: longer than the last bound {int(bounds[-1])}")
        if on_oversize == "error":
            key = good.column("key")[first].as_py()
            raise ConfigError(
                f"row {int(idx[first])} (key {key!r}) has {what}, {where}; pass {OversizeError.REJECT} or replan"
            )
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


def not_invalid(part: pa.Table) -> np.ndarray:
    """Rows not refused as invalid (kept, or oversize: their metadata is sound)."""
    reason = part.column("reason").fill_null("")
    return ~np.asarray(pc.starts_with(reason, "invalid"))


def refuse_kept(part: pa.Table, kept: np.ndarray, dup: np.ndarray) -> pa.Table:
    """Refuse the kept rows (``kept``, a mask over the part) that ``dup`` (a mask over the kept
    rows) marks as repeating an earlier batch's key."""
    refused = np.zeros(part.num_rows, dtype=bool)
    refused[np.flatnonzero(kept)[dup]] = True
    return _refuse_duplicates(part, refused)


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
        raise ConfigError(duplicate_key_message(row, keys[row].as_py()))


def duplicate_key_message(row: int, key: object) -> str:
    """What the error says of a key repeated at input ``row`` (``on_invalid="raise"``)."""
    return f"row {row}: key {key!r} is used by an earlier row; keys must be unique"


def load_manifest(
    path: str | Path,
    *,
    verify: bool = True,
    spec: TokenSpec | None = None,
    model: Described | None = None,
    allow_mismatch: bool = False,
) -> Manifest:
    """Read a manifest (a file or a directory of parts), checking its format version, its
    footer, (with ``verify``) every file's content hash, and (given ``spec`` / ``model``) that
    it was planned for them (:meth:`Manifest.check_made_for`).

    Raises:
        ConfigError: not a Parquet file, not a tokenbucket manifest, another format version (an
            older one: re-run ``tokenbucket plan``), a damaged footer, parts of different plans,
            a missing part, contents that do not match the recorded hash (truncated or edited),
            or another token spec or model than the ones given (unless ``allow_mismatch``: then
            a :class:`~tokenbucket._exceptions.ManifestMismatchWarning`).
    """
    path = Path(path)
    # by part number, not by name: part-100000 comes after part-99999
    files = sorted(path.glob("part-*.parquet"), key=_part_number) if path.is_dir() else [path]
    if not files:
        raise ConfigError(f"{str(path)!r} is a directory without part-*.parquet manifest files")
    infos = [_read_part(f, verify) for f in files]
    first = infos[0]
    if path.is_dir():
        if first["parts"] != len(files):
            raise ConfigError(f"{str(path)!r} should hold {first['parts']} parts, but holds {len(files)}")
        for i, (f, info) in enumerate(zip(files, infos, strict=True)):
            if info["plan"] != first["plan"] or info["created"] != first["created"]:
                raise ConfigError(f"{str(f)!r} belongs to another manifest than {str(files[0])!r}")
            if info["part"] != i:  # rows are indexed in part order: a renamed part would shift them
                raise ConfigError(f"{str(f)!r} holds part {info['part']} but sits at position {i}")
        combined = hashlib.sha256("".join(i["content_hash"] for i in infos).encode()).hexdigest()
        first = {**first, "rows": sum(i["rows"] for i in infos), "content_hash": combined}
        first.pop("part", None)
    try:
        plan = BucketPlan.from_dict(first["plan"])
    except (KeyError, TypeError, ValueError) as exc:  # ConfigError is a ValueError too
        raise ConfigError(f"{str(files[0])!r} has a damaged footer: its plan cannot be read ({exc!r})") from None
    manifest = Manifest(plan, first, path, files)
    if spec is not None or model is not None:
        manifest.check_made_for(spec, model, allow_mismatch=allow_mismatch)
    return manifest


# the footer's fields and their JSON types (bool is no int here)
_STAMP_FIELDS: dict[str, type] = {
    "format": int,
    "rows": int,
    "content_hash": str,
    "plan": dict,
    "token_spec": dict,
    "meta": dict,
    "created": str,
    "part": int,
    "parts": int,
}
_TYPE_WORDS = {int: "an integer", str: "a string", dict: "a JSON object"}


def _read_stamp(path: Path, raw: bytes) -> dict[str, Any]:
    """The footer's JSON object, refused with the file's name when damaged."""
    try:
        info = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (RecursionError: nested too deeply)
        raise ConfigError(
            f"{str(path)!r} has a damaged footer: its '{META_KEY.decode()}' entry is not JSON ({exc})"
        ) from None
    if not isinstance(info, dict):
        raise ConfigError(f"{str(path)!r} has a damaged footer: a JSON object was expected, but got {info!r:.60}")
    fmt = info.get("format")
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt != MANIFEST_FORMAT:
        if fmt < MANIFEST_FORMAT:
            raise ConfigError(
                f"{str(path)!r} is a manifest of format {fmt}, written by an older tokenbucket; re-run plan "
                f"(tokenbucket plan / build_manifest) to write it in format {MANIFEST_FORMAT}"
            )
        raise ConfigError(
            f"{str(path)!r} is a manifest of format {fmt}; this tokenbucket reads format {MANIFEST_FORMAT}: upgrade it"
        )
    for name, kind in _STAMP_FIELDS.items():
        value = info.get(name)
        if name not in info or not isinstance(value, kind) or isinstance(value, bool):
            got = "nothing" if name not in info else f"{value!r:.60}"
            raise ConfigError(
                f"{str(path)!r} has a damaged footer: field {name!r} should be {_TYPE_WORDS[kind]}, but got {got}"
            )
    if info["rows"] < 0 or not 0 <= info["part"] < info["parts"]:
        raise ConfigError(
            f"{str(path)!r} has a damaged footer: rows={info['rows']}, part={info['part']} of parts={info['parts']}"
        )
    return info


def _read_part(path: Path, verify: bool) -> dict[str, Any]:
    try:
        pf = pq.ParquetFile(path)
        kv = pf.metadata.metadata or {}  # the file footer's key-value metadata
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{str(path)!r} is not a readable Parquet file: {exc}") from None
    if META_KEY not in kv:
        raise ConfigError(
            f"{str(path)!r} is a Parquet file but not a tokenbucket manifest (no '{META_KEY.decode()}' metadata)"
        )
    info = _read_stamp(path, kv[META_KEY])
    if pf.metadata.num_rows != info["rows"]:
        raise ConfigError(f"{str(path)!r} has {pf.metadata.num_rows} rows but its metadata says {info['rows']}")
    if verify:
        h = ContentHash()  # NOTE [ Content hash ]: every column
        try:
            for batch in pf.iter_batches(batch_size=1_000_000):
                h.update(pa.Table.from_batches([batch]))
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"{str(path)!r} cannot be read (truncated?): {exc}") from None
        if h.hexdigest(info) != info["content_hash"]:
            raise ConfigError(
                f"{str(path)!r} does not match its content hash: its rows or plan were changed after it was written"
            )
    return info
