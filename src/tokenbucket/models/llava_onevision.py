"""LLaVA-OneVision: a SigLIP tower over any-resolution crops, unpadded, capped at ``anyres_max_N``.

NOTE [ LLaVA-OneVision image tokens ]
A sample's lone image is matched to the ``image_grid_pinpoints`` grid that keeps most of its
pixels (then wastes the fewest), cut into tower-sized crops plus the base image, as in
LLaVA-NeXT; the crops' feature grid is unpadded back to the image's aspect ratio, and when it
holds more than 1.1² times ``N`` crops' worth of features (``vision_aspect_ratio="anyres_max_N"``)
it is scaled down bilinearly by that ratio; each of its rows then ends in a learned newline
token. The base image adds its ``(image_size // patch)**2`` features (SigLIP has no class token).
A sample of several images is not tiled: each image is padded to a square and becomes one crop
plus one newline (730 tokens at 384 px). Under ``vision_feature_select_strategy="default"`` the
processor writes one token less per image. The rule is ``LlavaOnevisionProcessor``'s and
``LlavaOnevisionModel.pack_image_features``' (tests/test_family_llava_onevision.py checks both).
A sample's images are those its processor gets as images, not its clips; the breakdown of a
metadata row counts them as NOTE [ Images of a sample ] says (``counts_images``).

NOTE [ LLaVA-OneVision video clips ]
A clip reaches the model through LlavaOnevisionVideoProcessor (its keys: ``video_keys``): with
``do_sample_frames`` on it keeps ``num_frames`` frames, or ``frames / clip fps * fps`` of them
(at least one), else every frame; each kept frame is resized to ``size`` (384 x 384; or
center-cropped to ``crop_size``), one tower pass of ``(384 // 14)**2`` = 729 patches (a CLIP
tower adds its class token). The model pools each frame's 27 x 27 features bilinearly to
``ceil(27 / 2)**2`` = 196 LLM tokens (``apply_pooling``: a tower grid ``g`` gives
``ceil(g / 2)**2``) and appends one learned newline per clip, and ``LlavaOnevisionProcessor``
writes as many video tokens: ``frames x 196 + 1``, whatever the feature strategy. The processor
counts from its own ``num_image_tokens`` (``processor_config.json``), which the published
processors set to the tower's grid; the rule reads the tower. The pooling views each frame's
features as the tower's square, so a config whose frames reach the tower at another size (or
whose strategy leaves a class token in) breaks the model whatever the count: the published
configs do neither.

Example (the published 0.5B/7B processors):
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> cfg = HFConfig("<ov>", {"model_type": "llava_onevision"})
    >>> FAMILY.vision_inputs(cfg, 480, 640)
    VisionInputs(tower_images=5, patches_per_image=729, llm_tokens=2929)
    >>> FAMILY.vision_inputs(cfg, 480, 640, images=2)
    VisionInputs(tower_images=1, patches_per_image=729, llm_tokens=730)
    >>> FAMILY.clip_inputs(cfg, 8, 480, 640)
    VisionInputs(tower_images=8, patches_per_image=729, llm_tokens=1569)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Family, Inputs, Shape, SizedImage, SizedLayout, VisionInputs, token_ids
from tokenbucket.models._hf_json import HFConfig, VideoKeys
from tokenbucket.models._stages import Projector, VisionTower, vit_tower
from tokenbucket.models.llava import VIT_DEFAULTS, image_token
from tokenbucket.models.llava_next import best_resolution, pinpoints, tiled_image, unpadded

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = [
    "FAMILY",
    "ONEVISION_PINPOINTS",
    "ONEVISION_VIDEO",
    "SIGLIP_384",
    "LlavaOnevision",
    "max_crops",
    "sampled_frames",
]

# LlavaOnevisionConfig's defaults: SigLIP so400m at 384 px, 26 of its 27 blocks, no head
SIGLIP_384 = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304, "patch_size": 14,
              "image_size": 384, "num_hidden_layers": 26, "num_attention_heads": 16, "vision_use_head": False}  # fmt: skip
ONEVISION_PINPOINTS = [[h, w] for h in range(384, 2305, 384) for w in range(384, 2305, 384)]
_ANYRES_MAX = re.compile(r"anyres_max_([1-9][0-9]{0,3})")
# LlavaOnevisionVideoProcessor's class defaults (NOTE [ LLaVA-OneVision video clips ])
ONEVISION_VIDEO: dict[str, Any] = {
    "size": {"height": 384, "width": 384}, "do_resize": True, "do_center_crop": None, "crop_size": None,
    "do_sample_frames": False, "fps": None, "num_frames": None,
}  # fmt: skip


def sampled_frames(rule: Mapping[str, Any], frames: int, fps: float | None) -> int:
    """How many of a clip's ``frames`` frames transformers' default ``sample_frames`` keeps:
    ``num_frames``, or ``frames / fps * rule fps`` (at least one), or all; more than the clip
    holds is refused, as the processor does."""
    if not rule["sample"]:
        return frames
    n = rule["num_frames"]
    if n is None and rule["fps"] is not None:
        if fps is None:
            raise ConfigError(
                "this video processor samples frames at a target fps, which needs each clip's own fps "
                "(an fps column / --sample fps), but got none"
            )
        n = max(1, int(frames / fps * float(rule["fps"])))
    if n is None:
        return frames
    if n > frames:
        raise ConfigError(f"a clip of {frames} frames cannot be sampled to {n} frames (the video processor's rule)")
    return int(n)


def max_crops(cfg: HFConfig) -> int:
    """``N`` of ``vision_aspect_ratio="anyres_max_N"`` (transformers' default ``anyres_max_9``)."""
    raw = cfg.config.get("vision_aspect_ratio", "anyres_max_9")
    found = _ANYRES_MAX.fullmatch(raw) if isinstance(raw, str) else None
    if found is None:
        raise ConfigError(
            f"config.json {cfg.path!r}: key 'vision_aspect_ratio' should be 'anyres_max_N' (N a positive integer), "
            f"but got {raw!r}"
        )
    return int(found.group(1))


def _packed(rule: Mapping[str, Any], height: int, width: int, best_h: int, best_w: int) -> int:
    """LLM tokens of a lone image tiled on the ``best_h x best_w`` grid (NOTE [ LLaVA-OneVision image tokens ])."""
    side, grid = int(rule["side"]), int(rule["side"]) // int(rule["patch"])
    rows, cols = unpadded(height, width, grid * (best_h // side), grid * (best_w // side))
    ratio = math.sqrt(rows * cols / (int(rule["max"]) * grid * grid))
    if ratio > 1.1:  # pack_image_features' bilinear downscale to int(rows // ratio) x int(cols // ratio)
        rows, cols = int(rows // ratio), int(cols // ratio)
    return rows * cols + rows + grid * grid + int(rule["extra"])


class LlavaOnevision(Family):
    name = "llava_onevision"
    unpacked_reason = None  # its images; a packed row holds no video clips (NOTE [ Packed sized-image rows ])
    sized_pixels = True
    counts_images = True  # a lone image is tiled, each of several is one crop (NOTE [ LLaVA-OneVision image tokens ])
    model_types = ("llava_onevision",)
    hf_classes = {"llava_onevision": "LlavaOnevisionForConditionalGeneration"}
    vision_attr = "vision_tower"
    text_type = "qwen2"
    vision_types = VIT_DEFAULTS
    absent_vision = {"llava_onevision": SIGLIP_384}
    video_processor = "LlavaOnevisionVideoProcessor"

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        side, patch = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "patch_size")
        raw = cfg.config.get("image_grid_pinpoints")
        if raw is not None and (not isinstance(raw, list) or not raw):
            raise ConfigError(
                f"config.json {cfg.path!r}: key 'image_grid_pinpoints' should be a list of [h, w] pairs of "
                f"positive integers, but got {raw!r:.80}"
            )
        pins = ONEVISION_PINPOINTS if raw is None else pinpoints(cfg)
        # the processor takes the class token off the total, not off each crop (SigLIP has none)
        strategy = cfg.get(cfg.config, "", "vision_feature_select_strategy", "full", str)
        if strategy not in ("default", "full"):
            raise ConfigError(
                f"config.json {cfg.path!r}: key 'vision_feature_select_strategy' should be 'default' or 'full', "
                f"but got {strategy!r}"
            )
        extra = 0 if strategy == "full" else -1
        return {"side": side, "patch": patch, "pinpoints": pins, "max": max_crops(cfg), "extra": extra}

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        side, grid = int(rule["side"]), int(rule["side"]) // int(rule["patch"])
        best_h, best_w = best_resolution(height, width, rule["pinpoints"])
        crops = (best_h // side) * (best_w // side) + 1
        return VisionInputs(crops, grid * grid, _packed(rule, height, width, best_h, best_w))

    def sample_rule_inputs(self, rule: Mapping[str, Any], height: int, width: int, images: int) -> VisionInputs:
        if images == 1:
            return self.rule_inputs(rule, height, width)
        grid = int(rule["side"]) // int(rule["patch"])
        return VisionInputs(1, grid * grid, grid * grid + 1 + int(rule["extra"]))  # one crop and its newline

    def sized_layout(self, cfg: HFConfig) -> SizedLayout:
        # the model tiles a sample's lone image only: it reads each sample's image count
        rule = self.image_rule(cfg)
        return SizedLayout(True, self.vision_int(cfg, "num_channels"), int(rule["side"]), True, rule)

    def sized_image(self, rule: Mapping[str, Any], height: int, width: int, images: int) -> SizedImage:
        return tiled_image(self.sample_rule_inputs(rule, height, width, images))

    def video_rule(self, cfg: HFConfig) -> dict[str, Any]:
        keys = cfg.video_reader(ONEVISION_VIDEO)
        side, patch = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "patch_size")
        table, _ = self.vision_section(cfg)
        frame = None  # the size every frame is made; None: frames reach the tower as they come
        if keys.flag("do_center_crop"):
            frame = self._frame(keys, "crop_size")
        elif keys.flag("do_resize"):
            frame = self._frame(keys, "size")
        rule = {
            "grid": side // patch, "patch": patch, "class_token": table["model_type"] == "clip_vision_model",
            "frame": frame, "sample": keys.flag("do_sample_frames"), "fps": keys.rate("fps"),
            "num_frames": keys.optional_count("num_frames"),
        }  # fmt: skip
        if rule["sample"] and rule["fps"] is not None and rule["num_frames"] is not None:
            raise ConfigError(f"{keys.where}: fps and num_frames are mutually exclusive, but both are set")
        return rule

    @staticmethod
    def _frame(keys: VideoKeys, key: str) -> list[int]:
        """``[height, width]`` of ``key``'s ``{"height", "width"}`` (a size that keeps the frame's
        aspect ratio makes frames no tower square fits: refused)."""
        size = keys.table_of(key)
        if set(size) != {"height", "width"}:
            raise ConfigError(
                f"{keys.where}: {key} should be {{'height': ..., 'width': ...}} (the tower's square, which the video "
                f"pooling views: NOTE [ LLaVA-OneVision video clips ]), but got {size!r}"
            )
        return [keys.count(f"{key}.height", size["height"]), keys.count(f"{key}.width", size["width"])]

    def clip_rule_inputs(
        self, rule: Mapping[str, Any], frames: int, height: int, width: int, fps: float | None = None
    ) -> VisionInputs:
        n = sampled_frames(rule, frames, fps)
        fh, fw = rule["frame"] or (height, width)
        patch = int(rule["patch"])
        pooled = math.ceil(int(rule["grid"]) / 2) ** 2  # apply_pooling: bilinear to ceil(grid / 2) a side
        passes = (fh // patch) * (fw // patch) + bool(rule["class_token"])
        return VisionInputs(n, passes, n * pooled + 1)  # + the clip's newline

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        """The lone image with the most tokens among those that fill a grid along one side: the
        tokens an image would make on each grid bound the search (their best is exact)."""
        rule = self.image_rule(cfg)
        pins = [(int(h), int(w)) for h, w in rule["pinpoints"]]
        bounds = []
        for best_h, best_w in pins:
            # an image that fits a smaller grid of the same width (height) whole never picks this one
            below_h = max([h for h, w in pins if w == best_w and h < best_h], default=0)
            below_w = max([w for h, w in pins if h == best_h and w < best_w], default=0)
            bounds += [(_packed(rule, h, best_w, best_h, best_w), h, best_w) for h in range(below_h + 1, best_h + 1)]
            bounds += [(_packed(rule, best_h, w, best_h, best_w), best_h, w) for w in range(below_w + 1, best_w)]
        best, size = -1, (0, 0)
        for bound, h, w in sorted(bounds, reverse=True):
            if bound <= best:
                break
            tokens = self.rule_inputs(rule, h, w).llm_tokens
            if tokens > best:
                best, size = tokens, (h, w)
        return size

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        if "vision_feature_layer" not in cfg.config:  # LlavaOnevisionConfig's default: the last block
            cfg = HFConfig(cfg.path, {**cfg.config, "vision_feature_layer": -1}, cfg.preprocessor, cfg.video)
        table, where = self.vision_section(cfg)
        return (vit_tower(cfg, table, where, self.vision_types[str(table["model_type"])], reads_hidden=True),)

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        bias = bool(cfg.get(cfg.config, "", "multimodal_projector_bias", True, bool))
        return Projector(
            kind="mlp", in_dim=tower.hidden, out_dim=width, hidden_dims=(width,), bias=bias, extra_params=width
        )  # fmt: skip  (the image newline)

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        # LlavaOnevisionConfig copies a text_config tie up to the root flag
        return super().tied(cfg, text_tie) or text_tie

    def clip_side(self, cfg: HFConfig, shape: Shape) -> int:
        """The square side every frame of ``shape``'s clips reaches the tower at: the tower's
        ``image_size``, the only frame its video pooling reads (NOTE [ LLaVA-OneVision video
        clips ]); a video processor that makes other frames, or a strategy that leaves a class
        token in, is refused."""
        rule = self.video_rule(cfg)
        side = self.vision_int(cfg, "image_size")
        frame = rule["frame"] or [shape.height, shape.width]
        where = f"{cfg.video_keys[1]} next to {cfg.path!r}"
        if list(frame) != [side, side]:
            raise ConfigError(
                f"{where}: its frames are {frame[0]}x{frame[1]}, but the model pools each frame's features as the "
                f"vision tower's {side}x{side} square: the model cannot read these clips"
            )
        strategy = cfg.get(cfg.config, "", "vision_feature_select_strategy", "full", str)
        if rule["class_token"] and strategy == "full":
            raise ConfigError(
                f"config.json {cfg.path!r}: vision_feature_select_strategy='full' keeps the CLIP tower's class token, "
                "which the video pooling cannot fold into the tower's square: the model cannot read clips"
            )
        return side

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        import torch  # optional: the measured mode only (NOTE [ Families defer torch ])

        if shape.videos:  # NOTE [ LLaVA-OneVision video inputs ]
            side = self.clip_side(cfg, shape)
            clip = self.clip_inputs(cfg, shape.frames, shape.height, shape.width, shape.fps)
            n = clip.llm_tokens * shape.videos
            ids = token_ids(shape, n)
            ids[:, :n] = int(tconfig.video_token_id)
            pixels = (shape.videos * shape.batch, clip.tower_images, 3, side, side)
            return {"input_ids": ids}, {"pixel_values_videos": (pixels, dtype)}
        vi = self.vision_inputs(cfg, shape.height, shape.width, shape.images)
        n = vi.llm_tokens * shape.images
        ids = token_ids(shape, n)
        ids[:, :n] = image_token(tconfig)
        side = int(tconfig.vision_config.image_size)
        count = shape.images * shape.batch
        real = {
            "input_ids": ids,
            "image_sizes": torch.tensor([[shape.height, shape.width]] * count, dtype=torch.long),
            "batch_num_images": torch.tensor([shape.images] * shape.batch, dtype=torch.long),
        }
        return real, {"pixel_values": ((count, vi.tower_images, 3, side, side), dtype)}


# NOTE [ LLaVA-OneVision video inputs ]
# What LlavaOnevisionProcessor hands the model for a clip (NOTE [ LLaVA-OneVision video clips ]
# for its count), as the measured mode builds it: pixel_values_videos [clips, kept frames, 3,
# side, side] (fake; one row per clip of the batch, every sample's clips in turn), which
# LlavaOnevisionModel.get_video_features views as one tower batch of clips x frames images,
# projects, pools to ceil(grid / 2)**2 tokens a frame and ends with one newline per clip; and
# input_ids with frames x 196 + 1 video_token_id placeholders per clip at 384 px (the
# processor's "<video>" expanded), which the model fills in order. No image_sizes and no
# batch_num_images: those are the images'.

FAMILY = LlavaOnevision()
