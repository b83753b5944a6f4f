"""StreamBucketer on plain iterables: emission rules, nothing lost, max_buffered, equal steps,
state, the plan estimate. (Real webdataset shards: tests/test_wds.py.)"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.monitor.hooks import split_batch
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.stream.bucketer import StreamBucketer
from tokenbucket.stream.dataset import BucketedStream, StreamCollate
from tokenbucket.stream.emission import stream_batch_counts
from tokenbucket.stream.estimate import estimate_plan
from tokenbucket.testing import mixture_a
from tokenbucket.tokens.breakdown import breakdown_sample

SPEC = TokenSpec(patch=112)
COST = CostModel(ModelSpec(hidden=32, layers=2, heads=4, precision="fp32", attention="flash"))
BUDGET = 24 * 2**20


def samples(n: int = 500, seed: int = 0) -> list[dict[str, Any]]:
    rows = mixture_a(n, seed=seed).to_pylist()
    return [
        {"__key__": r["key"], "json": json.dumps(r).encode(), "__url__": f"shard{i // 100}"} for i, r in enumerate(rows)
    ]


def lengths_of(stream: list[dict[str, Any]]) -> np.ndarray:
    return breakdown_table(pa.Table.from_pylist([json.loads(s["json"]) for s in stream]), SPEC).totals


def plan_for(stream: list[dict[str, Any]], mode: str = "static") -> Any:
    return plan_buckets(lengths_of(stream), COST, BUDGET, max_buckets=6, multiple=32, mode=mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("max_buffered", [None, 40])
def test_stream_every_sample_once_every_batch_fits(mode: str, max_buffered: int | None) -> None:
    stream = samples()
    plan = plan_for(stream, mode)
    stage = StreamBucketer(plan, SPEC, cost_model=COST, max_buffered=max_buffered, lookahead=32)
    batches = list(stage(stream))
    keys = [k for b in batches for k in b.keys]
    assert sorted(keys) == sorted(s["__key__"] for s in stream)  # each sample exactly once
    lengths = dict(zip((s["__key__"] for s in stream), lengths_of(stream).tolist(), strict=True))
    for b in batches:
        assert (
            b.predicted_peak_bytes <= plan.budget_bytes
            and b.predicted_peak_bytes == COST.memory(b.rows, b.length).total
        )
        assert all(lengths[k] == n <= b.length for k, n in zip(b.keys, b.lengths, strict=True))
        assert all(plan.assign([n])[0] == b.bucket for n in b.lengths)  # one bucket per batch
        if mode == "static":
            assert (b.rows, b.length) == (plan.buckets[b.bucket].batch_size, plan.buckets[b.bucket].bound)
            assert b.reason != "full" or b.empty_rows == 0
        else:  # padded to its own longest, and one more sample would not have fitted
            assert b.rows == len(b.samples) and b.length == max(b.lengths)
    stats = stage.stats
    assert stats.batches == len(batches) and stats.samples == len(stream)
    if max_buffered is not None:
        assert stats.early > 0  # the bound forced partial batches out
    assert stats.real_tokens == sum(lengths.values())


def test_stream_batches_report_tokens_by_modality(monkeypatch: pytest.MonkeyPatch) -> None:
    import tokenbucket.stream.counting as counting

    stream = samples(200)
    rows = [json.loads(s["json"]) for s in stream]
    table = breakdown_table(pa.Table.from_pylist(rows), SPEC).table
    names = ("vision", "text", "proprio", "action", "memory")
    expected = {r["key"]: tuple(table.column(n)[i].as_py() for n in names) for i, r in enumerate(rows)}
    plan = plan_for(stream)
    # a field of mixed types makes its chunk fall back to counting one by one: both paths report
    stream[0] = {**stream[0], "json": json.dumps({**rows[0], "note": "x"}).encode()}
    stream[1] = {**stream[1], "json": json.dumps({**rows[1], "note": 1}).encode()}
    one_by_one: list[int] = []
    real = counting.breakdown_sample
    monkeypatch.setattr(counting, "breakdown_sample", lambda *a, **k: one_by_one.append(1) or real(*a, **k))
    batches = list(StreamBucketer(plan, SPEC, lookahead=16)(stream))
    assert len(one_by_one) == 16  # the chunk holding both
    for b in batches:
        info = b.info()
        assert list(info.row_tokens) == [expected[k] for k in b.keys]
        assert info.tokens == {n: sum(expected[k][j] for k in b.keys) for j, n in enumerate(names)}
        assert sum(info.tokens.values()) == info.real_tokens == sum(b.lengths)
    # what the OOM guard's split hands on for each part of a stream batch
    b = next(b for b in batches if len(b.keys) > 2)
    with_data = dataclasses.replace(b, samples=tuple({"tokens": torch.randn(n, 4)} for n in b.lengths))
    whole = StreamCollate()(with_data)
    parts = split_batch(whole, 2, cost_model=COST)
    assert [k for p in parts for k in p["keys"]] == list(b.keys)
    for p in parts:
        info = p["info"]
        assert list(info.keys) == p["keys"] and info.indices == ()
        assert info.tokens == {n: sum(expected[k][j] for k in p["keys"]) for j, n in enumerate(names)}
        assert p["tokens"].shape[:2] == (len(p["keys"]), max(info.lengths)) == info.shape
        assert info.predicted_peak_bytes == COST.memory(*info.shape).total


def test_stream_counts_a_key_only_some_samples_have() -> None:
    # the chunk's first sample has no text: the others' text must still count (and its own is 0)
    stream = samples(40)
    rows = [json.loads(s["json"]) for s in stream]
    del rows[0]["text_tokens"]
    rows[3]["text_tokens"] = None  # present but null: refused, as in a table
    data = [{**s, "json": json.dumps(r).encode()} for s, r in zip(stream, rows, strict=True)]
    expected = {r["key"]: breakdown_sample(r, SPEC).total for i, r in enumerate(rows) if i != 3}
    records: list[dict[str, Any]] = []
    batches = list(StreamBucketer(plan_for(stream), SPEC, lookahead=16, rejected=records.append)(data))
    got = {k: n for b in batches for k, n in zip(b.keys, b.lengths, strict=True)}
    assert got == expected and rows[1]["text_tokens"] > 0
    assert [(r["key"], r["column"]) for r in records] == [(rows[3]["key"], "text_tokens")]


@pytest.mark.slow
def test_stream_max_buffered_bounds_what_waits() -> None:
    stream = samples()
    plan = plan_for(stream)
    waiting = []

    class Probe(StreamBucketer):
        def _batch(self, buffers: Any, *args: Any) -> Any:
            waiting.append(buffers.count)
            return super()._batch(buffers, *args)

    unbounded = list(StreamBucketer(plan, SPEC, lookahead=1)(stream))
    list(Probe(plan, SPEC, max_buffered=25, lookahead=1)(stream))
    assert max(waiting) <= 25
    assert len(unbounded) < len(waiting)  # the bound forces extra, partial batches out


def test_stream_invalid_and_oversize_are_rejected_with_keys_and_the_rest_goes_on() -> None:
    stream = samples(300)
    plan = plan_for(stream)
    bad = [
        {"__key__": "corrupt", "json": b'{"cameras": 2, "frames"', "__url__": "shard9"},
        {"__key__": "negative", "json": json.dumps({"cameras": 1, "frames": -3, "height": 224, "width": 224}).encode()},
        {
            "__key__": "huge",
            "json": json.dumps(
                {**json.loads(stream[0]["json"]), "cameras": 8, "frames": 64, "height": 896, "width": 896}
            ).encode(),
        },
        {"__key__": "nometa"},
    ]
    mixed = stream[:100] + bad[:2] + stream[100:200] + bad[2:] + stream[200:]
    records: list[dict[str, Any]] = []
    stage = StreamBucketer(plan, SPEC, rejected=records.append, lookahead=16)
    keys = [k for b in stage(mixed) for k in b.keys]
    assert sorted(keys) == sorted(s["__key__"] for s in stream)
    got = {r["key"]: r for r in records}
    assert set(got) == {"corrupt", "negative", "huge", "nometa"}
    assert got["corrupt"]["reason"] == "invalid" and "JSON" in got["corrupt"]["message"]
    assert got["corrupt"]["shard"] == "shard9" and got["corrupt"]["column"] == "json"
    assert got["negative"]["column"] == "frames" and str(got["negative"]["value"]) == "-3"
    assert got["huge"]["reason"] == "oversize" and got["huge"]["value"] > plan.bounds[-1]
    assert stage.stats.rejected == {"invalid": 3, "oversize": 1}
    with pytest.raises(ConfigError, match="'corrupt'"):
        list(StreamBucketer(plan, SPEC, on_invalid="error")(mixed))


def test_stream_batches_target_pads_or_cuts_and_records_the_cut() -> None:
    stream = samples(200)
    plan = plan_for(stream)
    natural = len(list(StreamBucketer(plan, SPEC)(stream)))
    padded = list(StreamBucketer(plan, SPEC, batches=natural + 3)(stream))
    assert len(padded) == natural + 3 and [b.reason for b in padded[-3:]] == ["pad"] * 3
    assert all(not b.samples and b.rows == b.empty_rows for b in padded[-3:])
    records: list[dict[str, Any]] = []
    cut = StreamBucketer(plan, SPEC, batches=natural - 2, rejected=records.append)
    kept = [k for b in cut(stream) for k in b.keys]
    over = [r["key"] for r in records if r["reason"] == "over_epoch"]
    assert len(kept) + len(over) == len(stream) and not set(kept) & set(over)  # nothing lost, nothing twice
    assert cut.stats.over_epoch == len(over) > 0


def test_stream_batch_counts_match_the_stage_for_every_rank_and_worker() -> None:
    stream = samples(600)
    plan = plan_for(stream)
    shards = [stream[i : i + 50] for i in range(0, 600, 50)]
    lengths = [lengths_of(s).tolist() for s in shards]
    counts = stream_batch_counts(lengths, plan, world_size=3, num_workers=2, max_buffered=30)
    for rank in range(3):
        for w in range(2):
            mine = [x for s in shards[rank::3][w::2] for x in s]
            assert len(list(StreamBucketer(plan, SPEC, max_buffered=30)(mine))) == counts[rank, w]
    assert counts.min() < counts.max()  # unequal on their own: what batches= evens out


def test_stream_state_resume_neither_repeats_nor_loses() -> None:
    stream = samples(400)
    plan = plan_for(stream)
    full = [b.keys for b in StreamBucketer(plan, SPEC, lookahead=8)(stream)]
    for stop in (0, 1, 5, len(full) - 1):
        stage = StreamBucketer(plan, SPEC, lookahead=8)
        it = stage(stream)
        head = [next(it).keys for _ in range(stop)]
        state = json.loads(json.dumps(stage.state_dict()))  # a JSON checkpoint
        assert all(len(pair) == 2 for pair in state["buffered"])
        resumed = StreamBucketer(plan, SPEC, lookahead=8)
        resumed.load_state_dict(state)
        tail = [b.keys for b in resumed(stream)]  # the same shards, read again
        keys = [k for b in head + tail for k in b]
        assert sorted(keys) == sorted(s["__key__"] for s in stream)
        assert len(state["done_shards"]) <= 4
    with pytest.raises(ConfigError, match="unexpected"):
        StreamBucketer(plan, SPEC).load_state_dict({**state, "x": 1})


def interleaved(n_shards: int = 4, per_shard: int = 40, window: int = 25, seed: int = 0) -> list[dict[str, Any]]:
    """Shards read one after another through a shuffle buffer: samples of neighbouring shards
    mix at every shard end (webdataset's ``.shuffle(window)`` after the shard reader)."""
    rows = samples(n_shards * per_shard, seed=seed)
    ordered = [
        {**r, "__url__": f"shard-{i // per_shard}.tar", "__key__": f"{i % per_shard:06d}"} for i, r in enumerate(rows)
    ]  # keys repeat across shards, as webdataset's do
    rng = np.random.default_rng(seed)
    buffer: list[dict[str, Any]] = []
    out = []
    for sample in ordered:
        buffer.append(sample)
        if len(buffer) >= window:
            out.append(buffer.pop(int(rng.integers(len(buffer)))))
    while buffer:
        out.append(buffer.pop(int(rng.integers(len(buffer)))))
    return out


def handled(batches: list[Any], records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["__url__"], k) for b in batches for s, k in zip(b.samples, b.keys, strict=True)] + [
        (r["shard"], r["key"]) for r in records
    ]


