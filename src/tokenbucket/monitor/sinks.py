"""Where the monitor's events go: a JSONL file (the default), Python ``logging``, TensorBoard, or
any callable that takes the event dict (a W&B or MLflow user passes ``lambda e: run.log(e)``).

Every event is a flat JSON-ready dict with ``event`` (``start``, ``step``, ``risk``, ``oom``,
``drift``, ``adapt``, ``resume``, ``summary``) and ``time`` (Unix seconds); see
:class:`~tokenbucket.monitor.hooks.BucketMonitor` for the fields. A file's last line left cut
short by a killed run becomes a ``cut`` record when the file is opened again (NOTE [ Cut records ]).
"""

from __future__ import annotations

import atexit
import base64
import fcntl
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from tokenbucket._exceptions import ConfigError

__all__ = [
    "CUT_EVENT",
    "JsonlSink",
    "LoggingSink",
    "MAX_CUT_BYTES",
    "ScalarWriter",
    "TensorBoardSink",
    "append_line",
    "cut_bytes",
    "open_appending",
]

# one encoder for every event: json.dumps(..., separators=...) would build a new one per call
_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


class JsonlSink:
    """Appends one JSON object per line to ``path``.

    NOTE [ Whole lines only ]
    Events are kept as complete lines and written with one ``os.write`` per flush (every
    ``flush_lines`` events, after ``flush_seconds``, and at once for any event but ``step``), so
    logging a step costs a ``json.dumps`` and a list append, and a reader tailing the file, or a
    process killed between two flushes, sees whole lines only. What a kill loses is the unflushed
    steps (at most ``flush_seconds`` of them). A kill *inside* a large write can still cut its
    last line at a page boundary; reopening the file here puts that line into a cut record
    (NOTE [ Cut records ]), which :func:`~tokenbucket.monitor.report.read_events` skips, so a
    resumed run appends to a file whose every line is JSON.
    """

    def __init__(self, path: str | os.PathLike[str], *, flush_lines: int = 512, flush_seconds: float = 1.0) -> None:
        if flush_lines < 1:
            raise ConfigError(f"flush_lines should be a positive integer, but got flush_lines={flush_lines}")
        self.path = Path(path)
        self.flush_lines, self.flush_seconds = flush_lines, flush_seconds
        self._fd: int | None = open_appending(self.path)
        self._lines: list[str] = []
        self._last = time.monotonic()
        atexit.register(self.close)

    def __call__(self, event: Mapping[str, Any]) -> None:
        self._lines.append(_ENCODE(event) + "\n")
        if (
            event["event"] != "step"
            or len(self._lines) >= self.flush_lines
            or time.monotonic() - self._last >= self.flush_seconds
        ):
            self.flush()

    def flush(self) -> None:
        if self._fd is None or not self._lines:
            return
        data = "".join(self._lines).encode()
        self._lines.clear()
        _write_all(self._fd, data)  # NOTE [ Whole lines only ]
        self._last = time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            self.flush()
            os.close(self._fd)
            self._fd = None
            atexit.unregister(self.close)


CUT_EVENT = "cut"
# a last line longer than this is no cut monitor line: the file is refused, not rewritten
MAX_CUT_BYTES = 1 << 20


