"""``plan --hf-config`` (and a staged ``--preset``): the planner prices each bucket bound as its
worst sample (StagedLengthModel), the batch sizes are that adapter's, every real sample fits at
its bucket's batch size per the staged cost model, and mistakes end as one line, nothing written."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli_errors import cli, one_line_error, snapshot
from tests.test_cli_staged import qwen2_vl_dir
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import get_gpu, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel, load_hf_config
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.tokens.breakdown import breakdown_table
from tokenbucket.tokens.hf import read_hf_config, token_spec_from_hf
from tokenbucket.train.collate import TokenBucketDataset

BUDGET = gpu_budget_bytes(get_gpu("H100-SXM"))


def metadata(tmp_path: Path, n: int = 120) -> tuple[Path, pa.Table]:
    """Half text-heavy (one small image, 500-3,000 text tokens), half vision-heavy (2-4 cameras at
    224-448 px, 16-128 text tokens), 1-4 frames a camera (each frame an image: NOTE [ Frames are
    images ])."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        side = rng.choice
        if i % 2:
            rows.append({"key": f"v{i:03d}", "cameras": rng.randint(2, 4), "frames": rng.randint(1, 4), "height": side([224, 336, 448]),
                         "width": side([224, 336, 448]), "text_tokens": rng.randint(16, 128)})  # fmt: skip
        else:
            rows.append({"key": f"t{i:03d}", "cameras": 1, "frames": 1, "height": 224, "width": side([224, 448]),
                         "text_tokens": rng.randint(500, 3000)})  # fmt: skip
    table = pa.Table.from_pylist(rows)
    path = tmp_path / "meta.parquet"
    pq.write_table(table, path)
    return path, table


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out, err = cli(capsys, "plan", *argv, "--gpu", "H100-SXM", "--max-buckets", "6", "--json")
    assert code == 0, err
    return dict(json.loads(out))


def measured_share(folder: Path, table: pa.Table) -> float:
    result = breakdown_table(table, token_spec_from_hf(folder))
    vision = result.table.column("vision").to_numpy().astype(float)
    return float((vision / result.table.column("total").to_numpy()).max())


def test_plan_hf_config_batches_are_the_adapter_and_every_sample_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = qwen2_vl_dir(tmp_path)
    meta, table = metadata(tmp_path)
    out = tmp_path / "m.parquet"
    got = plan_json(capsys, str(meta), "--hf-config", str(folder), "--out", str(out))
    staged = got["staged"]
    assert isinstance(staged, dict)
    share = measured_share(folder, table)
    assert staged["vision_share"] == pytest.approx(share) and staged["vision_share_source"] == "measured"
    assert 0.9 < share < 1 and staged["image"] == [448, 448] and staged["image_tokens"] == 256

    cost = StagedCostModel(load_hf_config(folder), gpu="H100-SXM", config=read_hf_config(folder))
    adapter = StagedLengthModel(cost, vision_share=share)
    m = load_manifest(out)
    bounds, batches = m.plan.bounds.tolist(), m.plan.batch_sizes.tolist()
    assert m.plan.budget_bytes == BUDGET and len(bounds) > 2
    assert batches == [adapter.max_batch(u, BUDGET) for u in bounds]
    assert batches == sorted(batches, reverse=True) and batches[0] > batches[-1] >= 1

    rows = m.table
    assert rows.num_rows == table.num_rows and (rows.column("bucket").to_numpy() >= 0).all()  # none missing
    by_key = {r["key"]: r for r in table.to_pylist()}
    worst = 0.0
    for key, bucket, total in zip(*(rows.column(c).to_pylist() for c in ("key", "bucket", "total")), strict=True):
        r = by_key[key]
        own = Sample.video(cameras=r["cameras"], frames=r["frames"], height=r["height"], width=r["width"],
                           text_tokens=r["text_tokens"])  # fmt: skip
        est = cost.memory(batches[bucket], own)
        assert est.seq_len == total <= bounds[bucket]  # the manifest's length is the Sample's
        assert est.peak_bytes <= BUDGET, (key, bucket, est.peak_bytes)
        worst = max(worst, est.peak_bytes / BUDGET)
    assert worst > 0.5  # the check bites: some real batch comes near the budget


