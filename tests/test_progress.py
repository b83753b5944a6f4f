"""Progress bars: tqdm on stderr when it is a terminal, never on stdout, off with ``--quiet``.

NOTE [ Progress on stderr ] (tokenbucket/_progress.py): a bar shows only where a person watches
(stderr a terminal), and stdout (``--json`` included) is the same byte for byte with or without it.
The terminal here is a real pseudo-terminal (``os.openpty``), read by a thread while the command runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pyarrow.parquet as pq
import pytest
import torch

from tokenbucket._progress import progress, stderr_is_terminal
from tokenbucket.cli.main import VERBS, build_parser, main
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import profile_points
from tokenbucket.cost.reference import ReferenceTransformer
from tokenbucket.monitor.report import REPORT_FILES, read_events, write_report
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.testing import mixture_a

from .test_report import _write

ROWS = 3000
BAR = "%|"  # tqdm's bar: "1/3 counting: 100%|####| 3.00k/3.00k [...]"


class Terminal:
    """A pseudo-terminal: ``tty`` is its slave end as a text file; ``output()`` what was written to it."""

    def __init__(self) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100 characters
        self.tty: TextIO = os.fdopen(slave, "w", buffering=1, encoding="utf-8")
        self.data = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the slave end was closed
                return
            if not chunk:
                return
            self.data.extend(chunk)

    def output(self) -> str:
        """Close the terminal and return all that was written to it."""
        self.tty.close()
        self.reader.join(timeout=10)
        os.close(self.master)
        return self.data.decode("utf-8", "replace")


@contextlib.contextmanager
def stderr_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Terminal]:
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term.tty)
    try:
        yield term
    finally:
        monkeypatch.setattr(sys, "stderr", sys.__stderr__)


@pytest.fixture
def metadata(tmp_path: Path) -> Path:
    path = tmp_path / "metadata.parquet"
    pq.write_table(mixture_a(ROWS, seed=1), path)
    return path


def _plan_argv(metadata: Path, out: Path, *extra: str) -> list[str]:
    return ["plan", str(metadata), "--budget-gib", "40", "--on-oversize", "reject", "--out", str(out), "--json", *extra]


def _run(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` with stdout captured (stderr is whatever the test made it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


# -- the CLI: bars on a terminal, none when quiet or piped; stdout the same --------------------------


def test_progress_plan_on_a_terminal_bars_on_stderr_stdout_unchanged(
    metadata: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "manifest.parquet"
    with stderr_on_a_terminal(monkeypatch) as term:
        code, shown = _run(_plan_argv(metadata, out))
    bars = term.output()
    assert code == 0
    # every phase shows a bar: two passes over the rows, planning as one step between them
    for phase in ("1/3 counting", "2/3 planning", "3/3 writing"):
        assert phase in bars, bars
    assert BAR in bars and "rows" in bars
    assert bars.endswith("\r")  # each bar clears its line when done (nothing left above the results)
    first = load_manifest(out)
    assert len(first) == ROWS  # no sample lost

    with stderr_on_a_terminal(monkeypatch) as term:
        code_quiet, quiet = _run(_plan_argv(metadata, out, "--quiet"))
    assert code_quiet == 0 and term.output() == ""  # --quiet: nothing on the terminal at all

    piped = io.StringIO()  # not a terminal: a log file, a pipe
    monkeypatch.setattr(sys, "stderr", piped)
    code_piped, plain = _run(_plan_argv(metadata, out))
    assert code_piped == 0 and piped.getvalue() == ""

    # stdout is byte for byte the same, and it is one clean JSON object
    assert shown == quiet == plain
    data = json.loads(shown)
    assert data["summary"]["samples"] + data["summary"]["rejected"] == ROWS
    assert load_manifest(out).summary() == first.summary()


def test_progress_quiet_before_the_verb_is_the_same_flag(
    metadata: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with stderr_on_a_terminal(monkeypatch) as term:
        code, shown = _run(["--quiet", *_plan_argv(metadata, tmp_path / "m.parquet")])
    assert code == 0 and term.output() == ""
    assert json.loads(shown)["summary"]["samples"] > 0


def test_progress_error_after_a_bar_starts_on_its_own_line(
    metadata: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mixture A at 40 GiB has samples that fit not even alone: the plan stops inside phase 2
    out = tmp_path / "manifest.parquet"
    argv = ["plan", str(metadata), "--budget-gib", "40", "--out", str(out)]
    with stderr_on_a_terminal(monkeypatch) as term:
        code, shown = _run(argv)
    text = term.output()
    assert code == 1 and shown == ""
    assert "2/3 planning" in text
    # the bar cleared its line (\r, blanks, \r) before the one-line error
    assert "\rtokenbucket plan: error: " in text and "do not fit the budget even alone" in text
    assert not out.exists()


def test_progress_every_verb_takes_quiet_with_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for name, _, _ in VERBS:
        args = parser.parse_args([name, *_minimal_args(name), "--quiet"])
        assert args.quiet is True, name
    assert parser.parse_args(["gpus"]).quiet is False
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "--quiet" in capsys.readouterr().out


def _minimal_args(verb: str) -> list[str]:
    """Enough arguments for ``verb`` to parse (its required ones)."""
    return {
        "cost": ["--batch", "1", "--length", "8"],
        "ledger": ["--sample", "{}"],
        "profile": ["m:f"],
        "plan": ["--out", "x.parquet"],
        "inspect": ["m.parquet"],
        "report": ["run.jsonl"],
        "calibrate": ["run.jsonl"],
        "replan": ["m.parquet", "--from-log", "run.jsonl"],
    }.get(verb, [])


@pytest.mark.slow
def test_progress_plan_in_a_real_process_with_stderr_on_a_terminal(metadata: Path, tmp_path: Path) -> None:
    # the installed command as a user runs it: stderr a terminal, stdout a pipe
    out = tmp_path / "manifest.parquet"
    command = [sys.executable, "-m", "tokenbucket", *_plan_argv(metadata, out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    term = Terminal()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=term.tty, env=env) as proc:
        term.tty.close()  # the child holds its own copy
        shown = proc.communicate(timeout=120)[0]
    term.reader.join(timeout=10)
    os.close(term.master)
    bars = term.data.decode("utf-8", "replace")
    assert proc.returncode == 0
    assert "1/3 counting" in bars and "3/3 writing" in bars and BAR in bars
    piped = subprocess.run(command, capture_output=True, env=env, timeout=120, check=True)
    assert piped.stderr == b""
    assert shown == piped.stdout and json.loads(shown)["summary"]["samples"] > 0


# -- the helper ---------------------------------------------------------------------------------------


def test_progress_disabled_yields_every_item_and_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    items = [3, 1, 2]
    assert list(progress(items, desc="x", enabled=False)) == items
    bar = progress(10, desc="y", enabled=False)
    bar.update(4)
    bar.close()
    assert capsys.readouterr() == ("", "")


def test_progress_enabled_writes_to_stderr_never_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(progress(range(5), desc="adding", unit="points", enabled=True)) == [0, 1, 2, 3, 4]
    out, err = capsys.readouterr()
    assert out == ""
    # (a bar redraws at most every 0.1 s and clears its line at the end: its first drawing is sure)
    assert "adding" in err and "0/5" in err and "points" in err


def test_progress_count_without_a_known_total(capsys: pytest.CaptureFixture[str]) -> None:
    bar = progress(None, desc="counting", unit="rows", enabled=True)
    bar.update(1500)
    bar.close()
    out, err = capsys.readouterr()
    assert out == "" and "counting: 0.00rows" in err  # a count, no percentage: the end is unknown
    assert "%|" not in err


def test_progress_default_follows_whether_stderr_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    with stderr_on_a_terminal(monkeypatch) as term:
        assert stderr_is_terminal()
        assert list(progress([1, 2], desc="on a terminal")) == [1, 2]
    assert "on a terminal" in term.output()
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    assert not stderr_is_terminal()
    assert list(progress([1, 2], desc="piped")) == [1, 2]
    assert captured.getvalue() == ""


def test_progress_without_any_stderr_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", None)  # pythonw, a daemon with its streams closed
    assert not stderr_is_terminal()
    assert list(progress("ab", desc="nowhere")) == ["a", "b"]


@pytest.mark.slow
def test_progress_profile_points_one_step_per_point(capsys: pytest.CaptureFixture[str]) -> None:
    spec = ModelSpec(hidden=64, layers=1, heads=2, attention="eager")
    points = [(1, 16), (2, 16), (1, 32)]
    prof = profile_points(
        lambda: ReferenceTransformer(spec),
        lambda b, n: torch.empty(b, n, spec.hidden, dtype=torch.bfloat16),
        points,
        progress=True,
    )
    out, err = capsys.readouterr()
    assert [p[:2] for p in prof.points] == points  # every point measured, in order
    assert out == "" and "profiling" in err and "0/3" in err and "points" in err  # a step per point


def test_progress_report_one_step_per_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    log = read_events(_write(tmp_path / "run.jsonl", truncated=False))
    files = write_report(log, tmp_path / "report", progress=True)
    out, err = capsys.readouterr()
    pngs = len(REPORT_FILES) - 1
    assert out == "" and "report plots" in err and f"0/{pngs}" in err  # a step per plot
    assert len(files.pngs) == pngs and all(p.exists() for p in files.pngs)
