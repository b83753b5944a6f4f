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
from tokenbucket.monitor.report import REPORT_FILES, read_events, write_report

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


def test_cli_report_prints_table_counts_and_partial_warning(run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", str(run_log)])
    out, err = capsys.readouterr()
    assert code == 0
    rows = {cols[0]: cols for cols in map(str.split, out.splitlines()) if cols and cols[0].isdigit()}
    # one table row per bucket: bucket, steps first and ooms last (format_summary's columns)
    assert {k: (cols[1], cols[-1]) for k, cols in rows.items()} == {"0": ("4", "0"), "1": ("3", "0"), "2": ("2", "1")}
    assert "oom 1" in out
    assert "risk 1" in out and "drift 1" in out
    # the skipped line is named on stderr, one line, so stdout stays the table alone
    assert err.splitlines() == [
        f"tokenbucket report: warning: run log {str(run_log)!r} line 15 was cut short (killed run?) and was skipped"
    ]


def test_cli_report_json_matches_log(run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", str(run_log), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {r["bucket"]: r["steps"] for r in data["buckets"]} == {k: len(v) for k, v in LATENCIES.items()}
    assert {r["bucket"]: r["ooms"] for r in data["buckets"]} == {0: 0, 1: 0, 2: 1}
    assert data["events"] == {"risk": 1, "oom": 1, "drift": 1, "adapt": 0}
    assert data["partial_last_line"] is True
    assert data["skipped_lines"] == [15]


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
    assert [p.name for p in pngs] == ["buckets.png", "latency.png", "memory.png", "risk.png", "throughput.png"]
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, png
    page = (out_dir / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 5
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


# -- bad input: one line on stderr, exit 1, nothing written or changed ---------------------------
# NOTE [ Event fields ] (monitor/stats.py) decides which fields are required and which optional.

REQUIRED_STEP_FIELDS = ("step", "bucket", "latency_s", "real_tokens", "padded_tokens", "predicted_bytes", "risk")


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: its bytes and mtime (links by their own stat)."""
    return {
        str(p.relative_to(root)): (b"" if p.is_symlink() else p.read_bytes(), p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def _cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``tokenbucket report ARGV``; assert it failed with one line on stderr and nothing on stdout."""
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tokenbucket report: error: ")
    return lines[0]


def _lines(*, measured: bool = False) -> list[str]:
    return [json.dumps(e) for e in _events(measured=measured)]


@pytest.mark.parametrize("field", REQUIRED_STEP_FIELDS)
def test_cli_report_step_without_required_field_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    lines = _lines()
    step = json.loads(lines[3])
    del step[field]
    lines[3] = json.dumps(step)
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = _snapshot(tmp_path)
    message = _cli_error(capsys, str(path))
    assert f"run log {str(path)!r} line 4: the step event has no {field!r} field" in message
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("latency_s", "fast"), ("latency_s", None), ("bucket", True), ("bucket", 1.5), ("risk", -0.1), ("step", 2**70)],
)
def test_cli_report_step_with_wrong_value_names_line_field_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object
) -> None:
    lines = _lines()
    step = json.loads(lines[2])
    step[field] = value
    lines[2] = json.dumps(step)
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    message = _cli_error(capsys, str(path))
    assert f"line 3: the step event's {field!r} should be" in message and f"but got {field}=" in message


def test_cli_report_step_with_nan_latency_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lines()
    lines[1] = lines[1].replace('"latency_s": 0.01', '"latency_s": NaN')
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert "line 2: the step event's 'latency_s' should be a finite number" in _cli_error(capsys, str(path))


@pytest.mark.parametrize("kind", ["risk", "oom"])
def test_cli_report_risk_or_oom_without_bucket_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    events = _events(measured=False)
    number = next(i for i, e in enumerate(events, start=1) if e["event"] == kind)
    del events[number - 1]["bucket"]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert f"line {number}: the {kind} event has no 'bucket' field" in _cli_error(capsys, str(path))


