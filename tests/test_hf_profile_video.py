"""profile_hf on video samples: Qwen2-VL / Qwen2.5-VL / Qwen3-VL, LLaVA-OneVision and SmolVLM2
clips through the model's own video path.

The oracle is transformers' model code: a Qwen clip reaches ``get_video_features`` as
``pixel_values_videos`` with its ``video_grid_thw``, a LLaVA-OneVision clip as
``pixel_values_videos`` [clips, frames, 3, side, side], a SmolVLM2 clip as unsplit frames in
``pixel_values``; the measured peak is held to the staged model's price of the same clip
(NOTE [ Qwen video inputs ], NOTE [ LLaVA-OneVision video inputs ], NOTE [ SmolVLM video inputs ]).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers
from benchmarks import bench_staged_cost

from tests.test_cli_errors import cli, one_line_error
from tests.test_profile_hf_cli import TINY_VL
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.hf_profile import hf_inputs, profile_hf, sample_shape, transformers_config, with_markers
from tokenbucket.cost.staged import ERROR_BAND, Sample, StagedCostModel, TrainSetup
from tokenbucket.models._hf_json import HFConfig

torch = pytest.importorskip("torch")

TINY_Q25 = {
    "model_type": "qwen2_5_vl", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 151936, "tie_word_embeddings": True,
    "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "out_hidden_size": 256, "num_heads": 4,
                      "window_size": 112, "fullatt_block_indexes": [1]},
}  # fmt: skip
TINY_Q3 = {
    "model_type": "qwen3_vl", "tie_word_embeddings": True,
    "text_config": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 151936},
    "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "out_hidden_size": 256, "num_heads": 4,
                      "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
}  # fmt: skip
TINY_LLAVA = {
    "model_type": "llava", "image_token_index": 1000,
    "text_config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024},
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "image_size": 56, "patch_size": 14},
}  # fmt: skip
TRUTH = Path(__file__).parent / "data" / "hf_truth.json"
MODELS = {"qwen2_vl": "Qwen2VLModel", "qwen2_5_vl": "Qwen2_5_VLModel", "qwen3_vl": "Qwen3VLModel"}
# two clips of 8 frames at 2 fps (Qwen3-VL's processor keeps every frame at its 2 fps); the same frames as images
CLIPS = Sample(videos=2, frames=8, height=448, width=448, text_tokens=64, fps=2.0)
STILLS = Sample(images=16, height=448, width=448, text_tokens=64)
STEADY = TrainSetup(loop="dropped")  # the HF Trainer's step, priced and measured in the steady state


def _cost(cfg: HFConfig, setup: TrainSetup = STEADY) -> StagedCostModel:
    return StagedCostModel(staged_from_config(cfg), setup, config=cfg)


def _err(cfg: HFConfig, sample: Sample, measured: int) -> float:
    return 100.0 * (_cost(cfg).memory(1, sample).peak_bytes - measured) / measured


@pytest.mark.parametrize("config", [TINY_VL, TINY_Q25, TINY_Q3], ids=lambda c: c["model_type"])
@pytest.mark.slow
def test_profile_hf_video_sample_runs_the_models_video_path_within_the_band(
    config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = HFConfig(f"<tiny-{config['model_type']}>", config)
    model_cls = getattr(transformers, MODELS[config["model_type"]])
    seen: list[tuple[tuple[int, ...], list[list[int]]]] = []
    orig = model_cls.get_video_features

    def spy(self: Any, pixel_values_videos: Any, video_grid_thw: Any = None, **kwargs: Any) -> Any:
        seen.append((tuple(pixel_values_videos.shape), video_grid_thw.tolist()))
        return orig(self, pixel_values_videos, video_grid_thw, **kwargs)

    monkeypatch.setattr(model_cls, "get_video_features", spy)
    clips = profile_hf(cfg, CLIPS, 1, STEADY, steps=2)
    # the clip's grid is what the package counts (its video processor's rule), once per step
    clip = _cost(cfg).vision_inputs(CLIPS)
    groups, rows_cols = clip.tower_images, clip.patches_per_image
    assert groups == 4  # 8 frames, two to a temporal group
    assert len(seen) == 2 and all(len(grid) == 2 and grid[0][0] == groups for _, grid in seen)
    assert seen[0][0][0] == 2 * groups * rows_cols  # one row of pixels per pre-merge patch of every group
    assert all(g[1] * g[2] == rows_cols for _, grid in seen for g in grid)
    seen.clear()
    stills = profile_hf(cfg, STILLS, 1, STEADY, steps=2)
    assert seen == []  # the same frames as images never reach the video path
    assert clips.seq_len == 2 * clip.llm_tokens + 64 < stills.seq_len
    assert clips.peak_bytes < stills.peak_bytes  # two frames to a temporal patch: half the tokens
    for sample, run in ((CLIPS, clips), (STILLS, stills)):
        assert ERROR_BAND[0] <= _err(cfg, sample, run.peak_bytes) <= ERROR_BAND[1]


def test_profile_hf_frozen_vision_video_is_within_the_band() -> None:
    cfg = HFConfig("<tiny-qwen2_vl>", TINY_VL)
    setup = TrainSetup(train="frozen-vision", loop="dropped")
    run = profile_hf(cfg, CLIPS, 2, setup, steps=2)
    est = _cost(cfg, setup).memory(2, CLIPS)
    assert run.seq_len == est.seq_len
    assert ERROR_BAND[0] <= 100.0 * (est.peak_bytes - run.peak_bytes) / run.peak_bytes <= ERROR_BAND[1]


@pytest.mark.slow
def test_profile_hf_one_frame_clips_and_a_family_without_video_measure_frames_as_images() -> None:
    # NOTE [ Frames are images ]: as StagedCostModel.clips() prices them
    qwen = HFConfig("<tiny-qwen2_vl>", TINY_VL)
    one_frame = Sample(videos=3, frames=1, height=224, width=224, text_tokens=8)
    assert not _cost(qwen).clips(one_frame)
    assert sample_shape(qwen, one_frame, 2).images == 3
    as_images = Sample(images=3, height=224, width=224, text_tokens=8)
    a, b = profile_hf(qwen, one_frame, 1, STEADY), profile_hf(qwen, as_images, 1, STEADY)
    # (the first build in a process allocates a few kB once, hence approx)
    assert a.seq_len == b.seq_len and a.peak_bytes == pytest.approx(b.peak_bytes, rel=0.01)
    llava = HFConfig("<tiny-llava>", TINY_LLAVA)
    clip = Sample(videos=2, frames=3, height=56, width=56, text_tokens=8)
    assert not _cost(llava).clips(clip) and sample_shape(llava, clip, 1).images == 6
    _, fake = hf_inputs(llava, transformers_config(llava)[0], clip, 1)
    assert "pixel_values_videos" not in fake and fake["pixel_values"][0][0] == 6
    c = profile_hf(llava, clip, 1, STEADY)
    d = profile_hf(llava, Sample(images=6, height=56, width=56, text_tokens=8), 1, STEADY)
    assert c.seq_len == d.seq_len == 6 * 16 + 8 and c.peak_bytes == pytest.approx(d.peak_bytes, rel=0.01)


def test_qwen_video_inputs_place_the_processors_markers_and_rope_positions() -> None:
    # Qwen2.5-VL: one clip of 4 frames at 4 fps, 224 px (upscaled to 336: 24 x 24 patches, 144 tokens a group)
    cfg = HFConfig("<tiny-qwen2_5_vl>", TINY_Q25)
    tconfig = transformers_config(cfg)[0]
    sample = Sample(videos=1, frames=4, height=224, width=224, text_tokens=4, fps=4.0)
    real, fake = hf_inputs(cfg, tconfig, sample, 2)
    ids = real["input_ids"][0].tolist()
    assert ids[0] == tconfig.vision_start_token_id and ids[1 + 288] == tconfig.vision_end_token_id
    assert ids[1:289] == [tconfig.video_token_id] * 288 and len(ids) == 288 + 4
    assert real["video_grid_thw"].tolist() == [[2, 24, 24]] * 2 and "image_grid_thw" not in real
    assert fake["pixel_values_videos"][0] == (2 * 2 * 24 * 24, 3 * 2 * 14 * 14)
    assert real["second_per_grid_ts"].tolist() == [0.5, 0.5]  # 2 frames a group at 4 fps
    # the temporal rope positions step by tokens_per_second x seconds per group (4 x 0.5), not by 1
    t = real["position_ids"][0, 0, 1:289].tolist()
    assert sorted(set(t)) == [1, 3] and tconfig.vision_config.tokens_per_second == 4
    # Qwen3-VL: each temporal group apart, after a timestamp (a plain text token)
    cfg3 = HFConfig("<tiny-qwen3_vl>", TINY_Q3)
    t3 = transformers_config(cfg3)[0]
    sample3 = Sample(videos=1, frames=4, height=256, width=256, text_tokens=6, fps=2.0)
    real3, _ = hf_inputs(cfg3, t3, sample3, 1)
    ids3 = real3["input_ids"][0].tolist()
    per = 16 * 16 // 4  # 4 x 256 x 256 px within Qwen3-VL's clip budget: 16 x 16 patches a frame
    group = [1, t3.vision_start_token_id, *[t3.video_token_id] * per, t3.vision_end_token_id]
    assert ids3 == group * 2 and real3["video_grid_thw"].tolist() == [[2, 16, 16]]
    assert real3["position_ids"].shape == (3, 1, len(ids3))


@pytest.mark.parametrize(
    ("config", "sample", "message"),
    [
        (TINY_VL, Sample(videos=2, frames=4, height=224, width=224, text_tokens=3),
         "a qwen2_vl clip of 2 temporal groups holds 2 marker tokens (NOTE [ Qwen video inputs ]): text_tokens "
         "should be at least 2 x videos = 4, but got text_tokens=3"),
        (TINY_Q3, Sample(videos=1, frames=8, height=256, width=256, text_tokens=11, fps=2.0),
         "a qwen3_vl clip of 4 temporal groups holds 12 marker tokens (NOTE [ Qwen video inputs ]): text_tokens "
         "should be at least 12 x videos = 12, but got text_tokens=11"),
    ],
)  # fmt: skip
def test_profile_hf_video_without_room_for_its_markers_raises_one_line(
    config: dict[str, Any], sample: Sample, message: str
) -> None:
    cfg = HFConfig("<tiny>", config)
    with pytest.raises(ConfigError) as info:
        profile_hf(cfg, sample)
    assert str(info.value) == message
    fixed = with_markers(cfg, sample)  # what the CLI's grid does: room for the markers
    assert fixed.text_tokens == int(message.split(" = ")[1].split(",")[0])


def test_profile_hf_video_processor_the_tower_cannot_read_raises_one_line() -> None:
    cfg = HFConfig("<tiny>", TINY_VL, {}, {"patch_size": 16})
    with pytest.raises(ConfigError) as info:
        profile_hf(cfg, Sample(videos=1, frames=4, height=224, width=224, text_tokens=8))
    assert str(info.value) == (
        "video_preprocessor_config.json next to '<tiny>': patch_size=16 does not match the vision tower's 14: "
        "the model cannot read these clips"
    )


def test_profile_cli_hf_config_video_sample_measures_the_clips_beside_their_price(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_VL))
    sample = {"videos": 2, "frames": 8, "height": 448, "width": 448, "text_tokens": 64}
    code, out, err = cli(capsys, "profile", "--hf-config", str(tmp_path), "--sample", json.dumps(sample), "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["seq_len"] == 2 * 4 * 256 + 64  # two clips of 4 temporal groups, not 16 images of 256 tokens
    assert r["within_band"] and abs(r["error_percent"]) < 1.0
    code, _, err = cli(
        capsys, "profile", "--hf-config", str(tmp_path), "--sample", json.dumps({**sample, "text_tokens": 3})
    )
    assert code != 0 and "text_tokens should be at least 2 x videos = 4" in one_line_error(err, "text_tokens")


# -- LLaVA-OneVision and SmolVLM2: a clip's frames through the model as its video processor makes them --

TINY_OV = {
    "model_type": "llava_onevision", "tie_word_embeddings": True, "vision_feature_layer": -1,
    "image_token_index": 151646, "video_token_index": 151647,
    "text_config": {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 152000},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 128,
                      "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 112, "patch_size": 14,
                      "vision_use_head": False},
}  # fmt: skip
OV_VIDEO = {"size": {"height": 112, "width": 112}}  # the video processor makes the tower's square
TINY_SMOL = {
    "model_type": "smolvlm", "scale_factor": 2, "image_token_id": 49190, "tie_word_embeddings": True,
    "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "image_size": 128, "patch_size": 16},
    "text_config": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 49280},
}  # fmt: skip
SMOL_VIDEO = {"max_image_size": {"longest_edge": 128}}  # every frame the tower's square, all kept
FRAMES = Sample(videos=2, frames=8, height=240, width=320, text_tokens=64, fps=2.0)


@pytest.mark.slow
def test_profile_hf_onevision_clips_run_get_video_features_within_the_band(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = HFConfig("<tiny-ov>", TINY_OV, {}, OV_VIDEO)
    seen: list[tuple[int, ...]] = []
    orig = transformers.LlavaOnevisionModel.get_video_features

    def spy(self: Any, pixel_values_videos: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(tuple(pixel_values_videos.shape))
        return orig(self, pixel_values_videos, *args, **kwargs)

    monkeypatch.setattr(transformers.LlavaOnevisionModel, "get_video_features", spy)
    real, fake = hf_inputs(cfg, transformers_config(cfg)[0], FRAMES, 2)
    # NOTE [ LLaVA-OneVision video inputs ]: one row of frames per clip, 8 x 4 x 4 pooled tokens + a newline each
    assert fake == {"pixel_values_videos": ((4, 8, 3, 112, 112), torch.bfloat16)}
    assert set(real) == {"input_ids", "labels"} and real["input_ids"].shape == (2, 2 * 129 + 64)
    assert int((real["input_ids"][0] == 151647).sum()) == 2 * 129 and int((real["input_ids"] == 151646).sum()) == 0
    for setup in (STEADY, TrainSetup(train="frozen-vision", loop="dropped")):
        run = profile_hf(cfg, FRAMES, 2, setup, steps=2)
        est = _cost(cfg, setup).memory(2, FRAMES)
        assert run.seq_len == est.seq_len == 2 * 129 + 64
        assert ERROR_BAND[0] <= 100.0 * (est.peak_bytes - run.peak_bytes) / run.peak_bytes <= ERROR_BAND[1]
    assert seen == [(4, 8, 3, 112, 112)] * 4  # the video path, once a step


@pytest.mark.slow
def test_profile_hf_smolvlm_clips_are_unsplit_frames_within_the_band(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = HFConfig("<tiny-smolvlm>", TINY_SMOL, {}, SMOL_VIDEO)
    seen: list[tuple[int, ...]] = []
    orig = transformers.SmolVLMModel.get_image_features

    def spy(self: Any, pixel_values: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(tuple(pixel_values.shape))
        return orig(self, pixel_values, *args, **kwargs)

    monkeypatch.setattr(transformers.SmolVLMModel, "get_image_features", spy)
    real, fake = hf_inputs(cfg, transformers_config(cfg)[0], FRAMES, 2)
    # NOTE [ SmolVLM video inputs ]: each kept frame one 128 px image, never split: 8 x 8 / 2**2 = 16 tokens
    assert real["pixel_values"].shape == (2, 16, 3, 128, 128) and real["pixel_attention_mask"].shape == (
        2,
        16,
        128,
        128,
    )
    assert fake == {"_pixels_held": ((2, 16, 3, 128, 128), torch.bfloat16)}
    assert int((real["input_ids"][0] == 49190).sum()) == 16 * 16 and real["input_ids"].shape == (2, 16 * 16 + 64)
    for setup in (STEADY, TrainSetup(train="lora", loop="dropped")):
        run = profile_hf(cfg, FRAMES, 2, setup, steps=2)
        est = _cost(cfg, setup).memory(2, FRAMES)
        assert run.seq_len == est.seq_len == 16 * 16 + 64
        assert ERROR_BAND[0] <= 100.0 * (est.peak_bytes - run.peak_bytes) / run.peak_bytes <= ERROR_BAND[1]
    assert seen == [(2, 16, 3, 128, 128)] * 4


@pytest.mark.parametrize(
    ("config", "video", "message"),
    [
        (TINY_OV, {}, "video_preprocessor_config.json next to '<tiny>': its frames are 384x384, but the model pools "
         "each frame's features as the vision tower's 112x112 square: the model cannot read these clips"),
        (TINY_SMOL, {}, "video_preprocessor_config.json next to '<tiny>': its frames are 364x364, but the vision "
         "tower reads 128x128 (max_image_size.longest_edge should be 128): the model cannot read these clips"),
    ],
)  # fmt: skip
def test_profile_hf_clips_the_tower_cannot_read_raise_one_line(
    config: dict[str, Any], video: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        profile_hf(HFConfig("<tiny>", config, {}, video), FRAMES)
    assert str(info.value) == message


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "train", "sharding"), [("llava-onevision-0.5b", "lora", "none"), ("smolvlm2-256m", "full", "fsdp8")]
)
def test_profile_hf_video_equals_the_truth_set(arch: str, train: str, sharding: str) -> None:
    # the package's clip inputs (Family.inputs) against benchmarks/hf_truth.py's own: equal peaks (measured exact)
    data = json.loads(TRUTH.read_text())
    point = next(
        p for p in data["points"]
        if (p["arch"], p["train"], p["sharding"], p["steps"], p.get("videos", 0), p["batch"]) == (arch, train, sharding, 1, 2, 2)
    )  # fmt: skip
    run = profile_hf(
        bench_staged_cost.hf_config(arch, data["configs"]), bench_staged_cost.sample_of(point), point["batch"],
        bench_staged_cost.setup_of(point), kernels="cpu",
    )  # fmt: skip
    assert run.seq_len == point["seq_len"]
    assert run.peak_bytes == pytest.approx(point["peak_bytes"], rel=1e-3)
