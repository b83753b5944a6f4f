"""The planner: every sample placed once, every batch within budget, sorted covering bounds,
merged histograms plan like one pass, and the objective beats the peers' bounds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes
from tokenbucket.plan.buckets import BucketPlan, LengthHistogram, OversizeError, check_plan, plan_buckets
from tokenbucket.testing import mixture_a

MODEL = ModelSpec.preset("design-24L-1024")
COST = CostModel(MODEL, "H100-SXM")
EAGER = CostModel(dataclasses.replace(MODEL, attention="eager"), "H100-SXM")
BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture(scope="module")
def lengths() -> np.ndarray:
    return breakdown_table(mixture_a(50_000, seed=1), TokenSpec(patch=14)).totals


def assert_plan_invariants(plan: BucketPlan, lengths: np.ndarray, cost: CostModel) -> None:
    bounds = plan.bounds
    assert np.all(np.diff(bounds) > 0)  # sorted, distinct
    placed = plan.assign(lengths)
    kept = lengths[placed >= 0]
    # every kept sample is in exactly one bucket: the first bound at or above it
    assert np.all(kept <= bounds[placed[placed >= 0]])
    lower = np.concatenate([[0], bounds[:-1]])[placed[placed >= 0]]
    assert np.all(kept > lower)
    assert kept.max() <= bounds[-1]  # bounds cover the maximum
    assert plan.summary()["samples"] + plan.summary()["rejected"] == len(lengths)
    assert sum(b.samples for b in plan.buckets) == len(kept)
    for b in plan.buckets:  # every bucket's batch at its bound fits
        assert cost.memory(b.batch_size, b.bound).total <= plan.budget_bytes
        assert b.batch_size == cost.max_batch(b.bound, plan.budget_bytes)


@pytest.mark.parametrize("cost", [COST, EAGER], ids=["flash", "eager"])
def test_plan_static_mixture_a_invariants_and_quality(lengths: np.ndarray, cost: CostModel) -> None:
    plan = plan_buckets(lengths, cost, BUDGET, max_buckets=32, on_oversize="reject")
    assert_plan_invariants(plan, lengths, cost)
    s = plan.summary()
    assert s["shapes"] <= 32 and s["over_budget_batches"] == 0
    assert s["padding_efficiency"] >= 0.97


def test_plan_dynamic_is_tighter_and_within_budget(lengths: np.ndarray) -> None:
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=32, mode="dynamic", on_oversize="reject")
    s = plan.summary()
    assert s["padding_efficiency"] >= 0.99 and s["over_budget_batches"] == 0 and s["shapes"] is None
    static = plan_buckets(lengths, COST, BUDGET, max_buckets=32, on_oversize="reject").summary()
    assert s["batches"] <= static["batches"]


def test_plan_beats_quantile_bounds_on_the_objective(lengths: np.ndarray) -> None:
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=16, on_oversize="reject")
    kept = lengths[lengths <= plan.bounds[-1]]
    # the peers' way: equal-count quantile bounds with the same cost model's batch sizes
    q = np.unique(np.quantile(kept, np.linspace(0, 1, 17)[1:], method="higher").astype(np.int64))
    sizes = [COST.max_batch(int(u), BUDGET) for u in q]
    check_plan(q.tolist(), sizes, COST, BUDGET)
    pos = np.searchsorted(q, kept, side="left")
    quantile_seconds = sum(
        -(-int((pos == k).sum()) // b) * COST.step_seconds(b, int(u))
        for k, (u, b) in enumerate(zip(q, sizes, strict=True))
    )
    assert plan.summary()["predicted_epoch_seconds"] < quantile_seconds


def test_plan_merged_histograms_give_the_same_plan(lengths: np.ndarray) -> None:
    parts = np.array_split(lengths, 5)
    merged = LengthHistogram.from_lengths(parts[0])
    for part in parts[1:]:
        merged = merged.merge(LengthHistogram.from_lengths(part))
    one_pass = plan_buckets(lengths, COST, BUDGET, on_oversize="reject")
    from_parts = plan_buckets(merged, COST, BUDGET, on_oversize="reject")
    assert one_pass == from_parts
    # a histogram from another engine (unordered, repeated values, empty rows) plans the same
    rng = np.random.default_rng(0)
    order = rng.permutation(len(merged.values))
    values = np.concatenate([merged.values[order], merged.values[:3], [77]])
    counts = np.concatenate([merged.counts[order] - np.isin(order, [0, 1, 2]), [1, 1, 1], [0]])
    shuffled = LengthHistogram.from_dict({"values": values.tolist(), "counts": counts.tolist()})
    assert shuffled == merged and plan_buckets(shuffled, COST, BUDGET, on_oversize="reject") == one_pass
    with pytest.raises(ConfigError, match="negative"):
        LengthHistogram.from_dict({"values": [5, 6], "counts": [1, -1]})


def test_plan_oversize_error_says_how_many_the_largest_and_what_helps(lengths: np.ndarray) -> None:
    with pytest.raises(OversizeError) as info:
        plan_buckets(lengths, COST, BUDGET)
    message = str(info.value)
    n_over = int((lengths > 93_500).sum())
    assert f"{n_over:,} sample(s)" in message
    assert f"{int(lengths.max()):,} tokens" in message and "GiB" in message
    assert "checkpointing" in message and "fewer frames" in message.lower() and "bigger GPU" in message


def test_plan_reject_records_the_oversize(lengths: np.ndarray) -> None:
    plan = plan_buckets(lengths, COST, BUDGET, on_oversize="reject")
    assert plan.oversize["count"] == int((plan.assign(lengths) < 0).sum()) > 0
    assert plan.oversize["largest"] == int(lengths.max())


def test_plan_round_trips_through_json(lengths: np.ndarray) -> None:
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=8, on_oversize="reject", meta={"model": "design"})
    again = BucketPlan.from_json(plan.to_json())
    assert again == plan
    with pytest.raises(ConfigError, match="format"):
        BucketPlan.from_dict({**plan.to_dict(), "format": 99})


def test_plan_hand_plan_is_checked_against_the_cost_model() -> None:
    ok = [COST.max_batch(u, BUDGET) for u in (1024, 8192)]
    check_plan([1024, 8192], ok, COST, BUDGET)
    too_big = rf"bucket 1 \(batch {ok[1] + 1} x bound 8,192\).*largest batch that fits at this bound is {ok[1]}"
    with pytest.raises(ConfigError, match=too_big):
        check_plan([1024, 8192], [ok[0], ok[1] + 1], COST, BUDGET)
    with pytest.raises(ConfigError, match="strictly increasing"):
        check_plan([8192, 1024], [1, 1], COST, BUDGET)
    with pytest.raises(ConfigError, match="one batch size per bound"):
        check_plan([1024], [1, 2], COST, BUDGET)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_buckets": 0}, "max_buckets"),
        ({"mode": "sorted"}, "mode"),
        ({"on_oversize": "drop"}, "on_oversize"),
    ],
)
def test_plan_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_buckets([100, 200], COST, BUDGET, **kwargs)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 120_000), min_size=1, max_size=400),
    k=st.integers(1, 12),
    mode=st.sampled_from(["static", "dynamic"]),
    eager=st.booleans(),
)
def test_plan_invariants_hold_on_random_length_distributions(
    lengths: list[int], k: int, mode: str, eager: bool
) -> None:
    cost = EAGER if eager else COST
    arr = np.asarray(lengths, dtype=np.int64)
    plan = plan_buckets(arr, cost, BUDGET, max_buckets=k, mode=mode, on_oversize="reject")  # type: ignore[arg-type]
    if not plan.buckets:  # everything oversize
        assert plan.oversize["count"] == len(arr)
        return
    assert len(plan.buckets) <= k
    assert_plan_invariants(plan, arr, cost)
    assert plan.summary()["over_budget_batches"] == 0


def test_plan_from_bounds_predicts_like_the_planner(lengths: np.ndarray) -> None:
    from tokenbucket.plan.buckets import plan_from_bounds

    auto = plan_buckets(lengths, COST, BUDGET, max_buckets=6, on_oversize="reject")
    by_hand = plan_from_bounds(auto.bounds.tolist(), auto.batch_sizes.tolist(), lengths, COST, BUDGET)
    assert by_hand.buckets == auto.buckets
    assert by_hand.oversize["count"] == auto.oversize["count"]  # above the last bound
    assert by_hand.oversize["longest_fitting"] == auto.bounds[-1]
    with pytest.raises(ConfigError, match="over the budget"):
        plan_from_bounds([2048], [10_000], lengths, COST, BUDGET)
    with pytest.raises(ConfigError, match="mode='packed'"):
        plan_from_bounds([2048], [4], lengths, COST, BUDGET, mode="packed")  # type: ignore[arg-type]


def test_plan_every_mode_checks_the_budget_and_reports_when_nothing_fits() -> None:
    huge = [10**6, 2 * 10**6]
    for mode in ("static", "dynamic", "packed"):
        plan = plan_buckets(huge, COST, BUDGET, mode=mode, on_oversize="reject")  # type: ignore[arg-type]
        assert plan.buckets == () and plan.oversize["count"] == 2 and plan.oversize["largest"] == 2 * 10**6
        with pytest.raises(ConfigError, match="budget_bytes"):
            plan_buckets([100], COST, 0, mode=mode)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="multiple"):
            plan_buckets([100], COST, BUDGET, mode=mode, multiple=-64)  # type: ignore[arg-type]
