"""Plain decoders: Llama, Qwen2, Gemma, Gemma 2 (text only; the text keys sit at the top level).

Their text backbone is read by :func:`tokenbucket.cost.hf_model.staged_from_config` like every
family's; a decoder takes no image, so its token spec counts text only.

Example:
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> FAMILY.vision_inputs(HFConfig("<d>", {"model_type": "llama"}), 480, 640)
    VisionInputs(tower_images=0, patches_per_image=0, llm_tokens=0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenbucket.models._base import Family, Inputs, Shape, token_ids
from tokenbucket.models._hf_json import HFConfig

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "Decoders"]


class Decoders(Family):
    name = "decoders"
    unpacked_reason = "it has no vision tower: pack its text with PackedCollate"
    model_types = ("llama", "qwen2", "gemma", "gemma2")
    hf_classes = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "gemma": "GemmaForCausalLM",
        "gemma2": "Gemma2ForCausalLM",
    }

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        return {"input_ids": token_ids(shape, 0)}, {}


FAMILY = Decoders()
