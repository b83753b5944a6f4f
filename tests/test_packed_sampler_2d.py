"""PackedBatchSampler2D: a two-cap packed plan run epoch after epoch (NOTE [ Two-cap packing each
epoch ]) and fed through PackedModalityCollate, which keeps the sampler's rows (NOTE [ Rows
through the workers ]). Qwen2-VL-shaped items; the tiny Qwen2-VL's staged cost model prices them."""

from __future__ import annotations

import itertools
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from torch.utils.data import DataLoader

from tests._dist import free_port, gloo_group, spawn
from tests.test_packed_vlm import SPEC, QwenItems
from tokenbucket import ConfigError
from tokenbucket._exceptions import StateError
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.staged import Sample, StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.plan.packing_2d import EMPTY, plan_packing_2d, rank_imbalance
from tokenbucket.tokens.hf import HFConfig
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.packed_modal import PackedModalityCollate
from tokenbucket.train.packing import PackedBatchSampler
from tokenbucket.train.packing_2d import PackedBatchSampler2D
from tokenbucket.train.sampler import Fetched

# the tiny Qwen2-VL of tests/test_packed_vlm.py, as its config.json reads
TINY = {
    "model_type": "qwen2_vl", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False,
    "vision_config": {"depth": 2, "embed_dim": 32, "num_heads": 2, "hidden_size": 32, "mlp_ratio": 2,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3},
}  # fmt: skip
N, BUDGET, SEED = 48, 4 * 2**20, 3


def metadata(n: int = N) -> pa.Table:
    """One or two images of 56 .. 168 px a side, 3 .. 39 text tokens: rows of 1 to 4 samples."""
    rng = np.random.default_rng(0)
    sides = (56, 84, 112, 168)
    return pa.Table.from_pylist(
        [
            {
                "key": f"s{i}",
                "cameras": int(rng.integers(1, 3)),
                "frames": 1,
                "height": int(rng.choice(sides)),
                "width": int(rng.choice(sides)),
                "text_tokens": int(rng.integers(3, 40)),
            }
            for i in range(n)
        ]
    )


def samples(meta: pa.Table, specials: int = 2) -> list[Sample]:
    """The cost model's samples: each image's <vision_start> and <vision_end> are text to it."""
    return [
        Sample(
            images=r["cameras"],
            height=r["height"],
            width=r["width"],
            text_tokens=r["text_tokens"] + specials * r["cameras"],
        )
        for r in meta.to_pylist()
    ]


class Setup:
    def __init__(self) -> None:
        self.meta = metadata()
        self.cost = StagedPackedModel(StagedLengthModel(StagedCostModel(staged_from_config(HFConfig("<tiny>", TINY)))))
        self.loads = self.cost.loads(samples(self.meta))
        # planned for 2 ranks, 2 rows a batch: 14 batches, so 4 ranks get 2 empty batches
        self.plan = plan_packing_2d(
            self.loads, self.cost, BUDGET, world_size=2, rows_per_batch=(2,), multiple=8, seed=SEED
        )
        self.data = TokenBucketDataset(
            QwenItems(self.meta), metadata=self.meta, spec=SPEC, plan=self.plan.bucket_plan(self.loads)
        )

    def sampler(self, **kwargs: Any) -> PackedBatchSampler2D:
        return PackedBatchSampler2D.from_dataset(self.data, self.plan, self.loads, self.cost, **kwargs)

    def collate(self, **kwargs: Any) -> PackedModalityCollate:
        p = self.plan
        kwargs = {"rows_per_batch": p.rows_per_batch, "row_patches": p.row_patches, "mask_dtype": None, **kwargs}
        return PackedModalityCollate(self.data, p.row_tokens, **kwargs)


@pytest.fixture(scope="module")
def setup() -> Setup:
    return Setup()


