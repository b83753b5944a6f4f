"""Buckets of resolution x frames for a video DiT (NOTE [ Video buckets ]), an Open-Sora
``bucket_config`` written from them, and one read back and checked against a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from tokenbucket._exceptions import ConfigError
from tokenbucket.cli.main import main
from tokenbucket.cost.dit import DiTCostModel, DiTSetup
from tokenbucket.cost.gpus import gpu_budget_bytes
from tokenbucket.models._dit import DiTConfig, VAEFactors
from tokenbucket.plan.video_buckets import FRAME_BUCKETS, check_bucket_config, plan_video_buckets

WAN = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2],
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
}  # fmt: skip  (Wan 2.1 T2V 1.3B)
CFG = DiTConfig("wan-1.3b", "WanTransformer3DModel", WAN, VAEFactors(4, 8, 16, "published"))


def clips(n: int = 400, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    sizes = np.array([(480, 832), (720, 1280), (832, 480), (360, 640), (100, 100)])[
        rng.choice(5, n, p=[0.45, 0.2, 0.2, 0.1, 0.05])
    ]
    return pa.table({
        "key": [f"clip{i:04d}" for i in range(n)],
        "frames": rng.choice([5, 33, 49, 81, 121, 200, 300], n),
        "height": sizes[:, 0], "width": sizes[:, 1],
        "text_tokens": rng.integers(64, 513, n),
    })  # fmt: skip


@pytest.mark.parametrize("setup", [DiTSetup(checkpointing=True), DiTSetup(train="lora"), DiTSetup()])
def test_video_plan_every_clip_is_in_a_bucket_that_fits_or_rejected_with_its_reason(setup: DiTSetup) -> None:
    table, budget = clips(), gpu_budget_bytes("H100-SXM")
    cost = DiTCostModel(CFG, setup)
    plan = plan_video_buckets(table, cost, budget, gpu="H100-SXM")
    rejected = dict(plan.rejected)
    assert len(rejected) == len(plan.rejected)  # one reason a clip
    frames, heights, widths = (table.column(c).to_numpy() for c in ("frames", "height", "width"))
    for row, b in enumerate(plan.assignment.tolist()):
        assert (b >= 0) != (row in rejected), row  # in a bucket, or rejected: never both, never neither
        if b < 0:
            continue
        bucket = plan.buckets[b]
        # cut down, never up: the frames trimmed to a frame bucket, the size cropped to a whole multiple
        assert bucket.frames in FRAME_BUCKETS and bucket.frames <= frames[row]
        assert bucket.height <= heights[row] and bucket.width <= widths[row] and bucket.height % 16 == 0
    for bucket in plan.buckets:
        if bucket.batch_size:  # the largest batch that fits: one more does not
            assert cost.memory(bucket.batch_size, bucket.video_tokens, bucket.text_tokens).peak_bytes <= budget
            assert cost.memory(bucket.batch_size + 1, bucket.video_tokens, bucket.text_tokens).peak_bytes > budget
    assigned = np.bincount(plan.assignment[plan.assignment >= 0], minlength=len(plan.buckets))
    assert [b.samples if b.batch_size else 0 for b in plan.buckets] == assigned.tolist()
    # the 5-frame clips train as single frames (the smallest frame bucket under 5 is 1)
    assert all(plan.buckets[b].frames == 1 for b, f in zip(plan.assignment, frames, strict=True) if f == 5 and b >= 0)


def test_video_plan_flops_equal_torch_flop_counter_on_diffusers_own_forward() -> None:
    """The forward's FLOPs (a third of the training step's) against PyTorch's own count of
    diffusers' Wan forward at a mid size, on fake tensors, attention as the CUDA kernel runs it."""
    diffusers = pytest.importorskip("diffusers")
    from tokenbucket.cost._kernels import attention_kernels
    from tokenbucket.cost.profile import default_dtype
    from tokenbucket.models import dit_family

    t = {**WAN, "num_attention_heads": 4, "attention_head_dim": 64, "ffn_dim": 1024, "num_layers": 4,
         "text_dim": 256}  # fmt: skip
    cfg = DiTConfig("mid", "WanTransformer3DModel", t, VAEFactors(4, 8, 16, "x"))
    fam = dit_family(cfg.class_name)
    latents = fam.latents(cfg, 33, 256, 256)
    with FakeTensorMode(allow_non_fake_inputs=True), default_dtype(torch.bfloat16), attention_kernels("cuda"):
        model = diffusers.WanTransformer3DModel.from_config({k: v for k, v in t.items() if not k.startswith("_")})
        inputs = fam.inputs(cfg, 2, latents, 64, torch.bfloat16)
        inputs.pop("target")
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(**inputs)
    ours = DiTCostModel(cfg).flops(2, latents.tokens, 64) / 3
    assert ours == pytest.approx(counter.get_total_flops(), rel=0.01), (ours, counter.get_total_flops())


