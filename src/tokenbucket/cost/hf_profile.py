"""Measure a Hugging Face model's training peak from its ``config.json``: fake tensors, no GPU, no weights.

:func:`profile_hf` builds the real ``transformers`` model from the config at its real size, in
bf16 (or fp32: NOTE [ The build dtype ]), under ``FakeTensorMode`` on the CPU, turns one sample's shape (the same
:class:`~tokenbucket.cost.staged.Sample` the staged cost model prices) into the inputs the
model's processor would make (``input_ids`` with the image tokens, ``pixel_values``, the grid or
image-size fields, ``labels``; a clip as the family's video processor hands it over where it
has a video path: NOTE [ Qwen video inputs ], NOTE [ LLaVA-OneVision video inputs ],
NOTE [ SmolVLM video inputs ]), applies the training setup (frozen tower, LoRA via ``peft``,
FSDP2 or DDP over a fake process group) and runs training steps: forward, backward,
``AdamW(foreach=True).step()``. The peak of live bytes comes from PyTorch's own trackers
(``MemTracker``, and ``FSDPMemTracker`` under FSDP). ``transformers`` is an optional extra
(``pip install 'tokenbucket[transformers]'``; ``peft`` too for LoRA).

:func:`measure_step` is the engine under it, for any model and inputs (``benchmarks/hf_truth.py``
makes the truth set with it).

Example:
    >>> from tokenbucket.cost.staged import Sample, TrainSetup
    >>> config = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
    ...           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    ...           "vocab_size": 1000}
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> run = profile_hf(HFConfig("<tiny>", config), Sample(text_tokens=128), batch=2)
    >>> run.peak_bytes > 0 and run.params_total == run.params_trainable
    True

NOTE [ Root-only peak stats ]
``MemTracker._update_peak_stats`` walks every module's stats after every op (a weak-key dict
with a ``hasattr`` per module), 80% of the run time. The global peak does not depend on the
per-module stats, so the trackers here keep only the root module's (forward and backward peak):
the global peak is the one stock ``MemTracker`` reports, ~5x faster.

NOTE [ Real bookkeeping tensors ]
Qwen2-VL and LLaVA-NeXT read their image grids on the host (``grid_thw.tolist()``,
``cu_seqlens`` split sizes; Qwen2.5-VL's window index too), and Idefics3 (SmolVLM) reads its
pixels and pixel mask to drop padding tiles and place each patch's position. Fake tensors have
no data, so those inputs stay real tensors, and ``_RealOps`` runs any op whose tensor inputs are
all real on the real tensors (not counted; Idefics3's real pixels are stood in for by a fake
tensor of their size held through the step, as every other model's fake pixels are). Everything
with a fake input stays fake.

NOTE [ The build dtype ]
A model trains in the precision its run picks, not in the one its checkpoint is stored in:
PaliGemma's config.json says ``"torch_dtype": "float32"`` (transformers 5 writes ``"dtype"``),
and it fine-tunes in bf16 like the rest. So :func:`profile_hf` builds in ``precision`` when it
is given and in bf16 when not, and says in a note when config.json declares another dtype.
``default_dtype`` alone does not do it: transformers builds each sub-model (a VLM's vision tower
and language model) with ``AutoModel.from_config``, which sets torch's default dtype to that
sub-config's ``dtype`` while it builds; a config.json whose text_config declares float32 gave an
fp32 language model beside a bf16 tower and head, near twice the bf16 peak. Every (sub-)config's
``dtype`` is therefore set to the build dtype, and every floating parameter of the built model is
checked against it (an ``AssertionError`` if one differs), so the reported dtype is the built one.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as ddp_module
import transformers
from huggingface_hub.errors import StrictDataclassError
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore
from transformers.initialization import no_init_weights

from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost._fake_step import (
    _no_adapter_move,
    _no_torch_checks,
    _RealOps,
    _root_only_peaks,
    _skip_frozen_hooks,
    _unpacked_rows,
    deepstack_by_index,
    host_window_index,
)
from tokenbucket.cost._kernels import KERNELS, attention_kernels
from tokenbucket.cost.profile import StorageTracker, default_dtype
from tokenbucket.cost.staged import LOOPS as SETUP_LOOPS
from tokenbucket.cost.staged import Sample, TrainSetup
from tokenbucket.models._base import Shape, token_ids
from tokenbucket.models._hf_json import HFConfig, read_hf_config
from tokenbucket.models.qwen2_vl import rope_positions

__all__ = ["HF_CLASSES", "LOOPS", "HFProfile", "StepShape", "measure_step", "profile_hf"]

Builder = Callable[[], tuple[torch.nn.Module, list[str]]]
InputSpecs = dict[str, tuple[tuple[int, ...], torch.dtype]]
Units = Callable[[torch.nn.Module], list[torch.nn.Module]]
LOOPS = tuple(sorted(SETUP_LOOPS))  # the loops TrainSetup prices, each measurable
# the precisions profile_hf builds in (NOTE [ The build dtype ]); amp would need autocast in the step
BUILD_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# a tower's projector parts, trained in frozen-vision: Qwen2-VL's merger, Qwen3-VL's DeepStack mergers too
PROJECTOR_PREFIXES = ("merger.", "deepstack_merger_list.")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# model_type -> (transformers class, the vision tower's attribute under ``model.model``), every family's
HF_CLASSES: dict[str, tuple[str, str | None]] = {
    mt: (models.family(mt).hf_classes[mt], models.family(mt).vision_attr) for mt in models.SUPPORTED_MODEL_TYPES
}


# -- the engine ----------------------------------------------------------------------------------


def apply_training(
    model: torch.nn.Module, vision: str | None, train: str, lora_rank: int = 16, *,
    vision_checkpointing: bool = False, backbone_checkpointing: bool = False,
) -> tuple[Any, list[str]]:  # fmt: skip
    """``train`` (``full``, ``frozen-vision``, ``lora``) applied to a built model: (model, frozen prefixes).

    ``vision_checkpointing``/``backbone_checkpointing`` turn on transformers' own activation
    checkpointing (``activation_checkpointing_enable()``, non-reentrant) for the vision tower's
    blocks / every other layer (the decoder's), as a user does before wrapping the model."""
    frozen: list[str] = []
    if vision_checkpointing or backbone_checkpointing:
        model.activation_checkpointing_enable()  # type: ignore[operator]
        tower_modules = set(getattr(model.model, vision).modules()) if vision is not None else set()
        for module in model.modules():
            if hasattr(module, "gradient_checkpointing"):
                on = vision_checkpointing if module in tower_modules else backbone_checkpointing
                module.gradient_checkpointing = bool(module.gradient_checkpointing) and on  # type: ignore[assignment]
    if train == "frozen-vision" and vision is not None:
        tower = getattr(model.model, vision)
        for sub_name, p in tower.named_parameters():
            if not sub_name.startswith(PROJECTOR_PREFIXES):  # Qwen2-VL's projector stays trainable
                p.requires_grad_(False)
        kept = [prefix.rstrip(".") for prefix in PROJECTOR_PREFIXES if hasattr(tower, prefix.rstrip("."))]
        frozen = [f"model.{vision}" + (f" (except {', '.join(kept)})" if kept else "")]
    if train == "lora":
        import peft  # optional: only LoRA needs peft (pip install 'tokenbucket[peft]')

        targets: str | list[str] = list(LORA_TARGETS)
        if vision is not None:  # the LLM's projections only
            targets = r".*(language_model|text_model).*\.(" + "|".join(LORA_TARGETS) + ")"
        lora = peft.LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, target_modules=targets)
        # NOTE [ peft under fake mode ]: peft moves each new adapter to its base layer's device
        # with ``.to()``, which swaps fake tensors and fails; here everything is on cpu already
        with _no_adapter_move():
            model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
        frozen = ["base model (all but lora_A/lora_B)"]
    model.train()
    return model, frozen


