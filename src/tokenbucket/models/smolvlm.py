"""SmolVLM and SmolVLM2: Idefics3's tiles for an image (:mod:`tokenbucket.models.idefics3`) and a
video path through ``SmolVLMVideoProcessor``.

NOTE [ SmolVLM video clips ]
With ``do_sample_frames`` on (the class default is off: every frame is kept), the video processor
keeps ``round(fps x duration)`` frames, at most ``num_frames`` and at least one
(``video_sampling``'s ``fps`` and ``max_frames`` replace ``fps`` and ``num_frames``; ``duration``
is the clip's frames over its own fps, which it needs), spread evenly over the clip, one second
skipped at each end when the clip is long enough, with repeats dropped (``np.unique``), so a
short clip can keep fewer. Each kept frame is resized to the ``max_image_size`` square and never
split: one tower pass of ``(max_image_size // patch)**2`` patches and ``image_seq_len`` =
``(image_size // patch)**2 // scale_factor**2`` LLM tokens, as an unsplit image. The processor also writes, per
clip, an intro ("You are provided the following series of ...") and, per frame, a timestamp
("Frame from 00:01:") and the ``<fake_token_around_image><global-img>`` wrapper: tokenizer text,
left to the sample's text count (NOTE [ HF image tokens ]). The processor counts
``image_seq_len`` (``processor_config.json``) per frame, which the published processors set from
the tower as the rule does; their ``max_image_size`` is the tower's ``image_size``, as the model
needs (a frame of another size makes features that count does not match).

Example (SmolVLM2-256M's tower; its video processor sampling at 1 fps):
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> config = {"model_type": "smolvlm", "scale_factor": 4,
    ...           "vision_config": {"image_size": 512, "patch_size": 16}}
    >>> video = {"do_sample_frames": True, "max_image_size": {"longest_edge": 512},
    ...          "video_sampling": {"fps": 1, "max_frames": 64, "video_size": {"longest_edge": 2048}}}
    >>> FAMILY.clip_inputs(HFConfig("<s>", config, {}, video), 300, 480, 640, fps=30)
    VisionInputs(tower_images=10, patches_per_image=1024, llm_tokens=640)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Inputs, Shape, VisionInputs
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models.idefics3 import Idefics3, tile_inputs

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "SMOLVLM_VIDEO", "SmolVLM", "sampled_frames"]

# SmolVLMVideoProcessor's class defaults (NOTE [ SmolVLM video clips ])
SMOLVLM_VIDEO: dict[str, Any] = {
    "size": {"longest_edge": 4 * 364}, "max_image_size": {"longest_edge": 364}, "do_resize": True, "do_sample_frames": False, "fps": None,
    "num_frames": None, "video_sampling": None,
}  # fmt: skip
SKIP_SECONDS = 1  # sample_frames' skip_secs: trimmed from each end of a clip long enough


def sampled_frames(rule: Mapping[str, Any], frames: int, fps: float | None) -> int:
    """How many of a clip's ``frames`` frames ``SmolVLMVideoProcessor.sample_frames`` keeps."""
    if not rule["sample"]:
        return frames
    if fps is None:
        raise ConfigError(
            "SmolVLM's video processor samples frames by time, which needs each clip's own fps "
            "(an fps column / --sample fps), but got none"
        )
    target, most = float(rule["fps"]), int(rule["num_frames"])
    duration = frames / fps
    wanted = max(1, min(round(target * duration), most))
    start, end = 0, frames - 1
    if duration - 2 * SKIP_SECONDS > most * target:
        start, end = int(SKIP_SECONDS * fps), int(frames - SKIP_SECONDS * fps)
    start, end = max(0, start), min(end, frames - 1)
    if start >= end:
        start, end = 0, frames - 1
    return len(np.unique(np.linspace(start, end, wanted, dtype=int)))


