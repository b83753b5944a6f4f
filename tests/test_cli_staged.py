"""``cost`` and ``ledger`` on a staged model (a Hugging Face config.json or a staged preset): the
numbers are the library's, per rank, itemised per stage; the training flags move them the right
way; mistakes end as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli_errors import cli, one_line_error, snapshot
from tokenbucket import models
from tokenbucket.cost.hf_model import StagedModel, load_hf_config
from tokenbucket.cost.staged import STAGE_ITEMS, Sample, StagedCostModel, TrainSetup
from tokenbucket.tokens.hf import read_hf_config

TRUTH = Path(__file__).parent / "data" / "hf_truth.json"
SAMPLE = '{"images": 4, "height": 448, "width": 448, "text_tokens": 512}'


def qwen2_vl_dir(tmp_path: Path) -> Path:
    """Qwen2-VL-2B's config.json, as transformers wrote it for the truth set."""
    folder = tmp_path / "qwen2-vl-2b"
    folder.mkdir()
    config = json.loads(TRUTH.read_text())["configs"]["qwen2-vl-2b"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_cost_hf_config_json_is_the_library_estimate_per_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = qwen2_vl_dir(tmp_path)
    code, out, err = cli(capsys, "cost", "--hf-config", str(folder), "--sample", SAMPLE, "--batch", "2", "--json")
    assert code == 0, err
    got = json.loads(out)
    lib = StagedCostModel(load_hf_config(folder), config=read_hf_config(folder))
    want = lib.memory(2, Sample(images=4, height=448, width=448, text_tokens=512))
    assert got["peak_bytes"] == want.peak_bytes and got["phase"] == want.phase
    assert got["seq_len"] == 4 * 256 + 512  # 448 px: 32 x 32 patches merged 2 x 2
    assert sum(sum(items[i] for i in STAGE_ITEMS) for items in got["stages"].values()) == got["peak_bytes"]
    assert got["stages"]["vision"]["activations"] > 0 and got["stages"]["head_loss"]["activations"] > 0


def test_cost_hf_config_video_sample_is_the_library_estimate_of_its_clips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--sample '{"videos": N, "frames": F, ...}'``: N clips through Qwen2-VL's video path; the
    JSON keeps peak_bytes and the LLM tokens (frame pairs merged: 2 x 8 x 256 + text)."""
    folder = qwen2_vl_dir(tmp_path)
    video = '{"videos": 2, "frames": 16, "height": 448, "width": 448, "text_tokens": 100}'
    code, out, err = cli(capsys, "cost", "--hf-config", str(folder), "--sample", video, "--batch", "2", "--json")
    assert code == 0, err
    got = json.loads(out)
    lib = StagedCostModel(load_hf_config(folder), config=read_hf_config(folder))
    want = lib.memory(2, Sample(videos=2, frames=16, height=448, width=448, text_tokens=100))
    assert got["peak_bytes"] == want.peak_bytes and got["seq_len"] == 2 * 8 * 256 + 100
    stills = '{"images": 32, "height": 448, "width": 448, "text_tokens": 100}'
    code, out, err = cli(capsys, "cost", "--hf-config", str(folder), "--sample", stills, "--batch", "2", "--json")
    assert (
        code == 0 and json.loads(out)["seq_len"] == 32 * 256 + 100 and json.loads(out)["peak_bytes"] > got["peak_bytes"]
    )


def test_cost_training_flags_move_the_peak_the_right_way(capsys: pytest.CaptureFixture[str]) -> None:
    def peak(*flags: str) -> int:
        code, out, err = cli(  # batch 4: activations, not the optimizer step, make the peak
            capsys, "cost", "--preset", "qwen2-vl-2b", "--sample", SAMPLE, "--batch", "4", "--json", *flags
        )
        assert code == 0, err
        return int(json.loads(out)["peak_bytes"])

    full = peak()
    assert peak("--sharding", "fsdp", "--world-size", "8") < full
    assert peak("--train", "lora") < peak("--train", "frozen-vision") < full
    assert peak("--backbone-checkpointing", "full", "--vision-checkpointing", "full") < full
    assert peak("--optimizer", "sgd") < full
    lib = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), TrainSetup(sharding="fsdp", world_size=8))
    assert (
        peak("--sharding", "fsdp", "--world-size", "8")
        == lib.memory(4, Sample(images=4, height=448, width=448, text_tokens=512)).peak_bytes
    )


def test_cost_staged_with_a_gpu_says_whether_it_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(
        capsys, "cost", "--preset", "qwen2-vl-2b", "--sample", SAMPLE, "--batch", "2", "--gpu", "h100-sxm"
    )
    assert code == 0, err
    assert "per rank" in out and "vision" in out and "head_loss" in out and "largest batch of this sample" in out


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--preset", "qwen2-vl-2b", "--batch", "1"], ["--sample"]),
        (["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", SAMPLE, "--length", "100"], ["--length"]),
        (
            ["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", SAMPLE, "--world-size", "2"],
            ["--world-size", "--sharding"],
        ),
        (
            ["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", SAMPLE, "--hidden", "64"],
            ["--hidden", "--hf-config"],
        ),
        (["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", '{"imgs": 2}'], ["--sample", "imgs"]),
        (["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", '{"images": -1}'], ["--sample", "images"]),
        (["--batch", "1", "--length", "64", "--train", "lora"], ["--train", "--hf-config"]),
        (["--batch", "1", "--length", "64", "--vision-checkpointing", "full"], ["--vision-checkpointing"]),
        (["--batch", "1", "--length", "64", "--ddp-bucket-view"], ["--ddp-bucket-view", "--hf-config"]),
        (
            ["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", SAMPLE, "--ddp-bucket-view"],
            ["--ddp-bucket-view", "--sharding ddp"],
        ),
        (
            ["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", SAMPLE, "--qkv-layout", "contiguous"],
            ["--qkv-layout", "--hf-config"],
        ),
        (["--batch", "1"], ["--length"]),
        (
            ["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", '{"images": 2, "videos": 1, "frames": 4}'],
            ["--sample", "images", "videos"],
        ),
        (
            ["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", '{"videos": 1, "cameras": 1, "frames": 4}'],
            ["--sample", "videos", "cameras"],
        ),
        (
            [
                "--preset",
                "qwen2-vl-2b",
                "--batch",
                "1",
                "--sample",
                '{"images": 1, "height": 448, "width": 448, "fps": 2}',
            ],
            ["--sample", "fps", "videos"],
        ),
        (
            [
                "--preset",
                "qwen2-vl-2b",
                "--batch",
                "1",
                "--sample",
                '{"videos": 1, "frames": 4, "height": 448, "width": 448, "fps": 0}',
            ],
            ["--sample", "fps"],
        ),
    ],
)
def test_cost_staged_usage_mistakes_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], names: list[str]
) -> None:
    code, _, err = cli(capsys, "cost", *argv)
    assert code == 2
    one_line_error(err, *names)


def test_cost_unsupported_config_names_the_file_and_the_supported_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "cost", "--hf-config", str(tmp_path), "--sample", SAMPLE, "--batch", "1")
    assert code == 1
    line = one_line_error(err, "config.json", "mamba", "qwen2_vl", "llava")
    assert "supported" in line
    assert snapshot(tmp_path) == before


def test_ledger_worked_example_for_qwen2_vl_2b(capsys: pytest.CaptureFixture[str]) -> None:
    """The design document's sample, 4 cameras x 16 frames at 448 px, on Qwen2-VL-2B, as the
    video processor feeds it (4 clips: frame pairs merge, 4 x 8 x 256 = 8,192 LLM tokens) and as
    64 stills (16,384): the vision tower holds more activation memory than the backbone both ways."""
    video = '{"videos": 4, "frames": 16, "height": 448, "width": 448}'
    stills = '{"images": 64, "height": 448, "width": 448}'
    got = {}
    for name, sample in (("video", video), ("stills", stills)):
        code, out, err = cli(capsys, "ledger", "--preset", "qwen2-vl-2b", "--sample", sample, "--json")
        assert code == 0, err
        got[name] = json.loads(out)
    assert got["video"]["tokens"] == {
        "images": 0, "videos": 4, "frames": 16, "tower_passes": 32, "patches_per_pass": 1024,
        "image_tokens": 8192, "text_tokens": 0, "llm_tokens": 8192,
    }  # fmt: skip
    assert got["stills"]["tokens"] == {
        "images": 64, "videos": 0, "frames": 0, "tower_passes": 64, "patches_per_pass": 1024,
        "image_tokens": 16384, "text_tokens": 0, "llm_tokens": 16384,
    }  # fmt: skip
    for led in got.values():
        stages = led["stages"]
        assert stages["vision"]["activations"] > stages["backbone"]["activations"] > 0
        assert sum(led["params_by_stage"].values()) == StagedModel.preset("qwen2-vl-2b").params
    # half the tokens and half the tower passes: the clip's peak is well under the stills'
    assert got["video"]["peak_bytes"] < 0.75 * got["stills"]["peak_bytes"]
    cameras = video.replace('"videos"', '"cameras"')  # one clip per camera: the same sample
    code, out, err = cli(capsys, "ledger", "--preset", "qwen2-vl-2b", "--sample", cameras, "--json")
    assert code == 0 and json.loads(out)["tokens"] == got["video"]["tokens"]
    code, text, err = cli(capsys, "ledger", "--preset", "qwen2-vl-2b", "--sample", video)
    assert code == 0 and "4 videos of 16 frames" in text and "8,192 image tokens" in text and "vision" in text
    code, text, err = cli(capsys, "ledger", "--preset", "qwen2-vl-2b", "--sample", stills)
    assert code == 0 and "64 images" in text and "16,384 image tokens" in text
    code, _, err = cli(capsys, "ledger", "--preset", "qwen2-vl-2b", "--sample", video, "--whatif", "frames=32")
    assert code == 2
    one_line_error(err, "--whatif")


def test_cost_setup_errors_are_in_the_flags_words(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--preset", "qwen2-vl-2b", "--sample", SAMPLE, "--batch", "1", "--sharding", "none", "--world-size", "8"]
    code, _, err = cli(capsys, "cost", *argv)
    assert code == 2
    line = one_line_error(err, "--world-size 8", "--sharding 'none'")
    assert "----" not in line and "world_size" not in line


def test_ledger_block_model_refuses_the_training_setup_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """They price a staged model; the block ledger used to ignore them without a word."""
    sample = '{"cameras": 1, "frames": 1, "height": 224, "width": 224}'
    code, out, err = cli(capsys, "ledger", "--sample", sample, "--patch", "14", "--train", "lora", "--sharding", "ddp")
    assert code == 2 and out == ""
    one_line_error(err, "--train", "--sharding", "--hf-config")


def test_cost_ddp_buckets_cost_the_trainable_gradients_once_more(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--preset", "qwen2-vl-2b", "--batch", "1", "--sample", SAMPLE, "--train", "lora", "--json"]
    peaks = {}
    for name, extra in (("none", []), ("ddp", ["--sharding", "ddp", "--world-size", "8"]),
                        ("view", ["--sharding", "ddp", "--world-size", "8", "--ddp-bucket-view"])):  # fmt: skip
        code, out, _ = cli(capsys, "cost", *base, *extra)
        assert code == 0
        peaks[name] = json.loads(out)["peak_bytes"]
    setup = TrainSetup(train="lora")
    sample = Sample(**json.loads(SAMPLE))
    trainable = sum(u.trainable for u in StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup).units(1, sample))
    assert peaks["view"] == peaks["none"] and peaks["ddp"] - peaks["none"] == 2 * trainable


def test_video_processor_flag_changes_the_clip_rule_as_processor_kwargs_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--video-processor KEY=VALUE`` is ``processor(videos=..., KEY=VALUE)``: sampling a 32-frame
    30-fps clip at 4 fps keeps 4 frames (2 temporal groups); num_frames=8 keeps 8; the clip rule
    through the library gives the same counts; mistakes are one line."""
    folder = qwen2_vl_dir(tmp_path)
    sample = '{"videos": 1, "frames": 32, "height": 448, "width": 448, "fps": 30}'
    argv = ["cost", "--hf-config", str(folder), "--batch", "1", "--sample", sample, "--json"]
    seq = {}
    for name, extra in (("all", ("do_sample_frames=false",)), ("fps4", ("do_sample_frames=true", "fps=4")),
                        ("eight", ("do_sample_frames=true", "num_frames=8"))):  # fmt: skip
        flags = [f for kv in extra for f in ("--video-processor", kv)]
        code, out, err = cli(capsys, *argv, *flags)
        assert code == 0, err
        seq[name] = json.loads(out)["seq_len"]
    cfg = read_hf_config(folder)
    family = models.of(cfg)
    for name, changes in (("fps4", {"fps": 4}), ("eight", {"num_frames": 8})):
        changed = cfg.with_video({"do_sample_frames": True, **changes})
        assert seq[name] == family.clip_inputs(changed, 32, 448, 448, fps=30).llm_tokens
    assert seq == {"all": 16 * 256, "fps4": 2 * 256, "eight": 4 * 256}
    for bad, words in (
        ("bogus", ("--video-processor", "KEY=VALUE")),
        ("max_pixels=-1", ("--video-processor", "max_pixels", "-1")),
        ("do_sample_frames=true", ("--video-processor", "needs fps or num_frames")),  # transformers fails too
    ):
        code, out, err = cli(capsys, *argv, "--video-processor", bad)
        assert code == 2 and out == ""
        one_line_error(err, *words)
    code, _, err = cli(capsys, "cost", "--length", "64", "--batch", "1", "--video-processor", "fps=2")
    assert code == 2
    one_line_error(err, "--video-processor", "--hf-config")
