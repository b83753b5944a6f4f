"""HF config.json → StagedModel and image tokens, checked against transformers itself (meta device, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import STAGED_PRESETS, StagedModel, load_hf_config
from tokenbucket.tokens.hf import image_tokens, token_spec_from_hf

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SIGLIP_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16}

# model_type -> (config class name, kwargs of a real checkpoint)
REAL: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2_vl": ("Qwen2VLConfig", {  # Qwen/Qwen2-VL-2B-Instruct
        "text_config": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936},
        "vision_config": {"depth": 32, "embed_dim": 1280, "num_heads": 16, "hidden_size": 1536},
        "tie_word_embeddings": True}),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", {  # Qwen/Qwen2.5-VL-3B-Instruct
        "text_config": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                        "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936},
        "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                          "out_hidden_size": 2048},
        "tie_word_embeddings": True}),
    "qwen3_vl": ("Qwen3VLConfig", {  # Qwen/Qwen3-VL-2B-Instruct
        "text_config": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
        "vision_config": {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
                          "out_hidden_size": 2048, "deepstack_visual_indexes": [5, 11, 17]},
        "tie_word_embeddings": True}),
    "llava": ("LlavaConfig", {"text_config": {"model_type": "llama", "vocab_size": 32064}}),  # llava-1.5-7b-hf
    "llava_next": ("LlavaNextConfig", {  # llava-v1.6-mistral-7b-hf shapes on a Llama config
        "text_config": {"model_type": "llama", "vocab_size": 32064, "num_key_value_heads": 8,
                        "intermediate_size": 14336}}),
    "llava_onevision": ("LlavaOnevisionConfig", {  # llava-hf/llava-onevision-qwen2-0.5b-ov-hf
        "text_config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 152000,
                        "tie_word_embeddings": True},
        "vision_config": {"model_type": "siglip_vision_model", **SIGLIP_SO400M, "num_hidden_layers": 26,
                          "patch_size": 14, "image_size": 384, "vision_use_head": False},
        "tie_word_embeddings": True}),
    "paligemma": ("PaliGemmaConfig", {  # google/paligemma-3b-pt-224
        "text_config": {"model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18,
                        "intermediate_size": 16384, "num_attention_heads": 8, "num_key_value_heads": 1,
                        "vocab_size": 257216},
        "vision_config": {"model_type": "siglip_vision_model", **SIGLIP_SO400M, "patch_size": 14,
                          "image_size": 224, "vision_use_head": False}}),
    "idefics3": ("Idefics3Config", {  # HuggingFaceM4/Idefics3-8B-Llama3
        "text_config": {"model_type": "llama", "vocab_size": 128259, "hidden_size": 4096,
                        "intermediate_size": 14336, "num_key_value_heads": 8},
        "vision_config": {**SIGLIP_SO400M, "patch_size": 14, "image_size": 364}, "scale_factor": 2}),
    "smolvlm": ("SmolVLMConfig", {  # HuggingFaceTB/SmolVLM-256M-Instruct
        "text_config": {"model_type": "llama", "vocab_size": 49280, "hidden_size": 576, "intermediate_size": 1536,
                        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3},
        "vision_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                          "num_attention_heads": 12, "patch_size": 16, "image_size": 512},
        "scale_factor": 4, "tie_word_embeddings": True}),
    "internvl": ("InternVLConfig", {  # OpenGVLab/InternVL3-1B-hf
        "text_config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151674},
        "vision_config": {"attention_bias": True}, "tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,  # Qwen2-0.5B
                              "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "llama": ("LlamaConfig", {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,  # Llama-3.2-1B
                              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                              "tie_word_embeddings": True}),
    "gemma": ("GemmaConfig", {"hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,  # gemma-2b
                              "num_attention_heads": 8, "num_key_value_heads": 1}),
    "gemma2": ("Gemma2Config", {}),  # the class defaults are gemma-2-2b
    "gemma3": ("Gemma3Config", {  # google/gemma-3-4b-it
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
                        "sliding_window": 1024},
        "vision_config": {"model_type": "siglip_vision_model", **SIGLIP_SO400M, "patch_size": 14,
                          "image_size": 896, "vision_use_head": False}}),
}  # fmt: skip


def _write(tmp_path: Path, model_type: str) -> tuple[Path, Any]:
    cls_name, kwargs = REAL[model_type]
    cfg = getattr(transformers, cls_name)(**kwargs)
    cfg.to_json_file(str(tmp_path / "config.json"))
    return tmp_path, cfg


def _hf_params(cfg: Any) -> int:
    auto = transformers.AutoModelForCausalLM if cfg.model_type in ("qwen2", "llama", "gemma", "gemma2") else None
    with torch.device("meta"):
        model = (auto or transformers.AutoModelForImageTextToText).from_config(cfg)
    return int(sum(p.numel() for p in model.parameters()))


@pytest.mark.parametrize("model_type", sorted(REAL))
def test_load_hf_config_params_equal_transformers(tmp_path: Path, model_type: str) -> None:
    # the parsed stages add up to exactly what transformers builds from the same file
    path, cfg = _write(tmp_path, model_type)
    staged = load_hf_config(path)
    assert staged.model_type == model_type
    assert staged.params == _hf_params(cfg), staged.params_by_stage()
    assert load_hf_config(path / "config.json") == staged


def test_load_hf_config_flat_qwen2_vl_hub_layout(tmp_path: Path) -> None:
    # hub Qwen2-VL files keep text keys at the top level; the preset is exactly that file
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2_vl", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
        "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                          "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}}))  # fmt: skip
    assert load_hf_config(tmp_path).params == 2_208_985_600 == StagedModel.preset("qwen2-vl-2b").params


@pytest.mark.parametrize("model_type", ["llava", "llava_next", "smolvlm", "qwen2_vl", "paligemma"])
def test_load_hf_config_tie_follows_transformers_root_flag(tmp_path: Path, model_type: str) -> None:
    # a hub file with the tie only inside text_config: transformers 5 ties by the root flag, and
    # only LLaVA and Qwen2-VL copy the text flag up (LLaVA-NeXT stays untied: the truth's 935M)
    text = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 2,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    if model_type == "paligemma":
        text = {**REAL["paligemma"][1]["text_config"], "num_hidden_layers": 2, "tie_word_embeddings": False}
    raw: dict[str, Any] = {"model_type": model_type, "text_config": text}
    if model_type in ("smolvlm", "paligemma"):
        raw["vision_config"] = {**REAL[model_type][1]["vision_config"], "num_hidden_layers": 2}
    if model_type == "qwen2_vl":
        raw["text_config"] = {**text, "model_type": "qwen2_vl_text"}
        raw["vision_config"] = {"depth": 2, "embed_dim": 1280, "num_heads": 16, "hidden_size": 896}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    before = _snapshot(tmp_path / "config.json")
    staged = load_hf_config(tmp_path)
    hf_cfg = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert staged.tied_embeddings == bool(hf_cfg.tie_word_embeddings)
    assert staged.tied_embeddings == (model_type in ("llava", "qwen2_vl", "paligemma"))
    assert staged.params == _hf_params(hf_cfg), staged.params_by_stage()
    assert _snapshot(tmp_path / "config.json") == before


def test_load_hf_config_llava_feature_layer_marks_unused_blocks(tmp_path: Path) -> None:
    # vision_feature_layer=-2: CLIP-L's last block and its post-LayerNorm never get a gradient
    # (the truth's llava-next gap: 935,397,888 params, 922,799,616 with gradients)
    path, _ = _write(tmp_path, "llava_next")
    tower = load_hf_config(path).vision[0]
    assert (tower.unused_layers, tower.post_norm_used) == (1, False)
    assert tower.unused_params == 935_397_888 - 922_799_616
    for raw, unused in ((-1, 0), (-24, 23), ([3, -2], 1), (0, 24), (24, 0)):
        (path / "config.json").write_text(json.dumps({"model_type": "llava", "vision_feature_layer": raw}))
        assert load_hf_config(path).vision[0].unused_layers == unused
    for bad in (-26, 25, True, "last", []):
        (path / "config.json").write_text(json.dumps({"model_type": "llava", "vision_feature_layer": bad}))
        before = _snapshot(path / "config.json")
        with pytest.raises(ConfigError, match=r"key 'vision_feature_layer' should be a layer index in \[-25, 24\]"):
            load_hf_config(path)
        assert _snapshot(path / "config.json") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_staged_presets_published_counts() -> None:
    # published totals: llava-1.5-7b-hf, OpenVLA-7B, paligemma-3b-pt-224, Qwen2-VL-2B
    counts = {name: STAGED_PRESETS[name].params for name in STAGED_PRESETS}
    assert counts["llava-1.5-7b"] == 7_063_427_072
    assert counts["openvla"] == 7_541_237_184
    assert counts["paligemma-3b"] == 2_923_466_480
    assert counts["qwen2-vl-2b"] == 2_208_985_600
    assert len(STAGED_PRESETS["openvla"].vision) == 2
    assert STAGED_PRESETS["pi0"].action_expert is not None and STAGED_PRESETS["pi0"].action_expert.horizon == 50


def test_staged_preset_pi0_matches_transformers_minus_unused_expert_embedding() -> None:
    # transformers' PI0 keeps the expert's token embedding (257152 x 1024), which openpi drops
    from transformers.models.pi0 import modeling_pi0

    with torch.device("meta"):
        model = modeling_pi0.PI0ForConditionalGeneration(transformers.CONFIG_MAPPING["pi0"]())
    hf = sum(p.numel() for p in model.parameters())
    assert StagedModel.preset("pi0").params == hf - 257152 * 1024


def test_staged_preset_unknown_name_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"unknown staged model preset 'pi9'; known presets: \['llava-1.5-7b'"):
        StagedModel.preset("pi9")


SIZES = [(480, 640), (1080, 1920), (300, 200)]


def _pixels(h: int, w: int) -> Any:
    return np.zeros((h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize(("h", "w"), SIZES)
def test_image_tokens_qwen2_vl_equals_processor(tmp_path: Path, h: int, w: int) -> None:
    path, _ = _write(tmp_path, "qwen2_vl")
    out = transformers.Qwen2VLImageProcessor()(_pixels(h, w), return_tensors="np")
    assert image_tokens(path, h, w) == int(np.prod(out["image_grid_thw"][0])) // 4


@pytest.mark.parametrize(("h", "w"), SIZES)
def test_image_tokens_idefics3_and_smolvlm_equal_processor(tmp_path: Path, h: int, w: int) -> None:
    for model_type, proc in (("idefics3", "Idefics3ImageProcessor"), ("smolvlm", "SmolVLMImageProcessor")):
        path, cfg = _write(tmp_path, model_type)
        tiles = getattr(transformers, proc)()(_pixels(h, w), return_tensors="np")["pixel_values"].shape[1]
        vc = cfg.vision_config
        per_tile = (vc.image_size // vc.patch_size) ** 2 // cfg.scale_factor**2
        assert image_tokens(path, h, w) == tiles * per_tile


@pytest.mark.parametrize(("h", "w"), SIZES)
def test_image_tokens_llava_next_equals_processor_formula(tmp_path: Path, h: int, w: int) -> None:
    path, cfg = _write(tmp_path, "llava_next")
    proc = transformers.LlavaNextProcessor.__new__(transformers.LlavaNextProcessor)
    proc.image_processor = transformers.LlavaNextImageProcessor(image_grid_pinpoints=cfg.image_grid_pinpoints)
    proc.patch_size, proc.num_additional_image_tokens = 14, 1
    proc.vision_feature_select_strategy = "default"
    expected = proc._get_number_of_features(h, w, 336, 336) - 1  # "default" drops the class token
    assert image_tokens(path, h, w) == expected


@pytest.mark.parametrize(("h", "w"), SIZES)
def test_image_tokens_fixed_towers(tmp_path: Path, h: int, w: int) -> None:
    # LLaVA-1.5: 336/14 = 24 -> 576 (the class token is not an LLM token); PaliGemma 224/14 -> 256
    for model_type, expected in (("llava", 576), ("paligemma", 256), ("llama", 0)):
        path, cfg = _write(tmp_path, model_type)
        assert image_tokens(path, h, w) == expected
        if model_type == "paligemma":
            assert cfg.text_config.num_image_tokens == expected
    assert load_hf_config(tmp_path).vision == ()


def test_token_spec_from_hf_fields(tmp_path: Path) -> None:
    path, _ = _write(tmp_path, "qwen2_vl")
    (path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 1003520}))
    spec = token_spec_from_hf(path)
    assert (spec.patch, spec.merge, spec.tubelet, spec.resize) == (14, 2, 1, "max_pixels")  # NOTE [ Frames are images ]
    assert (spec.min_pixels, spec.max_pixels) == (3136, 1003520)
    out = transformers.Qwen2VLImageProcessor(min_pixels=3136, max_pixels=1003520)(_pixels(1080, 1920))
    assert image_tokens(path, 1080, 1920) == int(np.prod(out["image_grid_thw"][0])) // 4
    (tmp_path / "llava").mkdir()
    llava, _ = _write(tmp_path / "llava", "llava")
    assert token_spec_from_hf(llava).tokens_per_frame == 576


def _snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"model_type": "mamba"}',
            r"model_type 'mamba' is not supported; supported: gemma, gemma2, gemma3, idefics3, ",
        ),
        ('{"hidden_size": 8}', r"missing key 'model_type'"),
        ('{"model_type": "llama", "hidden_size": "big"}', r"key 'hidden_size' should be a positive integer"),
        ('{"model_type": "llava", "vision_config": {"model_type": "dinov2"}}', r"vision_config.model_type 'dinov2'"),
        ("not json {", r"should be a JSON object, but it does not parse"),
        ("[1, 2]", r"should be a JSON object, but got list"),
    ],
)
def test_load_hf_config_bad_file_one_line_error_file_unchanged(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    before = _snapshot(path)
    text_only = "hidden_size" in message  # a decoder's token spec reads no size
    for call in (load_hf_config,) if text_only else (load_hf_config, token_spec_from_hf):
        with pytest.raises(ConfigError, match=message) as info:
            call(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert _snapshot(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_load_hf_config_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config.json '.*nope.json' does not exist"):
        load_hf_config(tmp_path / "nope.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("config", "softcap", "norms"),
    [
        ({"model_type": "gemma2"}, True, 4),  # transformers' default final_logit_softcapping is 30.0
        ({"model_type": "gemma2", "final_logit_softcapping": None}, False, 4),
        ({"model_type": "gemma"}, False, 2),
        ({"model_type": "paligemma", "text_config": {"model_type": "gemma2"}}, True, 4),  # PaliGemma 2
        ({"model_type": "paligemma"}, False, 2),
    ],
)
def test_load_hf_config_gemma2_softcap_and_sandwich_norms(
    tmp_path: Path, config: dict[str, Any], softcap: bool, norms: int
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_hf_config(tmp_path)
    assert (model.logit_softcap, model.norms_per_layer) == (softcap, norms)
