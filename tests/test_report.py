"""The run-log reader, the report files and the ``tokenbucket report`` verb, on a hand-written log."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tokenbucket._exceptions import ConfigError
from tokenbucket.cli.main import main
from tokenbucket.monitor.report import read_events, write_report

# bucket -> step latencies (s); bucket 2 also OOMs once
LATENCIES = {0: [0.010, 0.012, 0.011, 0.013], 1: [0.020, 0.025, 0.022], 2: [0.040, 0.050]}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _events(*, measured: bool) -> list[dict[str, Any]]:
    buckets = [
        {"bucket": k, "bound": 256 * (k + 1), "batch_size": 8 >> k, "predicted_peak_bytes": 2**30 * (k + 1)}
        for k in LATENCIES
    ]
    events: list[dict[str, Any]] = [
        {
            "event": "start",
            "time": 100.0,
            "budget_bytes": 4 * 2**30,
            "risk_threshold": 0.9,
            "drift_margin": 0.1,
            "plan_mode": "static",
            "buckets": buckets,
        }
    ]
    step = 0
    for bucket, latencies in LATENCIES.items():
        rows, length = 8 >> bucket, 256 * (bucket + 1)
        for latency in latencies:
            predicted = 2**30 * (bucket + 1)
            events.append(
                {
                    "event": "step",
                    "step": step,
                    "time": 101.0 + step,
                    "bucket": bucket,
                    "rows": rows,
                    "length": length,
                    "real_tokens": rows * length // 2,
                    "padded_tokens": rows * length,
                    "latency_s": latency,
                    "tokens_per_s": rows * length / 2 / latency,
                    "predicted_bytes": predicted,
                    "measured_bytes": int(predicted * 1.1) if measured else None,
                    "reserved_bytes": predicted * 2 if measured else None,
                    "risk": 0.25 * (bucket + 1),
                }
            )
            step += 1
    events += [
        {
            "event": "risk",
            "step": step,
            "time": 120.0,
            "bucket": 2,
            "rows": 2,
            "length": 768,
            "risk": 0.95,
            "threshold": 0.9,
            "keys": ["ep7/0"],
            "tokens": {"vision": 700, "text": 68},
            "cameras": {"top": 350},
        },
        {
            "event": "oom",
            "step": step,
            "time": 121.0,
            "bucket": 2,
            "rows": 2,
            "length": 768,
            "keys": ["ep7/0"],
            "tokens": {"vision": 700},
            "cameras": {"top": 350},
            "policy": "skip",
            "message": "CUDA out of memory",
        },
        {
            "event": "drift",
            "step": step + 1,
            "time": 122.0,
            "bucket": 1,
            "ratio": 1.2,
            "margin": 0.1,
            "suggested_factor": 0.9,
        },
        {"event": "checkpoint_saved", "time": 123.0, "path": "ckpt/7"},  # a newer monitor's event: ignored
    ]
    return events


def _write(path: Path, *, measured: bool = False, truncated: bool = True) -> Path:
    text = "".join(json.dumps(e) + "\n" for e in _events(measured=measured))
    if truncated:
        text += '{"event": "step", "step": 99, "time": 130.0, "buck'  # the run was killed mid-write
    path.write_text(text)
    return path


@pytest.fixture
def run_log(tmp_path: Path) -> Path:
    return _write(tmp_path / "run.jsonl")


def test_read_events_truncated_last_line_skipped_and_flagged(run_log: Path) -> None:
    log = read_events(run_log)
    # 1 start + 9 steps + risk + oom + drift + the unknown event; the cut-off step is not an event
    assert len(log.events) == 14
    assert log.partial_last_line is True
    assert log.counts() == {"risk": 1, "oom": 1, "drift": 1, "adapt": 0}
    assert len(log.of("step")) == sum(map(len, LATENCIES.values()))
    assert log.start()["risk_threshold"] == 0.9


def test_read_events_whole_file_not_partial(tmp_path: Path) -> None:
    log = read_events(_write(tmp_path / "run.jsonl", truncated=False))
    assert log.partial_last_line is False
    assert len(log.events) == 14


def test_read_events_corrupt_middle_line_raises_with_line_number(tmp_path: Path) -> None:
    lines = _write(tmp_path / "run.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"event": "step", "step": oops}\n'
    path = tmp_path / "corrupt.jsonl"
    path.write_text("".join(lines))
    with pytest.raises(ConfigError, match=r"corrupt\.jsonl.*line 3 .*oops"):
        read_events(path)


def test_read_events_object_without_event_field_in_middle_raises(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"event": "start", "time": 1.0}\n[1, 2]\n{"event": "adapt", "time": 2.0}\n')
    with pytest.raises(ConfigError, match="line 2"):
        read_events(path)


def test_read_events_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_events(tmp_path / "nope.jsonl")


def test_cli_report_prints_table_counts_and_partial_note(run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", str(run_log)])
    out = capsys.readouterr().out
    assert code == 0
    rows = {cols[0]: cols for cols in map(str.split, out.splitlines()) if cols and cols[0].isdigit()}
    # one table row per bucket: bucket, steps first and ooms last (format_summary's columns)
    assert {k: (cols[1], cols[-1]) for k, cols in rows.items()} == {"0": ("4", "0"), "1": ("3", "0"), "2": ("2", "1")}
    assert "oom 1" in out
    assert "risk 1" in out and "drift 1" in out
    assert "cut short" in out


def test_cli_report_json_matches_log(run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", str(run_log), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {r["bucket"]: r["steps"] for r in data["buckets"]} == {k: len(v) for k, v in LATENCIES.items()}
    assert {r["bucket"]: r["ooms"] for r in data["buckets"]} == {0: 0, 1: 0, 2: 1}
    assert data["events"] == {"risk": 1, "oom": 1, "drift": 1, "adapt": 0}
    assert data["partial_last_line"] is True


@pytest.mark.slow
@pytest.mark.parametrize("measured", [False, True], ids=["cpu", "cuda"])
def test_cli_report_out_writes_pngs_and_self_contained_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], measured: bool
) -> None:
    pytest.importorskip("matplotlib")
    run_log = _write(tmp_path / "run.jsonl", measured=measured)
    out_dir = tmp_path / "report"
    code = main(["report", str(run_log), "--out", str(out_dir)])
    assert code == 0
    assert str(out_dir / "report.html") in capsys.readouterr().out
    pngs = sorted(out_dir.glob("*.png"))
    assert [p.name for p in pngs] == ["latency.png", "memory.png", "risk.png", "throughput.png"]
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, png
    page = (out_dir / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4
    assert 'src="http' not in page and "<script" not in page
    assert "oom 1" in page
    heads = re.findall(r"<th>(.*?)</th>", page)  # headings in words with the unit the cells are in
    assert "latency p50 (ms)" in heads and "predicted peak (GiB)" in heads and "bucket" in heads
    assert not [h for h in heads if "_" in h]


def test_write_report_without_matplotlib_names_the_extra(
    run_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(ConfigError, match=r"pip install 'tokenbucket\[plot\]'"):
        write_report(read_events(run_log), tmp_path / "report")
