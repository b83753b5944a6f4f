"""Nothing the monitor appends to destroys what a file already held.

NOTE [ Cut records ] (monitor/sinks.py): the run log and the replay file are appended to after
their last line is mended: a whole record gets the newline it lacks, a cut line becomes a cut
record holding its bytes. No byte already in the file is lost, even when the mend is killed, every
line is JSON, and every record appended is a line of its own.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tokenbucket import CostModel, ModelSpec
from tokenbucket._exceptions import ConfigError
from tokenbucket.cli.main import main
from tokenbucket.monitor import sinks
from tokenbucket.monitor.hooks import BucketMonitor, read_replay
from tokenbucket.monitor.report import read_events
from tokenbucket.monitor.sinks import CUT_EVENT, MAX_CUT_BYTES, JsonlSink, append_line, cut_bytes
from tokenbucket.monitor.stats import summarize_events
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.train.batch import BatchInfo

RECORDS = [{"event": "adapt", "time": float(i), "step": i, "bucket": 0} for i in range(3)]
NEW = [{"event": "resume", "time": 10.0, "step": 3}, {"event": "summary", "time": 11.0, "buckets": []}]


def _jsonl(records: list[dict[str, object]], *, final_newline: bool) -> bytes:
    text = "\n".join(json.dumps(r) for r in records)
    return (text + "\n" if final_newline else text).encode()


def _compact(records: list[dict[str, object]]) -> bytes:
    """What the sink writes: one compact JSON object a line."""
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


def _append_with_sink(path: Path, records: list[dict[str, object]]) -> None:
    sink = JsonlSink(path)
    for record in records:
        sink(record)
    sink.close()


@pytest.mark.parametrize("count", [1, 3])
def test_jsonl_sink_appending_after_a_last_line_without_newline_keeps_every_record(tmp_path: Path, count: int) -> None:
    path = tmp_path / "run.jsonl"
    old = _jsonl(RECORDS[:count], final_newline=False)
    path.write_bytes(old)
    _append_with_sink(path, NEW)
    data = path.read_bytes()
    assert data.startswith(old + b"\n")  # the old bytes are all still there, as they were
    parsed = [json.loads(line) for line in data.decode().splitlines()]
    assert len(parsed) == count + len(NEW)  # every record before, plus the new ones
    assert parsed == RECORDS[:count] + NEW


def test_jsonl_sink_appending_after_whole_lines_adds_nothing_between(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    old = _jsonl(RECORDS, final_newline=True)
    path.write_bytes(old)
    _append_with_sink(path, NEW)
    assert path.read_bytes() == old + _compact(NEW)


def test_jsonl_sink_new_or_empty_file_starts_without_blank_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    _append_with_sink(empty, NEW)
    fresh = tmp_path / "sub" / "fresh.jsonl"
    _append_with_sink(fresh, NEW)
    assert empty.read_bytes() == fresh.read_bytes() == _compact(NEW)


def _lines(data: bytes) -> list[dict[str, Any]]:
    """Every line of a JSONL file, parsed as any JSONL reader would: each must be JSON."""
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def test_jsonl_sink_keeps_a_cut_line_in_a_cut_record_and_the_reader_skips_it(tmp_path: Path) -> None:
    # a killed run's cut line, then a resumed run appending: the cut line's bytes are kept (in a
    # record), nothing before them is touched, and read_events names and skips the record
    path = tmp_path / "run.jsonl"
    whole = _jsonl(RECORDS, final_newline=True)
    cut = b'{"event": "step", "step": 3, "buck'
    path.write_bytes(whole + cut)
    _append_with_sink(path, NEW)
    data = path.read_bytes()
    assert data.startswith(whole)
    parsed = _lines(data)
    assert parsed[:3] == RECORDS and parsed[4:] == NEW
    assert parsed[3]["event"] == CUT_EVENT and parsed[3]["offset"] == len(whole)
    assert cut_bytes(parsed[3]) == cut
    log = read_events(path)
    assert log.events == RECORDS + NEW  # 3 old records + 2 new, none lost
    assert log.skipped_lines == (4,) and log.partial_last_line is False


def test_jsonl_sink_after_a_cut_last_line_every_line_is_json_and_report_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # NOTE [ Cut records ]: before, the cut line stayed a line of its own, which no JSONL reader
    # but ours could read (json.loads of it fails; pandas.read_json(lines=True) too)
    from tests.test_report import _events

    events = _events(measured=False)
    path = tmp_path / "run.jsonl"
    _append_with_sink(path, events[:6])
    killed = path.read_bytes()
    tail = b'{"event":"step","step":5,"time":106.0,"bucket":1,"rows":4,"length":5\xc3'  # cut inside a character
    path.write_bytes(killed + tail)
    _append_with_sink(path, events[6:])
    data = path.read_bytes()
    parsed = _lines(data)  # every line is JSON
    cuts = [r for r in parsed if r["event"] == CUT_EVENT]
    assert len(cuts) == 1 and cut_bytes(cuts[0]) == tail  # the cut bytes, exactly
    assert data[: cuts[0]["offset"]] == killed  # and where they stood
    assert [r for r in parsed if r["event"] != CUT_EVENT] == events
    pandas = pytest.importorskip("pandas")
    assert len(pandas.read_json(path, lines=True)) == len(events) + 1
    log = read_events(path)
    assert log.events == events and log.skipped_lines == (7,)
    assert main(["report", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows  # the report reads the whole run


def test_jsonl_sink_a_cut_record_survives_a_second_resume(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"event": "adapt", "ti')
    _append_with_sink(path, NEW[:1])
    once = path.read_bytes()
    _append_with_sink(path, NEW[1:])  # reopened: the record is a whole line, left as it is
    assert path.read_bytes() == once + _compact(NEW[1:])
    assert read_events(path).skipped_lines == (1,)


@pytest.mark.parametrize("killed_after", [1, 2, 3])
def test_jsonl_sink_mend_killed_at_each_step_loses_no_byte_and_the_next_open_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed_after: int
) -> None:
    # NOTE [ Cut records ]: a kill after step 1, 2 or 3 (each ends in an fsync)
    path = tmp_path / "run.jsonl"
    whole = _jsonl(RECORDS, final_newline=True)
    cut = b'{"event": "adapt", "time": 3.0, "st'
    path.write_bytes(whole + cut)
    calls = []
    real_fsync = sinks.os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        calls.append(fd)
        if len(calls) == killed_after:
            raise KeyboardInterrupt  # the process stops here

    with monkeypatch.context() as m:
        m.setattr(sinks.os, "fsync", fsync)
        with pytest.raises(KeyboardInterrupt):
            JsonlSink(path)
    stopped = path.read_bytes()
    assert stopped.startswith(whole)
    assert cut in stopped or any(cut_bytes(r) == cut for r in _lines(stopped[len(whole) :]) if r)
    _append_with_sink(path, NEW)
    data = path.read_bytes()
    parsed = _lines(data)
    assert parsed[:3] == RECORDS and parsed[4:] == NEW and cut_bytes(parsed[3]) == cut


def test_jsonl_sink_finishes_a_mend_killed_inside_step_2(tmp_path: Path) -> None:
    # the record half written over the cut line, the copy of step 1 whole after it
    path = tmp_path / "run.jsonl"
    whole = _jsonl(RECORDS, final_newline=True)
    cut = b'{"event": "adapt", "time": 3.0, "st'
    record = {"event": CUT_EVENT, "time": 1.5, "offset": len(whole), "base64": base64.b64encode(cut).decode()}
    line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
    step1 = cut + b"\n" * (len(line) - len(cut))
    path.write_bytes(whole + line[:20] + step1[20:] + line)
    _append_with_sink(path, NEW)
    assert path.read_bytes() == whole + line + _compact(NEW)


def test_jsonl_sink_leaves_a_last_cut_record_that_is_no_copy_of_a_mend(tmp_path: Path) -> None:
    # two logs joined: the second's cut record names an offset in its own file, not in this one
    path = tmp_path / "run.jsonl"
    record = {"event": CUT_EVENT, "time": 1.5, "offset": 3, "base64": base64.b64encode(b'{"ev').decode()}
    old = _jsonl([*RECORDS, record], final_newline=False)
    path.write_bytes(old)
    _append_with_sink(path, NEW)
    assert path.read_bytes() == old + b"\n" + _compact(NEW)


def test_jsonl_sink_refuses_a_file_ending_in_a_megabyte_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    old = b"\x00\x01" * (MAX_CUT_BYTES // 2 + 1)
    path.write_bytes(old)
    with pytest.raises(ConfigError, match=r"weights.bin' ends in over 1048576 bytes without a newline"):
        JsonlSink(path)
    assert path.read_bytes() == old  # untouched


def test_read_events_cut_lines_of_two_killed_runs_are_both_skipped(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(
        _jsonl(RECORDS[:1], final_newline=True)
        + b'{"event": "adapt", "time": 1.0, "st\n'
        + _jsonl(RECORDS[1:2], final_newline=True)
        + b'{"event": "adapt", "time": 2'
    )
    log = read_events(path)
    assert log.events == RECORDS[:2]
    assert log.skipped_lines == (2, 4) and log.partial_last_line is True


def _monitor_with_replay(tmp_path: Path) -> tuple[BucketMonitor, Path]:
    cost = CostModel(ModelSpec(hidden=8, layers=1, heads=2, precision="fp32", attention="eager"))
    plan = plan_buckets([64] * 16 + [128] * 16, cost, 2**20, max_buckets=2, multiple=8)
    replay = tmp_path / "run.replay.jsonl"
    return BucketMonitor(plan, sinks=[], memory=None, replay_path=replay), replay


def _oom(batch: object) -> None:
    raise torch.OutOfMemoryError("CUDA out of memory (fake)")


def _info(key: str, index: int) -> BatchInfo:
    return BatchInfo(
        bucket=0,
        shape=(1, 64),
        keys=(key,),
        tokens={"vision": 64},
        real_tokens=64,
        padded_tokens=64,
        predicted_peak_bytes=2**19,
        risk=0.5,
        indices=(index,),
        lengths=(64,),
        row_tokens=((64,),),
    )


def test_replay_append_after_a_record_without_newline_keeps_both(tmp_path: Path) -> None:
    monitor, replay = _monitor_with_replay(tmp_path)
    old_record = {"keys": ["ep0/0"], "indices": [7], "bucket": 0, "step": 0, "reason": "oom"}
    old = json.dumps(old_record).encode()  # a whole record whose newline was never written
    replay.write_bytes(old)
    train = monitor.guard(_oom, policy="skip")
    assert train({"info": _info("ep1/0", 11)}) is None
    assert train({"info": _info("ep1/1", 12)}) is None
    assert replay.read_bytes().startswith(old + b"\n")
    records = read_replay(replay)
    assert len(records) == 3  # the old record and both new ones: no sample lost
    assert records[0] == old_record
    assert [i for r in records for i in r["indices"]] == [7, 11, 12]


def test_append_line_after_a_cut_record_keeps_the_cut_bytes_and_read_replay_skips_them(tmp_path: Path) -> None:
    path = tmp_path / "run.replay.jsonl"
    first = b'{"keys": ["a"], "indices": [1]}\n'
    cut = b'{"keys": ["b"], "ind'
    path.write_bytes(first + cut)
    append_line(path, '{"keys": ["c"], "indices": [3]}')
    data = path.read_bytes()
    parsed = _lines(data)
    assert data.startswith(first) and data.endswith(b'\n{"keys": ["c"], "indices": [3]}\n')
    assert parsed[1]["event"] == CUT_EVENT and cut_bytes(parsed[1]) == cut
    assert read_replay(path) == [{"keys": ["a"], "indices": [1]}, {"keys": ["c"], "indices": [3]}]


def test_summarize_events_names_the_event_and_the_missing_field() -> None:
    step = {"event": "step", "step": 0, "bucket": 0, "latency_s": 0.1, "real_tokens": 8, "padded_tokens": 8}
    with pytest.raises(ConfigError, match=r"event 1: the step event has no 'predicted_bytes' field"):
        summarize_events([{"event": "start", "time": 0.0}, step])
    full = {**step, "predicted_bytes": 100, "risk": 0.1}
    rows = summarize_events([full, {**full, "measured_bytes": None}])  # optional fields: absent = null
    assert [(r["bucket"], r["steps"], r["measured_peak_bytes"]) for r in rows] == [(0, 2, None)]


def test_read_replay_skips_a_cut_last_line_and_names_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "run.replay.jsonl"
    whole = '{"keys": ["a"], "indices": [0], "bucket": 0, "step": 3, "reason": "oom"}'
    path.write_text(whole + "\n" + whole.replace('"a"', '"b"')[:30])  # killed inside the second write
    before = path.read_bytes()
    assert [r["keys"] for r in read_replay(path)] == [["a"]]
    assert path.read_bytes() == before  # read, never repaired in place
    path.write_text(whole + "\nnot json at all\n" + whole + "\n")
    with pytest.raises(ConfigError, match=r"run.replay.jsonl' line 2 is not a JSON record"):
        read_replay(path)
