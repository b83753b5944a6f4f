"""Building a manifest on Ray Data: the local engine's steps, spread over a cluster's cores.

:func:`build_manifest_ray` takes :func:`~tokenbucket.plan.manifest.build_manifest`'s arguments
and gives its result: the same rows, in the same order, in the same buckets, with the same
content hash. Install the extra with ``pip install 'tokenbucket[ray]'``; Ray runs locally unless
it is already initialised or ``address`` names a cluster (whose workers must see the inputs and
``out`` on a shared file system).

NOTE [ Ray engine: order and identity ]
The manifest depends on the local engine's record batches (a rejected row's reason names its
row within the batch; a key repeated inside a batch is refused by the breakdown, one repeated
across batches by the key check), so the Ray engine reads exactly those batches: a *unit* is a
slice of one input file made of whole local batches (a Parquet file is cut at multiples of
``batch_rows``; a JSONL or CSV file, read by the local reader itself, is one unit). The Ray
Dataset's rows are the unit numbers; each map task reads its unit with the same reader and
runs the same per-batch functions of :mod:`tokenbucket.plan.manifest` on each batch.

Order never comes from Ray: every result carries its unit number and the driver puts results
in unit order. The global row index of a unit's first row is the sum of the rows of the units
before it (pass 1 counts them), so ``index`` is the input row as in the local engine.

1. Count (map per unit): the per-batch histogram of the rows a manifest would put in a bucket,
   merged exactly on the driver (integer counts), plus each unit's first and last kept key.
2. Keys: when the kept keys increase across the whole input (the usual key-ordered metadata),
   no key repeats across batches. Otherwise (NOTE [ Duplicate keys across batches ]) the kept
   keys are hash-partitioned by Ray tasks, each partition finds its repeats in input order
   (the later row is refused), and the driver gets only their histogram (subtracted from pass
   1's) and the first one; the repeated rows' positions stay in Ray's object store for pass 3.
3. Plan on the driver from the histogram (dynamic and packed modes simulate the samples
   themselves, so there the driver holds every kept row's length: 8 bytes a row).
4. Write (map per unit): manifest rows per batch, saved to a scratch Arrow file; then one
   task per manifest file streams its batches, in order, through the local writer's part
   writer and content hash (so file boundaries, rows and hash match the local engine's).
5. Rename into place as the local engine does (NOTE [ Safe output ]).

The driver holds unit numbers, histograms, the plan, per-batch row counts and file paths; no
per-sample row. An error a worker meets (an invalid row under ``on_invalid="raise"``, an
unreadable file) is raised by re-running the failing unit on the driver, so it is the local
engine's error, word for word; the earliest unit's error wins, as in a sequential pass.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
import ray.data

from tokenbucket._exceptions import ConfigError, TokenbucketError
from tokenbucket._progress import progress as progress_bar
from tokenbucket.plan._manifest_io import (
    ContentHash,
    finish_part,
    footer_info,
    open_part_writer,
    prepare_out,
    replace_out,
    temp_path,
)
from tokenbucket.plan._phases import make_plan
from tokenbucket.plan.buckets import BucketPlan, LengthHistogram
from tokenbucket.plan.manifest import (
    Manifest,
    counting_spec,
    duplicate_key_message,
    empty_histogram,
    histogram_of,
    load_manifest,
    manifest_part,
    not_invalid,
    refuse_kept,
)
from tokenbucket.tokens.breakdown import breakdown_table, duplicate_rows
from tokenbucket.tokens.metadata import count_rows, iter_metadata_batches, metadata_paths
from tokenbucket.tokens.spec import TokenSpec

__all__ = ["build_manifest_ray"]

_PARQUET = (".parquet", ".pq")


@dataclass(frozen=True)
class _Unit:
    """Whole local batches of one input: rows ``[start, stop)`` of a Parquet file, or (``stop``
    None) every batch of a file the local reader reads (JSONL, CSV)."""

    number: int
    path: Path
    start: int = 0
    stop: int | None = None


@dataclass
class _Keys:
    """A unit's kept keys at a glance: strictly increasing within the unit, first and last."""

    increasing: bool = True
    first: str | None = None
    last: str | None = None

    def add(self, keys: pa.ChunkedArray) -> None:
        if not len(keys) or not self.increasing:
            return
        head = keys[0].as_py()
        if self.last is not None and not (head is not None and head > self.last):
            self.increasing = False
        elif len(keys) > 1 and not pc.all(pc.greater(keys.slice(1), keys.slice(0, len(keys) - 1))).as_py():
            self.increasing = False
        self.first = head if self.first is None else self.first
        self.last = keys[-1].as_py()


