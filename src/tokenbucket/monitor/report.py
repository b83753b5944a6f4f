"""A training run's JSONL log, read back and turned into a report.

    monitor (training) --> RUN.jsonl --read_events--> RunLog --summarize_events--> per-bucket rows
                                                         └--write_report--> 5 PNGs + report.html

The plots: step latency per bucket (a box per bucket), predicted vs measured peak per step, risk
per step against the threshold, real tokens/s per bucket, and per bucket the peak memory
(predicted, and measured where the run had a memory reader) as bars against the budget beside
the median step time (:func:`bucket_figure`). A 2D run's page also lays its buckets out by their
two bounds (:func:`run_grid`, NOTE [ The 2D report grid ]).

NOTE [ Risk ]
A batch's risk is its predicted peak memory / the plan's budget (``budget_bytes``, already about 10 %
under what the GPU can give: :func:`~tokenbucket.cost.gpus.gpu_budget_bytes`). A static plan's
own batches stay at or below 1; the monitor flags a batch above its ``risk_threshold`` (default
1.0) with a ``risk`` event. Where the measured peak runs above the prediction (the ``drift``
column, measured / predicted), a threshold of about ``1 / drift`` flags the batches that could
really run out of memory.

Each line of the log is one JSON object with an ``event`` field (``start``, ``step``, ``risk``,
``oom``, ``drift``, ``adapt``, ``summary``); events of other types are kept but ignored, so an
older reader can read a newer monitor's log. The fields the report reads are checked as each
line is read (NOTE [ Event fields ] in :mod:`tokenbucket.monitor.stats`).

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = Path(tmp) / "run.jsonl"
    ...     _ = path.write_text('{"event": "oom", "time": 0.5, "step": 3, "bucket": 0}\\n{"event": "st')
    ...     log = read_events(path)
    >>> len(log.events), log.partial_last_line, log.skipped_lines, log.counts()
    (1, True, (2,), {'risk': 0, 'oom': 1, 'drift': 0, 'adapt': 0})
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import ConfigError
from tokenbucket._progress import progress as progress_bar
from tokenbucket.monitor._grid import bucket_grid, grid_html
from tokenbucket.monitor.ranks import format_rank_balance, rank_balance_of_events
from tokenbucket.monitor.sinks import CUT_EVENT
from tokenbucket.monitor.stats import bucket_bounds_2d, event_problem, summarize_events

if TYPE_CHECKING:  # matplotlib is the optional `plot` extra: imported only by pyplot()
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "COUNTED_EVENTS",
    "REPORT_FILES",
    "ReportFiles",
    "RunLog",
    "bucket_figure",
    "check_report_dir",
    "pyplot",
    "read_events",
    "report_figures",
    "run_grid",
    "write_report",
]

COUNTED_EVENTS = ("risk", "oom", "drift", "adapt")
# what write_report writes into its folder, and nothing else (NOTE [ Report folder ]); the page last
REPORT_FILES = ("latency.png", "memory.png", "risk.png", "throughput.png", "buckets.png", "report.html")


@dataclass(frozen=True, kw_only=True)
class RunLog:
    """The events of one run log, in file order.

    Attributes:
        events: one dict per line, unknown event types included.
        path: the file they were read from.
        partial_last_line: the last line was cut short (the run was killed mid-write) and was skipped.
        skipped_lines: the 1-based numbers of every line cut short and skipped (NOTE [ Cut lines ]):
            the last one, and the cut records a resumed run's sink made of one before appending.
    """

    events: list[dict[str, Any]]
    path: Path
    partial_last_line: bool
    skipped_lines: tuple[int, ...] = ()

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The events whose ``event`` is ``kind``."""
        return [e for e in self.events if e["event"] == kind]

    def counts(self) -> dict[str, int]:
        """How many ``risk``, ``oom``, ``drift`` and ``adapt`` events the run logged."""
        return {kind: len(self.of(kind)) for kind in COUNTED_EVENTS}

    def start(self) -> dict[str, Any]:
        """The ``start`` event, or ``{}`` when the log has none."""
        starts = self.of("start")
        return starts[0] if starts else {}


