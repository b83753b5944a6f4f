"""``model_type`` -> the family module that reads it (the registry's table; plumbing of :mod:`tokenbucket.models`).

Adding a family: its module under ``tokenbucket/models/`` and one line here per ``model_type``.
"""

from __future__ import annotations

__all__ = ["DIT_MODULES", "MODULES"]

MODULES: dict[str, str] = {
    "gemma": "decoders",
    "gemma2": "decoders",
    "gemma3": "gemma3",
    "llama": "decoders",
    "qwen2": "decoders",
    "idefics3": "idefics3",
    "internvl": "internvl",
    "smolvlm": "smolvlm",
    "llava": "llava",
    "llava_next": "llava_next",
    "llava_onevision": "llava_onevision",
    "mistral3": "mistral3",
    "paligemma": "paligemma",
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_vl",
    "qwen3_vl": "qwen3_vl",
}

# video diffusion transformers (diffusers): the transformer config's ``_class_name`` -> its family module
DIT_MODULES: dict[str, str] = {
    "CogVideoXTransformer3DModel": "cogvideox",
    "CosmosTransformer3DModel": "cosmos",
    "HunyuanVideoTransformer3DModel": "hunyuan_video",
    "LTXVideoTransformer3DModel": "ltx_video",
    "WanTransformer3DModel": "wan",
}
