"""Token specs: how a model turns one sample's metadata into tokens.

A :class:`TokenSpec` is a frozen value object. It holds the vision tokenizer (the fields of
:class:`CameraSpec`), per-camera overrides by camera name, fixed camera slots, the rules for the
non-vision modalities (:class:`CountRule`), and the metadata column names (:class:`ColumnMap`).
Make variants with :func:`dataclasses.replace`.

Example:
    >>> spec = TokenSpec(patch=14)
    >>> spec.camera_spec("wrist").patch
    14
    >>> TokenSpec(patch=14, overrides={"wrist": {"tokens_per_frame": 64}}).camera_spec("wrist").tokens_per_frame
    64
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast

from tokenbucket import _values as V
from tokenbucket._config import load_toml_section
from tokenbucket._exceptions import ConfigError
from tokenbucket.models import clip_inputs, rule_inputs
from tokenbucket.models._registry import MODULES
from tokenbucket.models.qwen2_vl import smart_resize

__all__ = ["TOKEN_PRESETS", "CameraSpec", "ColumnMap", "CountRule", "TokenSpec"]

Resize = Literal["pad", "crop", "fixed", "max_pixels", "model"]
RESIZE_POLICIES: tuple[str, ...] = ("pad", "crop", "fixed", "max_pixels", "model")
Feed = Literal["images", "video"]
FEEDS: tuple[str, ...] = ("images", "video")


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """``value`` is an integer in ``[minimum, maximum]``; the maximum keeps every token count in
    int64 (NOTE [ Value bounds ]: a spec's sizes are bounded like the metadata's)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{name} should be {kind}, but got {name}={value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} should be at most {maximum}, but got {name}={value!r}")


