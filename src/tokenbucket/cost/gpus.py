"""GPU targets: the memory PyTorch can use on each, its bf16 peak and bandwidth, and budgets.

``visible_gib`` is what ``torch.cuda.get_device_properties(0).total_memory`` reports (a little
under the marketing size; ECC and driver reservations vary by a few hundred MiB, so measure your
own with ``tokenbucket gpus`` on the machine if it matters). Peak TFLOP/s are dense (no
sparsity) tensor-core figures for bf16 from the vendors' data sheets.

The budget for a training step is::

    budget = (visible - cuda_context - workspace) / safety

with a CUDA context of about 0.5 GiB (it is not counted by ``max_memory_allocated``), 0.25 GiB
of cuBLAS / cuDNN / NCCL workspaces, and a safety factor of 1.1 against fragmentation.

Example:
    >>> round(gpu_budget_bytes("H100-SXM") / 2**30, 1)
    71.2
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from tokenbucket._exceptions import ConfigError

__all__ = ["GPU", "GPUS", "get_gpu", "gpu_budget_bytes"]

GIB = 2**30

# NOTE [ Step-time defaults ]
# ``mfu`` is the share of the bf16 peak a well-filled training step reaches (the saturated end of
# the utilisation curve in :mod:`tokenbucket.cost.step_time`), from published whole-run model
# FLOPs utilisation where one exists (``mfu_source`` names it), else the H100 figure, marked
# assumed. ``link_gbs`` is one direction of the per-GPU interconnect from the vendor's data
# sheet (NVLink where the SXM/OAM part has it, else PCIe x16): the rate collectives are priced
# at. Both are starting points; ``tokenbucket calibrate`` replaces them with a run's own.
ASSUMED = "assumed: no published training MFU found; the H100 figure (Llama 3, 38-43 %)"
LLAMA3 = "Llama 3 (Dubey et al. 2024, Table 4): 38-43 % BF16 MFU on 8k-16k H100s"
MEGATRON = "Megatron-LM (Narayanan et al. SC21): 52 % of peak on 3,072 A100s; OPT-175B: 147 TFLOP/s (47 %)"
CUDA_CONTEXT_BYTES = GIB // 2
WORKSPACE_BYTES = GIB // 4
SAFETY = 1.1


@dataclass(frozen=True)
class GPU:
    """One GPU target."""

    name: str
    visible_gib: float
    bf16_tflops: float | None
    fp16_tflops: float
    fp32_tflops: float
    bandwidth_tbs: float
    vendor: str = "nvidia"
    link_gbs: float = 32.0
    mfu: float = 0.40
    mfu_source: str = ASSUMED

    @property
    def visible_bytes(self) -> int:
        return int(self.visible_gib * GIB)

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s for a precision (``bf16``/``amp`` use bf16 tensor cores)."""
        if precision == "fp32":
            return self.fp32_tflops * 1e12
        if self.bf16_tflops is None:
            raise ConfigError(
                f"{self.name} has no bf16 support; use precision='fp32' (or fp16 with a loss scaler, "
                f"which tokenbucket prices as fp32 master weights) on this GPU, or pick a newer GPU"
            )
        return self.bf16_tflops * 1e12


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("A100-40GB", 39.39, 312, 312, 19.5, 1.555, link_gbs=300, mfu=0.45, mfu_source=MEGATRON),
        GPU("A100-80GB", 79.15, 312, 312, 19.5, 2.039, link_gbs=300, mfu=0.45, mfu_source=MEGATRON),
        GPU("H100-SXM", 79.11, 989, 989, 67, 3.35, link_gbs=450, mfu=0.40, mfu_source=LLAMA3),
        GPU("H100-PCIe", 79.11, 756, 756, 51, 2.0, link_gbs=64),
        GPU("H200", 139.8, 989, 989, 67, 4.8, link_gbs=450),
        GPU("B200", 178.4, 2250, 2250, 80, 8.0, link_gbs=900),
        GPU("L40S", 44.39, 362, 362, 91.6, 0.864),
        GPU("RTX-4090", 23.65, 165, 165, 82.6, 1.008),
        GPU("RTX-3090", 23.57, 71, 71, 35.6, 0.936),
        GPU("A10G", 22.07, 70, 70, 31.2, 0.6),
        GPU("L4", 22.03, 121, 121, 30.3, 0.3),
        GPU("MI300X", 191.5, 1307, 1307, 163.4, 5.3, vendor="amd", link_gbs=448),
        GPU("V100-32GB", 31.74, None, 125, 15.7, 0.9, link_gbs=150),
    )
}


def _norm(name: str) -> str:
    return "".join(name.lower().replace("_", " ").replace("-", " ").split())


def get_gpu(name: str | GPU, *, source: str | None = None) -> GPU:
    """Look a GPU up by name, loosely: case, ``-``, ``_`` and spaces do not matter, and a prefix
    that only one GPU has is enough (``h100_sxm``, ``rtx 4090``, ``mi300``, ``h20``).

    Args:
        name: a registry name (see ``GPUS``), written loosely, or a :class:`GPU`.
        source: where the name came from (a command-line flag such as ``--gpu``), for the error.

    Raises:
        ConfigError: the name is unknown (the message suggests the 1-3 closest names), or it is the
            prefix of several (the message names them).

    Example:
        >>> get_gpu("h100-pcie").name, get_gpu("A100_80gb").name
        ('H100-PCIe', 'A100-80GB')
    """
    if isinstance(name, GPU):
        return name
    wanted = _norm(name)
    by_norm = {_norm(key): gpu for key, gpu in GPUS.items()}
    if wanted in by_norm:
        return by_norm[wanted]
    starting = [gpu.name for key, gpu in by_norm.items() if wanted and key.startswith(wanted)]
    if len(starting) == 1:
        return GPUS[starting[0]]
    label = f"{source} {name!r}" if source else f"GPU name {name!r}"
    if starting:
        raise ConfigError(f"{label} is ambiguous: did you mean {_either(starting)}?")
    close = [by_norm[key].name for key in difflib.get_close_matches(wanted, by_norm, n=3, cutoff=0.3)]
    head = f"{source} {name!r}: unknown GPU" if source else f"unknown GPU {name!r}"
    if close:
        raise ConfigError(f"{head}; did you mean {_either(close)}?")
    raise ConfigError(f"{head}; `tokenbucket gpus` lists the {len(GPUS)} known ones")


def _either(names: list[str]) -> str:
    """``A``, ``A or B``, ``A, B or C``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def gpu_budget_bytes(
    gpu: str | GPU,
    *,
    safety: float = SAFETY,
    context_bytes: int = CUDA_CONTEXT_BYTES,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> int:
    """Bytes a training step may allocate on ``gpu`` (see the module docstring)."""
    if safety < 1:
        raise ConfigError(f"safety should be >= 1, but got safety={safety}")
    g = get_gpu(gpu)
    return int((g.visible_bytes - context_bytes - workspace_bytes) / safety)
