"""BucketBatchSampler: coverage and equal steps on real gloo process groups, exact resume with
torchdata's StatefulDataLoader, determinism across processes, and property tests."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from tests._dist import free_port, spawn
from tokenbucket import ConfigError, CostModel, ModelSpec, StateError, TokenSpec, breakdown_table, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.buckets_2d import plan_buckets_2d
from tokenbucket.testing import mixture_a, mixture_tv
from tokenbucket.tokens.hf import token_spec_from_hf
from tokenbucket.train.sampler import BucketBatchSampler, epoch_steps, plan_id_of

PLAN_ID = plan_id_of("test")


def mixture_buckets(n: int = 3000, dims: int = 1) -> tuple[np.ndarray, list[int]]:
    """Buckets of a planned workload: 1D (mixture A, a block model) or 2D (mixture TV, Qwen2-VL-2B's
    staged model, buckets bounding length and image tokens: NOTE [ Two-dimensional buckets ])."""
    if dims == 2:
        staged = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM")
        assert staged.config is not None
        result = breakdown_table(mixture_tv(n, seed=11), token_spec_from_hf(staged.config))
        vision = result.table.column("vision").to_numpy()
        plan = plan_buckets_2d(
            result.totals, vision, StagedLengthModel(staged), gpu_budget_bytes("H100-SXM"), max_buckets=12,
            on_oversize="reject",
        )  # fmt: skip
        assert plan.two_d and len({b.bound for b in plan.buckets}) < len(plan.buckets)  # some band has 2+ levels
        return plan.assign(result.totals, vision), plan.batch_sizes.tolist()
    lengths = breakdown_table(mixture_a(n, seed=11), TokenSpec(patch=14)).totals
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    plan = plan_buckets(lengths, cost, gpu_budget_bytes("H100-SXM"), max_buckets=12, on_oversize="reject")
    return plan.assign(lengths), plan.batch_sizes.tolist()


class Indices(Dataset[int]):
    """Returns the index itself (empty rows, >= len, included), so batches can be compared."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _ddp_worker(
    rank: int, world: int, port: int, out: str, drop_last: bool, sync: bool, before: bool, dims: int
) -> None:
    buckets, sizes = mixture_buckets(dims=dims)

    def build() -> BucketBatchSampler:
        return BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, seed=3, drop_last=drop_last, sync_buckets=sync)

    early = build() if before else None  # built before the process group, as user code often is
    if early is not None:
        assert (early.rank, early.world_size) == (0, 1)  # no group yet
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        sampler = early if early is not None else build()
        assert (sampler.rank, sampler.world_size) == (rank, world)  # taken from the process group, now
        epochs = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            loader = DataLoader(Indices(len(buckets)), batch_sampler=sampler, collate_fn=list)
            epochs.append([list(b) for b in loader])
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"epochs": epochs, "dropped": sampler.dropped})
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


# world sizes 1-4 with the defaults; drop_last and unsynchronised buckets at 2 and 3 ranks (CI time);
# a sampler built before the process group at 2 and 3 ranks
@pytest.mark.parametrize(
    ("world", "drop_last", "sync", "before", "dims"),
    [
        (1, False, True, False, 1),
        (2, False, True, False, 1),
        (3, False, True, False, 1),
        (4, False, True, False, 1),
        (2, True, True, False, 1),
        (3, True, True, False, 1),
        (2, False, False, False, 1),
        (3, False, False, False, 1),
        (2, False, True, True, 1),  # the sampler built before init_process_group (NOTE [ Rank at iteration ])
        (3, True, True, True, 1),
        # 2D plans (NOTE [ Two-dimensional buckets ]): defaults, drop_last, unsynchronised buckets
        (2, False, True, False, 2),
        (3, True, True, False, 2),
        (3, False, False, False, 2),
    ],
)
@pytest.mark.slow
def test_sampler_ddp_gloo_every_sample_once_and_equal_steps(
    tmp_path: Path, world: int, drop_last: bool, sync: bool, before: bool, dims: int
) -> None:
    out = tmp_path / "out.json"
    spawn(_ddp_worker, args=(world, free_port(), str(out), drop_last, sync, before, dims), nprocs=world)
    ranks = json.loads(out.read_text())
    buckets, _ = mixture_buckets(dims=dims)
    n = len(buckets)
    expected = set(np.flatnonzero(buckets >= 0).tolist())
    for epoch in (0, 1):
        per_rank = [r["epochs"][epoch] for r in ranks]
        assert len({len(b) for b in per_rank}) == 1  # the same number of steps on every rank
        real = [i for batches in per_rank for b in batches for i in b if i < n]
        assert len(real) == len(set(real))  # no sample twice
        dropped = ranks[0]["dropped"]
        assert len(real) + dropped == len(expected)
        assert set(real) <= expected
        if not drop_last:
            assert set(real) == expected and dropped == 0
        if sync:  # all ranks' batches at a step come from one bucket
            for step in zip(*per_rank, strict=True):
                kinds = {int(buckets[i]) if i < n else i - n for b in step for i in b}
                assert len(kinds) == 1
    # different epochs, different orders
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]