@dataclass(frozen=True, kw_only=True)
class CameraSpec:
    """How one camera stream of ``frames`` frames at ``height x width`` becomes tokens.

    Per frame (spatial): the image is resized by ``resize``, cut into ``patch x patch`` patches,
    and an ``merge x merge`` merger folds patches together:

    - ``pad``: round H and W up to a multiple of ``patch`` → ``ceil(H/p) x ceil(W/p)`` patches.
    - ``crop``: round down → ``floor(H/p) x floor(W/p)``; an image with no whole (merged) patch
      is a metadata error, never zero tokens.
    - ``fixed``: every frame is resized to ``fixed_size`` (H, W) first, then as ``pad``.
    - ``max_pixels``: keep the aspect ratio, round H and W to multiples of ``patch * merge``,
      and rescale so that ``H'·W'`` lies in ``[min_pixels, max_pixels]`` (the Qwen2-VL rule).
    - ``model``: a model family's own per-image rule (``image_rule``, written by
      :func:`tokenbucket.tokens.hf.token_spec_from_hf`: LLaVA-NeXT's grids, Idefics3's tiles, ...);
      the count is the image's LLM tokens, ``patch`` and ``merge`` are not read.

    Patches are then merged: ``ceil(h/merge) x ceil(w/merge)`` (``floor`` under ``crop``).

    Over time: ``tubelet`` t merges t frames, ``ceil(frames/t)`` temporal tokens; with
    ``causal_first_frame`` frame 0 stays apart: ``1 + ceil((frames-1)/t)``.

    A resampler (``tokens_per_frame``) replaces all of that: ``frames x tokens_per_frame``.

    Per camera: ``temporal x (spatial + special_per_frame) + special_per_camera``.

    Args:
        patch: patch side in pixels.
        resize: ``pad``, ``crop``, ``fixed``, ``max_pixels`` or ``model``.
        fixed_size: ``(height, width)`` for ``resize="fixed"``.
        min_pixels: lower bound on ``H'·W'`` for ``resize="max_pixels"``.
        max_pixels: upper bound on ``H'·W'`` for ``resize="max_pixels"``.
        merge: side of the spatial token merger (1 = none).
        tubelet: frames merged into one temporal token.
        causal_first_frame: keep frame 0 apart (causal video tokenizers).
        tokens_per_frame: a resampler's fixed output per frame; overrides the spatial rule.
        special_per_frame: special tokens per temporal token (frame separators, ...).
        special_per_camera: special tokens per camera (begin/end of image, ...).
        image_rule: for ``resize="model"``, the family and its rule's parameters as JSON
            (:func:`tokenbucket.models.rule_inputs` reads it).
        feed: how a camera of two or more frames reaches the model: ``"images"`` (every frame
            one image, the fields above) or ``"video"`` (one clip through the family's video
            processor, ``video_rule``: its tower passes as ``temporal``, its LLM tokens per pass
            as ``spatial``, and what the clip adds once, LLaVA-OneVision's newline, in its
            tokens). A one-frame camera is an image either way (NOTE [ Frames are images ]).
        video_rule: the family's video rule as JSON (:func:`tokenbucket.models.clip_inputs`
            reads it); needed by ``feed="video"``.
    """

    patch: int = 14
    resize: Resize = "pad"
    fixed_size: tuple[int, int] | None = None
    min_pixels: int = 0
    max_pixels: int | None = None
    merge: int = 1
    tubelet: int = 1
    causal_first_frame: bool = False
    tokens_per_frame: int | None = None
    special_per_frame: int = 0
    special_per_camera: int = 0
    image_rule: str | None = None
    feed: Feed = "images"
    video_rule: str | None = None

    def __post_init__(self) -> None:
        _check_int("patch", self.patch, 1, V.MAX_SIDE)
        if self.feed not in FEEDS:
            raise ConfigError(f"feed should be one of {list(FEEDS)}, but got feed={self.feed!r}")
        if self.video_rule is not None:
            _check_rule(self.video_rule, "video_rule")
        if self.feed == "video" and self.video_rule is None:
            raise ConfigError('feed="video" needs video_rule (a family\'s video rule as JSON), but got video_rule=None')
        _check_int("merge", self.merge, 1, V.MAX_SIDE)
        _check_int("tubelet", self.tubelet, 1, V.MAX_FRAMES)
        _check_int("special_per_frame", self.special_per_frame, 0, V.MAX_TOKENS)
        _check_int("special_per_camera", self.special_per_camera, 0, V.MAX_TOKENS)
        _check_int("min_pixels", self.min_pixels, 0, V.MAX_SIDE**2)
        if self.resize not in RESIZE_POLICIES:
            raise ConfigError(f"resize should be one of {list(RESIZE_POLICIES)}, but got resize={self.resize!r}")
        if not isinstance(self.causal_first_frame, bool):
            raise ConfigError(
                f"causal_first_frame should be a bool, but got causal_first_frame={self.causal_first_frame!r}"
            )
        if self.tokens_per_frame is not None:
            _check_int("tokens_per_frame", self.tokens_per_frame, 1, V.MAX_TOKENS)
        if self.fixed_size is not None:
            if isinstance(self.fixed_size, str | bytes) or not isinstance(self.fixed_size, Iterable):
                raise ConfigError(f"fixed_size should be (height, width), but got fixed_size={self.fixed_size!r}")
            size = tuple(self.fixed_size)
            if len(size) != 2:
                raise ConfigError(f"fixed_size should be (height, width), but got fixed_size={self.fixed_size!r}")
            _check_int("fixed_size height", size[0], 1, V.MAX_SIDE)
            _check_int("fixed_size width", size[1], 1, V.MAX_SIDE)
            object.__setattr__(self, "fixed_size", (int(size[0]), int(size[1])))
        if self.resize == "model":
            _check_rule(self.image_rule)
        elif self.image_rule is not None:
            raise ConfigError(f'image_rule is read only with resize="model", but got resize={self.resize!r}')
        if self.resize == "fixed" and self.fixed_size is None:
            raise ConfigError('resize="fixed" needs fixed_size=(height, width), but got fixed_size=None')
        if self.max_pixels is not None:
            _check_int("max_pixels", self.max_pixels, 1, V.MAX_SIDE**2)
        if self.resize == "max_pixels":
            if self.max_pixels is None:
                raise ConfigError('resize="max_pixels" needs max_pixels, but got max_pixels=None')
            factor = self.patch * self.merge
            if self.max_pixels < factor * factor:
                raise ConfigError(
                    f"max_pixels should hold at least one merged patch ({factor}x{factor}="
                    f"{factor * factor} pixels), but got max_pixels={self.max_pixels}"
                )
            if self.min_pixels > self.max_pixels:
                raise ConfigError(
                    f"min_pixels should be <= max_pixels={self.max_pixels}, but got min_pixels={self.min_pixels}"
                )


