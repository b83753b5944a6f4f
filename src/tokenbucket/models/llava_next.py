"""LLaVA-NeXT: LLaVA's CLIP tower over any-resolution crops, unpadded, with a newline per row.

An image is matched to the ``image_grid_pinpoints`` grid that keeps most of its pixels (then
wastes the fewest), cut into tower-sized crops plus the base image; the crops' features are
unpadded back to the image's aspect ratio and each row ends in a learned newline token
(NOTE [ HF image tokens ] in :mod:`tokenbucket.tokens.hf`).

Example:
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> FAMILY.vision_inputs(HFConfig("<n>", {"model_type": "llava_next"}), 480, 640)
    VisionInputs(tower_images=5, patches_per_image=577, llm_tokens=2340)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenbucket import _values as V
from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Family, Inputs, Shape, SizedImage, SizedLayout, VisionInputs, token_ids
from tokenbucket.models._hf_json import HFConfig, is_side
from tokenbucket.models._stages import Projector, VisionTower, vit_tower
from tokenbucket.models.llava import CLIP_336, VIT_DEFAULTS, image_token, select_extra

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "LLAVA_PINPOINTS", "LlavaNext", "best_resolution", "pinpoints", "tiled_image", "unpadded"]

LLAVA_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]


def pinpoints(cfg: HFConfig) -> list[list[int]]:
    """The any-resolution grids (``image_grid_pinpoints``): ``[h, w]`` pairs of pixels."""
    pins = cfg.config.get("image_grid_pinpoints") or LLAVA_PINPOINTS
    if not isinstance(pins, list) or not all(isinstance(p, list) and len(p) == 2 and all(is_side(v) for v in p)
                                             for p in pins):  # fmt: skip
        raise ConfigError(
            f"config.json {cfg.path!r}: key 'image_grid_pinpoints' should be a list of [h, w] pairs of "
            f"positive integers up to {V.MAX_SIDE}, but got {pins!r:.80}"
        )
    return pins


def best_resolution(height: int, width: int, pins: list[list[int]]) -> tuple[int, int]:
    """The any-resolution grid that keeps most of the image's pixels, then wastes the fewest."""
    best, best_key = (0, 0), (-1, 0)
    for h, w in pins:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        key = (kept, -(w * h - kept))
        if key > best_key:
            best, best_key = (h, w), key
    return best


def unpadded(height: int, width: int, rows: int, cols: int) -> tuple[int, int]:
    """The ``rows x cols`` feature grid cut back to the image's aspect ratio (the padding removed)."""
    if width / height > cols / rows:
        new_h = int(round(height * (cols / width), 7))
        rows -= ((rows - new_h) // 2) * 2
    else:
        new_w = int(round(width * (rows / height), 7))
        cols -= ((cols - new_w) // 2) * 2
    return rows, cols


class LlavaNext(Family):
    name = "llava_next"
    unpacked_reason = None
    sized_pixels = True
    model_types = ("llava_next",)
    hf_classes = {"llava_next": "LlavaNextForConditionalGeneration"}
    vision_attr = "vision_tower"
    text_type = "llama"
    vision_types = VIT_DEFAULTS
    absent_vision = {"llava_next": CLIP_336}

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        side, patch = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "patch_size")
        return {"side": side, "patch": patch, "pinpoints": pinpoints(cfg), "extra": select_extra(cfg)}

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        side, patch = int(rule["side"]), int(rule["patch"])
        best_h, best_w = best_resolution(height, width, rule["pinpoints"])
        grid = side // patch
        rows, cols = unpadded(height, width, grid * (best_h // side), grid * (best_w // side))
        tokens = rows * cols + rows + grid * grid + int(rule["extra"])
        return VisionInputs((best_h // side) * (best_w // side) + 1, grid * grid + 1, tokens)

    def sized_layout(self, cfg: HFConfig) -> SizedLayout:
        rule = self.image_rule(cfg)
        return SizedLayout(True, self.vision_int(cfg, "num_channels"), int(rule["side"]), False, rule)

    def sized_image(self, rule: Mapping[str, Any], height: int, width: int, images: int) -> SizedImage:
        return tiled_image(self.sample_rule_inputs(rule, height, width, images))

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        best = max(pinpoints(cfg), key=lambda hw: self.vision_inputs(cfg, hw[0], hw[1]).llm_tokens)
        return best[0], best[1]

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        return (vit_tower(cfg, table, where, self.vision_types[str(table["model_type"])], reads_hidden=True),)

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        bias = bool(cfg.get(cfg.config, "", "multimodal_projector_bias", True, bool))
        return Projector(
            kind="mlp", in_dim=tower.hidden, out_dim=width, hidden_dims=(width,), bias=bias, extra_params=width
        )  # fmt: skip  (the image newline)

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        import torch  # optional: the measured mode only (NOTE [ Families defer torch ])

        vi = self.vision_inputs(cfg, shape.height, shape.width)
        n = vi.llm_tokens * shape.images
        ids = token_ids(shape, n)
        ids[:, :n] = image_token(tconfig)
        side = int(tconfig.vision_config.image_size)
        count = shape.images * shape.batch
        real = {"input_ids": ids, "image_sizes": torch.tensor([[shape.height, shape.width]] * count, dtype=torch.long)}
        return real, {"pixel_values": ((count, vi.tower_images, 3, side, side), dtype)}


def tiled_image(vi: VisionInputs) -> SizedImage:
    """An any-resolution image's tiles: its LLM tokens are all image placeholders (the newlines too)."""
    return SizedImage(vi.tower_images, vi.tower_images * vi.patches_per_image, vi.llm_tokens, vi.llm_tokens)


FAMILY = LlavaNext()