def _layer_lists(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Decoder layers and vision blocks: the children of every ``layers``/``blocks``/``layer``
    ModuleList (``layer``: InternViT's encoder)."""
    out: list[torch.nn.Module] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "blocks", "layer"):
            out.extend(module)
    return out


def _fake_inputs(real: dict[str, Any], specs: InputSpecs) -> dict[str, Any]:
    inputs = dict(real)
    for key in ("input_ids", "labels", "position_ids", "token_type_ids"):  # per-token tensors: fake
        if key in inputs:
            inputs[key] = torch.empty(inputs[key].shape, dtype=inputs[key].dtype)
    for key, (size, dtype) in specs.items():
        inputs[key] = torch.empty(size, dtype=dtype)
    return inputs


def _counts(model: torch.nn.Module, world: int = 1) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters()) * world
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) * world
    return {"params_total": int(total), "params_trainable": int(trainable)}


def _phase_peaks(tracker: MemTracker, root: torch.nn.Module) -> dict[str, int]:
    stats = tracker.memory_tracking.get(root)  # type: ignore[no-untyped-call]
    out: dict[str, int] = {}
    if stats is None:
        return out
    for state, snaps in stats.snapshots.items():
        label = str(getattr(state, "value", state))
        if label.startswith("Peak") and snaps:
            out[label] = max(int(s.get(torch.device("cpu"), {}).get("Total", 0)) for s in snaps)
    return out


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """How the training step is written (NOTE [ Step shapes ]).

    Args:
        loop: ``dropped`` (``loss = model(**batch).loss; loss.backward()``: the model's output
            is gone before backward, as in the HF ``Trainer`` and a Lightning ``training_step``)
            or ``held`` (``out = model(**batch); out.loss.backward()``: the output, logits and
            cache included, lives through backward, as in raw loops and Accelerate's examples).
        use_cache: ``None`` (as the model's config leaves it) or a bool (passed in the call).
        kernels: ``cpu`` (the CPU attention kernels) or ``cuda`` (the CUDA kernels' metas,
            :mod:`tokenbucket.cost._kernels`).
        optimizer: ``adamw`` or ``sgd`` (momentum 0.9), both ``foreach=True``.
    """

    loop: str = "dropped"
    use_cache: bool | None = None
    kernels: str = "cpu"
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        for name, value, choices in (("loop", self.loop, LOOPS), ("kernels", self.kernels, KERNELS),
                                     ("optimizer", self.optimizer, ("adamw", "sgd"))):  # fmt: skip
            if value not in choices:
                raise ConfigError(f"{name} should be one of {list(choices)}, but got {name}={value!r}")
        if self.use_cache is not None and not isinstance(self.use_cache, bool):
            raise ConfigError(
                f"use_cache should be None (the config's) or a bool, but got use_cache={self.use_cache!r}"
            )