def _pipeline(folder: Path) -> Path:
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (folder / "transformer" / "config.json").write_text(json.dumps(WAN))
    return folder


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_video_plan_cli_writes_the_plan_and_an_opensora_table_and_inspect_checks_it_for_another_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe, meta = _pipeline(tmp_path / "wan"), tmp_path / "clips.parquet"
    pq.write_table(clips(), meta)
    out, table = tmp_path / "plan.parquet", tmp_path / "bucket_config.json"
    base = ["plan", str(meta), "--hf-config", str(pipe), "--backbone-checkpointing", "full", "--out", str(out)]
    code, _, err = _cli(capsys, *base, "--gpu", "H100-SXM")  # some clips are too small for any bucket
    assert code == 2 and "clip(s) cannot be planned" in err and "--on-oversize reject" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    code, stdout, err = _cli(capsys, *base, "--gpu", "H200", "--on-oversize", "reject", "--export", "opensora",
                             str(table), "--json")  # fmt: skip
    assert code == 0, err
    plan = json.loads(stdout)
    rows = pq.read_table(out)
    assert rows.num_rows == 400 and set(rows.column("key").to_pylist()) == set(clips().column("key").to_pylist())
    kept = [r for r in rows.to_pylist() if r["bucket"] >= 0]
    assert all(r["reason"] is None for r in kept) and all(r["reason"] for r in rows.to_pylist() if r["bucket"] < 0)
    config = json.loads(table.read_text())  # Open-Sora's shape: {"HxW": {frames: [probability, batch]}}
    assert sum(len(v) for v in config.values()) == sum(1 for b in plan["buckets"] if b["batch_size"])
    # the H200 table on an 80 GB H100: every bucket whose batch no longer fits is named, by how much
    code, stdout, err = _cli(capsys, "inspect", str(table), "--hf-config", str(pipe), "--gpu", "H100-SXM",
                             "--backbone-checkpointing", "full", "--json")  # fmt: skip
    assert code == 0, err
    checked = json.loads(stdout)
    cost = DiTCostModel(CFG, DiTSetup(checkpointing=True))
    h100 = gpu_budget_bytes("H100-SXM")
    assert checked["overflowing"] > 0
    for row in checked["buckets"]:
        peak = cost.sample_memory(row["batch_size"], frames=row["frames"], height=row["height"], width=row["width"],
                                  text_tokens=512).peak_bytes  # fmt: skip
        assert row["peak_bytes"] == peak and row["fits"] == (peak <= h100)
        assert row["over_bytes"] == max(0, peak - h100)
        assert row["max_batch"] < row["batch_size"] or row["fits"]
    # a second plan replaces the plan tokenbucket wrote; a file it did not write is kept
    code, _, err = _cli(capsys, *base, "--gpu", "H100-SXM", "--on-oversize", "reject")
    assert code == 0, err
    foreign = tmp_path / "notes.parquet"
    pq.write_table(pa.table({"a": [1]}), foreign)
    code, _, err = _cli(capsys, *base[:-1], str(foreign), "--gpu", "H100-SXM", "--on-oversize", "reject")
    assert code == 2 and "is not a video plan tokenbucket wrote" in err
    assert pq.read_table(foreign).column("a").to_pylist() == [1]
    code, _, err = _cli(capsys, *base, "--gpu", "H100-SXM", "--on-oversize", "reject", "--export", "opensora",
                        str(table))  # fmt: skip
    assert code == 2 and "exists" in err


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"480p": {"33": [1.0, 4]}}, "resolution '480p' should be HEIGHTxWIDTH"),
        ({"480x832": {"33": 4}}, "should be [probability, batch size]"),
        ({"480x832": {"33": [1.0, -1]}}, "is not an integer >= 0"),
        ({"470x832": {"33": [1.0, 1]}}, "multiples of 16"),
    ],
)
def test_check_bucket_config_refuses_a_malformed_table_in_one_line(config: dict[str, Any], message: str) -> None:
    from tokenbucket._exceptions import ConfigError

    with pytest.raises(ConfigError) as info:
        check_bucket_config(config, DiTCostModel(CFG), 2**36, text_tokens=512, where="table.json")
    assert message in str(info.value) and str(info.value).startswith("table.json") and "\n" not in str(info.value)


