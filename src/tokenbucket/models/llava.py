"""LLaVA-1.5: a CLIP tower at a fixed square, a two-layer MLP projector, a Llama backbone.

Every image is resized to the tower's square: ``(image_size // patch)**2`` LLM tokens (576 at
336 px), the class token dropped unless ``vision_feature_select_strategy`` is ``"full"``
(NOTE [ HF image tokens ] in :mod:`tokenbucket.tokens.hf`).

Example:
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> FAMILY.vision_inputs(HFConfig("<l>", {"model_type": "llava"}), 480, 640)
    VisionInputs(tower_images=1, patches_per_image=577, llm_tokens=576)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Family, Inputs, Shape, TowerImage, VisionInputs, fixed_square, token_ids
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._stages import Projector, VisionTower, vit_tower

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["CLIP_336", "FAMILY", "VIT_DEFAULTS", "Llava", "select_extra"]

# transformers' vision config classes' defaults
VIT_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip_vision_model": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                          "num_attention_heads": 12, "image_size": 224, "patch_size": 32, "num_channels": 3},
    "siglip_vision_model": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                            "num_attention_heads": 12, "image_size": 224, "patch_size": 16, "num_channels": 3,
                            "vision_use_head": True},
}  # fmt: skip
CLIP_336 = {"model_type": "clip_vision_model", "intermediate_size": 4096, "hidden_size": 1024, "patch_size": 14,
            "image_size": 336, "num_hidden_layers": 24, "num_attention_heads": 16}  # fmt: skip


def select_extra(cfg: HFConfig) -> int:
    """The class token an image keeps as an LLM token: 1 under ``vision_feature_select_strategy="full"``."""
    strategy = cfg.get(cfg.config, "", "vision_feature_select_strategy", "default", str)
    if strategy not in ("default", "full"):
        raise ConfigError(
            f"config.json {cfg.path!r}: key 'vision_feature_select_strategy' should be 'default' or 'full', "
            f"but got {strategy!r}"
        )
    return 1 if strategy == "full" else 0


class Llava(Family):
    name = "llava"
    model_types = ("llava",)
    hf_classes = {"llava": "LlavaForConditionalGeneration"}
    vision_attr = "vision_tower"
    variable_tokens = False
    text_type = "llama"
    vision_types = VIT_DEFAULTS
    absent_vision = {"llava": CLIP_336}
    unpacked_reason = None

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        side, patch = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "patch_size")
        grid = (side // patch) ** 2
        return {"side": side, "patch": patch, "tokens": grid + select_extra(cfg), "patches": grid + 1}

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        return VisionInputs(1, int(rule["patches"]), int(rule["tokens"]))

    def spec_fields(self, cfg: HFConfig) -> dict[str, Any] | None:
        rule = self.image_rule(cfg)
        return fixed_square(rule)

    def tower_image(self, cfg: HFConfig) -> TowerImage:
        rule = self.image_rule(cfg)
        channels = self.vision_int(cfg, "num_channels")
        return TowerImage(channels=channels, side=rule["side"], patches=rule["patches"], llm_tokens=rule["tokens"])

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        return self.tower_square(cfg)

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        return (vit_tower(cfg, table, where, self.vision_types[str(table["model_type"])], reads_hidden=True),)

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        bias = bool(cfg.get(cfg.config, "", "multimodal_projector_bias", True, bool))
        return Projector(kind="mlp", in_dim=tower.hidden, out_dim=width, hidden_dims=(width,), bias=bias)

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        # transformers 5: LLaVA's config copies a text_config tie up to the root flag
        return super().tied(cfg, text_tie) or text_tie

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        per = self.vision_inputs(cfg, shape.height, shape.width).llm_tokens
        ids = token_ids(shape, per * shape.images)
        ids[:, : per * shape.images] = image_token(tconfig)
        side = int(tconfig.vision_config.image_size)
        return {"input_ids": ids}, {"pixel_values": ((shape.images * shape.batch, 3, side, side), dtype)}


def image_token(tconfig: PretrainedConfig) -> int:
    """The id of the image placeholder token in a transformers config."""
    named: Any = getattr(tconfig, "image_token_id", None) or getattr(tconfig, "image_token_index", 0)
    return int(named)


FAMILY = Llava()
