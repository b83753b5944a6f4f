"""Measured training peaks of real Hugging Face models on fake tensors: the truth set.

Command (what ``tests/data/hf_truth.json`` comes from; no GPU, no downloads):

    .venv/bin/python benchmarks/hf_truth.py                      # every arch, ~30-60 min on 2 cores
    .venv/bin/python benchmarks/hf_truth.py --only qwen2-vl-2b --out /tmp/qwen2vl.json
    .venv/bin/python benchmarks/hf_truth.py --steps 2 --shapes 1 --out /tmp/steady.json  # steady state
    .venv/bin/python benchmarks/hf_truth.py --sharding ddp8 --shapes 2 --out /tmp/ddp.json  # DDP's buckets
    .venv/bin/python benchmarks/hf_truth.py --merge a.json b.json --out tests/data/hf_truth.json
    # video clips (VIDEO_SHAPES: pixel_values_videos through the model's video path), one arch at a time:
    .venv/bin/python benchmarks/hf_truth.py --video --only qwen2-vl-2b --out /tmp/video_qwen2vl.json
    .venv/bin/python benchmarks/hf_truth.py --video --only qwen2-vl-2b --steps 2 --shapes 1 --sharding none \
        --out /tmp/video_qwen2vl.json
    .venv/bin/python benchmarks/hf_truth.py --merge /tmp/video_*.json --out tests/data/hf_truth_video.json
    # how the step is written (AXES; each flag repeatable, every combination measured):
    .venv/bin/python benchmarks/hf_truth.py --shapes 1 --sharding none --train full --steps 2 \
        --loop dropped --loop held --kernels cpu --kernels cuda --out /tmp/loops.json
    .venv/bin/python benchmarks/hf_truth.py --only qwen2-vl-2b --shapes 2 --sharding none --train full --steps 2 \
        --checkpointing vision --checkpointing backbone --checkpointing both --out /tmp/ckpt.json

Each point builds a real ``transformers`` model from its config class at the real size, in pure
bf16 (the default dtype is bf16 while it is built), under ``FakeTensorMode`` on ``cpu``, and runs
one training step: forward with labels, backward, ``AdamW(foreach=True).step()``. The peak of
live tensor bytes comes from PyTorch's own trackers: ``MemTracker`` (unsharded) and
``FSDPMemTracker`` over FSDP2 ``fully_shard`` on a fake process group of 8 ranks. Unsharded points
also carry tokenbucket's ``StorageTracker`` peak (512 B rounding, like the CUDA allocator).

A video point (``--video``, ``VIDEO_SHAPES``) holds ``videos`` clips of ``frames`` frames at
``fps``, fed as the model's processor feeds them: a Qwen processor's ``pixel_values_videos`` and
``video_grid_thw`` (and Qwen2.5-VL's ``second_per_grid_ts``), video tokens between vision start and
end tokens (Qwen3-VL: per temporal group, after a timestamp that one text token stands for),
counted from transformers' own resize and frame sampling; LLaVA-OneVision's
``pixel_values_videos`` [clips, frames, 3, 384, 384] and frames x 196 + 1 video tokens a clip
(``LlavaOnevisionProcessor.replace_video_token``); SmolVLM2's frames as unsplit 512 px images
(``pixel_values`` and its mask, 64 image tokens a frame). Its ``video_tokens`` are per sample, its
``image_tokens`` 0. ``smolvlm2-256m`` (SmolVLM2-256M-Video-Instruct, model_type ``smolvlm``) has
clips only: its images are ``smolvlm-256m``'s (Idefics3's, the same tower and backbone).
Measured one arch at a time on 2 shared cores: 18 one-step points (3 trains x none/fsdp8 x 3
shapes) in 491 s (qwen2-vl-2b), 582 s (qwen2.5-vl-3b), 192 s (qwen3-vl-2b), 162 s
(llava-onevision-0.5b) and 166 s (smolvlm2-256m); 3 steady-state ones (``--steps 2 --shapes 1
--sharding none``) in 49, 128, 49, 44 and 36 s. ``tests/data/hf_truth_video.json`` holds them,
merged into ``tests/data/hf_truth.json``.

A point also says how its step was written (``AXES``, NOTE [ Step shapes ] in
``tokenbucket.cost.hf_profile``): ``loop`` (``dropped``: ``loss = model(**batch).loss``, the HF
Trainer and Lightning; ``held``: ``outputs = model(**batch)`` bound to the next step, raw loops and
Accelerate's examples), ``use_cache`` (as the config leaves it, or off), ``kernels`` (the CPU
attention kernels, or the CUDA kernels' meta functions), ``optimizer`` (AdamW, SGD with momentum)
and ``checkpointing`` (transformers' own, on the vision tower, the backbone or both). A point
without a field was measured under its first value.

The measuring engine is ``tokenbucket.cost.hf_profile.measure_step`` (NOTE [ Root-only peak
stats ] and NOTE [ Real bookkeeping tensors ] there); this script owns the configs, the shapes
and its own image-token counting, written from each processor's rules apart from the
package's, so the fixture checks the package's counts too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_DISABLE_TORCH_CHECK", "1")  # checks read fake tensor values
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import peft
import torch
import transformers
from transformers.initialization import no_init_weights

from tokenbucket.cost.hf_profile import HF_CLASSES, StepShape, apply_training, measure_step, qwen_rope_positions
from tokenbucket.cost.profile import default_dtype

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_truth.json"
WORLD = 8

# -- configs (real sizes, built in code) -------------------------------------------------------


def _llama2_7b(**kw: object) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32064,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        **kw,
    )


def _gemma_2b(vocab_size: int = 256000) -> transformers.GemmaConfig:
    return transformers.GemmaConfig(
        hidden_size=2048,
        intermediate_size=16384,
        num_hidden_layers=18,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=vocab_size,
        max_position_embeddings=8192,
    )


def _qwen2_05b(vocab_size: int = 151936, **kw: object) -> transformers.Qwen2Config:
    return transformers.Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        **kw,
    )


def _clip_l336() -> transformers.CLIPVisionConfig:
    return transformers.CLIPVisionConfig(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        image_size=336,
        patch_size=14,
        projection_dim=768,
        hidden_act="quick_gelu",
    )


def _siglip_so400m(image_size: int, patch_size: int = 14) -> transformers.SiglipVisionConfig:
    return transformers.SiglipVisionConfig(
        hidden_size=1152,
        intermediate_size=4304,
        num_hidden_layers=27,
        num_attention_heads=16,
        image_size=image_size,
        patch_size=patch_size,
    )


def _build_config(name: str) -> transformers.PretrainedConfig:
    if name == "qwen2-0.5b":
        return _qwen2_05b()
    if name == "gemma-2-2b":  # sandwich norms, final logit soft-capping, q width != hidden
        # NOTE [ Gemma 2 attention ]: Gemma 2 is trained with flash_attention_2, which applies the
        # attention soft-cap inside the kernel (no score matrix). There is no such kernel here:
        # transformers refuses sdpa for Gemma 2 because sdpa has no soft-cap, so the truth runs sdpa
        # (the same memory class as flash) with the attention soft-cap off; the final logit
        # soft-cap, whose fp32 working set is what it costs, stays on. Every layer attends in
        # full: sdpa takes a sliding window only as an L x L mask and then keeps L x L scores
        # per layer on this CPU, where flash-attention 2 slides inside the kernel (a window
        # changes its FLOPs, not its memory). Eager attention (the default without flash-attn)
        # keeps L x L scores per layer and is not what is priced.
        return transformers.Gemma2Config(
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            vocab_size=256000,
            max_position_embeddings=8192,
            sliding_window=4096,
            layer_types=["full_attention"] * 26,  # NOTE [ Gemma 2 attention ]
            final_logit_softcapping=30.0,
            attn_logit_softcapping=None,
        )
    if name == "llama-3.2-1b":
        return transformers.LlamaConfig(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            vocab_size=128256,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            tie_word_embeddings=True,
        )
    if name == "gemma-2b":
        return _gemma_2b()
    if name == "qwen2-vl-2b":
        return transformers.Qwen2VLConfig(
            text_config={
                "hidden_size": 1536,
                "intermediate_size": 8960,
                "num_hidden_layers": 28,
                "num_attention_heads": 12,
                "num_key_value_heads": 2,
                "vocab_size": 151936,
                "max_position_embeddings": 32768,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
            },
            vision_config={
                "depth": 32,
                "embed_dim": 1280,
                "hidden_size": 1536,
                "num_heads": 16,
                "mlp_ratio": 4,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
            },
            tie_word_embeddings=True,
        )
    if name == "qwen2.5-vl-3b":
        return transformers.Qwen2_5_VLConfig(
            text_config={
                "hidden_size": 2048,
                "intermediate_size": 11008,
                "num_hidden_layers": 36,
                "num_attention_heads": 16,
                "num_key_value_heads": 2,
                "vocab_size": 151936,
                "max_position_embeddings": 128000,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
            },
            vision_config={
                "depth": 32,
                "hidden_size": 1280,
                "intermediate_size": 3420,
                "out_hidden_size": 2048,
                "num_heads": 16,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "window_size": 112,
                "fullatt_block_indexes": [7, 15, 23, 31],
            },
            tie_word_embeddings=True,
        )
    if name == "qwen3-vl-2b":  # Qwen/Qwen3-VL-2B-Instruct
        return transformers.Qwen3VLConfig(
            text_config={
                "hidden_size": 2048,
                "intermediate_size": 6144,
                "num_hidden_layers": 28,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
                "max_position_embeddings": 262144,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 5000000.0,
                    "mrope_section": [24, 20, 20],
                    "mrope_interleaved": True,
                },
            },
            vision_config={
                "depth": 24,
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_heads": 16,
                "out_hidden_size": 2048,
                "num_position_embeddings": 2304,
                "deepstack_visual_indexes": [5, 11, 17],
                "patch_size": 16,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
            },
            tie_word_embeddings=True,
        )
    if name == "llava-1.5-7b":
        return transformers.LlavaConfig(
            vision_config=_clip_l336(),
            text_config=_llama2_7b(),
            image_token_index=32000,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
        )
    if name == "llava-next-qwen2-0.5b":
        return transformers.LlavaNextConfig(
            vision_config=_clip_l336(),
            text_config=_qwen2_05b(),
            image_token_index=151646,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
            image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        )
    if name == "llava-onevision-0.5b":  # llava-hf/llava-onevision-qwen2-0.5b-ov-hf
        return transformers.LlavaOnevisionConfig(
            vision_config=transformers.SiglipVisionConfig(
                hidden_size=1152,
                intermediate_size=4304,
                num_hidden_layers=26,
                num_attention_heads=16,
                image_size=384,
                patch_size=14,
                vision_use_head=False,
            ),
            text_config=_qwen2_05b(vocab_size=152000),
            image_token_index=151646,
            video_token_index=151647,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
            vision_aspect_ratio="anyres_max_9",
            tie_word_embeddings=True,
        )
    if name == "paligemma-3b":
        return transformers.PaliGemmaConfig(
            vision_config=_siglip_so400m(224),
            text_config=_gemma_2b(vocab_size=257216),
            image_token_index=257152,
            projection_dim=2048,
            hidden_size=2048,
        )
    if name == "smolvlm-256m":
        return transformers.Idefics3Config(**_smolvlm_256m())
    if name == "smolvlm2-256m":  # HuggingFaceTB/SmolVLM2-256M-Video-Instruct: smolvlm-256m's tower and backbone
        return transformers.SmolVLMConfig(**_smolvlm_256m())
    if name == "internvl3-1b":  # OpenGVLab/InternVL3-1B-hf: InternViT-300M-448px-V2.5 + Qwen2.5-0.5B
        return transformers.InternVLConfig(
            vision_config={
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "attention_bias": True,
                "use_qk_norm": False,
                "norm_type": "layer_norm",
                "image_size": [448, 448],
                "patch_size": [14, 14],
                "layer_scale_init_value": 0.1,
                "use_mean_pooling": True,
            },
            text_config={
                "model_type": "qwen2",
                "hidden_size": 896,
                "intermediate_size": 4864,
                "num_hidden_layers": 24,
                "num_attention_heads": 14,
                "num_key_value_heads": 2,
                "vocab_size": 151674,
                "max_position_embeddings": 32768,
                "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6,
                "tie_word_embeddings": False,
            },
            downsample_ratio=0.5,
            image_token_id=151667,
            vision_feature_layer=-1,
            tie_word_embeddings=False,
        )
    if name == "gemma-3-4b":  # google/gemma-3-4b-it: SigLIP so400m at 896, 4x4 pooled to 256 tokens
        return transformers.Gemma3Config(
            vision_config={**_siglip_so400m(896).to_dict(), "vision_use_head": False},
            text_config={
                "hidden_size": 2560,
                "intermediate_size": 10240,
                "num_hidden_layers": 34,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "vocab_size": 262208,
                "max_position_embeddings": 131072,
                "query_pre_attn_scalar": 256,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                "final_logit_softcapping": None,
                "attn_logit_softcapping": None,
            },
            mm_tokens_per_image=256,
            image_token_index=262144,
            boi_token_index=255999,
            eoi_token_index=256000,
        )
    if name == "mistral-small-3.1-24b":  # mistralai/Mistral-Small-3.1-24B-Instruct-2503
        return transformers.Mistral3Config(
            vision_config={
                "model_type": "pixtral",
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "patch_size": 14,
                "image_size": 1540,
                "head_dim": 64,
                "hidden_act": "gelu",
                "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
            },
            text_config={
                "model_type": "mistral",
                "hidden_size": 5120,
                "intermediate_size": 32768,
                "num_hidden_layers": 40,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 131072,
                "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-5,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000000.0},
                "sliding_window": None,
            },
            image_token_index=10,
            spatial_merge_size=2,
            vision_feature_layer=-1,
            multimodal_projector_bias=False,
            tie_word_embeddings=False,  # the checkpoint stores both (NOTE [ Mistral 3's tie ] in the package)
        )
    raise KeyError(f"unknown arch {name!r}; one of {', '.join(ARCHS)}")


def _smolvlm_256m() -> dict[str, Any]:
    """SmolVLM-256M's tower and backbone (SmolVLM2-256M-Video-Instruct's are taken to be the same)."""
    vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
              "image_size": 512, "patch_size": 16}  # fmt: skip
    text = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49280, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0}  # fmt: skip
    return {"vision_config": vision, "text_config": text, "scale_factor": 4, "image_token_id": 49190,
            "tie_word_embeddings": True}  # fmt: skip


def build_config(name: str) -> transformers.PretrainedConfig:
    """The real-size config of ``name`` (sdpa attention), built from its config class."""
    config = _build_config(name)
    config._attn_implementation = "eager" if name == "gemma-2-2b" else "sdpa"  # NOTE [ Gemma 2 attention ]
    for sub in ("text_config", "vision_config"):
        if hasattr(config, sub):
            getattr(config, sub)._attn_implementation = "sdpa"
    return config


# arch -> its model_type; the class and the vision tower's attribute are the package's (HF_CLASSES)
ARCH_TYPES: dict[str, str] = {
    "qwen2-0.5b": "qwen2",
    "llama-3.2-1b": "llama",
    "gemma-2b": "gemma",
    "gemma-2-2b": "gemma2",
    "qwen2-vl-2b": "qwen2_vl",
    "qwen2.5-vl-3b": "qwen2_5_vl",
    "qwen3-vl-2b": "qwen3_vl",
    "llava-1.5-7b": "llava",
    "paligemma-3b": "paligemma",
    "llava-next-qwen2-0.5b": "llava_next",
    "smolvlm-256m": "idefics3",
    "llava-onevision-0.5b": "llava_onevision",
    "smolvlm2-256m": "smolvlm",  # clips only (VIDEO_SHAPES): its images are smolvlm-256m's
    "internvl3-1b": "internvl",
    "gemma-3-4b": "gemma3",
    "mistral-small-3.1-24b": "mistral3",
}
ARCHS: dict[str, tuple[str, str | None]] = {name: HF_CLASSES[mt] for name, mt in ARCH_TYPES.items()}

# per arch: (batch, images per sample, height, width, text tokens per sample)
SHAPES: dict[str, list[tuple[int, int, int, int, int]]] = {
    "qwen2-0.5b": [(1, 0, 0, 0, 256), (2, 0, 0, 0, 2048), (1, 0, 0, 0, 8192)],
    "llama-3.2-1b": [(1, 0, 0, 0, 512), (2, 0, 0, 0, 2048), (1, 0, 0, 0, 8192)],
    "gemma-2b": [(1, 0, 0, 0, 256), (2, 0, 0, 0, 1024), (1, 0, 0, 0, 4096)],
    "gemma-2-2b": [(1, 0, 0, 0, 256), (2, 0, 0, 0, 1024), (1, 0, 0, 0, 8192)],
    "qwen2-vl-2b": [(1, 1, 224, 224, 256), (2, 4, 448, 448, 1024), (1, 13, 448, 672, 2048), (1, 2, 896, 896, 8192)],
    "qwen2.5-vl-3b": [(1, 1, 224, 224, 256), (2, 4, 448, 448, 1024), (1, 2, 896, 896, 4096)],
    "qwen3-vl-2b": [(1, 1, 256, 256, 256), (2, 4, 512, 512, 1024), (1, 2, 1024, 1024, 4096)],
    "llava-1.5-7b": [(1, 1, 336, 336, 256), (2, 1, 336, 336, 1024), (1, 4, 336, 336, 2048)],
    "paligemma-3b": [(1, 1, 224, 224, 256), (2, 1, 224, 224, 1024), (1, 4, 224, 224, 2048)],
    "llava-next-qwen2-0.5b": [(1, 1, 336, 336, 256), (2, 1, 672, 672, 1024), (1, 2, 336, 1008, 2048)],
    "smolvlm-256m": [(1, 1, 512, 512, 256), (2, 1, 1024, 1024, 1024), (1, 4, 896, 896, 2048)],
    # a lone image is tiled (2 and 5 tower passes); four images in a sample are one crop each
    "llava-onevision-0.5b": [(1, 1, 384, 384, 256), (2, 1, 480, 640, 512), (1, 4, 384, 384, 1024)],
    "internvl3-1b": [(1, 1, 448, 448, 256), (2, 1, 480, 640, 1024), (1, 2, 896, 896, 2048)],
    # the last one is cut into crops: pan-and-scan on (_gemma3_passes)
    "gemma-3-4b": [(1, 1, 896, 896, 256), (2, 1, 896, 896, 1024), (1, 2, 896, 896, 2048), (1, 1, 896, 2048, 512)],
    "mistral-small-3.1-24b": [(1, 1, 224, 224, 256), (2, 2, 448, 448, 1024), (1, 4, 896, 672, 2048)],
}

# per arch with a video path: (batch, clips per sample, frames per clip, height, width, text tokens, clip fps);
# at 2 fps Qwen3-VL's processor keeps every frame (it samples at 2 fps), the others always do (their video
# processors' do_sample_frames is off)
VideoShape = tuple[int, int, int, int, int, int, float]
VIDEO_SHAPES: dict[str, list[VideoShape]] = {
    name: [(1, 1, 16, 448, 448, 256, 2.0), (2, 2, 8, 336, 336, 512, 2.0), (1, 4, 4, 224, 224, 1024, 2.0)]
    for name in ("qwen2-vl-2b", "qwen2.5-vl-3b", "qwen3-vl-2b", "llava-onevision-0.5b", "smolvlm2-256m")
}

TRAINS = ("full", "frozen-vision", "lora")
# how the step is written (NOTE [ Step shapes ] in tokenbucket.cost.hf_profile); the first of each is
# what every point without the field was measured under
AXES: dict[str, tuple[str, ...]] = {
    "loop": ("dropped", "held"),
    "use_cache": ("config", "off"),
    "kernels": ("cpu", "cuda"),
    "optimizer": ("adamw", "sgd"),
    "checkpointing": ("none", "vision", "backbone", "both"),
}
# checkpointing -> (vision tower, backbone)
CHECKPOINTING = {"none": (False, False), "vision": (True, False), "backbone": (False, True), "both": (True, True)}


def axes_of(p: dict[str, Any]) -> dict[str, str]:
    """A point's step-shape fields (the defaults where it has none)."""
    return {axis: str(p.get(axis, values[0])) for axis, values in AXES.items()}