@dataclass(frozen=True, kw_only=True)
class ReportFiles:
    """The files :func:`write_report` wrote."""

    latency: Path
    memory: Path
    risk: Path
    throughput: Path
    buckets: Path
    html: Path

    @property
    def pngs(self) -> tuple[Path, ...]:
        return self.latency, self.memory, self.risk, self.throughput, self.buckets


# NOTE [ Cut lines ]
# A killed run can leave its last line half written: the start of a JSON object, cut anywhere,
# even inside a UTF-8 character. A resumed run's sink puts that line's bytes into a cut record
# (NOTE [ Cut records ] in sinks.py), so such a record can sit before the resumed run's events,
# and a log resumed by an older version can hold a cut line there. A cut record, and a line that
# is the start of a JSON object cut short, is skipped and its number kept in RunLog.skipped_lines,
# wherever it is; any other line that is not an event (not UTF-8, not JSON, JSON but not an
# object with a string "event", or an object with more after it) is a corrupt file, and an error
# naming the line.
_DECODER = json.JSONDecoder()
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER_START = re.compile(r"-?\d*(?:\.\d*)?(?:[eE][-+]?\d*)?\Z")
_ESCAPE_START = re.compile(r"u[0-9a-fA-F]{0,3}\Z")


def _is_cut(text: str) -> bool:
    """Whether ``text`` is the start of a JSON object cut short (NOTE [ Cut lines ]).

    Example:
        >>> _is_cut('{"event": "step", "lat'), _is_cut('{"event": "step", "step": 1'), _is_cut('{"step": oops}')
        (True, True, False)
    """
    if not text.startswith("{"):
        return False
    try:
        _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        rest = text[exc.pos :]
        if exc.msg.startswith("Unterminated string"):
            return True
        if exc.msg.startswith("Invalid \\uXXXX escape"):
            return _ESCAPE_START.match(rest) is not None
        # what is left is the start of a value the cut ended inside (or nothing)
        return _NUMBER_START.match(rest) is not None or any(lit.startswith(rest) for lit in _LITERALS)
    except (ValueError, RecursionError):  # a number past int's digit limit, nesting past the stack
        return False
    return False  # a whole object, with more after it


