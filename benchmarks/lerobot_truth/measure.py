"""Measured training peaks of LeRobot's own VLA policies on fake tensors: the policy truth set.

Command (what ``tests/data/lerobot_truth.json`` comes from; no GPU, no weights downloaded):

    bash benchmarks/lerobot_truth/build.sh                                   # its own environment
    benchmarks/lerobot_truth/.venv/bin/python benchmarks/lerobot_truth/measure.py          # everything
    benchmarks/lerobot_truth/.venv/bin/python benchmarks/lerobot_truth/measure.py --planner  # + the planner's shapes
    benchmarks/lerobot_truth/.venv/bin/python benchmarks/lerobot_truth/measure.py \
        --policy pi0 --variant full --batch 1 --batch 4 --out /tmp/pi0.json
    python3 benchmarks/lerobot_truth/measure.py --table                     # the fixture as a table

Each point builds LeRobot 0.4.4's policy class (``PI0Policy``, ``PI05Policy``, ``SmolVLAPolicy``)
from its config class with the published defaults, except the precision: ``dtype="bfloat16"``
(pi0 / pi0.5 default to float32 in the config class; their training recipes and released
checkpoints run bf16, with LeRobot's own list of parameters kept in float32). The build runs
under ``FakeTensorMode`` on ``cpu``: every parameter, activation and optimizer state is a fake
tensor with a shape, a dtype and no data, so a 3B-parameter policy steps in seconds on a CPU.

The step is LeRobot's ``update_policy`` (``lerobot/scripts/lerobot_train.py``): ``policy.train()``,
``loss, _ = policy.forward(batch)``, ``loss.backward()``, ``clip_grad_norm_`` over the policy's
parameters, ``optimizer.step()``, ``optimizer.zero_grad()``; the optimizer is the policy's own
preset (``config.get_optimizer_preset()``: AdamW) built with ``foreach=True``, as PyTorch picks it
on a CUDA device. Two steps run; the recorded peak is the second step's (the steady state: the
AdamW states are live through forward and backward). The first step runs untracked; the
tracker then takes the policy, the optimizer (its states) and the batch, and follows the second
step phase by phase (forward, backward, optimizer). The batch is what LeRobot's preprocessor
hands the policy: three float32 camera images of 3 x 224 x 224 in [0, 1], a float32 state of
``max_state_dim``, a float32 action chunk of ``chunk_size x max_action_dim``, and 48 language
tokens with their mask (pi0.5's default ``tokenizer_max_length`` is 200: its prompt carries the
discretised state; a point says the length it ran).

The peak of live tensor bytes comes from PyTorch's ``MemTracker`` (parameters, buffers,
gradients, activations, temporaries and optimizer states, each storage counted once), with two
changes: its per-module peak bookkeeping is skipped (only the whole-step peak is read, and the
per-module loop over every tracked module at every op is most of the tracker's time), and a
module called again in the same forward (a tower run once per camera) starts its module stats
anew instead of being refused as a new iteration (LeRobot calls ``policy.forward``, not
``policy(...)``, so the tracker sees no root module).

Attention: pi0 / pi0.5 / SmolVLA run their backbone + expert attention as explicit matmuls and a
float32 softmax (their own ``eager_attention_forward``), so it runs here as on a GPU. The vision
towers call ``F.scaled_dot_product_attention``; ``--kernels cuda`` (the default) routes a call
without a mask to the CUDA flash kernel's meta function (head dim padded to a multiple of 8, as
the CUDA dispatcher pads it) and a call with a mask to the memory-efficient kernel's (the mask as
an additive bias), which is what a GPU keeps for backward; ``--kernels cpu`` leaves the CPU
kernels.

What this script patches, and why (nothing else is touched):
- ``.item()`` / ``.tolist()`` / ``.numpy()`` on a fake tensor return zeros: the policies log
  their loss with them (``loss_dict``); a fake tensor has no value to read.
- SmolVLA: ``AutoConfig`` / ``AutoModelForImageTextToText.from_pretrained`` /
  ``AutoProcessor.from_pretrained`` of ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct`` would
  download; the config is built in code from that checkpoint's published ``config.json`` values
  (``smolvlm2_500m_config``), the VLM is built from it in bf16 as ``from_pretrained(...,
  torch_dtype="bfloat16")`` builds it (``load_vlm_weights=True``: the path that fine-tunes from
  the VLM), and the processor is a stand-in holding the two image token ids the policy reads.
- SmolVLM's patch positions are given (NOTE [ SmolVLM patch positions ]).
- ``Module.to(dtype)`` of a fake parameter (NOTE [ Fake parameters' dtype change ]).
- torch.distributions' argument checks are off (the flow-matching time's Beta distribution
  reads its parameters' values).
- torchvision is stood in for (NOTE [ No torchvision ]), and LeRobot is told transformers is
  installed (the pi fork's distribution is named transformers-openpi).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import platform
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent.parent / "tests" / "data" / "lerobot_truth.json"
SMOLVLA_SITE = HERE / ".venv" / "smolvla-site"
POLICIES = ("pi0", "pi05", "smolvla")
VARIANTS = {
    # published defaults first; the frozen variants where the config class has the flags
    "pi0": ("full", "freeze_vision_encoder", "train_expert_only"),
    "pi05": ("full", "freeze_vision_encoder", "train_expert_only"),
    # SmolVLA's published default is freeze_vision_encoder=True, train_expert_only=True
    "smolvla": ("default", "unfrozen_vlm", "full"),
}
BATCHES = (1, 4, 16, 32, 64)
_FULL_4_16 = ["--variant", "full", "--batch", "4", "--batch", "16"]
# the planner's shapes (`plan --lerobot-policy`): batches holding fewer cameras than the policy's
# features, 480 x 640 frames as a dataset hands them over, pi0.5's language at its own 200 tokens
PLANNER = [
    *(["--policy", "pi0", *_FULL_4_16, "--present", str(n), "--frame", "480x640"] for n in (1, 2, 3)),
    ["--policy", "pi0", "--variant", "full", "--batch", "16", "--present", "1"],
    ["--policy", "pi05", *_FULL_4_16, "--text-tokens", "200"],
    [
        "--policy",
        "pi05",
        "--variant",
        "full",
        "--batch",
        "16",
        "--text-tokens",
        "200",
        "--present",
        "2",
        "--frame",
        "480x640",
    ],
    *(
        [
            "--policy",
            "smolvla",
            "--variant",
            "default",
            "--batch",
            "4",
            "--batch",
            "16",
            "--present",
            str(n),
            "--frame",
            "480x640",
        ]
        for n in (1, 2, 3)
    ),
]
CAMERAS = 3
IMAGE_SIZE = 224
TEXT_TOKENS = 48


# -- the policies, as their config classes build them ----------------------------------------


def _flags(policy: str, variant: str) -> dict[str, bool]:
    if policy == "smolvla":
        return {
            "default": {"freeze_vision_encoder": True, "train_expert_only": True},
            "unfrozen_vlm": {"freeze_vision_encoder": True, "train_expert_only": False},
            "full": {"freeze_vision_encoder": False, "train_expert_only": False},
        }[variant]
    return {
        "full": {"freeze_vision_encoder": False, "train_expert_only": False},
        "freeze_vision_encoder": {"freeze_vision_encoder": True, "train_expert_only": False},
        "train_expert_only": {"freeze_vision_encoder": False, "train_expert_only": True},
    }[variant]


def _features(config: Any, state_dim: int, action_dim: int, slots: int = CAMERAS) -> None:
    from lerobot.configs.types import FeatureType, PolicyFeature

    config.input_features = {
        f"observation.images.camera{i}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, IMAGE_SIZE, IMAGE_SIZE))
        for i in range(slots)
    }
    config.input_features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    config.output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}


def smolvlm2_500m_config() -> Any:
    """``HuggingFaceTB/SmolVLM2-500M-Video-Instruct``'s config, from its published ``config.json``
    values (SmolLM2-360M text model, SigLIP-B/16 at 512 px, pixel shuffle 4)."""
    import transformers

    text = {
        "model_type": "llama", "hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
        "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64, "vocab_size": 49280,
        "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "pad_token_id": 2, "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    vision = {
        "model_type": "smolvlm_vision", "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 12, "patch_size": 16, "image_size": 512, "num_channels": 3,
        "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
    }  # fmt: skip
    return transformers.SmolVLMConfig(
        text_config=text, vision_config=vision, scale_factor=4, image_token_id=49190, vocab_size=49280,
        tie_word_embeddings=False,
    )  # fmt: skip


@contextlib.contextmanager
def _smolvlm_offline() -> Iterator[None]:
    """SmolVLA's VLM built in code (module docstring), not downloaded."""
    import torch
    import transformers
    from lerobot.policies.smolvla import smolvlm_with_expert as swe

    def vlm_from_pretrained(model_id: str, torch_dtype: Any = None, **_: Any) -> Any:
        config = smolvlm2_500m_config()
        dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
        for node in (config, config.text_config, config.vision_config):  # from_pretrained sets every sub-config's
            node.torch_dtype = dtype
        model = transformers.SmolVLMForConditionalGeneration._from_config(config, torch_dtype=dtype)
        model.eval()  # from_pretrained hands the model back in eval mode
        return model

    tokenizer = types.SimpleNamespace(fake_image_token_id=49189, global_image_token_id=49152)
    saved = (swe.AutoModelForImageTextToText, swe.AutoConfig, swe.AutoProcessor)
    swe.AutoModelForImageTextToText = types.SimpleNamespace(from_pretrained=vlm_from_pretrained)
    swe.AutoConfig = types.SimpleNamespace(from_pretrained=lambda *_a, **_k: smolvlm2_500m_config())
    swe.AutoProcessor = types.SimpleNamespace(
        from_pretrained=lambda *_a, **_k: types.SimpleNamespace(tokenizer=tokenizer)
    )
    try:
        yield
    finally:
        swe.AutoModelForImageTextToText, swe.AutoConfig, swe.AutoProcessor = saved


