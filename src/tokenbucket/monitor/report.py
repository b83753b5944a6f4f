"""A training run's JSONL log, read back and turned into a report.

    monitor (training) --> RUN.jsonl --read_events--> RunLog --summarize_events--> per-bucket rows
                                                         └--write_report--> 4 PNGs + report.html

Each line of the log is one JSON object with an ``event`` field (``start``, ``step``, ``risk``,
``oom``, ``drift``, ``adapt``, ``summary``); events of other types are kept but ignored, so an
older reader can read a newer monitor's log.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = Path(tmp) / "run.jsonl"
    ...     _ = path.write_text('{"event": "oom", "time": 0.5, "step": 3}\\n{"event": "st')
    ...     log = read_events(path)
    >>> len(log.events), log.partial_last_line, log.counts()
    (1, True, {'risk': 0, 'oom': 1, 'drift': 0, 'adapt': 0})
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.monitor.stats import summarize_events

__all__ = ["COUNTED_EVENTS", "ReportFiles", "RunLog", "read_events", "write_report"]

COUNTED_EVENTS = ("risk", "oom", "drift", "adapt")


@dataclass(frozen=True, kw_only=True)
class RunLog:
    """The events of one run log, in file order.

    Attributes:
        events: one dict per line, unknown event types included.
        path: the file they were read from.
        partial_last_line: the last line was not a whole event (the run was killed mid-write) and was skipped.
    """

    events: list[dict[str, Any]]
    path: Path
    partial_last_line: bool

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
    html: Path

    @property
    def pngs(self) -> tuple[Path, Path, Path, Path]:
        return self.latency, self.memory, self.risk, self.throughput


def _parse(raw: bytes) -> dict[str, Any] | str:
    """The event on one line, or why it is not one."""
    try:
        event = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError from a cut multi-byte character
        return str(exc)
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return 'expected a JSON object with a string "event" field'
    return event


def read_events(path: str | Path) -> RunLog:
    """Read a run log line by line.

    NOTE [ Partial last line ]
    A killed run can leave its last line half written, so a bad last line is skipped and
    flagged in :attr:`RunLog.partial_last_line`. A bad line followed by more events is not
    a crash artefact but a corrupt file, and is an error.

    Raises:
        ConfigError: the file does not exist, or a line other than the last is not an event.
    """
    path = Path(path)
    events: list[dict[str, Any]] = []
    bad: tuple[int, bytes, str] | None = None  # (line number, text, reason) of the latest bad line
    try:
        with path.open("rb") as f:  # bytes: a cut-off last line may end inside a UTF-8 character
            # NOTE [ Partial last line ]: only the last line may be cut short
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                if bad is not None:
                    line, text, reason = bad
                    excerpt = text.strip()[:60].decode("utf-8", "replace")
                    raise ConfigError(
                        f"run log {str(path)!r} line {line} is not an event ({reason}), but got "
                        f"{excerpt!r}; only the last line may be cut short"
                    )
                parsed = _parse(raw)
                if isinstance(parsed, str):
                    bad = (number, raw, parsed)
                else:
                    events.append(parsed)
    except FileNotFoundError:
        raise ConfigError(f"run log {str(path)!r} does not exist") from None
    return RunLog(events=events, path=path, partial_last_line=bad is not None)


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


def _plots(log: RunLog, rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path, Path, Path]:
    plt = pyplot()
    steps, gib = log.of("step"), 2.0**30
    paths = (out_dir / "latency.png", out_dir / "memory.png", out_dir / "risk.png", out_dir / "throughput.png")
    figs = [plt.subplots(figsize=(7, 4)) for _ in paths]

    ax = figs[0][1]
    latency = _by_bucket(steps, "latency_s")
    if latency:
        positions = list(range(1, len(latency) + 1))
        ax.boxplot([[v * 1e3 for v in vs] for vs in latency.values()], positions=positions)
        ax.set_xticks(positions, [str(b) for b in latency])
    ax.set(xlabel="bucket", ylabel="step latency (ms)", title="step latency per bucket")

    ax = figs[1][1]
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

    ax = figs[2][1]
    for bucket in _by_bucket(steps, "risk"):
        xs, ys = _series(steps, bucket, "step", "risk")
        ax.scatter(xs, ys, s=8, label=f"bucket {bucket}")
    if log.start().get("risk_threshold") is not None:
        ax.axhline(log.start()["risk_threshold"], color="#c44e52", lw=1, ls="--", label="risk threshold")
    for i, oom in enumerate(e for e in log.of("oom") if "step" in e):
        ax.axvline(oom["step"], color="black", lw=1, alpha=0.6, label="oom" if i == 0 else None)
    ax.set(xlabel="step", ylabel="risk (predicted / budget)", title="risk per step")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")

    ax = figs[3][1]
    tps = [r for r in rows if r.get("tokens_per_s") is not None]
    ax.bar([str(r["bucket"]) for r in tps], [r["tokens_per_s"] for r in tps], color="#55a868")
    ax.set(xlabel="bucket", ylabel="real tokens/s", title="real (unpadded) tokens per second per bucket")

    for (fig, _), path in zip(figs, paths, strict=True):
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return paths


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


def write_report(log: RunLog, out_dir: str | Path) -> ReportFiles:
    """Write four PNG plots and one self-contained ``report.html`` (plots inlined) into ``out_dir``.

    Raises:
        ConfigError: matplotlib (the ``plot`` extra) is not installed.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize_events(log.events)
    pngs = _plots(log, rows, out_dir)
    heads = list(rows[0]) if rows else []
    table = "<tr>" + "".join(f"<th>{html.escape(_heading(h))}</th>" for h in heads) + "</tr>"
    table += "".join("<tr>" + "".join(f"<td>{_cell(h, r.get(h))}</td>" for h in heads) + "</tr>" for r in rows)
    counts = ", ".join(f"{kind} {n:,}" for kind, n in log.counts().items())
    note = "<p><b>The last line was cut short (killed run?) and was skipped.</b></p>" if log.partial_last_line else ""
    images = "".join(
        f'<img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode("ascii")}">'
        for p in pngs
    )
    title = html.escape(f"tokenbucket report: {log.path.name}")
    page = (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>'
        "body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f2f2f2}img{max-width:48%}"
        f"</style></head><body><h1>{title}</h1>{note}<table>{table}</table>"
        f"<p>events: {len(log.of('step')):,} steps, {counts}</p>{images}</body></html>\n"
    )
    html_path = out_dir / "report.html"
    html_path.write_text(page, encoding="utf-8")
    return ReportFiles(latency=pngs[0], memory=pngs[1], risk=pngs[2], throughput=pngs[3], html=html_path)