@dataclass
class _Result:
    """What a unit's task hands the driver (no per-sample rows, but ``lengths`` in dynamic mode)."""

    rows: list[int] = field(default_factory=list)  # per batch
    hist: LengthHistogram = field(default_factory=empty_histogram)
    lengths: list[np.ndarray] = field(default_factory=list)
    keys: _Keys = field(default_factory=_Keys)
    files: list[str] = field(default_factory=list)  # pass 3: a scratch file per batch
    schema: bytes | None = None  # pass 3: the first batch's manifest schema
    error: str | None = None


@dataclass(frozen=True)
class _Job:
    """Everything a task needs, sent once with the map function."""

    units: list[_Unit]
    spec: TokenSpec
    batch_rows: int
    min_total: int
    check_keys: bool
    keep_lengths: bool


def build_manifest_ray(
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
    address: str | None = None,
) -> Manifest:
    """:func:`~tokenbucket.plan.manifest.build_manifest` on Ray Data (NOTE [ Ray engine: order
    and identity ]): the same arguments, the same manifest, content hash for content hash.

    Args:
        address: the Ray cluster to join when Ray is not initialised yet (``None``: start a
            local one, shut down again at the end); an initialised Ray is used as it is.
        (the others): as for :func:`~tokenbucket.plan.manifest.build_manifest`; ``batch_rows``
            is also the unit of work (a task reads whole batches).

    Returns:
        The written manifest, loaded.

    Raises:
        ConfigError: as :func:`~tokenbucket.plan.manifest.build_manifest`. With a given
            :class:`BucketPlan` the rows are still counted once (for the row offsets), so an
            unreadable file is reported before an invalid row of an earlier file.
    """
    out = Path(out)
    paths = metadata_paths(sources)
    prepare_out(out, paths, force=force)
    if not isinstance(plan_or_cost, BucketPlan) and budget_bytes is None:
        raise ConfigError("build_manifest with a cost model needs budget_bytes (or pass a BucketPlan)")
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        return _build(
            paths, spec, plan_or_cost, out, budget_bytes or 0, max_buckets, mode, on_oversize, on_invalid,
            batch_rows, part_rows, progress, meta,
        )  # fmt: skip
    finally:
        if started:
            ray.shutdown()