def _optimizer(model: torch.nn.Module, shape: StepShape) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if shape.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=True)
    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def _step(
    model: torch.nn.Module, inputs: dict[str, Any], opt: torch.optim.Optimizer, mark: Callable[[str], None],
    shape: StepShape, held: list[Any],
) -> None:  # fmt: skip
    """One step written as ``shape`` says; ``held[0]`` is the output a ``held`` loop keeps bound
    (NOTE [ Step shapes ])."""
    kwargs = {k: v for k, v in inputs.items() if not k.startswith("_")}
    if shape.use_cache is not None:
        kwargs["use_cache"] = shape.use_cache
    mark("forward")
    if shape.loop == "held":
        held[0] = model(**kwargs)  # the previous step's output is let go only now, as in a for loop
        mark("backward")
        held[0].loss.backward()
    else:
        loss = model(**kwargs).loss
        mark("backward")
        loss.backward()
        del loss
    mark("optimizer")
    opt.step()
    opt.zero_grad(set_to_none=True)
    mark("idle")


# NOTE [ Step shapes ]
# The peak depends on how the user writes the step, not only on the model:
# - ``dropped``: ``loss = model(**batch).loss; loss.backward()``. The output (the logits, the
#   cache) is gone before backward starts: the HF ``Trainer`` (``compute_loss`` returns the loss
#   alone) and a Lightning ``training_step`` that returns the loss.
# - ``held``: ``outputs = model(**batch); loss = outputs.loss; loss.backward(); optimizer.step()``
#   in a ``for`` loop, as raw loops and Accelerate's examples are written. ``outputs`` stays bound
#   through backward, the optimizer step and the next step's forward (it is rebound only when
#   that forward returns), so in the steady state the previous step's logits (``B x L x vocab``)
#   and cache are live at every phase; two outputs are never live at once. The loops here keep
#   it exactly that way (``held[0] = model(**batch)`` in ``_step``).
# - ``use_cache``: as the config leaves it (transformers builds a ``DynamicCache`` in training
#   too, holding every layer's K and V) or ``False``. It changes the peak only through what the
#   loop holds; NOTE [ Unpacked rows ] is why it does not change the mask.
# - the attention kernels: NOTE [ The CUDA kernel choice ] in ``tokenbucket.cost._kernels``.


