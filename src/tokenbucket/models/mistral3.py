"""Mistral 3 (Mistral Small 3.1): a Pixtral tower at the image's own size, a patch merger, a Mistral backbone.

NOTE [ Pixtral row breaks ]
The processor asks the image processor for sides that are multiples of ``patch x merge`` (28):
an image whose longer side exceeds ``size.longest_edge`` (1540 in Mistral Small 3.1's
preprocessor, 1024 by default) is scaled down to fit, both sides floored, then each side is
rounded *up* to a multiple of 28 (never scaled up). The tower sees every 14-px patch of that
``R x C``-merged-patch image (``4RC`` tokens, all images of a batch in one sequence under a
block-diagonal mask); the merger folds 2x2 of them, and each row of ``C`` image tokens ends in
an ``[IMG_BREAK]`` token, the last one an ``[IMG_END]``: ``R x (C + 1)`` LLM tokens.

NOTE [ Mistral 3's tie ]
transformers 5's ``Mistral3Config`` ties the LM head to the token embedding by default (the
root ``tie_word_embeddings``), and Mistral Small 3.1's ``config.json`` names no tie. The
checkpoint stores both matrices, so ``from_pretrained`` keeps them apart (24,011,361,280
parameters) while a model built from that config alone ties them (23.34B). A config without
the key is priced as the published checkpoint (untied); ``"tie_word_embeddings": true`` ties.

Example:
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> cfg = HFConfig("<m>", {"model_type": "mistral3"}, {"size": {"longest_edge": 1540}})
    >>> FAMILY.vision_inputs(cfg, 448, 448)
    VisionInputs(tower_images=1, patches_per_image=1024, llm_tokens=272)
    >>> FAMILY.vision_inputs(cfg, 3000, 2000)  # scaled to 1540 x 1026, rounded up to 1540 x 1036
    VisionInputs(tower_images=1, patches_per_image=8140, llm_tokens=2090)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Family, Inputs, Shape, SizedImage, SizedLayout, VisionInputs, token_ids
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._stages import Projector, VisionTower, unused_layers
from tokenbucket.models.llava import image_token

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "IMAGE_BREAK_ID", "IMAGE_END_ID", "MISTRAL_SMALL_TEXT", "Mistral3", "resized"]

PIXTRAL_LONGEST_EDGE = 1024  # PixtralImageProcessor's default size.longest_edge
IMAGE_BREAK_ID, IMAGE_END_ID = 12, 13  # [IMG_BREAK] and [IMG_END] in Mistral's Tekken tokenizer
# transformers' PixtralVisionConfig defaults, and what Mistral3Config builds without a vision_config
_PIXTRAL = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
            "num_channels": 3, "image_size": 1024, "patch_size": 16}  # fmt: skip
_PIXTRAL_MISTRAL3 = {"model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096, "patch_size": 14,
                     "image_size": 1540, "num_hidden_layers": 24, "num_attention_heads": 16}  # fmt: skip
# what Mistral3Config builds without a text_config: Mistral Small 3.1's backbone
MISTRAL_SMALL_TEXT = {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 32768,
                      "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "vocab_size": 131072}  # fmt: skip


def resized(height: int, width: int, longest: int, factor: int, resize: bool = True) -> tuple[int, int]:
    """The processor's output sides (NOTE [ Pixtral row breaks ]): at most ``longest`` (floored),
    then rounded up to multiples of ``factor``; without ``resize`` the image keeps its size."""
    if not resize:
        return height, width
    ratio = max(height / longest, width / longest)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    return ((height - 1) // factor + 1) * factor, ((width - 1) // factor + 1) * factor


class Mistral3(Family):
    name = "mistral3"
    unpacked_reason = None
    sized_pixels = True
    model_types = ("mistral3",)
    hf_classes = {"mistral3": "Mistral3ForConditionalGeneration"}
    vision_attr = "vision_tower"
    text_type = "mistral"
    vision_types = {"pixtral": _PIXTRAL}
    absent_vision = {"mistral3": _PIXTRAL_MISTRAL3}
    absent_text = MISTRAL_SMALL_TEXT

    def merge(self, cfg: HFConfig) -> int:
        return int(cfg.get(cfg.config, "", "spatial_merge_size", 2))

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        """The tower's patch, the merge, ``size.longest_edge`` and ``do_resize`` of the preprocessor."""
        return {
            "patch": self.vision_int(cfg, "patch_size"),
            "merge": self.merge(cfg),
            "longest": cfg.sides("size", "longest_edge", PIXTRAL_LONGEST_EDGE),
            "resize": cfg.preprocessor.get("do_resize", True) is not False,
        }

    def sides(self, rule: Mapping[str, Any], height: int, width: int) -> tuple[int, int]:
        """The sides of one image as the tower gets it (NOTE [ Pixtral row breaks ])."""
        factor = int(rule["patch"]) * int(rule["merge"])
        return resized(height, width, int(rule["longest"]), factor, bool(rule["resize"]))

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        h, w = self.sides(rule, height, width)
        patch, factor = int(rule["patch"]), int(rule["patch"]) * int(rule["merge"])
        rows, cols = h // factor, w // factor  # the merged grid: rows x (cols + 1) LLM tokens
        return VisionInputs(1, (h // patch) * (w // patch), rows * (cols + 1))

    def sized_layout(self, cfg: HFConfig) -> SizedLayout:
        rule = self.image_rule(cfg)
        factor = int(rule["patch"]) * int(rule["merge"])
        return SizedLayout(False, self.vision_int(cfg, "num_channels"), factor, False, rule)

    def sized_image(self, rule: Mapping[str, Any], height: int, width: int, images: int) -> SizedImage:
        # image_sizes are the processor's output sides (NOTE [ Pixtral row breaks ]): no resize here
        patch, factor = int(rule["patch"]), int(rule["patch"]) * int(rule["merge"])
        rows, cols = height // factor, width // factor
        return SizedImage(1, (height // patch) * (width // patch), rows * (cols + 1), rows * cols)

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        return 448, 448  # NOTE [ The worst sample of a length ]: VLA cameras run at 224-480 px

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        defaults = self.vision_types[str(table["model_type"])]

        def num(key: str) -> int:
            return int(cfg.get(table, where, key, defaults.get(key)))

        width, heads, layers = num("hidden_size"), num("num_attention_heads"), num("num_hidden_layers")
        cfg.check_divides(where, "num_attention_heads", heads, "hidden_size", width)
        return (
            VisionTower(
                name="pixtral", hidden=width, layers=layers, heads=heads, ffn=num("intermediate_size"),
                patch=num("patch_size"), channels=num("num_channels"), gated_mlp=True, norm="rmsnorm",
                learned_positions=False, patch_bias=False, pre_norm=True, post_norm=False, qkv_bias=False,
                linear_bias=False, batch_mask=True, unused_layers=unused_layers(cfg, layers, default=-1),
            ),
        )  # fmt: skip

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        raw = cfg.config.get("vision_feature_layer", -1)
        layers = len(raw) if isinstance(raw, list) else 1
        bias = bool(cfg.get(cfg.config, "", "multimodal_projector_bias", False, bool))
        merge = self.merge(cfg)
        return Projector(
            kind="merger_mlp",
            in_dim=tower.hidden * layers,
            out_dim=width,
            hidden_dims=(width,),
            bias=bias,
            merge=merge,
            norm="rmsnorm",
            norm_dim=tower.hidden,
            extra_params=tower.hidden**2 * merge**2,
        )  # fmt: skip  (RMSNorm, the 2x2 merging layer without bias, then the MLP)

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        return bool(cfg.get(cfg.config, "", "tie_word_embeddings", False, bool))  # NOTE [ Mistral 3's tie ]

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        import torch  # optional: the measured mode only (NOTE [ Families defer torch ])

        rule = self.image_rule(cfg)
        h, w = self.sides(rule, shape.height, shape.width)
        factor = int(rule["patch"]) * int(rule["merge"])
        rows, cols = h // factor, w // factor
        if not rows or not cols:
            raise ConfigError(f"an image of {shape.height}x{shape.width} makes no merged Pixtral patch")
        token = image_token(tconfig)
        one = ([token] * cols + [IMAGE_BREAK_ID]) * rows
        one[-1] = IMAGE_END_ID
        ids = token_ids(shape, len(one) * shape.images)
        ids[:, : len(one) * shape.images] = torch.tensor(one * shape.images)
        count = shape.images * shape.batch
        sizes = torch.tensor([[h, w]] * count, dtype=torch.long)
        channels = int(tconfig.vision_config.num_channels)
        # NOTE [ Real bookkeeping tensors ]: the tower and the merger read image_sizes on the host
        return {"input_ids": ids, "image_sizes": sizes}, {"pixel_values": ((count, channels, h, w), dtype)}


FAMILY = Mistral3()
