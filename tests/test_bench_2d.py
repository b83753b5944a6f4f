"""The 2D benchmark's peer scoring (what the README's lhotse 2D rows rest on), without lhotse:
NeMo-style bins hold every sample, and a sampler's batches are priced per bin or per batch."""

from __future__ import annotations

import numpy as np
import pytest
from benchmarks import bench_2d

from tokenbucket import breakdown_table, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.buckets_2d import step_cost_2d
from tokenbucket.testing import mixture_tv
from tokenbucket.tokens.hf import token_spec_from_hf

BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture(scope="module")
def cost() -> StagedLengthModel:
    return StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM"))


@pytest.fixture(scope="module")
def workload(cost: StagedLengthModel) -> tuple[np.ndarray, np.ndarray]:
    config = cost.cost.config
    assert config is not None
    result = breakdown_table(mixture_tv(2000, seed=3), token_spec_from_hf(config))
    return result.totals.astype(np.int64), result.table.column("vision").to_numpy().astype(np.int64)


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
