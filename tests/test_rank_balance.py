"""Rank balance (NOTE [ Rank balance ]): real gloo groups of 2 and 3 spawned CPU processes whose
ranks are unequal on purpose (bigger batches, longer steps, a rank that sleeps); rank 0's log
must carry what each rank measured and predicted on its own, the per-step imbalance and the
epoch imbalance; one process gathers nothing and logs as before."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from tests._dist import free_port, gloo_group, spawn
from tokenbucket import ConfigError, CostModel, ModelSpec, StateError
from tokenbucket.cli.main import main
from tokenbucket.monitor.hooks import BucketMonitor
from tokenbucket.monitor.ranks import RankBalance, format_rank_balance, rank_balance_of_events, step_imbalance
from tokenbucket.monitor.report import read_events
from tokenbucket.monitor.sinks import TensorBoardSink
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.train.batch import BatchInfo

# a GPU, so the monitor predicts seconds; large enough that a step's FLOPs, not its fixed cost, set them
COST = CostModel(ModelSpec(hidden=2048, layers=16, heads=16, precision="bf16"), "H100-SXM")
TICK = 2**-6  # s; a power of two, so the fake clocks' sums are exact
EPOCHS, STEPS = 2, 3
SLEEP_S = 0.04  # the sleeping rank's extra time a step


def make_plan() -> BucketPlan:
    return plan_buckets(np.array([1024, 1536, 2048] * 20), COST, 60 * 2**30, max_buckets=2, multiple=64)


def rows_of(rank: int, step: int) -> int:
    return (rank + 1) * (1 + step % 2)  # rank r's batches are r + 1 times rank 0's


def latency_of(rank: int, epoch: int, step: int) -> float:
    return TICK * (1 + rank * (1 + epoch)) * (1 + step)  # a later rank is slower, more so in epoch 1


def info_of(plan: BucketPlan, rank: int, epoch: int, step: int) -> BatchInfo:
    b, rows = plan.buckets[0], rows_of(rank, step)
    return BatchInfo(
        bucket=0, shape=(rows, b.bound), keys=(), tokens={}, real_tokens=rows * b.bound,
        padded_tokens=rows * b.bound, predicted_peak_bytes=b.predicted_peak_bytes, risk=0.5,
        position=(epoch, step + 1),
    )  # fmt: skip


def _worker(rank: int, world: int, port: int, out: str) -> None:
    calls = [0]
    real_all_gather = dist.all_gather

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real_all_gather(*args, **kwargs)

    dist.all_gather = counted  # type: ignore[assignment]
    plan, folder = make_plan(), Path(out)
    with gloo_group(rank, world, port):
        # fake clocks: each rank's step takes exactly latency_of(...)
        now = [0.0]
        with BucketMonitor(
            plan, sinks=[folder / f"exact-rank{rank}.jsonl"], cost_model=COST, memory=None, clock=lambda: now[0]
        ) as monitor:
            for epoch in range(EPOCHS):
                for step in range(STEPS):
                    with monitor.step(info_of(plan, rank, epoch, step)):
                        now[0] += latency_of(rank, epoch, step)
        exact_calls = calls[0]
        # real clocks: the last rank sleeps SLEEP_S a step, the others do not
        with BucketMonitor(plan, sinks=[folder / f"sleep-rank{rank}.jsonl"], cost_model=COST, memory=None) as slept:
            for step in range(STEPS):
                with slept.step(info_of(plan, 0, 0, step)):
                    if rank == world - 1:
                        time.sleep(SLEEP_S)
        # opted out: no collective at all (were there one, the ranks' counts below would differ from 0)
        with BucketMonitor(
            plan, sinks=[folder / f"off-rank{rank}.jsonl"], cost_model=COST, memory=None, rank_balance=False
        ) as off:
            before = calls[0]
            for step in range(STEPS):
                with off.step(info_of(plan, rank, 0, step)):
                    pass
        record = {
            "exact_calls": exact_calls,
            "off_calls": calls[0] - before,
            "balance": monitor.rank_balance(),
            "off_balance": off.rank_balance(),
            "state": monitor.state_dict()["ranks"],
        }
        (folder / f"rank{rank}.json").write_text(json.dumps(record))


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps(path: Path) -> list[dict[str, Any]]:
    return [e for e in events(path) if e["event"] == "step"]


def run_ranks(tmp_path: Path, world: int) -> list[dict[str, Any]]:
    spawn(_worker, args=(world, free_port(), str(tmp_path)), nprocs=world)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def check_exact(tmp_path: Path, world: int, records: list[dict[str, Any]]) -> None:
    own = [steps(tmp_path / f"exact-rank{r}.jsonl") for r in range(world)]  # what each rank measured itself
    log0 = steps(tmp_path / "exact-rank0.jsonl")
    assert len(log0) == EPOCHS * STEPS
    sums: dict[int, list[float]] = {e: [0.0, 0.0, 0.0, 0.0] for e in range(EPOCHS)}
    for i, event in enumerate(log0):
        epoch, step = divmod(i, STEPS)
        latency = [own[r][i]["latency_s"] for r in range(world)]
        predicted = [own[r][i]["predicted_s"] for r in range(world)]
        assert latency == [latency_of(r, epoch, step) for r in range(world)]  # the fake clocks, exactly
        assert predicted == [COST.step_seconds(rows_of(r, step), make_plan().buckets[0].bound) for r in range(world)]
        assert event["rank_imbalance_predicted"] > 0.2  # unequal on purpose: bigger batches on later ranks
        assert event["rank_latency_s"] == latency and event["rank_predicted_s"] == predicted
        assert event["epoch"] == epoch
        assert event["rank_imbalance_measured"] == pytest.approx(max(latency) * world / sum(latency) - 1, rel=1e-12)
        assert event["rank_imbalance_predicted"] == pytest.approx(
            max(predicted) * world / sum(predicted) - 1, rel=1e-12
        )
        assert event["rank_imbalance_measured"] > 0.3  # the ranks really are unequal
        for r in range(1, world):  # every rank logged the same gathered figures
            assert {k: own[r][i][k] for k in event if k.startswith("rank_")} == {
                k: v for k, v in event.items() if k.startswith("rank_")
            }
        s = sums[epoch]
        s[0] += max(latency)
        s[1] += sum(latency) / world
        s[2] += max(predicted)
        s[3] += sum(predicted) / world
    for r, record in enumerate(records):
        assert record["exact_calls"] == EPOCHS * STEPS  # one all-gather a step, no more
        balance = record["balance"]
        assert balance["world_size"] == world and balance["steps"] == EPOCHS * STEPS
        for epoch, row in enumerate(balance["epochs"]):
            s = sums[epoch]
            assert row["epoch"] == epoch and row["steps"] == STEPS
            assert row["imbalance_measured"] == pytest.approx(s[0] / s[1] - 1, rel=1e-12)
            assert row["imbalance_predicted"] == pytest.approx(s[2] / s[3] - 1, rel=1e-12)
        run = [sum(s[k] for s in sums.values()) for k in range(4)]
        assert balance["imbalance_measured"] == pytest.approx(run[0] / run[1] - 1, rel=1e-12)
        assert balance["imbalance_predicted"] == pytest.approx(run[2] / run[3] - 1, rel=1e-12)
        summary = events(tmp_path / f"exact-rank{r}.jsonl")[-1]
        assert summary["event"] == "summary" and summary["ranks"] == balance
    # the report reads the same figures back from rank 0's log
    assert rank_balance_of_events(events(tmp_path / "exact-rank0.jsonl")) == records[0]["balance"]


def check_sleep_and_off(tmp_path: Path, world: int, records: list[dict[str, Any]]) -> None:
    own = [steps(tmp_path / f"sleep-rank{r}.jsonl") for r in range(world)]
    for i, event in enumerate(own[0]):
        latency = [own[r][i]["latency_s"] for r in range(world)]
        assert event["rank_latency_s"] == latency  # what each rank measured, by rank
        assert latency[-1] >= SLEEP_S > 4 * max(latency[:-1])  # the sleeper, and only it, slept
        assert event["rank_imbalance_measured"] == pytest.approx(max(latency) * world / sum(latency) - 1, rel=1e-12)
        assert event["rank_imbalance_predicted"] == 0.0  # the same batch on every rank
        assert event["rank_imbalance_measured"] > (world - 1) * 0.8  # close to world - 1: one rank does all the work
    for r, record in enumerate(records):
        assert record["off_calls"] == 0 and record["off_balance"] is None
        assert not any(k.startswith("rank_") for e in steps(tmp_path / f"off-rank{r}.jsonl") for k in e)


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_rank_balance_gloo_ranks_log_each_ranks_times_and_the_imbalance(tmp_path: Path, world: int) -> None:
    records = run_ranks(tmp_path, world)
    check_exact(tmp_path, world, records)
    check_sleep_and_off(tmp_path, world, records)


def test_rank_balance_cli_report_prints_the_epoch_imbalance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    plan, now = make_plan(), [0.0]
    balance = RankBalance()
    with BucketMonitor(plan, sinks=[log], cost_model=COST, memory=None, clock=lambda: now[0]) as monitor:
        with monitor.step(info_of(plan, 0, 0, 0)):
            now[0] += TICK
    lines = [json.dumps(e) for e in events(log)]
    # a distributed step as a 2-rank monitor logs it: rank 1 took 3 ticks to rank 0's 1
    fields = balance.add([0.01, 0.03], [TICK, 3 * TICK], epoch=0)
    step = {**json.loads(lines[1]), **fields, "epoch": 0}
    log.write_text("\n".join([lines[0], json.dumps(step), *lines[2:]]) + "\n")
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "rank balance over 2 ranks, 1 steps: slowest rank / mean - 1 = +50.0 % measured, +50.0 % predicted" in out
    assert main(["report", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"]["epochs"][0]["imbalance_measured"] == pytest.approx(0.5)
    assert rank_balance_of_events(read_events(log).events) == balance.report()


# -- one process ---------------------------------------------------------------------------------


def test_rank_balance_one_process_gathers_nothing_and_logs_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("one process must not all-gather")

    monkeypatch.setattr(dist, "all_gather", refuse)
    plan, now = make_plan(), [0.0]
    with BucketMonitor(plan, sinks=[tmp_path / "run.jsonl"], cost_model=COST, memory=None, clock=lambda: now[0]) as m:
        for step in range(3):
            with m.step(info_of(plan, 0, 0, step)):
                now[0] += TICK
    assert m.rank_balance() is None
    logged = events(tmp_path / "run.jsonl")
    assert not any(k.startswith("rank_") or k == "epoch" for e in logged for k in e)
    assert "ranks" not in logged[-1]
    assert rank_balance_of_events(logged) is None and format_rank_balance(None) == ""


def test_rank_balance_bad_option_is_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^rank_balance should be True or False, but got rank_balance='yes'$"):
        BucketMonitor(make_plan(), sinks=[], rank_balance="yes")  # type: ignore[arg-type]


def test_rank_balance_state_round_trips_and_a_state_without_it_loads() -> None:
    plan = make_plan()
    first = BucketMonitor(plan, sinks=[], memory=None)
    first.ranks.add([0.1, 0.2], [1.0, 3.0], epoch=0)
    first.ranks.add([None, 0.2], [2.0, 2.0], epoch=1)
    state = json.loads(json.dumps(first.state_dict()))  # it survives a JSON checkpoint
    second = BucketMonitor(plan, sinks=[], memory=None)
    second.load_state_dict(state)
    assert second.rank_balance() == first.rank_balance()
    older = {k: v for k, v in state.items() if k != "ranks"}  # saved before the monitor kept it
    third = BucketMonitor(plan, sinks=[], memory=None)
    third.load_state_dict(older)
    assert third.rank_balance() is None
    with pytest.raises(StateError, match="unexpected keys in the rank balance state"):
        third.load_state_dict({**state, "ranks": {**state["ranks"], "extra": 1}})


def test_rank_balance_epoch_figure_weights_steps_by_length() -> None:
    b = RankBalance()
    b.add([None, None], [1.0, 3.0], epoch=0)  # +50 %
    b.add([None, None], [10.0, 10.0], epoch=0)  # balanced, and 10x longer
    report = b.report()
    assert report is not None
    # (3 + 10) / (2 + 10) - 1, not the mean of +50 % and 0 %
    assert report["imbalance_measured"] == pytest.approx(13 / 12 - 1)
    assert report["imbalance_predicted"] is None and report["epochs"][0]["predicted_steps"] == 0
    assert step_imbalance([0.0, 0.0]) is None and step_imbalance([2.0]) == 0.0


def test_rank_balance_of_events_bad_field_names_the_event() -> None:
    bad = {"event": "step", "rank_latency_s": [0.1, -1.0], "rank_predicted_s": [None, None]}
    with pytest.raises(ConfigError, match=r"^event 1: the step event's 'rank_latency_s' should be a list"):
        rank_balance_of_events([{"event": "start"}, bad])
    short = {"event": "step", "rank_latency_s": [0.1, 0.2], "rank_predicted_s": [0.1]}
    with pytest.raises(ConfigError, match=r"'rank_predicted_s' should be .*one per rank \(2\)"):
        rank_balance_of_events([short])


def test_rank_balance_tensorboard_sink_writes_the_step_imbalance() -> None:
    written: list[tuple[str, float, int]] = []

    class Writer:
        def add_scalar(self, tag: str, value: float, step: int, /) -> None:
            written.append((tag, value, step))

    step = {"event": "step", "step": 4, "bucket": 0, "latency_s": 0.1, "tokens_per_s": 1.0, "risk": 0.5}
    step |= {"predicted_bytes": 2**20, "measured_bytes": None, **RankBalance().add([None, 0.1], [0.1, 0.3], epoch=0)}
    TensorBoardSink(writer=Writer())(step)
    assert ("tokenbucket/rank_imbalance_measured", pytest.approx(0.5), 4) in written
    assert not any(tag.endswith("rank_imbalance_predicted") for tag, _, _ in written)  # no prediction on rank 0
