"""BucketMonitor: step records, risk caught during batching, drift, the OOM guard, sinks, state.

The GPU is faked where it would be needed: an injected memory reader stands in for
``torch.cuda.max_memory_allocated`` and step functions raise ``torch.OutOfMemoryError`` on the
batches a small "GPU" would not hold.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket._exceptions import OOMRiskError, OOMRiskWarning, PlanDriftWarning
from tokenbucket.monitor.hooks import BucketMonitor, is_oom, read_replay, split_batch
from tokenbucket.monitor.sinks import LoggingSink, TensorBoardSink
from tokenbucket.monitor.stats import format_summary, summarize_events
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.testing import RandomTokens
from tokenbucket.train.collate import BucketCollate, TokenBucketDataset
from tokenbucket.train.risk import RiskSplitSampler, static_split

from .tables import small_meta

SPEC = TokenSpec(patch=56)
HIDDEN = 8
COST = CostModel(ModelSpec(hidden=HIDDEN, layers=1, heads=2, precision="fp32", attention="eager"))
BUDGET = 2**20


def setup(n: int = 80, mode: str = "static") -> TokenBucketDataset:
    table = small_meta(n)
    lengths = breakdown_table(table, SPEC).totals
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=3, multiple=8, mode=mode)  # type: ignore[arg-type]
    return TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=table, spec=SPEC, plan=plan)


TICK = 2**-6  # s; a power of two, so sums of ticks are exact


class FakeClock:
    """Each call advances one TICK, so a step between two calls lasts exactly one TICK."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += TICK
        return self.now


class FakeMemory:
    """Stands in for the CUDA peaks: each step's peak is ``factor`` x what the test says it predicts."""

    def __init__(self) -> None:
        self.factor, self.predicted, self.resets = 1.0, 0, 0

    def reset(self) -> None:
        self.resets += 1

    def read(self) -> tuple[int, int]:
        measured = int(self.predicted * self.factor)
        return measured, measured + 2**20


def batches(data: TokenBucketDataset, **collate_kwargs: Any) -> list[dict[str, Any]]:
    collate = BucketCollate(data, cost_model=COST, **collate_kwargs)
    return [collate([data[i] for i in idx]) for idx in data.sampler(seed=0)]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- step records --------------------------------------------------------------------------------


def test_monitor_step_records_latency_tokens_risk_and_measured_peak(tmp_path: Path) -> None:
    data = setup()
    memory = FakeMemory()
    monitor = BucketMonitor(data.plan, sinks=[tmp_path / "run.jsonl"], memory=memory, clock=FakeClock())
    seen = batches(data)
    for batch in seen:
        info = batch["info"]
        memory.predicted = info.predicted_peak_bytes
        with monitor.step(info, batch):
            pass
    monitor.close()
    log = events(tmp_path / "run.jsonl")
    steps = [e for e in log if e["event"] == "step"]
    assert next(e["event"] for e in log) == "start" and log[-1]["event"] == "summary"
    assert len(steps) == len(seen) and memory.resets == len(seen)
    for e, batch in zip(steps, seen, strict=True):
        info = batch["info"]
        assert e["bucket"] == info.bucket and (e["rows"], e["length"]) == info.shape
        assert e["latency_s"] == pytest.approx(TICK)
        assert e["tokens_per_s"] == pytest.approx(info.real_tokens / TICK)
        assert e["measured_bytes"] == info.predicted_peak_bytes and e["reserved_bytes"] == e["measured_bytes"] + 2**20
        assert e["risk"] == pytest.approx(info.predicted_peak_bytes / BUDGET)
    rows = monitor.summary()
    assert [r["bucket"] for r in rows] == sorted({b["info"].bucket for b in seen})
    for r in rows:
        mine = [b["info"] for b in seen if b["info"].bucket == r["bucket"]]
        assert r["steps"] == len(mine)
        assert r["latency_p50_s"] == pytest.approx(TICK, rel=0.005) and r["latency_max_s"] == pytest.approx(TICK)
        assert r["tokens_per_s"] == pytest.approx(sum(i.real_tokens for i in mine) / (TICK * len(mine)))
        assert r["predicted_peak_bytes"] == max(i.predicted_peak_bytes for i in mine)
        assert r["drift_ratio"] == pytest.approx(1.0, abs=1e-6) and r["ooms"] == 0
    # the report's aggregation of the log is the monitor's own
    assert summarize_events(log) == rows
    table = format_summary(rows)
    assert len(table.splitlines()) == len(rows) + 1


