"""LLaVA-OneVision's token rule against the pinned transformers (NOTE [ LLaVA-OneVision image tokens ]).

Two oracles, neither needing a tokenizer or a download: ``LlavaOnevisionProcessor.replace_image_token``
(the count the processor writes, lone images and samples of several) on a processor built from
config values, and ``LlavaOnevisionModel.pack_image_features`` (the features the model makes:
the anyres grid, unpadding, the ``anyres_max`` downscale and the newlines) run on zero features.
The image processor itself is run on a few sizes for its crop counts.
"""

from __future__ import annotations

import json
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import transformers
from transformers.models.llava_onevision.modeling_llava_onevision import LlavaOnevisionModel

from tests.test_cli_errors import cli
from tests.test_families import GRID, _mismatches
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.staged import ERROR_BAND, Sample, StagedCostModel
from tokenbucket.models import family
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models.llava_onevision import ONEVISION_PINPOINTS
from tokenbucket.tokens.breakdown import breakdown_sample, breakdown_table
from tokenbucket.tokens.hf import token_spec_from_hf, vision_inputs

# the grid, plus sizes around the anyres_max downscale and the planner's worst image
SIZES = [*GRID, (1386, 1152), (1154, 946), (1407, 1152), (2304, 2304), (384, 2304), (3000, 500), (1152, 2305)]
SMALL_PINS = [[384, 768], [768, 384], [768, 768], [1152, 384], [384, 1152]]
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {"model_type": "llava_onevision"},  # the published processors: anyres_max_9, full
    "max4-small-pins": {"model_type": "llava_onevision", "vision_aspect_ratio": "anyres_max_4",
                        "image_grid_pinpoints": SMALL_PINS},
    "default-strategy": {"model_type": "llava_onevision", "vision_feature_select_strategy": "default"},
}  # fmt: skip
# llava-hf/llava-onevision-qwen2-0.5b-ov-hf (config.json)
PUBLISHED_05B = {
    "model_type": "llava_onevision", "tie_word_embeddings": True, "vision_feature_layer": -1,
    "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9", "image_token_index": 151646,
    "image_grid_pinpoints": ONEVISION_PINPOINTS,
    "text_config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 152000,
                    "tie_word_embeddings": True},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 384,
                      "intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 26,
                      "patch_size": 14, "vision_use_head": False},
}  # fmt: skip
SAMPLE_384 = json.dumps({"images": 1, "height": 384, "width": 384, "text_tokens": 16})


