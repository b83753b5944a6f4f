"""Gemma 3 (tokenbucket/models/gemma3.py): counts against the pinned processor, stages against transformers.

The oracle is transformers' own ``Gemma3ImageProcessor`` (PIL backend) built from the config
values in the test, with ``Gemma3Processor``'s defaults where ``preprocessor_config.json`` says
null (NOTE [ Gemma 3 crops ]): every image and crop it returns is one 256-token pass. The
wrapper tokens the processor adds around each pass are text (NOTE [ Gemma 3 wrapper tokens ]).
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
from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import load_hf_config, staged_from_config
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models.gemma3 import GEMMA3_PAN_AND_SCAN
from tokenbucket.tokens.hf import token_spec_from_hf

# google/gemma-3-4b-it: SigLIP so400m at 896/14 pooled 4 x 4 to 256 tokens; Gemma 3 text
GEMMA3_4B: dict[str, Any] = {
    "model_type": "gemma3", "mm_tokens_per_image": 256, "image_token_index": 262144,
    "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                    "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "vocab_size": 262208, "sliding_window": 1024, "query_pre_attn_scalar": 256,
                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "final_logit_softcapping": None},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                      "num_hidden_layers": 27, "num_attention_heads": 16, "patch_size": 14, "image_size": 896,
                      "vision_use_head": False},
}  # fmt: skip
# the grid, plus sizes at each pan-and-scan threshold (ratio 1.2 exactly, crops at 256 px, ...)
SIZES = [*GRID, (100, 120), (100, 121), (600, 720), (720, 600), (256, 512), (255, 600), (300, 1000), (512, 2048),
         (2000, 500), (400, 3000), (10, 1000), (1000, 10), (500, 1250), (250, 625), (896, 896)]  # fmt: skip
# preprocessor_config.json variants: the hub's (all null: pan-and-scan off), on with the
# processor's defaults, and on with other limits
CONFIGS: list[dict[str, Any]] = [
    {"do_pan_and_scan": None, "pan_and_scan_min_crop_size": None, "pan_and_scan_max_num_crops": None,
     "pan_and_scan_min_ratio_to_activate": None},
    {"do_pan_and_scan": True},
    {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 128, "pan_and_scan_max_num_crops": 8,
     "pan_and_scan_min_ratio_to_activate": 1.0},
    {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 512, "pan_and_scan_max_num_crops": 2,
     "pan_and_scan_min_ratio_to_activate": 2.0},
]  # fmt: skip


def _passes(pre: dict[str, Any], sizes: list[tuple[int, int]]) -> list[int]:
    """Tower passes per image (the image and its crops) from the pinned processor, all images in one call."""
    kwargs = {k: (v if (v := pre.get(k)) is not None else d) for k, d in GEMMA3_PAN_AND_SCAN.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # a small output side: what is counted (the crops) is decided on the original size,
        # before the resize, and the resize of every pass is what makes the processor slow
        proc = transformers.Gemma3ImageProcessorPil(size={"height": 28, "width": 28}, **kwargs)
        out = proc([np.zeros((h, w, 3), dtype=np.uint8) for h, w in sizes], return_tensors="np")
    crops = [int(n) for n in out["num_crops"]]
    assert len(out["pixel_values"]) == len(sizes) + sum(crops)
    return [1 + n for n in crops]


@pytest.mark.parametrize("pre", CONFIGS, ids=["hub-null", "pas-default", "pas-128-8-1.0", "pas-512-2-2.0"])
def test_gemma3_counts_equal_the_processor_over_the_grid(pre: dict[str, Any]) -> None:
    cfg = HFConfig("<g>", GEMMA3_4B, pre)
    expected = {s: 256 * n for s, n in zip(SIZES, _passes(pre, SIZES), strict=True)}
    assert _mismatches(cfg, expected) == []
    assert len(expected) == len(SIZES) == 45
    family = models.of(cfg)
    for (h, w), tokens in expected.items():  # passes and patches: what the tower runs
        vi = family.vision_inputs(cfg, h, w)
        assert (vi.tower_images * 256, vi.patches_per_image) == (tokens, 4096)
    if pre.get("do_pan_and_scan"):
        assert token_spec_from_hf(cfg).resize == "model" and max(expected.values()) > 256
    else:
        assert token_spec_from_hf(cfg).resize == "fixed" and set(expected.values()) == {256}


def test_gemma3_images_of_a_sample_are_counted_one_by_one() -> None:
    # the processor's crops depend on each image alone: a batch of mixed images is their sum
    pre = CONFIGS[1]
    sizes = [(480, 1280), (896, 896), (1280, 480), (300, 1000)]
    cfg = HFConfig("<g>", GEMMA3_4B, pre)
    assert [models.of(cfg).vision_inputs(cfg, h, w).tower_images for h, w in sizes] == _passes(pre, sizes)
    assert _passes(pre, sizes) == [4, 1, 4, 4]


def test_gemma3_stages_equal_transformers_at_the_real_size(tmp_path: Path) -> None:
    # gemma-3-4b: 4,300,079,472 parameters, every one in a priced stage
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_4B))
    staged = load_hf_config(tmp_path)
    hf_cfg = transformers.AutoConfig.from_pretrained(str(tmp_path))
    import torch

    with torch.device("meta"):
        model = transformers.Gemma3ForConditionalGeneration(hf_cfg)
    real = {name: int(sum(p.numel() for p in mod.parameters())) for name, mod in model.model.named_children()}
    assert staged.params == sum(p.numel() for p in model.parameters()) == 4_300_079_472
    stages = staged.params_by_stage()
    assert stages["vision"] == real["vision_tower"] and stages["projector"] == real["multi_modal_projector"]
    assert stages["embedding"] + stages["backbone"] == real["language_model"]
    assert staged.qk_norm and staged.explicit_mask and staged.tied_embeddings and staged.norms_per_layer == 4
    assert staged.projector is not None and (staged.projector.kind, staged.projector.merge) == ("pool_norm_linear", 4)
    assert not staged.logit_softcap and staged.vision[0].tokens_per_image == 4096


def test_gemma3_defaults_follow_transformers_and_bad_values_raise() -> None:
    # no vision_config / text_config: transformers' SiglipVisionConfig() and Gemma3TextConfig()
    bare = staged_from_config(HFConfig("<g>", {"model_type": "gemma3", "mm_tokens_per_image": 196}))
    hf = transformers.Gemma3Config(mm_tokens_per_image=196)
    assert (bare.backbone.hidden, bare.backbone.layers, bare.vocab) == (2304, 26, 262208)
    assert (bare.vision[0].hidden, bare.vision[0].image_size, bare.vision[0].pooling_head) == (768, 224, True)
    assert (hf.text_config.hidden_size, hf.vision_config.image_size) == (2304, 224)
    with pytest.raises(ConfigError, match=r"key 'mm_tokens_per_image' should be a square whose side divides"):
        staged_from_config(HFConfig("<g>", {**GEMMA3_4B, "mm_tokens_per_image": 200}))
    cfg = HFConfig("<g>", GEMMA3_4B, {"do_pan_and_scan": "yes"})
    with pytest.raises(ConfigError, match=r"key 'do_pan_and_scan' should be a bool, but got 'yes'"):
        models.of(cfg).vision_inputs(cfg, 10, 10)
    cfg = HFConfig("<g>", GEMMA3_4B, {"do_pan_and_scan": True, "pan_and_scan_min_ratio_to_activate": -1})
    with pytest.raises(ConfigError, match=r"pan_and_scan_min_ratio_to_activate' should be a positive number"):
        models.of(cfg).vision_inputs(cfg, 10, 10)


# the smallest honest shape of the CLI comparison: gemma-3-4b's widths and one period of its
# attention pattern (5 sliding-window layers, then a full one), two SigLIP blocks, one 896-px
# image and 1,024 text tokens; the real 34 + 27 layers take minutes (the truth set has them)
GEMMA3_4B_SHALLOW = {
    **GEMMA3_4B,
    "text_config": {**GEMMA3_4B["text_config"], "num_hidden_layers": 6},
    "vision_config": {**GEMMA3_4B["vision_config"], "num_hidden_layers": 2},
}


@pytest.mark.slow
def test_gemma3_cost_and_profile_hf_config_agree_within_the_band(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenbucket.cost.staged import ERROR_BAND

    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_4B_SHALLOW))
    sample = json.dumps({"images": 1, "height": 896, "width": 896, "text_tokens": 1024})
    code, out, err = cli(capsys, "cost", "--hf-config", str(tmp_path), "--sample", sample, "--batch", "1", "--json")
    assert code == 0, err
    cost = json.loads(out)
    code, out, err = cli(capsys, "profile", "--hf-config", str(tmp_path), "--sample", sample, "--batch", "1", "--json")
    assert code == 0, err
    profile = json.loads(out)
    assert cost["seq_len"] == profile["seq_len"] == 256 + 1024
    assert cost["peak_bytes"] == profile["predicted_peak_bytes"]
    err = 100.0 * (cost["peak_bytes"] - profile["measured_peak_bytes"]) / profile["measured_peak_bytes"]
    assert ERROR_BAND[0] <= err <= ERROR_BAND[1], (cost["peak_bytes"], profile["measured_peak_bytes"], err)
    assert profile["within_band"]
