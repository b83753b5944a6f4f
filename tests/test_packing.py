"""Packing: rows that hold every sample once, masks and position ids that make a packed row
compute exactly what each sample alone would, and the collate's packed tensors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests._dist import free_port, gloo_group, spawn
from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.buckets import OversizeError, plan_buckets
from tokenbucket.testing import RandomTokens, mixture_a
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.packing import (
    DENSE_MASK_WARN_BYTES,
    PackedCollate,
    block_diagonal_mask,
    dense_mask_bytes,
    flex_block_mask,
    pack_rows,
)


def test_pack_rows_every_sample_once_rows_fit_deterministic() -> None:
    lengths = np.random.default_rng(0).integers(1, 300, 5000)
    rows = pack_rows(lengths, 512, seed=1, epoch=0, pool=700)
    flat = [i for r in rows for i in r]
    assert sorted(flat) == list(range(len(lengths)))  # whole samples, each once
    assert all(lengths[r].sum() <= 512 for r in rows)
    assert rows == pack_rows(lengths, 512, seed=1, epoch=0, pool=700)
    assert rows != pack_rows(lengths, 512, seed=1, epoch=1, pool=700)  # a new order each epoch
    # a row never mixes pools: memory stays flat however many samples there are
    order = np.random.default_rng([1, 0]).permutation(len(lengths))
    pool_of = np.empty(len(lengths), np.int64)
    pool_of[order] = np.arange(len(lengths)) // 700
    assert all(len(set(pool_of[r].tolist())) == 1 for r in rows)
    efficiency = lengths.sum() / (len(rows) * 512)
    assert efficiency > 0.98  # best-fit decreasing leaves little room
    with pytest.raises(ConfigError, match="never split"):
        pack_rows([10, 600, 20], 512)


def test_pack_rows_on_mixture_a_fills_rows() -> None:
    lengths = breakdown_table(mixture_a(50_000, seed=0), TokenSpec(patch=14)).totals
    pack = 65_536
    lengths = lengths[lengths <= pack]
    rows = pack_rows(lengths, pack, seed=0)
    assert lengths.sum() / (len(rows) * pack) >= 0.99


class TinyBlock(nn.Module):
    """One pre-norm attention + MLP block over SDPA, with learned positions taken from position_ids."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.pos = nn.Embedding(512, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.pos(position_ids)
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


def one_camera_data(
    n: int, seed: int, max_text: int, attention: str, **plan_kwargs: object
) -> tuple[TokenBucketDataset, CostModel]:
    """``n`` samples of one 14 px frame (1 token) plus 3 .. max_text text tokens, as real sequences."""
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "key": [f"s{i:03d}" for i in range(n)],
            "cameras": [1] * n,
            "frames": [1] * n,
            "height": [14] * n,
            "width": [14] * n,
            "text_tokens": rng.integers(3, max_text, n),
        }
    )
    spec = TokenSpec(patch=14)
    lengths = breakdown_table(table, spec).totals
    cost = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention=attention))
    plan = plan_buckets(lengths, cost, **plan_kwargs)
    return TokenBucketDataset(RandomTokens(lengths, 16), metadata=table, spec=spec, plan=plan), cost


def packed_setup() -> tuple[TokenBucketDataset, CostModel]:
    return one_camera_data(60, 0, 90, "eager", budget_bytes=2**30, max_buckets=1)


def test_packed_row_computes_what_each_sample_alone_computes() -> None:
    torch.manual_seed(0)
    data, cost = packed_setup()
    rows = pack_rows(data.lengths, 128, seed=0)
    collate = PackedCollate(data, 128, rows_per_batch=4, cost_model=cost)
    block = TinyBlock().eval()
    checked = 0
    with torch.no_grad():
        for start in range(0, len(rows), 4):
            batch = collate([data[i] for r in rows[start : start + 4] for i in r])
            out = block(batch["tokens"], batch["position_ids"], block_diagonal_mask(batch["segment_ids"]))
            for r, row in enumerate(batch["index"]):
                pos = 0
                for i in row:
                    n = int(data.lengths[i])
                    alone = block(data[i][1]["tokens"][None], torch.arange(n)[None])[0]
                    torch.testing.assert_close(out[r, pos : pos + n], alone, atol=1e-5, rtol=1e-5)
                    pos += n
                    checked += 1
    assert checked == len(data)  # every sample, in every row, matched its solo run