@pytest.mark.slow
def test_stream_resume_across_a_shuffle_buffer_is_exact_with_shard_sizes() -> None:
    stream = interleaved()
    plan = plan_for(stream)
    everything = sorted((s["__url__"], s["__key__"]) for s in stream)
    sizes = {f"shard-{i}.tar": 40 for i in range(4)}
    full = list(StreamBucketer(plan, SPEC, lookahead=4, shard_sizes=sizes)(stream))
    assert sorted(handled(full, [])) == everything  # keys repeat across shards: none taken for duplicates
    for stop in range(len(full) + 1):
        stage = StreamBucketer(plan, SPEC, lookahead=4, shard_sizes=sizes)
        it = stage(stream)
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(stage.state_dict()))
        resumed = StreamBucketer(plan, SPEC, lookahead=4, shard_sizes=sizes)
        resumed.load_state_dict(state)
        assert sorted(handled(head + list(resumed(stream)), [])) == everything, stop
        assert resumed.stats.samples == len(stream)  # buffered samples read twice, counted once
    # shard A seems over when B starts and A's samples have left; then a2 comes: without the sizes
    # a checkpoint there skipped all of A on resume (a2 lost); with them it is exact, and without
    # them the stage says that it saw a shard come back
    mixed = [
        {**stream[i], "__url__": url, "__key__": key}
        for i, (url, key) in enumerate([("A", "a0"), ("B", "b0"), ("B", "b1"), ("A", "a1"), ("B", "b2"), ("A", "a2")])
    ]
    small = plan_buckets(lengths_of(mixed).tolist() * 2, COST, BUDGET, max_buckets=1, multiple=32)
    small = dataclasses.replace(small, buckets=(dataclasses.replace(small.buckets[0], batch_size=2),))
    for stop in range(4):
        stage = StreamBucketer(small, SPEC, lookahead=1, shard_sizes={"A": 3, "B": 3})
        it = stage(mixed)
        head = [next(it) for _ in range(stop)]
        resumed = StreamBucketer(small, SPEC, lookahead=1, shard_sizes={"A": 3, "B": 3})
        resumed.load_state_dict(stage.state_dict())
        assert sorted(k for b in head + list(resumed(mixed)) for k in b.keys) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    with pytest.warns(UserWarning, match="shard_sizes"):
        list(StreamBucketer(small, SPEC, lookahead=1)(mixed))