def test_monitor_hooks_without_a_context_manager_and_on_cpu_no_measurement() -> None:
    data = setup()
    got: list[dict[str, Any]] = []
    monitor = BucketMonitor(data.plan, sinks=[got.append], memory=None)
    batch = batches(data)[0]
    monitor.on_batch_start(batch["info"], batch)
    monitor.on_batch_end()
    step = next(e for e in got if e["event"] == "step")
    assert step["measured_bytes"] is None and step["latency_s"] > 0
    with pytest.raises(ConfigError, match="without on_batch_start"):
        monitor.on_batch_end()


def test_monitor_latency_percentiles_per_bucket() -> None:
    data = setup()
    batch = batches(data)[0]
    times = iter(np.cumsum([0.0, *[v for d in range(1, 21) for v in (d / 1000, 0.5)]]).tolist())
    monitor = BucketMonitor(data.plan, sinks=[], memory=None, clock=lambda: next(times))
    for _ in range(20):  # step d lasts d ms
        with monitor.step(batch["info"]):
            pass
    row = monitor.summary()[0]
    # NOTE [ Latency histogram ]: nearest-rank percentiles within 0.5 %, the maximum exact
    assert row["latency_max_s"] == pytest.approx(0.020, rel=1e-9)
    assert row["latency_p50_s"] == pytest.approx(0.010, rel=0.005)
    assert row["latency_p95_s"] == pytest.approx(0.019, rel=0.005)


# -- risk caught during batching -----------------------------------------------------------------


def test_collate_risky_batch_warns_with_keys_modalities_and_cameras(tmp_path: Path) -> None:
    data = setup()
    collate = BucketCollate(data, cost_model=COST, risk_threshold=0.2)
    risky = [
        b
        for b in data.sampler(seed=0)
        if data.plan.buckets[int(data.buckets[b[0]])].predicted_peak_bytes / BUDGET > 0.2
    ]
    assert risky, "the plan should fill its buckets above 0.2 of the budget"
    idx = risky[0]
    with pytest.warns(OOMRiskWarning, match=r"keys \['s\d{3}'") as caught:
        batch = collate([data[i] for i in idx])
    info = batch["info"]
    assert info.cameras is not None and set(info.cameras) <= {"camera0", "camera1"}
    assert sum(info.cameras.values()) == info.tokens["vision"]
    assert "camera0" in str(caught[0].message) and "vision" in str(caught[0].message)
    got: list[dict[str, Any]] = []
    monitor = BucketMonitor(data.plan, sinks=[got.append], memory=None, risk_threshold=0.2)
    with monitor.step(info, batch):
        pass
    risk = [e for e in got if e["event"] == "risk"]
    assert len(risk) == 1 and risk[0]["keys"] == list(info.keys) and risk[0]["cameras"] == info.cameras
    assert monitor.summary()[0]["risky_batches"] == 1
    with pytest.raises(OOMRiskError, match=f"bucket {info.bucket}"):
        BucketCollate(data, cost_model=COST, risk_threshold=0.2, on_risk="raise")([data[i] for i in idx])
    # under the default threshold (1.0) the same, planned, batch is not flagged
    assert BucketCollate(data, cost_model=COST)([data[i] for i in idx])["info"].cameras is None


@pytest.mark.parametrize("threshold", [0.5, 0.25])
def test_risk_split_sampler_parts_fit_and_cover_every_sample_once(threshold: float) -> None:
    data = setup()
    plan = data.plan
    sampler = RiskSplitSampler(data.sampler(seed=3), data, COST, risk_threshold=threshold)
    collate = BucketCollate(data, cost_model=COST, risk_threshold=threshold, on_risk="split")
    parts = list(sampler)
    assert len(parts) == len(sampler)
    assert any(static_split(plan, COST, k, threshold)[0] > 1 for k in range(len(plan.buckets)))
    seen: list[int] = []
    for idx in parts:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            info = collate([data[i] for i in idx])["info"]
        # a part is under the threshold, or a single sample that cannot be cut (and is reported)
        assert info.risk <= threshold or len(info.keys) == 1
        assert bool(caught) == (info.risk > threshold)
        seen += [i for i in idx if i < len(data)]
    assert sorted(seen) == list(range(len(data)))


