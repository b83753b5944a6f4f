"""A 2D dynamic plan in the manifest (NOTE [ A two-dimensional dynamic manifest ]): ``build_manifest``
and ``tokenbucket plan --buckets 2d --mode dynamic`` write every row in a bucket or rejected with its
reason, with what re-cuts the batches (pools, seed, the staged model); the sampler read from the
manifest alone gives the planner's epoch 0 and the in-memory sampler's later epochs; other manifests
and a model that no longer prices the plan are refused in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli_errors import cli, one_line_error, snapshot
from tests.test_cli_staged import qwen2_vl_dir
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets_2d import DYNAMIC_2D_KEY, plan_buckets_2d
from tokenbucket.plan.dynamic_manifest import dynamic_plan_of
from tokenbucket.plan.manifest import Manifest, build_manifest, load_manifest
from tokenbucket.testing import mixture_tv
from tokenbucket.tokens.breakdown import breakdown_table
from tokenbucket.tokens.hf import read_hf_config, token_spec_from_hf
from tokenbucket.train.packing import PackedBatchSampler
from tokenbucket.train.packing_2d import PackedBatchSampler2D
from tokenbucket.train.sampler import BucketBatchSampler, DynamicFill2D

BUDGET = gpu_budget_bytes("H100-SXM")
N = 500
POOL, SEED = 8, 5  # not plan_buckets_2d's defaults: the manifest must carry them


@pytest.fixture(scope="module")
def cost() -> StagedLengthModel:
    return StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM"))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("meta") / "meta.parquet"
    table = mixture_tv(N, seed=4)
    # two rows that fit not even alone (12 cameras x 16 frames at 1,344 px) and one invalid row
    huge = pa.table({"key": ["huge0", "huge1"], "cameras": [12, 12], "frames": [16, 16], "height": [1344, 1344],
                     "width": [1344, 1344], "text_tokens": [10, 10]})  # fmt: skip
    bad = pa.table({"key": ["bad"], "cameras": [1], "frames": [1], "height": [-5], "width": [224],
                    "text_tokens": [10]})  # fmt: skip
    pq.write_table(pa.concat_tables([table, huge.cast(table.schema), bad.cast(table.schema)]), path)
    return path


def spec_of(cost: StagedLengthModel):  # type: ignore[no-untyped-def]
    assert cost.cost.config is not None
    return token_spec_from_hf(cost.cost.config)


@pytest.fixture(scope="module")
def planned(
    cost: StagedLengthModel, source: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[BucketPlan, Manifest]:
    """The plan in memory (from the valid rows' counts) and the manifest written of the same plan."""
    result = breakdown_table(pq.read_table(source), spec_of(cost), on_invalid="reject")
    lengths = result.totals.astype(np.int64)
    vision = result.table.column("vision").to_numpy().astype(np.int64)
    plan = plan_buckets_2d(lengths, vision, cost, BUDGET, max_buckets=5, on_oversize="reject", mode="dynamic",
                           pool_batches=POOL, seed=SEED)  # fmt: skip
    out = tmp_path_factory.mktemp("out") / "m.parquet"
    build_manifest(source, spec_of(cost), plan, out, on_oversize="reject", on_invalid="reject")
    return plan, load_manifest(out)  # read back from the Parquet file, its hash checked


def epochs(sampler: BucketBatchSampler, *which: int) -> list[list[list[int]]]:
    out = []
    for epoch in which:
        sampler.set_epoch(epoch)
        out.append([list(b) for b in sampler])
    return out


def test_2d_dynamic_manifest_sampler_is_the_planners_epoch_zero_and_the_in_memory_samplers_later(
    cost: StagedLengthModel, planned: tuple[BucketPlan, Manifest]
) -> None:
    plan, manifest = planned
    assert manifest.plan == plan  # the plan travels whole, its record of the cut included
    record = manifest.plan.meta[DYNAMIC_2D_KEY]
    assert (record["pool_batches"], record["seed"]) == (POOL, SEED) and record["cost_model"]["preset"] == "qwen2-vl-2b"
    t = manifest.table
    bucket, total, vision = (t.column(c).fill_null(0).to_numpy() for c in ("bucket", "total", "vision"))
    # the sampler from the manifest alone: no cost model, pools or seed passed
    stored = BucketBatchSampler.from_manifest(manifest)
    # the sampler in memory: the plan's own cost model, pools and seed over the same buckets
    fill = DynamicFill2D(total, vision, cost, BUDGET, POOL)
    memory = BucketBatchSampler(bucket, plan.batch_sizes.tolist(), plan_id=manifest.content_hash, dynamic=fill,
                                seed=SEED)  # fmt: skip
    e0, e1 = epochs(stored, 0, 1)
    assert [e0, e1] == epochs(memory, 0, 1)
    assert e1 != e0  # (a new cut each epoch: the comparison above could fail)
    # epoch 0 is what the plan predicted, bucket by bucket: batches and padded tokens
    for k, b in enumerate(plan.buckets):
        mine = [x for x in e0 if bucket[x[0]] == k]
        assert len(mine) == b.batches
        assert sum(len(x) * int(total[x].max()) for x in mine) == b.padded_tokens
        for x in mine:  # each batch at its own maxima fits the budget
            assert cost.memory(len(x), int(total[x].max()), int(vision[x].max())).total <= BUDGET
    # every row in a bucket once an epoch, or rejected with its reason
    for e in (e0, e1):
        seen = np.sort(np.concatenate([np.asarray(x) for x in e]))
        assert seen.tolist() == np.flatnonzero(bucket >= 0).tolist()
    reason = t.column("reason").to_pylist()
    assert all((k >= 0) == (r is None) for k, r in zip(bucket.tolist(), reason, strict=True))
    assert sum(1 for r in reason if r and r.startswith("oversize")) == 2
    assert sum(1 for r in reason if r and r.startswith("invalid")) == 1
    assert manifest.summary()["samples"] == plan.summary()["samples"] == N


def test_2d_dynamic_manifest_on_two_ranks_and_replaced_settings(planned: tuple[BucketPlan, Manifest]) -> None:
    _, manifest = planned
    bucket = manifest.table.column("bucket").to_numpy()
    ranks = [BucketBatchSampler.from_manifest(manifest, rank=r, world_size=2) for r in range(2)]
    batches = [[list(b) for b in s] for s in ranks]
    assert len(batches[0]) == len(batches[1])
    real = [i for rank in batches for b in rank for i in b if i < len(bucket)]
    assert sorted(real) == np.flatnonzero(bucket >= 0).tolist()
    # a seed or pool size given replaces the stored one: other batches
    (base,) = epochs(BucketBatchSampler.from_manifest(manifest), 0)
    assert epochs(BucketBatchSampler.from_manifest(manifest, seed=SEED + 1), 0)[0] != base
    assert epochs(BucketBatchSampler.from_manifest(manifest, pool_batches=1), 0)[0] != base


def test_2d_dynamic_manifest_from_build_manifest_with_a_cost_model(
    cost: StagedLengthModel, source: Path, tmp_path: Path
) -> None:
    """build_manifest plans the 2D dynamic mode itself (pass 1's counts) as plan_buckets_2d would."""
    out = tmp_path / "m.parquet"
    manifest = build_manifest(source, spec_of(cost), cost, out, budget_bytes=BUDGET, max_buckets=5, two_d=True,
                              mode="dynamic", on_oversize="reject", on_invalid="reject")  # fmt: skip
    assert manifest.plan.mode == "dynamic" and manifest.plan.two_d
    record = load_manifest(out).plan.meta[DYNAMIC_2D_KEY]
    assert (record["pool_batches"], record["seed"]) == (64, 0)  # plan_buckets_2d's defaults
    (e0,) = epochs(BucketBatchSampler.from_manifest(load_manifest(out)), 0)
    assert len(e0) == manifest.plan.summary()["batches"]
    with pytest.raises(ConfigError, match="build_packed_manifest_2d") as exc:
        build_manifest(source, spec_of(cost), cost, tmp_path / "p.parquet", budget_bytes=BUDGET, two_d=True,
                       mode="packed")  # fmt: skip
    assert "\n" not in str(exc.value) and not (tmp_path / "p.parquet").exists()


def test_2d_dynamic_manifest_other_manifests_are_refused_in_one_line(
    cost: StagedLengthModel, source: Path, tmp_path: Path, planned: tuple[BucketPlan, Manifest]
) -> None:
    static = build_manifest(source, spec_of(cost), cost, tmp_path / "s.parquet", budget_bytes=BUDGET, max_buckets=4,
                            two_d=True, on_oversize="reject", on_invalid="reject")  # fmt: skip
    with pytest.raises(ConfigError, match=r"a static 2D bucket plan, not a 2D dynamic plan.*BucketBatchSampler") as e:
        dynamic_plan_of(static)
    assert "\n" not in str(e.value)
    BucketBatchSampler.from_manifest(static)  # a static 2D manifest still reads as before
    _, dynamic = planned
    for reader in (PackedBatchSampler2D.from_manifest, PackedBatchSampler.from_manifest):
        with pytest.raises(ConfigError, match="BucketBatchSampler") as e:
            reader(dynamic)
        assert "\n" not in str(e.value)


def test_2d_dynamic_manifest_refuses_a_stored_model_that_prices_the_plan_otherwise(
    cost: StagedLengthModel, source: Path, tmp_path: Path, planned: tuple[BucketPlan, Manifest]
) -> None:
    plan, _ = planned
    record = json.loads(json.dumps(plan.meta[DYNAMIC_2D_KEY]))
    record["cost_model"]["setup"]["train"] = "lora"  # as another tokenbucket might price the same model
    edited = dataclasses.replace(plan, meta={**plan.meta, DYNAMIC_2D_KEY: record})
    m = build_manifest(source, spec_of(cost), edited, tmp_path / "m.parquet", on_oversize="reject",
                       on_invalid="reject")  # fmt: skip
    with pytest.raises(ConfigError, match=r"prices bucket 0 .* plan again, or pass cost_model=") as exc:
        BucketBatchSampler.from_manifest(m)
    assert "\n" not in str(exc.value)
    # the model passed in is taken as it is: the planner's epoch 0 again
    (e0,) = epochs(BucketBatchSampler.from_manifest(m, cost_model=cost), 0)
    assert len(e0) == plan.summary()["batches"]


def test_2d_dynamic_manifest_of_a_model_that_cannot_be_written_down_needs_it_passed(
    cost: StagedLengthModel, source: Path, tmp_path: Path
) -> None:
    custom = dataclasses.replace(StagedModel.preset("qwen2-vl-2b"), name="my-qwen")  # built by hand
    mine = StagedLengthModel(StagedCostModel(custom, gpu="H100-SXM"))
    with pytest.raises(ConfigError, match=r"neither a preset nor read from a config\.json"):
        mine.to_dict()
    m = build_manifest(source, spec_of(cost), mine, tmp_path / "m.parquet", budget_bytes=BUDGET, max_buckets=4,
                       two_d=True, mode="dynamic", on_oversize="reject", on_invalid="reject")  # fmt: skip
    assert m.plan.meta[DYNAMIC_2D_KEY]["cost_model"] is None
    with pytest.raises(ConfigError, match=r"records no cost model.*pass cost_model=") as exc:
        BucketBatchSampler.from_manifest(m)
    assert "\n" not in str(exc.value)
    (e0,) = epochs(BucketBatchSampler.from_manifest(m, cost_model=mine), 0)
    assert len(e0) == m.plan.summary()["batches"]


def test_staged_length_model_round_trips_a_preset_and_a_config(tmp_path: Path, cost: StagedLengthModel) -> None:
    again = StagedLengthModel.from_dict(json.loads(json.dumps(cost.to_dict())))
    assert (again.cost.model, again.cost.setup, again.image, again.gpu) == (
        cost.cost.model, cost.cost.setup, cost.image, cost.gpu
    )  # fmt: skip
    config = read_hf_config(qwen2_vl_dir(tmp_path))
    from tokenbucket.cost.hf_model import staged_from_config

    read = StagedLengthModel(StagedCostModel(staged_from_config(config), config=config), vision_share=0.3)
    record = json.loads(json.dumps(read.to_dict()))
    assert "preset" not in record and record["config"]["config"] == config.config and record["gpu"] is None
    back = StagedLengthModel.from_dict(record)
    assert back.cost.model == read.cost.model and back.vision_share == 0.3
    assert back.memory(2, 3000, 1024).total == read.memory(2, 3000, 1024).total
    with pytest.raises(ConfigError, match="not a staged length model's record"):
        StagedLengthModel.from_dict({"kind": "staged_length", "preset": "qwen2-vl-2b"})


@pytest.mark.slow
def test_cli_plan_2d_dynamic_end_to_end_with_the_manifest_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: Path
) -> None:
    folder = qwen2_vl_dir(tmp_path)
    out = tmp_path / "m.parquet"
    argv = ["plan", str(source), "--hf-config", str(folder), "--gpu", "H100-SXM", "--buckets", "2d", "--mode",
            "dynamic", "--max-buckets", "5", "--on-oversize", "reject", "--on-invalid", "reject", "--out", str(out)]  # fmt: skip
    code, text, err = cli(capsys, *argv)
    assert code == 0, err
    lines = text.splitlines()
    assert "images" in lines[0] and "dynamic shapes" in text and "over budget: 0" in text
    assert "2D dynamic: each batch padded to its own longest and most image tokens" in text
    assert "re-cuts every epoch from the manifest alone" in text and "rejected 3, 1 of them invalid rows" in text
    code, text, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["mode"] == "dynamic" and all("vision_bound" in b for b in data["buckets"])
    assert data["dynamic_2d"] == {"pool_batches": 64, "seed": 0, "cost_model_stored": True}
    assert data["summary"]["samples"] == N and data["summary"]["rejected"] == 3
    code, text, err = cli(capsys, "inspect", str(out))
    assert code == 0, err
    assert "2D dynamic:" in text and "hash" in text.splitlines()[0]
    code, text, err = cli(capsys, "inspect", str(out), "--json")
    assert code == 0, err
    assert json.loads(text)["dynamic_2d"]["cost_model_stored"] is True
    # training needs only the manifest: the config.json is gone
    shutil.rmtree(folder)
    manifest = load_manifest(out)
    assert "config" in manifest.plan.meta[DYNAMIC_2D_KEY]["cost_model"]
    (e0,) = epochs(BucketBatchSampler.from_manifest(manifest), 0)
    bucket = manifest.table.column("bucket").to_numpy()
    per_bucket = np.bincount([int(bucket[b[0]]) for b in e0], minlength=len(manifest.plan.buckets))
    assert per_bucket.tolist() == [b.batches for b in manifest.plan.buckets]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--engine", "ray"], "drop --engine ray"),
        (["--vision-share", "0.5"], "drop --vision-share"),
        (["--calibration", "c.json"], "drop --calibration"),
        (["--mode", "packed"], "drop --buckets 2d"),
    ],
)
def test_cli_plan_2d_dynamic_refusals_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: Path, flags: list[str], named: str
) -> None:
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "plan", str(source), "--preset", "qwen2-vl-2b", "--gpu", "H100-SXM", "--buckets", "2d",
                       "--mode", "dynamic", "--out", str(tmp_path / "m.parquet"), *flags)  # fmt: skip
    assert code != 0
    one_line_error(err, named)
    assert snapshot(tmp_path) == before


def test_cli_plan_2d_dynamic_never_overwrites_a_file_it_did_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: Path
) -> None:
    out = tmp_path / "notes.parquet"
    out.write_text("mine")
    code, _, err = cli(capsys, "plan", str(source), "--preset", "qwen2-vl-2b", "--gpu", "H100-SXM", "--buckets", "2d",
                       "--mode", "dynamic", "--on-oversize", "reject", "--on-invalid", "reject", "--out", str(out))  # fmt: skip
    assert code != 0
    one_line_error(err, "is not a tokenbucket manifest")
    assert out.read_text() == "mine"
