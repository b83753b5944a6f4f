"""The 2D dynamic mode (NOTE [ Two-dimensional dynamic batches ]): ``plan_buckets_2d(mode="dynamic")``
run by ``BucketBatchSampler`` with a ``DynamicFill2D`` epoch after epoch, each batch as large as
fits at its own longest and most image tokens, and collated to those maxima."""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from tests.test_2d_collate import BUDGET, MERGE2, WIDTH, TVItems, counts, tv_meta
from tokenbucket import ConfigError, StateError, TokenSpec
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets_2d import plan_buckets_2d
from tokenbucket.train.batch import Batch
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.modal import ModalityCollate
from tokenbucket.train.sampler import BucketBatchSampler, DynamicFill, DynamicFill2D

SPEC = TokenSpec(patch=14, merge=2, tubelet=2)
N = 96
POOL = 4
SEED = 3


@pytest.fixture(scope="module")
def cost() -> StagedLengthModel:
    return StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM"))


@pytest.fixture(scope="module")
def loads() -> tuple[np.ndarray, np.ndarray]:
    return counts(tv_meta(N), SPEC)


@pytest.fixture(scope="module")
def plan(cost: StagedLengthModel, loads: tuple[np.ndarray, np.ndarray]) -> BucketPlan:
    lengths, vision = loads
    plan = plan_buckets_2d(
        lengths, vision, cost, BUDGET, max_buckets=4, multiple=8, vision_multiple=4, mode="dynamic",
        pool_batches=POOL, seed=SEED,
    )  # fmt: skip
    assert plan.mode == "dynamic" and plan.two_d and len(plan.buckets) > 1
    return plan


def data_of(plan: BucketPlan, form: str = "frames") -> TokenBucketDataset:
    meta = tv_meta(N)
    return TokenBucketDataset(TVItems(meta, form), metadata=meta, spec=SPEC, plan=plan)


def sampler_of(data: TokenBucketDataset, cost: StagedLengthModel, **kwargs: Any) -> BucketBatchSampler:
    vision = data.breakdowns.column("vision").to_numpy()
    fill = DynamicFill2D(data.lengths, vision, cost, BUDGET, POOL)
    return data.sampler(dynamic=fill, **{"seed": SEED, **kwargs})


def rank_batches(data: TokenBucketDataset, cost: StagedLengthModel, world: int, epoch: int, seed: int = SEED) -> list:
    out = []
    for rank in range(world):
        s = sampler_of(data, cost, rank=rank, world_size=world, seed=seed)
        s.set_epoch(epoch)
        out.append([list(b) for b in s])
    return out


def test_2d_dynamic_plan_predicts_the_samplers_epoch_zero(plan: BucketPlan, cost: StagedLengthModel) -> None:
    data = data_of(plan)
    (batches,) = rank_batches(data, cost, 1, 0)
    per_bucket = np.bincount([int(data.buckets[b[0]]) for b in batches], minlength=len(plan.buckets))
    assert per_bucket.tolist() == [b.batches for b in plan.buckets]  # the plan simulated this very cut
    assert plan.summary()["over_budget_batches"] == 0
    lengths, vision = counts(tv_meta(N), SPEC)
    static = plan_buckets_2d(lengths, vision, cost, BUDGET, max_buckets=4, multiple=8, vision_multiple=4)
    assert [(b.bound, b.vision_bound) for b in static.buckets] == [(b.bound, b.vision_bound) for b in plan.buckets]
    # padded to its own maxima, never to the bounds, and no empty rows: at least as efficient
    assert plan.summary()["padding_efficiency"] >= static.summary()["padding_efficiency"]
    assert BucketPlan.from_json(plan.to_json()) == plan


