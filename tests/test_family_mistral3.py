"""Mistral 3 (Mistral Small 3.1 / Pixtral): counts against the pinned processor, stages against transformers.

The oracle for the counts is the pinned ``transformers``' own ``PixtralImageProcessor`` built from
the config values here (no tokenizer, no download), run on real pixels with the patch the
processor hands it (``patch_size x spatial_merge_size``), and the resize function
``PixtralProcessor._get_num_multimodal_tokens`` counts with (the processor class itself needs
torchvision): ``rows x (cols + 1)`` tokens, NOTE [ Pixtral row breaks ] in
``tokenbucket.models.mistral3``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers
from transformers.models.pixtral.image_processing_pil_pixtral import get_resize_output_image_size

from tests.test_cli_errors import cli
from tests.test_families import GRID, _mismatches, _pixels
from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import load_hf_config, staged_from_config
from tokenbucket.cost.staged import ERROR_BAND
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models.mistral3 import MISTRAL_SMALL_TEXT

torch = pytest.importorskip("torch")

PIXTRAL_VISION = {"model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "patch_size": 14, "image_size": 1540, "head_dim": 64}  # fmt: skip
MISTRAL_SMALL_31 = {"model_type": "mistral3", "spatial_merge_size": 2, "vision_feature_layer": -1,
                    "multimodal_projector_bias": False, "image_token_index": 10, "tie_word_embeddings": False,
                    "text_config": {**MISTRAL_SMALL_TEXT, "rms_norm_eps": 1e-5, "sliding_window": None},
                    "vision_config": PIXTRAL_VISION}  # fmt: skip
# (config, preprocessor_config, the processor's patch, merge and longest edge)
VARIANTS: list[tuple[dict[str, Any], dict[str, Any], int, int, int]] = [
    (MISTRAL_SMALL_31, {"size": {"longest_edge": 1540}, "patch_size": {"height": 14, "width": 14}}, 14, 2, 1540),
    ({"model_type": "mistral3"}, {}, 14, 2, 1024),  # transformers' defaults: the processor's 1024
    ({"model_type": "mistral3", "vision_config": {"patch_size": 16}}, {"size": {"longest_edge": 1024}}, 16, 2, 1024),
    ({"model_type": "mistral3", "spatial_merge_size": 1}, {"size": {"longest_edge": 1540}}, 14, 1, 1540),
    ({"model_type": "mistral3", "vision_config": {"model_type": "pixtral", "patch_size": 16}, "spatial_merge_size": 1},
     {"size": {"longest_edge": 512}}, 16, 1, 512),
]  # fmt: skip


def _counted(sizes: list[tuple[int, int]], patch: int, merge: int, longest: int) -> list[int]:
    """PixtralProcessor._get_num_multimodal_tokens: the resized sides, a row break per merged row."""
    factor, out = patch * merge, []
    for h, w in sizes:
        rh, rw = get_resize_output_image_size(np.zeros((h, w, 3)), (longest, longest), (factor, factor))
        out.append((rh // factor) * (rw // factor + 1))
    return out


def _processor(longest: int) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.PixtralImageProcessorPil(size={"longest_edge": longest})


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_mistral3_counts_equal_the_processor_over_the_grid(variant: int) -> None:
    config, pre, patch, merge, longest = VARIANTS[variant]
    cfg = HFConfig("<m>", config, pre)
    image_proc = _processor(longest)
    counted = _counted(GRID, patch, merge, longest)
    factor = patch * merge
    expected = {}
    # the processor resizes real pixels: a third of the grid keeps this fast, the counting method
    # covers all of them
    for (h, w), tokens in zip(GRID, counted, strict=True):
        if (h, w) in GRID[::3]:
            rh, rw = image_proc(_pixels(h, w), patch_size=factor, return_tensors="np")["image_sizes"][0]
            assert tokens == (rh // factor) * (rw // factor + 1), (h, w)
            assert models.of(cfg).vision_inputs(cfg, h, w).patches_per_image == (rh // patch) * (rw // patch)
        expected[(h, w)] = tokens
    assert _mismatches(cfg, expected) == []
    assert len(expected) == len(GRID) == 30


def test_mistral3_image_counts_add_up_per_image() -> None:
    # a sample's images are counted one by one (the processor pads a batch, the model cuts each back)
    cfg = HFConfig("<m>", MISTRAL_SMALL_31, VARIANTS[0][1])
    family = models.of(cfg)
    sizes = [(448, 448), (224, 672), (1000, 300)]
    image_proc = _processor(1540)
    for n in (1, 2, 3):
        # one call over n images pads them to one batch; image_sizes keeps each one's own
        got = image_proc([_pixels(h, w) for h, w in sizes[:n]], patch_size=28, return_tensors="np")["image_sizes"]
        counted = [(h // 28) * (w // 28 + 1) for h, w in got]
        assert sum(counted) == sum(family.vision_inputs(cfg, h, w).llm_tokens for h, w in sizes[:n])


def test_mistral3_params_equal_transformers_at_the_published_size() -> None:
    # Mistral-Small-3.1-24B: 24,011,361,280 parameters (untied head: NOTE [ Mistral 3's tie ])
    config = transformers.Mistral3Config(**{k: v for k, v in MISTRAL_SMALL_31.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.Mistral3ForConditionalGeneration(config)
    real = sum(p.numel() for p in model.parameters())
    staged = staged_from_config(HFConfig("<m>", MISTRAL_SMALL_31))
    assert staged.params == real == 24_011_361_280, staged.params_by_stage()
    assert not staged.tied_embeddings and staged.vision[0].unused_layers == 0
    assert staged_from_config(HFConfig("<m>", {"model_type": "mistral3"})).params == real  # the defaults: the same
    tied = staged_from_config(HFConfig("<m>", {**MISTRAL_SMALL_31, "tie_word_embeddings": True}))
    assert tied.params == real - 131072 * 5120


def test_mistral3_feature_layers_and_small_configs_match_transformers(tmp_path: Path) -> None:
    # a small variant: two feature layers (the projector's input doubles), one block past the deepest
    raw = {"model_type": "mistral3", "vision_feature_layer": [-3, -2], "multimodal_projector_bias": True,
           "tie_word_embeddings": True,
           "text_config": {"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512,
                           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "vocab_size": 1000},
           "vision_config": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
                             "num_attention_heads": 4, "patch_size": 14}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(raw))
    staged = load_hf_config(tmp_path)
    config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    with torch.device("meta"):
        model = transformers.Mistral3ForConditionalGeneration(config)
    assert staged.params == sum(p.numel() for p in model.parameters()), staged.params_by_stage()
    assert staged.tied_embeddings and staged.vision[0].unused_layers == 1


def test_mistral3_refuses_a_bad_key_in_one_line() -> None:
    for raw, message in (
        ({"model_type": "mistral3", "spatial_merge_size": 0}, "key 'spatial_merge_size' should be a positive integer"),
        ({"model_type": "mistral3", "vision_feature_layer": 30}, "key 'vision_feature_layer' should be a layer index"),
        ({"model_type": "mistral3", "vision_config": {"model_type": "siglip_vision_model"}}, "is not supported"),
    ):
        with pytest.raises(ConfigError, match=message) as info:
            staged_from_config(HFConfig("<m>", raw))
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"size.longest_edge' should be a positive integer"):
        models.of(HFConfig("<m>", {"model_type": "mistral3"})).image_rule(
            HFConfig("<m>", {"model_type": "mistral3"}, {"size": {"longest_edge": 0}})
        )


@pytest.mark.slow
def test_mistral3_cost_and_profile_hf_config_agree_at_the_published_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Mistral-Small-3.1-24B on fake tensors, one 224 px image: the truth set's smallest shape, one
    # step (the 24B weights and AdamW's first step make the peak; ~15 s of CPU, the model's size)
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_SMALL_31))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(VARIANTS[0][1]))
    sample = json.dumps({"images": 1, "height": 224, "width": 224, "text_tokens": 256})
    code, out, err = cli(capsys, "cost", "--hf-config", str(tmp_path), "--sample", sample, "--batch", "1", "--json")
    assert code == 0, err
    priced = json.loads(out)
    code, out, err = cli(capsys, "profile", "--hf-config", str(tmp_path), "--sample", sample, "--batch", "1", "--steps", "1",
                         "--json")  # fmt: skip
    assert code == 0, err
    measured = json.loads(out)
    assert priced["seq_len"] == measured["seq_len"] == 8 * 9 + 256  # 8 rows of 8 tokens and a break
    err_pct = 100.0 * (priced["peak_bytes"] - measured["measured_peak_bytes"]) / measured["measured_peak_bytes"]
    assert ERROR_BAND[0] <= err_pct <= ERROR_BAND[1] and measured["within_band"], err_pct
