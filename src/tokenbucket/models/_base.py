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
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError

if TYPE_CHECKING:
    from tokenbucket.cost.hf_model import Projector, VisionTower
    from tokenbucket.cost.staged import Sample
    from tokenbucket.tokens._hf_json import HFConfig
    from tokenbucket.tokens.spec import TokenSpec

__all__ = ["Family", "VisionInputs", "check_image_size"]


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
        vision_types: vision ``model_type`` -> the defaults transformers applies to its keys.
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

    def token_spec(self, cfg: HFConfig) -> TokenSpec:
        """The :class:`TokenSpec` whose per-image count is this family's exact rule (one image per
        camera frame, NOTE [ Frames are images ]); a plain decoder's counts text only."""
        from tokenbucket.tokens.spec import CountRule, TokenSpec

        none = CountRule(count=0)
        rules: dict[str, Any] = {"proprio": none, "action": none, "memory": none}
        if not self.has_vision:
            return TokenSpec(patch=1, tokens_per_frame=1, **rules)
        return TokenSpec(resize="model", image_rule=rule_json(self.name, self.image_rule(cfg)), **rules)

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

    def inputs(
        self, cfg: HFConfig, tconfig: Any, sample: Sample, batch: int, dtype: Any
    ) -> tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], Any]]]:
        """The inputs the processor makes for ``batch`` samples shaped like ``sample``: (real,
        fake specs), NOTE [ Real bookkeeping tensors ] in :mod:`tokenbucket.cost.hf_profile`.
        ``input_ids`` and ``labels`` are added by the caller when absent."""
        return {}, {}


def rule_json(family: str, rule: Mapping[str, Any]) -> str:
    """A rule as the compact JSON string a :class:`TokenSpec` carries (``image_rule``)."""
    return json.dumps({"family": family, **rule}, sort_keys=True, separators=(",", ":"))