def _parse(line: bytes) -> dict[str, Any] | tuple[str, bool]:
    """The event on one (stripped) line, or why it is not one and whether it was cut short."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason != "unexpected end of data" or exc.end != len(line):
            return f"not UTF-8 text: byte 0x{line[exc.start]:02x} at column {exc.start + 1}", False
        # NOTE [ Cut lines ]: a character cut in two at the very end
        return "cut short inside a character", _is_cut(line[: exc.start].decode("utf-8"))
    try:
        event = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return (str(exc) or type(exc).__name__), _is_cut(text)
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return 'expected a JSON object with a string "event" field', False
    return event


def read_events(path: str | os.PathLike[str]) -> RunLog:
    """Read a run log line by line, checking each event's fields.

    Lines cut short by a killed run, and the cut records that hold them, are skipped (NOTE [ Cut
    lines ]); blank lines are ignored.

    Raises:
        ConfigError: the file does not exist, is a folder or cannot be read; a line is not an
            event and was not cut short; an event lacks a field the report needs or holds a wrong
            value there (NOTE [ Event fields ]). The message names the file and the line.
    """
    path = Path(path)
    where = f"run log {str(path)!r}"
    events: list[dict[str, Any]] = []
    skipped: list[int] = []
    last = 0  # the number of the last line that is not blank
    try:
        with path.open("rb") as f:  # bytes: a cut-off line may end inside a UTF-8 character
            for number, raw in enumerate(f, start=1):
                line = raw.strip()
                if not line:
                    continue
                last = number
                parsed = _parse(line)
                if isinstance(parsed, dict) and parsed["event"] == CUT_EVENT:
                    skipped.append(number)  # NOTE [ Cut lines ]: a cut line, kept in a record
                    continue
                if isinstance(parsed, dict):
                    problem = event_problem(parsed)
                    if problem is not None:
                        raise ConfigError(f"{where} line {number}: {problem}")
                    events.append(parsed)
                    continue
                reason, cut = parsed
                if not cut:
                    excerpt = line[:60].decode("utf-8", "replace")
                    raise ConfigError(f"{where} line {number} is not a monitor event ({reason}), but got {excerpt!r}")
                skipped.append(number)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{where} is a folder, not a file: give the monitor's JSONL log") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror or exc}") from None
    return RunLog(
        events=events,
        path=path,
        partial_last_line=bool(skipped) and skipped[-1] == last,
        skipped_lines=tuple(skipped),
    )


def _by_bucket(steps: list[dict[str, Any]], key: str) -> dict[Any, list[float]]:
    out: defaultdict[Any, list[float]] = defaultdict(list)
    for s in steps:
        if s.get(key) is not None:
            out[s["bucket"]].append(float(s[key]))
    return dict(sorted(out.items()))


def _series(steps: list[dict[str, Any]], bucket: object, x: str, y: str) -> tuple[list[float], list[float]]:
    """One bucket's ``(x, y)`` points, skipping steps without a ``y``."""
    pts = [s for s in steps if s["bucket"] == bucket and s.get(y) is not None]
    return [float(s[x]) for s in pts], [float(s[y]) for s in pts]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, or a ConfigError naming the extra."""
    try:
        import matplotlib.pyplot as plt  # optional: the `plot` extra; only plotting needs it
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'tokenbucket[plot]'") from None
    plt.switch_backend("Agg")
    return plt


def _latency_figure(log: RunLog, rows: list[dict[str, Any]]) -> Figure:
    plt = pyplot()
    fig: Figure
    fig, ax = plt.subplots(figsize=(7, 4))
    latency = _by_bucket(log.of("step"), "latency_s")
    if latency:
        positions = list(range(1, len(latency) + 1))
        ax.boxplot([[v * 1e3 for v in vs] for vs in latency.values()], positions=positions)
        ax.set_xticks(positions, [str(b) for b in latency])
    ax.set(xlabel="bucket", ylabel="step latency (ms)", title="step latency per bucket")
    return fig


def _memory_figure(log: RunLog, rows: list[dict[str, Any]]) -> Figure:
    plt = pyplot()
    steps, gib = log.of("step"), 2.0**30
    fig: Figure
    fig, ax = plt.subplots(figsize=(7, 4))
    measured = [s for s in steps if s.get("measured_bytes") is not None]
    if measured:
        for bucket in sorted({s["bucket"] for s in measured}):
            xs, ys = _series(measured, bucket, "predicted_bytes", "measured_bytes")
            ax.scatter([x / gib for x in xs], [y / gib for y in ys], s=12, label=f"bucket {bucket}")
        top = max(max(s["predicted_bytes"], s["measured_bytes"]) for s in measured) / gib
        ax.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="measured = predicted")
        ax.set(xlabel="predicted peak (GiB)", ylabel="measured peak (GiB)", title="predicted vs measured peak memory")
        ax.legend(fontsize="small")
    else:
        predicted = _by_bucket(steps, "predicted_bytes")
        for bucket, values in predicted.items():
            ax.scatter([str(bucket)] * len(values), [v / gib for v in values], s=12, color="#4c72b0")
        ax.set(xlabel="bucket", ylabel="predicted peak (GiB)", title="predicted peak; no measured memory (CPU run)")
    return fig


def _risk_figure(log: RunLog, rows: list[dict[str, Any]]) -> Figure:
    plt = pyplot()
    steps = log.of("step")
    fig: Figure
    fig, ax = plt.subplots(figsize=(7, 4))
    for bucket in _by_bucket(steps, "risk"):
        xs, ys = _series(steps, bucket, "step", "risk")
        ax.scatter(xs, ys, s=8, label=f"bucket {bucket}")
    if log.start().get("risk_threshold") is not None:
        ax.axhline(log.start()["risk_threshold"], color="#c44e52", lw=1, ls="--", label="risk threshold")
    for i, oom in enumerate(e for e in log.of("oom") if e.get("step") is not None):
        ax.axvline(oom["step"], color="black", lw=1, alpha=0.6, label="oom" if i == 0 else None)
    # NOTE [ Risk ]
    ax.set(xlabel="step", ylabel="risk (predicted peak / budget)", title="risk per step")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    return fig


def _throughput_figure(log: RunLog, rows: list[dict[str, Any]]) -> Figure:
    plt = pyplot()
    fig: Figure
    fig, ax = plt.subplots(figsize=(7, 4))
    tps = [r for r in rows if r.get("tokens_per_s") is not None]
    ax.bar([str(r["bucket"]) for r in tps], [r["tokens_per_s"] for r in tps], color="#55a868")
    ax.set(xlabel="bucket", ylabel="real tokens/s", title="real (unpadded) tokens per second per bucket")
    return fig


def _budget_bytes(log: RunLog) -> float | None:
    """The run's memory budget: the start event's ``budget_bytes``, else predicted / risk of a step
    (NOTE [ Risk ]: risk is predicted / budget), else ``None``."""
    budget = log.start().get("budget_bytes")
    if type(budget) is int and budget > 0:
        return float(budget)
    for s in log.of("step"):
        if s["risk"] > 0 and s["predicted_bytes"] > 0:
            return float(s["predicted_bytes"] / s["risk"])
    return None


def run_grid(log: RunLog, rows: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """A 2D run's buckets by their two bounds (NOTE [ The 2D report grid ]), from its first start
    event; ``None`` for a 1D run. ``rows``: :func:`summarize_events` of the log's events."""
    rows = summarize_events(log.events) if rows is None else rows
    return bucket_grid(bucket_bounds_2d(log.start()), rows, _budget_bytes(log))