def test_2d_dynamic_plain_sampler_cuts_as_the_plan_never_at_static_sizes(
    plan: BucketPlan, cost: StagedLengthModel
) -> None:
    # NOTE [ A dynamic plan's sampler ]: data.sampler() with no dynamic= is the plan's own cut
    data = data_of(plan)
    plain = data.sampler()
    assert [list(b) for b in plain] == [list(b) for b in sampler_of(data, cost)]  # the plan's seed and pools
    static = BucketBatchSampler(data.buckets, plan.batch_sizes.tolist(), plan_id=data.plan_id, seed=SEED)
    assert [list(b) for b in plain] != [list(b) for b in static]
    assert [list(b) for b in data.sampler(seed=SEED + 1)] != [list(b) for b in plain]  # a seed given wins
    bare = dataclasses.replace(plan, meta={})  # a plan with no record of its cost model
    with pytest.raises(ConfigError, match=r"records no cost model.*DynamicFill2D") as caught:
        data_of(bare).sampler()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_2d_dynamic_every_sample_once_equal_steps_each_batch_within_budget(
    plan: BucketPlan, cost: StagedLengthModel, world: int
) -> None:
    data = data_of(plan)
    lengths, vision = data.lengths, data.breakdowns.column("vision").to_numpy()
    ranks = rank_batches(data, cost, world, epoch=1)
    assert len({len(r) for r in ranks}) == 1  # every rank the same number of steps
    seen: list[int] = []
    for step in zip(*ranks, strict=True):
        real = [b for b in step if b[0] < N]
        assert len({int(data.buckets[b[0]]) for b in real}) <= 1  # sync_buckets: one bucket a step
        for b in step:
            if b[0] >= N:  # an empty batch pads the step: one empty row
                assert len(b) == 1
                continue
            seen += b
            # within budget at its own longest and most image tokens, and one more sample would not fit
            # a pool's tail may be short, so only the fit is an invariant
            assert cost.memory(len(b), int(lengths[b].max()), int(vision[b].max())).total <= BUDGET
    assert sorted(seen) == list(range(N))


def test_2d_dynamic_epochs_differ_by_seed_and_epoch_and_repeat_exactly(
    plan: BucketPlan, cost: StagedLengthModel
) -> None:
    data = data_of(plan)
    e1 = rank_batches(data, cost, 2, epoch=1)
    assert rank_batches(data, cost, 2, epoch=1) == e1  # a pure function of (seed, epoch, plan, world)
    assert rank_batches(data, cost, 2, epoch=2) != e1
    assert rank_batches(data, cost, 2, epoch=1, seed=SEED + 1) != e1


