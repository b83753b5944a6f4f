"""The contract of a model family (plumbing of :mod:`tokenbucket.models`).

A :class:`Family` holds everything tokenbucket knows about one family of Hugging Face models:
which ``model_type`` values it reads, the transformers defaults of its ``config.json`` /
``preprocessor_config.json`` keys, its exact per-image token rule, its stages for the cost
model, and the inputs its processor makes for the measured mode. Each family module under
``tokenbucket/models/`` defines one ``FAMILY``; :mod:`tokenbucket.models` maps ``model_type``
to it. Nothing here imports ``transformers`` or ``torch`` at import time: only
:meth:`Family.inputs` (the measured mode) does, inside the method.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._stages import Projector, VisionTower

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = [
    "Family",
    "Inputs",
    "PackedAttention",
    "Shape",
    "SizedImage",
    "SizedLayout",
    "TEXT_TOKEN",
    "TowerImage",
    "VisionInputs",
    "check_frames",
    "check_image_size",
    "fixed_square",
    "rule_json",
    "token_ids",
]


@dataclass(frozen=True)
class VisionInputs:
    """What one image (or one video clip, :meth:`Family.clip_inputs`) becomes: ``tower_images``
    tower passes of ``patches_per_image`` tokens each, and ``llm_tokens`` LLM positions
    (NOTE [ HF image tokens ])."""

    tower_images: int
    patches_per_image: int
    llm_tokens: int


@dataclass(frozen=True)
class TowerImage:
    """One entry of a fixed-tower family's ``pixel_values`` ``[images, channels, side, side]``
    (a LLaVA-1.5 image, an InternVL tile): ``patches`` tower patches, ``llm_tokens`` image
    placeholders in the ids (NOTE [ Packed fixed-tower rows ] in :mod:`tokenbucket.train.packed_tower`).
    ``batched``: the processor writes ``[batch, images, channels, side, side]`` beside a
    ``pixel_attention_mask`` (an Idefics3 tile), NOTE [ Packed tiles by row ]."""

    channels: int
    side: int
    patches: int
    llm_tokens: int
    batched: bool = False


@dataclass(frozen=True)
class SizedLayout:
    """How a family whose processor writes ``image_sizes`` beside ``pixel_values`` lays a
    sample's images (NOTE [ Packed sized-image rows ] in :mod:`tokenbucket.train.packed_tower`):
    any-resolution ``tiles`` of a ``side`` square, ``[images, tiles, channels, side, side]`` with
    each image's tiles padded to the batch's most (LLaVA-NeXT, LLaVA-OneVision), or each image
    at its own size, ``[images, channels, H, W]`` padded to the batch's largest, every side a
    multiple of ``side`` (Pixtral's patch x merge: Mistral 3). ``sample_counts``: the model reads
    each sample's image count (``batch_num_images``); ``rule``: what :meth:`Family.sized_image` takes."""

    tiles: bool
    channels: int
    side: int
    sample_counts: bool
    rule: Mapping[str, Any]


@dataclass(frozen=True)
class SizedImage:
    """What the model makes of one entry of ``image_sizes`` (:meth:`Family.sized_image`):
    ``tiles`` tower passes (1 for an image at its own size), ``patches`` tower patches in all,
    ``llm_tokens`` LLM positions (what the metadata counts) of which ``placeholders`` hold the
    config's image token (the rest: Pixtral's row breaks)."""

    tiles: int
    patches: int
    llm_tokens: int
    placeholders: int


@dataclass(frozen=True)
class PackedAttention:
    """How a packed row's text model attends, for a family that one causal block-diagonal mask
    over positions from 0 does not pack (NOTE [ Families a packed row refuses ] in
    :mod:`tokenbucket.train.packed_tower`).

    ``masks(causal, segment_ids, token_type_ids)`` takes the rows' causal block-diagonal mask
    ``[R, 1, P, P]`` (bool, True: attend; a padding token attends to itself only), their
    ``segment_ids`` ``[R, P]`` and the samples' ``token_type_ids`` ``[R, P]`` (0 on padding;
    ``None`` when no item carries them) and returns the bool mask the text model takes as
    ``attention_mask``, or a dict of them keyed by layer type; nothing across samples.
    ``first_position``: each sample's first position id. ``windows``: the masks apply the text
    model's sliding window within each sample (else a window shorter than the row is refused).
    """

    masks: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor | dict[str, torch.Tensor]]
    first_position: int = 0
    windows: bool = False


def check_frames(frames: object, fps: object = None) -> None:
    """A clip's frame count (a positive integer) and its source ``fps`` (``None`` or a positive number)."""
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ConfigError(f"frames should be a positive integer, but got frames={frames!r}")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps < float("inf")):
        raise ConfigError(f"fps should be a positive number, but got fps={fps!r}")