def rows_of_batch(batch: list[int]) -> list[list[int]]:
    """A sampler batch's rows, as it says (NOTE [ Rows through the workers ])."""
    rows = getattr(batch, "rows", None)
    assert rows is not None and sum(rows) == len(batch)
    cut = np.cumsum([0, *rows]).tolist()
    return [list(batch[a:b]) for a, b in itertools.pairwise(cut)]


def test_packed_sampler_2d_plan_is_the_fixture_it_claims(setup: Setup) -> None:
    p = setup.plan
    assert p.rows_per_batch == 2 and len(p.batches) == 14 and not p.rejected
    assert (setup.data.lengths == setup.loads.llm_tokens).all()  # the spec and the cost model count alike
    assert max(len(r) for b in p.batches for r in b) >= 2  # rows of several samples


@pytest.mark.parametrize("world", [1, 2, 4])
def test_packed_sampler_2d_every_sample_once_equal_steps_rows_within_both_caps(setup: Setup, world: int) -> None:
    p, loads = setup.plan, setup.loads
    for epoch in (0, 1):
        per_rank = []
        for rank in range(world):
            sampler = setup.sampler(rank=rank, world_size=world)
            sampler.set_epoch(epoch)
            per_rank.append(list(sampler))
            assert len(sampler) == len(per_rank[-1])
        assert len({len(b) for b in per_rank}) == 1  # every rank the same number of steps
        real = [i for batches in per_rank for batch in batches for i in batch if i < N]
        assert sorted(real) == list(range(N))  # each sample once an epoch, over all ranks
        empty = [batch for batches in per_rank for batch in batches if batch == [N]]
        assert len(empty) == -14 % world  # the last step's missing batches, one empty row each
        for batches in per_rank:
            for batch in batches:
                rows = rows_of_batch(batch)
                assert len(rows) <= p.rows_per_batch
                for row in rows:
                    if row != [N]:
                        assert loads.llm_tokens[row].sum() <= p.row_tokens and loads.patches[row].sum() <= p.row_patches


