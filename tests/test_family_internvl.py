"""InternVL 3 (tokenbucket/models/internvl.py) against the pinned transformers.

The oracle for the counts is transformers' own: ``InternVLProcessor._get_num_multimodal_tokens``
over a ``GotOcr2ImageProcessor`` built from the config values here (no tokenizer, no download),
and for a part of the grid the image processor itself, cutting real pixels into tiles the way the
processor asks it to (``crop_to_patches=True``), several images of different sizes at once.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers

from tests.test_cli_errors import cli
from tests.test_families import GRID, _mismatches
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.staged import ERROR_BAND, Sample, StagedCostModel
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.tokens.hf import token_spec_from_hf, vision_inputs

# OpenGVLab/InternVL3-1B-hf: InternViT-300M-448px-V2.5 and Qwen2.5-0.5B (vocab 151674, untied head)
INTERNVL3_1B: dict[str, Any] = {
    "model_type": "internvl", "downsample_ratio": 0.5, "image_seq_length": 256, "image_token_id": 151667,
    "projector_hidden_act": "gelu", "vision_feature_layer": -1, "vision_feature_select_strategy": "default",
    "tie_word_embeddings": False,
    "text_config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151674,
                    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": False},
    "vision_config": {"model_type": "internvl_vision", "hidden_size": 1024, "intermediate_size": 4096,
                      "num_hidden_layers": 24, "num_attention_heads": 16, "attention_bias": True,
                      "use_qk_norm": False, "norm_type": "layer_norm", "image_size": [448, 448],
                      "patch_size": [14, 14], "layer_scale_init_value": 0.1, "use_mean_pooling": True},
}  # fmt: skip
PRE = {"size": {"height": 448, "width": 448}}  # the hub's preprocessor_config.json (GotOcr2's own is 384)
# (min_patches, max_patches): the default, fewer, a single tile, a floor, more, a wide range
PATCHES = [(1, 12), (1, 6), (1, 1), (2, 12), (1, 24), (4, 40)]


def _image_processor(**kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, **kwargs)


def _processor(least: int, most: int) -> Any:
    """InternVLProcessor's counting method without its tokenizer (it reads only these)."""
    proc = transformers.InternVLProcessor.__new__(transformers.InternVLProcessor)
    proc.image_processor = _image_processor(min_patches=least, max_patches=most)
    proc.image_seq_length = 256
    return proc


@pytest.mark.parametrize(("least", "most"), PATCHES)
def test_internvl_counts_equal_the_processor_over_the_grid(least: int, most: int) -> None:
    cfg = HFConfig("<i>", INTERNVL3_1B, {**PRE, "min_patches": least, "max_patches": most})
    counted = _processor(least, most)._get_num_multimodal_tokens(image_sizes=GRID)
    # the processor's count holds the <img> and </img> around each image (NOTE [ HF image tokens ])
    expected = {size: n - 2 for size, n in zip(GRID, counted["num_image_tokens"], strict=True)}
    assert _mismatches(cfg, expected) == []
    for size, tiles in zip(GRID, counted["num_image_patches"], strict=True):
        assert vision_inputs(cfg, *size).tower_images == tiles
    assert token_spec_from_hf(cfg).resize == "model" and len(expected) == len(GRID) == 30


def test_internvl_tiles_equal_the_image_processor_cutting_several_images() -> None:
    # real pixels, several images of different sizes in one call, as the processor asks (crop on)
    cfg = HFConfig("<i>", INTERNVL3_1B, PRE)
    sizes = [(56, 300), (300, 200), (480, 640), (600, 90), (1008, 336), (1500, 37)]  # the processor resizes pixels
    images = [np.zeros((h, w, 3), dtype=np.uint8) for h, w in sizes]
    out = _image_processor()(images, crop_to_patches=True, return_tensors="np")
    got = [vision_inputs(cfg, h, w) for h, w in sizes]
    assert list(out["num_patches"]) == [vi.tower_images for vi in got]
    assert out["pixel_values"].shape == (sum(vi.tower_images for vi in got), 3, 448, 448)
    assert {vi.patches_per_image for vi in got} == {32 * 32 + 1}  # the class token runs in the tower


def test_internvl_480x640_is_13_tiles_and_3328_tokens_and_the_worst_image_has_the_most_tiles() -> None:
    cfg = HFConfig("<i>", INTERNVL3_1B, PRE)
    assert vision_inputs(cfg, 480, 640).llm_tokens == 13 * 256 == 3328
    family = staged_from_config(cfg)
    assert family.vision[0].tokens_per_image == 1025
    from tokenbucket.models.internvl import FAMILY

    h, w = FAMILY.default_image(cfg)
    assert vision_inputs(cfg, h, w).tower_images == 13  # 12 tiles and the thumbnail
    assert FAMILY.default_image(HFConfig("<i>", INTERNVL3_1B, {"max_patches": 1})) == (448, 448)