def _snapshot(tracker: MemTracker, model: torch.nn.Module) -> dict[str, Any]:
    snap = tracker._peak_mem_snap[torch.device("cpu")]
    return {
        "peak_bytes": int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]),
        "peak_breakdown": {str(k.value if hasattr(k, "value") else k): int(v) for k, v in snap.items()},
        "phase_peaks": _phase_peaks(tracker, model),
    }


def _single(build: Builder, real: dict[str, Any], specs: InputSpecs, steps: int, shape: StepShape) -> dict[str, Any]:
    with FakeTensorMode(allow_non_fake_inputs=True):
        model, frozen = build()
        counts = _counts(model)
        inputs = _fake_inputs(real, specs)
        storage = StorageTracker()
        for t in [*model.parameters(), *model.buffers(), *inputs.values()]:
            if isinstance(t, FakeTensor):
                storage.track(t)
        tracker = MemTracker()
        _root_only_peaks(tracker, model)
        _skip_frozen_hooks(tracker, model)
        tracker.track_external(model, *[t for t in inputs.values() if isinstance(t, FakeTensor)])
        with tracker, storage, _RealOps():
            opt = _optimizer(model, shape)
            tracker.track_external(opt)
            held: list[Any] = [None]
            for i in range(steps):
                if i:  # MemTracker keeps per-module stats of one iteration; the overall peak stays
                    tracker.reset_mod_stats()
                _step(model, inputs, opt, storage.set_phase, shape, held)
            del held, opt
        out = _snapshot(tracker, model)
    return {
        **out,
        "storage_tracker_peak": storage.peak,
        "storage_tracker_phase_peaks": {k: v for k, v in storage.peaks.items() if k != "idle"},
        "frozen": frozen,
        **counts,
    }


def _fsdp(
    build: Builder, real: dict[str, Any], specs: InputSpecs, steps: int, world: int, shape: StepShape,
    units: Units,
) -> dict[str, Any]:  # fmt: skip

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        with FakeTensorMode(allow_non_fake_inputs=True):
            model, frozen = build()
            counts = _counts(model)  # the whole model's, before it is sharded
            for layer in units(model):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            inputs = _fake_inputs(real, specs)
            opt = _optimizer(model, shape)
            tracker = FSDPMemTracker(model, opt)
            _root_only_peaks(tracker, model)
            _skip_frozen_hooks(tracker, model)
            tracker.track_inputs(tuple(v for v in inputs.values() if isinstance(v, FakeTensor)))
            with tracker, _RealOps():
                held: list[Any] = [None]
                for i in range(steps):
                    if i:
                        tracker.reset_mod_stats()
                    _step(model, inputs, opt, lambda _phase: None, shape, held)
                del held
            out = _snapshot(tracker, model)
    finally:
        dist.destroy_process_group()
    return {**out, "frozen": frozen, **counts}