def bucket_figure(log: RunLog, rows: list[dict[str, Any]] | None = None) -> Figure:
    """Per bucket, two panels: the peak memory as bars against the budget (a horizontal line),
    and the median step time.

    The memory panel has one bar per bucket for the predicted peak and, where the run had a
    memory reader (a GPU), one beside it for the measured peak (NaN, so no bar, for a bucket
    never measured); the step-time panel has one bar per bucket at the median (p50) latency,
    whiskers up to p95, each labelled with its steps. ``rows``: :func:`summarize_events` of the
    log's events (computed when not given).

    Raises:
        ConfigError: matplotlib (the ``plot`` extra) is not installed.
    """
    plt = pyplot()
    rows = summarize_events(log.events) if rows is None else rows
    fig: Figure
    memory: Axes
    timing: Axes
    fig, (memory, timing) = plt.subplots(1, 2, figsize=(11, 4))
    x = list(range(len(rows)))
    names = [str(r["bucket"]) for r in rows]
    budget = _budget_bytes(log)
    top = max(
        [budget or 0.0, *(r["predicted_peak_bytes"] for r in rows), *(r["measured_peak_bytes"] or 0 for r in rows)]
    )
    unit, scale = ("GiB", 2.0**30) if top >= 2**30 else ("MiB", 2.0**20)  # as format_summary shows them
    measured = any(r["measured_peak_bytes"] is not None for r in rows)
    width = 0.4 if measured else 0.6
    shift = width / 2 if measured else 0.0
    predicted = [r["predicted_peak_bytes"] / scale for r in rows]
    memory.bar([i - shift for i in x], predicted, width, color="#4c72b0", label="predicted peak")
    if measured:
        peaks = [math.nan if r["measured_peak_bytes"] is None else r["measured_peak_bytes"] / scale for r in rows]
        memory.bar([i + shift for i in x], peaks, width, color="#dd8452", label="measured peak")
    if budget is not None:
        memory.axhline(budget / scale, color="#c44e52", lw=1.2, ls="--", label=f"budget {budget / scale:,.2f} {unit}")
    memory.set_xticks(x, names)
    title = "peak memory per bucket" + ("" if measured else " (predicted; no measured memory: CPU run)")
    memory.set(xlabel="bucket", ylabel=f"peak memory ({unit})", title=title)
    memory.set_ylim(0, top / scale * 1.2)  # room above the budget line for the legend
    memory.legend(fontsize="small", loc="upper right", ncols=3)

    p50 = [(r["latency_p50_s"] or 0.0) * 1e3 for r in rows]
    p95 = [(r["latency_p95_s"] or 0.0) * 1e3 for r in rows]
    whiskers = [[0.0] * len(rows), [max(hi - lo, 0.0) for lo, hi in zip(p50, p95, strict=True)]]
    bars = timing.bar(x, p50, 0.6, yerr=whiskers, capsize=3, color="#55a868", label="median step time")
    timing.bar_label(bars, labels=[f"{r['steps']:,} steps" for r in rows], fontsize="small", padding=2)
    timing.set_xticks(x, names)
    timing.set_ylim(0, max([*p95, *p50, 1e-3]) * 1.15)  # room for the labels above the whiskers
    timing.set(xlabel="bucket", ylabel="step time (ms)", title="step time per bucket (median, whisker to p95)")
    fig.tight_layout()
    return fig


