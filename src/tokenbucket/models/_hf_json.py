"""Reading a Hugging Face ``config.json`` / ``preprocessor_config.json`` as JSON (plumbing of :mod:`tokenbucket.models`).

What every family reads alike: the files, the ``model_type``, a ``text_config`` table, checked
keys with one-line errors. The defaults transformers applies when a key is missing are each
family's (its module under ``tokenbucket/models/``); transformers is never imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenbucket import _values as V
from tokenbucket._config import read_json_file
from tokenbucket._exceptions import ConfigError
from tokenbucket.models._registry import MODULES

__all__ = ["HFConfig", "VideoKeys", "is_side", "read_hf_config"]

LAYER_KEYS = ("num_hidden_layers", "depth")  # NOTE [ Layer counts are bounded ] in tokenbucket._values


@dataclass(frozen=True)
class HFConfig:
    """A parsed ``config.json`` (``path``), its ``preprocessor_config.json`` (``{}`` when absent)
    and its ``video_preprocessor_config.json`` (``video``; ``None`` when absent: transformers'
    video processor then reads ``preprocessor_config.json``, :attr:`video_keys`)."""

    path: str
    config: dict[str, Any]
    preprocessor: dict[str, Any] = field(default_factory=dict)
    video: dict[str, Any] | None = None

    @property
    def video_keys(self) -> tuple[dict[str, Any], str]:
        """The table a family's video processor reads, and its file's name: the
        ``video_preprocessor_config.json`` when there is one, else ``preprocessor_config.json``
        (what ``AutoVideoProcessor.from_pretrained`` falls back to for older checkpoints)."""
        if self.video is not None:
            return self.video, "video_preprocessor_config.json"
        return self.preprocessor, "preprocessor_config.json"

    def with_video(self, changes: Mapping[str, Any]) -> HFConfig:
        """This config with its video processor's keys changed (``processor(videos=..., **changes)``:
        ``fps``, ``num_frames``, ``do_sample_frames``, ``min_pixels`` / ``max_pixels``, ...)."""
        table, _ = self.video_keys
        return HFConfig(self.path, self.config, self.preprocessor, {**table, **changes})

    def video_reader(self, defaults: Mapping[str, Any]) -> VideoKeys:
        """:attr:`video_keys` over a video processor class's ``defaults``, read with checks."""
        table, name = self.video_keys
        return VideoKeys(table, defaults, f"{name} next to {self.path!r}")

    @property
    def model_type(self) -> str:
        value = self.config.get("model_type")
        if not isinstance(value, str):
            raise ConfigError(f"config.json {self.path!r}: missing key 'model_type' (a string naming the architecture)")
        if value not in MODULES:
            raise ConfigError(
                f"config.json {self.path!r}: model_type {value!r} is not supported; "
                f"supported: {', '.join(sorted(MODULES))}"
            )
        return value

    def section(self, name: str) -> tuple[dict[str, Any], str]:
        """A sub-config table (``text_config``; ``{}`` when absent) and its key prefix; a family
        reads its ``vision_config`` with :meth:`~tokenbucket.models._base.Family.vision_section`."""
        raw = self.config.get(name)
        if raw is None:
            return {}, name
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json {self.path!r}: key {name!r} should be an object, but got {raw!r}")
        return dict(raw), name

    def sides(self, table_key: str, key: str, default: int) -> int:
        """``preprocessor_config.json``'s ``table_key.key`` (``default`` when absent): a side in pixels."""
        table = self.preprocessor.get(table_key)
        value = table.get(key, default) if isinstance(table, dict) else default
        if not is_side(value):
            raise ConfigError(
                f"preprocessor_config.json next to {self.path!r}: key '{table_key}.{key}' should be a positive "
                f"integer up to {V.MAX_SIDE}, but got {value!r}"
            )
        return int(value)

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


_RAW: Any = object()  # VideoKeys: "read the key's own value"


@dataclass(frozen=True)
class VideoKeys:
    """A video processor's keys (``table``) over its class's ``defaults``; errors name ``where``
    (the file). A key the table holds replaces the default even as null: transformers sets
    every init kwarg as an attribute, ``None`` included."""

    table: Mapping[str, Any]
    defaults: Mapping[str, Any]
    where: str

    def raw(self, key: str) -> Any:
        return self.table[key] if key in self.table else self.defaults.get(key)

    def count(self, key: str, value: object = _RAW) -> int:
        """A positive integer (``value``, else the key's)."""
        value = self.raw(key) if value is _RAW else value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.where}: {key} should be a positive integer, but got {value!r}")
        return value

    def optional_count(self, key: str) -> int | None:
        return None if self.raw(key) is None else self.count(key)

    def rate(self, key: str, value: object = _RAW) -> float | None:
        """``None`` or a positive finite number (a frame rate; ``value``, else the key's)."""
        value = self.raw(key) if value is _RAW else value
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf")
        ):
            raise ConfigError(f"{self.where}: {key} should be a positive number, but got {value!r}")
        return value

    def flag(self, key: str) -> bool:
        """``true`` / ``false`` (``null`` reads false, as the processor's ``if`` does)."""
        value = self.raw(key)
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{self.where}: {key} should be true or false, but got {value!r}")
        return bool(value)

    def table_of(self, key: str) -> dict[str, Any]:
        """A sub-table such as ``size`` (a JSON object)."""
        value = self.raw(key)
        if not isinstance(value, dict):
            raise ConfigError(f"{self.where}: {key} should be an object, but got {value!r}")
        return dict(value)


def is_side(value: object) -> bool:
    """An image side in pixels: a positive integer within NOTE [ Value bounds ]."""
    return type(value) is int and 1 <= value <= V.MAX_SIDE


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def read_hf_config(path: str | Path | HFConfig) -> HFConfig:
    """Read ``config.json`` (a file, or a directory holding one) and a sibling
    ``preprocessor_config.json`` and ``video_preprocessor_config.json``."""
    if isinstance(path, HFConfig):
        return path
    p = Path(path)
    config_path = p / "config.json" if p.is_dir() else p
    config = read_json_file(config_path, "config.json")
    pre_path = config_path.parent / "preprocessor_config.json"
    pre = read_json_file(pre_path, "preprocessor_config.json") if pre_path.is_file() else {}
    video_path = config_path.parent / "video_preprocessor_config.json"
    video = read_json_file(video_path, "video_preprocessor_config.json") if video_path.is_file() else None
    return HFConfig(str(config_path), config, pre, video)