def _ddp(
    build: Builder, real: dict[str, Any], specs: InputSpecs, steps: int, world: int, shape: StepShape
) -> dict[str, Any]:
    """NOTE [ DDP on fake tensors ]: DDP reads parameter values twice, to check that every rank
    holds the same shapes and to broadcast rank 0's weights; a fake tensor has no values, so
    both are skipped (one process stands for every rank). Its all-reduce is a no-op hook (in
    place on the bucket, as NCCL's is). The second step rebuilds the buckets in the order the
    first backward produced them, which reads an index tensor: one step only."""

    if steps != 1:
        raise ConfigError(f"DDP is measured over one step on fake tensors, but got steps={steps}")
    verify = ddp_module._verify_param_shape_across_processes  # type: ignore[attr-defined]
    ddp_module._verify_param_shape_across_processes = lambda *a, **k: None  # type: ignore[attr-defined]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model, frozen = build()
            counts = _counts(model)
            inputs = _fake_inputs(real, specs)
            tracker = MemTracker()
            _root_only_peaks(tracker, model)
            _skip_frozen_hooks(tracker, model)
            with tracker, _RealOps():
                wrapped = ddp_module.DistributedDataParallel(model, init_sync=False)  # buckets made here
                wrapped.register_comm_hook(None, noop_hook)
                tracker.track_external(model, *[t for t in inputs.values() if isinstance(t, FakeTensor)])
                opt = _optimizer(model, shape)
                tracker.track_external(opt)
                _step(wrapped, inputs, opt, lambda _phase: None, shape, [None])
            out = _snapshot(tracker, model)
    finally:
        dist.destroy_process_group()
        ddp_module._verify_param_shape_across_processes = verify  # type: ignore[attr-defined]
    return {**out, "frozen": frozen, **counts}


def measure_step(
    build: Builder, real: dict[str, Any], fake: InputSpecs, *, sharding: str = "none", world_size: int = 1,
    steps: int = 1, shape: StepShape | None = None, units: Units = _layer_lists,
) -> dict[str, Any]:  # fmt: skip
    """The peak of ``steps`` training steps of the model ``build()`` makes (under fake mode).

    Args:
        build: returns ``(model, frozen prefixes)``; called under ``FakeTensorMode`` (and after
            the fake process group is up when sharded). Build in bf16 (``default_dtype(torch.bfloat16)``).
        real: inputs kept real (token ids, grids: NOTE [ Real bookkeeping tensors ]); the
            per-token ones (``input_ids``, ``labels``, ``position_ids``, ``token_type_ids``) are
            re-made fake at their shape. Keys starting with ``_`` are held, not passed.
        fake: ``{name: (shape, dtype)}`` inputs made fake (pixels).
        sharding: ``none``, ``fsdp`` (FSDP2, one unit per module ``units`` lists, the root one
            more) or ``ddp`` (NOTE [ DDP on fake tensors ]), over ``world_size`` fake ranks.
        steps: 1 (the first step) or 2 (the steady state, optimizer states live).
        shape: how the step is written: the loop, ``use_cache``, the attention kernels and the
            optimizer (default :class:`StepShape`: output dropped, the config's cache, CPU
            kernels, AdamW).
        units: the modules FSDP shards one by one (default: every decoder layer and vision block).

    Returns:
        ``peak_bytes`` (per rank), ``peak_breakdown`` (the tracker's categories at the peak),
        ``phase_peaks``, ``frozen``, ``params_total`` and ``params_trainable`` (whole model).
    """
    shape = StepShape() if shape is None else shape
    with warnings.catch_warnings(), host_window_index(), deepstack_by_index(), _no_torch_checks(), _unpacked_rows():
        warnings.simplefilter("ignore")
        with attention_kernels(shape.kernels):
            if sharding == "fsdp":
                return _fsdp(build, real, fake, steps, world_size, shape, units)
            if sharding == "ddp":
                return _ddp(build, real, fake, steps, world_size, shape)
            if sharding != "none":
                raise ConfigError(f"sharding should be one of ['none', 'fsdp', 'ddp'] to measure, but got {sharding!r}")
            return _single(build, real, fake, steps, shape)