# the figures in REPORT_FILES order
_FIGURES = (_latency_figure, _memory_figure, _risk_figure, _throughput_figure, bucket_figure)


def report_figures(log: RunLog, rows: list[dict[str, Any]] | None = None) -> dict[str, Figure]:
    """The report's figures by file name (:data:`REPORT_FILES`' PNGs), for a caller to inspect or
    save its own way; close them with ``pyplot().close(fig)``."""
    rows = summarize_events(log.events) if rows is None else rows
    return {name: build(log, rows) for name, build in zip(REPORT_FILES[:-1], _FIGURES, strict=True)}


def _plots(log: RunLog, rows: list[dict[str, Any]], progress: bool | None = None) -> list[bytes]:
    """The plots as PNG files' bytes, in :data:`REPORT_FILES` order (a bar step per plot on a terminal)."""
    plt = pyplot()
    out = []
    for build in progress_bar(_FIGURES, desc="report plots", unit="plots", enabled=progress):
        fig = build(log, rows)
        fig.tight_layout()
        buffer = io.BytesIO()
        # NOTE [ Report folder ]: the mark that lets a later report replace this file
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": _GENERATOR})
        plt.close(fig)
        out.append(buffer.getvalue())
    return out


# NOTE [ Report folder ]
# write_report writes REPORT_FILES and nothing else into its folder, and replaces one of them only
# when it wrote it: a PNG whose "Software" text chunk or a page whose generator meta tag says
# _GENERATOR. Any other file of those names (a user's plot, a link, a folder, an unreadable file)
# stops the report before anything is written, naming the file; the fix is another folder. Each
# file is written under a fresh temporary name and renamed over its old self, so a failure
# leaves the earlier report's file whole and a hard link to it untouched.
_GENERATOR = "tokenbucket report"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_MARK = b"tEXtSoftware\x00" + _GENERATOR.encode()
_HTML_MARK = f'<meta name="generator" content="{_GENERATOR}">'.encode()


