"""Measure a video diffusion transformer's training step from its diffusers config: fake tensors, no GPU.

:func:`profile_dit` builds diffusers' own transformer class (the config's ``_class_name``) at its
real size under ``FakeTensorMode`` on the CPU, in bf16 with the modules the class keeps in fp32
kept there (NOTE [ Modules kept in fp32 ]), turns a batch of clips into the cached latents and
text states the usual fine-tuning step feeds it (:meth:`~tokenbucket.models._dit.VideoDiT.inputs`),
applies the training setup (LoRA on the attention projections as diffusers' training scripts
add it; diffusers' own gradient checkpointing; FSDP2 over a fake process group) and runs
training steps: forward, the flow-matching loss, backward, ``AdamW(foreach=True).step()``
(NOTE [ The fine-tuning step ]). The peak comes from PyTorch's own trackers, through
:func:`~tokenbucket.cost.hf_profile.measure_step`; attention runs as a CUDA GPU runs it (its
kernels' meta functions, :mod:`tokenbucket.cost._kernels`). ``diffusers`` is an optional extra
(``pip install 'tokenbucket[diffusers]'``, which brings ``peft`` for LoRA): this module imports it.

NOTE [ The fine-tuning step ]
The scripts people fine-tune these models with (diffusers' training examples, finetrainers,
DiffSynth, musubi-tuner) train the transformer alone on latents and text states cached beforehand:
the VAE and the text encoder are not on the GPU. One step is ``pred = transformer(noisy_latents,
timestep, text_states)``, ``loss = ((pred.float() - target.float()) ** 2).mean()`` (the flow
target ``noise - latents``, in fp32), ``loss.backward()``, ``optimizer.step()``. The measured
step is that one: the loss is taken outside the transformer, in fp32, and the output is dropped
before backward.

NOTE [ Modules kept in fp32 ]
diffusers' ``from_pretrained(..., torch_dtype=torch.bfloat16)`` keeps the parameters of the
modules a class lists in ``_keep_in_fp32_modules`` (Wan: its time embedder, scale-shift tables
and norms) in fp32, by name. A model built here under bf16 gets those parameters back in fp32
the same way, so its weights, gradients and AdamW states have the dtypes a fine-tuning run has.
FSDP2 refuses a unit whose trainable parameters have two dtypes ("FSDP expects uniform original
parameter dtype"), so a sharded run casts the whole transformer to bf16 before ``fully_shard``,
and so does the model measured under FSDP here.

NOTE [ A DiT's FSDP units ]
A sharded run wraps every block of the transformer as its own FSDP2 unit, and the transformer
(the patch embedding, the time and text embeddings, the output head) as the root. diffusers names
its block lists after the family: ``blocks`` (Wan), ``transformer_blocks`` (CogVideoX, LTX-Video,
Cosmos, HunyuanVideo's dual-stream blocks), ``single_transformer_blocks`` (HunyuanVideo's
single-stream blocks) and ``refiner_blocks`` (HunyuanVideo's text token refiner): every
``ModuleList`` whose name ends in ``blocks`` is a block list, and each of its children one unit.
The measured step hands that rule to :func:`~tokenbucket.cost.hf_profile.measure_step` as its
``units`` in place of the decoder-layer rule (``layers``/``blocks``/``layer`` lists); for Wan, whose
one list is ``blocks``, the two rules wrap the same units.

NOTE [ Cosmos's padding-mask resize ]
``CosmosTransformer3DModel.forward`` resizes the pipeline's pixel-size padding mask to the latent
grid with ``torchvision.transforms.functional.resize`` (nearest), a name diffusers imports only
where torchvision is installed. The measured step needs nothing of it but the resized shape: where
torchvision is absent, it runs with a stand-in that resizes the same way with
``torch.nn.functional.interpolate(..., mode="nearest")`` (a ``1 x 1 x H' x W'`` mask, a few
kilobytes, as torchvision's). Where torchvision is installed, its own resize runs.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import diffusers
import peft
import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost._fake_step import _no_adapter_move
from tokenbucket.cost.hf_profile import StepShape, measure_step
from tokenbucket.cost.profile import default_dtype
from tokenbucket.models import dit_family
from tokenbucket.models._dit import DiTConfig, Latents, VideoDiT

__all__ = ["DIT_LORA_TARGETS", "DiTProfile", "FlowMatchingStep", "build_dit", "profile_dit"]

# the attention projections diffusers' LoRA training scripts put adapters on
DIT_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
TRAINS = ("full", "lora")


class FlowMatchingStep(torch.nn.Module):
    """A transformer and the loss the fine-tuning step takes of its output (NOTE [ The
    fine-tuning step ]): ``forward(target=..., **inputs).loss``."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(self, target: torch.Tensor, **inputs: torch.Tensor) -> types.SimpleNamespace:
        with _resize_stand_in(self.transformer):  # NOTE [ Cosmos's padding-mask resize ]
            pred = self.transformer(**_regrouped(inputs), return_dict=False)[0]
        return types.SimpleNamespace(loss=((pred.float() - target.float()) ** 2).mean())


