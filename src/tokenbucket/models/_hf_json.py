"""Reading a Hugging Face ``config.json`` / ``preprocessor_config.json`` as JSON (plumbing of :mod:`tokenbucket.tokens.hf`).

The defaults transformers applies when a key is missing are written out here (from its config
classes); transformers is never imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenbucket import _values as V
from tokenbucket._config import json_object
from tokenbucket._exceptions import ConfigError

__all__ = ["DECODER_TYPES", "SUPPORTED_MODEL_TYPES", "VISION_DEFAULTS", "HFConfig", "read_hf_config"]

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "gemma", "gemma2", "idefics3", "llama", "llava", "llava_next", "paligemma", "qwen2", "qwen2_5_vl",
    "qwen2_vl", "smolvlm",
)  # fmt: skip
DECODER_TYPES: tuple[str, ...] = ("gemma", "gemma2", "llama", "qwen2")

# Vision-tower defaults per vision model_type (transformers' config classes), and the defaults
# a composite config applies when its ``vision_config`` is absent altogether.
VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip_vision_model": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                          "num_attention_heads": 12, "image_size": 224, "patch_size": 32, "num_channels": 3},
    "siglip_vision_model": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                            "num_attention_heads": 12, "image_size": 224, "patch_size": 16, "num_channels": 3,
                            "vision_use_head": True},
    "idefics3_vision": {"hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12,
                        "num_attention_heads": 16, "image_size": 224, "patch_size": 32, "num_channels": 3},
    "qwen2_vl_vision": {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "mlp_ratio": 4, "num_heads": 16,
                        "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "qwen2_5_vl_vision": {"depth": 32, "hidden_size": 3584, "intermediate_size": 3420, "num_heads": 16,
                          "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "out_hidden_size": 3584},
}  # fmt: skip
VISION_DEFAULTS["smolvlm_vision"] = VISION_DEFAULTS["idefics3_vision"]
_CLIP_336 = {"model_type": "clip_vision_model", "intermediate_size": 4096, "hidden_size": 1024, "patch_size": 14,
             "image_size": 336, "num_hidden_layers": 24, "num_attention_heads": 16}  # fmt: skip
ABSENT_VISION: dict[str, dict[str, Any]] = {
    "llava": _CLIP_336,
    "llava_next": _CLIP_336,
    "paligemma": {"model_type": "siglip_vision_model", "intermediate_size": 4096, "hidden_size": 1152,
                  "patch_size": 14, "image_size": 224, "num_hidden_layers": 27, "num_attention_heads": 16,
                  "vision_use_head": False},
    "idefics3": {"model_type": "idefics3_vision"},
    "smolvlm": {"model_type": "smolvlm_vision"},
    "qwen2_vl": {"model_type": "qwen2_vl_vision"},
    "qwen2_5_vl": {"model_type": "qwen2_5_vl_vision"},
}  # fmt: skip
# the vision model_type a composite assumes for a ``vision_config`` that names none
VISION_TYPE = {k: str(v["model_type"]) for k, v in ABSENT_VISION.items()}
VISION_TYPE["paligemma"] = "siglip_vision_model"
LLAVA_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
LAYER_KEYS = ("num_hidden_layers", "depth")  # NOTE [ Layer counts are bounded ] in tokenbucket._values
IDEFICS3_MAX_IMAGE_SIZE = 4096  # the image processors' absolute cap on a resized side
QWEN2_VL_PIXELS = (56 * 56, 28 * 28 * 1280)  # Qwen2VLImageProcessor: (min_pixels, max_pixels)


@dataclass(frozen=True)
class HFConfig:
    """A parsed ``config.json`` (``path``) and its ``preprocessor_config.json`` (``{}`` when absent)."""

    path: str
    config: dict[str, Any]
    preprocessor: dict[str, Any] = field(default_factory=dict)

    @property
    def model_type(self) -> str:
        value = self.config.get("model_type")
        if not isinstance(value, str):
            raise ConfigError(f"config.json {self.path!r}: missing key 'model_type' (a string naming the architecture)")
        if value not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"config.json {self.path!r}: model_type {value!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        return value

    def section(self, name: str) -> tuple[dict[str, Any], str]:
        """``vision_config`` / ``text_config`` with its model_type filled in, and its key prefix."""
        mt = self.model_type
        raw = self.config.get(name)
        if raw is None:
            if name == "vision_config":
                return dict(ABSENT_VISION[mt]), name
            return {}, name
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json {self.path!r}: key {name!r} should be an object, but got {raw!r}")
        out = dict(raw)
        if name == "vision_config":
            out.setdefault("model_type", VISION_TYPE[mt])
            if out["model_type"] in (mt, mt + "_vision"):  # old checkpoints name the composite here
                out["model_type"] = VISION_TYPE[mt]
            if out["model_type"] not in VISION_DEFAULTS:
                raise ConfigError(
                    f"config.json {self.path!r}: vision_config.model_type {out['model_type']!r} is not supported; "
                    f"supported: {', '.join(sorted(VISION_DEFAULTS))}"
                )
        return out, name

    def get(self, table: Mapping[str, Any], where: str, key: str, default: object = None, kind: type = int) -> Any:
        """``table[key]`` checked to be a ``kind`` (``default`` when absent); errors name file and key."""
        if key in table and table[key] is not None:
            value = table[key]
        elif default is not None:
            value = default
        else:
            raise ConfigError(f"config.json {self.path!r}: missing key {_dotted(where, key)!r}")
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok or (kind is int and value < 1):
            raise ConfigError(
                f"config.json {self.path!r}: key {_dotted(where, key)!r} should be "
                f"{'a positive integer' if kind is int else kind.__name__}, but got {value!r}"
            )
        if kind is int and key in LAYER_KEYS and value > V.MAX_LAYERS:  # NOTE [ Layer counts are bounded ]
            raise ConfigError(
                f"config.json {self.path!r}: key {_dotted(where, key)!r} should be at most {V.MAX_LAYERS} layers "
                f"(the deepest published models have about 130), but got {value!r}"
            )
        return value

    def check_divides(self, where: str, part_key: str, part: int, whole_key: str, whole: int) -> None:
        """``part`` (``part_key``'s value, e.g. the attention heads) divides ``whole`` (e.g. the width)."""
        if whole % part:
            raise ConfigError(
                f"config.json {self.path!r}: key {_dotted(where, part_key)!r} should divide key "
                f"{_dotted(where, whole_key)!r}, but got {part_key}={part}, {whole_key}={whole} "
                f"({whole} / {part} = {whole / part:g})"
            )

    def pinpoints(self) -> list[list[int]]:
        """LLaVA-NeXT's any-resolution grids (``image_grid_pinpoints``): ``[h, w]`` pairs of pixels."""
        pins = self.config.get("image_grid_pinpoints") or LLAVA_PINPOINTS
        if not isinstance(pins, list) or not all(isinstance(p, list) and len(p) == 2 and all(_side(v) for v in p)
                                                 for p in pins):  # fmt: skip
            raise ConfigError(
                f"config.json {self.path!r}: key 'image_grid_pinpoints' should be a list of [h, w] pairs of "
                f"positive integers up to {V.MAX_SIDE}, but got {pins!r:.80}"
            )
        return pins

    def idefics3_sizes(self) -> tuple[int, int, bool]:
        """Idefics3 / SmolVLM: (longest edge after resize, tile side, split into tiles), from the
        preprocessor's ``size.longest_edge``, ``max_image_size.longest_edge`` and
        ``do_image_splitting`` (or the image processor's defaults: 1456, 364, true)."""
        sides = []
        for key, default in (("size", 4 * 364), ("max_image_size", 364)):
            table = self.preprocessor.get(key)
            value = table.get("longest_edge", default) if isinstance(table, dict) else default
            if not _side(value):
                raise ConfigError(
                    f"preprocessor_config.json next to {self.path!r}: key '{key}.longest_edge' should be a positive "
                    f"integer up to {V.MAX_SIDE}, but got {value!r}"
                )
            sides.append(int(value))
        return sides[0], sides[1], bool(self.preprocessor.get("do_image_splitting", True))

    def vision_int(self, key: str) -> int:
        """An integer of the vision tower, with its model_type's default."""
        table, where = self.section("vision_config")
        return int(self.get(table, where, key, VISION_DEFAULTS[str(table["model_type"])].get(key)))


def _side(value: object) -> bool:
    """An image side in pixels: a positive integer within NOTE [ Value bounds ]."""
    return type(value) is int and 1 <= value <= V.MAX_SIDE


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _read_json(path: Path, label: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{label} {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label} {str(path)!r} cannot be read: {exc}") from None
    return json_object(text, f"{label} {str(path)!r}")


def read_hf_config(path: str | Path | HFConfig) -> HFConfig:
    """Read ``config.json`` (a file, or a directory holding one) and a sibling ``preprocessor_config.json``."""
    if isinstance(path, HFConfig):
        return path
    p = Path(path)
    config_path = p / "config.json" if p.is_dir() else p
    config = _read_json(config_path, "config.json")
    pre_path = config_path.parent / "preprocessor_config.json"
    pre = _read_json(pre_path, "preprocessor_config.json") if pre_path.is_file() else {}
    return HFConfig(str(config_path), config, pre)