def test_packed_collate_tensors_describe_the_rows() -> None:
    data, cost = packed_setup()
    rows = pack_rows(data.lengths, 128, seed=3)
    collate = PackedCollate(data, 128, rows_per_batch=3, cost_model=cost)
    for start in range(0, len(rows), 3):
        group = rows[start : start + 3]
        batch = collate([data[i] for r in group for i in r])
        seg, pos = batch["segment_ids"], batch["position_ids"]
        assert batch["tokens"].shape == (3, 128, 16) and batch["info"].shape == (3, 128)
        assert len([r for r in batch["index"] if r]) <= len(group)  # next-fit needs no more rows
        lengths = [int(data.lengths[i]) for r in batch["index"] for i in r]
        assert batch["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()]
        assert batch["max_seqlen"] == max(lengths) and int((seg > 0).sum()) == sum(lengths)
        for r, row in enumerate(batch["index"]):  # positions restart at 0 for every sample
            starts = torch.nonzero(pos[r] == 0).flatten()[: len(row)].tolist()
            assert [int(seg[r, s]) for s in starts] == list(range(1, len(row) + 1))
        info = batch["info"]
        assert info.real_tokens == sum(lengths) and info.predicted_peak_bytes == cost.memory(3, 128).total
    # the token layout: every sample's segments, at its place in the row, tile the real tokens
    laid = PackedCollate(data, 128, rows_per_batch=3, with_layout=True)([data[i] for r in rows[:3] for i in r])
    for r, segments in enumerate(laid["layout"]):
        covered = sorted((g.start, g.stop) for g in segments)
        assert covered[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(covered))
        assert covered[-1][1] == int((laid["segment_ids"][r] > 0).sum())
        assert {g.modality for g in segments} <= {"vision", "text"}
    with pytest.raises(ConfigError, match="rows of 128 tokens but holds 1"):
        PackedCollate(data, 128, rows_per_batch=1)([data[i] for r in rows[:3] for i in r])


def test_packed_collate_takes_a_sample_of_no_tokens() -> None:
    # metadata may describe a sample with no tokens (no camera, no text): it still gets a row
    meta = pa.table(
        {
            "key": ["a", "b", "c"],
            "cameras": [1, 1, 0],
            "frames": [1, 1, 1],
            "height": [28] * 3,
            "width": [28] * 3,
            "text_tokens": [1, 3, 0],
        }
    )
    spec = TokenSpec(patch=14)
    totals = breakdown_table(meta, spec).totals
    cost = CostModel(ModelSpec(hidden=8, layers=1, heads=2, precision="fp32", attention="flash"))
    data = TokenBucketDataset(
        RandomTokens(totals, 8),
        metadata=meta,
        spec=spec,
        plan=plan_buckets(totals, cost, 2**20, mode="packed", pack_length=16),
    )
    for order in ([2, 0, 1], [0, 2, 1], [2]):
        out = PackedCollate(data, 16, None)([data[i] for i in order])
        assert sorted(i for row in out["index"] for i in row) == sorted(order)
        assert out["cu_seqlens"].tolist()[-1] == int(totals[order].sum())


def test_dense_mask_bytes_is_the_block_diagonal_masks_size() -> None:
    seg = torch.tensor([[1, 1, 2, 0, 0], [1, 2, 2, 3, 0], [0, 0, 0, 0, 0]])
    mask = block_diagonal_mask(seg)
    assert dense_mask_bytes(3, 5) == mask.numel() * mask.element_size() == 75
    assert dense_mask_bytes(1, 16_384) == DENSE_MASK_WARN_BYTES == 256 * 2**20


def test_packed_collate_warns_once_when_the_dense_mask_would_pass_256_mib() -> None:
    # NOTE [ Dense mask size ]: one row of 16,385 tokens is a 256 MiB + 32 KiB bool mask
    data, _ = packed_setup()
    items = [data[i] for i in range(8)]
    at_limit = PackedCollate(data, 16_384, rows_per_batch=1)
    assert at_limit(items)["tokens"].shape[:2] == (1, 16_384)  # exactly 256 MiB: no warning (errors here)
    collate = PackedCollate(data, 16_385, rows_per_batch=1)
    with pytest.warns(UserWarning) as record:
        first = collate(items)
    assert len(record) == 1
    message = str(record[0].message)
    assert "\n" not in message
    assert message.startswith("packed batch of 1 rows x 16,385 tokens: a dense block_diagonal_mask would take 256 MiB")
    assert "cu_seqlens" in message and "flex_block_mask" in message
    assert sorted(i for row in first["index"] for i in row) == list(range(8))  # no sample lost
    second = collate(items)  # once per collate: the second batch is silent (an error under filterwarnings)
    assert sorted(i for row in second["index"] for i in row) == list(range(8))
    with pytest.warns(UserWarning, match="4 rows x 16,385 tokens: .* 1,024 MiB"):
        PackedCollate(data, 16_385, rows_per_batch=4)(items)  # a new collate warns again


@pytest.mark.slow
def test_flex_block_mask_matches_the_sdpa_mask() -> None:
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    seg = torch.tensor([[1] * 40 + [2] * 50 + [3] * 30 + [0] * 8, [1] * 128])
    q, k, v = (torch.randn(2, 2, 128, 8) for _ in range(3))
    with pytest.warns(UserWarning, match="without torch.compile"):  # unfused on CPU, still exact
        out = flex.flex_attention(q, k, v, block_mask=flex_block_mask(seg))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=block_diagonal_mask(seg))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert math.isfinite(float(out.abs().max()))