def test_stream_batches_target_holds_across_a_resume_and_an_ended_pass_starts_the_next() -> None:
    stream = samples(120)
    plan = plan_for(stream)
    natural = len(list(StreamBucketer(plan, SPEC)(stream)))
    for target in (natural - 2, natural + 3):
        records: list[dict[str, Any]] = []
        stage = StreamBucketer(plan, SPEC, batches=target, rejected=records.append)
        it = stage(stream)
        head = [next(it) for _ in range(3)]
        resumed = StreamBucketer(plan, SPEC, batches=target, rejected=records.append)
        resumed.load_state_dict(stage.state_dict())
        tail = list(resumed(stream))
        assert len(head) + len(tail) == target
        assert sorted(k for _, k in handled(head + tail, records)) == sorted(s["__key__"] for s in stream)
    # a state saved at the end of a pass resumes into the next pass, not an empty one
    stage = StreamBucketer(plan, SPEC)
    first = list(stage(stream))
    after = StreamBucketer(plan, SPEC)
    after.load_state_dict(stage.state_dict())
    assert [b.keys for b in after(stream)] == [b.keys for b in first]


def test_stream_odd_metadata_is_rejected_not_raised() -> None:
    stream = samples(20)
    plan = plan_for(stream)
    bad = [
        {
            "__key__": "past-int64",
            "json": json.dumps({"cameras": 1, "frames": 2**63, "height": 224, "width": 224}).encode(),
        },
        {
            "__key__": "not-structs",
            "json": json.dumps({"cameras": [1], "frames": 1, "height": 224, "width": 224}).encode(),
        },
    ]
    for lookahead in (1, 4, 64):  # whatever else shares the chunk
        records: list[dict[str, Any]] = []
        batches = list(
            StreamBucketer(plan, SPEC, lookahead=lookahead, rejected=records.append)(stream[:5] + bad + stream[5:])
        )
        assert sorted(k for b in batches for k in b.keys) == sorted(s["__key__"] for s in stream)
        assert {r["key"]: r["reason"] for r in records} == {"past-int64": "invalid", "not-structs": "invalid"}