def _build(
    paths: list[Path],
    spec: TokenSpec,
    plan_or_cost: object,
    out: Path,
    budget_bytes: int,
    max_buckets: int,
    mode: str,
    on_oversize: str,
    on_invalid: str,
    batch_rows: int,
    part_rows: int | None,
    progress: bool | None,
    meta: dict[str, Any] | None,
) -> Manifest:
    total_rows = count_rows(paths)
    given = isinstance(plan_or_cost, BucketPlan)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]
    units = _units(paths, batch_rows, cpus)
    packed = (plan_or_cost.mode if isinstance(plan_or_cost, BucketPlan) else mode) == "packed"
    job = _Job(
        units,
        spec,
        batch_rows,
        min_total=0 if packed else 1,  # NOTE [ Samples without tokens ]
        check_keys=on_invalid == "reject",
        keep_lengths=not given and mode in ("dynamic", "packed"),
    )

    # pass 1: count (also the row offsets, so it runs with a given plan too)
    counted = _map(job, _count_unit, progress, total_rows, "1/3 counting" if not given else "1/2 counting")
    offsets = np.concatenate([[0], np.cumsum([sum(r.rows) for r in counted])]).astype(np.int64)
    hist = empty_histogram()
    for r in counted:
        hist = hist.merge(r.hist)
    dups: list[ray.ObjectRef[Any]] = []  # NOTE [ Duplicate keys across batches ], for pass 3
    if job.check_keys and not _increasing([r.keys for r in counted]):
        dups, dup_hist, _ = _duplicates(job, cpus)
        hist = _without(hist, dup_hist)
    if isinstance(plan_or_cost, BucketPlan):
        plan = plan_or_cost
    else:
        lengths: LengthHistogram | np.ndarray = hist
        if job.keep_lengths:
            lengths = _kept_lengths(counted, dups)
        plan = make_plan(
            lengths,
            plan_or_cost,
            budget_bytes,
            max_buckets=max_buckets,
            mode=mode,
            on_oversize=on_oversize,
            meta=meta,
            progress=progress,
        )
    if not len(plan.bounds):
        raise ConfigError("the plan has no buckets: every sample was oversize")

    # pass 3: manifest rows per batch to scratch files, then the manifest files, in order
    as_parts = part_rows is not None or out.suffix.lower() != ".parquet"
    target = temp_path(out)  # NOTE [ Safe output ]
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".ray", dir=out.parent))
    try:
        writer = _Writer(plan, on_invalid, on_oversize, offsets, dups, str(scratch))
        desc = "2/2 writing" if given else "3/3 writing"
        written = _map(job, writer, progress, total_rows, desc)
        rows = [n for r in written for n in r.rows]
        if not sum(rows):
            raise ConfigError("the metadata inputs hold no rows")
        if on_invalid != "reject" and not _increasing([r.keys for r in written]):
            _, _, first = _duplicates(job, cpus)
            if first is not None:
                raise ConfigError(duplicate_key_message(int(offsets[first[0]]) + first[1], first[2]))
        if as_parts:
            target.mkdir()
        files = [f for r in written for f in r.files]
        schema = next(r.schema for r in written if r.schema is not None)
        groups = _file_groups(rows, as_parts, part_rows)
        info = footer_info(plan, spec, plan_or_cost, meta)
        parts = [
            (str(target / f"part-{i:05d}.parquet" if as_parts else target), [files[b] for b in group])
            for i, group in enumerate(groups)
        ]
        _map_plain(
            len(parts),
            _Assemble(parts, schema, info),
        )
        replace_out(target, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()
    return load_manifest(out, verify=False)  # just hashed what was written


# -- units and reading -----------------------------------------------------------------------


def _units(paths: list[Path], batch_rows: int, cpus: int) -> list[_Unit]:
    """The inputs cut into units of whole local batches, about four per core (NOTE [ Ray
    engine: order and identity ])."""
    sizes = [pq.ParquetFile(p).metadata.num_rows if p.suffix.lower() in _PARQUET else None for p in paths]
    batches = sum(-(-n // batch_rows) for n in sizes if n is not None)
    per_unit = batch_rows * max(1, -(-batches // (4 * cpus)))
    units: list[_Unit] = []
    for path, n in zip(paths, sizes, strict=True):
        if n is None:
            units.append(_Unit(len(units), path))
        for start in range(0, n or 0, per_unit):
            units.append(_Unit(len(units), path, start, min(start + per_unit, n or 0)))
    return units


def _read(unit: _Unit, job: _Job, columns: list[str] | None) -> Iterator[pa.Table]:
    """The unit's batches, as the local engine's reader cuts them."""
    if unit.stop is None:
        yield from iter_metadata_batches(
            unit.path,
            batch_rows=job.batch_rows,
            columns=columns,
            key=job.spec.columns.key,
            absent=job.spec.absent_as_zero(),
        )
        return
    try:
        yield from _parquet_slice(unit.path, unit.start, unit.stop, job.batch_rows, columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise ConfigError(f"cannot read {str(unit.path)!r} as parquet: {exc}") from None


def _parquet_slice(path: Path, start: int, stop: int, batch_rows: int, columns: list[str] | None) -> Iterator[pa.Table]:
    """Rows ``[start, stop)`` of a Parquet file in tables of ``batch_rows`` (``start`` is a
    multiple of it, as the local reader's batches of the file are), reading only the row
    groups that hold them."""
    pf = pq.ParquetFile(path)
    cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
    meta = pf.metadata
    bounds = np.cumsum([0] + [meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
    first = int(np.searchsorted(bounds, start, side="right")) - 1
    last = int(np.searchsorted(bounds, stop, side="left"))
    skip, row = start - int(bounds[first]), start
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in pf.iter_batches(batch_size=batch_rows, row_groups=list(range(first, last)), columns=cols):
        if skip:
            cut = min(skip, batch.num_rows)
            batch, skip = batch.slice(cut), skip - cut
        pending.append(batch)
        held += batch.num_rows
        while row < stop and held >= min(batch_rows, stop - row):
            n = min(batch_rows, stop - row)
            table = pa.Table.from_batches(pending, schema=batch.schema)
            yield table.slice(0, n)
            pending, held, row = table.slice(n).to_batches(), held - n, row + n
    if row != stop:
        raise AssertionError(f"{str(path)!r}: rows {row} to {stop} are missing from its row groups")


# -- the map steps ---------------------------------------------------------------------------


def _map(
    job: _Job, step: Callable[[_Unit, _Job, bool], _Result], progress: bool | None, total: int | None, desc: str
) -> list[_Result]:
    """``step`` over every unit on Ray Data, results in unit order; the earliest unit's error
    is raised by running that unit again here (NOTE [ Ray engine: order and identity ])."""
    results: list[_Result | None] = [None] * len(job.units)
    bar = progress_bar(total, desc=desc, unit="rows", enabled=progress)
    try:
        for number, result in _map_rows(len(job.units), _OnUnit(job, step)):
            results[number] = result
            bar.update(sum(result.rows))
    finally:
        bar.close()
    done = [r for r in results if r is not None]
    if len(done) != len(job.units):
        raise AssertionError(f"Ray returned {len(done)} of {len(job.units)} units")
    for unit, result in zip(job.units, done, strict=True):
        if result.error is not None:
            step(unit, job, False)  # raises the local engine's error here
            raise ConfigError(f"{str(unit.path)!r}: {result.error} (on a Ray worker; it did not recur here)")
    return done


class _OnUnit:
    """A picklable ``number -> result`` for :func:`_map_rows`."""

    def __init__(self, job: _Job, step: Callable[[_Unit, _Job, bool], _Result]) -> None:
        self.job, self.step = job, step

    def __call__(self, number: int) -> _Result:
        return self.step(self.job.units[number], self.job, True)


def _map_rows(count: int, fn: Callable[[int], object]) -> Iterator[tuple[int, Any]]:
    """``fn(n)`` for ``n`` in ``range(count)`` as Ray Data map tasks, in completion order."""
    if not count:
        return

    def row(item: dict[str, Any]) -> dict[str, Any]:
        return {"n": item["n"], "out": pickle.dumps(fn(int(item["n"])))}

    with warnings.catch_warnings():  # Ray's first DataContext warns of its own deprecated field
        warnings.simplefilter("ignore", DeprecationWarning)
        ray.data.DataContext.get_current()
    ds = ray.data.from_items([{"n": n} for n in range(count)], override_num_blocks=count)
    for item in ds.map(row).iter_rows():
        yield int(item["n"]), pickle.loads(item["out"])


def _map_plain(count: int, fn: Callable[[int], object]) -> None:
    for _ in _map_rows(count, fn):
        pass


def _count_unit(unit: _Unit, job: _Job, catch: bool) -> _Result:
    """Pass 1 over a unit: what the local ``_count`` does per batch."""
    counting, columns = counting_spec(job.spec, job.check_keys)
    result = _Result()
    try:
        for table in _read(unit, job, columns):
            counted = breakdown_table(table, counting, on_invalid="reject", min_total=job.min_total)
            result.rows.append(table.num_rows)
            result.hist = result.hist.merge(histogram_of(counted.totals))
            if job.keep_lengths:
                result.lengths.append(counted.totals)
            if job.check_keys:
                result.keys.add(counted.table.column("key"))
    except TokenbucketError as exc:
        if not catch:
            raise
        result.error = str(exc)
    return result


class _Writer:
    """Pass 3 over a unit: the local engine's per-batch manifest rows, saved to scratch files."""

    def __init__(
        self,
        plan: BucketPlan,
        on_invalid: str,
        on_oversize: str,
        offsets: np.ndarray,
        dups: list[ray.ObjectRef[Any]],
        scratch: str,
    ) -> None:
        self.plan, self.on_invalid, self.on_oversize = plan, on_invalid, on_oversize
        self.offsets, self.dups, self.scratch = offsets, dups, scratch

    def __call__(self, unit: _Unit, job: _Job, catch: bool) -> _Result:
        result = _Result()
        offset = int(self.offsets[unit.number])
        # the unit's kept rows that repeat an earlier batch's key, by their rank among its kept rows
        repeated = _unit_ranks(self.dups, unit.number)
        seen = 0  # kept rows so far in this unit
        try:
            for number, table in enumerate(_read(unit, job, None)):
                part = manifest_part(table, job.spec, self.plan, offset, self.on_invalid, self.on_oversize)
                kept = not_invalid(part) if self.on_invalid == "reject" else None
                if kept is not None:
                    n_kept = int(kept.sum())
                    mine = repeated[(repeated >= seen) & (repeated < seen + n_kept)] - seen
                    if len(mine):
                        dup = np.zeros(n_kept, dtype=bool)
                        dup[mine] = True
                        part = refuse_kept(part, kept, dup)
                    seen += n_kept
                else:
                    result.keys.add(part.column("key"))
                path = os.path.join(self.scratch, f"{unit.number:06d}-{number:06d}.arrow")
                with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, part.schema) as ipc:
                    ipc.write_table(part)
                result.rows.append(table.num_rows)
                result.files.append(path)
                if result.schema is None:
                    result.schema = part.schema.serialize().to_pybytes()
                offset += table.num_rows
        except TokenbucketError as exc:
            if not catch:
                raise
            result.error = str(exc)
        return result


class _Assemble:
    """One manifest file from its batches' scratch files, in order, through the local writer's
    part writer and content hash (NOTE [ Content hash ])."""

    def __init__(self, parts: list[tuple[str, list[str]]], schema: bytes, info: dict[str, Any]) -> None:
        self.parts, self.schema, self.info = parts, schema, info

    def __call__(self, number: int) -> int:
        path, files = self.parts[number]
        schema = pa.ipc.read_schema(pa.py_buffer(self.schema))
        writer = open_part_writer(Path(path), schema)
        hasher, rows = ContentHash(), 0
        try:
            for file in files:
                part = pa.ipc.open_file(pa.memory_map(file)).read_all()
                if part.schema != schema:
                    part = part.cast(schema)
                writer.write_table(part)
                hasher.update(part)
                rows += part.num_rows
        except BaseException:
            writer.close()
            raise
        stamp = {**self.info, "rows": rows, "part": number, "parts": len(self.parts)}
        finish_part(writer, hasher, Path(path), stamp)
        return rows


def _file_groups(rows: list[int], as_parts: bool, part_rows: int | None) -> list[list[int]]:
    """Which batches each manifest file holds: :class:`PartSink`'s rule (a new part once the
    current one holds ``part_rows``, checked before each batch)."""
    limit = (part_rows or 1 << 62) if as_parts else 1 << 62
    groups: list[list[int]] = []
    held = 0
    for b, n in enumerate(rows):
        if not groups or held >= limit:
            groups.append([])
            held = 0
        groups[-1].append(b)
        held += n
    return groups


# -- keys repeated across batches (NOTE [ Duplicate keys across batches ]) --------------------


def _increasing(runs: list[_Keys]) -> bool:
    """Whether the kept keys increase across the whole input (then none repeats)."""
    last: str | None = None
    for run in runs:
        if not run.increasing:
            return False
        if run.first is None:
            continue
        if last is not None and not run.first > last:
            return False
        last = run.last
    return True


def _duplicates(job: _Job, cpus: int) -> tuple[list[ray.ObjectRef[Any]], LengthHistogram, tuple[int, int, str] | None]:
    """The kept rows whose key an earlier kept row has: per partition, a ref to ``{unit: ranks}``
    (a rank counts a unit's kept rows), and on the driver their histogram and the first one
    (unit, rank, key)."""
    partitions = max(2, cpus)
    # num_returns > 1: a list of refs, one per partition
    shards = [
        cast("list[ray.ObjectRef[pa.Table]]", _key_shards.options(num_returns=partitions).remote(unit, job, partitions))
        for unit in job.units
    ]
    found = [_shard_repeats.remote(*[s[p] for s in shards]) for p in range(partitions)]
    summaries = ray.get([f[0] for f in found])
    hist = empty_histogram()
    first: tuple[int, int, str] | None = None
    for part_hist, part_first in summaries:
        hist = hist.merge(part_hist)
        if part_first is not None and (first is None or part_first[:2] < first[:2]):
            first = part_first
    return [f[1] for f in found], hist, first


@ray.remote
def _key_shards(unit: _Unit, job: _Job, partitions: int) -> tuple[pa.Table, ...]:
    """A unit's kept keys with (unit, rank, total), cut into ``partitions`` by a hash of the key."""
    counting, columns = counting_spec(job.spec, True)
    tables = []
    for table in _read(unit, job, columns):
        counted = breakdown_table(table, counting, on_invalid="reject", min_total=job.min_total).table
        tables.append(
            counted.select(["key", "total"]).cast(pa.schema([("key", pa.large_string()), ("total", pa.int64())]))
        )
    kept = (
        pa.concat_tables(tables)
        if tables
        else pa.table({"key": pa.array([], pa.large_string()), "total": pa.array([], pa.int64())})
    )
    kept = kept.append_column("unit", pa.array(np.full(kept.num_rows, unit.number, np.int32)))
    kept = kept.append_column("rank", pa.array(np.arange(kept.num_rows, dtype=np.int64)))
    shard = _key_hash(kept.column("key").combine_chunks()) % partitions
    return tuple(kept.filter(pa.array(shard == p)) for p in range(partitions))


def _key_hash(keys: pa.Array) -> np.ndarray:
    """A hash of each key's bytes, the same in every process (Python's ``hash`` is salted)."""
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset : keys.offset + len(keys) + 1]
    buffer = keys.buffers()[2]
    data = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]].astype(np.uint64)
    starts = offsets[:-1] - offsets[0]
    lengths = np.diff(offsets)
    out = lengths.astype(np.uint64) * np.uint64(2654435761)
    if data.size:
        where = np.arange(data.size, dtype=np.uint64) - np.repeat(starts, lengths).astype(np.uint64)
        full = lengths > 0
        out[full] += np.add.reduceat(data, starts[full]) * np.uint64(1000003)
        out[full] += np.add.reduceat(data * (where + np.uint64(1)), starts[full])
    return out


@ray.remote(num_returns=2)
def _shard_repeats(
    *shards: pa.Table,
) -> tuple[tuple[LengthHistogram, tuple[int, int, str] | None], dict[int, np.ndarray]]:
    """One partition's repeats: rows (in input order) whose key an earlier row has."""
    table = pa.concat_tables(shards)  # units in order, ranks increasing: input order
    dup = duplicate_rows(table.column("key").combine_chunks())
    units = table.column("unit").to_numpy()[dup]
    ranks = table.column("rank").to_numpy()[dup]
    hist = histogram_of(table.column("total").to_numpy()[dup])
    first = None
    if len(dup):
        first = (int(units[0]), int(ranks[0]), str(table.column("key")[int(dup[0])].as_py()))
    return (hist, first), {int(u): ranks[units == u] for u in np.unique(units)}


def _unit_ranks(dups: list[ray.ObjectRef[Any]], unit: int) -> np.ndarray:
    """The ranks of a unit's repeated kept rows, sorted (empty when no key repeats)."""
    if not dups:
        return np.zeros(0, np.int64)
    found = [d.get(unit) for d in ray.get(dups)]
    return np.sort(np.concatenate([f for f in found if f is not None] + [np.zeros(0, np.int64)]))


def _without(hist: LengthHistogram, dup: LengthHistogram) -> LengthHistogram:
    """``hist`` less the rows of ``dup`` (each of whose lengths ``hist`` holds)."""
    counts = hist.counts.copy()
    np.subtract.at(counts, np.searchsorted(hist.values, dup.values), dup.counts)
    return LengthHistogram(hist.values, counts)


def _kept_lengths(counted: list[_Result], dups: list[ray.ObjectRef[Any]]) -> np.ndarray:
    """Every kept row's length, in input order (dynamic and packed plans simulate them)."""
    out = []
    for unit, result in enumerate(counted):
        lengths = np.concatenate(result.lengths) if result.lengths else np.zeros(0, np.int64)
        out.append(np.delete(lengths, _unit_ranks(dups, unit)))
    return np.concatenate(out) if out else np.zeros(0, np.int64)
