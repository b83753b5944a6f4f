"""The 2D benchmark's checks (what the README's 2D table rests on), without lhotse: real samples
priced as the breakdown counts them, every bucket's heaviest member checked, NeMo-style bins hold
every sample, and a sampler's batches are priced per bin or per batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from benchmarks import bench_2d

from tokenbucket import breakdown_table, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.buckets_2d import plan_buckets_2d, step_cost_2d
from tokenbucket.testing import mixture_tv
from tokenbucket.tokens.hf import token_spec_from_hf

BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture(scope="module")
def cost() -> StagedLengthModel:
    return StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM"))


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return mixture_tv(2000, seed=3)


@pytest.fixture(scope="module")
def workload(cost: StagedLengthModel, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    config = cost.cost.config
    assert config is not None
    result = breakdown_table(table, token_spec_from_hf(config))
    return result.totals.astype(np.int64), result.table.column("vision").to_numpy().astype(np.int64)


def test_samples_of_prices_every_row_as_the_breakdown_counts_it(
    cost: StagedLengthModel, table: pa.Table, workload: tuple[np.ndarray, np.ndarray]
) -> None:
    lengths, vision = workload
    samples = bench_2d.samples_of(table)
    priced = np.array([cost.cost.sample_vision(s).llm_tokens for s in samples])
    text = np.array([s.text_tokens for s in samples])
    assert (priced == vision).all() and (priced + text == lengths).all()
    # the rows this is about: a Qwen camera of 2+ frames is one clip (frame pairs merged along
    # time, frames resized by the video processor), whose tokens its frames as stills miss: about
    # twice as many from 320 px up, fewer at 224 px (the video processor's larger minimum)
    clips = [i for i, s in enumerate(samples) if s.frames >= 2]
    assert clips and all(cost.cost.clips(samples[i]) for i in clips)
    for i in clips:
        s = samples[i]
        still = Sample.stills(cameras=s.videos, frames=s.frames, height=s.height, width=s.width)
        assert cost.cost.sample_vision(still).llm_tokens != vision[i]


@pytest.mark.slow
def test_exact_over_prices_real_clips_and_counts_overrun_batches(
    table: pa.Table, workload: tuple[np.ndarray, np.ndarray]
) -> None:
    # the benchmark's set-up: checkpointing on, so the planned batches are large
    setup = TrainSetup(vision_checkpointing="full", backbone_checkpointing="full")
    staged = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup, gpu="H100-SXM")
    lengths, vision = workload
    plan = plan_buckets_2d(lengths, vision, StagedLengthModel(staged), BUDGET, max_buckets=16, on_oversize="reject")
    samples = bench_2d.samples_of(table)
    # every real member, clips as clips, fits its bucket's batch (NOTE [ Two-dimensional buckets ])
    assert bench_2d.exact_over(plan, samples, lengths, vision, staged, BUDGET) == 0
    # the old pricing (each frame a still image) finds overruns that are not there
    stills = [
        Sample.stills(cameras=s.videos, frames=s.frames, height=s.height, width=s.width, text_tokens=s.text_tokens)
        if s.videos
        else s
        for s in samples
    ]
    assert bench_2d.exact_over(plan, stills, lengths, vision, staged, BUDGET) > 0
    # a real overrun is counted, in whole buckets' batches
    tight = bench_2d.exact_over(plan, samples, lengths, vision, staged, BUDGET // 2)
    assert 0 < tight <= plan.summary()["batches"]


def test_exact_over_prices_the_heaviest_member_not_the_one_with_most_text() -> None:
    setup = TrainSetup(vision_checkpointing="full", backbone_checkpointing="full")
    staged = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup, gpu="H100-SXM")
    # one bucket: a text-only sample with the most text, and a longer one that is mostly images
    samples = [Sample(text_tokens=2000), Sample(images=8, height=448, width=448, text_tokens=100)]
    lengths, vision = np.array([2000, 2148]), np.array([0, 2048])
    plan = plan_buckets_2d(lengths, vision, StagedLengthModel(staged), BUDGET, max_buckets=1)
    (bucket,) = plan.buckets
    heavy = staged.memory(bucket.batch_size, samples[1]).peak_bytes
    assert heavy > staged.memory(bucket.batch_size, samples[0]).peak_bytes
    assert bench_2d.exact_over(plan, samples, lengths, vision, staged, heavy) == 0
    assert bench_2d.exact_over(plan, samples, lengths, vision, staged, heavy - 1) == bucket.batches == 1


@pytest.mark.parametrize(("n_len", "n_vis"), [(8, 1), (4, 4), (2, 8)])
def test_split_bins_hold_every_sample_within_its_bins_corner(
    workload: tuple[np.ndarray, np.ndarray], n_len: int, n_vis: int
) -> None:
    lengths, vision = workload
    bins = bench_2d.split_bins(lengths, vision, n_len, n_vis)
    assert bins == sorted(bins) and len(set(bins)) == len(bins) and 1 < len(bins) <= n_len * n_vis
    where = np.array([bench_2d.first_bin(bins, int(length), int(v)) for length, v in zip(lengths, vision, strict=True)])
    assert (where < len(bins)).all()
    corners = np.array(bins)[where]
    assert (lengths <= corners[:, 0]).all() and (vision <= corners[:, 1]).all()
    assert len({top for top, _ in bins}) <= n_len  # the image-token cut is inside each length bin
    if n_vis > 1:  # sub-bins split text-only samples from image-heavy ones
        assert len({v for _, v in bins}) > 1
    assert bench_2d.first_bin(bins, int(lengths.max()) + 1, 0) == len(bins)


def test_score_prices_per_batch_or_per_bin_and_counts_overruns_and_losses(cost: StagedLengthModel) -> None:
    lengths = np.array([100, 900, 1000, 2000, 4000])
    vision = np.array([0, 0, 800, 1500, 3000])
    bins = [(1000, 0), (1000, 1000), (2000, 1500), (4000, 3000)]
    sizes = [cost.max_batch(top, BUDGET, vision=v) for top, v in bins]
    sizes[-1] += 1  # the last bin's size is past the budget
    batches = [np.array([0, 1]), np.array([2]), np.array([3]), np.array([4])]
    per_batch = bench_2d.score_batches(batches, lengths, vision, cost, BUDGET)
    expected = [(2, 900, 0), (1, 1000, 800), (1, 2000, 1500), (1, 4000, 3000)]
    assert per_batch["batches"] == 4 and per_batch["shapes"] == 4 and per_batch["over_budget"] == 0
    assert per_batch["predicted_epoch_seconds"] == pytest.approx(sum(step_cost_2d(cost, *e) for e in expected))
    assert per_batch["padding_efficiency"] == pytest.approx(lengths.sum() / (2 * 900 + 1000 + 2000 + 4000))
    per_bin = bench_2d.score_batches(batches, lengths, vision, cost, BUDGET, bins, sizes)
    padded = [(size, top, v) for size, (top, v) in zip(sizes, bins, strict=True)]
    assert per_bin["over_budget"] == 1 and per_bin["shapes"] == 4
    assert per_bin["predicted_epoch_seconds"] == pytest.approx(sum(step_cost_2d(cost, *p) for p in padded))
    assert per_bin["predicted_epoch_seconds"] > per_batch["predicted_epoch_seconds"]
    for lost_or_twice in (batches[:3], [*batches, np.array([0])]):
        with pytest.raises(AssertionError, match="exactly once"):
            bench_2d.score_batches(lost_or_twice, lengths, vision, cost, BUDGET)