def test_plan_hf_config_fsdp_gives_larger_batches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = qwen2_vl_dir(tmp_path)
    meta, _ = metadata(tmp_path)
    args = (str(meta), "--hf-config", str(folder), "--vision-share", "0.95")

    def sizes(*flags: str) -> dict[int, int]:
        got = plan_json(capsys, *args, "--out", str(tmp_path / f"m{len(flags)}.parquet"), *flags)
        return {int(b["bound"]): int(b["batch_size"]) for b in got["buckets"]}  # type: ignore[attr-defined]

    plain, fsdp = sizes(), sizes("--sharding", "fsdp", "--world-size", "8")
    cost = StagedCostModel(
        load_hf_config(folder), TrainSetup(sharding="fsdp", world_size=8), config=read_hf_config(folder)
    )
    adapter = StagedLengthModel(cost, vision_share=0.95)
    assert all(b == adapter.max_batch(u, BUDGET) for u, b in fsdp.items())
    for u in set(plain) & set(fsdp):  # the same bound holds at least as many samples per rank
        assert fsdp[u] >= plain[u]
    # the bounds may move (FSDP's collectives are a fixed cost per step: NOTE [ Step time ]), so
    # compare each FSDP bucket with what one unsharded rank fits at the same bound
    alone = StagedLengthModel(StagedCostModel(load_hf_config(folder), config=read_hf_config(folder)), vision_share=0.95)
    assert all(b >= alone.max_batch(u, BUDGET) for u, b in fsdp.items())
    assert any(b > alone.max_batch(u, BUDGET) for u, b in fsdp.items())


def test_plan_hf_config_manifest_records_the_staged_model_and_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = qwen2_vl_dir(tmp_path)
    meta, table = metadata(tmp_path, 40)
    out = tmp_path / "m.parquet"
    plan_json(capsys, str(meta), "--hf-config", str(folder), "--train", "lora", "--out", str(out))
    m = load_manifest(out, spec=token_spec_from_hf(folder))  # planned for the config's own spec
    model = m.meta["meta"]["model"]
    assert model["model_type"] == "qwen2_vl" and model["kind"] == "staged"
    assert model["config_sha256"] == hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    assert model["setup"]["train"] == "lora" and model["image"] == [448, 448] and m.meta["meta"]["gpu"] == "H100-SXM"
    ds = TokenBucketDataset(table.to_pylist(), spec=token_spec_from_hf(folder), manifest=m)  # no ModelSpec needed
    assert len(ds) == table.num_rows == len(m)


def test_plan_staged_preset_takes_its_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta, table = metadata(tmp_path, 40)
    got = plan_json(capsys, str(meta), "--preset", "paligemma-3b", "--out", str(tmp_path / "m.parquet"))
    staged = got["staged"]
    assert isinstance(staged, dict) and staged["preset"] == "paligemma-3b" and staged["image"] == [224, 224]
    m = load_manifest(tmp_path / "m.parquet")
    assert m.table.column("vision").to_pylist()[:2] == [256 * table.column("cameras")[i].as_py() for i in range(2)]
    adapter = StagedLengthModel(
        StagedCostModel(StagedModel.preset("paligemma-3b")), vision_share=staged["vision_share"]
    )
    assert m.plan.batch_sizes.tolist() == [adapter.max_batch(u, BUDGET) for u in m.plan.bounds.tolist()]


# -- the adapter ------------------------------------------------------------------------------