def _resizes(size: object) -> bool:
    """A size ``SmolVLMVideoProcessor.resize`` takes: a longest edge, or a height and width (an int
    is a square)."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size > 0
    return isinstance(size, dict) and bool(size.get("longest_edge") or (size.get("height") and size.get("width")))


class SmolVLM(Idefics3):
    name = "smolvlm"
    model_types = ("smolvlm",)
    hf_classes = {"smolvlm": "SmolVLMForConditionalGeneration"}
    absent_vision = {"smolvlm": {"model_type": "smolvlm_vision"}}
    video_processor = "SmolVLMVideoProcessor"

    def video_rule(self, cfg: HFConfig) -> dict[str, Any]:
        keys = cfg.video_reader(SMOLVLM_VIDEO)
        image = self.image_rule(cfg)
        fps, most, size = keys.rate("fps"), keys.optional_count("num_frames"), keys.raw("size")
        if keys.raw("video_sampling") is not None:  # __init__: it replaces fps, num_frames and size
            sampling = keys.table_of("video_sampling")
            needed = ("fps", "max_frames") if "size" in keys.table else ("fps", "max_frames", "video_size")
            if not set(needed) <= set(sampling):
                raise ConfigError(f"{keys.where}: video_sampling should hold {', '.join(needed)}, but got {sampling!r}")
            fps = keys.rate("video_sampling.fps", sampling["fps"])
            most = keys.count("video_sampling.max_frames", sampling["max_frames"])
            size = size if "size" in keys.table else sampling["video_size"]
        if keys.flag("do_resize") and not _resizes(size):
            raise ConfigError(
                f"{keys.where}: size should be {{'longest_edge': ...}} or {{'height': ..., 'width': ...}} (the "
                f"first resize; every frame then becomes the max_image_size square), but got {size!r}"
            )
        frame = None  # the square every frame is made; None: frames reach the tower as they come
        if keys.flag("do_resize"):
            frame = keys.count("max_image_size.longest_edge", keys.table_of("max_image_size").get("longest_edge"))
        rule = {"frame": frame, "patch": self.vision_int(cfg, "patch_size"), "seq": image["seq"],
                "sample": keys.flag("do_sample_frames"), "fps": fps, "num_frames": most}  # fmt: skip
        if rule["sample"] and (fps is None or most is None):
            raise ConfigError(
                f"{keys.where}: do_sample_frames needs fps and num_frames (or video_sampling's fps and max_frames), "
                f"but got fps={fps!r}, num_frames={most!r}"
            )
        return rule

    def clip_rule_inputs(
        self, rule: Mapping[str, Any], frames: int, height: int, width: int, fps: float | None = None
    ) -> VisionInputs:
        n = sampled_frames(rule, frames, fps)
        patch, frame = int(rule["patch"]), rule["frame"]
        passes = (frame // patch) ** 2 if frame is not None else (height // patch) * (width // patch)
        return VisionInputs(n, passes, n * int(rule["seq"]))

    def clip_side(self, cfg: HFConfig, shape: Shape) -> int:
        """The square side every frame of ``shape``'s clips reaches the tower at: the tower's
        ``image_size``, the one square whose features ``image_seq_len`` counts (NOTE [ SmolVLM
        video clips ]); a video processor that makes other frames is refused."""
        rule = self.video_rule(cfg)
        side = self.vision_int(cfg, "image_size")
        frame = [rule["frame"]] * 2 if rule["frame"] is not None else [shape.height, shape.width]
        if frame != [side, side]:
            raise ConfigError(
                f"{cfg.video_keys[1]} next to {cfg.path!r}: its frames are {frame[0]}x{frame[1]}, but the vision "
                f"tower reads {side}x{side} (max_image_size.longest_edge should be {side}): the model cannot read "
                "these clips"
            )
        return side

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        if not shape.videos:
            return super().inputs(cfg, tconfig, shape, dtype)
        # NOTE [ SmolVLM video inputs ]
        # SmolVLMVideoProcessor hands a clip's kept frames over as unsplit images: pixel_values
        # [clips, frames, 3, side, side] with its pixel_attention_mask, which the model reads as
        # Idefics3 reads tiles (one tower pass a frame, image_seq_len image tokens each, filled in
        # order). A sample's clips sit in one row here, [batch, clips x frames, ...]: the same
        # bytes and tower passes as one row a clip. The per-frame wrappers and timestamps are text.
        side = self.clip_side(cfg, shape)
        clip = self.clip_inputs(cfg, shape.frames, shape.height, shape.width, shape.fps)
        return tile_inputs(
            tconfig, shape, clip.tower_images * shape.videos, clip.llm_tokens * shape.videos, side, dtype
        )


FAMILY = SmolVLM()
