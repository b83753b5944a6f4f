"""The stream stage with a 2D plan (NOTE [ Two-dimensional buckets ]): real webdataset tar shards of
mixture TV, every sample in one batch of a bucket holding both its counts or rejected with its
reason, the shard index's image tokens, and equal steps from the index."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds

from tokenbucket import ConfigError, breakdown_table, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.buckets_2d import plan_buckets_2d
from tokenbucket.stream.bucketer import read_rejected
from tokenbucket.stream.emission import stream_batch_counts
from tokenbucket.stream.wds import bucketed, index_shards
from tokenbucket.testing import mixture_tv
from tokenbucket.tokens.hf import token_spec_from_hf

# webdataset leaves the last shard's file open when a pipeline ends: collected in each test
pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")

BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture(autouse=True)
def _collect_leaked_shards() -> Any:
    yield
    gc.collect()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    staged = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM")
    assert staged.config is not None
    spec = token_spec_from_hf(staged.config)
    table = mixture_tv(400, seed=8)
    result = breakdown_table(table, spec)
    lengths, vision = result.totals, result.table.column("vision").to_numpy()
    cost = StagedLengthModel(staged)
    # planned without the sample "huge" the last shard adds: the stage must reject it
    plan = plan_buckets_2d(lengths, vision, cost, BUDGET, max_buckets=8, on_oversize="reject")
    kept = plan.assign(lengths, vision) >= 0
    rows = table.to_pylist()
    root = tmp_path_factory.mktemp("tv-shards")
    urls = []
    for s in range(4):
        url = str(root / f"tv-{s:03d}.tar")
        urls.append(url)
        with wds.TarWriter(url) as sink:
            for r in rows[s * 100 : (s + 1) * 100]:
                sink.write({"__key__": r["key"], "json": json.dumps(r).encode()})
            if s == 3:  # image tokens past every bucket of the plan, a length inside it
                huge = {"key": "huge", "cameras": 3, "frames": 4, "height": 960, "width": 960, "text_tokens": 1}
                sink.write({"__key__": "huge", "json": json.dumps(huge).encode()})
    return {
        "spec": spec, "plan": plan, "cost": cost, "urls": urls,
        "counts": {r["key"]: (int(n), int(v)) for r, n, v in zip(rows, lengths, vision, strict=True)},
        "kept": {r["key"] for r, k in zip(rows, kept, strict=True) if k},
    }  # fmt: skip


@pytest.mark.parametrize("max_buffered", [None, 40])
def test_stream_2d_every_sample_in_a_bucket_holding_both_counts(
    world: dict[str, Any], tmp_path: Path, max_buffered: int | None
) -> None:
    plan, rejected = world["plan"], tmp_path / "rejected.jsonl"
    data = wds.WebDataset(world["urls"], shardshuffle=False, empty_check=False).compose(
        bucketed(plan, world["spec"], cost_model=world["cost"], rejected=str(rejected), max_buffered=max_buffered)
    )
    seen: list[str] = []
    for batch in data:
        b = plan.buckets[batch.bucket]
        info = batch.info()
        assert info.vision_bound == b.vision_bound is not None and info.shape == (b.batch_size, b.bound)
        assert len(batch.keys) <= b.batch_size and batch.predicted_peak_bytes == b.predicted_peak_bytes
        for key in batch.keys:
            n, v = world["counts"][key]
            assert n <= b.bound and v <= b.vision_bound
            # the first bucket that holds both: the one the plan assigns
            assert plan.assign([n], [v])[0] == batch.bucket
        seen += batch.keys
    assert len(seen) == len(set(seen)) and set(seen) == world["kept"]
    records = read_rejected(rejected)
    assert {r["key"] for r in records} == {"huge"} | (set(world["counts"]) - world["kept"])
    huge = next(r for r in records if r["key"] == "huge")
    assert huge["reason"] == "oversize" and "image tokens" in str(huge["message"])


def test_stream_2d_index_carries_image_tokens_and_gives_equal_steps(world: dict[str, Any]) -> None:
    plan, spec = world["plan"], world["spec"]
    index = index_shards(world["urls"], spec)
    flat = {k: (n, v) for ks, ns, vs in zip(index.keys, index.lengths, index.vision, strict=True)
            for k, n, v in zip(ks, ns, vs, strict=True)}  # fmt: skip
    assert {k: flat[k] for k in world["counts"]} == world["counts"]
    assert index.reorder(list(reversed(index.urls))).vision == tuple(reversed(index.vision))
    counts = stream_batch_counts(index.lengths, plan, world_size=2, shard_vision=index.vision)
    emitted = []
    for rank in range(2):
        urls = index.urls[rank::2]
        data = wds.WebDataset(list(urls), shardshuffle=False, empty_check=False).compose(bucketed(plan, spec))
        emitted.append(sum(1 for _ in data))
    assert emitted == counts[:, 0].tolist()  # the simulation is the stage
    steps = index.batches_per_worker(plan, world_size=2)
    assert steps == int(counts.max())
    with pytest.raises(ConfigError, match="shard_vision"):
        stream_batch_counts(index.lengths, plan)
    # with batches= every rank emits exactly that many, nothing cut
    for rank in range(2):
        data = wds.WebDataset(list(index.urls[rank::2]), shardshuffle=False, empty_check=False).compose(
            index.bucketed(plan, spec, world_size=2)
        )
        got = list(data)
        assert len(got) == steps and all(b.reason != "over_epoch" for b in got)
    assert np.all(counts >= 1)