def test_staged_length_model_is_monotone_and_text_only_at_share_zero() -> None:
    cost = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM")
    worst = StagedLengthModel(cost, vision_share=0.9)
    lengths = sorted({*range(64, 6000, 64), *range(200, 800)})  # every length across image boundaries
    for batch in (1, 3):
        peaks = [worst.memory(batch, n).total for n in lengths]
        assert peaks == sorted(peaks)
    for n in (300, 2048):
        assert [worst.memory(b, n).total for b in range(1, 6)] == sorted(worst.memory(b, n).total for b in range(1, 6))
        assert worst.flops(2, n).training < worst.flops(2, n + 256).training < worst.flops(3, n + 256).training
    text = StagedLengthModel(cost, vision_share=0.0)
    for b, n in ((1, 64), (4, 1000), (2, 4096)):
        assert text.memory(b, n).total == cost.memory(b, Sample(text_tokens=n)).peak_bytes
        assert text.memory(b, n).total < worst.memory(b, n).total  # image tokens cost the tower too
    assert worst.sample(1000) == Sample(images=4, height=448, width=448, text_tokens=0)  # ceil: 900 -> 4 images
    parts = worst.step_time_parts(2, 1000)  # NOTE [ Step time ]: FLOPs at u(T), plus the fixed cost
    assert parts.compute == pytest.approx(worst.flops(2, 1000).training / (989.4e12 * parts.utilisation), rel=0.01)
    assert parts.utilisation == 0.4  # 2,000 tokens: above the knee (the ridge point, 295 tokens)
    assert worst.step_time_parts(1, 200).utilisation == pytest.approx(0.4 * 200 / (989 / 3.35))
    assert worst.step_seconds(2, 1000) == parts.total > parts.compute


def test_staged_length_model_fixed_tower_rounds_down_and_pickles() -> None:
    cost = StagedCostModel(StagedModel.preset("paligemma-3b"), gpu="H100-SXM")
    m = StagedLengthModel(cost, vision_share=0.8)
    assert m.sample(1000) == Sample(images=3, height=224, width=224, text_tokens=232)  # 800 // 256 whole images
    back = pickle.loads(pickle.dumps(m))
    assert back.max_batch(2048, BUDGET) == m.max_batch(2048, BUDGET) > 0
    with pytest.raises(ConfigError, match="vision_share should be a number in"):
        StagedLengthModel(cost, vision_share=1.5)


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--patch", "16", "--merge", "1"], ["--patch", "--merge", "--hf-config"]),
        (["--vision-share", "1.5"], ["--vision-share", "1.5"]),
        (["--vision-share", "nan"], ["--vision-share"]),
        (["--mode", "packed", "--vision-share", "0.5"], ["--mode packed", "--vision-share"]),
        (["--hidden", "512"], ["--hidden"]),
    ],
)
def test_plan_hf_config_refusals_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], names: list[str]
) -> None:
    folder = qwen2_vl_dir(tmp_path)
    meta, table = metadata(tmp_path, 20)
    (tmp_path / "p.json").write_text("{}")
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "plan", str(meta), "--hf-config", str(folder), "--gpu", "H100-SXM",
                         "--out", str(tmp_path / "m.parquet"), *flags)  # fmt: skip
    assert code == 2 and out == ""
    one_line_error(err, *names)
    assert snapshot(tmp_path) == before and not (tmp_path / "m.parquet").exists()
    assert pq.read_table(meta).num_rows == table.num_rows == 20


