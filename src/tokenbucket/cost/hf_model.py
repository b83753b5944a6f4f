"""Staged models: a VLA / VLM read from a Hugging Face ``config.json`` (no pricing here).

A :class:`StagedModel` lists the stages a sample's tokens pass through: vision towers, a
projector, the backbone (a :class:`ModelSpec`) with its vocabulary, and an optional action
expert. Parameter counts are exact for the supported architectures (tests/test_hf_config.py
compares them with transformers on the meta device). The JSON is read by
:mod:`tokenbucket.tokens.hf`; transformers is never imported.

Example:
    >>> m = StagedModel.preset("llava-1.5-7b")
    >>> m.params, m.vision[0].tokens_per_image
    (7063427072, 577)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.model import ModelSpec
from tokenbucket.models._hf_json import HFConfig, read_hf_config
from tokenbucket.models._stages import Projector, VisionTower, linear_params
from tokenbucket.models.paligemma import PALIGEMMA_TEXT

__all__ = ["STAGED_PRESETS", "ActionExpert", "Projector", "StagedModel", "VisionTower", "load_hf_config"]


@dataclass(frozen=True, kw_only=True)
class ActionExpert:
    """An action head: a small transformer (``spec``, pi0's flow-matching expert) or an MLP.

    ``kind="flow"``: state and noisy-action projections in, a time MLP (2w → w → w), an action
    projection out, all with bias, plus the blocks (Gemma-style: no bias, RMSNorm, no
    embedding). ``kind="mlp"``: ``width → width → horizon·action_dim`` from the backbone.
    """

    kind: Literal["flow", "mlp"]
    width: int
    horizon: int
    action_dim: int
    spec: ModelSpec | None = None
    head_dim: int | None = None

    @property
    def params(self) -> int:
        w, a = self.width, self.action_dim
        if self.kind == "mlp":
            return linear_params(w, w, True) + linear_params(w, self.horizon * a, True)
        if self.spec is None or self.head_dim is None:
            raise AssertionError("a flow expert needs spec and head_dim")
        io = (
            2 * linear_params(a, w, True)
            + linear_params(2 * w, w, True)
            + linear_params(w, w, True)
            + linear_params(w, a, True)
        )
        return io + _decoder_block_params(self.spec, self.head_dim, "none", 2) + w


def _decoder_block_params(spec: ModelSpec, head_dim: int, bias: str, norms: int) -> int:
    """All blocks of a Llama/Qwen2/Gemma decoder (RMSNorm, gated MLP)."""
    d, q, kv, f = spec.hidden, spec.heads * head_dim, int(spec.kv_heads or 0) * head_dim, spec.ffn
    attn = 2 * d * q + 2 * d * kv + {"none": 0, "qkv": q + 2 * kv, "all": q + 2 * kv + d}[bias]
    return spec.layers * (attn + 3 * d * f + norms * d)


@dataclass(frozen=True, kw_only=True)
class StagedModel:
    """A model as stages: ``vision`` towers (fused when several), ``projector``, ``backbone``.

    ``backbone`` is the block stack the cost model prices (``extra_params=0``); ``head_dim``,
    ``attn_bias`` and ``norms_per_layer`` make the backbone's count exact where ModelSpec's
    generic block differs (Gemma's head_dim, Qwen2's q/k/v bias, RMSNorm; Gemma 2's four
    norms a layer), ``qk_norm`` its per-head RMSNorm on q and k (Qwen3, Gemma 3: ``QK_NORM_TEXT_TYPES``).
    ``logit_softcap``: the logits pass through ``tanh(x / cap) * cap`` before
    the loss (Gemma 2's ``final_logit_softcapping``). ``explicit_mask``: the text attends under an
    explicit ``B x 1 x S x S`` mask (Gemma 3's image tokens attend both ways within an image).
    """

    name: str
    model_type: str
    vision: tuple[VisionTower, ...]
    projector: Projector | None
    backbone: ModelSpec
    vocab: int
    tied_embeddings: bool
    head_dim: int
    attn_bias: Literal["none", "qkv", "all"] = "none"
    norms_per_layer: int = 2
    logit_softcap: bool = False
    action_expert: ActionExpert | None = None
    use_cache: bool = True
    qk_norm: bool = False
    explicit_mask: bool = False

    def params_by_stage(self) -> dict[str, int]:
        """Parameters per stage: embedding, vision, projector, backbone (blocks + final norm), head."""
        d = self.backbone.hidden
        out = {
            "embedding": self.vocab * d,
            "vision": sum(t.params for t in self.vision),
            "projector": self.projector.params if self.projector else 0,
            "backbone": self.decoder_layer_params * self.backbone.layers + d,
            "head": 0 if self.tied_embeddings else self.vocab * d,
        }
        if self.action_expert is not None:
            out["action_expert"] = self.action_expert.params
        return out

    @property
    def params(self) -> int:
        return sum(self.params_by_stage().values())

    @property
    def decoder_layer_params(self) -> int:
        """Parameters of one backbone layer (exact, unlike ``backbone.layer_params``)."""
        spec = self.backbone
        qk = 2 * self.head_dim if self.qk_norm else 0
        return _decoder_block_params(spec, self.head_dim, self.attn_bias, self.norms_per_layer) // spec.layers + qk

    @classmethod
    def preset(cls, name: str) -> StagedModel:
        """A named preset (see ``STAGED_PRESETS``)."""
        if name not in STAGED_PRESETS:
            raise ConfigError(f"unknown staged model preset {name!r}; known presets: {sorted(STAGED_PRESETS)}")
        return STAGED_PRESETS[name]


# -- reading config.json ---------------------------------------------------------------------


# text model_types whose attention normalises q and k per head (an RMSNorm of head_dim each)
QK_NORM_TEXT_TYPES: frozenset[str] = frozenset({"qwen3_vl_text", "gemma3_text"})
# text model_types with four norms a layer (pre/post attention, pre/post MLP)
_SANDWICH_NORMS: frozenset[str] = frozenset({"gemma2", "gemma3_text"})

# text defaults per decoder model_type (transformers' config classes)
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "tie_word_embeddings": False, "attention_bias": False},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "tie_word_embeddings": False},
    "qwen2_vl": {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
                 "num_attention_heads": 64, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "gemma": {"vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
              "num_attention_heads": 16, "head_dim": 256, "tie_word_embeddings": True},
    "gemma2": {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True},
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True},
    "qwen3_vl_text": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
                      "tie_word_embeddings": False, "attention_bias": False},
}  # fmt: skip


def _text_table(cfg: HFConfig) -> tuple[dict[str, Any], str, str]:
    """(text keys, key prefix, text model_type): the top level for a decoder or a flat Qwen2-VL config."""
    mt, family = cfg.model_type, models.of(cfg)
    if family.text_type is None:
        return cfg.config, "", mt
    raw = cfg.config.get("text_config")
    if raw is None:
        if family.flat_text:
            return cfg.config, "", family.text_type  # hub checkpoints keep the text keys at the top level
        return (
            dict(family.absent_text or {}),
            "text_config",
            str((family.absent_text or {}).get("model_type", family.text_type)),
        )
    table, where = cfg.section("text_config")
    tt = str(table.get("model_type", family.text_type))
    if tt.startswith("qwen2") and tt.endswith("_text"):
        tt = "qwen2_vl"
    if tt not in _TEXT_DEFAULTS:
        raise ConfigError(
            f"config.json {cfg.path!r}: text_config.model_type {tt!r} is not supported; "
            f"supported: {', '.join(sorted(_TEXT_DEFAULTS))}"
        )
    return table, where, tt


def _backbone(cfg: HFConfig) -> tuple[ModelSpec, int, int, bool, str, int]:
    """(spec, vocab, head_dim, text tie flag, attention bias, norms per layer)."""
    table, where, tt = _text_table(cfg)
    defaults = _TEXT_DEFAULTS[tt]

    def num(key: str, default: object = None) -> int:
        return int(cfg.get(table, where, key, defaults.get(key, default)))

    hidden, heads = num("hidden_size"), num("num_attention_heads")
    kv = num("num_key_value_heads", heads)
    cfg.check_divides(where, "num_attention_heads", heads, "hidden_size", hidden)
    cfg.check_divides(where, "num_key_value_heads", kv, "num_attention_heads", heads)
    head_dim = num("head_dim", hidden // heads) if tt != "qwen2_vl" and tt != "qwen2" else hidden // heads
    ffn = num("intermediate_size")
    tie = bool(cfg.get(table, where, "tie_word_embeddings", defaults["tie_word_embeddings"], bool))
    if tt in ("llama", "qwen3_vl_text"):
        bias = "all" if cfg.get(table, where, "attention_bias", False, bool) else "none"
        if tt == "llama" and cfg.get(table, where, "mlp_bias", False, bool):
            raise ConfigError(
                f"config.json {cfg.path!r}: key {where + '.' if where else ''}mlp_bias=true is not supported"
            )
    else:
        bias = "qkv" if tt.startswith("qwen2") else "none"
    spec = ModelSpec(
        name=f"{cfg.model_type}-backbone", hidden=hidden, layers=num("num_hidden_layers"), heads=heads,
        kv_heads=kv, mlp_ratio=ffn / hidden, gated_mlp=True,
    )  # fmt: skip
    return spec, num("vocab_size"), head_dim, tie, bias, 4 if tt in _SANDWICH_NORMS else 2


def _logit_softcap(cfg: HFConfig) -> bool:
    """Gemma 2's final logit soft-cap (30.0 unless the config sets it to null), under PaliGemma too;
    Gemma 3's only when the config sets one (its default is null)."""
    table, _, tt = _text_table(cfg)
    if tt == "gemma3_text":
        return table.get("final_logit_softcapping") is not None
    return tt == "gemma2" and table.get("final_logit_softcapping", 30.0) is not None


def _use_cache(cfg: HFConfig) -> bool:
    """The decoder's ``use_cache`` as the config leaves it (transformers' default: true)."""
    table, _, _ = _text_table(cfg)
    value = table.get("use_cache", cfg.config.get("use_cache", True))
    return value is not False


def staged_from_config(cfg: HFConfig, name: str | None = None) -> StagedModel:
    """The :class:`StagedModel` of an already-read config (what :func:`load_hf_config` returns)."""
    mt = cfg.model_type
    spec, vocab, head_dim, text_tie, bias, norms = _backbone(cfg)
    family = models.of(cfg)
    vision = family.vision_towers(cfg)
    projector = family.projector(cfg, vision[0], spec.hidden) if vision else None
    tie = family.tied(cfg, text_tie)
    return StagedModel(
        name=name or str(cfg.config.get("_name_or_path") or mt), model_type=mt, vision=vision, projector=projector,
        backbone=spec, vocab=vocab, tied_embeddings=tie, head_dim=head_dim, attn_bias=bias,  # type: ignore[arg-type]
        norms_per_layer=norms, logit_softcap=_logit_softcap(cfg), use_cache=_use_cache(cfg),
        qk_norm=_text_table(cfg)[2] in QK_NORM_TEXT_TYPES, explicit_mask=family.bidirectional_images,
    )  # fmt: skip


def load_hf_config(path: str | Path) -> StagedModel:
    """Read a Hugging Face ``config.json`` (a file, or a directory holding one) as a :class:`StagedModel`.

    Raises:
        ConfigError: the file is missing or not a JSON object, its ``model_type`` is not
            supported, or a key the model needs is missing or of the wrong type (each one line
            naming the file and the key).
    """
    return staged_from_config(read_hf_config(path))


# -- presets ----------------------------------------------------------------------------------

_PALIGEMMA_3B = {
    "model_type": "paligemma", "projection_dim": 2048,
    "text_config": {**PALIGEMMA_TEXT, "vocab_size": 257216},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                      "num_hidden_layers": 27, "num_attention_heads": 16, "patch_size": 14, "image_size": 224,
                      "vision_use_head": False},
}  # fmt: skip
_QWEN2_VL_2B = {
    "model_type": "qwen2_vl", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
    "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                      "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}  # fmt: skip
_LLAVA_15_7B = {"model_type": "llava", "text_config": {"model_type": "llama", "vocab_size": 32064}}


def _from_dict(name: str, config: dict[str, Any]) -> StagedModel:
    return staged_from_config(HFConfig(f"<preset {name}>", config), name)


def _pi0() -> StagedModel:
    # openpi's pi0: PaliGemma-3B (vocab 257152) + a Gemma-300M-shaped flow-matching expert
    # without token embeddings; 50-step chunks of 32-dim actions. Its parameters are counted here;
    # its memory is LeRobotPolicy's (NOTE [ pi0 is a LeRobot policy ]).
    base = _from_dict("pi0", {**_PALIGEMMA_3B, "text_config": dict(PALIGEMMA_TEXT)})
    expert = ModelSpec(name="gemma-300m-expert", hidden=1024, layers=18, heads=8, kv_heads=1, mlp_ratio=4.0,
                       gated_mlp=True)  # fmt: skip
    action = ActionExpert(kind="flow", width=1024, horizon=50, action_dim=32, spec=expert, head_dim=256)
    return dataclasses.replace(base, action_expert=action)


def _openvla() -> StagedModel:
    # OpenVLA (prismatic): timm DINOv2-L/14 with 4 registers and LayerScale + SigLIP-so400m/14
    # with its attention-pool head, both at 224; features concatenated (1024 + 1152 = 2176);
    # a 3-layer GELU MLP to Llama-2-7B (vocab 32000 padded to 32064).
    dino = VisionTower(
        name="dinov2-vit-l-14-reg4",
        hidden=1024,
        layers=24,
        heads=16,
        ffn=4096,
        patch=14,
        image_size=224,
        class_token=True,
        class_position=False,
        register_tokens=4,
        layer_scale=True,
    )  # fmt: skip  (timm's no_embed_class: no position for the class token)
    siglip = VisionTower(name="siglip-so400m-14", hidden=1152, layers=27, heads=16, ffn=4304, patch=14,
                         image_size=224, pooling_head=True)  # fmt: skip
    llama = _from_dict("openvla", _LLAVA_15_7B)
    fused = dino.hidden + siglip.hidden
    projector = Projector(kind="fused_mlp", in_dim=fused, out_dim=4096, hidden_dims=(4 * fused, 4096))
    return dataclasses.replace(llama, model_type="openvla", vision=(dino, siglip), projector=projector)


def _qwen2_vl_vla() -> StagedModel:
    # Qwen2-VL-2B with an illustrative MLP action head: an 8-step chunk of 7-DoF actions.
    base = _from_dict("qwen2-vl-vla", _QWEN2_VL_2B)
    return dataclasses.replace(base, action_expert=ActionExpert(kind="mlp", width=1536, horizon=8, action_dim=7))


STAGED_PRESETS: dict[str, StagedModel] = {
    "llava-1.5-7b": _from_dict("llava-1.5-7b", _LLAVA_15_7B),
    "openvla": _openvla(),
    "paligemma-3b": _from_dict("paligemma-3b", _PALIGEMMA_3B),
    "pi0": _pi0(),
    "qwen2-vl-2b": _from_dict("qwen2-vl-2b", _QWEN2_VL_2B),
    "qwen2-vl-vla": _qwen2_vl_vla(),
}