CAMERA_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CameraSpec))

_RULE_RE = re.compile(r"^\s*(?P<base>[A-Za-z_][\w.\-]*|\d+)\s*(?:\*\s*(?P<mul>\d+)\s*)?(?P<opt>\?)?\s*$")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_rule(rule: object, name: str = "image_rule") -> None:
    """A ``resize="model"`` rule or a ``video_rule``: JSON naming a known family (its parameters are the family's)."""
    if not isinstance(rule, str):
        raise ConfigError(f"{name} should be a family's rule as JSON, but got {name}={rule!r}")
    try:
        params = json.loads(rule)
    except ValueError:
        params = None
    if not isinstance(params, dict) or params.get("family") not in set(MODULES.values()):
        raise ConfigError(f"{name} should be JSON naming a model family, but got {name}={rule!r:.120}")


def _smart_resize(cs: CameraSpec, h: int, w: int) -> tuple[int, int]:
    """The ``max_pixels`` resize (Qwen2-VL's ``smart_resize``): both sides multiples of patch x merge."""
    if cs.max_pixels is None:  # CameraSpec.__post_init__ guarantees it with resize="max_pixels"
        raise AssertionError("cs.max_pixels is unset")
    return smart_resize(h, w, cs.patch * cs.merge, cs.min_pixels, cs.max_pixels)