SHARDINGS = ("none", "fsdp8")  # and "ddp8" (DistributedDataParallel over 8), with --sharding ddp8


def setups(name: str, shardings: Sequence[str] = SHARDINGS) -> list[tuple[str, str]]:
    """(train, sharding) pairs measured for ``name`` (frozen-vision only with a vision tower)."""
    trains = [t for t in TRAINS if t != "frozen-vision" or ARCHS[name][1] is not None]
    return [(t, s) for t in trains for s in shardings]


# -- image tokens, the way each processor counts them -----------------------------------------


def _qwen_grid(h: int, w: int) -> tuple[int, int]:
    """Patch grid (rows, cols) of one image: sides rounded to multiples of 28 (smart_resize)."""
    factor, min_pixels, max_pixels = 28, 56 * 56, 14 * 14 * 4 * 1280
    hb, wb = max(factor, round(h / factor) * factor), max(factor, round(w / factor) * factor)
    if hb * wb > max_pixels or hb * wb < min_pixels:
        raise ValueError(f"image {h}x{w} outside the Qwen2-VL pixel range")
    return hb // 14, wb // 14


def _qwen3_grid(h: int, w: int) -> tuple[int, int]:
    """Qwen3-VL's patch grid (rows, cols): Qwen2VLImageProcessor's smart_resize at 16-px patches (factor 32)
    under the published size {shortest_edge: 65536, longest_edge: 16777216}."""
    factor, min_pixels, max_pixels = 32, 65536, 16777216
    hb, wb = max(factor, round(h / factor) * factor), max(factor, round(w / factor) * factor)
    if hb * wb > max_pixels:
        beta = (h * w / max_pixels) ** 0.5
        hb, wb = (
            max(factor, math.floor(h / beta / factor) * factor),
            max(factor, math.floor(w / beta / factor) * factor),
        )
    elif hb * wb < min_pixels:
        beta = (min_pixels / (h * w)) ** 0.5
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hb // 16, wb // 16