def test_risk_split_sampler_ranks_stay_in_step_and_resume_mid_batch() -> None:
    data = setup()
    ranks = [
        RiskSplitSampler(data.sampler(seed=1, rank=r, world_size=3), data, COST, risk_threshold=0.3) for r in range(3)
    ]
    lists = [list(s) for s in ranks]
    assert len({len(x) for x in lists}) == 1
    for step in zip(*lists, strict=True):  # one bucket per step on every rank
        assert len({i - len(data) if i >= len(data) else int(data.buckets[i]) for b in step for i in b[:1]}) == 1
    flat = [i for x in lists for b in x for i in b if i < len(data)]
    assert sorted(flat) == list(range(len(data)))
    # resume harness: stop after k parts, restore into a fresh wrapper, the rest is the same
    full = lists[0]
    for k in (0, 1, 3, len(full) - 1, len(full)):
        s = RiskSplitSampler(data.sampler(seed=1, rank=0, world_size=3), data, COST, risk_threshold=0.3)
        it = iter(s)
        head = [next(it) for _ in range(k)]
        state = s.state_dict()
        fresh = RiskSplitSampler(data.sampler(seed=1, rank=0, world_size=3), data, COST, risk_threshold=0.3)
        fresh.load_state_dict(state)
        # saved again before a part is drawn (a checkpoint right after a resume): the same position
        again = RiskSplitSampler(data.sampler(seed=1, rank=0, world_size=3), data, COST, risk_threshold=0.3)
        again.load_state_dict(fresh.state_dict())
        assert head + list(fresh) == full and head + list(again) == full

    # a new epoch starts at its first part, whether the last one stopped mid-batch or was loaded there
    def make() -> RiskSplitSampler:
        return RiskSplitSampler(data.sampler(seed=1, rank=0, world_size=3), data, COST, risk_threshold=0.3)

    epoch1 = make()
    epoch1.set_epoch(1)
    full1 = list(epoch1)
    stopped = make()
    it = iter(stopped)
    next(it)
    assert stopped.state_dict()["part"] == 1  # mid-batch
    stopped.set_epoch(1)
    assert stopped.state_dict()["sampler"]["step"] == 0 and stopped.state_dict()["part"] == 0
    loaded = make()
    loaded.load_state_dict(
        {**epoch1.state_dict(), "sampler": {**epoch1.state_dict()["sampler"], "epoch": 0, "step": 0}, "part": 1}
    )
    loaded.set_epoch(1)
    assert list(stopped) == full1 and list(loaded) == full1
    with pytest.raises(ConfigError, match="should be an integer >= 0"):
        make().load_state_dict({"sampler": {**epoch1.state_dict()["sampler"], "step": -1}, "part": 0})


def test_risk_split_refuses_what_would_break_equal_steps() -> None:
    dyn = setup(mode="dynamic")
    with pytest.raises(ConfigError, match="different step counts"):
        RiskSplitSampler(
            dyn.sampler(world_size=2, rank=0, dynamic=(dyn.lengths, COST, BUDGET, 8)), dyn, COST, risk_threshold=0.5
        )
    data = setup()
    with pytest.raises(ConfigError, match="sync_buckets"):
        RiskSplitSampler(data.sampler(world_size=2, rank=0, sync_buckets=False), data, COST, risk_threshold=0.5)
    with pytest.raises(ConfigError, match="cost_model"):
        BucketCollate(data, on_risk="split")
    with pytest.raises(ConfigError, match="risk_threshold"):
        BucketCollate(data, risk_threshold=0)


def test_risk_split_sampler_dynamic_halves_until_each_part_fits() -> None:
    data = setup(mode="dynamic")
    inner = data.sampler(seed=0, dynamic=(data.lengths, COST, BUDGET, 8))
    sampler = RiskSplitSampler(inner, data, COST, risk_threshold=0.4)
    parts = list(sampler)
    assert len(parts) == len(sampler) > len(list(inner))
    for idx in parts:
        assert len(idx) == 1 or COST.memory(len(idx), int(data.lengths[idx].max())).total <= 0.4 * BUDGET
    assert sorted(i for p in parts for i in p) == list(range(len(data)))


# -- drift ---------------------------------------------------------------------------------------