def _spatial_py(cs: CameraSpec, h: int, w: int, images: int) -> tuple[int, str | None]:
    """Spatial tokens per frame; or ``(0, "height"|"width")`` when too small under crop.
    ``images``: the images of the camera's sample (NOTE [ Images of a sample ])."""
    p, m = cs.patch, cs.merge
    if cs.resize == "crop":
        gh, gw = (h // p) // m, (w // p) // m
        if gh == 0:
            return 0, "height"
        if gw == 0:
            return 0, "width"
        return gh * gw, None
    if cs.resize == "model":
        return rule_inputs(str(cs.image_rule), h, w, images).llm_tokens, None
    if cs.resize == "max_pixels":
        factor = p * m
        hb, wb = _smart_resize(cs, h, w)
        return (hb // factor) * (wb // factor), None
    if cs.resize == "fixed":
        if cs.fixed_size is None:  # CameraSpec.__post_init__ guarantees it
            raise AssertionError("cs.fixed_size is unset")
        h, w = cs.fixed_size
    return _ceil_div(_ceil_div(h, p), m) * _ceil_div(_ceil_div(w, p), m), None


def _temporal_py(cs: CameraSpec, frames: int) -> int:
    if cs.tokens_per_frame is not None:
        return frames
    if cs.causal_first_frame:
        return 1 + _ceil_div(frames - 1, cs.tubelet)
    return _ceil_div(frames, cs.tubelet)


def _fed_images(cs: CameraSpec, frames: int) -> int:
    """The images a camera of ``frames`` frames feeds the model: none for a clip (``feed="video"``,
    two frames or more), else one a frame (NOTE [ Images of a sample ])."""
    return 0 if cs.feed == "video" and frames > 1 else frames


def _camera_py(cs: CameraSpec, frames: int, h: int, w: int, images: int) -> tuple[int, int, int, str | None]:
    """One camera's ``(temporal, spatial, tokens, too_small)``; ``too_small`` names the side
    ("height"/"width") a crop leaves no patch of, and the counts are then 0. A clip
    (``feed="video"``, two frames or more) has ``temporal`` groups of ``spatial`` tokens, plus
    what the clip adds once (LLaVA-OneVision's newline): its tokens are the clip's ``llm_tokens``.
    ``images``: how many images the camera's sample feeds the model (NOTE [ Images of a sample ])."""
    if _fed_images(cs, frames) == 0:
        clip = clip_inputs(str(cs.video_rule), frames, h, w)
        temporal, spatial = clip.tower_images, clip.llm_tokens // clip.tower_images
        return temporal, spatial, clip.llm_tokens + temporal * cs.special_per_frame + cs.special_per_camera, None
    if cs.tokens_per_frame is not None:
        spatial, small = cs.tokens_per_frame, None
    else:
        spatial, small = _spatial_py(cs, h, w, images)
        if small is not None:
            return 0, 0, 0, small
    temporal = _temporal_py(cs, frames)
    return temporal, spatial, temporal * (spatial + cs.special_per_frame) + cs.special_per_camera, None


@dataclass(frozen=True, kw_only=True)
class CountRule:
    """How many tokens a non-vision modality (text, proprio, action, memory, extras) adds.

    ``tokens = (row[column] if column else count) * tokens_per_unit``.

    - a column: ``CountRule(column="text_tokens")``;
    - a fixed count: ``CountRule(count=48)``;
    - a rule, e.g. action = horizon x tokens per step: ``CountRule(count=50, tokens_per_unit=1)``
      or proprio = frames x tokens per step: ``CountRule(column="frames", tokens_per_unit=2)``.

    With ``optional=True`` an absent column counts 0 tokens (a present null is still an error).
    In the per-camera schema, ``column="frames"`` means the sample's longest camera stream.

    ``CountRule.parse`` reads the compact form used by the CLI and TOML: ``48``, ``text_tokens``,
    ``50*2``, ``frames*2``, and a trailing ``?`` for optional (``text_tokens?``).

    Example:
        >>> CountRule.parse("frames*2")
        CountRule(column='frames', count=0, tokens_per_unit=2, optional=False)
    """

    column: str | None = None
    count: int = 0
    tokens_per_unit: int = 1
    optional: bool = False

    def __post_init__(self) -> None:
        if self.column is not None and (not isinstance(self.column, str) or not self.column):
            raise ConfigError(f"column should be a non-empty string, but got column={self.column!r}")
        _check_int("count", self.count, 0)
        _check_int("tokens_per_unit", self.tokens_per_unit, 0)
        for name in ("count", "tokens_per_unit"):  # NOTE [ Value bounds ]: a rule's product fits int64
            if getattr(self, name) > V.MAX_TOKENS:
                raise ConfigError(
                    f"{name} should be at most {V.MAX_TOKENS} (2**31), but got {name}={getattr(self, name)}"
                )

    @classmethod
    def parse(cls, value: str | int | Mapping[str, Any] | CountRule) -> CountRule:
        """Build a rule from an int, a compact string, or a mapping of the fields."""
        if isinstance(value, CountRule):
            return value
        if isinstance(value, bool):
            raise ConfigError(f"a token rule should be an int, a string or a table, but got {value!r}")
        if isinstance(value, int):
            return cls(count=value)
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            data = dict(value)
            # TOML spells the two common rules in their own words.
            for alias in ("horizon", "steps"):
                if alias in data:
                    data["count"] = data.pop(alias)
            if "tokens_per_step" in data:
                data["tokens_per_unit"] = data.pop("tokens_per_step")
            unknown = sorted(set(data) - known)
            if unknown:
                raise ConfigError(f"unknown token rule keys {unknown}; expected some of {sorted(known)}")
            return cls(**data)
        if isinstance(value, str):
            match = _RULE_RE.match(value)
            if match is None:
                raise ConfigError(
                    f"a token rule should look like 48, text_tokens, 50*2, frames*2 or text_tokens?, but got {value!r}"
                )
            base, mul, opt = match["base"], match["mul"], match["opt"]
            per_unit = int(mul) if mul is not None else 1
            if base.isdigit():
                return cls(count=int(base), tokens_per_unit=per_unit)
            return cls(column=base, tokens_per_unit=per_unit, optional=opt is not None)
        raise ConfigError(f"a token rule should be an int, a string or a table, but got {value!r}")

    def describe(self) -> str:
        """The compact form :meth:`parse` reads back."""
        base = self.column if self.column is not None else str(self.count)
        mul = f"*{self.tokens_per_unit}" if self.tokens_per_unit != 1 else ""
        return f"{base}{mul}{'?' if self.optional else ''}"


@dataclass(frozen=True, kw_only=True)
class ColumnMap:
    """Names of the metadata columns (and of the per-camera struct fields).

    ``cameras`` holds either a camera count (flat schema: every camera has the row's
    ``frames``, ``height``, ``width``) or a list of structs ``{name, frames, height, width}``
    (per-camera schema). ``key=None`` uses the row index as the key.
    """

    key: str | None = "key"
    cameras: str = "cameras"
    frames: str = "frames"
    height: str = "height"
    width: str = "width"
    name: str = "name"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "key" and value is None:
                continue
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{f.name} should be a non-empty column name, but got {f.name}={value!r}")


def _default_rule(column: str) -> CountRule:
    return CountRule(column=column, optional=True)


@dataclass(frozen=True, kw_only=True)
class TokenSpec(CameraSpec):
    """The full token accounting of one sample.

    ``L_total = L_vision + text + proprio + action + memory + sum(extras)``, where
    ``L_vision`` sums every camera (and every empty camera slot) as described in
    :class:`CameraSpec`.

    Args:
        overrides: per-camera changes to the vision fields, by camera name, e.g.
            ``{"wrist": {"patch": 16}}``. In the flat schema camera ``j`` is named
            ``camera_names[j]`` (else ``camera{j}``); in the per-camera schema it is the
            struct's ``name`` field.
        camera_names: names of the flat schema's camera positions.
        camera_slots: the model always reserves this many camera slots; an empty slot costs
            the same as the sample's first camera would in that slot. A sample with more
            cameras than slots is a metadata error.
        text, proprio, action, memory: :class:`CountRule` (or what ``CountRule.parse`` reads).
            Default: the optional columns ``text_tokens``, ``proprio_tokens``,
            ``action_tokens``, ``memory_tokens``.
        extras: further named modalities, name -> rule.
        columns: the metadata column names.

    Example (pi0: 3 fixed 224x224 camera slots, 48 text, 1 state and 50 action tokens):
        >>> pi0 = TokenSpec(patch=14, resize="fixed", fixed_size=(224, 224), camera_slots=3,
        ...                 text=48, proprio=1, action=50)
        >>> from tokenbucket.tokens.breakdown import breakdown_sample
        >>> breakdown_sample({"cameras": 2, "frames": 1, "height": 480, "width": 640}, pi0).total
        867
    """

    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    camera_names: tuple[str, ...] = ()
    camera_slots: int | None = None
    text: CountRule = field(default_factory=lambda: _default_rule("text_tokens"))
    proprio: CountRule = field(default_factory=lambda: _default_rule("proprio_tokens"))
    action: CountRule = field(default_factory=lambda: _default_rule("action_tokens"))
    memory: CountRule = field(default_factory=lambda: _default_rule("memory_tokens"))
    extras: Mapping[str, CountRule] = field(default_factory=dict)
    columns: ColumnMap = field(default_factory=ColumnMap)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("text", "proprio", "action", "memory"):
            object.__setattr__(self, name, CountRule.parse(getattr(self, name)))
        extras = {}
        for name, rule in dict(self.extras).items():
            if name in MODALITIES or name in ("vision", "total", "key", "index"):
                raise ConfigError(f"extras should not reuse a built-in name, but got extras[{name!r}]")
            extras[str(name)] = CountRule.parse(rule)
        object.__setattr__(self, "extras", extras)
        if isinstance(self.camera_names, str):
            raise ConfigError(f"camera_names should be a list of names, but got {self.camera_names!r}")
        object.__setattr__(self, "camera_names", tuple(str(n) for n in self.camera_names))
        if self.camera_slots is not None:
            _check_int("camera_slots", self.camera_slots, 1, V.MAX_CAMERAS)
        if isinstance(self.columns, Mapping):
            object.__setattr__(self, "columns", ColumnMap(**self.columns))
        overrides: dict[str, dict[str, Any]] = {}
        for cam, change in dict(self.overrides).items():
            if not isinstance(change, Mapping):
                raise ConfigError(f"overrides[{cam!r}] should be a table of fields, but got {change!r}")
            unknown = sorted(set(change) - set(CAMERA_FIELDS))
            if unknown:
                raise ConfigError(
                    f"overrides[{cam!r}] has unknown fields {unknown}; expected some of {list(CAMERA_FIELDS)}"
                )
            overrides[str(cam)] = dict(change)
        object.__setattr__(self, "overrides", overrides)
        # Resolve once: an invalid override fails here, not on row 10,000,000.
        base = self.base_camera()
        resolved = {}
        for cam, change in overrides.items():
            try:
                resolved[cam] = dataclasses.replace(base, **change)
            except ConfigError as exc:
                raise ConfigError(f"overrides[{cam!r}]: {exc}") from None
        object.__setattr__(self, "_resolved", resolved)
        object.__setattr__(self, "_base", base)
        rules = {name: cast(CountRule, getattr(self, name)) for name in MODALITIES}
        rules.update(extras)
        object.__setattr__(self, "_rules", rules)

    def __hash__(self) -> int:
        return hash(repr(self.to_dict()))

    def base_camera(self) -> CameraSpec:
        """The vision fields without any override."""
        base: CameraSpec | None = self.__dict__.get("_base")
        if base is None:  # during __post_init__, before it is cached
            base = CameraSpec(**{name: getattr(self, name) for name in CAMERA_FIELDS})
        return base

    def camera_spec(self, name: str | None) -> CameraSpec:
        """The vision fields for the camera called ``name`` (overrides applied)."""
        resolved: dict[str, CameraSpec] = self.__dict__["_resolved"]
        if name is not None and name in resolved:
            return resolved[name]
        return self.base_camera()

    def slot_name(self, position: int) -> str:
        """The flat schema's name for camera position ``position``."""
        if position < len(self.camera_names):
            return self.camera_names[position]
        return f"camera{position}"

    def empty_slot_names(self, used: Collection[str], first: int, count: int) -> list[str]:
        """Names of a sample's ``count`` empty camera slots (positions ``first``, ``first + 1``, ...):
        the ``camera_names`` its cameras (``used``) do not have, in order, then the positions' names.
        A sample that lists only ``wrist`` lacks the ``top`` slot, whatever position it holds, so
        an override for ``top`` prices that empty slot."""
        free = [name for name in self.camera_names if name not in used]
        return [free[e] if e < len(free) else self.slot_name(first + e) for e in range(count)]

    def rules(self) -> dict[str, CountRule]:
        """Every non-vision modality's rule, built-ins first, then extras in order."""
        return dict(self.__dict__["_rules"])

    def absent_as_zero(self) -> dict[str, int]:
        """Columns a sample may leave out, counting 0 tokens (every rule reading them is optional),
        as ``{column: 0}``: what a row of dicts fills in where one sample lacks a key that others
        have, so it counts as if the column were absent, not as a (refused) null."""
        rules = self.rules().values()
        optional = {r.column for r in rules if r.column is not None and r.optional}
        required = {r.column for r in rules if r.column is not None and not r.optional}
        return {c: 0 for c in sorted(optional - required - {self.columns.frames})}

    # -- serialisation -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (TOML / JSON friendly) that :meth:`from_dict` reads back."""
        out: dict[str, Any] = {}
        for name in CAMERA_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        if self.overrides:
            out["overrides"] = {k: dict(v) for k, v in self.overrides.items()}
        if self.camera_names:
            out["camera_names"] = list(self.camera_names)
        if self.camera_slots is not None:
            out["camera_slots"] = self.camera_slots
        for name, rule in self.rules().items():
            target = out.setdefault("extras", {}) if name in self.extras else out
            target[name] = dataclasses.asdict(rule)
        out["columns"] = dataclasses.asdict(self.columns)
        if out["columns"]["key"] is None:
            out["columns"]["key"] = ""
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenSpec:
        """Build a spec from a mapping such as a TOML ``[tokens]`` table."""
        known = {f.name for f in fields(cls) if f.init} | {"preset"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown [tokens] keys {unknown}; expected some of {sorted(known)}")
        kwargs = dict(data)
        preset = kwargs.pop("preset", None)
        if "fixed_size" in kwargs and kwargs["fixed_size"] is not None:
            kwargs["fixed_size"] = tuple(kwargs["fixed_size"])
        if "camera_names" in kwargs:
            kwargs["camera_names"] = tuple(kwargs["camera_names"])
        if "columns" in kwargs:
            columns = dict(kwargs["columns"])
            if columns.get("key") == "":
                columns["key"] = None
            try:
                kwargs["columns"] = ColumnMap(**columns)
            except TypeError as exc:
                raise ConfigError(f"invalid [tokens.columns]: {exc}") from None
        if preset is not None:  # ``preset = "pi0"``: the preset, changed by the other keys
            return dataclasses.replace(cls.preset(str(preset)), **kwargs)
        return cls(**kwargs)

    @classmethod
    def preset(cls, name: str) -> TokenSpec:
        """A well-known model's tokenisation by name (see ``TOKEN_PRESETS`` and NOTE [ Token presets ]).

        Example:
            >>> from tokenbucket import breakdown_sample
            >>> breakdown_sample({"cameras": 1, "frames": 1, "height": 480, "width": 640},
            ...                  TokenSpec.preset("pi0")).total
            867
        """
        if name not in TOKEN_PRESETS:
            raise ConfigError(f"unknown token preset {name!r}; known presets: {sorted(TOKEN_PRESETS)}")
        return TOKEN_PRESETS[name]

    @classmethod
    def from_toml(cls, path: str | Path, section: str = "tokens") -> TokenSpec:
        """Read the ``[tokens]`` section of a ``tokenbucket.toml`` file.

        Example file::

            [tokens]
            patch = 14
            resize = "pad"
            camera_names = ["top", "wrist"]
            text = "text_tokens"
            action = { horizon = 50, tokens_per_step = 1 }

            [tokens.overrides.wrist]
            tokens_per_frame = 64
        """
        return cls.from_dict(load_toml_section(path, section))


MODALITIES: tuple[str, ...] = ("text", "proprio", "action", "memory")
# the per-sample counts a batch reports its tokens by (extras are in the total only)
MODALITY_COLUMNS: tuple[str, ...] = ("vision", *MODALITIES)

_NONE = CountRule(count=0)

# NOTE [ Token presets ]
# Model-side tokenisations users otherwise get wrong, each with its published count
# (../shared/data/SOURCES.md; tests/test_spec.py checks every one):
# - pi0 (openpi): three fixed 224x224 camera slots at patch 14, 256 tokens each, and an empty slot
#   still costs its tokens; 48 text tokens, 1 state token, a 50-step action chunk: 867 in all.
# - openvla: one 224x224 image at patch 14 (256 tokens), the prompt from the metadata's text
#   column, 7 action tokens.
# - vjepa: 224 px at patch 16 with tubelets of 2 frames: 16 frames -> 8 x 14 x 14 = 1,568 tokens.
# - cosmos-dv4x8x8: a causal video tokenizer, 4x in time (first frame apart) and 8x8 in space:
#   9 frames of 512x512 -> 3 latent frames of 64 x 64 = 12,288 tokens.
TOKEN_PRESETS: dict[str, TokenSpec] = {
    "pi0": TokenSpec(
        patch=14,
        resize="fixed",
        fixed_size=(224, 224),
        camera_slots=3,
        camera_names=("base", "left_wrist", "right_wrist"),
        text=CountRule(count=48),
        proprio=CountRule(count=1),
        action=CountRule(count=50),
        memory=_NONE,
    ),
    "openvla": TokenSpec(
        patch=14,
        resize="fixed",
        fixed_size=(224, 224),
        camera_slots=1,
        text=CountRule(column="text_tokens", optional=True),
        proprio=_NONE,
        action=CountRule(count=7),
        memory=_NONE,
    ),
    "vjepa": TokenSpec(
        patch=16,
        tubelet=2,
        resize="fixed",
        fixed_size=(224, 224),
        text=_NONE,
        proprio=_NONE,
        action=_NONE,
        memory=_NONE,
    ),
    "cosmos-dv4x8x8": TokenSpec(
        patch=8, tubelet=4, causal_first_frame=True, text=_NONE, proprio=_NONE, action=_NONE, memory=_NONE
    ),
}
