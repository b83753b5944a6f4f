"""The manifest on disk: its footer key and format, the content hash, the part writer, and the
rules for putting a new manifest where ``out`` says without losing anything that was there.

NOTE [ Safe output ]
Building a manifest never deletes or overwrites what tokenbucket did not create:

- ``out`` may already hold a tokenbucket manifest (a Parquet file with our footer key, or a
  directory holding nothing but our ``part-*.parquet`` files); that one is replaced. A regular
  file that is not a manifest is replaced only with ``force``; a directory holding anything
  else, a metadata input, a symbolic link, or a name such as ``.`` never is.
- The new manifest is written to a sibling ``.{name}.{pid}.tmp`` and moved into place with
  ``os.replace``, so ``out`` holds the old manifest or the new one, never half of one. (A
  directory replacing a directory takes two renames, the old one parked as ``.{name}.{pid}.old``
  in between.)
- A killed build leaves its temporary behind. The next build for the same ``out`` removes the
  temporaries of that pattern whose process is gone (and puts a parked old manifest back if the
  kill fell between the two renames); no other file is touched. The Ray engine's scratch
  directory, ``.{name}.{pid}.{random}.ray`` holding only its ``NNNNNN-NNNNNN.arrow`` batch files,
  is cleared the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.tokens.spec import TokenSpec

__all__ = [
    "MANIFEST_FORMAT",
    "META_KEY",
    "ContentHash",
    "Described",
    "PartSink",
    "RowAssignment",
    "finish_part",
    "footer_info",
    "is_manifest_file",
    "json_ready",
    "model_of",
    "open_part_writer",
    "prepare_out",
    "replace_out",
    "temp_path",
]

MANIFEST_FORMAT = 2  # 2: the content hash covers every column, the plan and the token spec
META_KEY = b"tokenbucket"
_PART = re.compile(r"part-\d+\.parquet")
_SCRATCH = re.compile(r"\d{6}-\d{6}\.arrow")  # the Ray engine's batch files


# -- the content hash ------------------------------------------------------------------------


class ContentHash:
    """SHA-256 of a manifest file's logical contents and of what it was planned with.

    NOTE [ Content hash ]
    Every column is hashed: its name, and per column three streams fed batch by batch — the
    global row numbers of its nulls, the byte length of each string (string columns), and the
    values (integers as int64, floats as float64, strings as their UTF-8 bytes, nulls as 0 or
    ""). Streams are concatenations, so neither the buffers' layout nor the batch boundaries
    change the result: a file hashes the same when written and when read back in other
    batches. :meth:`hexdigest` adds the plan and token spec of the footer, so an edit to any
    column or to the plan shows. Hashing runs in the writer thread (NOTE [ Overlapped writes ]);
    see benchmarks/bench_plan.py for its cost.
    """

    def __init__(self) -> None:
        self.columns: dict[str, tuple[hashlib._Hash, hashlib._Hash, hashlib._Hash]] = {}
        self.rows = 0

    def update(self, table: pa.Table) -> None:
        for name, column in zip(table.column_names, table.columns, strict=True):
            streams = self.columns.get(name)
            if streams is None:
                streams = self.columns[name] = (hashlib.sha256(), hashlib.sha256(), hashlib.sha256())
            _hash_column(column, self.rows, *streams)
        self.rows += table.num_rows

    def hexdigest(self, stamp: Mapping[str, object]) -> str:
        """The digest of the columns seen, with ``stamp``'s ``plan`` and ``token_spec``."""
        made_with = {"plan": stamp.get("plan"), "token_spec": stamp.get("token_spec")}
        total = hashlib.sha256(b"tokenbucket manifest %d\n" % MANIFEST_FORMAT)
        total.update(json.dumps(made_with, sort_keys=True, separators=(",", ":")).encode())
        for name, streams in self.columns.items():
            total.update(b"\ncolumn %d:" % len(name.encode()) + name.encode())
            for s in streams:
                total.update(s.digest())
        return total.hexdigest()


