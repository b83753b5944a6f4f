"""Idefics3 and SmolVLM: a SigLIP-style tower over square tiles, pixel shuffle, a Llama backbone
(SmolVLM's video path: :mod:`tokenbucket.models.smolvlm`).

NOTE [ Idefics3 tiles ]
The image processor scales the longest side to ``size.longest_edge`` (up or down; the other
side keeps the ratio, rounded up to even), caps both at 4096, then rounds both sides up to
multiples of the tile (``max_image_size.longest_edge``): ``rows x cols`` tiles plus one global
tile, or a single tile when the image fits one or ``do_image_splitting`` is off. Each tile is
``(image_size // patch)**2 // scale_factor**2`` LLM tokens. So SmolVLM's default processor
makes a 512 x 512 image 17 tiles (1,088 tokens) and, with splitting off, one (64): the image's
own size decides, never a constant.

Example (SmolVLM-256M's tower and processor, which SmolVLM reads alike):
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> config = {"model_type": "idefics3", "scale_factor": 4,
    ...           "vision_config": {"image_size": 512, "patch_size": 16}}
    >>> pre = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}
    >>> FAMILY.vision_inputs(HFConfig("<s>", config, pre), 512, 512).llm_tokens
    1088
    >>> FAMILY.vision_inputs(HFConfig("<s>", config, {**pre, "do_image_splitting": False}), 512, 512).llm_tokens
    64
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket.models._base import Family, Inputs, Shape, TowerImage, VisionInputs, token_ids
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._stages import Projector, VisionTower, vit_tower
from tokenbucket.models.llava import image_token

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "IDEFICS3_MAX_IMAGE_SIZE", "Idefics3", "tile_inputs", "tiles"]

IDEFICS3_MAX_IMAGE_SIZE = 4096  # the image processors' absolute cap on a resized side
_TOWER = {"hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 16,
          "image_size": 224, "patch_size": 32, "num_channels": 3}  # fmt: skip


def tiles(rule: Mapping[str, Any], height: int, width: int) -> int:
    """Tiles of one image, the global tile included (NOTE [ Idefics3 tiles ])."""
    longest, tile = int(rule["longest"]), int(rule["tile"])
    if not rule["split"]:
        return 1
    if not rule["resize"]:  # no resize: only the cap, then the tile grid
        w, h = width, height
    elif width >= height:
        w, h = longest, int(longest / (width / height))
        h += h % 2
    else:
        h, w = longest, int(longest * (width / height))
        w += w % 2
    ratio = w / h
    if w >= h and w > IDEFICS3_MAX_IMAGE_SIZE:
        w, h = IDEFICS3_MAX_IMAGE_SIZE, int(IDEFICS3_MAX_IMAGE_SIZE / ratio)
    elif h > w and h > IDEFICS3_MAX_IMAGE_SIZE:
        h, w = IDEFICS3_MAX_IMAGE_SIZE, int(IDEFICS3_MAX_IMAGE_SIZE * ratio)
    h, w = max(h, 1), max(w, 1)
    ratio = w / h  # then both sides up to multiples of the tile
    if w >= h:
        w = math.ceil(w / tile) * tile
        h = math.ceil(int(w / ratio) / tile) * tile
    else:
        h = math.ceil(h / tile) * tile
        w = math.ceil(int(h * ratio) / tile) * tile
    if h > tile or w > tile:
        return (h // tile) * (w // tile) + 1
    return 1


class Idefics3(Family):
    name = "idefics3"
    unpacked_reason = None
    model_types: ClassVar[tuple[str, ...]] = ("idefics3",)  # smolvlm: its subclass (tokenbucket.models.smolvlm)
    hf_classes: ClassVar[Mapping[str, str]] = {"idefics3": "Idefics3ForConditionalGeneration"}
    vision_attr = "vision_model"
    text_type = "llama"
    vision_types = {"idefics3_vision": _TOWER, "smolvlm_vision": _TOWER}
    absent_vision: ClassVar[Mapping[str, Mapping[str, Any]]] = {"idefics3": {"model_type": "idefics3_vision"}}

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        """The processor's ``size.longest_edge``, ``max_image_size.longest_edge`` (the tile),
        ``do_image_splitting`` and ``do_resize`` (its defaults: 1456, 364, true, true), and the
        tower's tile side, patch and pixel-shuffle scale."""
        scale = int(cfg.get(cfg.config, "", "scale_factor", 2))
        side, patch = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "patch_size")
        return {
            "longest": cfg.sides("size", "longest_edge", 4 * 364),
            "tile": cfg.sides("max_image_size", "longest_edge", 364),
            "split": bool(cfg.preprocessor.get("do_image_splitting", True)),
            "resize": cfg.preprocessor.get("do_resize", True) is not False,
            "patches": (side // patch) ** 2,
            "seq": (side // patch) ** 2 // (scale * scale),
        }

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        n = tiles(rule, height, width)
        return VisionInputs(n, int(rule["patches"]), n * int(rule["seq"]))

    def tower_image(self, cfg: HFConfig) -> TowerImage:
        # every tile (and the global one) is the tower's square, whatever the image: its token
        # count is the model's fixed image_seq_len (the markers around it are text)
        rule = self.image_rule(cfg)
        side, channels = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "num_channels")
        return TowerImage(channels, side, int(rule["patches"]), int(rule["seq"]), batched=True)

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        side = int(self.image_rule(cfg)["longest"])
        return side, side

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        return (vit_tower(cfg, table, where, self.vision_types[str(table["model_type"])], reads_hidden=False),)

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        scale = int(cfg.get(cfg.config, "", "scale_factor", 2))
        return Projector(kind="pixel_shuffle", in_dim=tower.hidden * scale**2, out_dim=width, bias=False, merge=scale)

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        vi = self.vision_inputs(cfg, shape.height, shape.width)
        side = int(tconfig.vision_config.image_size)
        return tile_inputs(tconfig, shape, vi.tower_images * shape.images, vi.llm_tokens * shape.images, side, dtype)


def tile_inputs(
    tconfig: PretrainedConfig, shape: Shape, count: int, tokens: int, side: int, dtype: torch.dtype
) -> Inputs:
    """``shape.batch`` samples of ``count`` ``side``-px tiles and ``tokens`` image tokens each, as
    Idefics3's and SmolVLM's processors hand them over: ``pixel_values`` [batch, count, 3, side,
    side] and its ``pixel_attention_mask`` (real: NOTE [ Real bookkeeping tensors ], the model
    reads them), their bytes held by a fake stand-in, the image tokens first in ``input_ids``."""
    import torch  # optional: the measured mode only (NOTE [ Families defer torch ])

    ids = token_ids(shape, tokens)
    ids[:, :tokens] = image_token(tconfig)
    real = {
        "input_ids": ids,
        "pixel_values": torch.ones((shape.batch, count, 3, side, side), dtype=dtype),
        "pixel_attention_mask": torch.ones((shape.batch, count, side, side), dtype=torch.bool),
    }
    return real, {"_pixels_held": ((shape.batch, count, 3, side, side), dtype)}


FAMILY = Idefics3()