class _Loader:
    """Batches of one uninterrupted StatefulDataLoader run, and resumed runs from a save point."""

    def __init__(self, workers: int, dims: int = 1) -> None:
        self.buckets, self.sizes = mixture_buckets(1500, dims)
        self.workers = workers

    def make(self) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        sampler = BucketBatchSampler(self.buckets, self.sizes, plan_id=PLAN_ID, seed=5)
        return StatefulDataLoader(
            Indices(len(self.buckets)), batch_sampler=sampler, num_workers=self.workers, collate_fn=list
        )


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "dims"), [(0, 1), (2, 1), (0, 2), (2, 2)])
def test_sampler_resume_with_stateful_dataloader_is_exact(workers: int, dims: int) -> None:
    harness = _Loader(workers, dims)
    full = [list(b) for b in harness.make()]
    total = len(full)
    for stop in (0, total // 2, total):
        loader = harness.make()
        it = iter(loader)
        head = [list(next(it)) for _ in range(stop)]
        state = loader.state_dict()
        del it, loader
        resumed = harness.make()
        resumed.load_state_dict(state)
        tail = [list(b) for b in resumed]
        assert head + tail == full, f"resume at step {stop} of {total}"
    # a second save and resume within the same epoch
    loader = harness.make()
    it = iter(loader)
    first = [list(next(it)) for _ in range(3)]
    state = loader.state_dict()
    loader2 = harness.make()
    loader2.load_state_dict(state)
    it2 = iter(loader2)
    second = [list(next(it2)) for _ in range(4)]
    state2 = loader2.state_dict()
    loader3 = harness.make()
    loader3.load_state_dict(state2)
    assert first + second + [list(b) for b in loader3] == full


def test_sampler_refuses_a_resume_that_cannot_continue_exactly() -> None:
    buckets, sizes = mixture_buckets(500)
    state = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, world_size=2, rank=0).state_dict()
    with pytest.raises(ConfigError, match="world_size=2 but this sampler has world_size=4"):
        BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, world_size=4, rank=0).load_state_dict(state)
    with pytest.raises(ConfigError, match="manifest changed"):
        BucketBatchSampler(buckets, sizes, plan_id=plan_id_of("other"), world_size=2, rank=0).load_state_dict(state)
    with pytest.raises(ConfigError, match="unexpected keys"):
        BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, world_size=2, rank=0).load_state_dict({**state, "x": 1})
    with pytest.raises(StateError, match="'step' should be an integer >= 0, but got -1"):
        BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, world_size=2, rank=0).load_state_dict({**state, "step": -1})


@pytest.mark.parametrize(
    "change",
    [{"step": 2.7}, {"step": "3"}, {"step": True}, {"epoch": None}, {"epoch": 1.0}, {"step": None}],
    ids=["step-2.7", "step-str", "step-bool", "epoch-none", "epoch-float", "step-none"],
)
def test_sampler_resume_refuses_a_position_that_is_not_a_count(change: dict[str, object]) -> None:
    buckets, sizes = mixture_buckets(500)
    saved = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID)
    it = iter(saved)
    for _ in range(3):
        next(it)
    state = {**saved.state_dict(), **change}
    fresh = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID)
    ((key, value),) = change.items()
    with pytest.raises(StateError, match=f"'{key}' should be an integer >= 0, but got {re.escape(repr(value))}"):
        fresh.load_state_dict(state)
    assert (fresh.epoch, fresh.step) == (0, 0)  # nothing half-loaded
    assert sum(len(b) for b in fresh) == int((buckets >= 0).sum())  # and the fresh epoch still has every sample


@pytest.mark.parametrize("drop", ["epoch", "step", "plan_id"])
def test_sampler_resume_refuses_a_state_missing_a_key(drop: str) -> None:
    buckets, sizes = mixture_buckets(500)
    state = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID).state_dict()
    del state[drop]
    with pytest.raises(StateError, match=f"has no '{drop}'"):
        BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID).load_state_dict(state)