# -- the packed planning mode and its sampler --------------------------------------------------


@pytest.mark.slow
def test_plan_packed_on_mixture_a_flash_beats_the_oracle_in_one_shape() -> None:
    from tokenbucket import gpu_budget_bytes
    from tokenbucket.plan._search import max_batch_table

    lengths = breakdown_table(mixture_a(200_000, seed=0), TokenSpec(patch=14)).totals
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    budget = gpu_budget_bytes("H100-SXM")
    plan = plan_buckets(lengths, cost, budget, mode="packed", on_oversize="reject")
    (b,) = plan.buckets  # one row shape
    kept = lengths[lengths <= b.bound]
    assert plan.mode == "packed" and b.samples == len(kept) and plan.oversize["count"] == len(lengths) - len(kept)
    assert b.padding_efficiency >= 0.99 and b.predicted_peak_bytes <= budget
    # the sort-everything-then-fill oracle on the same samples, at their own padded lengths
    order = np.sort(kept)
    caps = max_batch_table(cost, order, budget).tolist()
    oracle, begin = 1, 0
    for i in range(len(order)):
        if i + 1 - begin > caps[i]:
            oracle, begin = oracle + 1, i
    assert b.batches < oracle
    with pytest.raises(OversizeError, match="never split"):
        plan_buckets(lengths, cost, budget, mode="packed")


def packed_data() -> tuple[TokenBucketDataset, CostModel]:
    return one_camera_data(90, 5, 120, "flash", budget_bytes=2 * 2**20, mode="packed", pack_length=256)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_packed_sampler_every_sample_once_equal_steps_rows_fit(world: int) -> None:
    data, cost = packed_data()
    b = data.plan.buckets[0]
    assert b.batch_size > 1  # several rows a batch, so row boundaries matter
    samplers = [data.sampler(seed=2, rank=r, world_size=world) for r in range(world)]
    per_rank = [list(s) for s in samplers]
    assert len({len(p) for p in per_rank}) == 1 and all(len(s) == len(per_rank[0]) for s in samplers)
    real = [i for p in per_rank for batch in p for i in batch if i < len(data)]
    assert sorted(real) == list(range(len(data)))
    collate = PackedCollate(data, b.bound, b.batch_size, cost_model=cost)
    feature = data[0][1]["tokens"].shape[1:]
    for batch in per_rank[-1]:
        out = collate([data[i] for i in batch])  # never more rows than the plan's batch holds
        # a filler batch of empty rows only looks like every other batch (the model takes it)
        assert out["tokens"].shape == (b.batch_size, b.bound, *feature) and out["tokens"].dtype == torch.float32
        assert out["info"].predicted_peak_bytes <= data.plan.budget_bytes
    fillers = [batch for p in per_rank for batch in p if all(i >= len(data) for i in batch)]
    assert world == 1 or fillers  # the tail's filler batches are exercised


