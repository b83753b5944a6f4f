"""The contract of a video diffusion transformer family (plumbing of :mod:`tokenbucket.models`).

A diffusers video pipeline is a folder: ``model_index.json`` and one folder per component
(``transformer/config.json``, ``vae/config.json``, ``text_encoder/``, ``scheduler/``). The
transformer's ``_class_name`` names the family (``WanTransformer3DModel``, ...). A
:class:`VideoDiT` holds what tokenbucket knows about one family: the VAE's compression (read from
``vae/config.json``, or the family's published factors when only the transformer's config is
given), the pipeline's own rule from frames x height x width to the latent grid (and the sizes it
refuses), the transformer's patch sizes, how the text it conditions on meets the video tokens
(cross-attention, or joined into one sequence), and the inputs its ``forward`` takes for the
measured mode. :func:`read_pipeline` reads either form into a :class:`DiTConfig`.

NOTE [ Views of a sample ]: a multi-view world model feeds a sample's cameras to one transformer
in one of two ways. Laid along the latent time axis (``time``: each view's latents one after the
other, ``[C, V x F', H', W']``, as Cosmos's multi-view models and the multi-camera driving world
models built on Wan lay them) the views are one sequence of ``V x tokens`` that attends across
cameras, and attention grows with ``V^2``; laid as a batch of views (``batch``: ``[B x V, C, F',
H', W']``) each view is its own sequence and the batch grows ``V``-fold. The cost model and the
planner price the layout given (``time`` by default).

NOTE [ Video DiT tokens ]: one clip of ``F`` frames of ``H x W`` becomes latents ``[C, F', H',
W']`` by the VAE (``F' = (F - 1) / t + 1`` for the causal video VAEs of Wan, CogVideoX,
HunyuanVideo, LTX-Video and Cosmos; ``H' = H / s``), and the transformer cuts them into ``p_t x p
x p`` patches: ``F'/p_t x H'/p x W'/p`` tokens. The text states it conditions on are cached by
the usual fine-tuning scripts (DiffSynth, finetrainers, musubi-tuner) beside the latents, so a
sample's text length is what its cache holds. Nothing here imports ``torch`` or ``diffusers`` at
import time: only :meth:`VideoDiT.inputs` (the measured mode) does, inside the method.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._config import read_json_file
from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import check_frames, check_image_size
from tokenbucket.models._registry import DIT_MODULES

if TYPE_CHECKING:
    import torch

__all__ = [
    "BlockTerms",
    "DiTConfig",
    "DiTParams",
    "Latents",
    "SUPPORTED_DIT_CLASSES",
    "StepTerms",
    "VAEFactors",
    "VideoDiT",
    "check_clip",
    "config_int",
    "dit_family",
    "is_pipeline",
    "patch_triple",
    "read_pipeline",
]


@dataclass(frozen=True)
class VAEFactors:
    """A video VAE's compression: ``temporal`` frames and ``spatial`` pixels a side per latent,
    ``channels`` latent channels; ``source``: where they were read (``vae/config.json`` or the
    family's published factors)."""

    temporal: int
    spatial: int
    channels: int
    source: str


@dataclass(frozen=True)
class DiTConfig:
    """A video DiT as read from a pipeline folder or a transformer ``config.json`` alone.

    ``path``: what was read; ``class_name``: the transformer's ``_class_name``; ``transformer``:
    its config; ``vae``: the compression the latents have; ``pipeline``: ``model_index.json``'s
    ``_class_name`` (``None``: a transformer config alone)."""

    path: str
    class_name: str
    transformer: dict[str, Any]
    vae: VAEFactors
    pipeline: str | None = None

    def get(self, key: str, default: object = None) -> Any:
        """A transformer config key, or ``default`` (the class's own) when the config omits it."""
        value = self.transformer.get(key)
        return default if value is None else value


@dataclass(frozen=True)
class Latents:
    """What one clip becomes: the latent grid ``frames x height x width`` (after any frames the
    pipeline pads), and ``tokens`` transformer tokens after its patches."""

    frames: int
    height: int
    width: int
    tokens: int


@dataclass(frozen=True)
class DiTParams:
    """A transformer's parameters as a fine-tuning run holds them: ``total``, of which ``fp32``
    are kept in fp32 (NOTE [ Modules kept in fp32 ] in :mod:`tokenbucket.cost.dit_profile`) and the
    rest bf16; ``block``: one block's (what FSDP gathers at a time); ``lora``: the adapters LoRA
    adds at its rank on the attention projections; ``buffers``: the bytes of the tables the class
    builds beside its parameters (CogVideoX's sin-cos positions), held whole on every rank."""

    total: int
    fp32: int
    block: int
    lora: int
    buffers: int = 0

    @property
    def bf16(self) -> int:
        return self.total - self.fp32


@dataclass(frozen=True)
class BlockTerms:
    """What one kind of block keeps in a fine-tuning step, in bytes (NOTE [ What a DiT block
    keeps ] in :mod:`tokenbucket.cost.dit`): ``count`` blocks of it, each keeping ``video`` per
    video token and ``text`` per text token for backward; under checkpointing, ``checkpoint`` per
    video token (its input) and ``backward`` per video token of its backward's working set
    (``fsdp_backward`` under FSDP)."""

    count: int
    video: float
    text: float
    checkpoint: float
    backward: float
    fsdp_backward: float


@dataclass(frozen=True)
class StepTerms:
    """A step's terms: its ``blocks`` (one :class:`BlockTerms` per kind of block, in order), and
    what is kept outside them, ``outside`` per video token (patch embedding, output head, the fp32
    loss) and ``outside_text`` per text token (the text projection)."""

    blocks: tuple[BlockTerms, ...]
    outside: float
    outside_text: float


def check_clip(frames: object, height: object, width: object) -> None:
    """A clip's frames, height and width: positive integers (one-line error naming the field)."""
    check_frames(frames)
    check_image_size(height, width)


def patch_triple(cfg: DiTConfig, default: tuple[int, int, int]) -> tuple[int, int, int]:
    """A ``patch_size`` key given as three positive integers ``(p_t, p_h, p_w)`` (Wan, Cosmos)."""
    value = cfg.get("patch_size", list(default))
    if (
        not isinstance(value, list | tuple)
        or len(value) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)
    ):
        raise ConfigError(
            f"config.json {cfg.path!r}: key 'patch_size' should be three positive integers, got {value!r}"
        )
    return int(value[0]), int(value[1]), int(value[2])