def test_dynamic_sampler_names_a_sample_its_cost_model_cannot_fit() -> None:
    # a plan made for one model, batches cut with a bigger one: the longest samples fit not even alone
    lengths = breakdown_table(mixture_a(400, seed=3), TokenSpec(patch=56)).totals
    small = CostModel(ModelSpec(hidden=32, layers=2, heads=4, precision="fp32", attention="eager"))
    big = CostModel(ModelSpec(hidden=64, layers=8, heads=4, precision="fp32", attention="eager"))
    budget = 2 * small.memory(1, int(lengths.max())).total
    plan = plan_buckets(lengths, small, budget, max_buckets=4, mode="dynamic", multiple=8)
    assert big.memory(1, int(lengths.max())).total > budget
    sampler = BucketBatchSampler(
        plan.assign(lengths), plan.batch_sizes.tolist(), plan_id=PLAN_ID, dynamic=(lengths, big, budget, 4)
    )
    with pytest.raises(ConfigError, match=r"sample \d+ \([\d,]+ tokens\) fits not even alone"):
        list(sampler)  # never an empty batch


_SCRIPT = """
import json, sys
from tests.test_sampler import mixture_buckets, PLAN_ID
from tokenbucket.train.sampler import BucketBatchSampler
b, s = mixture_buckets(800)
sampler = BucketBatchSampler(b, s, plan_id=PLAN_ID, seed=9, rank=1, world_size=2)
sampler.set_epoch(int(sys.argv[1]))
print(json.dumps(list(sampler)))
"""


@pytest.mark.slow
def test_sampler_same_seed_and_epoch_same_batches_in_two_processes() -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "src")])}

    def run(epoch: int) -> Any:
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(epoch)],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env=env,
            timeout=120,
        )
        return json.loads(proc.stdout)

    assert run(4) == run(4)
    assert run(4) != run(5)


def test_sampler_pickles_and_len_is_exact() -> None:
    buckets, sizes = mixture_buckets(600)
    s = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, world_size=3, rank=2)
    again = pickle.loads(pickle.dumps(s))
    assert list(again) == list(s)
    assert len(s) == len(list(s))


def test_sampler_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="rank should be in"):
        BucketBatchSampler([0], [1], plan_id=PLAN_ID, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="plan_id"):
        BucketBatchSampler([0], [1], plan_id="x")
    with pytest.raises(ConfigError, match="has no batch size"):
        BucketBatchSampler([0, 3], [1], plan_id=PLAN_ID)
    with pytest.raises(ConfigError, match=r"batch_sizes\[0\]=0"):
        BucketBatchSampler([0], [0], plan_id=PLAN_ID)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    sizes=st.lists(st.integers(1, 9), min_size=6, max_size=6),
    world=st.integers(1, 5),
    sync=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sampler_coverage_and_equal_steps_properties(
    counts: list[int], sizes: list[int], world: int, sync: bool, drop_last: bool, seed: int
) -> None:
    buckets = np.repeat(np.arange(len(counts)), counts)
    buckets = buckets[np.random.default_rng(seed).permutation(len(buckets))]
    n = len(buckets)
    epoch = epoch_steps(
        buckets,
        sizes[: len(counts)],
        seed=seed,
        epoch=0,
        plan_id=PLAN_ID,
        world_size=world,
        sync_buckets=sync,
        drop_last=drop_last,
    )
    dropped = epoch.dropped
    steps = [[np.array(epoch.batch(s, r)) for r in range(world)] for s in range(len(epoch))]
    assert epoch.steps.shape == (len(epoch), world)  # every rank has a batch at every step
    real = [i for step in steps for b in step for i in b.tolist() if i < n]
    assert len(real) == len(set(real))
    assert len(real) + dropped == n
    if not drop_last:
        assert dropped == 0
    for step in steps:
        for b in step:
            assert 1 <= len(b)
            ks = {int(buckets[i]) if i < n else i - n for i in b.tolist()}
            assert len(ks) == 1 and len(b) <= sizes[ks.pop()]
        if sync:
            assert len({int(buckets[i]) if i < n else i - n for b in step for i in b.tolist()}) == 1


