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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._stages import Projector, VisionTower

__all__ = ["Family", "Inputs", "Shape", "VisionInputs", "check_image_size", "rule_json"]


@dataclass(frozen=True)
class VisionInputs:
    """What one image becomes: ``tower_images`` tower passes of ``patches_per_image`` tokens each,
    and ``llm_tokens`` LLM positions (NOTE [ HF image tokens ])."""

    tower_images: int
    patches_per_image: int
    llm_tokens: int


def check_image_size(height: object, width: object) -> None:
    """Both sides positive integers (one-line error naming the side)."""
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} should be a positive integer, but got {name}={value!r}")


class Family:
    """One family of models. Subclasses set the class attributes and override the methods.

    Class attributes:
        name: the family's module name (``qwen2_vl``, ``gemma3``, ...).
        model_types: the ``model_type`` values of ``config.json`` it reads.
        hf_classes: ``model_type`` -> the ``transformers`` class the measured mode builds.
        vision_attr: the vision tower's attribute under ``model.model`` (``None``: no tower).
        text_type: the text ``model_type`` a ``text_config`` that names none defaults to
            (``None``: a plain decoder, whose text keys sit at the top level).
        vision_types: vision ``model_type`` -> the defaults transformers applies to its keys
            (the first is what a ``vision_config`` naming no ``model_type`` is).
        absent_vision: the ``vision_config`` a config without one gets (transformers' default).
        absent_text: the ``text_config`` a config without one gets.
    """

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    hf_classes: ClassVar[Mapping[str, str]] = {}
    vision_attr: ClassVar[str | None] = None
    text_type: ClassVar[str | None] = None
    vision_types: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    absent_vision: ClassVar[Mapping[str, Any] | None] = None
    absent_text: ClassVar[Mapping[str, Any] | None] = None

    @property
    def has_vision(self) -> bool:
        return self.vision_attr is not None

    def vision_section(self, cfg: HFConfig) -> tuple[dict[str, Any], str]:
        """``vision_config`` with its ``model_type`` filled in (``absent_vision`` when the config has
        none), and its key prefix; a vision ``model_type`` outside ``vision_types`` is refused."""
        raw = cfg.config.get("vision_config")
        if raw is None:
            if self.absent_vision is None:
                raise ConfigError(f"config.json {cfg.path!r}: missing key 'vision_config'")
            return dict(self.absent_vision), "vision_config"
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json {cfg.path!r}: key 'vision_config' should be an object, but got {raw!r}")
        out = dict(raw)
        default_type = next(iter(self.vision_types))
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

    def vision_inputs(self, cfg: HFConfig, height: int, width: int) -> VisionInputs:
        """:meth:`rule_inputs` under ``cfg``'s rule."""
        check_image_size(height, width)
        return self.rule_inputs(self.image_rule(cfg), height, width)

    def spec_fields(self, cfg: HFConfig) -> dict[str, Any] | None:
        """The :class:`~tokenbucket.tokens.spec.CameraSpec` fields of a native rule that is exact
        for this family (a fixed square, Qwen2-VL's ``max_pixels``), or ``None``: the token spec
        then carries :meth:`image_rule` itself (``resize="model"``)."""
        return None

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        """The image size a planner's worst case assumes (NOTE [ The worst sample of a length ])."""
        raise NotImplementedError(f"{self.name}: default_image")

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

    def inputs(self, cfg: HFConfig, tconfig: Any, shape: Shape, dtype: Any) -> Inputs:
        """The inputs the processor makes for ``shape.batch`` samples of ``shape.images`` images
        each: (real tensors, fake ``{name: (size, dtype)}``), NOTE [ Real bookkeeping tensors ]
        in :mod:`tokenbucket.cost.hf_profile`. ``real`` holds ``input_ids`` ([batch, length],
        image tokens placed); the caller adds ``labels``. ``tconfig`` is the transformers config,
        ``dtype`` the pixels' torch dtype (NOTE [ Families defer torch ])."""
        raise NotImplementedError(f"{self.name}: inputs")


@dataclass(frozen=True)
class Shape:
    """One measured batch: ``batch`` samples of ``images`` images of ``height x width`` and
    ``text_tokens`` text tokens each (a :class:`~tokenbucket.cost.staged.Sample` and its batch)."""

    batch: int
    images: int
    height: int
    width: int
    text_tokens: int


Inputs = tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], Any]]]


def rule_json(family: str, rule: Mapping[str, Any]) -> str:
    """A rule as the compact JSON string a :class:`TokenSpec` carries (``image_rule``)."""
    return json.dumps({"family": family, **rule}, sort_keys=True, separators=(",", ":"))