# NOTE [ Tensor pairs among the inputs ]: an input that is a tuple of tensors (CogVideoX's rotary
# cosines and sines) travels to the measured step as one fake input per tensor, ``name<PART>i``,
# and is put back together before the transformer's forward
_PART = "#"


def _regrouped(inputs: dict[str, Any]) -> dict[str, Any]:
    """NOTE [ Tensor pairs among the inputs ]: the ``name#i`` inputs as the tuple ``name``."""
    out: dict[str, Any] = {}
    parts: dict[str, dict[int, Any]] = {}
    for key, value in inputs.items():
        name, part, index = key.partition(_PART)
        if part:
            parts.setdefault(name, {})[int(index)] = value
        else:
            out[key] = value
    for name, pieces in parts.items():
        out[name] = tuple(pieces[i] for i in sorted(pieces))
    return out


class _NearestResize:
    """NOTE [ Cosmos's padding-mask resize ]: what Cosmos's forward reads of ``torchvision.transforms``."""

    class InterpolationMode:
        NEAREST = "nearest"

    class functional:  # torchvision's name
        @staticmethod
        def resize(img: torch.Tensor, size: list[int], interpolation: object = None) -> torch.Tensor:
            return torch.nn.functional.interpolate(img, size=size, mode="nearest")


@contextlib.contextmanager
def _resize_stand_in(transformer: torch.nn.Module) -> Iterator[None]:
    """NOTE [ Cosmos's padding-mask resize ]: the stand-in, while Cosmos's transformer runs,
    where its diffusers module has no ``transforms`` (torchvision absent)."""
    module = inspect.getmodule(type(transformer))
    if type(transformer).__name__ != "CosmosTransformer3DModel" or module is None or hasattr(module, "transforms"):
        yield
        return
    module.transforms = _NearestResize  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del module.transforms


def _block_lists(model: torch.nn.Module) -> list[torch.nn.Module]:
    """NOTE [ A DiT's FSDP units ]: the children of every ``ModuleList`` whose name ends in ``blocks``."""
    out: list[torch.nn.Module] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1].endswith("blocks"):
            out.extend(module)
    return out


def _keep_in_fp32(model: torch.nn.Module) -> int:
    """NOTE [ Modules kept in fp32 ]: the parameters whose names hold one of the class's
    ``_keep_in_fp32_modules`` remade in fp32 (fake tensors of the same shape); their count."""
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    moved = 0
    for module_name, module in model.named_modules():
        for name, p in list(module._parameters.items()):
            full = f"{module_name}.{name}" if module_name else name
            if p is None or p.dtype == torch.float32 or not any(k in full for k in keep):
                continue
            module._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, dtype=torch.float32), p.requires_grad)
            moved += p.numel()
    return moved