def test_plan_hf_config_reads_a_profile_and_refuses_a_broken_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A staged model plans from ``profile --hf-config --save`` (tests/test_profile_hf_cli.py); a file
    that is no profile is refused in one line naming it, and nothing is written."""
    folder = qwen2_vl_dir(tmp_path)
    meta, _ = metadata(tmp_path, 20)
    (tmp_path / "p.json").write_text("{}")
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "plan", str(meta), "--hf-config", str(folder), "--gpu", "H100-SXM",
                         "--out", str(tmp_path / "m.parquet"), "--profile", str(tmp_path / "p.json"))  # fmt: skip
    assert code == 1 and out == ""
    one_line_error(err, "p.json", "profile format")
    assert snapshot(tmp_path) == before


def test_plan_staged_flags_without_a_staged_model_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta, _ = metadata(tmp_path, 20)
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "plan", str(meta), "--gpu", "H100-SXM", "--out", str(tmp_path / "m.parquet"),
                       "--train", "lora", "--vision-share", "0.5")  # fmt: skip
    assert code == 2
    one_line_error(err, "--train", "--vision-share", "--hf-config")
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_plan_hf_config_ray_engine_writes_the_same_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    folder = qwen2_vl_dir(tmp_path)
    meta, _ = metadata(tmp_path, 60)
    args = (str(meta), "--hf-config", str(folder))
    plan_json(capsys, *args, "--out", str(tmp_path / "local.parquet"))
    plan_json(capsys, *args, "--out", str(tmp_path / "ray.parquet"), "--engine", "ray")
    local, ray = load_manifest(tmp_path / "local.parquet"), load_manifest(tmp_path / "ray.parquet")
    assert local.content_hash == ray.content_hash
    assert np.array_equal(local.table.column("bucket").to_numpy(), ray.table.column("bucket").to_numpy())


def test_plan_hf_config_feeds_cameras_as_clips_or_stills(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen2-VL has a video path: a camera of several frames is one clip by default (frame pairs
    merge), every frame an image with --feed images, and the --stills cameras images among clips;
    each manifest length is the staged cost model's own sequence for that feed."""
    folder = qwen2_vl_dir(tmp_path)
    rng = random.Random(3)
    rows = [{"key": f"k{i:03d}", "cameras": rng.randint(1, 3), "frames": rng.choice([1, 3, 4, 8]),
             "height": rng.choice([224, 336]), "width": rng.choice([224, 448]),
             "text_tokens": rng.randint(16, 256)} for i in range(60)]  # fmt: skip
    meta = tmp_path / "mixture.parquet"
    pq.write_table(pa.Table.from_pylist(rows), meta)
    cost = StagedCostModel(load_hf_config(folder), gpu="H100-SXM", config=read_hf_config(folder))
    totals = {}
    for name, extra in (("video", ()), ("images", ("--feed", "images")), ("stills", ("--stills", "camera0"))):
        out = tmp_path / f"{name}.parquet"
        plan_json(capsys, str(meta), "--hf-config", str(folder), "--out", str(out), *extra)
        table = load_manifest(out).table
        totals[name] = dict(zip(table.column("key").to_pylist(), table.column("total").to_pylist(), strict=True))
    for r in rows:
        shape = {k: r[k] for k in ("frames", "height", "width", "text_tokens")}
        clip = cost.memory(1, Sample.video(cameras=r["cameras"], **shape)).seq_len
        stills = cost.memory(1, Sample.stills(cameras=r["cameras"], **shape)).seq_len
        assert totals["video"][r["key"]] == clip and totals["images"][r["key"]] == stills
        first = cost.memory(1, Sample.stills(cameras=1, **shape)).seq_len - r["text_tokens"]
        rest = (
            cost.memory(1, Sample.video(cameras=r["cameras"] - 1, **shape)).seq_len
            if r["cameras"] > 1
            else r["text_tokens"]
        )
        assert totals["stills"][r["key"]] == first + rest
        # a one-frame camera is an image either way; Qwen2-VL's video min_pixels (128 merged
        # patches a frame) lifts small frames, so a clip is not always the cheaper feed
        assert (clip == stills) == (r["frames"] == 1)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--preset", "design-24L-1024", "--feed", "images"), ("--feed", "--hf-config")),
        (("--hf-config", "QWEN", "--stills", " , "), ("--stills", "CAM")),
        (("--hf-config", "QWEN", "--feed", "images", "--stills", "wrist"), ("--stills", "--feed images")),
        (("--hf-config", "LLAVA", "--feed", "video"), ("--feed video", "no video path")),
    ],
)
def test_plan_feed_flags_mistakes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], words: tuple[str, ...]
) -> None:
    meta, _ = metadata(tmp_path, n=8)
    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "config.json").write_text(json.dumps({"model_type": "llava"}))
    qwen = str(qwen2_vl_dir(tmp_path))
    argv = [a.replace("QWEN", qwen).replace("LLAVA", str(llava)) for a in extra]
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "plan", str(meta), *argv, "--gpu", "H100-SXM", "--out", str(tmp_path / "m.parquet"))
    assert code == 2 and out == ""
    one_line_error(err, *words)
    assert snapshot(tmp_path) == before