@contextlib.contextmanager
def _set_data_for_fake_params() -> Iterator[None]:
    """NOTE [ Fake parameters' dtype change ]: ``Module.to(dtype)`` (pi0 / pi0.5 call
    ``self.to(dtype=torch.bfloat16)``) swaps a fake parameter's payload with ``swap_tensors``,
    which torch refuses for a fake tensor that has a weak reference (every one here does); a
    refused swap of a ``Parameter`` falls back to ``param.data = new``, PyTorch's path for ordinary
    tensors: the same parameter object (ties kept) with the new dtype's storage."""
    import torch
    import torch.utils

    orig = torch.utils.swap_tensors

    def swap(t1: Any, t2: Any) -> None:
        try:
            orig(t1, t2)
        except RuntimeError:
            if not isinstance(t1, torch.nn.Parameter):
                raise
            t1.data = t2.data

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = orig


@contextlib.contextmanager
def _full_patch_grid_positions(policy: str) -> Iterator[None]:
    """NOTE [ SmolVLM patch positions ]: SmolVLM's vision embeddings place each patch by reading
    its patch mask (``p_attn_mask.sum()``, then ``arange`` over the count and a boolean scatter),
    which a fake tensor cannot answer. SmolVLA never pads an image (it resizes every camera to the
    tower's 512 x 512 and passes no mask, so the tower makes an all-ones one): every patch is
    present and its position is its index, 0 .. n-1. The embeddings run their own patch
    convolution and position embedding; only the positions are given (as one ``arange``
    broadcast over the batch rather than the tower's B x n ``torch.full``: n int64 per image
    less, 8 KB each)."""
    if policy != "smolvla":
        yield
        return
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers.models.smolvlm import modeling_smolvlm

    cls = modeling_smolvlm.SmolVLMVisionEmbeddings
    orig = cls.forward

    def forward(self: Any, pixel_values: Any, patch_attention_mask: Any) -> Any:
        if not isinstance(patch_attention_mask, FakeTensor):
            return orig(self, pixel_values, patch_attention_mask)
        embeddings = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        n = embeddings.shape[1]
        if n != self.num_patches_per_side**2:
            raise AssertionError(f"SmolVLA's images fill the tower's grid; got {n} patches")
        position_ids = torch.arange(n, device=pixel_values.device).expand(pixel_values.shape[0], n)
        return embeddings + self.position_embedding(position_ids)

    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = orig


