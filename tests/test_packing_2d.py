"""Two-cap packing (NOTE [ Two-cap packed rows ]), balanced ranks (NOTE [ Balanced ranks ]) and the
2D dynamic mode (NOTE [ Two-dimensional dynamic batches ]): every row within both caps, every
batch within budget, every sample packed once or rejected with a reason, first-fit decreasing,
the balance bound, dynamic batches that fit."""

from __future__ import annotations

import numpy as np
import pytest

from tokenbucket import ConfigError, OversizeError, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.staged_packed import SampleLoads, StagedPackedModel
from tokenbucket.plan.buckets_2d import dynamic_batches_2d, sorted_oracle
from tokenbucket.plan.packing_2d import (
    EMPTY,
    _ffd_order,
    balance_steps,
    pack_rows_2d,
    plan_packing_2d,
    rank_imbalance,
)

BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture(scope="module")
def packed_model() -> StagedPackedModel:
    setup = TrainSetup(vision_checkpointing="full", backbone_checkpointing="full")
    return StagedPackedModel(
        StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup, gpu="H100-SXM"))
    )


def _samples(n: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text = int(rng.integers(1, 6000))
        if rng.random() < 0.4:
            out.append(Sample(text_tokens=text))
        else:
            side = int(rng.choice([224, 448, 896]))
            out.append(Sample.video(cameras=int(rng.integers(1, 4)), frames=int(rng.choice([1, 2, 4])), height=side,
                                    width=side, text_tokens=text // 20 + 1))  # fmt: skip
    return out


def test_pack_rows_2d_rows_within_both_caps_each_sample_once() -> None:
    rng = np.random.default_rng(0)
    lengths, patches = rng.integers(1, 100, 500), rng.integers(0, 400, 500)
    rows = pack_rows_2d(lengths, patches, 120, 500, pool=128, seed=3)
    members = np.concatenate(rows)
    assert sorted(members.tolist()) == list(range(500))  # every sample exactly once
    assert all(lengths[r].sum() <= 120 and patches[r].sum() <= 500 for r in rows)


def test_pack_rows_2d_first_fit_decreasing_each_sample_in_the_first_row_with_room() -> None:
    rng = np.random.default_rng(1)
    lengths, patches = rng.integers(1, 60, 200), rng.integers(0, 300, 200)
    rows = pack_rows_2d(lengths, patches, 100, 400, shuffle=False, pool=1000)
    row_of = {int(i): k for k, r in enumerate(rows) for i in r.tolist()}
    # replay in first-fit-decreasing order: no earlier row had room for both counts
    room_t, room_p = [100] * len(rows), [400] * len(rows)
    opened = 0
    for i in _ffd_order(lengths, patches, 100, 400).tolist():
        k = row_of[i]
        assert not any(room_t[j] >= lengths[i] and room_p[j] >= patches[i] for j in range(min(k, opened)))
        assert k <= opened  # a new row only when none open has room
        opened = max(opened, k + 1)
        room_t[k] -= int(lengths[i])
        room_p[k] -= int(patches[i])
    assert min(room_t) >= 0 and min(room_p) >= 0


def test_pack_rows_2d_over_a_cap_raises() -> None:
    with pytest.raises(ConfigError, match="over the row caps"):
        pack_rows_2d(np.array([5, 50]), np.array([0, 0]), 40, 10)


def test_plan_packing_2d_every_batch_within_budget_every_sample_packed_once(packed_model: StagedPackedModel) -> None:
    samples = _samples(600, 0)
    loads = packed_model.loads(samples)
    plan = plan_packing_2d(loads, packed_model, BUDGET, world_size=4)
    members = np.concatenate([r for b in plan.batches for r in b])
    assert sorted(members.tolist()) == list(range(600)) and not plan.rejected
    assert plan.row_tokens >= loads.llm_tokens.max() and plan.row_patches >= loads.patches.max()
    assert plan.predicted_peak_bytes <= BUDGET
    for batch in plan.batches:
        assert len(batch) <= plan.rows_per_batch
        for row in batch:  # each row within both caps
            assert loads.llm_tokens[row].sum() <= plan.row_tokens and loads.patches[row].sum() <= plan.row_patches
            assert loads.image_tokens[row].sum() <= plan.row_image_tokens
        every = np.concatenate(batch)  # the batch at its real members fits
        real = packed_model.memory(plan.rows_per_batch, plan.row_tokens, int(loads.patches[every].sum()),
                                   int(loads.image_tokens[every].sum()))  # fmt: skip
        assert real.total <= plan.predicted_peak_bytes <= BUDGET
    # every rank gets every step, each batch on exactly one rank
    assert all(len(s) == 4 for s in plan.steps)
    assert sorted(b for s in plan.steps for b in s if b != EMPTY) == list(range(len(plan.batches)))
    s = plan.summary(loads)
    assert s["rank_imbalance"] <= 0.03 and 0.9 < s["llm_efficiency"] <= 1


def test_packed_epoch_stays_above_the_packing_floor(packed_model: StagedPackedModel) -> None:
    # NOTE [ The packing floor ] (benchmarks/bench_packing_2d.py): a packed batch costs at least
    # its members' own FLOPs at saturated utilisation, so the epoch stays above
    # sum(FLOPs alone) / (W x peak x mfu), and on this mixture close to it
    loads = packed_model.loads(_samples(600, 1))
    plan = plan_packing_2d(loads, packed_model, BUDGET, world_size=4)
    st = packed_model.step_cost().step_time
    assert st is not None
    floor = float(loads.flops.sum()) / (st.peak_flops * st.mfu) / 4
    assert all(
        plan.seconds[k] >= float(loads.flops[np.concatenate(b)].sum()) / (st.peak_flops * st.mfu)
        for k, b in enumerate(plan.batches)
    )
    assert floor < plan.summary(loads)["predicted_epoch_seconds"] < 1.1 * floor


def test_plan_packing_2d_rejects_what_fits_not_even_alone_with_its_reason(packed_model: StagedPackedModel) -> None:
    huge = Sample(text_tokens=200_000)
    samples = [*_samples(50, 1), huge]
    loads = packed_model.loads(samples)
    with pytest.raises(OversizeError, match="do not fit the budget even alone"):
        plan_packing_2d(loads, packed_model, BUDGET)
    plan = plan_packing_2d(loads, packed_model, BUDGET, on_oversize="reject")
    assert list(plan.rejected) == [50] and "fits not even alone: 200,000 LLM tokens" in plan.rejected[50]
    assert sorted(np.concatenate([r for b in plan.batches for r in b]).tolist()) == list(range(50))


def test_plan_packing_2d_bad_arguments_name_themselves(packed_model: StagedPackedModel) -> None:
    loads = packed_model.loads(_samples(5, 2))
    with pytest.raises(ConfigError, match="world_size"):
        plan_packing_2d(loads, packed_model, BUDGET, world_size=0)
    with pytest.raises(ConfigError, match="rows_per_batch"):
        plan_packing_2d(loads, packed_model, BUDGET, rows_per_batch=(0,))
    with pytest.raises(ConfigError, match="on_oversize"):
        plan_packing_2d(loads, packed_model, BUDGET, on_oversize="drop")  # type: ignore[arg-type]


def test_balance_steps_within_the_bound_where_a_plain_split_is_not() -> None:
    # a case that could fail: every 8th batch is 10x slower, so a plain in-order split puts all
    # slow batches on rank 0 (imbalance ~ +400 %); sorted groups stay within W (t_max - t_min) / sum(t)
    w = 8
    seconds = np.where(np.arange(800) % w == 0, 10.0, 1.0) + np.random.default_rng(0).random(800) * 0.1
    plain = [list(range(k, k + w)) for k in range(0, 800, w)]
    assert rank_imbalance(plain, seconds)[1] > 3.0
    steps = balance_steps(seconds, w, seed=1, epoch=2)
    epoch, imbalance = rank_imbalance(steps, seconds)
    assert imbalance <= w * (seconds.max() - seconds.min()) / seconds.sum() and imbalance <= 0.03
    assert sorted(b for s in steps for b in s) == list(range(800))
    assert epoch >= seconds.sum() / w
    assert steps != balance_steps(seconds, w, seed=1, epoch=3)  # the step order changes with the epoch


def test_balance_steps_fills_the_last_step_with_empty_batches() -> None:
    steps = balance_steps(np.array([3.0, 2.0, 1.0]), 2, shuffle=False)
    assert steps == [[0, 1], [2, EMPTY]]
    assert rank_imbalance(steps, np.array([3.0, 2.0, 1.0]), empty_seconds=0.5) == pytest.approx((4.0, 4.0 / 3.25 - 1))


def test_dynamic_batches_2d_each_batch_fits_at_its_own_maxima(packed_model: StagedPackedModel) -> None:
    cost = packed_model.length_model
    loads = packed_model.loads(_samples(400, 3))
    lengths, vision = loads.llm_tokens, loads.image_tokens
    batches = dynamic_batches_2d(lengths, vision, cost, BUDGET, pool_batches=4, seed=0, epoch=1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(400))
    for b in batches:
        assert cost.memory(len(b), int(lengths[b].max()), int(vision[b].max())).total <= BUDGET
    again = dynamic_batches_2d(lengths, vision, cost, BUDGET, pool_batches=4, seed=0, epoch=1)
    assert [b.tolist() for b in again] == [b.tolist() for b in batches]  # a pure function of (seed, epoch)
    # the oracle sorts the whole epoch: never more batches than the pooled cut
    assert sorted_oracle(lengths, vision, cost, BUDGET, key="length")["batches"] <= len(batches)


def test_sample_loads_of_checks_shapes() -> None:
    loads = SampleLoads.of([10, 20], [0, 40], [1.0, 2.0])
    assert loads.image_tokens.tolist() == [0, 10] and loads.passes.tolist() == [0, 1]
    with pytest.raises(ConfigError, match="one value per sample"):
        SampleLoads.of([10], [0, 1], [1.0])