def test_monitor_drift_warns_past_the_margin_rearms_and_suggests_a_factor() -> None:
    data = setup()
    memory = FakeMemory()
    got: list[dict[str, Any]] = []
    monitor = BucketMonitor(data.plan, sinks=[got.append], memory=memory, cost_model=COST, drift_margin=0.1)
    batch = batches(data)[0]
    info = batch["info"]
    memory.predicted = info.predicted_peak_bytes

    def step(factor: float) -> None:
        memory.factor = factor
        with monitor.step(info, batch):
            pass

    step(1.05)  # within the margin: quiet (filterwarnings=error would fail here otherwise)
    assert monitor.recalibration()["factor"] == pytest.approx(1.05)  # type: ignore[index]
    with pytest.warns(PlanDriftWarning, match="1.200x"):
        step(1.20)
    step(1.25)  # re-armed at 1.30: a steady offset does not warn every step
    with pytest.warns(PlanDriftWarning, match="1.350x"):
        step(1.35)
    drift = [e for e in got if e["event"] == "drift"]
    assert [round(e["ratio"], 2) for e in drift] == [1.2, 1.35]
    assert drift[-1]["suggested_factor"] == pytest.approx(1.35)
    rec = monitor.recalibration()
    assert rec is not None and rec["factor"] == pytest.approx(1.35)
    assert rec["budget_bytes"] == int(BUDGET / 1.35)
    sizes = rec["batch_sizes"]
    assert any(v["suggested"] < v["planned"] for v in sizes.values())
    for k, v in sizes.items():
        assert COST.memory(v["suggested"], data.plan.buckets[k].bound).total <= BUDGET / 1.35
    assert monitor.summary()[0]["drift_ratio"] == pytest.approx(1.35, rel=1e-6)


# -- the OOM guard -------------------------------------------------------------------------------