def build_policy(policy: str, variant: str, slots: int = CAMERAS) -> tuple[Any, dict[str, Any]]:
    """LeRobot's policy with its published defaults (bf16 for pi0 / pi0.5) and ``slots`` camera
    features, and its config values."""
    with _set_data_for_fake_params():
        return _build_policy(policy, variant, slots)


def _build_policy(policy: str, variant: str, slots: int) -> tuple[Any, dict[str, Any]]:
    flags = _flags(policy, variant)
    if policy == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy

        config = PI0Config(dtype="bfloat16", device="cpu", **flags)
        _features(config, config.max_state_dim, config.max_action_dim, slots)
        return PI0Policy(config), _config_record(config)
    if policy == "pi05":
        from lerobot.policies.pi05.configuration_pi05 import PI05Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy

        config = PI05Config(dtype="bfloat16", device="cpu", **flags)
        _features(config, config.max_state_dim, config.max_action_dim, slots)
        return PI05Policy(config), _config_record(config)
    if policy == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

        config = SmolVLAConfig(device="cpu", load_vlm_weights=True, **flags)
        _features(config, config.max_state_dim, config.max_action_dim, slots)
        with _smolvlm_offline():
            built = SmolVLAPolicy(config)
        return built, _config_record(config)
    raise ValueError(f"policy should be one of {list(POLICIES)}, but got policy={policy!r}")