# -- a Hugging Face config and one sample's shape ------------------------------------------------


@dataclass(frozen=True)
class HFProfile:
    """One measured training step (per rank); ``breakdown`` is the tracker's categories at the peak."""

    peak_bytes: int
    breakdown: dict[str, int]
    phase_peaks: dict[str, int]
    params_total: int
    params_trainable: int
    seq_len: int
    seconds: float
    versions: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    dtype: str = "bf16"  # what every floating parameter was built in (NOTE [ The build dtype ])

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def transformers_config(cfg: HFConfig, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, list[str]]:
    """The ``transformers`` config of ``cfg`` with sdpa attention and every (sub-)config's ``dtype``
    set to ``dtype`` (NOTE [ The build dtype ]), and notes on what was changed."""
    data = {k: v for k, v in cfg.config.items() if k not in ("model_type", "architectures", "transformers_version")}
    try:
        config = transformers.AutoConfig.for_model(cfg.model_type, **data)
    except (TypeError, ValueError, KeyError, StrictDataclassError) as exc:  # transformers' config class refuses a value
        raise ConfigError(f"config.json {cfg.path!r}: transformers refuses it: {' '.join(str(exc).split())}") from None
    notes = []
    impl = "sdpa"
    if cfg.model_type == "gemma2" or (config.get_text_config().model_type == "gemma2"):
        # NOTE [ Gemma 2 attention ]: trained with flash-attention 2 (soft-cap in the kernel, no
        # score matrix); sdpa has no soft-cap, so it runs with the attention soft-cap off
        text = config.get_text_config()
        if getattr(text, "attn_logit_softcapping", None) is not None:
            text.attn_logit_softcapping = None
            notes.append("Gemma 2's attention soft-cap is off (sdpa stands in for flash-attention 2)")
        impl = "eager"  # transformers refuses sdpa for Gemma 2 at build time; switched after
    config._attn_implementation = impl
    for sub in ("text_config", "vision_config"):
        if hasattr(config, sub):
            getattr(config, sub)._attn_implementation = "sdpa" if sub == "vision_config" else impl
    stack = [config]  # NOTE [ The build dtype ]: from_config builds each sub-model in its config's dtype
    while stack:
        node = stack.pop()
        node.dtype = dtype
        stack.extend(c for key in getattr(node, "sub_configs", {}) if (c := getattr(node, key, None)) is not None)
    return config, notes


def sample_shape(cfg: HFConfig, sample: Sample, batch: int) -> Shape:
    """``batch`` samples shaped like ``sample`` as the measured mode builds them: clips of two
    frames or more as clips where the family has a video path, every other clip's frames as
    images (NOTE [ Frames are images ]), as :meth:`StagedCostModel.clips
    <tokenbucket.cost.staged.StagedCostModel.clips>` prices them; no vision without a tower."""
    family = models.of(cfg)
    if not family.has_vision or not (sample.images or sample.videos):
        return Shape(batch, 0, sample.height, sample.width, sample.text_tokens)
    if sample.videos and sample.frames >= 2 and family.has_video:
        return Shape(
            batch, 0, sample.height, sample.width, sample.text_tokens, videos=sample.videos, frames=sample.frames,
            fps=sample.fps,
        )  # fmt: skip
    return Shape(batch, sample.images or sample.videos * sample.frames, sample.height, sample.width, sample.text_tokens)