def _written_here(path: Path) -> bool:
    """Whether ``path`` is a report file an earlier :func:`write_report` wrote (NOTE [ Report folder ])."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if path.suffix == ".png":
        return head.startswith(_PNG_MAGIC) and _PNG_MARK in head
    return head.startswith(b"<!doctype html>") and _HTML_MARK in head


def check_report_dir(out_dir: str | os.PathLike[str], *, name: str = "report folder") -> Path:
    """``out_dir`` as a Path, once sure :func:`write_report` may write there (NOTE [ Report folder ]).

    Args:
        out_dir: the folder; it need not exist.
        name: what the messages call it (the command line passes ``"--out"``).

    Raises:
        ConfigError: ``out_dir`` (or a folder above it) is a file, or it holds a file of a
            report file's name that :func:`write_report` did not write.
    """
    out_dir = Path(out_dir)
    shown = f"{name} {str(out_dir)!r}"
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{shown} is a file, not a folder: give a new folder for the report")
    above = next((p for p in out_dir.absolute().parents if p.exists()), None)
    if not out_dir.exists() and above is not None and not above.is_dir():
        raise ConfigError(f"{shown} cannot be made: {str(above)!r} is a file, not a folder")
    foreign = [f for f in REPORT_FILES if os.path.lexists(out_dir / f) and not _written_here(out_dir / f)]
    if foreign:
        raise ConfigError(
            f"{shown} already holds {', '.join(map(repr, foreign))}, which tokenbucket did not write; "
            f"it is left as it is: give another {name} (a new folder)"
        )
    return out_dir


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` under a fresh temporary name, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _heading(key: str) -> str:
    """A column heading for a summary key: words, with the unit its cells are shown in."""
    for suffix, unit in (("_bytes", " (GiB)"), ("_s", " (ms)")):
        if key.endswith(suffix):
            return key[: -len(suffix)].replace("_", " ") + unit
    return key.replace("_", " ")


def _cell(head: str, value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return html.escape(str(value))
    if head.endswith("_bytes"):
        return f"{value / 2**30:,.2f}"
    if head.endswith("_s"):
        return f"{value * 1e3:,.1f}"
    return f"{value:,.0f}" if abs(value) >= 1000 or isinstance(value, int) else f"{value:.4g}"


def write_report(log: RunLog, out_dir: str | os.PathLike[str], *, progress: bool | None = None) -> ReportFiles:
    """Write five PNG plots and one self-contained ``report.html`` (plots inlined) into ``out_dir``.

    The folder is made if missing; files there are replaced only if an earlier report wrote them
    (NOTE [ Report folder ]). ``progress``: a bar on stderr, a step per plot (default: when
    stderr is a terminal; NOTE [ Progress on stderr ]).

    Raises:
        ConfigError: ``out_dir`` cannot hold the report (see :func:`check_report_dir`), or
            matplotlib (the ``plot`` extra) is not installed.
    """
    out_dir = check_report_dir(out_dir)
    rows = summarize_events(log.events)
    pngs = _plots(log, rows, progress)
    heads = list(rows[0]) if rows else []
    table = "<tr>" + "".join(f"<th>{html.escape(_heading(h))}</th>" for h in heads) + "</tr>"
    table += "".join("<tr>" + "".join(f"<td>{_cell(h, r.get(h))}</td>" for h in heads) + "</tr>" for r in rows)
    counts = ", ".join(f"{kind} {n:,}" for kind, n in log.counts().items())
    grid = run_grid(log, rows)
    grid_part = "" if grid is None else grid_html(grid)  # a 2D run's buckets by both bounds
    ranks = format_rank_balance(rank_balance_of_events(log.events))  # NOTE [ Rank balance ]
    ranks_part = f"<pre>{html.escape(ranks)}</pre>" if ranks else ""
    note = (
        f"<p><b>Line(s) {', '.join(map(str, log.skipped_lines))} of the log were cut short (killed run?) "
        "and were skipped.</b></p>"
        if log.skipped_lines
        else ""
    )
    images = "".join(
        f'<img alt="{Path(name).stem}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'
        for name, data in zip(REPORT_FILES[:-1], pngs, strict=True)
    )
    title = html.escape(f"tokenbucket report: {log.path.name}")
    page = (
        f'<!doctype html><html><head><meta charset="utf-8">{_HTML_MARK.decode()}<title>{title}</title><style>'
        "body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f2f2f2}img{max-width:48%}"
        f"</style></head><body><h1>{title}</h1>{note}<table>{table}</table>{grid_part}"
        f"<p>events: {len(log.of('step')):,} steps, {counts}</p>{ranks_part}{images}</body></html>\n"
    )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make report folder {str(out_dir)!r}: {exc.strerror or exc}") from None
    paths = [out_dir / name for name in REPORT_FILES]
    for path, data in zip(paths, [*pngs, page.encode("utf-8")], strict=True):
        _replace(path, data)
    return ReportFiles(
        latency=paths[0], memory=paths[1], risk=paths[2], throughput=paths[3], buckets=paths[4], html=paths[5]
    )