def test_sampler_torch_dataloader_round_trip_with_persistent_workers() -> None:
    buckets, sizes = mixture_buckets(400)
    sampler = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID)
    loader = DataLoader(
        Indices(len(buckets)),
        batch_sampler=sampler,
        num_workers=2,
        persistent_workers=True,
        collate_fn=lambda b: torch.tensor(b),
    )
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        got = sorted(int(i) for batch in loader for i in batch if int(i) < len(buckets))
        assert got == np.flatnonzero(buckets >= 0).tolist()


def test_sampler_from_manifest_static_and_dynamic(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tokenbucket.plan.manifest import build_manifest

    src = tmp_path / "meta.parquet"
    pq.write_table(mixture_a(3000, seed=12), src)
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    budget = gpu_budget_bytes("H100-SXM")
    for mode in ("static", "dynamic"):
        m = build_manifest(
            src,
            TokenSpec(patch=14),
            cost,
            tmp_path / f"{mode}.parquet",
            budget_bytes=budget,
            mode=mode,
            on_oversize="reject",
        )
        sampler = BucketBatchSampler.from_manifest(m, cost_model=cost, world_size=2, rank=0)
        totals = m.table.column("total").fill_null(0).to_numpy()
        n = len(totals)
        for batch in sampler:
            real = [i for i in batch if i < n]
            if real:  # every batch, padded to its longest (dynamic) or to its bound (static), fits
                length = max(int(totals[i]) for i in real)
                assert cost.memory(len(batch), length).total <= budget
        assert sampler.plan_id == m.content_hash
    with pytest.raises(ConfigError, match="needs cost_model"):
        BucketBatchSampler.from_manifest(m)


def test_sampler_rank_and_world_are_read_when_needed_explicit_ones_win() -> None:
    buckets, sizes = mixture_buckets(500)
    lazy = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID)
    alone = [list(b) for b in lazy]  # no process group: rank 0 of 1
    lazy.world_size, lazy.rank = 2, 1  # as if a group of 2 had come up since
    lazy.set_epoch(0)  # the same epoch again (without it, a second pass is the next epoch)
    second = [list(b) for b in lazy]
    first = [list(b) for b in BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, rank=0, world_size=2)]
    assert len(second) == len(first) == len(lazy) < len(alone)  # the epoch was redrawn for 2 ranks
    n = len(buckets)
    seen = [i for b in first + second for i in b if i < n]
    assert sorted(seen) == sorted(i for b in alone for i in b if i < n)  # every sample once across the 2
    with pytest.raises(ConfigError, match=r"rank should be in \[0, world_size=2\), but got rank=2"):
        BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="world_size should be a positive integer, but got world_size=0"):
        BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, world_size=0)


def _ddp_resume_worker(rank: int, world: int, port: int, out: str, dims: int, workers: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        buckets, sizes = mixture_buckets(600, dims)

        def run(stop: tuple[int, int] | None, state: dict[str, Any] | None) -> tuple[list[list[int]], Any]:
            """Epochs 0 and 1 through a DataLoader; ``stop`` = (epoch, step) to save the sampler's state at
            (with workers, which draw ahead, the state counts the batches handed out: NOTE [ Who draws the
            batches ])."""
            sampler = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, seed=7)
            first = 0
            if state is not None:
                sampler.load_state_dict(state)
                first = sampler.epoch
            steps: list[list[int]] = []
            for epoch in range(first, 2):
                sampler.set_epoch(epoch)
                loader = DataLoader(Indices(len(buckets)), batch_sampler=sampler, collate_fn=list, num_workers=workers)
                for k, batch in enumerate(loader, start=1):
                    steps.append(batch)
                    if stop == (epoch, k):  # the training loop's checkpoint, taken after this step
                        return steps, sampler.state_dict()
            return steps, None

        full, _ = run(None, None)
        head, state = run((1, 3), None)
        rest, _ = run(None, json.loads(json.dumps(state)))
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"full": full, "head": head, "rest": rest})
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("dims", "workers"), [(1, 0), (2, 0), (1, 2)])
def test_sampler_ddp_gloo_mid_epoch_resume_is_exact_on_every_rank(tmp_path: Path, dims: int, workers: int) -> None:
    out = tmp_path / "out.json"
    spawn(_ddp_resume_worker, args=(2, free_port(), str(out), dims, workers), nprocs=2)
    ranks = json.loads(out.read_text())
    for r in ranks:
        assert len(r["head"]) > len(r["full"]) // 2  # the stop fell inside epoch 1 (the second)
        assert r["head"] + r["rest"] == r["full"]  # nothing repeated, nothing skipped
    assert len(ranks[0]["rest"]) == len(ranks[1]["rest"])  # the ranks resume in step