def _hash_column(
    column: pa.ChunkedArray, offset: int, nulls: hashlib._Hash, lengths: hashlib._Hash, values: hashlib._Hash
) -> None:
    """Feed one batch of a column to its three streams (NOTE [ Content hash ])."""
    typ = column.type
    if pa.types.is_dictionary(typ):
        column = column.cast(typ.value_type)
        typ = typ.value_type
    if column.null_count:
        valid = np.asarray(column.is_valid())
        nulls.update(np.ascontiguousarray(np.flatnonzero(~valid) + offset, dtype=np.int64).data)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ):
        text = column.fill_null("") if column.null_count else column
        for chunk in text.cast(pa.large_binary()).chunks:
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int64)[chunk.offset : chunk.offset + len(chunk) + 1]
            lengths.update(np.ascontiguousarray(np.diff(offsets)).data)
            if len(chunk):
                values.update(memoryview(chunk.buffers()[2])[int(offsets[0]) : int(offsets[-1])])
    elif pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        dtype = np.float64 if pa.types.is_floating(typ) else np.int64
        filled = column.fill_null(False if pa.types.is_boolean(typ) else 0) if column.null_count else column
        for chunk in filled.chunks:
            values.update(np.ascontiguousarray(chunk.to_numpy(zero_copy_only=False), dtype=dtype).data)
    else:  # no manifest column has another type today; this keeps a future one covered
        for item in column.to_pylist():
            text = json.dumps(item, sort_keys=True, default=str).encode()
            lengths.update(np.int64(len(text)).tobytes())
            values.update(text)