def with_markers(cfg: HFConfig, sample: Sample) -> Sample:
    """``sample`` with room for the text tokens its family's model reads around each image or
    clip (Qwen2-VL's vision start and end tokens, which its 3-D rope positions need to find each
    image; Qwen3-VL's per temporal group of a clip); other samples as they are."""
    family = models.of(cfg)
    shape = sample_shape(cfg, sample, 1)
    least = family.min_text_tokens(shape.images)
    if shape.videos:
        groups = family.clip_inputs(cfg, shape.frames, shape.height, shape.width, shape.fps).tower_images
        least += shape.videos * family.min_video_text_tokens(groups)
    if (shape.images or shape.videos) and sample.text_tokens < least:
        return dataclasses.replace(sample, text_tokens=least)
    return sample


def qwen_rope_positions(
    model_type: str, config: object, ids: torch.Tensor, image_token: int, grid: torch.Tensor | None, *,
    video_token: int | None = None, video_grid: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Qwen2-VL's / Qwen2.5-VL's / Qwen3-VL's 3-D rope positions (:func:`tokenbucket.models.qwen2_vl.rope_positions`)."""
    positions: torch.Tensor = rope_positions(
        HF_CLASSES[model_type][0], config, ids, image_token, grid, video_token=video_token, video_grid=video_grid,
        second_per_grid_ts=second_per_grid_ts,
    )  # fmt: skip
    return positions


def hf_inputs(
    cfg: HFConfig, config: Any, sample: Sample, batch: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[dict[str, Any], InputSpecs]:
    """The inputs a processor makes for ``batch`` samples shaped like ``sample`` (real, fake), pixels
    in ``dtype``: the family's own (:meth:`tokenbucket.models.Family.inputs`, on :func:`sample_shape`),
    ``labels`` added."""
    shape = sample_shape(cfg, sample, batch)
    if shape.images or shape.videos:
        real, fake = models.of(cfg).inputs(cfg, config, shape, dtype)
    else:
        real, fake = {"input_ids": token_ids(shape, 0)}, {}
    real["labels"] = real["input_ids"].clone()
    return real, fake


def _dtype_note(cfg: HFConfig, built: str, precision: str | None) -> str:
    """Which dtype the model is built in and why (NOTE [ The build dtype ]), naming what config.json declares."""
    words = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16"}
    declared = []
    for where, table in [("", cfg.config)] + [(f"{k}.", v) for k, v in cfg.config.items() if isinstance(v, dict)]:
        for key in ("torch_dtype", "dtype"):
            value = table.get(key)
            if value is not None and words.get(str(value).removeprefix("torch.")) != built:
                declared.append(f"{where}{key}={str(value).removeprefix('torch.')}")
    if precision is not None:
        return f"built in {built} as --precision asks" + (
            f"; config.json declares {', '.join(declared)}" if declared else ""
        )
    if declared:
        return (
            f"built in {built}: --precision not given; config.json declares {', '.join(declared)}, which is how "
            f"the checkpoint is stored, not how it trains (--precision fp32 builds in fp32)"
        )
    return f"built in {built}: --precision not given, and config.json declares no other dtype"


def profile_hf(
    config: str | Path | HFConfig, sample: Sample, batch: int = 1, setup: TrainSetup | None = None, *,
    steps: int = 1, precision: str | None = None, kernels: str = "cuda",
) -> HFProfile:  # fmt: skip
    """Measure one (``steps=2``: a steady-state) training step of the model ``config`` describes.

    Args:
        config: a ``config.json``, its folder, or an ``HFConfig`` (a supported ``model_type``).
        sample: one sample's shape; every sample of the batch has it. Its clips reach a family
            with a video path as clips, and elsewhere (or of one frame) as their frames, images
            (:func:`sample_shape`, as the staged model prices them).
        batch: samples per step (per rank).
        setup: the training setup; ``sharding`` ``none``, ``fsdp`` or ``ddp`` (ZeRO is
            DeepSpeed's and is not measured), optimizer ``adamw`` or ``sgd``; its checkpointing
            (transformers' own, per stage), ``loop`` and ``use_cache`` shape the step
            (NOTE [ Step shapes ]).
        steps: 1 or 2 (DDP: 1).
        precision: ``bf16`` or ``fp32``, the dtype of every weight, gradient, optimizer state and
            activation; ``None`` builds in bf16 whatever config.json's ``torch_dtype``/``dtype``
            says (NOTE [ The build dtype ]). The first note says which and why.
        kernels: the attention kernels recorded: ``cuda`` (the default: the CUDA kernels'
            metas, what a GPU saves; NOTE [ The CUDA kernel choice ]) or ``cpu``.

    Raises:
        ConfigError: an unsupported model, setup or precision.
    """
    setup = TrainSetup() if setup is None else setup
    cfg = read_hf_config(config)
    if precision is not None and precision not in BUILD_DTYPES:
        raise ConfigError(
            f"precision should be one of {sorted(BUILD_DTYPES)} to measure (amp's autocast is not measured), "
            f"but got precision={precision!r}"
        )
    built = "bf16" if precision is None else precision
    dtype = BUILD_DTYPES[built]
    if setup.sharding in ("zero2", "zero3"):
        raise ConfigError(f"sharding={setup.sharding!r} is DeepSpeed's and is not measured here: use fsdp or ddp")
    if setup.optimizer == "none":
        raise ConfigError("optimizer='none' is not measured: profile with adamw or sgd")
    if setup.sharding == "ddp" and setup.ddp_bucket_view:
        raise ConfigError("ddp_bucket_view=True is not measured yet: profile PyTorch's default buckets")
    if steps not in (1, 2):
        raise ConfigError(f"steps should be 1 or 2, but got steps={steps}")
    cls_name, vision = HF_CLASSES[cfg.model_type]
    cls = getattr(transformers, cls_name)
    tconfig, notes = transformers_config(cfg, dtype)
    notes.insert(0, _dtype_note(cfg, built, precision))
    real, fake = hf_inputs(cfg, tconfig, sample, batch, dtype)

    def build() -> tuple[torch.nn.Module, list[str]]:
        # weights' values do not matter on fake tensors, and SigLIP's trunc_normal_ init reads them
        with default_dtype(dtype), no_init_weights():
            model = cls(tconfig)
            model.tie_weights()  # no_init_weights skips the tying that init does
            if tconfig._attn_implementation == "eager":  # NOTE [ Gemma 2 attention ]: run with sdpa
                model.config._attn_implementation = "sdpa"
            trained, frozen = apply_training(
                model, vision, setup.train, setup.lora_rank, vision_checkpointing=setup.vision_checkpointing == "full",
                backbone_checkpointing=setup.backbone_checkpointing == "full",
            )  # fmt: skip
        # NOTE [ The build dtype ]: the dtype reported is the one every floating parameter has
        for name, p in trained.named_parameters():
            if p.is_floating_point() and p.dtype != dtype:
                raise AssertionError(f"built {cfg.model_type} in {built}, but parameter {name} is {p.dtype}")
        return trained, frozen

    start = time.perf_counter()
    shape = StepShape(loop=setup.loop, use_cache=setup.use_cache, kernels=kernels, optimizer=setup.optimizer)
    out = measure_step(
        build, real, fake, sharding=setup.sharding, world_size=setup.world_size, steps=steps, shape=shape
    )  # fmt: skip
    return HFProfile(
        peak_bytes=out["peak_bytes"], breakdown=out["peak_breakdown"], phase_peaks=out["phase_peaks"],
        params_total=out["params_total"], params_trainable=out["params_trainable"],
        seq_len=int(real["input_ids"].shape[1]), seconds=round(time.perf_counter() - start, 1),
        versions={"torch": torch.__version__, "transformers": transformers.__version__}, notes=tuple(notes),
        dtype=built,
    )  # fmt: skip