def test_video_plan_cli_flags_go_with_a_video_dit_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = tmp_path / "m.parquet"
    pq.write_table(clips(10), meta)
    code, _, err = _cli(capsys, "plan", str(meta), "--gpu", "H100-SXM", "--out", str(tmp_path / "o.parquet"),
                        "--sizes", "480x832")  # fmt: skip
    assert code == 2 and "--sizes go with a video DiT's plan" in err
    pipe = _pipeline(tmp_path / "wan")
    code, _, err = _cli(capsys, "plan", str(meta), "--hf-config", str(pipe), "--gpu", "H100-SXM", "--out",
                        str(tmp_path / "o.parquet"), "--mode", "dynamic")  # fmt: skip
    assert code == 2 and "--mode plan by token lengths" in err and len(err.strip().splitlines()) == 1


def test_views_laid_along_time_are_one_sequence_of_the_transformer_and_as_a_batch_a_larger_batch() -> None:
    """NOTE [ Views of a sample ]: three cameras' latents one after the other along the latent time
    axis are the sequence diffusers' Wan forward sees; as a batch of views, three sequences."""
    diffusers = pytest.importorskip("diffusers")
    from tokenbucket.models import dit_family

    t = {**WAN, "num_attention_heads": 2, "attention_head_dim": 16, "ffn_dim": 32, "num_layers": 1, "text_dim": 16}
    cfg = DiTConfig("tiny", "WanTransformer3DModel", t, VAEFactors(4, 8, 16, "x"))
    fam = dit_family(cfg.class_name)
    clip = fam.latents(cfg, 33, 96, 160)
    laid, per_sample = fam.laid_views(cfg, clip, 3)
    assert per_sample == 1 and laid.tokens == 3 * clip.tokens and laid.frames == 3 * clip.frames
    seen: list[int] = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = diffusers.WanTransformer3DModel.from_config({k: v for k, v in t.items() if not k.startswith("_")})
        model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
        model(**{k: v for k, v in fam.inputs(cfg, 1, laid, 8, torch.float32).items() if k != "target"})
    assert seen == [laid.tokens]
    cost = DiTCostModel(cfg)
    time_laid = cost.sample_memory(2, frames=33, height=96, width=160, text_tokens=8, views=3)
    assert time_laid.peak_bytes == cost.memory(2, 3 * clip.tokens, 8).peak_bytes
    batched = cost.sample_memory(2, frames=33, height=96, width=160, text_tokens=8, views=3, view_layout="batch")
    assert batched.peak_bytes == cost.memory(6, clip.tokens, 8).peak_bytes and batched.sequences_per_sample == 3