class Source(IterableDataset[dict[str, Any]]):
    """Any IterableDataset: it splits itself across DataLoader workers."""

    def __init__(self, stream: list[dict[str, Any]]) -> None:
        self.stream = stream

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        for s in self.stream[w::n]:
            yield {**s, "tokens": torch.ones(int(lengths_of([s])[0]), 3)}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bucketed_stream_wraps_any_iterable_dataset_into_a_dataloader(num_workers: int) -> None:
    stream = samples(300)
    plan = plan_for(stream)
    data = BucketedStream(Source(stream), plan, SPEC)
    loader = DataLoader(data, batch_size=None, num_workers=num_workers, collate_fn=StreamCollate())
    keys = []
    for batch in loader:
        info = batch["info"]
        assert batch["tokens"].shape == (info.shape[0], info.shape[1], 3)
        assert int(batch["attention_mask"].sum()) == info.real_tokens
        keys += batch["keys"]
    assert sorted(keys) == sorted(s["__key__"] for s in stream)


def test_estimate_plan_from_the_first_samples_states_its_uncertainty() -> None:
    stream = samples(2000, seed=3)
    est = estimate_plan(iter(stream), 400, SPEC, COST, BUDGET, max_buckets=6, multiple=32, on_oversize="reject")
    assert est.n == 400 and est.beyond_max_95 == pytest.approx(3 / 400)
    lengths = lengths_of(stream)
    assert est.max_seen == lengths[:400].max()
    beyond = float((lengths[400:] > est.max_seen).mean())
    assert beyond <= 0.05  # the stated bound is a 95 % one; on this workload it holds with room
    # 95 % intervals from the first 400 against the shares of all 2,000: at most one of six may miss
    shares = [float((est.plan.assign(lengths) == k).mean()) for k in range(len(est.plan.buckets))]
    misses = sum(not lo <= p <= hi for (lo, hi), p in zip(est.bucket_share_95, shares, strict=True))
    assert misses <= 1
    assert "400 samples" in est.describe()
    stretched = estimate_plan(iter(stream), 400, SPEC, COST, BUDGET, headroom=1.5, max_buckets=6, multiple=32)
    assert stretched.plan.bounds[-1] >= 1.5 * est.max_seen


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_bucketed_stream_resumes_with_stateful_dataloader(num_workers: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    stream = samples(400)
    plan = plan_for(stream)

    def loader() -> Any:
        data = BucketedStream(Source(stream), plan, SPEC, lookahead=16)
        return StatefulDataLoader(data, batch_size=None, num_workers=num_workers, collate_fn=StreamCollate())

    full = [tuple(b["keys"]) for b in loader()]
    for stop in (0, 2, len(full) // 2):
        first = loader()
        it = iter(first)
        head = [tuple(next(it)["keys"]) for _ in range(stop)]
        state = first.state_dict()
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        tail = [tuple(b["keys"]) for b in resumed]
        keys = [k for b in head + tail for k in b]
        # nothing repeated, nothing lost (batch boundaries after the stop may differ: buffered
        # samples are read again and bucketed with the ones after them)
        assert sorted(keys) == sorted(s["__key__"] for s in stream)
    # a checkpoint at the end of the epoch resumes into a whole next epoch
    first = loader()
    assert sorted(k for b in first for k in b["keys"]) == sorted(s["__key__"] for s in stream)
    after = loader()
    after.load_state_dict(first.state_dict())
    assert sorted(k for b in after for k in b["keys"]) == sorted(s["__key__"] for s in stream)


def test_stream_names_a_shard_that_gave_fewer_samples_than_it_was_indexed_with() -> None:
    stream = interleaved()[:150]  # the shards' last samples never come (a shard cut after indexing)
    plan = plan_for(stream)
    sizes = {f"shard-{i}.tar": 40 for i in range(4)} | {"shard-9.tar": 40}  # shard 9: another worker's
    got = {s: sum(1 for x in stream if x["__url__"] == s) for s in sizes}
    with pytest.warns(UserWarning, match=r"never arrived from \d shard\(s\)") as caught:
        batches = list(StreamBucketer(plan, SPEC, lookahead=4, shard_sizes=sizes)(stream))
    assert sum(len(b.keys) for b in batches) == len(stream)  # everything that came went out
    message = str(caught[0].message)
    assert f"{sum(40 - n for s, n in got.items() if 0 < n < 40)} indexed sample(s)" in message
    assert "shard-9.tar" not in message  # never begun: not this stream's
    for shard, n in got.items():
        if 0 < n < 40:
            assert f"'{shard}' gave {n} of 40" in message