# Qwen/Qwen3-VL-2B-Instruct's video_preprocessor_config.json (its fps 2, min_frames 4 and max_frames 768 are
# Qwen3VLVideoProcessor's own); the Qwen2 archs' clips get Qwen2VLVideoProcessor's defaults
QWEN3_VL_VIDEO_SIZE = {"shortest_edge": 4096, "longest_edge": 25165824}


def _sampled(name: str, frames: int, fps: float) -> int:
    """The frames a clip of ``frames`` frames at ``fps`` keeps: all of them (Qwen2VLVideoProcessor:
    do_sample_frames off), or Qwen3VLVideoProcessor's own ``sample_frames`` (2 fps, at least 4)."""
    if name != "qwen3-vl-2b":
        return frames
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    proc = types.SimpleNamespace(fps=Qwen3VLVideoProcessor.fps, min_frames=Qwen3VLVideoProcessor.min_frames,
                                 max_frames=Qwen3VLVideoProcessor.max_frames)  # fmt: skip
    meta = VideoMetadata(total_num_frames=frames, fps=fps)
    return len(Qwen3VLVideoProcessor.sample_frames(proc, meta))


def _video_grid(name: str, frames: int, h: int, w: int, fps: float) -> tuple[int, int, int]:
    """``video_grid_thw`` of one clip: the kept frames padded to pairs, each frame resized the way
    the video processor resizes it (transformers' own smart_resize, the video processors' default sizes)."""
    n = _sampled(name, frames, fps)
    if name == "qwen3-vl-2b":  # Qwen3VLVideoProcessor: the pixel bounds hold for the whole clip
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        size = QWEN3_VL_VIDEO_SIZE
        hb, wb = smart_resize(n, h, w, temporal_factor=2, factor=32, min_pixels=size["shortest_edge"],
                              max_pixels=size["longest_edge"])  # fmt: skip
        return -(-n // 2), hb // 16, wb // 16
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as frame_resize

    # Qwen2VLVideoProcessor's size: {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28} per frame
    hb, wb = frame_resize(h, w, factor=28, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28)
    return -(-n // 2), hb // 14, wb // 14


def _onevision_clip_tokens(config: Any, frames: int) -> int:
    """LLaVA-OneVision video tokens of one clip (LlavaOnevisionProcessor.replace_video_token: every
    frame kept, each pooled to half the tower's grid a side, and a newline)."""
    proc = _onevision_processor(config)
    proc.video_token = "<video>"
    side = config.vision_config.image_size
    inputs = {"pixel_values_videos": [torch.empty((frames, 3, side, side), device="meta")]}
    return len(proc.replace_video_token(inputs, 0)) // len("<video>")


def _smolvlm_clip_tokens(config: Any, frames: int) -> int:
    """SmolVLM2 image tokens of one clip: each frame one unsplit image of image_seq_len tokens
    (SmolVLMProcessor.replace_video_token's per-frame prompt; the timestamps are text)."""
    from transformers.models.smolvlm.processing_smolvlm import _prompt_single_image

    seq = (config.vision_config.image_size // config.vision_config.patch_size) ** 2 // config.scale_factor**2
    frame = _prompt_single_image(seq, fake_token_around_image="<f>", image_token="<i>", global_image_token="<g>")
    return frames * frame.count("<i>")


def clip_tokens(name: str, frames: int, h: int, w: int, fps: float) -> int:
    """LLM video tokens of one clip of ``frames`` frames of ``h`` x ``w`` at ``fps``."""
    config = build_config(name)
    if name == "llava-onevision-0.5b":
        return _onevision_clip_tokens(config, frames)
    if name == "smolvlm2-256m":
        return _smolvlm_clip_tokens(config, frames)
    gt, gh, gw = _video_grid(name, frames, h, w, fps)
    return gt * gh * gw // 4


def _next_patches(config: Any, h: int, w: int) -> tuple[int, tuple[int, int]]:
    """LLaVA-NeXT anyres: (number of 336 crops incl. the base image, best grid resolution)."""
    from transformers.image_processing_utils import select_best_resolution

    best = select_best_resolution((h, w), config.image_grid_pinpoints)
    size = config.vision_config.image_size
    return (best[0] // size) * (best[1] // size) + 1, best


def _next_tokens(config: Any, h: int, w: int) -> int:
    """LLaVA-NeXT image tokens (LlavaNextProcessor._get_number_of_features)."""
    side = config.vision_config.image_size // config.vision_config.patch_size
    _, (bh, bw) = _next_patches(config, h, w)
    ch, cw = bh // config.vision_config.image_size * side, bw // config.vision_config.image_size * side
    orig_ratio, cur_ratio = w / h, cw / ch
    if orig_ratio > cur_ratio:
        new_h = int(round(h * (cw / w), 7))
        ch -= 2 * ((ch - new_h) // 2)
    else:
        new_w = int(round(w * (ch / h), 7))
        cw -= 2 * ((cw - new_w) // 2)
    return ch * cw + ch + side * side  # unpadded grid, one newline per row, the base image


def _smol_tiles(h: int, w: int) -> int:
    """Idefics3 512-px tiles of one image (longest side resized to at most 2048), plus the global one."""
    scale = min(1.0, 2048 / max(h, w))
    rows, cols = -(-round(h * scale) // 512), -(-round(w * scale) // 512)
    return rows * cols + (1 if rows * cols > 1 else 0)


def _onevision_processor(config: Any) -> Any:
    """LlavaOnevisionProcessor without a tokenizer: its own counting (replace_image_token)."""
    proc = transformers.LlavaOnevisionProcessor.__new__(transformers.LlavaOnevisionProcessor)
    proc.image_processor = types.SimpleNamespace(image_grid_pinpoints=config.image_grid_pinpoints)
    proc.num_image_tokens = (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    proc.vision_feature_select_strategy = config.vision_feature_select_strategy
    proc.vision_aspect_ratio = config.vision_aspect_ratio
    proc.image_token = "<image>"
    return proc


def _onevision_tokens(config: Any, h: int, w: int, images: int) -> int:
    """LLaVA-OneVision image tokens of one of a sample's ``images`` images (only a lone one is tiled)."""
    side = config.vision_config.image_size
    inputs = {"batch_num_images": [images], "image_sizes": [[h, w]] * images,
              "pixel_values": [[torch.empty((3, side, side), device="meta")]]}  # fmt: skip
    return len(_onevision_processor(config).replace_image_token(inputs, 0)) // len("<image>")


def _internvl_tiles(h: int, w: int) -> int:
    """InternVL 448-px tiles of one image (1 to 12 of them), plus the thumbnail when there are several."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

    cols, rows = get_optimal_tiled_canvas((h, w), (448, 448), 1, 12)
    return cols * rows + (1 if cols * rows > 1 else 0)


def _gemma3_passes(h: int, w: int) -> int:
    """Gemma 3 tower passes of one image with pan-and-scan on (the processor's other defaults: crops
    of at least 256 px, at most 4, from a 1.2 aspect ratio): the image and its crops along the long side."""
    long, short = max(h, w), min(h, w)
    if long / short < 1.2:
        return 1
    n = min(4, max(2, min(long // 256, int(long / short + 0.5))))
    return 1 if min(-(-long // n), short) < 256 else 1 + n


def _pixtral_sides(h: int, w: int) -> tuple[int, int]:
    """Pixtral's resized sides: longest edge at most 1540 (floored), then up to multiples of 14 x 2."""
    scale = max(h / 1540, w / 1540)
    if scale > 1:
        h, w = int(h / scale), int(w / scale)
    return -(-h // 28) * 28, -(-w // 28) * 28


def image_tokens_per_image(name: str, config: Any, h: int, w: int, images: int = 1) -> int:
    """LLM tokens one of ``images`` images of ``h``×``w`` in a sample becomes (0 for text-only archs)."""
    if name in ("qwen2-vl-2b", "qwen2.5-vl-3b"):
        gh, gw = _qwen_grid(h, w)
        return gh * gw // 4
    if name == "qwen3-vl-2b":
        gh, gw = _qwen3_grid(h, w)
        return gh * gw // 4
    if name == "llava-1.5-7b":
        return (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    if name == "paligemma-3b":
        return (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    if name == "gemma-3-4b":
        return _gemma3_passes(h, w) * int(config.mm_tokens_per_image)
    if name == "llava-next-qwen2-0.5b":
        return _next_tokens(config, h, w)
    if name == "smolvlm-256m":
        per_tile = (config.vision_config.image_size // config.vision_config.patch_size) ** 2 // config.scale_factor**2
        return _smol_tiles(h, w) * per_tile
    if name == "llava-onevision-0.5b":
        return _onevision_tokens(config, h, w, images)
    if name == "internvl3-1b":  # 32 x 32 patches a tile, pixel-shuffled 2 x 2
        return _internvl_tiles(h, w) * 256
    if name == "mistral-small-3.1-24b":  # a row break after each row of merged patches, the last an end
        rh, rw = _pixtral_sides(h, w)
        return (rh // 28) * (rw // 28 + 1)
    return 0


# -- the model and its inputs ----------------------------------------------------------------


def _build_model(name: str, config: Any, train: str, checkpointing: str = "none") -> tuple[torch.nn.Module, list[str]]:
    """The bf16 model with ``train`` applied; returns it and the frozen module prefixes."""
    cls = getattr(transformers, ARCHS[name][0])
    # weights' values do not matter on fake tensors, and SigLIP's trunc_normal_ init reads them
    with default_dtype(torch.bfloat16), no_init_weights():
        model = cls(config)
        model.tie_weights()  # no_init_weights skips the tying that init does
        if name == "gemma-2-2b":  # NOTE [ Gemma 2 attention ]: built eager, run with sdpa
            model.config._attn_implementation = "sdpa"
        vision, backbone = CHECKPOINTING[checkpointing]
        return apply_training(  # type: ignore[no-any-return]
            model, ARCHS[name][1], train, vision_checkpointing=vision, backbone_checkpointing=backbone
        )


def _real_inputs(name: str, config: Any, shape: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Real small inputs (token ids, grids) and the fake-to-be ones as (shape, dtype) specs."""
    batch, images, h, w = shape["batch"], shape["images"], shape["height"], shape["width"]
    n_img, n_txt = shape["image_tokens"], shape["text_tokens"]
    length = n_img + n_txt
    real: dict[str, Any] = {}
    fake: dict[str, Any] = {}
    ids = torch.full((batch, length + shape.get("video_tokens", 0)), 100, dtype=torch.long)
    if shape.get("videos"):
        real.update(_video_inputs(name, config, shape, ids, fake))
    elif name in ("qwen2-vl-2b", "qwen2.5-vl-3b", "qwen3-vl-2b"):
        gh, gw = _qwen3_grid(h, w) if name == "qwen3-vl-2b" else _qwen_grid(h, w)
        patch = 16 if name == "qwen3-vl-2b" else 14
        per = gh * gw // 4
        row: list[int] = []
        for _ in range(images):
            row += [config.vision_start_token_id] + [config.image_token_id] * per + [config.vision_end_token_id]
        ids[:, : len(row)] = torch.tensor(row)
        grid = torch.tensor([[1, gh, gw]] * (images * batch), dtype=torch.long)
        pos = qwen_rope_positions(config.model_type, config, ids, config.image_token_id, grid)
        real.update(image_grid_thw=grid, position_ids=pos)
        fake["pixel_values"] = ((images * batch * gh * gw, 3 * 2 * patch * patch), torch.bfloat16)
    elif images:
        token = config.image_token_id if hasattr(config, "image_token_id") else config.image_token_index
        ids[:, :n_img] = token
        if name == "llava-next-qwen2-0.5b":
            crops, _ = _next_patches(config, h, w)
            real["image_sizes"] = torch.tensor([[h, w]] * (images * batch), dtype=torch.long)
            fake["pixel_values"] = ((images * batch, crops, 3, 336, 336), torch.bfloat16)
        elif name == "llava-onevision-0.5b":  # a lone image: the base image and its grid's crops
            crops = _next_patches(config, h, w)[0] if images == 1 else 1
            real["image_sizes"] = torch.tensor([[h, w]] * (images * batch), dtype=torch.long)
            real["batch_num_images"] = torch.tensor([images] * batch, dtype=torch.long)
            fake["pixel_values"] = ((images * batch, crops, 3, 384, 384), torch.bfloat16)
        elif name == "smolvlm-256m":  # NOTE [ Real bookkeeping tensors ]: Idefics3 reads its pixels
            tiles = _smol_tiles(h, w) * images
            real["pixel_values"] = torch.ones((batch, tiles, 3, 512, 512), dtype=torch.bfloat16)
            real["pixel_attention_mask"] = torch.ones((batch, tiles, 512, 512), dtype=torch.bool)
            fake["_pixels_held"] = ((batch, tiles, 3, 512, 512), torch.bfloat16)  # their bytes, counted
        elif name == "internvl3-1b":
            fake["pixel_values"] = ((_internvl_tiles(h, w) * images * batch, 3, 448, 448), torch.bfloat16)
        elif name == "mistral-small-3.1-24b":
            rh, rw = _pixtral_sides(h, w)
            real["image_sizes"] = torch.tensor([[rh, rw]] * (images * batch), dtype=torch.long)
            fake["pixel_values"] = ((images * batch, 3, rh, rw), torch.bfloat16)
        else:
            size = config.vision_config.image_size
            passes = _gemma3_passes(h, w) if name == "gemma-3-4b" else 1
            fake["pixel_values"] = ((passes * images * batch, 3, size, size), torch.bfloat16)
        if name == "paligemma-3b":
            tt = torch.zeros((batch, length), dtype=torch.long)
            tt[:, length // 2 :] = 1  # prefix (image + prompt) then suffix
            real["token_type_ids"] = tt
        if name == "gemma-3-4b":  # the image tokens attend both ways within an image
            tt = torch.zeros((batch, length), dtype=torch.long)
            tt[:, :n_img] = 1
            real["token_type_ids"] = tt
    real["input_ids"] = ids
    real["labels"] = ids.clone()
    return real, fake


def _video_inputs(
    name: str, config: Any, shape: dict[str, Any], ids: torch.Tensor, fake: dict[str, Any]
) -> dict[str, Any]:
    """A video processor's clips: their markers and video tokens placed in ``ids``, the pixels
    added to ``fake``; returns the real inputs (a Qwen grid, positions and Qwen2.5-VL's seconds
    per group; SmolVLM2's real pixels and mask)."""
    batch, videos, frames, fps = shape["batch"], shape["videos"], shape["frames"], shape["fps"]
    tokens = shape["video_tokens"]  # per sample
    if name == "llava-onevision-0.5b":  # LlavaOnevisionVideoProcessor: every frame at 384 x 384, one row a clip
        ids[:, :tokens] = config.video_token_id
        fake["pixel_values_videos"] = ((videos * batch, frames, 3, 384, 384), torch.bfloat16)
        return {}
    if name == "smolvlm2-256m":  # SmolVLMVideoProcessor: every frame one unsplit 512 px image
        ids[:, :tokens] = config.image_token_id
        count = videos * frames  # NOTE [ Real bookkeeping tensors ]: the model reads its pixels
        fake["_pixels_held"] = ((batch, count, 3, 512, 512), torch.bfloat16)
        return {
            "pixel_values": torch.ones((batch, count, 3, 512, 512), dtype=torch.bfloat16),
            "pixel_attention_mask": torch.ones((batch, count, 512, 512), dtype=torch.bool),
        }
    gt, gh, gw = _video_grid(name, frames, shape["height"], shape["width"], fps)
    per, patch = gh * gw // 4, 16 if name == "qwen3-vl-2b" else 14
    start, end, video = config.vision_start_token_id, config.vision_end_token_id, config.video_token_id
    row: list[int] = []
    for _ in range(videos):
        if name == "qwen3-vl-2b":  # Qwen3VLProcessor: "<t seconds>" and the group's tokens, per temporal group
            row += ([100, start] + [video] * per + [end]) * gt
        else:
            row += [start] + [video] * (gt * per) + [end]
    ids[:, : len(row)] = torch.tensor(row)
    grid = torch.tensor([[gt, gh, gw]] * (videos * batch), dtype=torch.long)
    real: dict[str, Any] = {"video_grid_thw": grid}
    if name == "qwen2.5-vl-3b":  # Qwen2_5_VLProcessor: temporal_patch_size / the sampled frames' fps
        real["second_per_grid_ts"] = torch.tensor([2 / (fps * _sampled(name, frames, fps) / frames)] * (videos * batch))
    real["position_ids"] = qwen_rope_positions(
        config.model_type, config, ids, config.image_token_id, None, video_token=video, video_grid=grid,
        second_per_grid_ts=real.get("second_per_grid_ts"),
    )  # fmt: skip
    fake["pixel_values_videos"] = ((videos * batch * gt * gh * gw, 3 * 2 * patch * patch), torch.bfloat16)
    return real


def video_record(name: str, shape: VideoShape) -> dict[str, Any]:
    """The shape fields of one video point: video_tokens and text_tokens are per sample."""
    batch, videos, frames, h, w, text, fps = shape
    return {
        "batch": batch,
        "images": 0,
        "videos": videos,
        "frames": frames,
        "fps": fps,
        "height": h,
        "width": w,
        "image_tokens": 0,
        "video_tokens": videos * clip_tokens(name, frames, h, w, fps),
        "text_tokens": text,
    }


def shape_record(name: str, shape: tuple[int, int, int, int, int], config: Any | None = None) -> dict[str, int]:
    """The shape fields of one point: image_tokens and text_tokens are per sample."""
    batch, images, h, w, text = shape
    config = config if config is not None else build_config(name)
    per = image_tokens_per_image(name, config, h, w, images) if images else 0
    return {
        "batch": batch,
        "images": images,
        "height": h,
        "width": w,
        "image_tokens": per * images,
        "text_tokens": text,
    }


def measure(
    name: str, train: str, sharding: str, shape: tuple[int, int, int, int, int] | dict[str, Any], steps: int = 1,
    **axes: str,
) -> dict[str, Any]:  # fmt: skip
    """``steps`` training steps of ``name`` at ``shape`` under ``train``/``sharding``; the point's record.

    One step has no optimizer state until its optimizer phase; from the second step on the
    states are live through forward and backward (the steady state a long run is in). ``axes``:
    how the step is written (``AXES``; the first value of each by default)."""
    unknown = set(axes) - set(AXES)
    if unknown:
        raise KeyError(f"unknown axes {sorted(unknown)}; the axes are {list(AXES)}")
    step = {**axes_of({}), **axes}
    start = time.perf_counter()
    config = build_config(name)
    fields = shape if isinstance(shape, dict) else shape_record(name, shape, config)
    real, fake_specs = _real_inputs(name, config, fields)
    sharded = {"none": "none", "fsdp8": "fsdp", "ddp8": "ddp"}[sharding]
    shape_of_step = StepShape(
        loop=step["loop"], use_cache=None if step["use_cache"] == "config" else False, kernels=step["kernels"],
        optimizer=step["optimizer"],
    )  # fmt: skip
    out = measure_step(
        lambda: _build_model(name, config, train, step["checkpointing"]), real, fake_specs, sharding=sharded,
        world_size=WORLD, steps=steps, shape=shape_of_step,
    )  # fmt: skip
    record: dict[str, Any] = {
        "arch": name,
        "model_type": config.model_type,
        "train": train,
        "sharding": sharding,
        "world": 1 if sharding == "none" else WORLD,
        "steps": steps,
        **step,
        **fields,
        "seq_len": int(real["input_ids"].shape[1]),
        **out,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
        "seconds": round(time.perf_counter() - start, 1),
    }
    return record


# -- the fixture -------------------------------------------------------------------------------


def _key(p: dict[str, Any]) -> tuple[Any, ...]:
    shape = (p["batch"], p["images"], p["height"], p["width"], p["text_tokens"])
    clips = (p.get("videos", 0), p.get("frames", 0), p.get("fps") or 0.0)  # (0, 0, 0.0): an image point
    return (p["arch"], p["train"], p["sharding"], *shape, p.get("steps", 1), *axes_of(p).values(), *clips)


def _axes_tag(axes: dict[str, str]) -> str:
    """``/loop=held/kernels=cuda`` for the axes off their default ('' when all are)."""
    return "".join(f"/{axis}={value}" for axis, value in axes.items() if value != AXES[axis][0])


def _tag(p: dict[str, Any]) -> str:
    shape: tuple[Any, ...] = (p["batch"], p["images"], p["height"], p["width"], p["text_tokens"])
    if p.get("videos"):  # (batch, clips, frames, height, width, text, fps)
        shape = ("video", p["batch"], p["videos"], p["frames"], p["height"], p["width"], p["text_tokens"], p["fps"])
    steps = "" if p.get("steps", 1) == 1 else f"/steps={p['steps']}"
    return f"{p['arch']}/{p['train']}/{p['sharding']}/{shape}{steps}{_axes_tag(axes_of(p))}"


def _write(path: Path, points: list[dict[str, Any]], failures: dict[str, str]) -> None:
    configs = {p["arch"]: build_config(p["arch"]).to_dict() for p in points}
    data = {
        "format": 1,
        "about": "bf16 training steps on FakeTensorMode (cpu), written as each point's loop, use_cache, kernels, "
        "optimizer and checkpointing say; see benchmarks/hf_truth.py",
        "configs": dict(sorted(configs.items())),
        "failures": dict(sorted(failures.items())),
        "points": sorted(({**p, **axes_of(p)} for p in points), key=_key),  # every point names its step shape
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def _load(path: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    if not path.exists():
        return [], {}
    data = json.loads(path.read_text())
    return list(data["points"]), dict(data.get("failures", {}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="arch name (repeatable)")
    parser.add_argument("--shapes", type=int, help="only each arch's first N shapes (the smallest)")
    parser.add_argument(
        "--sharding", action="append", choices=["none", "fsdp8", "ddp8"], help="only these (default none, fsdp8)"
    )
    parser.add_argument("--out", type=Path, default=FIXTURE)
    parser.add_argument("--steps", type=int, default=1, help="training steps per point (2: the steady state)")
    parser.add_argument("--merge", nargs="+", type=Path, help="merge these fixture files into --out")
    parser.add_argument("--missing-reason", help="with --merge: record planned points not measured, with this reason")
    parser.add_argument("--train", action="append", choices=TRAINS, help="only these training setups")
    parser.add_argument("--video", action="store_true", help="measure each arch's VIDEO_SHAPES (clips) instead")
    for axis, values in AXES.items():
        parser.add_argument(
            f"--{axis.replace('_', '-')}", action="append", choices=values,
            help=f"how the step is written (repeatable; default {values[0]})",
        )  # fmt: skip
    args = parser.parse_args(argv)
    chosen = {axis: getattr(args, axis) or [values[0]] for axis, values in AXES.items()}
    combos = [dict(zip(chosen, vals, strict=True)) for vals in itertools.product(*chosen.values())]
    if args.merge:
        points, failures = [], {}
        for path in args.merge:
            p, f = _load(path)
            points += p
            failures.update(f)
        done = {_key(p): p for p in points}
        measured = {_tag(p) for p in done.values()}
        failures = {k: v for k, v in failures.items() if k not in measured}
        if args.missing_reason:  # planned points that were not measured, and why
            for name in ARCHS:
                for shape in SHAPES.get(name, []):  # (an arch of clips only has none)
                    for train, sharding in setups(name):
                        tag = f"{name}/{train}/{sharding}/{shape}"
                        if tag not in measured:
                            failures.setdefault(tag, args.missing_reason)
        _write(args.out, list(done.values()), failures)
        print(f"{len(done)} points -> {args.out}")
        return
    points, failures = _load(args.out)
    done = {_key(p): p for p in points}
    table: dict[str, list[Any]] = dict(VIDEO_SHAPES) if args.video else dict(SHAPES)
    for name in args.only or list(table):
        for shape in table[name][: args.shapes]:  # every setup at the small shape first
            for (train, sharding), axes in itertools.product(setups(name, args.sharding or SHARDINGS), combos):
                if args.train and train not in args.train:
                    continue
                fields = video_record(name, shape) if args.video else shape_record(name, shape)
                planned = {"arch": name, "train": train, "sharding": sharding, **fields, "steps": args.steps, **axes}
                key = _key(planned)
                if key in done:
                    continue
                tag = _tag(planned)
                try:
                    rec = measure(name, train, sharding, fields, args.steps, **axes)
                except Exception as exc:  # record why and keep the rest
                    failures[tag] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    print(f"FAIL {tag}: {failures[tag]}", flush=True)
                    _write(args.out, list(done.values()), failures)
                    continue
                failures.pop(tag, None)
                done[key] = rec
                _write(args.out, list(done.values()), failures)
                print(f"{tag}: peak {rec['peak_bytes'] / 2**30:.2f} GiB, {rec['seconds']} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
