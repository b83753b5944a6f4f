"""Qwen3-VL: Qwen2-VL's dynamic resolution at 16-px patches, DeepStack mergers, a Qwen3 backbone.

The image processor is transformers' ``Qwen2VLImageProcessor`` (``smart_resize``) with the
published checkpoints' ``preprocessor_config.json``: ``patch_size`` 16, so both sides round to
multiples of 32, and ``size`` ``{"shortest_edge": 65536, "longest_edge": 16777216}`` (the
processor class's own defaults are Qwen2-VL's 14-px ones, which no Qwen3-VL tower reads: a
config without a preprocessor gets the published bounds, ``QWEN3_VL_PIXELS``). The tower is a
LayerNorm ViT with biases everywhere, a learned position table of ``num_position_embeddings``
rows bilinearly interpolated to each image's grid and a 2-D rope; its 2x2 merger feeds the LLM,
and one more merger per ``deepstack_visual_indexes`` entry (LayerNorm over the folded input)
adds that block's features to the first decoder layers' image positions. The backbone is
Qwen3's: no q/k/v bias, a per-head RMSNorm on q and k. Exact in a native
:class:`~tokenbucket.tokens.spec.CameraSpec` rule (``resize="max_pixels"``).

Example:
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> FAMILY.vision_inputs(HFConfig("<q>", {"model_type": "qwen3_vl"}), 512, 512)
    VisionInputs(tower_images=1, patches_per_image=1024, llm_tokens=256)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import TEXT_TOKEN
from tokenbucket.models._hf_json import HFConfig, VideoKeys
from tokenbucket.models._stages import Projector, VisionTower
from tokenbucket.models.qwen2_vl import UNKNOWN_FPS, Qwen2VL, check_aspect

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "QWEN3_VL_PIXELS", "QWEN3_VL_VIDEO", "Qwen3VL", "clip_resize"]

QWEN3_VL_PIXELS = (65536, 16777216)  # the published preprocessor_config.json's size: (shortest, longest)_edge
# Qwen3VLVideoProcessor's class defaults: its pixel bounds hold for a whole clip, not one frame
QWEN3_VL_VIDEO: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}, "patch_size": 16,
    "temporal_patch_size": 2, "merge_size": 2, "do_sample_frames": True, "fps": 2, "num_frames": None,
    "min_frames": 4, "max_frames": 768, "cap_pixels_per_frame": None, "max_video_tokens": 768,
}  # fmt: skip


def clip_resize(
    frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen3-VL's video ``smart_resize``: both sides multiples of ``factor``, the clip's pixels
    (frames rounded to ``temporal``) brought into ``[min_pixels, max_pixels]``."""
    if frames < temporal:
        raise ConfigError(
            f"a Qwen3-VL clip needs at least {temporal} frames (its temporal patch), but got frames={frames}"
        )
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    check_aspect(height, width)
    hb, wb = round(height / factor) * factor, round(width / factor) * factor
    tb = round(frames / temporal) * temporal
    if tb * hb * wb > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        hb = max(factor, math.floor(height / beta / factor) * factor)
        wb = max(factor, math.floor(width / beta / factor) * factor)
    elif tb * hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        hb = math.ceil(height * beta / factor) * factor
        wb = math.ceil(width * beta / factor) * factor
    return hb, wb


_TOWERS: dict[str, dict[str, Any]] = {
    "qwen3_vl_vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                        "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                        "out_hidden_size": 3584, "num_position_embeddings": 2304,
                        "deepstack_visual_indexes": [8, 16, 24]},
}  # fmt: skip