def tiny_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(HIDDEN, 2, 2 * HIDDEN, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    return model, torch.optim.SGD(model.parameters(), lr=1e-2)


def oom_loop(
    tmp_path: Path, policy: str, *, limit: int, num_workers: int = 0, adapt: bool = False
) -> tuple[list[int], BucketMonitor, int]:
    """An epoch of a real training loop whose "GPU" holds at most `limit` real tokens a step."""
    data = setup()
    model, opt = tiny_model()
    trained: list[int] = []

    def train_step(batch: dict[str, Any]) -> float:
        mask = batch["attention_mask"]
        if int(mask.sum()) > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake)")
        out = model(batch["tokens"], src_key_padding_mask=~mask)
        loss = ((out - batch["tokens"]) ** 2)[mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        trained.extend(int(i) for i in batch["index"][batch["row_mask"]])
        return loss.item()

    monitor = BucketMonitor(data.plan, sinks=[tmp_path / "run.jsonl"], memory=None, cost_model=COST, data=data)
    train = monitor.guard(train_step, policy=policy, adapt=adapt)
    loader = DataLoader(
        data,
        batch_sampler=data.sampler(seed=0),
        collate_fn=BucketCollate(data, cost_model=COST),
        num_workers=num_workers,
    )
    for batch in loader:
        train(batch)
    monitor.close()
    return trained, monitor, len(data)


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_guard_skip_every_sample_is_trained_or_in_the_replay_file(tmp_path: Path, num_workers: int) -> None:
    trained, monitor, n = oom_loop(tmp_path, "skip", limit=300, num_workers=num_workers)
    replay = read_replay(tmp_path / "run.replay.jsonl")
    replayed = [i for r in replay for i in r["indices"]]
    assert replay and trained  # some batches fit, some did not
    assert sorted(trained + replayed) == list(range(n))  # nothing lost, nothing twice
    ooms = [e for e in events(tmp_path / "run.jsonl") if e["event"] == "oom"]
    assert len(ooms) == len(replay) == sum(r["ooms"] for r in monitor.summary())
    assert all(e["policy"] == "skip" and e["keys"] and "vision" in e["tokens"] and e["cameras"] for e in ooms)
    assert {r["keys"][0] for r in replay} == {e["keys"][0] for e in ooms}


@pytest.mark.slow
def test_guard_split_ends_with_every_sample_trained(tmp_path: Path) -> None:
    trained, _monitor, n = oom_loop(tmp_path, "split", limit=300)
    assert sorted(trained) == list(range(n))
    assert not (tmp_path / "run.replay.jsonl").exists()
    ooms = [e for e in events(tmp_path / "run.jsonl") if e["event"] == "oom"]
    assert ooms and all(e["policy"] == "split" for e in ooms)


@pytest.mark.slow
def test_guard_split_down_to_one_sample_then_replay(tmp_path: Path) -> None:
    data = setup()
    longest = int(data.lengths.max())
    trained, _, n = oom_loop(tmp_path, "split", limit=longest - 1)  # the longest samples never fit
    replayed = [i for r in read_replay(tmp_path / "run.replay.jsonl") for i in r["indices"]]
    assert replayed and all(data.lengths[i] == longest for i in replayed)
    assert sorted(trained + replayed) == list(range(n))


def test_guard_frees_the_failed_attempt_before_the_retry(tmp_path: Path) -> None:
    import weakref

    data = setup()
    monitor = BucketMonitor(data.plan, sinks=[tmp_path / "run.jsonl"], memory=None, cost_model=COST, data=data)
    batch = next(b for b in batches(data) if int(b["row_mask"].sum()) > 2)
    attempts: list[weakref.ref[torch.Tensor]] = []
    alive_at_retry: list[bool] = []

    def step(b: dict[str, Any]) -> None:
        alive_at_retry.extend(ref() is not None for ref in attempts)
        activations = torch.empty(1000)  # what a real step holds when it runs out of memory
        attempts.append(weakref.ref(activations))
        if int(b["row_mask"].sum()) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")

    monitor.guard(step, policy="split")(batch)
    assert len(attempts) > 2 and not any(alive_at_retry)  # every retry began with the failures' tensors freed
    assert [e["event"] for e in events(tmp_path / "run.jsonl") if e["event"] == "oom"]
    monitor.close()


@pytest.mark.slow
def test_guard_adapt_lowers_the_batch_size_and_says_so(tmp_path: Path) -> None:
    with pytest.warns(OOMRiskWarning, match="parts of"):
        trained, monitor, n = oom_loop(tmp_path, "split", limit=300, adapt=True)
    assert sorted(trained) == list(range(n))
    log = events(tmp_path / "run.jsonl")
    adapts = [e for e in log if e["event"] == "adapt"]
    assert adapts and all(e["new_batch_size"] < e["old_batch_size"] for e in adapts)
    assert monitor.limits == {
        e["bucket"]: min(a["new_batch_size"] for a in adapts if a["bucket"] == e["bucket"]) for e in adapts
    }
    # once adapted, a bucket OOMs less often than without adaptation
    _, plain, _ = oom_loop(tmp_path / "plain", "split", limit=300)
    assert sum(r["ooms"] for r in monitor.summary()) < sum(r["ooms"] for r in plain.summary())


def test_guard_raise_records_then_reraises_and_other_errors_pass(tmp_path: Path) -> None:
    data = setup()
    monitor = BucketMonitor(data.plan, sinks=[tmp_path / "run.jsonl"], memory=None, data=data)
    batch = batches(data)[0]

    def oom(_: Any) -> None:
        raise RuntimeError("CUDA error: out of memory")  # the form older stacks raise

    with pytest.raises(RuntimeError, match="out of memory"):
        monitor.guard(oom)(batch)

    def bug(_: Any) -> None:
        raise KeyError("not an OOM")

    with pytest.raises(KeyError):
        monitor.guard(bug, policy="skip")(batch)
    monitor.close()
    log = events(tmp_path / "run.jsonl")
    ooms = [e for e in log if e["event"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["policy"] == "raise" and ooms[0]["keys"] == list(batch["info"].keys)
    assert not [e for e in log if e["event"] == "step"]  # failed steps are not timed as steps
    assert is_oom(torch.OutOfMemoryError("x")) and not is_oom(RuntimeError("shape mismatch"))
    with pytest.raises(ConfigError, match="replay"):
        BucketMonitor(data.plan, sinks=[]).guard(oom, policy="skip")


def test_split_batch_parts_are_exact_and_trimmed() -> None:
    data = setup()
    batch = max(batches(data), key=lambda b: len(b["info"].keys))
    info = batch["info"]
    parts = split_batch(batch, 2, cost_model=COST)
    assert sum(len(p["info"].keys) for p in parts) == len(info.keys) and len(parts) == 2
    for p in parts:
        pi = p["info"]
        assert p["tokens"].shape[:2] == pi.shape == (len(pi.keys), max(pi.lengths))
        assert pi.real_tokens == int(p["attention_mask"].sum())
        assert pi.predicted_peak_bytes == COST.memory(*pi.shape).total
        assert [data.key(int(i)) for i in p["index"]] == list(pi.keys)
    assert {k: sum(p["info"].tokens[k] for p in parts) for k in info.tokens} == info.tokens


# -- sinks ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_jsonl_lines_stay_valid_when_the_process_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    script = textwrap.dedent(f"""
        import itertools
        from tokenbucket.train.collate import BatchInfo
        from tokenbucket.monitor.hooks import BucketMonitor
        from tokenbucket.plan.buckets import Bucket, BucketPlan
        bucket = Bucket(bound=64, batch_size=4, samples=8, batches=2, tokens=500, padded_tokens=512,
                        predicted_peak_bytes=2**20, fill=0.5, padding_efficiency=0.97, step_seconds=0.0)
        plan = BucketPlan(mode="static", budget_bytes=2**21, buckets=(bucket,))
        monitor = BucketMonitor(plan, sinks=[{str(path)!r}], memory=None)
        monitor.sinks[0].flush_seconds = 0.001
        info = BatchInfo(bucket=0, shape=(4, 64), keys=("a", "b"), tokens={{"vision": 100}}, real_tokens=100,
                         padded_tokens=256, predicted_peak_bytes=2**20, risk=0.5)
        for i in itertools.count():
            with monitor.step(info):
                pass
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 200_000):
            time.sleep(0.05)
        assert proc.poll() is None, "the writer ended before it was killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    lines = path.read_bytes().split(b"\n")
    # NOTE [ Whole lines only ]: a kill between flushes leaves whole lines; a kill inside a write
    # (SIGKILL can stop a large write at a page boundary) may cut the last line, and only that one
    assert len(lines[-1]) < 4096  # empty, or the one line a kill cut inside a page-sized write
    parsed = [json.loads(line) for line in lines[:-1]]
    assert len(parsed) > 500 and parsed[0]["event"] == "start"
    assert [e["step"] for e in parsed[1:]] == list(range(len(parsed) - 1))  # in order, none missing


def test_logging_tensorboard_and_callable_sinks(caplog: pytest.LogCaptureFixture) -> None:
    data = setup()

    class Writer:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.scalars.append((tag, value, step))

    writer, calls = Writer(), []
    monitor = BucketMonitor(data.plan, sinks=[LoggingSink(), TensorBoardSink(writer=writer), calls.append], memory=None)
    batch = batches(data)[0]
    k = batch["info"].bucket
    with caplog.at_level(logging.DEBUG, logger="tokenbucket.monitor.hooks"):
        with monitor.step(batch["info"], batch):
            pass
    assert any(r.levelno == logging.DEBUG and f"bucket={k}" in r.getMessage() for r in caplog.records)
    tags = {t for t, _, _ in writer.scalars}
    assert {f"tokenbucket/bucket{k}/{n}" for n in ("latency_ms", "tokens_per_s", "risk", "predicted_gib")} == tags
    assert [e["event"] for e in calls] == ["start", "step"]


# -- state ---------------------------------------------------------------------------------------


def test_monitor_state_dict_round_trip_continues_the_aggregates(tmp_path: Path) -> None:
    data = setup()
    seen = batches(data)
    whole = BucketMonitor(data.plan, sinks=[], memory=None, clock=FakeClock())
    first = BucketMonitor(data.plan, sinks=[], memory=None, clock=FakeClock())
    for i, batch in enumerate(seen):
        with whole.step(batch["info"]):
            pass
        if i < len(seen) // 2:
            with first.step(batch["info"]):
                pass
    state = json.loads(json.dumps(first.state_dict()))  # it survives a JSON checkpoint
    second = BucketMonitor(data.plan, sinks=[], memory=None, clock=FakeClock())
    second.load_state_dict(state)
    for batch in seen[len(seen) // 2 :]:
        with second.step(batch["info"]):
            pass
    assert second.summary() == whole.summary() and second.step_count == len(seen)
    with pytest.raises(ConfigError, match="unexpected keys"):
        second.load_state_dict({**state, "extra": 1})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_monitor_on_cuda_times_with_events_and_measures_the_step_peak() -> None:
    data = setup()
    got: list[dict[str, Any]] = []
    monitor = BucketMonitor(data.plan, sinks=[got.append])  # "auto": CudaMemory
    batch = batches(data)[0]
    x = torch.zeros(4096, 4096, device="cuda")  # 64 MiB alive before the step
    with monitor.step(batch["info"], {"tokens": x}):
        y = x @ x  # +64 MiB during the step
        del y
    step = next(e for e in got if e["event"] == "step")
    assert step["measured_bytes"] >= 2 * 64 * 2**20 and step["reserved_bytes"] >= step["measured_bytes"]
    assert step["latency_s"] > 0