def open_appending(path: Path) -> int:
    """A descriptor that appends to ``path`` (made, with its folder, if missing) at the start of a line.

    A last line cut short is first turned into a cut record (NOTE [ Cut records ]).

    Raises:
        ConfigError: the last line is over ``MAX_CUT_BYTES`` long and not JSON (not a JSONL file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # no O_APPEND: Linux pwrite would ignore the offset
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two sinks opening one file mend it once
        _mend_last_line(fd, path)
        appending = os.open(path, os.O_WRONLY | os.O_APPEND)
    finally:
        os.close(fd)  # and with it the lock
    return appending


def cut_bytes(record: Mapping[str, Any]) -> bytes:
    """The bytes a cut record holds (NOTE [ Cut records ]): what stood where its line stands.

    Example:
        >>> cut_bytes({"event": "cut", "time": 0.0, "offset": 12, "base64": "eyJldmVudCI6InN0"})
        b'{"event":"st'
    """
    return base64.b64decode(str(record["base64"]), validate=True)


# NOTE [ Cut records ]
# A killed writer can leave the file's last line cut short (NOTE [ Whole lines only ]); a hand
# edit or a whole record whose newline was never written can leave a last line without its
# newline. Opening the file to append mends its last line before the first new byte:
#   - a last line that is JSON (or blank) gets the newline it lacks, if any, and stays as it is;
#   - any other last line is replaced by one cut record holding its bytes, so that every line of
#     the file is JSON for any JSONL reader (pandas.read_json(lines=True) included):
#         {"event":"cut","time":<Unix s>,"offset":<byte offset of the line>,"base64":"<its bytes>"}
#     ``base64`` is every byte from the start of that line to the end of the file, exactly (the
#     cut may end inside a UTF-8 character); decoded (cut_bytes) and put back at ``offset`` it
#     gives the file as the killed run left it. Our readers skip the record as they skip a cut
#     line and name its line (NOTE [ Cut lines ] in report.py; read_replay).
# No byte is lost if the mend itself is killed, or the machine stops, at any point: with R the
# record's line, the file P + T (T the cut line, at offset p) goes through
#   1. P + T + newlines + R: R appended where it starts at p + len(R) (then fsync);
#   2. P + R + R: R written over T and the newlines (fsync);
#   3. P + R: the copy cut off (ftruncate, fsync).
# Until 2 is on disk T is untouched; from then on it is in R. An open that finds the copy of 1
# still last (its offset is not its own place, and the bytes between are R's or T + newlines)
# does 2 and 3 again; a mend stopped inside 1 leaves T a cut line our readers skip, and the part
# of R written a cut line of its own, mended at the next open. The only bytes ever removed are
# the ones a record holds, and the newlines and copy of step 1. Opening under an exclusive lock
# (flock) keeps two sinks of one file from mending it at once.
def _mend_last_line(fd: int, path: Path) -> None:
    size = os.fstat(fd).st_size
    found = _last_line(fd, size)
    ends = not size or os.pread(fd, 1, size - 1) == b"\n"
    if found is None:  # no line start in the last MAX_CUT_BYTES
        if ends:
            return  # a long whole line: nothing to mend
        raise ConfigError(
            f"{str(path)!r} ends in over {MAX_CUT_BYTES} bytes without a newline: it is not a JSONL file "
            "(a monitor log or a replay file); give the right file or a new path"
        )
    start, line = found
    if line.strip():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            _replace_cut(fd, start, line)
            return
        if isinstance(record, dict) and record.get("event") == CUT_EVENT and record.get("offset") != start:
            if _finish_interrupted(fd, start, line.rstrip(b"\n"), record):
                return
    if not ends:
        _pwrite_all(fd, b"\n", size)  # a whole record (or blanks) whose newline was never written


def _last_line(fd: int, size: int) -> tuple[int, bytes] | None:
    """The offset of the last line that is not blank and the bytes from there to the end, or
    ``None`` when its start is more than ``MAX_CUT_BYTES`` back."""
    end, chunk, newline = size, b"", -1
    while end > 0 and newline < 0 and len(chunk) <= MAX_CUT_BYTES:
        step = min(end, 1 << 16)
        end -= step
        chunk = os.pread(fd, step, end) + chunk
        newline = chunk.rstrip().rfind(b"\n")
    line = chunk[newline + 1 :]
    return (end + newline + 1, line) if (newline >= 0 or end == 0) and len(line) <= MAX_CUT_BYTES else None


def _replace_cut(fd: int, start: int, cut: bytes) -> None:
    """Steps 1-3 of NOTE [ Cut records ]: the bytes from ``start`` to the end become one cut record."""
    record = {"event": CUT_EVENT, "time": time.time(), "offset": start, "base64": base64.b64encode(cut).decode()}
    line = _ENCODE(record).encode() + b"\n"  # longer than ``cut``: base64 alone is
    _pwrite_all(fd, b"\n" * (len(line) - len(cut)) + line, start + len(cut))
    os.fsync(fd)
    _finish(fd, start, line)


def _finish_interrupted(fd: int, at: int, line: bytes, record: dict[str, Any]) -> bool:
    """Steps 2-3 of NOTE [ Cut records ] where a mend stopped after step 1; whether it was one."""
    offset, encoded, full = record.get("offset"), record.get("base64"), line + b"\n"
    if not isinstance(offset, int) or not isinstance(encoded, str) or offset + len(full) != at:
        return False  # not a copy left by step 1 (say, two logs joined): a record like any other
    try:
        cut = base64.b64decode(encoded, validate=True)
    except ValueError:
        return False
    if len(cut) >= len(full):
        return False
    before = cut + b"\n" * (len(full) - len(cut))  # what step 1 left there
    between = os.pread(fd, len(full), offset)
    if not all(b in (x, y) for b, x, y in zip(between, full, before, strict=True)):
        return False
    _finish(fd, offset, full)
    return True


def _finish(fd: int, start: int, line: bytes) -> None:
    _pwrite_all(fd, line, start)
    os.fsync(fd)
    os.ftruncate(fd, start + len(line))
    os.fsync(fd)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    while data:
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def append_line(path: Path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` in one write, after mending its last line (NOTE [ Cut records ])."""
    fd = open_appending(path)
    try:
        _write_all(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    # one write call for the whole data unless the OS takes less
    while data:
        data = data[os.write(fd, data) :]


class LoggingSink:
    """Events as log records: steps at ``step_level`` (DEBUG), risk/oom/drift/adapt at ``alert_level``
    (WARNING), the rest at INFO. A disabled level costs one ``isEnabledFor`` call."""

    def __init__(
        self,
        logger: str | logging.Logger = "tokenbucket.monitor.hooks",
        *,
        step_level: int = logging.DEBUG,
        alert_level: int = logging.WARNING,
    ) -> None:
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.step_level, self.alert_level = step_level, alert_level

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event["event"]
        level = (
            self.step_level
            if kind == "step"
            else self.alert_level
            if kind in ("risk", "oom", "drift", "adapt")
            else logging.INFO
        )
        if self.logger.isEnabledFor(level):
            fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "time", "buckets"))
            self.logger.log(level, "%s %s", kind, fields)


