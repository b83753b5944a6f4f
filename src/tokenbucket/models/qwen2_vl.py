"""Qwen2-VL and Qwen2.5-VL: a dynamic-resolution tower, a 2x2 patch merger, a Qwen2 backbone.

The image processor's ``smart_resize`` rounds both sides to multiples of ``patch x merge`` (28)
and rescales so the area lies in ``[min_pixels, max_pixels]``; the tower sees every 14-px
patch (the image repeated along time to fill ``temporal_patch_size``) and the merger folds 2x2
of them into one LLM token. Exact in a native :class:`~tokenbucket.tokens.spec.CameraSpec`
rule (``resize="max_pixels"``). Qwen2.5-VL's tower attends within windows (8 x 8 patches) in
all blocks but its ``fullatt_block_indexes`` (NOTE [ Windowed tower attention ]).

Example:
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> FAMILY.vision_inputs(HFConfig("<q>", {"model_type": "qwen2_vl"}), 448, 448)
    VisionInputs(tower_images=1, patches_per_image=1024, llm_tokens=256)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Family, Inputs, Shape, VisionInputs, token_ids
from tokenbucket.models._hf_json import HFConfig, VideoKeys
from tokenbucket.models._stages import MAX_MLP_RATIO, Projector, VisionTower
from tokenbucket.models.llava import image_token

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = [
    "FAMILY",
    "MAX_ASPECT",
    "QWEN2_VL_PIXELS",
    "QWEN2_VL_VIDEO",
    "UNKNOWN_FPS",
    "Qwen2VL",
    "check_aspect",
    "check_pixel_bounds",
    "rope_positions",
    "smart_resize",
]

QWEN2_VL_PIXELS = (56 * 56, 28 * 28 * 1280)  # Qwen2VLImageProcessor: (min_pixels, max_pixels)
# Qwen2VLVideoProcessor's class defaults (Qwen2.5-VL's processor uses the same class)
QWEN2_VL_VIDEO: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}, "patch_size": 14,
    "temporal_patch_size": 2, "merge_size": 2, "do_sample_frames": False, "fps": None, "num_frames": None,
    "min_frames": 4, "max_frames": 768, "cap_pixels_per_frame": None, "max_video_tokens": 128000,
}  # fmt: skip
_TOWERS: dict[str, dict[str, Any]] = {
    "qwen2_vl_vision": {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "mlp_ratio": 4, "num_heads": 16,
                        "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "qwen2_5_vl_vision": {"depth": 32, "hidden_size": 3584, "intermediate_size": 3420, "num_heads": 16,
                          "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "out_hidden_size": 3584, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]},
}  # fmt: skip


MAX_ASPECT = 200  # smart_resize refuses a frame whose long side is more than 200 times its short side


def check_pixel_bounds(where: str, lo: int, hi: int, factor: int) -> None:
    """``[lo, hi]`` pixel bounds hold one merged patch (``factor`` x ``factor``) and are in order."""
    if hi < factor * factor:
        raise ConfigError(
            f"{where}: max_pixels should hold at least one merged patch ({factor}x{factor}={factor * factor} "
            f"pixels), but got max_pixels={hi}"
        )
    if lo > hi:
        raise ConfigError(f"{where}: min_pixels should be <= max_pixels={hi}, but got min_pixels={lo}")


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int, *, floor: int | None = None
) -> tuple[int, int]:
    """Both sides rounded to multiples of ``factor``, the area brought into ``[min_pixels, max_pixels]``.
    ``floor``: the least a side first rounds to (``factor``, the native ``max_pixels`` rule's; the
    video processors' 0: a side under ``factor / 2`` rounds to 0 and the area is then scaled up)."""
    floor = factor if floor is None else floor
    hb = max(floor, round(height / factor) * factor)
    wb = max(floor, round(width / factor) * factor)
    if hb * wb > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        hb = max(factor, math.floor(height / beta / factor) * factor)
        wb = max(factor, math.floor(width / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        hb = math.ceil(height * beta / factor) * factor
        wb = math.ceil(width * beta / factor) * factor
    return hb, wb


def check_aspect(height: int, width: int) -> None:
    """The video processors' ``smart_resize`` refuses a frame past ``MAX_ASPECT`` (one-line error)."""
    if max(height, width) > MAX_ASPECT * min(height, width):
        raise ConfigError(
            f"a video frame of {height}x{width} has an aspect ratio past {MAX_ASPECT}, which the video processor refuses"
        )


# NOTE [ Qwen video clips ]
# A clip reaches Qwen2-VL / Qwen2.5-VL / Qwen3-VL through the video processor (transformers'
# Qwen2VLVideoProcessor / Qwen3VLVideoProcessor), whose keys video_rule reads as its __init__
# does: a key the table holds replaces the class default even as null; Qwen2-VL's size (given
# whole, or the default) has its edges replaced by min_pixels / max_pixels, while Qwen3-VL reads
# size alone; both edges must be there. tests/test_video_tokens.py checks it all against them:
# - sampling (do_sample_frames; off for Qwen2-VL, on at fps=2 for Qwen3-VL): num_frames rounded
#   to the temporal patch, or frames / clip fps * fps clamped to [min_frames, max_frames]; a
#   Qwen3-VL clip whose fps is not known is taken at 24 fps, as its processor does;
# - resize: Qwen2-VL's smart_resize per frame in [min_pixels, max_pixels] (its video defaults,
#   128..768 merged patches per frame); Qwen3-VL's bounds hold for the whole clip (frames
#   rounded to the temporal patch times the frame area); cap_pixels_per_frame shares a budget;
#   a side under half a merged patch rounds to 0 and the frame is scaled up (Qwen3-VL scales a
#   side under one merged patch up first), and a frame past MAX_ASPECT is refused, as they do;
# - time: the frames are padded to a multiple of temporal_patch_size by repeating the last one,
#   and each pair merges: video_grid_thw = (ceil(frames / 2), rows, cols).
# The tower attends within one temporal slice (its cu_seqlens repeat rows x cols per slice), so a
# clip is ceil(frames / 2) tower passes of rows x cols patches, and rows x cols / 4 LLM tokens
# per slice. Qwen3-VL's processor also writes a timestamp ("<0.5 seconds>") before each slice:
# text tokens, which depend on the tokenizer and are left to the sample's text count.


class Qwen2VL(Family):
    name = "qwen2_vl"
    unpacked_reason = "its patch stream and 3-D rope positions are PackedModalityCollate's (rope_config=)"
    model_types: ClassVar[tuple[str, ...]] = ("qwen2_vl", "qwen2_5_vl")
    hf_classes = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}
    vision_attr = "visual"
    text_type = "qwen2_vl"
    vision_types = _TOWERS
    absent_vision = {"qwen2_vl": {"model_type": "qwen2_vl_vision"}, "qwen2_5_vl": {"model_type": "qwen2_5_vl_vision"}}
    flat_text = True
    video_processor = "Qwen2VLVideoProcessor"
    # Qwen2VLVideoProcessor.sample_frames compares a None num_frames when neither fps nor
    # num_frames is set (a TypeError); Qwen3-VL's then keeps min(max(frames, min_frames), max_frames)
    sampling_needs_a_rate: ClassVar[bool] = True
    # (min_pixels, max_pixels) when preprocessor_config.json sets neither
    default_pixels: ClassVar[tuple[int, int]] = QWEN2_VL_PIXELS

    def pixels(self, cfg: HFConfig) -> tuple[int, int]:
        """(min_pixels, max_pixels): the preprocessor's, or ``size``'s, or ``default_pixels``."""
        pre, size = cfg.preprocessor, cfg.preprocessor.get("size")
        size = size if isinstance(size, dict) else {}
        lo = pre.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", self.default_pixels[0])))
        hi = pre.get("max_pixels", size.get("longest_edge", size.get("max_pixels", self.default_pixels[1])))
        out: list[int] = []
        for key, value in (("min_pixels", lo), ("max_pixels", hi)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"preprocessor_config.json next to {cfg.path!r}: {key} should be a positive integer, "
                    f"but got {value!r}"
                )
            out.append(value)
        return out[0], out[1]

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        lo, hi = self.pixels(cfg)
        patch, merge = self.vision_int(cfg, "patch_size"), self.vision_int(cfg, "spatial_merge_size")
        check_pixel_bounds(f"preprocessor_config.json next to {cfg.path!r}", lo, hi, patch * merge)
        return {"patch": patch, "merge": merge, "min_pixels": lo, "max_pixels": hi}

    def grid(self, rule: Mapping[str, Any], height: int, width: int) -> tuple[int, int]:
        """The pre-merge patch grid ``(rows, cols)`` after the resize (``image_grid_thw`` without its 1)."""
        patch, merge = int(rule["patch"]), int(rule["merge"])
        factor = patch * merge
        if min(height, width) < factor:
            raise ConfigError(f"an image of {height}x{width} is smaller than one merged patch ({factor} px)")
        hb, wb = smart_resize(height, width, factor, int(rule["min_pixels"]), int(rule["max_pixels"]))
        return hb // patch, wb // patch

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        gh, gw = self.grid(rule, height, width)
        merge = int(rule["merge"])
        return VisionInputs(1, gh * gw, gh * gw // (merge * merge))

    # -- video (NOTE [ Qwen video clips ]) ----------------------------------------------------------

    def video_defaults(self) -> Mapping[str, Any]:
        return QWEN2_VL_VIDEO

    def video_pixels(self, keys: VideoKeys) -> tuple[int, int]:
        """(min_pixels, max_pixels) per frame: ``size``'s shortest and longest edge (its class
        default when absent or null; a given ``size`` replaces it whole), each replaced by a
        non-null ``min_pixels`` / ``max_pixels`` (Qwen2VLVideoProcessor.__init__)."""
        size = keys.defaults["size"] if keys.raw("size") is None else keys.table_of("size")
        size = dict(size)
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if keys.table.get(key) is not None:
                size[edge] = keys.count(key)
        return self.edges(keys, size)

    def edges(self, keys: VideoKeys, size: Mapping[str, Any]) -> tuple[int, int]:
        lo, hi = size.get("shortest_edge"), size.get("longest_edge")
        if not (isinstance(lo, int) and isinstance(hi, int)) or isinstance(lo, bool) or isinstance(hi, bool):
            raise ConfigError(
                f"{keys.where}: size should hold shortest_edge and longest_edge (pixel bounds), but got {dict(size)!r}"
            )
        return keys.count("size.shortest_edge", lo), keys.count("size.longest_edge", hi)

    def video_rule(self, cfg: HFConfig) -> dict[str, Any]:
        keys = cfg.video_reader(self.video_defaults())
        lo, hi = self.video_pixels(keys)
        patch, merge = keys.count("patch_size"), keys.count("merge_size")
        rule: dict[str, Any] = {
            "patch": patch, "merge": merge, "temporal": keys.count("temporal_patch_size"),
            "min_pixels": lo, "max_pixels": hi, "sample": keys.flag("do_sample_frames"), "fps": keys.rate("fps"),
            "num_frames": keys.optional_count("num_frames"), "min_frames": keys.count("min_frames"),
            "max_frames": keys.count("max_frames"), "cap": keys.flag("cap_pixels_per_frame"),
            "max_video_tokens": keys.count("max_video_tokens"),
        }  # fmt: skip
        if rule["sample"] and rule["fps"] is not None and rule["num_frames"] is not None:
            raise ConfigError(f"{keys.where}: fps and num_frames are mutually exclusive, but both are set")
        if rule["sample"] and rule["fps"] is None and rule["num_frames"] is None and self.sampling_needs_a_rate:
            raise ConfigError(
                f"{keys.where}: do_sample_frames needs fps or num_frames (the video processor fails without "
                "either), but got neither"
            )
        check_pixel_bounds(keys.where, lo, hi, patch * merge)
        return rule

    def sampled_frames(self, rule: Mapping[str, Any], frames: int, fps: float | None) -> int:
        """How many of a clip's ``frames`` frames the video processor keeps (``sample_frames``)."""
        if not rule["sample"]:
            return frames
        t = int(rule["temporal"])
        if rule["num_frames"] is not None:
            n: float = round(int(rule["num_frames"]) / t) * t
        elif rule["fps"] is not None:
            if fps is None:
                raise ConfigError(
                    "this video processor samples frames at a target fps, which needs each clip's own fps "
                    "(an fps column / --sample fps), but got none"
                )
            top = math.floor(min(int(rule["max_frames"]), frames) / t) * t
            n = min(max(frames / fps * float(rule["fps"]), int(rule["min_frames"])), top, frames)
            n = math.floor(n / t) * t
        else:  # video_rule refuses sampling without either
            raise AssertionError("do_sample_frames without fps or num_frames")
        if n > frames or n < 1:
            raise ConfigError(
                f"a clip of {frames} frames cannot be sampled to {int(n)} frames (the video processor's rule)"
            )
        return math.ceil(frames / (frames / n))  # len(torch.arange(0, frames, frames / n))

    def clip_grid(self, rule: Mapping[str, Any], frames: int, height: int, width: int) -> tuple[int, int, int]:
        """``video_grid_thw`` of a clip of ``frames`` (sampled) frames: temporal groups and the
        pre-merge patch rows and columns."""
        patch, merge, t = int(rule["patch"]), int(rule["merge"]), int(rule["temporal"])
        factor = patch * merge
        check_aspect(height, width)
        hi = int(rule["max_pixels"])
        if rule["cap"]:
            total = int(int(rule["max_video_tokens"]) * factor * factor * 0.9)
            hi = max(min(hi, total * t // frames), int(int(rule["min_pixels"]) * 1.05))
        hb, wb = smart_resize(height, width, factor, int(rule["min_pixels"]), hi, floor=0)
        return -(-frames // t), hb // patch, wb // patch

    def clip_rule_inputs(
        self, rule: Mapping[str, Any], frames: int, height: int, width: int, fps: float | None = None
    ) -> VisionInputs:
        gt, gh, gw = self.clip_grid(rule, self.sampled_frames(rule, frames, fps), height, width)
        return VisionInputs(gt, gh * gw, gt * gh * gw // int(rule["merge"]) ** 2)

    def pass_grid(
        self, cfg: HFConfig, height: int, width: int, frames: int | None = None, fps: float | None = None
    ) -> tuple[int, int] | None:
        if frames is None:
            return self.grid(self.image_rule(cfg), height, width)
        rule = self.video_rule(cfg)
        _, rows, cols = self.clip_grid(rule, self.sampled_frames(rule, frames, fps), height, width)
        return rows, cols

    def spec_fields(self, cfg: HFConfig) -> dict[str, Any] | None:
        rule = self.image_rule(cfg)
        return {
            "patch": rule["patch"], "merge": rule["merge"], "tubelet": 1,  # NOTE [ Frames are images ]
            "resize": "max_pixels", "min_pixels": rule["min_pixels"], "max_pixels": rule["max_pixels"],
        }  # fmt: skip

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        return 448, 448  # NOTE [ The worst sample of a length ]: VLA cameras run at 224-480 px

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        vt = str(table["model_type"])
        defaults = self.vision_types[vt]

        def num(key: str, alias: str | None = None) -> int:
            if alias is not None and key not in table and alias in table:
                key = alias
            return int(cfg.get(table, where, key, defaults.get(key)))

        width_key = "embed_dim" if vt == "qwen2_vl_vision" else "hidden_size"
        width, heads = num(width_key), num("num_heads")
        cfg.check_divides(where, "num_heads", heads, width_key, width)
        if vt == "qwen2_vl_vision":
            ratio = float(cfg.get(table, where, "mlp_ratio", defaults["mlp_ratio"], float))
            if not 0 < ratio <= MAX_MLP_RATIO:  # (nan fails too)
                raise ConfigError(
                    f"config.json {cfg.path!r}: key {where}.mlp_ratio should be a number in (0, {MAX_MLP_RATIO}], "
                    f"but got {ratio!r}"
                )
            common: dict[str, Any] = {"hidden": width, "ffn": max(1, int(width * ratio))}
        else:
            common = {"hidden": width, "ffn": num("intermediate_size"), "gated_mlp": True, "norm": "rmsnorm"}
            common.update(
                self.windows(cfg, num("depth"), num("window_size"), num("patch_size") * num("spatial_merge_size"))
            )
        return (
            VisionTower(
                name=vt, layers=num("depth"), heads=heads, patch=num("patch_size"),
                temporal_patch=num("temporal_patch_size"), merge=num("spatial_merge_size"),
                channels=num("in_channels", "in_chans"), learned_positions=False, patch_bias=False, post_norm=False,
                **common,
            ),
        )  # fmt: skip

    def windows(self, cfg: HFConfig, layers: int, window_px: int, merged_px: int) -> dict[str, Any]:
        """Qwen2.5-VL's attention windows (NOTE [ Windowed tower attention ]): the window side in
        merged units (``window_size // spatial_merge_size // patch_size``) and the blocks that
        attend over the whole pass (``fullatt_block_indexes``)."""
        table, where = self.vision_section(cfg)
        if window_px < merged_px:  # transformers' window index divides by window_size // merge // patch
            raise ConfigError(
                f"config.json {cfg.path!r}: key {where}.window_size should hold at least one merged patch "
                f"({merged_px} px), but got {window_px}"
            )
        raw = table.get("fullatt_block_indexes", _TOWERS["qwen2_5_vl_vision"]["fullatt_block_indexes"])
        if not isinstance(raw, list | tuple) or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < layers for k in raw
        ):
            raise ConfigError(
                f"config.json {cfg.path!r}: key {where}.fullatt_block_indexes should be a list of block indexes "
                f"in [0, {layers - 1}], but got {raw!r}"
            )
        return {"window": window_px // merged_px, "full_attention_blocks": tuple(sorted(set(raw)))}

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        table, where = self.vision_section(cfg)
        out_key = "hidden_size" if cfg.model_type == "qwen2_vl" else "out_hidden_size"
        out = int(cfg.get(table, where, out_key, self.vision_types[str(table["model_type"])][out_key]))
        folded = tower.hidden * tower.merge**2
        return Projector(kind="patch_merger", in_dim=folded, out_dim=out, hidden_dims=(folded,), merge=tower.merge,
                         norm=tower.norm, norm_dim=tower.hidden)  # fmt: skip

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        # transformers 5: Qwen2(.5)-VL's config copies a text_config tie up to the root flag
        return super().tied(cfg, text_tie) or text_tie

    def min_text_tokens(self, images: int) -> int:
        return 2 * images  # a vision start and end token per image, which the 3-D rope positions need

    def min_video_text_tokens(self, groups: int) -> int:
        """Text tokens one clip of ``groups`` temporal groups needs at least (NOTE [ Qwen video inputs ])."""
        return 2  # a vision start and end token around the clip

    def video_placeholder(self, tconfig: PretrainedConfig, groups: int, per_group: int) -> list[int]:
        """One clip's ids as the processor writes them: ``groups`` temporal groups of ``per_group``
        video tokens each, with their markers (NOTE [ Qwen video inputs ])."""
        video = int(tconfig.video_token_id)
        return [tconfig.vision_start_token_id] + [video] * (groups * per_group) + [tconfig.vision_end_token_id]

    def video_grid(self, cfg: HFConfig, shape: Shape) -> tuple[int, int, int]:
        """``video_grid_thw`` of each of ``shape``'s clips, the one :meth:`clip_inputs` counts; a
        video processor whose patches the tower cannot read is refused."""
        rule = self.video_rule(cfg)
        for key, name, tower_key in (("patch", "patch_size", "patch_size"), ("merge", "merge_size", "spatial_merge_size"),
                                     ("temporal", "temporal_patch_size", "temporal_patch_size")):  # fmt: skip
            theirs = self.vision_int(cfg, tower_key)
            if int(rule[key]) != theirs:
                raise ConfigError(
                    f"{cfg.video_keys[1]} next to {cfg.path!r}: {name}={rule[key]} does not match the vision tower's "
                    f"{theirs}: the model cannot read these clips"
                )
        return self.clip_grid(rule, self.sampled_frames(rule, shape.frames, shape.fps), shape.height, shape.width)

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        import torch  # optional: the measured mode only (NOTE [ Families defer torch ])

        if shape.text_tokens < self.min_text_tokens(shape.images):
            raise ConfigError(
                f"a {cfg.model_type} sample holds a vision start and end token per image: text_tokens should be at "
                f"least 2 x images = {2 * shape.images}, but got text_tokens={shape.text_tokens}"
            )
        rule = self.image_rule(cfg)
        merge, patch = int(rule["merge"]), int(rule["patch"])
        width = 3 * self.vision_int(cfg, "temporal_patch_size") * patch**2  # one row of pixels: a patch's values
        row: list[int] = []
        fake: dict[str, tuple[tuple[int, ...], Any]] = {}
        grids: dict[str, Any] = {}
        vision_tokens = 0
        if shape.images:
            gh, gw = self.grid(rule, shape.height, shape.width)
            per = gh * gw // merge**2
            for _ in range(shape.images):
                row += [tconfig.vision_start_token_id] + [image_token(tconfig)] * per + [tconfig.vision_end_token_id]
            vision_tokens += per * shape.images
            grids["image_grid_thw"] = torch.tensor([[1, gh, gw]] * (shape.images * shape.batch), dtype=torch.long)
            fake["pixel_values"] = ((shape.images * shape.batch * gh * gw, width), dtype)
        if shape.videos:  # NOTE [ Qwen video inputs ]
            gt, gh, gw = self.video_grid(cfg, shape)
            least = shape.videos * self.min_video_text_tokens(gt)
            if shape.text_tokens < least:
                raise ConfigError(
                    f"a {cfg.model_type} clip of {gt} temporal groups holds {least // shape.videos} marker tokens "
                    f"(NOTE [ Qwen video inputs ]): text_tokens should be at least {least // shape.videos} x "
                    f"videos = {least}, but got text_tokens={shape.text_tokens}"
                )
            per = gh * gw // merge**2
            for _ in range(shape.videos):
                row += self.video_placeholder(tconfig, gt, per)
            vision_tokens += gt * per * shape.videos
            clips = shape.videos * shape.batch
            grids["video_grid_thw"] = torch.tensor([[gt, gh, gw]] * clips, dtype=torch.long)
            fake["pixel_values_videos"] = ((clips * gt * gh * gw, width), dtype)
            if cfg.model_type == "qwen2_5_vl":  # seconds per temporal group, which its rope positions space
                seconds = self.vision_int(cfg, "temporal_patch_size") / self.sampled_fps(cfg, shape)
                grids["second_per_grid_ts"] = torch.tensor([seconds] * clips)
        ids = token_ids(shape, vision_tokens)
        ids[:, : len(row)] = torch.tensor(row)
        positions = rope_positions(
            self.hf_classes[cfg.model_type], tconfig, ids, image_token(tconfig), grids.get("image_grid_thw"),
            video_token=int(tconfig.video_token_id), video_grid=grids.get("video_grid_thw"),
            second_per_grid_ts=grids.get("second_per_grid_ts"),
        )  # fmt: skip
        return {"input_ids": ids, **grids, "position_ids": positions}, fake

    def sampled_fps(self, cfg: HFConfig, shape: Shape) -> float:
        """The frame rate of the frames the video processor keeps of ``shape``'s clips
        (transformers' ``VideoMetadata.sampled_fps``: 24 when the clip's own is not known)."""
        if shape.fps is None:
            return float(UNKNOWN_FPS)
        return shape.fps * self.sampled_frames(self.video_rule(cfg), shape.frames, shape.fps) / shape.frames


# NOTE [ Qwen video inputs ]
# What Qwen2VLProcessor / Qwen2_5_VLProcessor / Qwen3VLProcessor hand the model for a clip
# (NOTE [ Qwen video clips ] for its grid), as the measured mode builds it:
# - pixel_values_videos: one row per pre-merge patch of every temporal group of every clip,
#   [clips x t x rows x cols, 3 x temporal_patch_size x patch^2] (fake); video_grid_thw
#   (t, rows, cols) per clip (real: the tower reads it on the host);
# - input_ids: Qwen2-VL and Qwen2.5-VL write a clip as a vision start token, t x rows x cols / 4
#   video tokens and a vision end token. Qwen3-VL writes each temporal group apart: a timestamp
#   ("<0.5 seconds>", text whose token count is the tokenizer's: one plain text token stands for
#   it here, the rest of its length is the sample's text), a vision start token, rows x cols / 4
#   video tokens and a vision end token, so its get_rope_index can split the grid per group;
# - second_per_grid_ts (Qwen2.5-VL): temporal_patch_size / the sampled frames' fps per clip,
#   which spaces its temporal rope positions (values only: no byte depends on it);
# - position_ids: the model's own get_rope_index over those ids (text 0, image 1, video 2).
# The markers are text tokens: a sample's text_tokens should hold them (min_video_text_tokens).

UNKNOWN_FPS = 24  # transformers' VideoMetadata.sampled_fps of a clip whose fps is not known


def rope_positions(
    cls_name: str, config: object, ids: torch.Tensor, image_token: int, grid: torch.Tensor | None, *,
    video_token: int | None = None, video_grid: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Qwen2-VL's / Qwen2.5-VL's / Qwen3-VL's 3-D rope positions of ``ids`` (images marked by
    ``image_token``, of ``grid`` patches each; clips by ``video_token``, of ``video_grid``), from
    transformers' own ``get_rope_index`` on a model shell that holds only the config (no
    weights). ``second_per_grid_ts``: Qwen2.5-VL's seconds per temporal group of each clip."""
    import torch  # optional: the measured mode only (NOTE [ Families defer torch ])
    import transformers  # optional: the measured mode only

    mm = torch.eq(ids, image_token).int()  # mm_token_type_ids: text 0, image 1, video 2
    if video_token is not None:
        mm = mm + 2 * torch.eq(ids, video_token).int()
    model_cls = getattr(transformers, cls_name.replace("ForConditionalGeneration", "Model"))
    shell = model_cls.__new__(model_cls)  # get_rope_index reads only the config
    torch.nn.Module.__init__(shell)
    shell.config = config
    extra = {} if second_per_grid_ts is None else {"second_per_grid_ts": second_per_grid_ts}
    positions: torch.Tensor = shell.get_rope_index(
        ids, mm, image_grid_thw=grid, video_grid_thw=video_grid, attention_mask=None, **extra
    )[0]
    return positions


FAMILY = Qwen2VL()