@pytest.mark.parametrize("layout", ["time", "batch"])
def test_video_plan_of_multi_view_samples_fits_each_sample_with_all_its_views(layout: str) -> None:
    table = clips(200).append_column("cameras", pa.array(np.random.default_rng(1).choice([1, 3, 6], 200)))
    cost, budget = DiTCostModel(CFG, DiTSetup(checkpointing=True)), gpu_budget_bytes("H100-SXM")
    plan = plan_video_buckets(table, cost, budget, view_layout=layout)
    cams = table.column("cameras").to_numpy()
    assert {b.views for b in plan.buckets} == {1, 3, 6}
    for row, b in enumerate(plan.assignment.tolist()):
        if b >= 0:
            bucket = plan.buckets[b]
            assert bucket.views == cams[row]
            est = cost.sample_memory(bucket.batch_size, frames=bucket.frames, height=bucket.height,
                                     width=bucket.width, text_tokens=bucket.text_tokens, views=bucket.views,
                                     view_layout=layout)  # fmt: skip
            assert est.peak_bytes <= budget
    with pytest.raises(ConfigError, match="several views"):
        plan.to_opensora()


def test_video_sampler_and_collate_give_each_planned_clip_once_in_batches_of_one_latent_shape() -> None:
    from torch.utils.data import DataLoader

    from tokenbucket import DiTLatentCollate, video_sampler

    table = clips(300)
    plan = plan_video_buckets(table, DiTCostModel(CFG, DiTSetup(checkpointing=True)), gpu_budget_bytes("H100-SXM"))

    class Clips(torch.utils.data.Dataset[dict[str, Any]]):  # latents of each clip's bucket (tiny stand-ins)
        def __len__(self) -> int:
            return table.num_rows

        def __getitem__(self, i: int) -> dict[str, Any]:
            b = plan.buckets[int(plan.assignment[i])]
            grid = ((b.frames - 1) // 4 + 1, b.height // 8 // 8 * 2, b.width // 8 // 8 * 2)  # small, whole patches
            return {"key": i, "latents": torch.zeros(1, *grid), "text": torch.zeros(int(i % 7) + 1, 2)}

    loader = DataLoader(Clips(), batch_sampler=video_sampler(plan, seed=3), collate_fn=DiTLatentCollate())
    seen: list[int] = []
    for batch in loader:
        keys = batch["keys"]
        bucket = {int(plan.assignment[k]) for k in keys}
        assert len(bucket) == 1 and len(keys) <= plan.buckets[bucket.pop()].batch_size  # one bucket, its batch
        assert batch["encoder_attention_mask"].sum(dim=1).tolist() == [k % 7 + 1 for k in keys]
        seen.extend(keys)
    assert sorted(seen) == [i for i in range(table.num_rows) if plan.assignment[i] >= 0]
    with pytest.raises(ConfigError, match=r"^a batch mixes latent shapes .* feed the DataLoader video_sampler"):
        DiTLatentCollate()([{"latents": torch.zeros(1, 1, 2, 2), "text": torch.zeros(1, 2)},
                            {"latents": torch.zeros(1, 2, 2, 2), "text": torch.zeros(1, 2)}])  # fmt: skip


def test_video_plan_cli_bad_clip_values_end_in_one_line_and_force_never_replaces_an_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe, meta = _pipeline(tmp_path / "wan"), tmp_path / "clips.parquet"
    pq.write_table(pa.table({"frames": ["81", "many"], "height": [480, 480], "width": [832, 832]}), meta)
    base = ["plan", str(meta), "--hf-config", str(pipe), "--gpu", "H100-SXM"]
    code, _, err = _cli(capsys, *base, "--out", str(tmp_path / "plan.parquet"))
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert str(meta) in err and "row 1" in err and "'frames'" in err and "many" in err
    pq.write_table(clips(5), meta)
    before = meta.read_bytes()
    code, _, err = _cli(capsys, *base, "--on-oversize", "reject", "--out", str(meta), "--force")  # the input, forced
    assert code == 2 and "is (or holds) the metadata input" in err and meta.read_bytes() == before