def test_packed_sampler_resumes_exactly() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    data, _ = packed_data()
    b = data.plan.buckets[0]
    full = [list(x) for x in data.sampler(seed=4)]
    for stop in (0, 3, len(full)):  # the resume harness: start, middle, end
        sampler = data.sampler(seed=4)
        it = iter(sampler)
        head = [next(it) for _ in range(stop)]
        resumed = data.sampler(seed=4)
        resumed.load_state_dict(sampler.state_dict())
        assert head + [list(x) for x in resumed] == full
    collate = PackedCollate(data, b.bound, b.batch_size)
    loader = StatefulDataLoader(data, batch_sampler=data.sampler(seed=4), collate_fn=collate)
    it = iter(loader)
    first = [next(it)["index"] for _ in range(2)]
    state = loader.state_dict()
    again = StatefulDataLoader(data, batch_sampler=data.sampler(seed=4), collate_fn=collate)
    again.load_state_dict(state)
    seen = [i for batch in first + [x["index"] for x in again] for row in batch for i in row]
    assert sorted(seen) == list(range(len(data)))
    with pytest.raises(ConfigError, match="world_size"):
        data.sampler(seed=4, rank=0, world_size=2).load_state_dict(data.sampler(seed=4).state_dict())


def _packed_ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    import json

    import torch.distributed as dist

    with gloo_group(rank, world, port):
        data, _ = packed_data()
        sampler = data.sampler(seed=7)  # rank and world size from the process group
        batches = [list(b) for b in sampler]
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, batches)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_packed_sampler_ddp_gloo_equal_steps_every_sample_once(tmp_path: object, world: int) -> None:
    import json
    from pathlib import Path

    out = Path(str(tmp_path)) / "out.json"
    spawn(_packed_ddp_worker, args=(world, free_port(), str(out)), nprocs=world)
    ranks = json.loads(out.read_text())
    assert len({len(r) for r in ranks}) == 1
    n = 90
    real = [i for r in ranks for b in r for i in b if i < n]
    assert sorted(real) == list(range(n))


def test_packed_manifest_from_the_cli_feeds_the_packed_sampler(tmp_path: object) -> None:
    from pathlib import Path

    import pyarrow.parquet as pq

    from tokenbucket.cli.main import main
    from tokenbucket.plan.manifest import load_manifest
    from tokenbucket.train.packing import PackedBatchSampler
    from tokenbucket.train.sampler import BucketBatchSampler

    root = Path(str(tmp_path))
    pq.write_table(mixture_a(2000, seed=2), root / "meta.parquet")
    code = main(
        [
            "plan",
            str(root / "meta.parquet"),
            "--patch",
            "56",
            "--preset",
            "design-24L-1024",
            "--gpu",
            "H100-SXM",
            "--mode",
            "packed",
            "--on-oversize",
            "reject",
            "--out",
            str(root / "m.parquet"),
        ]
    )
    assert code == 0
    manifest = load_manifest(root / "m.parquet")
    assert manifest.plan.mode == "packed" and len(manifest.plan.buckets) == 1
    sampler = PackedBatchSampler.from_manifest(manifest, seed=0, rank=0, world_size=1)
    seen = sorted(i for batch in sampler for i in batch)
    valid = np.flatnonzero(manifest.table.column("bucket").to_numpy() >= 0).tolist()
    assert seen == valid
    with pytest.raises(ConfigError, match="PackedBatchSampler"):
        BucketBatchSampler.from_manifest(manifest)