def _config_record(config: Any) -> dict[str, Any]:
    keys = (
        "type", "dtype", "chunk_size", "max_state_dim", "max_action_dim", "tokenizer_max_length",
        "paligemma_variant", "action_expert_variant", "freeze_vision_encoder", "train_expert_only",
        "train_state_proj", "gradient_checkpointing", "vlm_model_name", "load_vlm_weights", "attention_mode",
        "num_vlm_layers", "num_expert_layers", "self_attn_every_n_layers", "expert_width_multiplier",
        "resize_imgs_with_padding", "image_resolution", "empty_cameras",
    )  # fmt: skip
    out: dict[str, Any] = {}
    for k in keys:
        if k == "type":
            out[k] = config.type
        elif hasattr(config, k):
            v = getattr(config, k)
            out[k] = list(v) if isinstance(v, tuple) else v
    return out


def make_batch(
    config: Any, batch: int, text_tokens: int, present: int | None = None, frame: tuple[int, int] | None = None
) -> dict[str, Any]:
    """What LeRobot's preprocessor hands the policy (module docstring), as fake tensors: the first
    ``present`` camera features (default: all) as float32 frames of ``frame`` (default 224 x 224);
    the policy pads the missing ones as it pads them (pi0 / pi0.5 every one, SmolVLA up to its
    ``empty_cameras``)."""
    import torch

    h, w = frame or (IMAGE_SIZE, IMAGE_SIZE)
    out: dict[str, Any] = {}
    keys = list(config.image_features)
    for key in keys[: len(keys) if present is None else present]:
        out[key] = torch.rand(batch, 3, h, w, dtype=torch.float32)
    out["observation.state"] = torch.randn(batch, config.max_state_dim, dtype=torch.float32)
    out["action"] = torch.randn(batch, config.chunk_size, config.max_action_dim, dtype=torch.float32)
    out["observation.language.tokens"] = torch.zeros(batch, text_tokens, dtype=torch.long)
    out["observation.language.attention_mask"] = torch.ones(batch, text_tokens, dtype=torch.bool)
    return out


# -- counts -----------------------------------------------------------------------------------


