"""The peer benchmark's scoring: what the README's peer table rests on, on a small workload."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from benchmarks import bench_peers

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes
from tokenbucket.testing import mixture_a


def test_score_counts_padding_fill_overruns_and_shapes(tmp_path: Path) -> None:
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    budget = gpu_budget_bytes("H100-SXM")
    lengths = np.array([100, 300, 200, 400])
    too_long = cost.max_batch(400, budget) + 1  # rows of 400 tokens past the budget
    path = tmp_path / "b.npz"
    np.savez(path, flat=np.array([0, 1, 2, 3]), shapes=np.array([[2, 300], [too_long, 400]]))
    r = bench_peers.score(lengths, path, cost, budget)
    assert r["batches"] == 2 and r["shapes"] == 2 and r["over_budget"] == 1
    assert r["padding_efficiency"] == pytest.approx(1000 / (600 + too_long * 400))
    fills = [cost.memory(2, 300).total / budget, cost.memory(too_long, 400).total / budget]
    assert r["mean_fill"] == pytest.approx(np.mean(fills))
    for flat in ([0, 1, 2, 2], [0, 1, 2]):  # a sample twice, a sample lost: the run is refused
        np.savez(path, flat=np.array(flat), shapes=np.array([[2, 300], [2, 400]]))
        with pytest.raises(AssertionError, match="exactly once"):
            bench_peers.score(lengths, path, cost, budget)


@pytest.mark.slow
def test_strategies_without_peers_run_and_hold_every_sample(tmp_path: Path) -> None:
    cost = CostModel(dataclasses.replace(ModelSpec.preset("design-24L-1024"), attention="flash"), "H100-SXM")
    budget = gpu_budget_bytes("H100-SXM")
    totals = breakdown_table(mixture_a(3000, seed=1), TokenSpec(patch=14)).totals
    lengths = totals[totals <= bench_peers._longest_fitting(cost, budget)]
    path = tmp_path / "lengths.npy"
    np.save(path, lengths)
    scored = {}
    for name in (
        "random, fixed batch (fits median)",
        "oracle: sort all, fill greedily",
        "tokenbucket static (≤ 32 shapes)",
    ):
        out = tmp_path / f"{len(scored)}.npz"
        timing = bench_peers.run_strategy(bench_peers.STRATEGIES[name], path, "flash", out)
        assert timing["build"] >= 0 and timing["iterate"] >= 0
        scored[name] = bench_peers.score(lengths, out, cost, budget)  # raises unless every sample once
    static, oracle = scored["tokenbucket static (≤ 32 shapes)"], scored["oracle: sort all, fill greedily"]
    assert static["over_budget"] == 0 and static["shapes"] <= 32 and oracle["over_budget"] == 0
    assert oracle["batches"] <= static["batches"]  # greedy fill of the sorted lengths is the fewest padded batches
    assert scored["random, fixed batch (fits median)"]["over_budget"] > 0  # the fixed size the tail breaks