def _processor(config: dict[str, Any]) -> Any:
    proc = transformers.LlavaOnevisionProcessor.__new__(transformers.LlavaOnevisionProcessor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proc.image_processor = transformers.LlavaOnevisionImageProcessorPil(
            image_grid_pinpoints=config.get("image_grid_pinpoints", ONEVISION_PINPOINTS)
        )
    proc.num_image_tokens = (384 // 14) ** 2
    proc.vision_feature_select_strategy = config.get("vision_feature_select_strategy", "full")
    proc.vision_aspect_ratio = config.get("vision_aspect_ratio", "anyres_max_9")
    proc.image_token = "<image>"
    return proc


def _written(proc: Any, sizes: list[tuple[int, int]], per_sample: int) -> list[int]:
    """The image tokens the processor writes for each image of samples of ``per_sample`` images."""
    inputs = {"batch_num_images": [per_sample] * (len(sizes) // per_sample), "image_sizes": sizes,
              "pixel_values": [[np.zeros((3, 384, 384))]]}  # fmt: skip
    return [len(proc.replace_image_token(inputs, i)) // len("<image>") for i in range(len(sizes))]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_llava_onevision_counts_equal_the_processor_over_the_grid(name: str) -> None:
    config = CONFIGS[name]
    cfg = HFConfig(f"<{name}>", config)
    proc = _processor(config)
    expected = dict(zip(SIZES, _written(proc, SIZES, 1), strict=True))
    assert _mismatches(cfg, expected) == []  # image_tokens, the spec's scalar and vectorised paths
    two = _written(proc, SIZES[:30], 2)  # a sample of two images: neither is tiled
    assert [vision_inputs(cfg, h, w, images=2).llm_tokens for h, w in SIZES[:30]] == two
    assert set(two) == {730 if "strategy" not in name else 729}
    assert len(expected) == len(SIZES) == 37


@pytest.mark.parametrize("name", ["default", "max4-small-pins"])
def test_llava_onevision_counts_equal_the_model_packing(name: str) -> None:
    config = CONFIGS[name]
    cfg = HFConfig(f"<{name}>", config)
    tconfig = types.SimpleNamespace(
        vision_config=types.SimpleNamespace(image_size=384, patch_size=14),
        image_grid_pinpoints=config.get("image_grid_pinpoints", ONEVISION_PINPOINTS),
    )
    model = types.SimpleNamespace(config=tconfig)
    got, want = [], []
    for h, w in SIZES:
        vi = vision_inputs(cfg, h, w)
        feats = [torch.zeros((vi.tower_images, vi.patches_per_image, 1))]
        _, lens = LlavaOnevisionModel.pack_image_features(
            model, feats, torch.tensor([[h, w]]), torch.zeros(1), config.get("vision_aspect_ratio", "anyres_max_9")
        )
        got.append(vi.llm_tokens)
        want.append(int(lens[0]))
    assert got == want


def _placeholders(config: dict[str, Any], samples: list[list[tuple[int, int]]]) -> list[int]:
    """The image placeholders the processor writes for each sample of images of these sizes: the
    image processor run on the batch (its own ``batch_num_images``), then ``replace_image_token``."""
    proc = _processor(config)
    pixels = [[np.zeros((h, w, 3), dtype=np.uint8) for h, w in sizes] for sizes in samples]
    out = proc.image_processor(pixels, return_tensors="np")
    assert list(out["batch_num_images"]) == [len(sizes) for sizes in samples]
    written = [len(proc.replace_image_token(out, i)) // len("<image>") for i in range(sum(map(len, samples)))]
    each = iter(written)
    return [sum(next(each) for _ in sizes) for sizes in samples]


# per-camera rows (name, frames, height, width) and their text tokens: 1, 2 and 3 images of
# different sizes, a 3-frame camera fed as stills beside a 1-frame one (4 images) and a clip
# beside one image (the clip is a video: the image is its sample's lone one, tiled)
CAMERA_ROWS = [
    ([("head", 1, 480, 640)], 10),
    ([("head", 1, 480, 640), ("wrist", 1, 224, 224)], 7),
    ([("head", 1, 1080, 1920), ("wrist", 1, 240, 320), ("side", 1, 600, 90)], 31),
    ([("wrist", 3, 240, 320), ("head", 1, 720, 1280)], 5),
    ([("head", 8, 480, 640), ("wrist", 1, 240, 320)], 12),
]


@pytest.mark.parametrize("name", ["default", "default-strategy"])
def test_llava_onevision_breakdown_of_several_images_equals_the_processor(name: str) -> None:
    # NOTE [ Images of a sample ]: each image of a row is priced at its sample's image count
    config = CONFIGS[name]
    cfg = HFConfig(f"<{name}>", config)
    spec = token_spec_from_hf(cfg, stills=("wrist",))
    images = [[(h, w) for cam, f, h, w in row if f == 1 or cam == "wrist" for _ in range(f)] for row, _ in CAMERA_ROWS]
    clips = [sum(_clip(cfg, f, h, w) for cam, f, h, w in row if f > 1 and cam != "wrist") for row, _ in CAMERA_ROWS]
    want = [p + c + t for p, c, (_, t) in zip(_placeholders(config, images), clips, CAMERA_ROWS, strict=True)]
    rows = [{"key": f"r{i}", "cameras": [{"name": n, "frames": f, "height": h, "width": w} for n, f, h, w in row],
             "text_tokens": t} for i, (row, t) in enumerate(CAMERA_ROWS)]  # fmt: skip
    out = breakdown_table(pa.Table.from_pylist(rows), spec)
    assert out.rejected.num_rows == 0
    assert [breakdown_sample(row, spec).total for row in rows] == out.totals.tolist() == want
    strategy = 0 if name == "default" else 1
    assert want[:3] == [2929 - strategy + 10, 2 * (730 - strategy) + 7, 3 * (730 - strategy) + 31]

    # the flat schema: cameras x frames of one size, against the processor and the staged cost
    # model, with one-frame cameras (images under either feed) and, under feed="images", 2 x 3 stills
    cost = StagedCostModel(staged_from_config(cfg), config=cfg)
    flat = [(1, 1, 480, 640, 10), (2, 1, 480, 640, 10), (3, 1, 1080, 1920, 4), (2, 3, 240, 320, 0)]
    for feed in ("video", "images"):
        mine = [r for r in flat if r[1] == 1 or feed == "images"]
        names = ("cameras", "frames", "height", "width", "text_tokens")
        table = pa.table({"key": [f"f{i}" for i in range(len(mine))], **{k: [r[j] for r in mine]
                                                                        for j, k in enumerate(names)}})  # fmt: skip
        spec = token_spec_from_hf(cfg, feed=feed)
        processor = _placeholders(config, [[(h, w)] * (c * f) for c, f, h, w, _ in mine])
        staged = [cost.memory(1, Sample.stills(cameras=c, frames=f, height=h, width=w, text_tokens=t)).seq_len
                  for c, f, h, w, t in mine]  # fmt: skip
        scalar = [breakdown_sample(dict(zip(table.column_names, r, strict=True)), spec).total
                  for r in zip(*table.to_pydict().values(), strict=True)]  # fmt: skip
        assert (
            scalar
            == breakdown_table(table, spec).totals.tolist()
            == staged
            == [p + r[4] for p, r in zip(processor, mine, strict=True)]
        ), feed
        # the 2-camera row: 2 x 730 + 10 (the lone-image rule gave 2 x 2,929 + 10 = 5,868)
        assert scalar[1] == 2 * (730 - strategy) + 10


def _clip(cfg: HFConfig, frames: int, height: int, width: int) -> int:
    """A clip's tokens (checked against the video processor in tests/test_video_tokens.py)."""
    return family("llava_onevision").clip_inputs(cfg, frames, height, width).llm_tokens


def test_llava_onevision_image_processor_crops_and_multi_image_pixels() -> None:
    proc = _processor({}).image_processor
    cfg = HFConfig("<ov>", {"model_type": "llava_onevision"})
    for h, w in [(240, 320), (600, 90), (1080, 1920)]:
        pixels = proc(np.zeros((h, w, 3), dtype=np.uint8), return_tensors="np")["pixel_values"]
        assert pixels.shape[1:] == (vision_inputs(cfg, h, w).tower_images, 3, 384, 384)
    two = [[np.zeros((480, 640, 3), dtype=np.uint8)] * 2]
    out = proc(two, return_tensors="np")
    assert out["pixel_values"].shape == (2, 1, 3, 384, 384) and list(out["batch_num_images"]) == [2]


def test_llava_onevision_worst_image_and_staged_model() -> None:
    cfg = HFConfig("<ov>", PUBLISHED_05B)
    fam = family("llava_onevision")
    h, w = fam.default_image(cfg)
    # brute force over every 2 x 8 px step up to 2500 px finds no image above 8,765 tokens
    assert vision_inputs(cfg, h, w).llm_tokens == 8765 == vision_inputs(cfg, 1386, 1152).llm_tokens
    model = staged_from_config(cfg)
    assert model.params == 893_675_552  # transformers' own count: tests/test_hf_config.py
    assert model.vision[0].unused_layers == 0 and not model.vision[0].post_norm_used
    bare = staged_from_config(HFConfig("<bare>", {"model_type": "llava_onevision"}))  # transformers' defaults
    assert bare.vision[0].unused_layers == 0 and bare.vision[0].layers == 26 and not bare.vision[0].pooling_head
    cost = StagedCostModel(model, config=cfg)
    one = cost.memory(1, Sample(images=1, height=480, width=640, text_tokens=64))
    two = cost.memory(1, Sample(images=2, height=480, width=640, text_tokens=64))
    assert one.seq_len == 2929 + 64 and two.seq_len == 2 * 730 + 64


def test_llava_onevision_measured_inputs_of_a_sample_of_several_images() -> None:
    # a tiny model: three untiled images a sample (the pixels one crop each, batch_num_images real)
    tiny = {
        "model_type": "llava_onevision", "image_grid_pinpoints": [[28, 28], [28, 56], [56, 28], [56, 56]],
        "image_token_index": 900, "video_token_index": 901,
        "text_config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                          "vision_use_head": False},
    }  # fmt: skip
    from tokenbucket.cost.hf_profile import hf_inputs, profile_hf, transformers_config

    cfg = HFConfig("<tiny>", tiny)
    sample = Sample(images=3, height=40, width=56, text_tokens=8)
    real, fake = hf_inputs(cfg, transformers_config(cfg)[0], sample, 2, torch.bfloat16)
    assert fake["pixel_values"][0] == (6, 1, 3, 28, 28) and real["batch_num_images"].tolist() == [3, 3]
    run = profile_hf(cfg, sample, batch=2)
    assert run.seq_len == StagedCostModel(staged_from_config(cfg), config=cfg).memory(2, sample).seq_len == 3 * 5 + 8


@pytest.mark.parametrize(("key", "value", "message"), [
    ("vision_aspect_ratio", "anyres", "key 'vision_aspect_ratio' should be 'anyres_max_N'"),
    ("vision_feature_select_strategy", "cls", "key 'vision_feature_select_strategy' should be 'default' or 'full'"),
    ("image_grid_pinpoints", [[384]], "key 'image_grid_pinpoints' should be a list of [h, w] pairs"),
])  # fmt: skip
def test_llava_onevision_bad_keys_are_refused_in_one_line(key: str, value: Any, message: str) -> None:
    cfg = HFConfig("<bad>", {"model_type": "llava_onevision", key: value})
    with pytest.raises(ConfigError) as info:
        vision_inputs(cfg, 480, 640)
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="images should be a positive integer, but got images=0"):
        vision_inputs(HFConfig("<ov>", {"model_type": "llava_onevision"}), 480, 640, images=0)


@pytest.mark.slow
def test_llava_onevision_cli_cost_agrees_with_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the published 0.5B at its smallest honest sample: a lone 384 px image (the base image and one
    # crop through the tower, 1,485 LLM tokens); frozen tower: its backward does not run (time)
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED_05B))
    argv = ["--hf-config", str(tmp_path), "--sample", SAMPLE_384, "--train", "frozen-vision", "--batch", "1", "--json"]
    code, out, err = cli(capsys, "cost", *argv)
    assert code == 0, err
    cost = json.loads(out)
    code, out, err = cli(capsys, "profile", *argv)
    assert code == 0, err
    run = json.loads(out)
    assert run["seq_len"] == cost["seq_len"] == 1485 + 16 and run["predicted_peak_bytes"] == cost["peak_bytes"]
    err_percent = 100.0 * (cost["peak_bytes"] - run["measured_peak_bytes"]) / run["measured_peak_bytes"]
    assert ERROR_BAND[0] <= err_percent <= ERROR_BAND[1] and run["within_band"]