def build_dit(
    cfg: DiTConfig, *, train: str = "full", lora_rank: int = 16, checkpointing: bool = False, keep_fp32: bool = True
) -> tuple[torch.nn.Module, list[str]]:
    """diffusers' transformer for ``cfg`` (call under ``FakeTensorMode`` and a bf16 default
    dtype), set up to train: (the :class:`FlowMatchingStep` around it, frozen parts).
    ``keep_fp32``: NOTE [ Modules kept in fp32 ] (``False``: every parameter bf16, as FSDP2
    needs them within a unit)."""
    if train not in TRAINS:
        raise ConfigError(f"train should be one of {list(TRAINS)} for a video DiT, but got train={train!r}")
    cls = getattr(diffusers, cfg.class_name)
    model = cls.from_config({k: v for k, v in cfg.transformer.items() if not k.startswith("_")})
    if keep_fp32:
        _keep_in_fp32(model)
    if checkpointing:
        model.enable_gradient_checkpointing()
    frozen: list[str] = []
    if train == "lora":
        model.requires_grad_(False)
        lora = peft.LoraConfig(r=lora_rank, lora_alpha=lora_rank, init_lora_weights="gaussian",
                               target_modules=list(DIT_LORA_TARGETS))  # fmt: skip
        with _no_adapter_move():  # NOTE [ peft under fake mode ] in tokenbucket.cost.hf_profile
            model.add_adapter(lora)
        frozen = ["transformer (all but lora_A/lora_B)"]
    model.train()
    return FlowMatchingStep(model), frozen


@dataclass(frozen=True)
class DiTProfile:
    """One measured training step of a video DiT (per rank)."""

    peak_bytes: int
    breakdown: dict[str, int]
    params_total: int
    params_trainable: int
    tokens: int
    seconds: float
    versions: dict[str, str] = field(default_factory=dict)


def profile_dit(
    cfg: DiTConfig, *, batch: int, frames: int, height: int, width: int, text_tokens: int, views: int = 1,
    train: str = "full", lora_rank: int = 16, checkpointing: bool = False, sharding: str = "none",
    world_size: int = 1, steps: int = 2,
) -> DiTProfile:  # fmt: skip
    """The peak of ``steps`` fine-tuning steps of ``cfg``'s transformer on ``batch`` clips of
    ``frames`` frames of ``height x width`` (``views`` cameras laid along the latent time axis)
    and ``text_tokens`` cached text states (NOTE [ The fine-tuning step ]).

    ``sharding``: ``none`` or ``fsdp`` (FSDP2 over ``world_size`` fake ranks: one unit per block,
    the root one more: NOTE [ A DiT's FSDP units ]); ``steps``: 2 is the steady state (AdamW's states live)."""
    fam = dit_family(cfg.class_name)
    latents = fam.latents(cfg, frames, height, width)
    if views != 1:
        raise ConfigError(f"views={views}: several cameras are not laid out for video DiTs yet")
    text = fam.text_tokens(cfg, text_tokens)
    started = time.perf_counter()

    def build() -> tuple[torch.nn.Module, list[str]]:
        with default_dtype(torch.bfloat16):
            return build_dit(cfg, train=train, lora_rank=lora_rank, checkpointing=checkpointing,
                             keep_fp32=sharding != "fsdp")  # fmt: skip

    made = _shapes(fam, cfg, batch, latents, text)
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    plain: dict[str, Any] = {}  # the grid, the frame rate
    for key, value in made.items():
        if isinstance(value, torch.Tensor):
            specs[key] = (tuple(value.shape), value.dtype)
        elif isinstance(value, tuple) and value and all(isinstance(t, torch.Tensor) for t in value):
            for i, t in enumerate(value):  # NOTE [ Tensor pairs among the inputs ]
                specs[f"{key}{_PART}{i}"] = (tuple(t.shape), t.dtype)
        else:
            plain[key] = value
    run = measure_step(build, plain, specs, sharding=sharding, world_size=world_size, steps=steps,
                       shape=StepShape(kernels="cuda"), units=_block_lists)  # fmt: skip
    return DiTProfile(
        peak_bytes=int(run["peak_bytes"]),
        breakdown=dict(run["peak_breakdown"]),
        params_total=int(run["params_total"]),
        params_trainable=int(run["params_trainable"]),
        tokens=latents.tokens,
        seconds=round(time.perf_counter() - started, 2),
        versions={"torch": torch.__version__, "diffusers": diffusers.__version__},
    )


def _shapes(fam: VideoDiT, cfg: DiTConfig, batch: int, latents: Latents, text: int) -> dict[str, Any]:
    """The inputs: tensors by their shapes and dtypes (built on the meta device: no memory), and
    the plain values some families' ``forward`` takes beside them (LTX-Video's latent grid and
    rotary scale, Cosmos's frame rate)."""
    with torch.device("meta"):
        shapes: dict[str, Any] = fam.inputs(cfg, batch, latents, text, torch.bfloat16)
    return shapes