def json_ready(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as a footer holds it (tuples become lists, keys strings)."""
    out: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return out


class Described(Protocol):
    """What a model spec gives a manifest to record and compare: its fields as a JSON-ready dict."""

    def to_dict(self) -> dict[str, Any]: ...


class RowAssignment(Protocol):
    """Rows a plan placed itself, before the write (a two-cap packed plan: NOTE [ A two-cap
    packed manifest ]): for input rows ``index`` (global, valid ones), their bucket, their reason
    (null when placed) and the extra columns the manifest stores of them."""

    def rows(self, index: np.ndarray) -> tuple[np.ndarray, pa.Array, dict[str, pa.Array]]: ...


def model_of(cost: object) -> Described | None:
    """The model ``cost`` prices, as a manifest records what it was planned for: its ``model``
    when that gives a ``to_dict`` (a ``CostModel``'s ``ModelSpec``), else ``None``."""
    model = getattr(cost, "model", None)  # (a property may refuse with AttributeError: no model)
    return cast(Described, model) if model is not None and callable(getattr(model, "to_dict", None)) else None


def footer_info(plan: BucketPlan, spec: TokenSpec, plan_or_cost: object, meta: dict[str, Any] | None) -> dict[str, Any]:
    """What every file's footer records (its rows, part and hash aside)."""
    # record what the plan was made for (the caller's words win)
    model = model_of(plan_or_cost)
    gpu = getattr(plan_or_cost, "gpu", None)
    made_for = {
        "model": model.to_dict() if model is not None else None,
        "gpu": getattr(gpu, "name", None),
    }
    info = {
        "format": MANIFEST_FORMAT,
        "plan": plan.to_dict(),
        "token_spec": spec.to_dict(),
        "meta": {**made_for, **(meta or {})},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return json_ready(info)


# -- writing ---------------------------------------------------------------------------------


class PartSink:
    """Writes manifest rows to one file, or to ``part-NNNNN.parquet`` files of ``part_rows``.

    NOTE [ Overlapped writes ]
    Parquet encoding and hashing release the GIL, so a writer thread encodes batch i and a hasher
    thread hashes it while the main thread counts batch i + 1; at most two batches are in memory
    at once. (Hashing every column costs about 0.1 s per 2M rows: on its own thread it hides
    behind the encoding where there are cores for it; see benchmarks/bench_plan.py.)
    """

    def __init__(self, target: Path, as_parts: bool, part_rows: int | None) -> None:
        self.target, self.as_parts = target, as_parts
        self.part_rows = part_rows or (1 << 62)
        self.pools = (ThreadPoolExecutor(max_workers=1), ThreadPoolExecutor(max_workers=1))  # write, hash
        self.pending: list[Future[None]] = []
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self.hasher = ContentHash()
        self.part_rows_written = 0
        self.parts: list[tuple[pq.ParquetWriter, ContentHash, int, Path]] = []  # closed at the end
        self.rows = 0

    def _path(self) -> Path:
        return self.target / f"part-{len(self.parts):05d}.parquet" if self.as_parts else self.target

    def write(self, part: pa.Table) -> None:
        if self.schema is None:
            self.schema = part.schema
        if part.schema != self.schema:
            part = part.cast(self.schema)
        self._wait()
        if self.writer is None or (self.as_parts and self.part_rows_written >= self.part_rows):
            self._rotate()
        if self.writer is None:
            raise AssertionError("a part is written before its file is open")
        self.pending = [
            self.pools[0].submit(self.writer.write_table, part),
            self.pools[1].submit(self.hasher.update, part),
        ]
        self.part_rows_written += part.num_rows
        self.rows += part.num_rows

    def _wait(self) -> None:
        pending, self.pending = self.pending, []
        for job in pending:
            job.result()

    def _rotate(self) -> None:
        if self.writer is not None:
            self.parts.append((self.writer, self.hasher, self.part_rows_written, self._path()))
        if self.schema is None:
            raise AssertionError("a part file is opened before the first rows came")
        self.writer = open_part_writer(self._path(), self.schema)
        self.hasher = ContentHash()
        self.part_rows_written = 0

    def close(self, info: dict[str, object]) -> None:
        """Finish every file with its footer (``info`` plus its own rows and content hash), on disk."""
        self._wait()
        if self.writer is not None:
            self.parts.append((self.writer, self.hasher, self.part_rows_written, self._path()))
            self.writer = None
        # NOTE [ Overlapped writes ]: the writer thread's parts are closed here
        for i, (writer, hasher, rows, path) in enumerate(self.parts):
            finish_part(writer, hasher, path, {**info, "rows": rows, "part": i, "parts": len(self.parts)})
        self.parts = []

    def abort(self) -> None:
        for pool in self.pools:
            pool.shutdown(wait=True)
        for writer, *_ in self.parts:
            writer.close()
        if self.writer is not None:
            self.writer.close()
        self.parts, self.writer = [], None


def open_part_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    """A manifest file's writer (shared by :class:`PartSink` and the Ray engine's part writers)."""
    # keys are unique: a dictionary would only cost time
    return pq.ParquetWriter(path, schema, use_dictionary=["bucket", "reason"])


def finish_part(writer: pq.ParquetWriter, hasher: ContentHash, path: Path, stamp: dict[str, object]) -> None:
    """Close one manifest file with its footer: ``stamp`` (the manifest's info with this file's
    ``rows``, ``part`` and ``parts``) plus its content hash; then make its bytes durable."""
    stamp = {**stamp, "content_hash": hasher.hexdigest(stamp)}
    writer.add_key_value_metadata({META_KEY.decode(): json.dumps(stamp)})
    writer.close()
    _fsync(path)  # the rename that publishes it must not outrun its bytes


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- where the manifest goes (NOTE [ Safe output ]) -------------------------------------------


def temp_path(out: Path, kind: str = "tmp") -> Path:
    """This process's temporary (``tmp``) or parked old manifest (``old``) beside ``out``."""
    return out.with_name(f".{out.name}.{os.getpid()}.{kind}")


def prepare_out(
    out: Path, inputs: Sequence[Path], *, force: bool, ours: Callable[[Path], bool] | None = None,
    what: str = "tokenbucket manifest",
) -> None:  # fmt: skip
    """Check that a manifest may be written to ``out``, and clear this ``out``'s stale temporaries.

    ``ours``: a file of another kind tokenbucket writes, which ``out`` may replace (a video plan,
    :func:`tokenbucket.plan.video_buckets.write_video_plan`; ``what`` names it): that kind is a
    single file, so a directory ``out`` is refused. ``None``: a manifest, a file or a folder of parts.

    Raises:
        ConfigError: ``out`` names no file (``.``), its directory is missing, it is a symbolic
            link, a metadata input (or holds one), a directory holding other files, or a file
            that is not ``what`` (without ``force``).
    """
    if out.name in ("", ".", ".."):
        raise ConfigError(f"out {str(out)!r} names a directory, not a manifest; pass a path such as 'manifest.parquet'")
    if not out.parent.is_dir():
        raise ConfigError(f"out {str(out)!r}: its directory {str(out.parent)!r} does not exist; create it first")
    _clear_stale(out)
    if out.is_symlink():
        raise ConfigError(
            f"out {str(out)!r} is a symbolic link (to {os.readlink(out)!r}); pass the path itself or another path"
        )
    if not out.exists():
        return
    for path in inputs:
        if _same_or_inside(path, out):
            raise ConfigError(
                f"out {str(out)!r} is (or holds) the metadata input {str(path)!r}; pass another path "
                "(--force never overwrites an input)"
            )
    if out.is_dir() and ours is not None:
        raise ConfigError(f"out {str(out)!r} is a directory; a {what} is one file: pass a file's path")
    if out.is_dir():
        stranger = _stranger_in(out)
        if stranger is not None:
            raise ConfigError(
                f"out {str(out)!r} is a directory holding {stranger!r}, which is not a tokenbucket manifest part; "
                "pass another path (--force never replaces a directory)"
            )
    elif not (ours or is_manifest_file)(out) and not (force and out.is_file()):
        hint = ", or --force (force=True) to replace that file" if out.is_file() else ""
        raise ConfigError(f"out {str(out)!r} exists and is not a {what}; pass another path{hint}")


def _same_or_inside(path: Path, out: Path) -> bool:
    try:
        if os.path.samefile(path, out):
            return True
    except OSError:
        return False
    return out.is_dir() and out.resolve() in path.resolve().parents


def is_manifest_file(path: Path) -> bool:
    """A regular file whose Parquet footer carries our key (the footer only is read)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        kv = pq.read_metadata(path).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return META_KEY in kv


def _stranger_in(directory: Path) -> str | None:
    """The first entry of ``directory`` that is not one of our part files (``None``: all ours)."""
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if not (_PART.fullmatch(entry.name) and is_manifest_file(Path(entry.path))):
            return entry.name
    return None


def _clear_stale(out: Path) -> None:
    """Remove the temporaries a killed build for ``out`` left (NOTE [ Safe output ]); nothing else."""
    if os.name != "posix":  # signal 0 probes a process only on POSIX
        return
    name = re.escape(out.name)
    pattern = re.compile(rf"\.{name}\.(\d+)\.(tmp|old)")
    scratch = re.compile(rf"\.{name}\.(\d+)\.[a-z0-9_]{{8}}\.ray")  # tempfile.mkdtemp's name
    found = []
    for entry in os.scandir(out.parent):
        match = pattern.fullmatch(entry.name)
        if match and not entry.is_symlink() and not _alive(int(match.group(1))):
            found.append((match.group(2), Path(entry.path)))
        ray = scratch.fullmatch(entry.name)
        if ray and entry.is_dir(follow_symlinks=False) and not _alive(int(ray.group(1))):
            files = list(os.scandir(entry.path))
            if all(_SCRATCH.fullmatch(f.name) and f.is_file(follow_symlinks=False) for f in files):
                shutil.rmtree(entry.path)  # only the Ray engine's batch files: its scratch directory
    for kind, path in sorted(found, key=lambda f: f[0] != "old"):  # parked old ones first
        if kind == "old":
            if not _is_manifest(path):
                continue  # our name, but not our contents: leave it
            if not out.exists() and not out.is_symlink():
                os.replace(path, out)  # killed between the two renames: the old manifest goes back
                continue
        if path.is_dir():
            if all(_PART.fullmatch(p.name) and p.is_file() and not p.is_symlink() for p in path.iterdir()):
                shutil.rmtree(path)  # only our part files (or none): a temporary directory of ours
        elif path.is_file() and _written_by_us(path):
            path.unlink()


def _written_by_us(path: Path) -> bool:
    """A temporary file a killed build left: empty, or Parquet from its first bytes (a writer
    puts the magic ``PAR1`` first; the footer a killed one never wrote)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head in (b"", b"PAR1")


def _is_manifest(path: Path) -> bool:
    """A manifest file, or a directory holding one or more of our parts and nothing else."""
    if path.is_dir() and not path.is_symlink():
        return any(True for _ in path.iterdir()) and _stranger_in(path) is None
    return is_manifest_file(path)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` may still be writing (our own pid: an earlier process's leftover)."""
    if pid == os.getpid():
        return False
    if not 0 < pid < 1 << 22:  # not a pid this system hands out: leave the file alone
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: someone else's live process
        return True
    return True


def replace_out(src: Path, dst: Path) -> None:
    """Move the finished manifest ``src`` to ``dst`` (NOTE [ Safe output ]): one atomic rename
    when both are files; otherwise the old one is parked, the new one moved in, the old removed."""
    if dst.exists() and (src.is_dir() or dst.is_dir()):
        old = temp_path(dst, "old")
        os.replace(dst, old)
        os.replace(src, dst)
        _sync_dir(dst.parent)
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        os.replace(src, dst)
        _sync_dir(dst.parent)


def _sync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; elsewhere the rename is all there is)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
