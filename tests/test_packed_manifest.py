"""A two-cap packed plan in the manifest (NOTE [ A two-cap packed manifest ]): ``plan --mode
packed`` with a staged model writes every row packed or rejected with its reason, every batch of
the sampler read from it fits the budget under the cost model, its epoch 0 is the planner's, the
content hash covers the loads, other manifests still load (and are refused by the sampler in one
line), and the flags that do not go with it are one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli_errors import cli, one_line_error, snapshot
from tests.test_cli_staged import qwen2_vl_dir
from tests.test_manifest import _edit, _rewrite, _stamp
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.staged_packed import PackedStepCost, StagedPackedModel
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.plan.packed_manifest import LOAD_COLUMNS, build_packed_manifest_2d, packed_plan_of
from tokenbucket.plan.packing_2d import plan_packing_2d
from tokenbucket.tokens.hf import token_spec_from_hf
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.packing_2d import PackedBatchSampler2D

BUDGET = gpu_budget_bytes("H100-SXM")


def rows(n: int = 80, *, huge: int = 0) -> list[dict[str, int | str]]:
    """Qwen2-VL-shaped rows: half text-heavy (one small image), half vision-heavy (2-4 cameras of
    1-4 frames, short text); ``huge`` rows of 12 cameras x 16 frames at 1,344 px fit not even alone."""
    rng = random.Random(3)
    out: list[dict[str, int | str]] = []
    for i in range(n):
        if i % 2:
            side = rng.choice([224, 336, 448])
            out.append({"key": f"v{i:03d}", "cameras": rng.randint(2, 4), "frames": rng.randint(1, 4), "height": side,
                        "width": side, "text_tokens": rng.randint(16, 128)})  # fmt: skip
        else:
            out.append({"key": f"t{i:03d}", "cameras": 1, "frames": 1, "height": 224, "width": 224,
                        "text_tokens": rng.randint(500, 3000)})  # fmt: skip
    out += [{"key": f"x{i}", "cameras": 12, "frames": 16, "height": 1344, "width": 1344, "text_tokens": 10}
            for i in range(huge)]  # fmt: skip
    return out


def write(tmp_path: Path, table_rows: list[dict[str, int | str]]) -> Path:
    path = tmp_path / "meta.parquet"
    pq.write_table(pa.Table.from_pylist(table_rows), path)
    return path


@pytest.fixture(scope="module")
def cost() -> StagedPackedModel:
    return StagedPackedModel(StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM")))


def samples(table_rows: list[dict[str, int | str]]) -> list[Sample]:
    """The samples as the staged model sees them (each camera one clip: Qwen2-VL has a video path)."""
    return [
        Sample.video(cameras=int(r["cameras"]), frames=int(r["frames"]), height=int(r["height"]),
                     width=int(r["width"]), text_tokens=int(r["text_tokens"]))
        if int(r["frames"]) > 1 else
        Sample.stills(cameras=int(r["cameras"]), frames=1, height=int(r["height"]), width=int(r["width"]),
                      text_tokens=int(r["text_tokens"]))
        for r in table_rows
    ]  # fmt: skip


def test_packed_manifest_sampler_epoch_zero_is_the_planners_on_every_rank(
    tmp_path: Path, cost: StagedPackedModel
) -> None:
    table_rows = rows()
    spec = token_spec_from_hf(cost.staged.config)  # type: ignore[arg-type]
    m = build_packed_manifest_2d(write(tmp_path, table_rows), spec, cost, tmp_path / "m.parquet",
                                 budget_bytes=BUDGET, world_size=2)  # fmt: skip
    plan = plan_packing_2d(cost.loads(samples(table_rows)), cost, BUDGET, world_size=2)
    packed = packed_plan_of(m)
    # the manifest gives back the planner's caps, loads (total is the sample's LLM sequence) and pricing
    assert (packed.plan.row_tokens, packed.plan.row_patches, packed.plan.rows_per_batch) == (
        plan.row_tokens, plan.row_patches, plan.rows_per_batch)  # fmt: skip
    assert packed.plan.row_image_tokens == plan.row_image_tokens and packed.plan.world_size == 2
    assert packed.step_cost == cost.step_cost()
    assert packed.step_cost.step_seconds(3e14, 4096) == cost.step_seconds(3e14, 4096)  # bit for bit
    np.testing.assert_array_equal(packed.loads.llm_tokens, cost.loads(samples(table_rows)).llm_tokens)
    np.testing.assert_array_equal(packed.plan.seconds, plan.seconds)
    assert packed.plan.steps == plan.steps
    for rank in range(2):
        sampler = PackedBatchSampler2D.from_manifest(m, rank=rank, world_size=2)
        want = [
            np.concatenate(plan.batches[s[rank]]).tolist() if s[rank] >= 0 else [len(table_rows)] for s in plan.steps
        ]
        assert list(sampler) == want
    # the dataset path: a TokenBucketDataset over the manifest (the collate's lengths are the loads')
    data = TokenBucketDataset([{}] * len(table_rows), spec=spec, manifest=m)
    assert PackedBatchSampler2D.from_dataset(data, packed.plan, packed.loads, packed.step_cost).plan_id == (
        PackedBatchSampler2D.from_manifest(m).plan_id)  # fmt: skip


def test_plan_packed_cli_rows_packed_or_rejected_and_every_batch_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cost: StagedPackedModel
) -> None:
    meta = write(tmp_path, rows(huge=2))
    out = tmp_path / "m.parquet"
    code, text, err = cli(capsys, "plan", str(meta), "--preset", "qwen2-vl-2b", "--mode", "packed", "--sharding",
                          "ddp", "--world-size", "4", "--gpu", "H100-SXM", "--on-oversize", "reject", "--out",
                          str(out), "--json")  # fmt: skip
    assert code == 0, err
    got = json.loads(text)
    p = got["packed_2d"]
    assert {"row_tokens", "row_patches", "row_image_tokens", "rows_per_batch", "world_size", "batches", "steps",
            "predicted_epoch_seconds", "rank_imbalance", "over_budget_batches"} <= set(p)  # fmt: skip
    assert p["world_size"] == 4 and p["over_budget_batches"] == 0 and p["predicted_peak_bytes"] <= BUDGET
    assert got["summary"]["samples"] == 80 and got["summary"]["rejected"] == 2 == p["rejected"]
    assert got["staged"]["setup"]["world_size"] == 4 and 0 <= p["rank_imbalance"] < 0.5

    m = load_manifest(out)
    t = m.table
    bucket, reason = t.column("bucket").to_numpy(), t.column("reason").to_pylist()
    assert set(bucket.tolist()) == {0, -1} and len(bucket) == 82  # every row packed or rejected
    assert all((b < 0) == (r is not None) for b, r in zip(bucket.tolist(), reason, strict=True))
    assert all(r.startswith("oversize: fits not even alone") for r in reason[-2:])
    assert all(t.column(c).null_count == 0 for c in LOAD_COLUMNS)
    # every batch of the sampler's epochs: both caps per row, and its rows at their own patches fit
    packed = packed_plan_of(m)
    sampler = PackedBatchSampler2D.from_manifest(m, rank=0, world_size=1)
    caps, loads = packed.plan, packed.loads
    setup = TrainSetup(sharding="ddp", world_size=4)  # the plan's
    staged_cost = StagedPackedModel(StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup,
                                                                      gpu="H100-SXM")))  # fmt: skip
    for epoch in (0, 1):
        for batch in sampler.epoch_batches(epoch).batches:
            for row in batch:
                assert loads.llm_tokens[row].sum() <= caps.row_tokens and loads.patches[row].sum() <= caps.row_patches
            patches = int(sum(loads.patches[row].sum() for row in batch))
            image = int(sum(loads.image_tokens[row].sum() for row in batch))
            r = caps.rows_per_batch
            assert staged_cost.memory(r, caps.row_tokens, patches, image).total <= BUDGET
    assert staged_cost.memory(r, caps.row_tokens, r * caps.row_patches, r * caps.row_image_tokens).total <= BUDGET

    code, text, err = cli(capsys, "inspect", str(out))
    assert code == 0 and "two-cap packed rows" in text and "4 rank(s)" in text, err
    code, text, err = cli(capsys, "inspect", str(out), "--json")
    assert code == 0 and json.loads(text)["packed_2d"]["row_tokens"] == p["row_tokens"], err


@pytest.mark.parametrize("column", [*LOAD_COLUMNS, "step_cost"])
def test_packed_manifest_content_hash_covers_the_loads_and_step_cost(
    tmp_path: Path, cost: StagedPackedModel, column: str
) -> None:
    spec = token_spec_from_hf(cost.staged.config)  # type: ignore[arg-type]
    out, edited = tmp_path / "m.parquet", tmp_path / "edited.parquet"
    build_packed_manifest_2d(write(tmp_path, rows(20)), spec, cost, out, budget_bytes=BUDGET)
    if column == "step_cost":  # the plan's pricing of each epoch's batches
        stamp = _stamp(out)
        stamp["plan"]["meta"]["step_cost"]["pad_flops_per_token"] *= 2  # type: ignore[index]
        _rewrite(out, edited, footer=json.dumps(stamp).encode())
    else:
        _rewrite(out, edited, table=_edit(pq.read_table(out), column, "value"))
    with pytest.raises(ConfigError, match="does not match its content hash"):
        load_manifest(edited)


def test_packed_manifest_other_manifests_still_load_and_the_sampler_refuses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = write(tmp_path, rows(20))
    for mode, reader in (("static", "BucketBatchSampler"), ("dynamic", "BucketBatchSampler")):
        out = tmp_path / f"{mode}.parquet"
        code, _, err = cli(capsys, "plan", str(meta), "--preset", "qwen2-vl-2b", "--mode", mode, "--gpu", "H100-SXM",
                           "--out", str(out))  # fmt: skip
        assert code == 0, err
        m = load_manifest(out)  # a manifest without the packed columns reads as before
        assert not set(LOAD_COLUMNS) & set(m.table.column_names)
        with pytest.raises(ConfigError, match=reader) as exc:
            PackedBatchSampler2D.from_manifest(m)
        assert "\n" not in str(exc.value)
        code, _, err = cli(capsys, "inspect", str(out))
        assert code == 0, err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--buckets", "2d"], "--buckets 2d"),
        (["--calibration", "c.json"], "--calibration"),
        (["--engine", "ray"], "--engine ray"),
        (["--vision-share", "0.5"], "--vision-share"),
        (["--stills", "wrist"], "--stills"),
        (["--profile", "p.json"], "--profile"),
    ],
)
def test_plan_packed_staged_refusals_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    meta = write(tmp_path, rows(10))
    folder = qwen2_vl_dir(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "plan", str(meta), "--hf-config", str(folder), "--mode", "packed", "--gpu",
                       "H100-SXM", "--out", str(tmp_path / "m.parquet"), *flags)  # fmt: skip
    assert code != 0
    one_line_error(err, named)
    assert snapshot(tmp_path) == before


def test_plan_packed_cameras_as_lists_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = pa.table({"key": ["a"], "cameras": [[{"name": "top", "frames": 1, "height": 224, "width": 224}]],
                      "text_tokens": [5]})  # fmt: skip
    pq.write_table(table, tmp_path / "meta.parquet")
    code, _, err = cli(capsys, "plan", str(tmp_path / "meta.parquet"), "--preset", "qwen2-vl-2b", "--mode",
                       "packed", "--gpu", "H100-SXM", "--out", str(tmp_path / "m.parquet"))  # fmt: skip
    assert code != 0
    one_line_error(err, "cameras")


def test_packed_step_cost_round_trips_and_refuses_a_damaged_entry(cost: StagedPackedModel) -> None:
    c = cost.step_cost()
    assert PackedStepCost.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ConfigError, match="packed step cost"):
        PackedStepCost.from_dict({"pad_flops_per_token": 1.0, "step_time": {"peak": 1}, "fixed": None})
