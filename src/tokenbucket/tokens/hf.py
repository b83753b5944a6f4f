"""Token specs and exact image tokens from a Hugging Face ``config.json`` (and ``preprocessor_config.json``).

No ``transformers`` import: each family's module under :mod:`tokenbucket.models` writes out the
keys it reads and the defaults transformers applies when a key is missing. :func:`image_tokens`
and :func:`vision_inputs` follow the family's processor exactly (NOTE [ HF image tokens ]);
:func:`token_spec_from_hf` gives a :class:`TokenSpec` whose per-image count is that same rule,
so a metadata table's breakdown counts every image as the processor does.

Example:
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    >>> token_spec_from_hf(d).fixed_size, image_tokens(d, 480, 640)
    ((224, 224), 256)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenbucket._exceptions import ConfigError
from tokenbucket.models import SUPPORTED_MODEL_TYPES, VisionInputs, of
from tokenbucket.models._base import rule_json
from tokenbucket.models._hf_json import HFConfig, read_hf_config
from tokenbucket.models.qwen2_vl import FAMILY as QWEN2_VL
from tokenbucket.tokens.spec import CountRule, TokenSpec

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


def token_spec_from_hf(
    path: str | Path | HFConfig, *, feed: str | None = None, stills: Iterable[str] = ()
) -> TokenSpec:
    """The :class:`TokenSpec` of the model's own processing of each camera.

    NOTE [ Frames are images ]
    A camera of two frames or more reaches a family with a video path (Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL, LLaVA-OneVision, SmolVLM) as one clip through its video processor, by default
    (``feed="video"``): the clip's frames are sampled and resized by the video processor's keys
    (``video_preprocessor_config.json``, else ``preprocessor_config.json``, else the class
    defaults). Qwen's frame pairs merge along time, so a clip takes about half the tokens of its
    frames as images; LLaVA-OneVision pools each frame to a quarter of its tower grid, plus one
    newline a clip; SmolVLM feeds each kept frame as one unsplit image (NOTE [ Qwen video
    clips ], NOTE [ LLaVA-OneVision video clips ], NOTE [ SmolVLM video clips ]). ``feed="images"`` counts every frame as one image instead, the way a VLA
    that hands each frame to the image processor feeds them (Qwen2-VL's image path repeats an
    image along time to fill its ``temporal_patch_size``, so an image is one temporal slice);
    ``stills`` names the cameras fed that way while the rest are clips (a wrist camera as
    stills, a head camera as a clip). A one-frame camera is an image either way. A family
    without a video path always feeds images.

    Exact for every family: a native rule where one fits (a fixed square; Qwen2-VL's
    ``max_pixels``), else the family's own rule (``resize="model"``, NOTE [ HF image tokens ]).
    Plain decoders get a text-only spec.

    Example:
        >>> from tokenbucket.tokens.breakdown import breakdown_sample
        >>> cfg = HFConfig("<q>", {"model_type": "qwen2_vl"})
        >>> row = {"cameras": 4, "frames": 16, "height": 448, "width": 448}
        >>> breakdown_sample(row, token_spec_from_hf(cfg)).vision
        8192
        >>> breakdown_sample(row, token_spec_from_hf(cfg, feed="images")).vision
        16384
    """
    cfg = read_hf_config(path)
    family = of(cfg)
    if feed not in (None, "video", "images"):
        raise ConfigError(f"feed should be 'video' or 'images', but got feed={feed!r}")
    if isinstance(stills, str):
        stills = (stills,)
    none = CountRule(count=0)
    rules = {"proprio": none, "action": none, "memory": none}
    if not family.has_vision:
        return TokenSpec(patch=1, tokens_per_frame=1, **rules)  # type: ignore[arg-type]
    fields = family.spec_fields(cfg)
    if fields is None:
        fields = {"resize": "model", "image_rule": rule_json(family.name, family.image_rule(cfg))}
    if family.has_video and feed != "images":
        fields = {**fields, "feed": "video", "video_rule": rule_json(family.name, family.video_rule(cfg))}
        overrides = {str(name): {"feed": "images"} for name in stills}
        return TokenSpec(**fields, overrides=overrides, **rules)  # type: ignore[arg-type]
    if feed == "video":
        raise ConfigError(
            f"config.json {cfg.path!r}: model_type {cfg.model_type!r} has no video path; use feed='images'"
        )
    return TokenSpec(**fields, **rules)  # type: ignore[arg-type]


# NOTE [ HF image tokens ]
# image_tokens counts the LLM positions that carry image features (the <image> placeholders),
# not the fixed wrappers around each image (Qwen2-VL's <|vision_start|>/<|vision_end|>,
# Idefics3's <fake_token_around_image>, <row_r_col_c> and <global-img> text), exactly as each
# family's processor makes them; the rule is in the family's module (tokenbucket/models/):
# - Qwen2-VL: smart_resize to multiples of patch*merge within [min_pixels, max_pixels], then
#   (H'/28)*(W'/28): the TokenSpec max_pixels rule.
# - LLaVA-1.5 / PaliGemma: a fixed square; the class token is dropped unless the strategy is "full".
# - LLaVA-NeXT: the base grid plus the best any-resolution grid, unpadded back to the image's
#   aspect ratio, with one newline token per row.
# - Idefics3 / SmolVLM: tiles plus a global tile (NOTE [ Idefics3 tiles ]).
# - LLaVA-OneVision: LLaVA-NeXT's grids, scaled down past anyres_max_N; a sample of several
#   images is not tiled (NOTE [ LLaVA-OneVision image tokens ]); its spec carries its rule too,
#   which the breakdown runs at each row's image count (NOTE [ Images of a sample ]).
# The last two depend on the aspect ratio in ways no native TokenSpec rule expresses: their
# specs carry the family's rule itself (resize="model").


def image_tokens(config: str | Path | HFConfig, height: int, width: int) -> int:
    """LLM image tokens of one ``height x width`` image, exactly as the model's processor counts them.

    See NOTE [ HF image tokens ] for what is counted. A plain decoder takes no image: 0.
    """
    return vision_inputs(config, height, width).llm_tokens


def vision_inputs(config: str | Path | HFConfig, height: int, width: int, images: int = 1) -> VisionInputs:
    """How the vision tower and the LLM see one ``height x width`` image, as the processor prepares it.

    ``tower_images`` counts the tower's passes (LLaVA-NeXT's base image plus its any-resolution
    crops; Idefics3 / SmolVLM tiles plus the global tile; one otherwise); ``patches_per_image``
    is the tower's own sequence per pass (CLIP keeps its class token; Qwen2-VL's pre-merge
    patches); ``llm_tokens`` equals :func:`image_tokens`. A plain decoder gives ``(0, 0, 0)``.
    ``images``: how many images the sample holds (LLaVA-OneVision tiles only a lone image).

    Example:
        >>> vision_inputs(HFConfig("<qwen>", {"model_type": "qwen2_vl"}), 448, 448)
        VisionInputs(tower_images=1, patches_per_image=1024, llm_tokens=256)
    """
    cfg = read_hf_config(config)
    return of(cfg).vision_inputs(cfg, height, width, images)


def patch_grid(config: str | Path | HFConfig, height: int, width: int) -> tuple[int, int]:
    """Qwen2-VL / Qwen2.5-VL: the pre-merge patch grid ``(rows, cols)`` of one ``height x width``
    image after the processor's resize (``image_grid_thw`` without its temporal 1).

    Example:
        >>> patch_grid(HFConfig("<qwen>", {"model_type": "qwen2_vl"}), 448, 672)
        (32, 48)
    """
    cfg = read_hf_config(config)
    if cfg.model_type not in QWEN2_VL.model_types:
        raise ConfigError(f"config.json {cfg.path!r}: model_type {cfg.model_type!r} has no patch grid (Qwen2-VL only)")
    vision_inputs(cfg, height, width)  # the same checks
    return QWEN2_VL.grid(QWEN2_VL.image_rule(cfg), height, width)