def test_cli_report_step_without_optional_memory_fields_reads_them_as_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # measured_bytes / reserved_bytes are optional: null in every CPU run, so absent means the same
    nulls = _write(tmp_path / "nulls.jsonl", truncated=False)
    absent = tmp_path / "absent.jsonl"
    events = _events(measured=False)
    for e in events:
        if e["event"] == "step":
            del e["measured_bytes"], e["reserved_bytes"]
    absent.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["report", str(nulls), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main(["report", str(absent), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == expected
    assert sum(r["steps"] for r in got["buckets"]) == sum(map(len, LATENCIES.values()))


def test_cli_report_measured_with_zero_predicted_has_no_drift_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _events(measured=True)
    for e in events:
        if e["event"] == "step" and e["bucket"] == 0:
            e["predicted_bytes"] = 0
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["report", str(path), "--json"]) == 0
    rows = {r["bucket"]: r for r in json.loads(capsys.readouterr().out)["buckets"]}
    assert rows[0]["drift_ratio"] is None and rows[0]["measured_peak_bytes"] == int(2**30 * 1.1)
    assert rows[1]["drift_ratio"] == pytest.approx(1.1, rel=1e-6)


@pytest.mark.parametrize(
    "text", ["", "\n\n  \n", '{"event": "start", "time": 1.0}\n', '{"event": "start", "time": 1.0}\n{"event": "st']
)
def test_cli_report_log_without_step_events_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(text)
    before = _snapshot(tmp_path)
    message = _cli_error(capsys, str(path))
    assert f"run log {str(path)!r} holds no step events" in message
    assert _snapshot(tmp_path) == before


def test_cli_report_out_is_an_existing_file_names_out(run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = run_log.parent / "notes.txt"
    target.write_text("mine\n")
    before = _snapshot(run_log.parent)
    message = _cli_error(capsys, str(run_log), "--out", str(target))
    assert f"--out {str(target)!r} is a file, not a folder" in message
    assert _snapshot(run_log.parent) == before


def test_cli_report_out_is_the_run_log_itself_leaves_it_whole(
    run_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(run_log.parent)
    assert "--out" in _cli_error(capsys, str(run_log), "--out", str(run_log))
    assert _snapshot(run_log.parent) == before


def test_cli_report_out_below_a_file_names_out(run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(run_log.parent)
    message = _cli_error(capsys, str(run_log), "--out", str(run_log / "report"))
    assert f"--out {str(run_log / 'report')!r} cannot be made: {str(run_log)!r} is a file" in message
    assert _snapshot(run_log.parent) == before


@pytest.mark.parametrize("name", ["latency.png", "report.html"])
def test_cli_report_out_never_overwrites_a_users_file_of_a_report_name(
    run_log: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    out_dir = run_log.parent / "mine"
    out_dir.mkdir()
    (out_dir / name).write_bytes(PNG_MAGIC + b"a user's own plot" if name.endswith(".png") else b"<p>my page</p>")
    (out_dir / "keep.txt").write_text("untouched\n")
    before = _snapshot(run_log.parent)
    message = _cli_error(capsys, str(run_log), "--out", str(out_dir))
    assert f"--out {str(out_dir)!r} already holds {name!r}, which tokenbucket did not write" in message
    assert "give another --out" in message
    assert _snapshot(run_log.parent) == before  # nothing written, not even the other report files


def test_cli_report_out_never_writes_through_a_link(run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = run_log.parent / "precious.html"
    outside.write_text("<!doctype html>precious")
    out_dir = run_log.parent / "report"
    out_dir.mkdir()
    (out_dir / "report.html").symlink_to(outside)
    before = _snapshot(run_log.parent)
    assert "'report.html'" in _cli_error(capsys, str(run_log), "--out", str(out_dir))
    assert _snapshot(run_log.parent) == before


def test_cli_report_out_replaces_its_own_report_and_nothing_else(
    run_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    out_dir = run_log.parent / "report"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("mine\n")
    assert main(["report", str(run_log), "--out", str(out_dir)]) == 0
    first = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    assert sorted(first) == sorted(["notes.txt", *REPORT_FILES])
    log_before = run_log.read_bytes()
    assert main(["report", str(run_log), "--out", str(out_dir)]) == 0  # a rerun replaces its own files
    capsys.readouterr()
    second = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    assert sorted(second) == sorted(first)  # no temporary file left behind
    assert second["notes.txt"] == b"mine\n" and run_log.read_bytes() == log_before
    assert second["report.html"] == first["report.html"]


def test_write_report_refusal_names_the_report_folder(run_log: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "plots"
    out_dir.mkdir()
    (out_dir / "risk.png").write_bytes(b"not ours")
    with pytest.raises(ConfigError, match=r"report folder .*plots' already holds 'risk.png'.*another report folder"):
        write_report(read_events(run_log), out_dir)
    assert (out_dir / "risk.png").read_bytes() == b"not ours"
    assert sorted(p.name for p in out_dir.iterdir()) == ["risk.png"]


def test_cli_report_missing_file_and_folder_fail_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.jsonl"
    assert f"run log {str(missing)!r} does not exist" in _cli_error(capsys, str(missing))
    assert f"run log {str(tmp_path)!r} is a folder, not a file" in _cli_error(capsys, str(tmp_path))
    assert not missing.exists()


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        (b"\xff\xfe\x00garbage", "middle"),
        (b'{"event": "st\xffep", "step": 1}', "middle"),
        (b'{"event": "st\xffep", "step": 1', "last"),  # a bad byte inside the line is no cut
        (b"\x89PNG\r\x1a\x00\x00", "last"),
    ],
)
def test_cli_report_invalid_utf8_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: bytes, where: str
) -> None:
    lines = [line.encode() for line in _lines()]
    number = 3 if where == "middle" else len(lines) + 1
    lines.insert(number - 1, bad)
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if where == "middle" else b""))
    before = _snapshot(tmp_path)
    message = _cli_error(capsys, str(path))
    assert f"run log {str(path)!r} line {number} is not a monitor event (not UTF-8 text: byte 0x" in message
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "bad",
    [
        "hello world",  # not JSON at all
        '{"event": "step", "step": oops}',  # JSON-like, but no cut could make it whole
        "[1, 2, 3]",  # JSON, but not an event
        '{"event": "adapt", "time": 1}{"event": "adapt", "time": 2}',  # two records glued together
    ],
)
@pytest.mark.parametrize("where", ["middle", "last"])
def test_cli_report_line_that_is_not_an_event_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, where: str
) -> None:
    lines = _lines()
    number = 4 if where == "middle" else len(lines) + 1
    lines.insert(number - 1, bad)
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines))
    message = _cli_error(capsys, str(path))
    assert f"run log {str(path)!r} line {number} is not a monitor event" in message


@pytest.mark.parametrize(
    "cut",
    [
        '{"event": "step", "step": 9, "bu',
        '{"event": "step", "step": 9',
        '{"event": "step", "step": 9, "latency_s": 1.',
        '{"event": "step", "step": 9, "measured_bytes": nu',
        '{"event": "risk", "keys": ["\\u00',
        '{"event": "risk", "keys": ["caf\xc3',  # a two-byte character cut after its first byte
    ],
)
def test_cli_report_cut_last_line_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: str
) -> None:
    lines = _lines()
    path = tmp_path / "run.jsonl"
    path.write_bytes("\n".join(lines).encode() + b"\n" + cut.encode("latin-1"))
    before = _snapshot(tmp_path)
    assert main(["report", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"tokenbucket report: warning: run log {str(path)!r} line {len(lines) + 1} was cut short (killed run?) "
        "and was skipped"
    ]
    data = json.loads(out)
    assert data["skipped_lines"] == [len(lines) + 1] and data["partial_last_line"] is True
    assert sum(r["steps"] for r in data["buckets"]) == sum(map(len, LATENCIES.values()))  # no step lost
    assert _snapshot(tmp_path) == before
