"""Qwen3-VL (tokenbucket/models/qwen3_vl.py) against the pinned transformers: token counts and parameters.

The oracle for the counts is transformers' ``Qwen2VLImageProcessor`` (the class the Qwen3-VL
processor builds) made from the config values in the test, at 16-px patches; no tokenizer, no
download. The parameter count is the real model's, built on the meta device from the published
Qwen3-VL-2B-Instruct sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers

from tests.test_cli_errors import cli
from tests.test_families import GRID, _mismatches, _pixels, _proc
from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import load_hf_config, staged_from_config
from tokenbucket.cost.staged import ERROR_BAND
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models.qwen3_vl import QWEN3_VL_PIXELS
from tokenbucket.tokens.hf import token_spec_from_hf

torch = pytest.importorskip("torch")

# Qwen/Qwen3-VL-2B-Instruct's config.json, the keys that shape the model
QWEN3_VL_2B: dict[str, Any] = {
    "model_type": "qwen3_vl", "tie_word_embeddings": True,
    "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 2048, "intermediate_size": 6144,
                    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                    "vocab_size": 151936, "tie_word_embeddings": True},
    "vision_config": {"model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                      "num_heads": 16, "out_hidden_size": 2048, "num_position_embeddings": 2304,
                      "deepstack_visual_indexes": [5, 11, 17], "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "hidden_act": "gelu_pytorch_tanh"},
}  # fmt: skip
# its preprocessor_config.json (the image part)
PUBLISHED_PRE = {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16,
                 "temporal_patch_size": 2, "merge_size": 2}  # fmt: skip
SIZES = [s for s in GRID if min(s) >= 32] + [(32, 32), (4096, 4096), (3000, 5000)]


def _config(vision: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**QWEN3_VL_2B, "vision_config": {**QWEN3_VL_2B["vision_config"], **(vision or {})}}


# (config, preprocessor_config.json, the processor's kwargs): published, no preprocessor file (the
# published bounds), the old min_pixels/max_pixels keys, and a 14-px tower with a small budget
SETUPS = [
    (_config(), PUBLISHED_PRE, {"patch_size": 16, "size": PUBLISHED_PRE["size"]}),
    (_config(), {}, {"patch_size": 16, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}),
    (_config(), {"min_pixels": 3136, "max_pixels": 401408},
     {"patch_size": 16, "size": {"shortest_edge": 3136, "longest_edge": 401408}}),
    (_config({"patch_size": 14}), {"size": {"shortest_edge": 200704, "longest_edge": 1003520}},
     {"patch_size": 14, "size": {"shortest_edge": 200704, "longest_edge": 1003520}}),
]  # fmt: skip


@pytest.mark.parametrize(("config", "pre", "proc_kwargs"), SETUPS, ids=["published", "absent", "old-keys", "patch14"])
def test_qwen3_vl_counts_equal_the_processor_over_the_grid(
    config: dict[str, Any], pre: dict[str, Any], proc_kwargs: dict[str, Any]
) -> None:
    # the counts come from the processor's own counting method (what Qwen3VLProcessor counts image
    # tokens with), checked against its real output (image_grid_thw of resized pixels) wherever
    # the resized image is small enough to stay fast; rescaling and normalising change no count
    proc = _proc("Qwen2VLImageProcessor", do_rescale=False, do_normalize=False, **proc_kwargs)
    factor = proc_kwargs["patch_size"] * 2
    sizes = [s for s in SIZES if min(s) >= factor]
    expected = {}
    for h, w in sizes:
        patches = proc.get_number_of_image_patches(h, w, {})
        if h * w <= 600_000:
            assert int(np.prod(proc(_pixels(h, w), return_tensors="np")["image_grid_thw"][0])) == patches
        expected[(h, w)] = patches // 4
    cfg = HFConfig("<q3>", config, pre)
    assert _mismatches(cfg, expected) == []
    assert len(expected) >= 31
    assert token_spec_from_hf(cfg).resize == "max_pixels"  # exact in the native rule


def test_qwen3_vl_reads_the_published_pixels_and_refuses_bad_keys() -> None:
    family = models.family("qwen3_vl")
    assert family.pixels(HFConfig("<q3>", QWEN3_VL_2B)) == QWEN3_VL_PIXELS == (65536, 16777216)
    assert family.vision_inputs(HFConfig("<q3>", QWEN3_VL_2B), 224, 224).llm_tokens == 64  # upscaled to 256x256
    bad = _config({"deepstack_visual_indexes": [5, 30]})
    with pytest.raises(ConfigError, match=r"vision_config\.deepstack_visual_indexes should be a list of block"):
        staged_from_config(HFConfig("<q3>", bad))
    with pytest.raises(ConfigError, match=r"vision_config\.model_type 'siglip' is not supported"):
        staged_from_config(HFConfig("<q3>", _config({"model_type": "siglip"})))


def _real_params(config: dict[str, Any]) -> int:
    data = {k: v for k, v in config.items() if k != "model_type"}
    tconfig = transformers.Qwen3VLConfig(**data)
    with torch.device("meta"):
        model = transformers.Qwen3VLForConditionalGeneration(tconfig)
    return int(sum(p.numel() for p in model.parameters()))


@pytest.mark.parametrize("variant", ["2b", "untied-bias-4stack"])
def test_qwen3_vl_params_equal_transformers(tmp_path: Path, variant: str) -> None:
    config = QWEN3_VL_2B
    if variant != "2b":
        config = {**_config({"deepstack_visual_indexes": [1, 2, 3, 4], "depth": 6}), "tie_word_embeddings": False,
                  "text_config": {**QWEN3_VL_2B["text_config"], "attention_bias": True, "num_hidden_layers": 4}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    staged = load_hf_config(tmp_path)
    assert staged.qk_norm and staged.vision[0].position_rows == 2304
    assert staged.params == _real_params(config), staged.params_by_stage()
    if variant == "2b":
        assert staged.params == 2_127_532_032 and staged.tied_embeddings and staged.projector is not None
        assert staged.projector.deepstack == 3


# the smallest honest shape for the CLI check: every part of the 2B (a tower with two DeepStack
# mergers, a q/k-normed backbone with head_dim 128 for its 3-D rope sections) at small widths,
# and one 256x256 image (256 tower patches, 64 LLM tokens)
SMALL = {
    "model_type": "qwen3_vl", "tie_word_embeddings": True,
    "text_config": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 8192},
    "vision_config": {"depth": 3, "hidden_size": 256, "intermediate_size": 1024, "num_heads": 4,
                      "out_hidden_size": 512, "num_position_embeddings": 2304, "deepstack_visual_indexes": [0, 1]},
}  # fmt: skip


@pytest.mark.slow
def test_qwen3_vl_cli_cost_agrees_with_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PUBLISHED_PRE))
    sample = json.dumps({"images": 1, "height": 256, "width": 256, "text_tokens": 128})
    args = ["--hf-config", str(tmp_path), "--sample", sample, "--batch", "2", "--json"]
    out = {}
    for cmd in ("cost", "profile"):
        code, text, err = cli(capsys, cmd, *args)
        assert code == 0, err
        out[cmd] = json.loads(text)
    assert out["cost"]["seq_len"] == out["profile"]["seq_len"] == 64 + 128
    assert out["cost"]["peak_bytes"] == out["profile"]["predicted_peak_bytes"]
    measured = out["profile"]["measured_peak_bytes"]
    err_pct = 100.0 * (out["cost"]["peak_bytes"] - measured) / measured
    assert ERROR_BAND[0] <= err_pct <= ERROR_BAND[1], f"cost is {err_pct:+.2f} % off profile"
    print(f"cost vs profile: {err_pct:+.2f} %")