def check_image_size(height: object, width: object) -> None:
    """Both sides positive integers (one-line error naming the side)."""
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} should be a positive integer, but got {name}={value!r}")


@dataclass(frozen=True)
class Shape:
    """One measured batch: ``batch`` samples of ``images`` images, or ``videos`` clips of
    ``frames`` frames each, of ``height x width`` and ``text_tokens`` text tokens each (a
    :class:`~tokenbucket.cost.staged.Sample` and its batch). A shape with clips is only given to a
    family with a video path (:attr:`Family.has_video`), and only for clips of two frames or more:
    elsewhere the frames are images (``images = videos x frames``), as the staged model prices
    them. ``fps``: the clips' own frame rate (``None``: not known), which a video processor that
    samples frames reads."""

    batch: int
    images: int
    height: int
    width: int
    text_tokens: int
    videos: int = 0
    frames: int = 0
    fps: float | None = None

    def __post_init__(self) -> None:
        if self.images and self.videos:
            raise AssertionError(f"a shape holds images or clips, not both: images={self.images}, videos={self.videos}")
        if bool(self.videos) != bool(self.frames):
            raise AssertionError(f"a shape's clips need frames: videos={self.videos}, frames={self.frames}")


Inputs = tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], Any]]]


class Family:
    """One family of models. Subclasses set the class attributes and override the methods.

    Class attributes:
        name: the family's module name (``qwen2_vl``, ``gemma3``, ...).
        model_types: the ``model_type`` values of ``config.json`` it reads.
        hf_classes: ``model_type`` -> the ``transformers`` class the measured mode builds.
        vision_attr: the vision tower's attribute under ``model.model`` (``None``: no tower).
        text_type: the text ``model_type`` a ``text_config`` that names none defaults to
            (``None``: a plain decoder, whose text keys sit at the top level).
        vision_types: vision ``model_type`` -> the defaults transformers applies to its keys.
        absent_vision: ``model_type`` -> the ``vision_config`` a config without one gets
            (transformers' default); its ``model_type`` is also what a ``vision_config`` naming
            none is.
        absent_text: the ``text_config`` a config without one gets (``None``: the text type's defaults).
        flat_text: a config without ``text_config`` keeps its text keys at the top level
            (Qwen2-VL's hub checkpoints).
        variable_tokens: an image's LLM tokens depend on its size (``False``: a fixed square).
        bidirectional_images: an image's tokens attend both ways within the image, so the text
            attention runs under an explicit mask (Gemma 3's ``token_type_ids``).
        video_processor: the ``transformers`` video processor class of a family with a video
            path (``None``: a camera's frames reach the model as images, NOTE [ Frames are images ]).
        unpacked_reason: why :class:`~tokenbucket.train.packed_tower.PackedTowerCollate` does not
            pack this family, in a few words (``None``: it does, from :meth:`tower_image` and
            :meth:`packed_attention`; NOTE [ Families a packed row refuses ]).
        sized_pixels: its processor writes ``image_sizes`` beside ``pixel_values``, and a packed
            row lays them by :meth:`sized_layout` and :meth:`sized_image` (``False``: by :meth:`tower_image`).
        counts_images: an image's tokens depend on how many images its sample holds, and
            :meth:`sample_rule_inputs` says how (LLaVA-OneVision tiles a lone image only; NOTE
            [ Images of a sample ] in :mod:`tokenbucket.tokens._vision`).
    """

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    hf_classes: ClassVar[Mapping[str, str]] = {}
    vision_attr: ClassVar[str | None] = None
    text_type: ClassVar[str | None] = None
    vision_types: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    absent_vision: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    absent_text: ClassVar[Mapping[str, Any] | None] = None
    flat_text: ClassVar[bool] = False
    variable_tokens: ClassVar[bool] = True
    bidirectional_images: ClassVar[bool] = False
    video_processor: ClassVar[str | None] = None
    unpacked_reason: ClassVar[str | None] = "its processor lays pixels another way than one fixed square an image"
    sized_pixels: ClassVar[bool] = False
    counts_images: ClassVar[bool] = False

    @property
    def has_vision(self) -> bool:
        return self.vision_attr is not None

    @property
    def has_video(self) -> bool:
        return self.video_processor is not None

    def vision_section(self, cfg: HFConfig) -> tuple[dict[str, Any], str]:
        """``vision_config`` with its ``model_type`` filled in (``absent_vision``'s when the config
        has none), and its key prefix; a vision ``model_type`` outside ``vision_types`` is refused."""
        raw = cfg.config.get("vision_config")
        absent = self.absent_vision.get(cfg.model_type)
        if absent is None:
            raise ConfigError(f"config.json {cfg.path!r}: model_type {cfg.model_type!r} has no vision tower")
        if raw is None:
            return dict(absent), "vision_config"
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json {cfg.path!r}: key 'vision_config' should be an object, but got {raw!r}")
        out = dict(raw)
        default_type = str(absent["model_type"])
        out.setdefault("model_type", default_type)
        if out["model_type"] in (cfg.model_type, cfg.model_type + "_vision"):  # old checkpoints name the composite
            out["model_type"] = default_type
        if out["model_type"] not in self.vision_types:
            raise ConfigError(
                f"config.json {cfg.path!r}: vision_config.model_type {out['model_type']!r} is not supported; "
                f"supported: {', '.join(sorted(self.vision_types))}"
            )
        return out, "vision_config"

    def vision_int(self, cfg: HFConfig, key: str) -> int:
        """A positive integer of the vision tower, with its vision model_type's default."""
        table, where = self.vision_section(cfg)
        return int(cfg.get(table, where, key, self.vision_types[str(table["model_type"])].get(key)))

    # -- tokens ---------------------------------------------------------------------------------

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        """The parameters of the per-image token rule, read from ``cfg`` (JSON-friendly values;
        :meth:`rule_inputs` takes them). A family without a tower: ``{}``."""
        return {}

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        """Exactly what the processor makes of one ``height x width`` image under ``rule``."""
        return VisionInputs(0, 0, 0)

    def sample_rule_inputs(self, rule: Mapping[str, Any], height: int, width: int, images: int) -> VisionInputs:
        """One of ``images`` images of a sample (LLaVA-OneVision tiles a lone image only);
        :meth:`rule_inputs` unless a family's processor looks at the sample's image count (then
        it sets :attr:`counts_images`)."""
        return self.rule_inputs(rule, height, width)

    def vision_inputs(self, cfg: HFConfig, height: int, width: int, images: int = 1) -> VisionInputs:
        """:meth:`sample_rule_inputs` under ``cfg``'s rule: one of ``images`` images of a sample."""
        check_image_size(height, width)
        if isinstance(images, bool) or not isinstance(images, int) or images < 1:
            raise ConfigError(f"images should be a positive integer, but got images={images!r}")
        return self.sample_rule_inputs(self.image_rule(cfg), height, width, images)

    def video_rule(self, cfg: HFConfig) -> dict[str, Any]:
        """The parameters of the per-clip token rule, read from the video processor's keys
        (:attr:`HFConfig.video_keys`) with the video processor class's defaults (JSON-friendly;
        :meth:`clip_rule_inputs` takes them). A family without a video path refuses."""
        raise ConfigError(
            f"config.json {cfg.path!r}: model_type {cfg.model_type!r} has no video path; feed its frames as images"
        )

    def clip_rule_inputs(
        self, rule: Mapping[str, Any], frames: int, height: int, width: int, fps: float | None = None
    ) -> VisionInputs:
        """Exactly what the video processor makes of one clip of ``frames`` frames of
        ``height x width`` under ``rule``: ``tower_images`` tower passes of ``patches_per_image``
        each and ``llm_tokens`` LLM positions for the whole clip. ``fps``: the clip's own frame
        rate, which a rule that samples frames reads (``None``: the frames are fed as they are)."""
        raise AssertionError(f"family {self.name!r} has no video path")

    def clip_inputs(
        self, cfg: HFConfig, frames: int, height: int, width: int, fps: float | None = None
    ) -> VisionInputs:
        """:meth:`clip_rule_inputs` under ``cfg``'s video rule."""
        check_image_size(height, width)
        check_frames(frames, fps)
        return self.clip_rule_inputs(self.video_rule(cfg), frames, height, width, fps)

    def pass_grid(
        self, cfg: HFConfig, height: int, width: int, frames: int | None = None, fps: float | None = None
    ) -> tuple[int, int] | None:
        """The pre-merge patch grid ``(rows, cols)`` of one tower pass over a ``height x width``
        image (with ``frames``: over one temporal group of such a clip, :meth:`clip_inputs`'s), for a
        tower whose attention depends on the grid's shape, not only its length (NOTE [ Windowed
        tower attention ]); ``None`` for a family whose towers do not window."""
        return None

    def spec_fields(self, cfg: HFConfig) -> dict[str, Any] | None:
        """The :class:`~tokenbucket.tokens.spec.CameraSpec` fields of a native rule that is exact
        for this family (a fixed square, Qwen2-VL's ``max_pixels``), or ``None``: the token spec
        then carries :meth:`image_rule` itself (``resize="model"``)."""
        return None

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        """The image size a planner's worst case assumes (NOTE [ The worst sample of a length ])."""
        raise AssertionError(f"family {self.name!r} has a vision tower but no default_image")

    def tower_square(self, cfg: HFConfig) -> tuple[int, int]:
        """The tower's ``image_size`` square: the worst image of a family that resizes every
        image to it (:meth:`default_image` of LLaVA-1.5, PaliGemma, Gemma 3)."""
        side = self.vision_int(cfg, "image_size")
        return side, side

    def tower_image(self, cfg: HFConfig) -> TowerImage:
        """One entry of the processor's ``pixel_values`` under ``cfg``: a family that packs
        (:attr:`unpacked_reason` ``None``) lays each sample's images ``[images, channels, side,
        side]``, each ``llm_tokens`` placeholders of the config's image token."""
        raise AssertionError(f"family {self.name!r} does not lay its images as fixed squares: {self.unpacked_reason}")

    def sized_layout(self, cfg: HFConfig) -> SizedLayout:
        """How the processor lays a sample's images beside ``image_sizes`` under ``cfg`` (a family
        with :attr:`sized_pixels`; NOTE [ Packed sized-image rows ])."""
        raise AssertionError(f"family {self.name!r} writes no image_sizes")

    def sized_image(self, rule: Mapping[str, Any], height: int, width: int, images: int) -> SizedImage:
        """What the model makes of one image whose ``image_sizes`` entry is ``height x width``,
        one of ``images`` images of its sample, under :meth:`sized_layout`'s ``rule``: the
        model's own count from the sizes it reads (for Pixtral, the processor's output sides)."""
        raise AssertionError(f"family {self.name!r} writes no image_sizes")

    def packed_attention(self, text: object) -> PackedAttention | None:
        """How a packed row of a family that packs attends under ``text`` (its transformers text
        config): ``None``, one causal block-diagonal mask over positions restarting at 0; a
        config the family's masks cannot follow is refused in one line."""
        return None

    # -- stages ---------------------------------------------------------------------------------

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        """The vision tower(s), read from ``vision_config`` (empty for a plain decoder)."""
        return ()

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        """The projector from ``tower`` to the LLM's ``width``."""
        return None

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        """Whether the LLM head shares the token embedding, given the text config's own flag.
        transformers 5 ties by the root ``tie_word_embeddings`` (default false for a VLM)."""
        if not self.has_vision:
            return text_tie
        return bool(cfg.get(cfg.config, "", "tie_word_embeddings", False, bool))

    # -- the measured mode ----------------------------------------------------------------------

    def min_text_tokens(self, images: int) -> int:
        """Text tokens a sample of ``images`` images needs at least (markers the model reads)."""
        return 0

    def min_video_text_tokens(self, groups: int) -> int:
        """Text tokens one clip of ``groups`` temporal groups (:meth:`clip_inputs`'
        ``tower_images``) needs at least: markers the model reads (a family without a video path: 0)."""
        return 0

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        """The inputs the processor makes for ``shape.batch`` samples of ``shape.images`` images
        (or, with a video path, ``shape.videos`` clips) each: (real tensors, fake ``{name: (size,
        dtype)}``), NOTE [ Real bookkeeping tensors ] in :mod:`tokenbucket.cost.hf_profile`.
        ``real`` holds ``input_ids`` ([batch, length], image and video tokens placed); the caller
        adds ``labels``. ``tconfig`` is the transformers config, ``dtype`` the pixels' torch dtype
        (NOTE [ Families defer torch ])."""
        raise ConfigError(f"model family {self.name!r} has no measured mode yet: price it with cost --hf-config")


def fixed_square(rule: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~tokenbucket.tokens.spec.CameraSpec` fields of a rule that resizes every image
    to a ``side`` square of ``tokens`` LLM tokens over ``patch``-pixel patches."""
    side = int(rule["side"])
    return {"patch": rule["patch"], "resize": "fixed", "fixed_size": (side, side), "tokens_per_frame": rule["tokens"]}


TEXT_TOKEN = 1  # the id of every plain text token the measured mode writes


def token_ids(shape: Shape, image_tokens: int) -> Any:
    """``input_ids`` [batch, image_tokens + text_tokens]: plain text (``TEXT_TOKEN``), the caller
    places the image tokens."""
    import torch  # optional: the measured mode only (NOTE [ Families defer torch ])

    return torch.full((shape.batch, image_tokens + shape.text_tokens), TEXT_TOKEN, dtype=torch.long)


def rule_json(family: str, rule: Mapping[str, Any]) -> str:
    """A rule as the compact JSON string a :class:`TokenSpec` carries (``image_rule``)."""
    return json.dumps({"family": family, **rule}, sort_keys=True, separators=(",", ":"))