def param_counts(model: Any) -> dict[str, Any]:
    """Parameters (each tensor once), trainable ones, and the split per dtype (counts and bytes)."""
    seen: set[int] = set()
    total = trainable = 0
    split: dict[str, dict[str, int]] = {}
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel()
        total += n
        trainable += n if p.requires_grad else 0
        d = split.setdefault(str(p.dtype).removeprefix("torch."), {"params": 0, "bytes": 0, "trainable": 0})
        d["params"] += n
        d["bytes"] += n * p.element_size()
        d["trainable"] += n if p.requires_grad else 0
    return {"params_total": total, "params_trainable": trainable, "dtype_split": dict(sorted(split.items()))}


def grad_counts(model: Any) -> dict[str, int]:
    """After a backward: trainable parameters that got a gradient, and those that never do."""
    with_grad = without = 0
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                without += p.numel()
            else:
                with_grad += p.numel()
    return {"params_with_grad": with_grad, "params_trainable_without_grad": without}


# -- the fake-tensor step ---------------------------------------------------------------------


@contextlib.contextmanager
def _no_value_reads() -> Iterator[None]:
    """``.item()`` / ``.tolist()`` / ``.numpy()`` of a fake tensor answer zeros (module docstring)."""
    import numpy as np
    from torch._subclasses.fake_tensor import FakeTensor

    def zeros(self: Any) -> Any:
        return np.zeros(tuple(self.shape), dtype=np.float32)

    saved = {name: FakeTensor.__dict__.get(name) for name in ("item", "tolist", "numpy")}
    FakeTensor.item = lambda self: 0.0  # type: ignore[method-assign]
    FakeTensor.tolist = lambda self: zeros(self).tolist()  # type: ignore[method-assign]
    FakeTensor.numpy = zeros  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, orig in saved.items():
            if orig is None:
                delattr(FakeTensor, name)
            else:
                setattr(FakeTensor, name, orig)