def config_int(table: Mapping[str, Any], key: str, default: int | None, where: str) -> int:
    """A positive integer key of a config table (``default`` when absent), or a one-line error."""
    value = table.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: key {key!r} should be a positive integer, but got {value!r}")
    return value


class VideoDiT:
    """One family of video diffusion transformers. Subclasses set the class attributes and
    override the methods.

    Class attributes:
        name: the family's module name (``wan``, ``cogvideox``, ...).
        class_names: the transformer ``_class_name`` values it reads.
        published_vae: the VAE factors of the family's published pipelines, used when only a
            transformer config is given (``source`` says so).
        joint_text: the text tokens join the video tokens in one attention sequence
            (CogVideoX, HunyuanVideo); ``False``: the video tokens cross-attend to them.
    """

    name: ClassVar[str] = ""
    class_names: ClassVar[tuple[str, ...]] = ()
    published_vae: ClassVar[VAEFactors] = VAEFactors(4, 8, 16, "published")
    joint_text: ClassVar[bool] = False

    # -- reading --------------------------------------------------------------------------------

    def vae_factors(self, vae: Mapping[str, Any], where: str) -> VAEFactors:
        """The compression read from a ``vae/config.json`` (``where`` names it)."""
        raise AssertionError(f"video DiT family {self.name!r} does not define this")

    def patch_sizes(self, cfg: DiTConfig) -> tuple[int, int, int]:
        """The transformer's ``(p_t, p_h, p_w)``."""
        raise AssertionError(f"video DiT family {self.name!r} does not define this")

    def default_vae(self, transformer: Mapping[str, Any]) -> VAEFactors:
        """The VAE a transformer config alone implies: the family's published one (a family with
        several published VAEs tells them apart by the transformer's latent channels)."""
        return self.published_vae

    # -- tokens ---------------------------------------------------------------------------------

    def latents(self, cfg: DiTConfig, frames: int, height: int, width: int) -> Latents:
        """Exactly what the pipeline's latent preparation and the transformer's patch embedding
        make of one clip of ``frames`` frames of ``height x width``; a size the pipeline refuses
        is refused in one line naming its rule (NOTE [ Video DiT tokens ])."""
        raise AssertionError(f"video DiT family {self.name!r} does not define this")

    def text_tokens(self, cfg: DiTConfig, text_tokens: int) -> int:
        """The text positions the transformer attends for a cached prompt of ``text_tokens``."""
        return text_tokens

    def laid_views(self, cfg: DiTConfig, latents: Latents, views: int, layout: str = "time") -> tuple[Latents, int]:
        """``views`` cameras of one sample as the model is fed them (NOTE [ Views of a sample ]):
        ``(the latents of one sequence, sequences per sample)``."""
        if isinstance(views, bool) or not isinstance(views, int) or views < 1:
            raise ConfigError(f"views should be a positive integer, but got views={views!r}")
        if layout == "batch":
            return latents, views
        if layout != "time":
            raise ConfigError(f"a view layout should be 'time' or 'batch', but got {layout!r}")
        return Latents(latents.frames * views, latents.height, latents.width, latents.tokens * views), 1

    # -- the cost model --------------------------------------------------------------------------

    def width(self, cfg: DiTConfig) -> int:
        """The attention width ``D``: ``num_attention_heads x attention_head_dim``, the keys every
        diffusers video transformer names its width by."""
        where = f"config.json {cfg.path!r}"
        return config_int(cfg.transformer, "num_attention_heads", None, where) * config_int(
            cfg.transformer, "attention_head_dim", None, where
        )

    def params(self, cfg: DiTConfig, lora_rank: int = 16) -> DiTParams:
        """The parameters diffusers' class builds for ``cfg`` (counted exactly)."""
        raise AssertionError(f"video DiT family {self.name!r} does not define this")

    def matmul_params(self, cfg: DiTConfig) -> tuple[int, int]:
        """The weights a video token and a text token each meet in a forward's matmuls (NOTE [ DiT
        FLOPs ] in :mod:`tokenbucket.cost.dit`); by default every parameter, for the video tokens."""
        return self.params(cfg).total, 0

    def step_terms(self, cfg: DiTConfig, train: str, lora_rank: int = 16) -> StepTerms:
        """What a step keeps per token (NOTE [ What a DiT block keeps ] in :mod:`tokenbucket.cost.dit`),
        under ``train`` (``full`` or ``lora`` at ``lora_rank``)."""
        raise AssertionError(f"video DiT family {self.name!r} does not define this")

    # -- the measured mode ----------------------------------------------------------------------

    def inputs(
        self, cfg: DiTConfig, batch: int, latents: Latents, text_tokens: int, dtype: torch.dtype
    ) -> dict[str, Any]:
        """The keyword arguments of the transformer's ``forward`` for ``batch`` clips of
        ``latents`` and cached text states of ``text_tokens`` tokens, as tensors of the current
        fake mode (bookkeeping tensors may be real), plus ``"target"``: the flow-matching target
        the loss compares the output with (the output's shape, in ``dtype``)."""
        raise ConfigError(f"video DiT family {self.name!r} has no measured mode yet")