def test_2d_dynamic_resumes_exactly_at_start_middle_end(plan: BucketPlan, cost: StagedLengthModel) -> None:
    data = data_of(plan)
    for world, rank in ((1, 0), (4, 3)):
        full = sampler_of(data, cost, rank=rank, world_size=world)
        full.set_epoch(1)
        want = [list(b) for b in full]
        for stop in (0, len(want) // 2, len(want)):  # the resume harness
            sampler = sampler_of(data, cost, rank=rank, world_size=world)
            sampler.set_epoch(1)
            it = iter(sampler)
            head = [list(next(it)) for _ in range(stop)]
            resumed = sampler_of(data, cost, rank=rank, world_size=world)
            resumed.load_state_dict(sampler.state_dict())
            assert head + [list(b) for b in resumed] == want, f"resume at {stop} of {len(want)}"
    s = sampler_of(data, cost)
    assert s.mode == "dynamic_2d" and pickle.loads(pickle.dumps(s)).mode == "dynamic_2d"
    one_d = data.sampler(seed=SEED, dynamic=DynamicFill(data.lengths, cost, BUDGET, POOL))
    with pytest.raises(StateError, match=r"mode='dynamic_2d'"):
        s.load_state_dict(one_d.state_dict())  # a 1D fill cuts other batches


@pytest.mark.parametrize("workers", [0, 2])
def test_2d_dynamic_through_a_dataloader_resumes_exactly(
    plan: BucketPlan, cost: StagedLengthModel, workers: int
) -> None:
    data = data_of(plan)
    world, rank = 2, 1

    def loader(sampler: BucketBatchSampler) -> DataLoader[Batch]:
        collate = ModalityCollate(data, layout="patches", cost_model=cost)
        return DataLoader(data, batch_sampler=sampler, collate_fn=collate, num_workers=workers)

    sampler = sampler_of(data, cost, rank=rank, world_size=world)
    sampler.set_epoch(1)
    got, state = [], None
    for k, batch in enumerate(loader(sampler)):
        got.append(batch["index"].tolist())
        if k == 2:
            state = sampler.state_dict(after=batch["info"])  # NOTE [ Position through the workers ]
    assert state is not None and len(got) > 3
    resumed = sampler_of(data, cost, rank=rank, world_size=world)
    resumed.load_state_dict(state)
    assert got[:3] + [batch["index"].tolist() for batch in loader(resumed)] == got


@pytest.mark.parametrize("layout", ["stacked", "patches"])
def test_2d_dynamic_collate_pads_each_batch_to_its_own_maxima(
    plan: BucketPlan, cost: StagedLengthModel, layout: str
) -> None:
    data = data_of(plan)
    meta = tv_meta(N).to_pylist()
    vision = data.breakdowns.column("vision").to_numpy()
    collate = ModalityCollate(data, layout=layout, cost_model=cost)  # type: ignore[arg-type]
    shapes = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a batch priced at its bucket's bound, not its own, could warn
        batches = [b for r in range(2) for b in DataLoader(data, batch_sampler=sampler_of(data, cost, rank=r, world_size=2), collate_fn=collate)]  # fmt: skip
    for batch in batches:
        info, real = batch["info"], [int(i) for i in batch["index"] if i >= 0]
        if not real:
            assert batch["index"].tolist() == [-1] and info.shape == (1, 1)
            continue
        top_l, top_v = int(data.lengths[real].max()), int(vision[real].max())
        rows = [meta[i] for i in real]
        assert len(batch["index"]) == len(real)  # no empty rows in a dynamic batch
        assert info.shape == (len(real), top_l) and info.vision_bound == top_v
        assert info.predicted_peak_bytes == cost.memory(len(real), top_l, top_v).total <= BUDGET
        assert batch["input_ids"].shape == (len(real), max(r["text_tokens"] for r in rows))
        assert "patch_mask" not in batch  # no patch padding to a bound
        if not top_v:
            assert "pixel_values" not in batch
        elif layout == "patches":  # the real patches only, each image token merge² of them
            assert batch["pixel_values"].shape == (MERGE2 * int(vision[real].sum()), WIDTH)
        else:  # cameras, frames and sides padded to the batch's largest
            imaged = [r for r in rows if r["cameras"]]
            assert batch["pixel_values"].shape == (
                len(real),
                max(r["cameras"] for r in rows),
                max(r["frames"] for r in imaged),
                3,
                max(r["height"] for r in imaged),
                max(r["width"] for r in imaged),
            )
        shapes.add(info.shape)
    assert len(shapes) > len(plan.buckets)  # shapes of their own, not one a bucket


def test_2d_dynamic_refusals_are_one_line(plan: BucketPlan, cost: StagedLengthModel) -> None:
    lengths, vision = counts(tv_meta(N), SPEC)

    def refused(match: str, call: Any) -> None:
        with pytest.raises(ConfigError, match=match) as info:
            call()
        assert "\n" not in str(info.value)

    refused(r"mode should be 'static' or 'dynamic'.*plan_packing_2d", lambda: plan_buckets_2d(lengths, vision, cost, BUDGET, mode="packed"))  # fmt: skip
    refused(r"pool_batches=0", lambda: plan_buckets_2d(lengths, vision, cost, BUDGET, mode="dynamic", pool_batches=0))
    data = data_of(plan)
    refused(r"DynamicFill2D.*tuple of 3", lambda: data.sampler(dynamic=(data.lengths, cost, BUDGET)))  # type: ignore[arg-type]
    big = int(np.argmax(vision))
    small = DynamicFill2D(
        data.lengths, vision, cost, int(cost.memory(1, int(lengths[big]), int(vision[big])).total) - 1, POOL
    )
    refused(
        r"sample \d+ \([\d,]+ tokens, [\d,]+ image tokens\) fits not even alone",
        lambda: list(data.sampler(dynamic=small)),
    )