class ScalarWriter(Protocol):
    """What :class:`TensorBoardSink` writes to (a ``SummaryWriter`` answers it)."""

    def add_scalar(self, tag: str, value: float, step: int, /) -> object: ...


class TensorBoardSink:
    """Scalars per bucket under ``tokenbucket/bucket{k}/...``: latency_ms, tokens_per_s, risk,
    predicted_gib, measured_gib (on GPU), and the running oom count; in a distributed run
    ``tokenbucket/rank_imbalance_measured`` and ``_predicted`` per step.

    Args:
        log_dir: where a ``SummaryWriter`` writes (needs the ``tb`` extra).
        writer: an existing writer (anything with ``add_scalar``) instead.
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None = None, *, writer: ScalarWriter | None = None) -> None:
        if writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional: the `tb` extra
            except ImportError as exc:
                raise ConfigError("TensorBoardSink needs tensorboard: pip install 'tokenbucket[tb]'") from exc
            writer = SummaryWriter(log_dir=None if log_dir is None else str(log_dir))
        self.writer: ScalarWriter = writer
        self._ooms: dict[int, int] = {}

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event["event"]
        if kind == "step":
            tag, step = f"tokenbucket/bucket{event['bucket']}", event["step"]
            self.writer.add_scalar(f"{tag}/latency_ms", event["latency_s"] * 1e3, step)
            self.writer.add_scalar(f"{tag}/tokens_per_s", event["tokens_per_s"], step)
            self.writer.add_scalar(f"{tag}/risk", event["risk"], step)
            self.writer.add_scalar(f"{tag}/predicted_gib", event["predicted_bytes"] / 2**30, step)
            if event["measured_bytes"] is not None:
                self.writer.add_scalar(f"{tag}/measured_gib", event["measured_bytes"] / 2**30, step)
            for name in ("rank_imbalance_measured", "rank_imbalance_predicted"):  # NOTE [ Rank balance ]
                if event.get(name) is not None:
                    self.writer.add_scalar(f"tokenbucket/{name}", event[name], step)
        elif kind == "oom":
            k = event["bucket"]
            self._ooms[k] = self._ooms.get(k, 0) + 1
            self.writer.add_scalar(f"tokenbucket/bucket{k}/ooms", self._ooms[k], event["step"])

    def flush(self) -> None:
        if hasattr(self.writer, "flush"):
            self.writer.flush()

    def close(self) -> None:
        if hasattr(self.writer, "close"):
            self.writer.close()