def test_internvl_staged_model_without_its_config_refuses_images_in_one_line() -> None:
    # without its config the tiles are unknown: one pass of 256 tokens would price a 480x640
    # image at 1/13 of the processor's 3,328 tokens; refuse rather than under-price
    cfg = HFConfig("<i>", INTERNVL3_1B, PRE)
    blind = StagedCostModel(staged_from_config(cfg))
    with pytest.raises(ConfigError, match=r"config=") as caught:
        blind.memory(1, Sample(images=1, height=480, width=640, text_tokens=16))
    assert "\n" not in str(caught.value)
    assert blind.memory(1, Sample(text_tokens=16)).peak_bytes > 0  # text alone needs no tiles
    seeing = StagedCostModel(staged_from_config(cfg), config=cfg)
    assert seeing.vision_inputs(Sample(images=1, height=480, width=640)).llm_tokens == 3328


def test_internvl_params_equal_transformers_on_the_meta_device() -> None:
    torch = pytest.importorskip("torch")
    data = {k: v for k, v in INTERNVL3_1B.items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.InternVLForConditionalGeneration(transformers.InternVLConfig(**data))
    real = sum(p.numel() for p in model.parameters())
    staged = staged_from_config(HFConfig("<i>", INTERNVL3_1B))
    assert staged.params == real == 938_193_024, staged.params_by_stage()
    assert not staged.tied_embeddings and staged.projector is not None and staged.projector.in_dim == 4096


def test_internvl_reads_the_root_tie_and_the_6b_tower_options() -> None:
    # InternVLConfig ties by default; InternViT-6B: RMSNorm blocks, q/k norm, no q/k/v bias
    untied = staged_from_config(HFConfig("<i>", INTERNVL3_1B))
    tied = staged_from_config(HFConfig("<i>", {k: v for k, v in INTERNVL3_1B.items() if k != "tie_word_embeddings"}))
    assert tied.tied_embeddings and untied.params - tied.params == 151674 * 896
    six_b = {**INTERNVL3_1B["vision_config"], "norm_type": "rms_norm", "use_qk_norm": True, "attention_bias": False}
    tower = staged_from_config(HFConfig("<i>", {**INTERNVL3_1B, "vision_config": six_b})).vision[0]
    assert tower.norm == "rmsnorm" and tower.qk_norm and not tower.qkv_bias
    # per block: no q/k/v bias (-3d), RMSNorm weights only (-2d), the q and k norms (+2d)
    assert untied.vision[0].params - tower.params == 24 * 3 * 1024


@pytest.mark.parametrize(
    ("config", "pre", "message"),
    [
        ({"downsample_ratio": 0.3}, {}, "key 'downsample_ratio' should be 1 / n for a positive integer n"),
        ({}, {"size": {"height": 448, "width": 896}}, "key 'size' should be a square tile"),
        ({}, {"max_patches": 0}, "key 'max_patches' should be an integer in [1, 256], but got 0"),
        ({"vision_config": {"image_size": [448, 224]}}, {}, "'vision_config.image_size' should be a positive integer"),
        ({}, {"size": {"height": 434, "width": 434}}, "a 434-px tile is 31 patches of 14 px a side"),
        ({"vision_config": {"use_mask_token": True}}, {}, "use_mask_token'=true (masked image pre-training)"),
    ],
)
def test_internvl_bad_config_one_line_error_naming_the_key(
    config: dict[str, Any], pre: dict[str, Any], message: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "internvl", **config}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    with pytest.raises(ConfigError) as info:
        vision_inputs(tmp_path, 480, 640)
        staged_from_config(HFConfig(str(tmp_path), {"model_type": "internvl", **config}, pre))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_internvl_cost_and_profile_cli_agree_within_the_band(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the real InternVL3-1B at its smallest honest sample: one 448-px tile (256 tokens) and a
    # short prompt, a steady-state step measured on fake tensors (~17 s on 2 cores)
    (tmp_path / "config.json").write_text(json.dumps(INTERNVL3_1B))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PRE))
    argv = ["--hf-config", str(tmp_path), "--sample", json.dumps({"images": 1, "height": 448, "width": 448,
            "text_tokens": 64}), "--batch", "1", "--json"]  # fmt: skip
    code, out, err = cli(capsys, "cost", *argv)
    assert code == 0, err
    priced = json.loads(out)
    code, out, err = cli(capsys, "profile", *argv)
    assert code == 0, err
    measured = json.loads(out)
    assert priced["seq_len"] == measured["seq_len"] == 256 + 64
    assert measured["params_total"] == priced["params"] == 938_193_024
    err_percent = 100 * (priced["peak_bytes"] - measured["measured_peak_bytes"]) / measured["measured_peak_bytes"]
    assert ERROR_BAND[0] <= err_percent <= ERROR_BAND[1] and measured["within_band"], err_percent