def test_packed_sampler_2d_epoch_zero_is_the_plans_batches_and_steps_later_epochs_balanced(setup: Setup) -> None:
    p = setup.plan
    ranks = [list(setup.sampler(rank=r, world_size=2)) for r in range(2)]
    want = [[[*np.concatenate(p.batches[b]).tolist()] if b != EMPTY else [N] for b in step] for step in p.steps]
    assert [[ranks[0][s], ranks[1][s]] for s in range(len(p.steps))] == want  # the planner's steps, rank by rank
    sampler = setup.sampler(world_size=2)
    for epoch in (1, 2):
        batches, seconds, steps = sampler.epoch_batches(epoch)
        assert steps != p.steps or [len(r) for r in batches[0]] != [len(r) for r in p.batches[0]]  # a new packing
        # NOTE [ Balanced ranks ]: sum of step maxima less sum of step means <= t_max - t_min
        slowest, imbalance = rank_imbalance(steps, seconds, p.empty_seconds)
        mean = slowest / (1 + imbalance)
        assert slowest - mean <= float(seconds.max() - seconds.min()) * (1 + 1e-9)
        assert imbalance < 0.05
        # a plain split (batches in packing order, rank r taking every other) is worse
        plain = [[2 * k, 2 * k + 1] for k in range(len(batches) // 2)]
        assert rank_imbalance(plain, seconds)[1] > imbalance


def test_packed_sampler_2d_resumes_exactly_at_start_middle_end(setup: Setup) -> None:
    for world, rank in ((1, 0), (4, 3)):
        full = setup.sampler(rank=rank, world_size=world)
        full.set_epoch(1)
        want = [(list(b), rows_of_batch(b)) for b in full]
        for stop in (0, len(want) // 2, len(want)):  # the resume harness
            sampler = setup.sampler(rank=rank, world_size=world)
            sampler.set_epoch(1)
            it = iter(sampler)
            head = [next(it) for _ in range(stop)]
            resumed = setup.sampler(rank=rank, world_size=world)
            resumed.load_state_dict(sampler.state_dict())
            got = [(list(b), rows_of_batch(b)) for b in head] + [(list(b), rows_of_batch(b)) for b in resumed]
            assert got == want
    with pytest.raises(StateError, match=r"world_size.*every rank's slice changed"):
        setup.sampler(rank=0, world_size=2).load_state_dict(setup.sampler().state_dict())


def patches_by_row(batch: dict[str, Any]) -> list[int]:
    rows = len(batch["index"])
    grid = batch.get("image_grid_thw")
    if grid is None:
        return [0] * rows
    return [int(grid[batch["image_rows"] == r].prod(-1).sum()) for r in range(rows)]


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_sampler_2d_through_a_dataloader_keeps_rows_caps_and_resumes(setup: Setup, workers: int) -> None:
    p = setup.plan
    world, rank = 2, 1

    def loader(sampler: PackedBatchSampler2D) -> DataLoader[Any]:
        return DataLoader(setup.data, batch_sampler=sampler, collate_fn=setup.collate(), num_workers=workers)

    reference = setup.sampler(rank=rank, world_size=world)
    reference.set_epoch(1)
    want = [[row for row in rows_of_batch(b) if row != [N]] for b in reference]
    sampler = setup.sampler(rank=rank, world_size=world)
    sampler.set_epoch(1)
    got, state = [], None
    for k, batch in enumerate(loader(sampler)):
        index = batch["index"]
        assert len(index) == p.rows_per_batch  # the batch's fixed shape
        got.append([row for row in index if row])
        tokens = batch["segment_ids"].gt(0).sum(-1).tolist()
        assert max(tokens) <= p.row_tokens and max(patches_by_row(batch)) <= p.row_patches  # both caps held
        assert tokens == [int(setup.loads.llm_tokens[row].sum()) for row in index]
        if k == 2:
            state = sampler.state_dict(after=batch["info"])  # NOTE [ Position through the workers ]
    assert got == want  # the sampler's rows, kept
    assert state is not None
    resumed = setup.sampler(rank=rank, world_size=world)
    resumed.load_state_dict(state)
    rest = [[row for row in batch["index"] if row] for batch in loader(resumed)]
    assert got[:3] + rest == got


def test_packed_modal_collate_keeps_the_samplers_rows_where_next_fit_would_break_the_patch_cap(setup: Setup) -> None:
    loads, tokens = setup.loads, setup.plan.row_tokens
    # two samples that share a row by tokens but not under a patch cap of the larger one's patches
    a, b = next((i, j) for i in range(N) for j in range(i + 1, N) if loads.llm_tokens[[i, j]].sum() <= tokens)
    cap = int(loads.patches[[a, b]].max())
    items = [setup.data[a], setup.data[b]]
    merged = PackedModalityCollate(setup.data, tokens, mask_dtype=None)(items)  # next-fit on tokens alone
    assert merged["index"] == [[a, b]] and patches_by_row(merged)[0] > cap  # what a patch cap forbids
    chosen = Fetched(items)
    chosen.rows = (1, 1)  # the sampler's rows (NOTE [ Rows through the workers ])
    kept = setup.collate(row_patches=cap)(chosen)
    assert kept["index"] == [[a], [b]] and max(patches_by_row(kept)) <= cap
    # without rows carried, the collate's next-fit honours the patch cap too
    assert setup.collate(row_patches=cap)(items)["index"] == [[a], [b]]
    with pytest.raises(ConfigError, match=rf"^sample {a} \(key 's{a}'\) has \d+ patches, more than row_patches=0$"):
        setup.collate(row_patches=0)(items)


def test_packed_modal_collate_row_over_a_cap_is_a_one_line_config_error(setup: Setup) -> None:
    batch = next(iter(setup.sampler()))
    rows = rows_of_batch(batch)
    fetched = setup.data.__getitems__(batch)
    assert fetched.rows == tuple(len(r) for r in rows)
    first = [int(i) for i in rows[0]]
    patches = int(setup.loads.patches[first].sum())
    with pytest.raises(ConfigError) as caught:
        setup.collate(row_patches=patches - 1)(fetched)
    assert str(caught.value) == (
        f"row 0 of the batch (samples {first}) holds {patches:,} patches, more than row_patches={patches - 1:,}: "
        f"the sampler's caps and the collate's disagree (pass the plan's row_tokens and row_patches)"
    )
    tokens = int(setup.loads.llm_tokens[first].sum())
    with pytest.raises(
        ConfigError, match=rf"^row 0 of the batch \(samples .*\) holds {tokens} tokens, more than pack_length"
    ):
        PackedModalityCollate(setup.data, tokens - 1, mask_dtype=None)(fetched)


def test_packed_sampler_2d_refuses_what_is_not_its_plan_in_one_line(setup: Setup) -> None:
    def refused(match: str, call: Any) -> None:
        with pytest.raises(ConfigError, match=match) as caught:
            call()
        assert "\n" not in str(caught.value)

    bucket_plan = setup.data.plan
    refused(
        r"^plan should be a two-cap packed plan \(PackedPlan2D, from plan_packing_2d\), but got BucketPlan \(mode 'packed'\)",
        lambda: PackedBatchSampler2D(bucket_plan, setup.loads, setup.cost),  # type: ignore[arg-type]
    )
    refused(
        r"^the plan packs 48 samples and rejected 0, but loads holds 47",
        lambda: PackedBatchSampler2D(setup.plan, setup.loads.take(np.arange(N - 1)), setup.cost),
    )
    # the cost model's samples without the images' start / end tokens: the dataset counts 2 a camera more
    short = setup.cost.loads(samples(setup.meta, specials=0))
    plan = plan_packing_2d(short, setup.cost, BUDGET, rows_per_batch=(2,), multiple=8)
    refused(r"^sample \d+ \(key 's\d+'\): the dataset counts \d+ tokens but the plan's loads \d+ \(48 such samples\)",
            lambda: PackedBatchSampler2D.from_dataset(setup.data, plan, short, setup.cost))  # fmt: skip
    refused(r"^this packed plan also caps patches a row \(row_patches=\d+\).*PackedBatchSampler2D$",
            lambda: PackedBatchSampler.from_dataset(setup.data))  # fmt: skip
    refused(r"^this packed plan also caps patches a row", lambda: setup.data.sampler())


def test_packed_sampler_2d_pickles(setup: Setup) -> None:
    sampler = setup.sampler(rank=1, world_size=2)
    assert [list(b) for b in pickle.loads(pickle.dumps(sampler))] == [list(b) for b in sampler]


def _gloo_worker(rank: int, world: int, port: int, out: str) -> None:
    import json

    import torch.distributed as dist

    with gloo_group(rank, world, port):
        setup = Setup()
        sampler = setup.sampler()  # rank and world size from the process group
        batches = [[list(b), list(getattr(b, "rows", ()))] for b in sampler]
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, batches)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)


@pytest.mark.slow
def test_packed_sampler_2d_ddp_gloo_two_ranks_every_sample_once(tmp_path: object) -> None:
    import json
    from pathlib import Path

    out = Path(str(tmp_path)) / "out.json"
    spawn(_gloo_worker, args=(2, free_port(), str(out)), nprocs=2)
    ranks = json.loads(out.read_text())
    assert len(ranks[0]) == len(ranks[1]) == 7
    assert sorted(i for r in ranks for b, _ in r for i in b if i < N) == list(range(N))
    setup = Setup()
    for rank in range(2):  # what each process drew is what the sampler gives that rank
        assert [b for b, _ in ranks[rank]] == [list(b) for b in setup.sampler(rank=rank, world_size=2)]