def _cuda_sdpa(
    query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
    scale: float | None = None, enable_gqa: bool = False,
) -> Any:  # fmt: skip
    """``F.scaled_dot_product_attention`` as PyTorch's CUDA dispatcher runs it, through the CUDA
    kernels' meta functions: with a mask, the memory-efficient kernel; without one, flash where
    it takes the call (bf16 / fp16, head dim <= 256, same K/V heads); else as it is."""
    import torch
    import torch.nn.functional as F

    head = query.shape[-1]
    low = query.dtype in (torch.bfloat16, torch.float16)
    same_heads = query.dim() == 4 and key.dim() == 4 and key.shape[-3] == query.shape[-3]
    if attn_mask is not None and same_heads and head % (8 if low else 4) == 0:
        # the memory-efficient kernel: a boolean mask becomes an additive bias of the query's
        # dtype, its last dimension padded to a multiple of 16 (kept for backward)
        bias = attn_mask
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill_(bias.logical_not(), float("-inf"))
        last = bias.shape[-1]
        if last % 16:
            bias = F.pad(bias, (0, 16 - last % 16))[..., :last]
        grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, grad, dropout_p, is_causal, scale=scale
        )[0]
    flash_ok = (
        query.dtype in (torch.bfloat16, torch.float16) and attn_mask is None and head <= 256
        and value.shape[-1] == head and query.dim() == 4 and key.shape[-3] == query.shape[-3]
    )  # fmt: skip
    if not flash_ok:
        return _ORIG_SDPA[0](query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    scale = head**-0.5 if scale is None else scale
    pad = (-head) % 8
    q, k, v = (F.pad(x, (0, pad)) if pad else x for x in (query, key, value))
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    return out[..., :head] if pad else out


_ORIG_SDPA: list[Any] = []


@contextlib.contextmanager
def _kernels(kind: str) -> Iterator[None]:
    import torch.nn.functional as F

    if kind == "cpu":
        yield
        return
    _ORIG_SDPA[:] = [F.scaled_dot_product_attention]
    F.scaled_dot_product_attention = _cuda_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _ORIG_SDPA[0]


class _NoHook:
    def remove(self) -> None:
        pass


def _whole_step_peaks_only(tracker: Any) -> None:
    """The tracker's peak without its per-module bookkeeping (module docstring)."""
    from copy import deepcopy

    def update(self: Any, _peak_state: Any) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = deepcopy(snap)

    tracker._update_peak_stats = types.MethodType(update, tracker)

    # LeRobot calls ``policy.forward(batch)`` (not ``policy(batch)``) and the policies call their
    # towers as methods, so a tower run once per camera looks to the tracker like a new iteration
    # of a root module, which it refuses; a repeated forward call starts the module's stats anew.
    pre_fw = tracker._pre_fw_hook

    def pre_fw_again(module: Any, inputs: Any) -> None:
        if module in tracker.memory_tracking and not tracker._mod_tracker.is_bw:
            del tracker.memory_tracking[module]
        pre_fw(module, inputs)

    tracker._pre_fw_hook = pre_fw_again


def _restart_peak(tracker: Any) -> None:
    from copy import deepcopy

    snap = tracker.get_tracker_snapshot()
    tracker._peak_mem = {dev: s["Total"] for dev, s in snap.items()}
    tracker._peak_mem_snap = deepcopy(snap)


def _peak(tracker: Any) -> tuple[int, dict[str, int]]:
    peak = tracker.get_tracker_snapshot("peak")
    total = sum(s["Total"] for s in peak.values())
    breakdown: dict[str, int] = {}
    for s in peak.values():
        for k, v in s.items():
            name = str(getattr(k, "name", k))
            breakdown[name] = breakdown.get(name, 0) + int(v)
    return int(total), breakdown


def measure(
    policy: str,
    variant: str,
    batch: int,
    text_tokens: int,
    kernels: str,
    steps: int = 2,
    *,
    slots: int = CAMERAS,
    present: int | None = None,
    frame: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One point: ``steps`` LeRobot training steps; the peak of the last one (module docstring).
    ``slots``, ``present``, ``frame``: the policy's camera features, how many of them the batch
    holds, and their frame size (``make_batch``)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    t0 = time.perf_counter()
    # the flow-matching time is drawn from a Beta distribution, whose argument checks read values
    torch.distributions.Distribution.set_default_validate_args(False)
    with FakeTensorMode(allow_non_fake_inputs=True), _kernels(kernels), _full_patch_grid_positions(policy):
        model, config = build_policy(policy, variant, slots)
        counts = param_counts(model)
        inputs = make_batch(model.config, batch, text_tokens, present, frame)
        preset = model.config.get_optimizer_preset()  # LeRobot's make_optimizer_and_scheduler
        opt = torch.optim.AdamW(
            model.get_optim_params(), lr=preset.lr, betas=preset.betas, eps=preset.eps,
            weight_decay=preset.weight_decay, foreach=True,
        )  # fmt: skip

        def step(tracker: Any | None) -> None:
            """LeRobot's ``update_policy``; with a tracker, each phase's peak is read."""
            model.train()
            if tracker is not None:
                _restart_peak(tracker)
            with _no_value_reads():  # only the policy's logging reads values
                loss, _ = model.forward(inputs)
            if tracker is not None:
                phases["forward"], breakdowns["forward"] = _peak(tracker)
                _restart_peak(tracker)
            loss.backward()
            if tracker is not None:
                phases["backward"], breakdowns["backward"] = _peak(tracker)
                grads.update(grad_counts(model))
                _restart_peak(tracker)
            torch.nn.utils.clip_grad_norm_(model.parameters(), preset.grad_clip_norm)
            opt.step()
            opt.zero_grad()
            del loss  # update_policy reads loss.item() after the step
            if tracker is not None:
                phases["optimizer"], breakdowns["optimizer"] = _peak(tracker)

        phases: dict[str, int] = {}
        breakdowns: dict[str, dict[str, int]] = {}
        grads: dict[str, int] = {}
        for _ in range(steps - 1):  # untracked: nothing of it is live at the next step but the states
            step(None)
        tracker = MemTracker()
        _whole_step_peaks_only(tracker)
        for p in model.parameters():  # register_hook raises on a frozen parameter
            if not p.requires_grad:
                tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        tracker.track_external(model, opt, *inputs.values())
        with tracker:
            step(tracker)
        phase = max(phases, key=lambda k: phases[k])
    return {
        "policy": policy,
        "variant": variant,
        "batch": batch,
        "cameras": slots,
        "image_size": IMAGE_SIZE,
        "text_tokens": text_tokens,
        # a point with fewer cameras in the batch than the policy has, or frames of another size
        **({"present": present} if present is not None and present != slots else {}),
        **({"frame": list(frame)} if frame is not None and tuple(frame) != (IMAGE_SIZE, IMAGE_SIZE) else {}),
        "kernels": kernels,
        "steps": steps,
        "peak_bytes": phases[phase],
        "peak_phase": phase,
        "peak_breakdown": breakdowns[phase],
        "phase_peaks": phases,
        **counts,
        **grads,
        "config": config,
        "seconds": round(time.perf_counter() - t0, 1),
    }


# -- driver ------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    import lerobot
    import torch
    import transformers

    return {
        "lerobot": lerobot.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "transformers_dist": _dist_name(),
        "python": platform.python_version(),
    }


def _dist_name() -> str:
    from importlib import metadata

    import transformers

    where = Path(transformers.__file__).resolve().parent.parent
    for dist in metadata.distributions(path=[str(where)]):
        names = {Path(str(f)).parts[0] for f in (dist.files or [])}
        if "transformers" in names:
            return f"{dist.metadata['Name']}=={dist.version}"
    return "unknown"


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty ``torchvision`` modules (NOTE [ No torchvision ])."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def placeholder(attr: str) -> type:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {"__init__": lambda self, *a, **k: None})

        module.__getattr__ = placeholder  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def worker(args: argparse.Namespace) -> None:
    """One policy in this process (its transformers is the one on ``sys.path``)."""
    # NOTE [ No torchvision ]: LeRobot imports torchvision at module level in its dataset and
    # processor modules (image transforms for data loading), never in the policies' code. PyPI's
    # Linux torchvision is built against the CUDA torch and cannot load its operators beside the
    # CPU torch (``operator torchvision::nms does not exist`` at import), so it is not installed
    # and its imports get empty stand-in modules; nothing a policy runs comes from them.
    sys.meta_path.insert(0, _TorchvisionStandIn())
    # LeRobot asks package metadata for a distribution named "transformers"; the pi fork's wheel
    # is named transformers-openpi (it installs the same ``transformers`` package), so LeRobot
    # would take transformers for missing. It is importable, and is said to be.
    from lerobot.utils import import_utils

    import_utils._transformers_available = True
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import warnings

    warnings.simplefilter("ignore")
    points: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    (policy,) = args.policy
    for variant in args.variant or VARIANTS[policy]:
        for batch in args.batch or BATCHES:
            tag = f"{policy}/{variant}/b{batch}"
            try:
                rec = measure(
                    policy, variant, batch, args.text_tokens, args.kernels,
                    slots=args.slots, present=args.present, frame=args.frame,
                )  # fmt: skip
            except Exception as exc:  # a point that cannot run is recorded with its reason
                if os.environ.get("LEROBOT_TRUTH_RAISE"):
                    raise
                failures[tag] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                print(f"{tag}: FAILED {failures[tag]}", file=sys.stderr, flush=True)
                continue
            rec["versions"] = versions()
            points.append(rec)
            gib = rec["peak_bytes"] / 2**30
            print(f"{tag}: {gib:.3f} GiB ({rec['peak_phase']}) in {rec['seconds']} s", file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps({"points": points, "failures": failures}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", choices=POLICIES, help="repeatable; default: all")
    parser.add_argument("--variant", action="append", help="repeatable; default: the policy's VARIANTS")
    parser.add_argument("--batch", action="append", type=int, help="repeatable; default: 1 4 16 32 64")
    parser.add_argument("--text-tokens", type=int, default=TEXT_TOKENS)
    parser.add_argument("--kernels", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--slots", type=int, default=CAMERAS, help="the policy's camera features (default 3)")
    parser.add_argument("--present", type=int, help="of them, the cameras the batch holds (default: all)")
    parser.add_argument("--frame", type=_frame, help="the batch's frame size HxW (default 224x224)")
    parser.add_argument("--out", default=str(FIXTURE))
    parser.add_argument("--table", action="store_true", help="print --out's points as a Markdown table")
    parser.add_argument("--planner", action="store_true", help="measure the planner's shapes (PLANNER) into --out")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.out).read_text())["points"]))
        return
    if args.worker:
        worker(args)
        return
    if args.planner:
        for extra in PLANNER:
            main([*extra, "--out", args.out])
        return
    merged: dict[str, Any] = {"points": [], "failures": {}}
    out = Path(args.out)
    if out.exists():  # points measured before and not re-measured now are kept
        merged = json.loads(out.read_text())
    for policy in args.policy or POLICIES:
        tmp = out.with_suffix(f".{policy}.tmp.json")
        cmd = [sys.executable, __file__, "--worker", "--policy", policy, "--out", str(tmp)]
        cmd += [x for v in args.variant or () for x in ("--variant", v)]
        cmd += [x for b in args.batch or () for x in ("--batch", str(b))]
        cmd += ["--text-tokens", str(args.text_tokens), "--kernels", args.kernels, "--slots", str(args.slots)]
        cmd += [] if args.present is None else ["--present", str(args.present)]
        cmd += [] if args.frame is None else ["--frame", "{}x{}".format(*args.frame)]
        env = dict(os.environ)
        if policy == "smolvla":  # LeRobot's transformers for SmolVLA (requirements-smolvla.txt)
            env["PYTHONPATH"] = os.pathsep.join([str(SMOLVLA_SITE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        subprocess.run(cmd, env=env, check=True)
        got = json.loads(tmp.read_text())
        tmp.unlink()
        new = {_key(p) for p in got["points"]}
        merged["points"] = [p for p in merged["points"] if _key(p) not in new] + got["points"]
        for tag in list(merged["failures"]):
            if tag.startswith(f"{policy}/"):
                del merged["failures"][tag]
        merged["failures"].update(got["failures"])
    merged["points"].sort(key=_key)
    merged["about"] = (
        "LeRobot policies' training peaks (two AdamW steps, the second's peak) on FakeTensorMode (cpu); "
        "see benchmarks/lerobot_truth/measure.py"
    )
    out.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"wrote {len(merged['points'])} points to {out}", file=sys.stderr)


def _frame(text: str) -> tuple[int, int]:
    h, _, w = text.partition("x")
    return int(h), int(w)


def table(points: list[dict[str, Any]]) -> str:
    """The points as a Markdown table: peak GiB per batch, parameters, trainable, with a gradient, float32."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for p in sorted(points, key=_key):
        if "present" in p or "frame" in p or p["text_tokens"] != TEXT_TOKENS:  # the planner's points
            continue
        row = rows.setdefault((p["policy"], p["variant"]), {"p": p, "peaks": {}})
        row["peaks"][p["batch"]] = p["peak_bytes"] / 2**30
    batches = sorted({p["batch"] for p in points})
    head = ["policy", "variant", *(f"B={b} GiB" for b in batches), "params", "trainable", "with grad", "float32"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (policy, variant), row in rows.items():
        p = row["p"]
        fp32 = p["dtype_split"].get("float32", {"params": 0})["params"]
        peaks = [f"{row['peaks'][b]:.2f}" if b in row["peaks"] else "" for b in batches]
        counts = [p["params_total"], p["params_trainable"], p["params_with_grad"], fp32]
        lines.append("| " + " | ".join([policy, variant, *peaks, *(f"{n:,}" for n in counts)]) + " |")
    return "\n".join(lines)


def _key(p: dict[str, Any]) -> tuple[Any, ...]:
    order = {name: i for i, name in enumerate(POLICIES)}
    variants = VARIANTS[p["policy"]]
    shape = (p["cameras"], p.get("present", p["cameras"]), tuple(p.get("frame", (IMAGE_SIZE, IMAGE_SIZE))))
    return (order[p["policy"]], variants.index(p["variant"]), p["batch"], p["text_tokens"], p["kernels"], shape)


if __name__ == "__main__":
    main()
