"""PaliGemma: a SigLIP tower at a fixed square, one linear projector, a Gemma backbone under a
prefix-LM mask (the image and the prompt attend both ways; NOTE [ What an HF block saves ]).

NOTE [ PaliGemma packed mask ]
Alone, ``PaliGemmaModel`` (transformers 5.24) numbers positions from 1 and, given
``token_type_ids``, ORs into the causal mask one block of every token of type 0 (the image and
the prompt: the prefix), so the prefix attends both ways and the answer causally. Handed a 4-D
``attention_mask`` it uses it as it is, for every layer. A packed row gets the rows' causal
block-diagonal mask OR each sample's own prefix block, and positions 1, 2, ... restarting per
sample: per sample what the sample alone computes (tests/test_packed_gemma.py). Without
``token_type_ids`` the model alone is causal, and so is the row. The 4-D mask stands for both
layer types of a Gemma 2 text model (PaliGemma 2), so a sliding window shorter than the row is
refused; flash-attn is refused (``_supports_flash_attn`` is False; ``cu_seqlens`` say causal
blocks only).

Example:
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> FAMILY.vision_inputs(HFConfig("<p>", {"model_type": "paligemma"}), 480, 640)
    VisionInputs(tower_images=1, patches_per_image=256, llm_tokens=256)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenbucket.models._base import Family, Inputs, PackedAttention, Shape, TowerImage, VisionInputs, token_ids
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._stages import Projector, VisionTower, vit_tower
from tokenbucket.models.llava import VIT_DEFAULTS, image_token

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "PALIGEMMA_TEXT", "PaliGemma"]

PALIGEMMA_TEXT = {"model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18, "intermediate_size": 16384,
                  "num_attention_heads": 8, "num_key_value_heads": 1, "vocab_size": 257152}  # fmt: skip
_SIGLIP_224 = {"model_type": "siglip_vision_model", "intermediate_size": 4096, "hidden_size": 1152, "patch_size": 14,
               "image_size": 224, "num_hidden_layers": 27, "num_attention_heads": 16, "vision_use_head": False}  # fmt: skip


class PaliGemma(Family):
    name = "paligemma"
    unpacked_reason = None  # NOTE [ PaliGemma packed mask ]
    model_types = ("paligemma",)
    hf_classes = {"paligemma": "PaliGemmaForConditionalGeneration"}
    vision_attr = "vision_tower"
    variable_tokens = False
    text_type = "gemma"
    vision_types = {"siglip_vision_model": VIT_DEFAULTS["siglip_vision_model"]}
    absent_vision = {"paligemma": _SIGLIP_224}
    absent_text = PALIGEMMA_TEXT

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        side, patch = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "patch_size")
        return {"side": side, "patch": patch}

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        grid = (int(rule["side"]) // int(rule["patch"])) ** 2
        return VisionInputs(1, grid, grid)

    def spec_fields(self, cfg: HFConfig) -> dict[str, Any] | None:
        rule = self.image_rule(cfg)
        return {"patch": rule["patch"], "resize": "fixed", "fixed_size": (rule["side"], rule["side"])}

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        return self.tower_square(cfg)

    def tower_image(self, cfg: HFConfig) -> TowerImage:
        rule = self.image_rule(cfg)
        grid = (int(rule["side"]) // int(rule["patch"])) ** 2
        return TowerImage(
            channels=self.vision_int(cfg, "num_channels"), side=rule["side"], patches=grid, llm_tokens=grid
        )

    def packed_attention(self, text: object) -> PackedAttention | None:
        """The prefix-LM mask, positions from 1 (NOTE [ PaliGemma packed mask ])."""
        return PackedAttention(masks=_packed_mask, first_position=1)

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        return (vit_tower(cfg, table, where, self.vision_types[str(table["model_type"])], reads_hidden=False),)

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        return Projector(
            kind="linear", in_dim=tower.hidden, out_dim=int(cfg.get(cfg.config, "", "projection_dim", 2048))
        )

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        return bool(cfg.get(cfg.config, "", "tie_word_embeddings", True, bool))

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        import torch  # optional: the measured mode only (NOTE [ Families defer torch ])

        n = self.vision_inputs(cfg, shape.height, shape.width).llm_tokens * shape.images
        ids = token_ids(shape, n)
        ids[:, :n] = image_token(tconfig)
        length = ids.shape[1]
        tt = torch.zeros((shape.batch, length), dtype=torch.long)
        tt[:, length // 2 :] = 1  # prefix (image + prompt) then suffix, half and half
        side = int(tconfig.vision_config.image_size)
        return {"input_ids": ids, "token_type_ids": tt}, {
            "pixel_values": ((shape.images * shape.batch, 3, side, side), dtype)
        }


def _packed_mask(causal: torch.Tensor, segment_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
    """Bool ``[R, 1, P, P]``: each sample's causal mask OR its prefix both ways (NOTE [ PaliGemma packed mask ])."""
    if token_type_ids is None:
        return causal
    prefix = token_type_ids.eq(0) & segment_ids.gt(0)
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal | (prefix[:, :, None] & prefix[:, None, :] & same)[:, None]


FAMILY = PaliGemma()
