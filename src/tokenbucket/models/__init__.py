"""Model families: one module per family, and the registry that maps ``model_type`` to it.

Each module (``qwen2_vl.py``, ``idefics3.py``, ...) defines ``FAMILY``, a
:class:`~tokenbucket.models._base.Family` holding everything about that family: reading its
``config.json`` and ``preprocessor_config.json``, its exact token count per image, its stages
for the cost model and its inputs for the measured mode. Adding a family is one new module,
one line per ``model_type`` in ``_registry.MODULES`` and its truth points (docs/architecture.md: "Adding a
model family").

Example:
    >>> family("smolvlm").name, family("qwen2_5_vl").model_types
    ('smolvlm', ('qwen2_vl', 'qwen2_5_vl'))
"""

from __future__ import annotations

import importlib
import json
from functools import cache
from typing import Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Family, VisionInputs, check_frames, check_image_size
from tokenbucket.models._dit import (
    SUPPORTED_DIT_CLASSES,
    DiTConfig,
    Latents,
    VAEFactors,
    VideoDiT,
    dit_family,
    read_pipeline,
)
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._registry import DIT_MODULES, MODULES

__all__ = [
    "DIT_MODULES",
    "MODULES",
    "SUPPORTED_DIT_CLASSES",
    "SUPPORTED_MODEL_TYPES",
    "DiTConfig",
    "Family",
    "Latents",
    "VAEFactors",
    "VideoDiT",
    "VisionInputs",
    "clip_inputs",
    "counts_images",
    "dit_family",
    "family",
    "of",
    "read_pipeline",
    "rule_inputs",
]

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(MODULES))


@cache
def _load(module: str) -> Family:
    found: Family = importlib.import_module(f"tokenbucket.models.{module}").FAMILY
    return found


def family(model_type: str) -> Family:
    """The family that reads ``model_type`` (a one-line error listing the supported ones)."""
    if model_type not in MODULES:
        raise ConfigError(f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return _load(MODULES[model_type])


def of(cfg: HFConfig) -> Family:
    """The family of a read config (its ``model_type`` checked)."""
    return family(cfg.model_type)


def rule_inputs(rule: str, height: int, width: int, images: int = 1) -> VisionInputs:
    """One ``height x width`` image under a :class:`TokenSpec`'s ``image_rule`` (the JSON string
    :meth:`Family.token_spec` writes: the family's name and its rule's parameters), one of the
    ``images`` images of its sample (:meth:`Family.sample_rule_inputs`; read only by a family
    that :func:`counts_images`)."""
    check_image_size(height, width)
    if isinstance(images, bool) or not isinstance(images, int) or images < 1:
        raise ConfigError(f"images should be a positive integer, but got images={images!r}")
    fam, params = _rule(rule)
    try:
        return fam.sample_rule_inputs(params, height, width, images)
    except (KeyError, TypeError) as exc:  # a hand-written rule without the family's parameters
        raise ConfigError(f"image_rule is not a {fam.name} rule ({exc!r} missing or wrong): {rule!r:.120}") from None


def counts_images(rule: str) -> bool:
    """Whether an image's tokens under ``rule`` depend on how many images its sample holds
    (:attr:`Family.counts_images`: LLaVA-OneVision's)."""
    return _rule(rule)[0].counts_images


def clip_inputs(rule: str, frames: int, height: int, width: int, fps: float | None = None) -> VisionInputs:
    """One clip of ``frames`` frames of ``height x width`` under a :class:`TokenSpec`'s
    ``video_rule`` (the family's name and its video rule's parameters, as JSON); ``fps``: the
    clip's own frame rate, read by a rule that samples frames."""
    check_image_size(height, width)
    check_frames(frames, fps)
    fam, params = _rule(rule)
    if not fam.has_video:
        raise ConfigError(f"video_rule names {fam.name}, which has no video path: {rule!r:.120}")
    try:
        return fam.clip_rule_inputs(params, frames, height, width, fps)
    except (KeyError, TypeError) as exc:  # a hand-written rule without the family's parameters
        raise ConfigError(f"video_rule is not a {fam.name} rule ({exc!r} missing or wrong): {rule!r:.120}") from None


def _rule(rule: str) -> tuple[Family, dict[str, Any]]:
    """A rule's family and its parameters (the JSON :class:`TokenSpec` checked names a family)."""
    params: dict[str, Any] = json.loads(rule)
    return _load(str(params.pop("family"))), params