SUPPORTED_DIT_CLASSES: tuple[str, ...] = tuple(sorted(DIT_MODULES))


@cache
def _load(module: str) -> VideoDiT:
    found: VideoDiT = importlib.import_module(f"tokenbucket.models.{module}").DIT
    return found


def dit_family(class_name: str) -> VideoDiT:
    """The video DiT family whose transformer is diffusers' ``class_name`` (a one-line error
    listing the supported ones)."""
    if class_name not in DIT_MODULES:
        raise ConfigError(
            f"transformer _class_name {class_name!r} is not supported; supported: {', '.join(SUPPORTED_DIT_CLASSES)}"
        )
    return _load(DIT_MODULES[class_name])


def is_pipeline(path: str | Path) -> bool:
    """Whether ``path`` is a diffusers pipeline folder (a ``model_index.json`` in it), or a
    ``config.json`` (or a folder holding one) whose ``_class_name`` names a video DiT."""
    p = Path(path)
    if p.is_dir() and (p / "model_index.json").is_file():
        return True
    config = p / "config.json" if p.is_dir() else p
    if not config.is_file():
        return False
    try:
        name = json.loads(config.read_text(encoding="utf-8")).get("_class_name")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, RecursionError):  # not ours: the caller says why
        return False
    return isinstance(name, str) and name in DIT_MODULES


def read_pipeline(path: str | Path) -> DiTConfig:
    """Read a diffusers pipeline folder (``model_index.json``, ``transformer/config.json`` and,
    when present, ``vae/config.json``) or a transformer ``config.json`` alone (a file, or a folder
    holding one); without a VAE config the family's published factors apply (the returned
    :attr:`DiTConfig.vae` says so)."""
    p = Path(path)
    pipeline: str | None = None
    vae_path: Path | None = None
    if p.is_dir() and (p / "model_index.json").is_file():
        index = read_json_file(p / "model_index.json", "model_index.json")
        pipeline = str(index.get("_class_name", "")) or None
        config_path = p / "transformer" / "config.json"
        if not config_path.is_file():
            raise ConfigError(f"pipeline {str(p)!r}: model_index.json has no transformer/config.json beside it")
        vae_path = p / "vae" / "config.json"
    else:
        config_path = p / "config.json" if p.is_dir() else p
    config = read_json_file(config_path, "config.json")
    name = config.get("_class_name")
    if not isinstance(name, str):
        raise ConfigError(
            f"config.json {str(config_path)!r}: missing key '_class_name' (the diffusers class of the transformer)"
        )
    fam = dit_family(name)
    if vae_path is not None and vae_path.is_file():
        vae = fam.vae_factors(read_json_file(vae_path, "vae config.json"), f"vae config.json {str(vae_path)!r}")
    else:
        vae = fam.default_vae(config)
    return DiTConfig(str(config_path), name, config, vae, pipeline)