class Qwen3VL(Qwen2VL):
    name = "qwen3_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen3_vl",)
    hf_classes = {"qwen3_vl": "Qwen3VLForConditionalGeneration"}
    vision_attr = "visual"
    text_type = "qwen3_vl_text"
    vision_types = _TOWERS
    absent_vision = {"qwen3_vl": {"model_type": "qwen3_vl_vision"}}
    flat_text = False
    default_pixels = QWEN3_VL_PIXELS
    video_processor = "Qwen3VLVideoProcessor"
    sampling_needs_a_rate = False

    def video_defaults(self) -> Mapping[str, Any]:
        return QWEN3_VL_VIDEO

    def video_pixels(self, keys: VideoKeys) -> tuple[int, int]:
        """(min_pixels, max_pixels) per clip: ``size``'s edges alone (Qwen3VLVideoProcessor has no
        ``min_pixels`` / ``max_pixels`` keys, and a null ``size`` is no size)."""
        return self.edges(keys, keys.table_of("size"))

    def sampled_frames(self, rule: Mapping[str, Any], frames: int, fps: float | None) -> int:
        if not rule["sample"]:
            return frames
        if rule["num_frames"] is not None:
            n = int(rule["num_frames"])
        elif rule["fps"] is not None:
            # a clip of unknown rate at UNKNOWN_FPS, as its sample_frames assumes
            n = int(frames / (UNKNOWN_FPS if fps is None else fps) * float(rule["fps"]))
            n = min(max(n, int(rule["min_frames"])), int(rule["max_frames"]), frames)
        else:
            n = min(max(frames, int(rule["min_frames"])), int(rule["max_frames"]))
        return n  # np.linspace(0, frames - 1, n): n indices, repeats allowed

    def clip_grid(self, rule: Mapping[str, Any], frames: int, height: int, width: int) -> tuple[int, int, int]:
        patch, merge, t = int(rule["patch"]), int(rule["merge"]), int(rule["temporal"])
        factor = patch * merge
        lo, hi = int(rule["min_pixels"]), int(rule["max_pixels"])
        if rule["cap"]:
            per_frame = max(min(int(rule["max_video_tokens"]) * factor * factor, hi // frames), int(lo * 1.05))
            hi = per_frame * frames
        hb, wb = clip_resize(frames, height, width, t, factor, lo, hi)
        return -(-frames // t), hb // patch, wb // patch

    def min_video_text_tokens(self, groups: int) -> int:
        return 3 * groups  # a timestamp (one token at least), a vision start and end token per temporal group

    def video_placeholder(self, tconfig: PretrainedConfig, groups: int, per_group: int) -> list[int]:
        # NOTE [ Qwen video inputs ]: each temporal group apart, after its timestamp (a plain text token here)
        video = [int(tconfig.video_token_id)] * per_group
        return [TEXT_TOKEN, tconfig.vision_start_token_id, *video, tconfig.vision_end_token_id] * groups

    def deepstack(self, cfg: HFConfig, layers: int) -> int:
        """How many DeepStack mergers the tower builds (one per ``deepstack_visual_indexes`` entry)."""
        table, where = self.vision_section(cfg)
        raw = table.get("deepstack_visual_indexes", _TOWERS["qwen3_vl_vision"]["deepstack_visual_indexes"])
        if not isinstance(raw, list | tuple) or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < layers for k in raw
        ):
            raise ConfigError(
                f"config.json {cfg.path!r}: key {where}.deepstack_visual_indexes should be a list of block indexes "
                f"in [0, {layers - 1}], but got {raw!r}"
            )
        return len(raw)

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        defaults = self.vision_types[str(table["model_type"])]

        def num(key: str) -> int:
            return int(cfg.get(table, where, key, defaults.get(key)))

        width, heads = num("hidden_size"), num("num_heads")
        cfg.check_divides(where, "num_heads", heads, "hidden_size", width)
        return (
            VisionTower(
                name="qwen3_vl_vision", hidden=width, layers=num("depth"), heads=heads, ffn=num("intermediate_size"),
                patch=num("patch_size"), temporal_patch=num("temporal_patch_size"), merge=num("spatial_merge_size"),
                channels=num("in_channels"), learned_positions=False, position_rows=num("num_position_embeddings"),
                post_norm=False,
            ),
        )  # fmt: skip

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        table, where = self.vision_section(cfg)
        out = int(cfg.get(table, where, "out_hidden_size", _TOWERS["qwen3_vl_vision"]["out_hidden_size"]))
        folded = tower.hidden * tower.merge**2
        return Projector(kind="patch_merger", in_dim=folded, out_dim=out, hidden_dims=(folded,), merge=tower.merge,
                         norm="layernorm", norm_dim=tower.hidden, deepstack=self.deepstack(cfg, tower.layers))  # fmt: skip

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        # transformers 5: Qwen3VLConfig ties by its root flag alone (default false)
        return bool(cfg.get(cfg.config, "", "tie_word_embeddings", False, bool))


FAMILY = Qwen3VL()
