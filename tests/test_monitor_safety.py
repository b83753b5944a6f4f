"""Nothing the monitor appends to destroys what a file already held.

NOTE [ Appending never truncates ] (monitor/sinks.py): the run log and the replay file are
appended to after a newline is added where the last line lacks one; no record already in the
file is cut off, and every record appended is a line of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenbucket import CostModel, ModelSpec
from tokenbucket._exceptions import ConfigError
from tokenbucket.monitor.hooks import BucketMonitor, read_replay
from tokenbucket.monitor.report import read_events
from tokenbucket.monitor.sinks import JsonlSink, append_line
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


def test_jsonl_sink_keeps_a_cut_line_on_its_own_and_the_reader_skips_it(tmp_path: Path) -> None:
    # a killed run's cut line, then a resumed run appending: the cut line is kept (not truncated
    # away with whatever came before it) and read_events names and skips it
    path = tmp_path / "run.jsonl"
    old = _jsonl(RECORDS, final_newline=True) + b'{"event": "step", "step": 3, "buck'
    path.write_bytes(old)
    _append_with_sink(path, NEW)
    data = path.read_bytes()
    assert data.startswith(old + b"\n")
    log = read_events(path)
    assert log.events == RECORDS + NEW  # 3 old records + 2 new, none lost
    assert log.skipped_lines == (4,) and log.partial_last_line is False


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


def test_append_line_after_a_cut_record_keeps_the_cut_bytes(tmp_path: Path) -> None:
    path = tmp_path / "run.replay.jsonl"
    old = b'{"keys": ["a"], "indices": [1]}\n{"keys": ["b"], "ind'
    path.write_bytes(old)
    append_line(path, '{"keys": ["c"], "indices": [3]}')
    data = path.read_bytes()
    assert data == old + b'\n{"keys": ["c"], "indices": [3]}\n'
    assert [json.loads(line) for line in data.splitlines() if line.endswith(b"}")] == [
        {"keys": ["a"], "indices": [1]},
        {"keys": ["c"], "indices": [3]},
    ]


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
