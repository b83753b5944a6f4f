"""Token specs from a Hugging Face ``config.json`` (and ``preprocessor_config.json``), read as JSON.

No ``transformers`` import: the keys and the defaults transformers applies when a key is
missing are written out here. :func:`token_spec_from_hf` gives the closest :class:`TokenSpec`;
:func:`image_tokens` is exact for every supported model, including what a spec cannot express
(see NOTE [ HF image tokens ]).

Example:
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    >>> token_spec_from_hf(d).fixed_size, image_tokens(d, 480, 640)
    ((224, 224), 256)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._hf_json import (
    DECODER_TYPES,
    IDEFICS3_MAX_IMAGE_SIZE,
    QWEN2_VL_PIXELS,
    SUPPORTED_MODEL_TYPES,
    HFConfig,
    read_hf_config,
)
from tokenbucket.tokens.spec import CountRule, TokenSpec, _camera_py, _smart_resize

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HFConfig",
    "VisionInputs",
    "image_tokens",
    "patch_grid",
    "read_hf_config",
    "token_spec_from_hf",
    "vision_inputs",
]


def _text_only() -> dict[str, CountRule]:
    none = CountRule(count=0)
    return {"proprio": none, "action": none, "memory": none}


def _fixed_side(cfg: HFConfig) -> tuple[int, int]:
    """(image side, patch) of a fixed-size tower."""
    return cfg.vision_int("image_size"), cfg.vision_int("patch_size")


def _qwen_pixels(cfg: HFConfig) -> tuple[int, int]:
    pre, size = cfg.preprocessor, cfg.preprocessor.get("size")
    size = size if isinstance(size, dict) else {}
    lo = pre.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", QWEN2_VL_PIXELS[0])))
    hi = pre.get("max_pixels", size.get("longest_edge", size.get("max_pixels", QWEN2_VL_PIXELS[1])))
    out: list[int] = []
    for key, value in (("min_pixels", lo), ("max_pixels", hi)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"preprocessor_config.json next to {cfg.path!r}: {key} should be a positive integer, but got {value!r}"
            )
        out.append(value)
    return out[0], out[1]


def image_seq_len(cfg: HFConfig) -> int:
    """LLM tokens of one Idefics3 / SmolVLM tile: ``(image_size // patch)**2 // scale_factor**2``."""
    side, patch = _fixed_side(cfg)
    scale = int(cfg.get(cfg.config, "", "scale_factor", 2))
    return (side // patch) ** 2 // (scale * scale)


def token_spec_from_hf(path: str | Path | HFConfig) -> TokenSpec:
    """The closest :class:`TokenSpec` to the model's own image processing (one image per camera frame).

    NOTE [ Frames are images ]
    A camera's frames are counted as that many images, the way a VLA hands them to the image
    processor and the way :meth:`tokenbucket.cost.staged.Sample.video` prices them: Qwen2-VL's
    image path repeats each image along time to fill its ``temporal_patch_size``, so an image is
    one temporal slice. Fed as one video (``pixel_values_videos``), frame pairs merge and a clip
    takes half the tokens; counting them as images is the safe side of that choice.

    Exact for Qwen2-VL / Qwen2.5-VL (``max_pixels``), LLaVA-1.5 and PaliGemma (fixed size). Not
    exact for LLaVA-NeXT (any-resolution grids) and Idefics3 / SmolVLM (tiles): see NOTE [ HF
    image tokens ]; use :func:`image_tokens` for those. Plain decoders get a text-only spec.
    """
    cfg = read_hf_config(path)
    mt = cfg.model_type
    rules = _text_only()
    if mt in DECODER_TYPES:
        return TokenSpec(patch=1, tokens_per_frame=1, **rules)  # type: ignore[arg-type]
    if mt in ("qwen2_vl", "qwen2_5_vl"):
        lo, hi = _qwen_pixels(cfg)
        return TokenSpec(
            patch=cfg.vision_int("patch_size"),
            merge=cfg.vision_int("spatial_merge_size"),
            tubelet=1,  # NOTE [ Frames are images ]
            resize="max_pixels",
            min_pixels=lo,
            max_pixels=hi,
            **rules,  # type: ignore[arg-type]
        )
    side, patch = _fixed_side(cfg)
    if mt in ("idefics3", "smolvlm"):
        # NOTE [ HF image tokens ]: the nearest constant is a 4x4 grid plus the global tile.
        longest, tile, split = cfg.idefics3_sizes()
        tiles = (math.ceil(longest / tile) ** 2 + 1) if split and longest > tile else 1
        return TokenSpec(patch=patch, tokens_per_frame=tiles * image_seq_len(cfg), **rules)  # type: ignore[arg-type]
    return TokenSpec(
        patch=patch,
        resize="fixed",
        fixed_size=(side, side),
        tokens_per_frame=_fixed_tokens(cfg, side, patch) if mt in ("llava", "llava_next") else None,
        **rules,  # type: ignore[arg-type]
    )


def _fixed_tokens(cfg: HFConfig, side: int, patch: int) -> int | None:
    """LLaVA's tokens per image: the patch grid, plus the class token under ``"full"``."""
    strategy = cfg.get(cfg.config, "", "vision_feature_select_strategy", "default", str)
    if strategy not in ("default", "full"):
        raise ConfigError(
            f"config.json {cfg.path!r}: key 'vision_feature_select_strategy' should be 'default' or 'full', "
            f"but got {strategy!r}"
        )
    return (side // patch) ** 2 + (1 if strategy == "full" else 0)


# NOTE [ HF image tokens ]
# image_tokens counts the LLM positions that carry image features (the <image> placeholders),
# not the wrappers around them (Qwen2-VL's <|vision_start|>/<|vision_end|>, Idefics3's
# <fake_token_around_image>, <row_r_col_c> and <global-img> text). Exactly as the processors:
# - Qwen2-VL: smart_resize to multiples of patch*merge within [min_pixels, max_pixels], then
#   (H'/28)*(W'/28): the TokenSpec max_pixels rule.
# - LLaVA-1.5 / PaliGemma: a fixed square; the class token is dropped unless the strategy is "full".
# - LLaVA-NeXT: the base 336 grid plus the best any-resolution grid, unpadded back to the
#   image's aspect ratio, with one newline token per row: depends on the aspect ratio in a way no
#   TokenSpec rule can express.
# - Idefics3 / SmolVLM: the longest side is scaled to size.longest_edge (up or down), both sides
#   rounded up to multiples of the tile, rows*cols tiles plus one global tile, each
#   image_seq_len tokens: also beyond TokenSpec (tiles depend on the aspect ratio).


def _best_resolution(height: int, width: int, pinpoints: list[list[int]]) -> tuple[int, int]:
    """The any-resolution grid that keeps most of the image's pixels, then wastes the fewest."""
    best, best_key = (0, 0), (-1, 0)
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        key = (kept, -(w * h - kept))
        if key > best_key:
            best, best_key = (h, w), key
    return best


def _llava_next_tokens(cfg: HFConfig, height: int, width: int) -> int:
    side, patch = _fixed_side(cfg)
    best_h, best_w = _best_resolution(height, width, cfg.pinpoints())
    grid = side // patch
    cur_h, cur_w = grid * (best_h // side), grid * (best_w // side)
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= ((cur_h - new_h) // 2) * 2
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= ((cur_w - new_w) // 2) * 2
    base = _fixed_tokens(cfg, side, patch) or 0
    return cur_h * cur_w + cur_h + base


def _idefics3_tiles(cfg: HFConfig, height: int, width: int) -> int:
    longest, tile, split = cfg.idefics3_sizes()
    if not split:
        return 1
    ratio = width / height  # longest side to ``longest``, the other keeps the ratio (rounded up to even)
    if cfg.preprocessor.get("do_resize", True) is False:  # no resize: only the cap, then the tile grid
        w, h = width, height
    elif width >= height:
        w, h = longest, int(longest / ratio)
        h += h % 2
    else:
        h, w = longest, int(longest * ratio)
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


def image_tokens(config: str | Path | HFConfig, height: int, width: int) -> int:
    """LLM image tokens of one ``height x width`` image, exactly as the model's processor counts them.

    See NOTE [ HF image tokens ] for what is counted. A plain decoder takes no image: 0.
    """
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} should be a positive integer, but got {name}={value!r}")
    cfg = read_hf_config(config)
    mt = cfg.model_type
    if mt in DECODER_TYPES:
        return 0
    if mt == "llava_next":
        return _llava_next_tokens(cfg, height, width)
    if mt in ("idefics3", "smolvlm"):
        return _idefics3_tiles(cfg, height, width) * image_seq_len(cfg)
    if mt in ("qwen2_vl", "qwen2_5_vl"):
        factor = cfg.vision_int("patch_size") * cfg.vision_int("spatial_merge_size")
        if min(height, width) < factor:
            raise ConfigError(f"an image of {height}x{width} is smaller than one merged patch ({factor} px)")
    spec = token_spec_from_hf(cfg)
    _, _, tokens, small = _camera_py(spec.camera_spec(spec.slot_name(0)), 1, height, width)
    if small is not None:
        raise ConfigError(f"an image of {height}x{width} has no whole patch along its {small}")
    return tokens


def patch_grid(config: str | Path | HFConfig, height: int, width: int) -> tuple[int, int]:
    """Qwen2-VL / Qwen2.5-VL: the pre-merge patch grid ``(rows, cols)`` of one ``height x width``
    image after the processor's resize (``image_grid_thw`` without its temporal 1).

    Example:
        >>> from tokenbucket.models._hf_json import HFConfig
        >>> patch_grid(HFConfig("<qwen>", {"model_type": "qwen2_vl"}), 448, 672)
        (32, 48)
    """
    cfg = read_hf_config(config)
    if cfg.model_type not in ("qwen2_vl", "qwen2_5_vl"):
        raise ConfigError(f"config.json {cfg.path!r}: model_type {cfg.model_type!r} has no patch grid (Qwen2-VL only)")
    image_tokens(cfg, height, width)  # the same checks
    spec = token_spec_from_hf(cfg)
    hb, wb = _smart_resize(spec.camera_spec(spec.slot_name(0)), height, width)
    patch = cfg.vision_int("patch_size")
    return hb // patch, wb // patch


@dataclass(frozen=True)
class VisionInputs:
    """What one image becomes: ``tower_images`` tower passes of ``patches_per_image`` tokens each,
    and ``llm_tokens`` LLM positions (see :func:`vision_inputs`)."""

    tower_images: int
    patches_per_image: int
    llm_tokens: int


def vision_inputs(config: str | Path | HFConfig, height: int, width: int) -> VisionInputs:
    """How the vision tower and the LLM see one ``height x width`` image, as the processor prepares it.

    ``tower_images`` counts the tower's passes (LLaVA-NeXT's base image plus its any-resolution
    crops; Idefics3 / SmolVLM tiles plus the global tile; one otherwise); ``patches_per_image``
    is the tower's own sequence per pass (CLIP keeps its class token; Qwen2-VL's pre-merge
    patches); ``llm_tokens`` equals :func:`image_tokens`. A plain decoder gives ``(0, 0, 0)``.

    Example:
        >>> from tokenbucket.models._hf_json import HFConfig
        >>> vision_inputs(HFConfig("<qwen>", {"model_type": "qwen2_vl"}), 448, 448)
        VisionInputs(tower_images=1, patches_per_image=1024, llm_tokens=256)
    """
    cfg = read_hf_config(config)
    llm = image_tokens(cfg, height, width)
    mt = cfg.model_type
    if mt in DECODER_TYPES:
        return VisionInputs(0, 0, 0)
    if mt in ("qwen2_vl", "qwen2_5_vl"):
        merge = cfg.vision_int("spatial_merge_size")
        return VisionInputs(1, llm * merge * merge, llm)
    side, patch = _fixed_side(cfg)
    grid = (side // patch) ** 2
    if mt in ("idefics3", "smolvlm"):
        return VisionInputs(_idefics3_tiles(cfg, height, width), grid, llm)
    if mt == "llava_next":
        best_h, best_w = _best_resolution(height, width, cfg.pinpoints())
        return VisionInputs((best_h // side) * (best_w // side) + 1, grid + 1, llm)
    return VisionInputs(1, grid + (1 if mt == "llava" else 0), llm)
