"""Where the monitor's events go: a JSONL file (the default), Python ``logging``, TensorBoard, or
any callable that takes the event dict (a W&B or MLflow user passes ``lambda e: run.log(e)``).

Every event is a flat JSON-ready dict with ``event`` (``start``, ``step``, ``risk``, ``oom``,
``drift``, ``adapt``, ``resume``, ``summary``) and ``time`` (Unix seconds); see
:class:`~tokenbucket.monitor.hooks.BucketMonitor` for the fields.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from tokenbucket._exceptions import ConfigError

__all__ = ["JsonlSink", "LoggingSink", "ScalarWriter", "TensorBoardSink", "append_line", "open_appending"]

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
    last line at a page boundary; reopening the file here ends that line (NOTE [ Appending never
    truncates ]) and :func:`~tokenbucket.monitor.report.read_events` skips a cut line, so a
    resumed run appends to a readable file.
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


def open_appending(path: Path) -> int:
    """A descriptor that appends to ``path`` (made, with its folder, if missing) at the start of a line.

    NOTE [ Appending never truncates ]
    A file whose last byte is not a newline (a killed writer's cut line, a whole record whose
    newline was never written, a hand edit) gets one before anything is appended, so the next
    record starts a line of its own. Nothing already in the file is removed: a whole record
    stays a record, and a cut line stays a line, which the reader skips and names
    (:func:`~tokenbucket.monitor.report.read_events`). Truncating back to the last newline
    instead would lose that record, and with it the only event of a one-line file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            _write_all(fd, b"\n")
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_line(path: Path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` in one write (NOTE [ Appending never truncates ])."""
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
    predicted_gib, measured_gib (on GPU), and the running oom count.

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
