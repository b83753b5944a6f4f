"""Model specs: the transformer the cost model prices.

A :class:`ModelSpec` describes a stack of pre-norm transformer blocks (what dominates memory in
VLA and video models) plus fixed extras for what the block model does not see (vision encoder,
heads, embeddings). Frozen and validated; ``[model]`` in ``tokenbucket.toml``; presets by name.

Example:
    >>> spec = ModelSpec.preset("design-24L-1024")
    >>> spec.head_dim, spec.kv_dim, spec.block_params
    (64, 1024, 302088192)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from tokenbucket._config import load_toml_section
from tokenbucket._exceptions import ConfigError

__all__ = ["MODEL_PRESETS", "ModelSpec"]

Precision = Literal["bf16", "amp", "fp32"]
Attention = Literal["flash", "sdpa", "eager", "mem_efficient"]
Checkpointing = Literal["none", "full"]
Mode = Literal["train", "infer"]
Optimizer = Literal["adamw", "sgd", "none"]
QKVLayout = Literal["views", "contiguous", "fused_rotary"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "precision": ("bf16", "amp", "fp32"),
    "attention": ("flash", "sdpa", "eager", "mem_efficient"),
    "checkpointing": ("none", "full"),
    "mode": ("train", "infer"),
    "optimizer": ("adamw", "sgd", "none"),
    "qkv_layout": ("views", "contiguous", "fused_rotary"),
}


def _positive(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{name} should be {kind}, but got {name}={value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A stack of ``layers`` pre-norm transformer blocks of width ``hidden``.

    Each block: LayerNorm → Q, K, V projections (K and V of width ``kv_heads x head_dim``) →
    attention → output projection → residual; LayerNorm → MLP (``hidden → ffn → hidden`` with
    GELU, or SwiGLU with ``gated_mlp``) → residual. Linear layers have no bias; LayerNorms have
    weight and bias. ``tokenbucket.cost.profile.ReferenceTransformer`` is exactly this block.

    Args:
        hidden: model width D.
        layers: number of blocks N.
        heads: attention heads H (must divide ``hidden``).
        kv_heads: K/V heads for GQA/MQA (must divide ``heads``); default ``heads``.
        mlp_ratio: MLP width over ``hidden``; ``ffn = round(mlp_ratio * hidden)``.
        gated_mlp: SwiGLU (three matrices) instead of GELU (two).
        precision: ``bf16`` (weights, grads, states and activations in bf16), ``amp`` (fp32
            master weights, bf16 compute as CUDA autocast does), ``fp32``.
        attention: ``flash``/``sdpa`` (no score tensor; a fp32 log-sum-exp per row),
            ``mem_efficient`` (the same memory class), ``eager`` (materialised scores).
        qkv_layout: what a flash / memory-efficient kernel is handed (NOTE [ QKV layout ]):
            ``views`` (default; ``None`` means it) of the projections' outputs; ``contiguous``
            copies in ``[B, H, L, Dh]``, so folding the heads back copies the output;
            ``fused_rotary``, one fused QKV projection with a rotary embedding writing new Q
            and K while V's view keeps the whole projection output alive.
        window: local attention window in tokens (flash/mem_efficient FLOPs only; eager still
            materialises the full score matrix).
        checkpointing: ``none`` or ``full`` (each block recomputed in backward).
        mode: ``train`` (forward + backward + optimizer step) or ``infer`` (prefill with KV
            cache, no gradients).
        optimizer: ``adamw`` (two states), ``sgd`` (momentum, one state), ``none``.
        extra_params: parameters outside the block stack (encoders, embeddings, heads); they
            pay weights, gradients and optimizer states like the blocks do.
        extra_bytes: fixed bytes for anything else the block model does not see.
        name: a label for reports.
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int | None = None
    mlp_ratio: float = 4.0
    gated_mlp: bool = False
    precision: Precision = "bf16"
    attention: Attention = "flash"
    qkv_layout: QKVLayout | None = None
    window: int | None = None
    checkpointing: Checkpointing = "none"
    mode: Mode = "train"
    optimizer: Optimizer = "adamw"
    extra_params: int = 0
    extra_bytes: int = 0
    name: str | None = None

    def __post_init__(self) -> None:
        _positive("hidden", self.hidden)
        _positive("layers", self.layers)
        _positive("heads", self.heads)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        _positive("kv_heads", self.kv_heads)
        if self.hidden % self.heads:
            raise ConfigError(
                f"heads should divide hidden, but got hidden={self.hidden}, heads={self.heads} "
                f"({self.hidden} / {self.heads} = {self.hidden / self.heads:g})"
            )
        if self.heads % self.kv_heads:  # type: ignore[operator]
            raise ConfigError(f"kv_heads should divide heads, but got heads={self.heads}, kv_heads={self.kv_heads}")
        r = self.mlp_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0 < r < math.inf):  # nan fails too
            raise ConfigError(f"mlp_ratio should be a positive finite number, but got mlp_ratio={r!r}")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices and not (name == "qkv_layout" and self.qkv_layout is None):
                raise ConfigError(f"{name} should be one of {list(choices)}, but got {name}={getattr(self, name)!r}")
        if self.window is not None:
            _positive("window", self.window)
        _positive("extra_params", self.extra_params, 0)
        _positive("extra_bytes", self.extra_bytes, 0)
        if not isinstance(self.gated_mlp, bool):
            raise ConfigError(f"gated_mlp should be a bool, but got gated_mlp={self.gated_mlp!r}")

    # -- derived sizes -------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads x head_dim``."""
        return int(self.kv_heads) * self.head_dim  # type: ignore[arg-type]

    @property
    def ffn(self) -> int:
        return round(self.mlp_ratio * self.hidden)

    @property
    def layer_matmul_params(self) -> int:
        """Parameters of one block's matrices (Q, K, V, O and the MLP)."""
        d, kv, f = self.hidden, self.kv_dim, self.ffn
        mlp = (3 if self.gated_mlp else 2) * d * f
        return 2 * d * d + 2 * d * kv + mlp

    @property
    def layer_params(self) -> int:
        """Parameters of one block: matrices plus two LayerNorms (weight and bias)."""
        return self.layer_matmul_params + 4 * self.hidden

    @property
    def block_params(self) -> int:
        return self.layers * self.layer_params

    @property
    def params(self) -> int:
        """All parameters the model trains: blocks plus ``extra_params``."""
        return self.block_params + self.extra_params

    @property
    def param_bytes(self) -> int:
        """Bytes per parameter of the weights (and of their gradients)."""
        return 2 if self.precision == "bf16" else 4

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of what matmuls read and write (activations, K/V cache)."""
        return 4 if self.precision == "fp32" else 2

    @property
    def stream_bytes(self) -> int:
        """Bytes per element of the residual stream (the dtype of the weights)."""
        return self.param_bytes

    @property
    def optimizer_states(self) -> int:
        """Optimizer state tensors per parameter (AdamW 2, momentum SGD 1)."""
        if self.mode == "infer":
            return 0
        return {"adamw": 2, "sgd": 1, "none": 0}[self.optimizer]

    # -- config --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """Build a spec from a mapping such as a TOML ``[model]`` table.

        ``preset = "NAME"`` starts from a preset and the other keys change it.
        """
        data = dict(data)
        known = {f.name for f in fields(cls)} | {"preset"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown [model] keys {unknown}; expected some of {sorted(known)}")
        preset = data.pop("preset", None)
        if preset is not None:
            return dataclasses.replace(cls.preset(preset), **data)
        missing = [k for k in ("hidden", "layers", "heads") if k not in data]
        if missing:
            raise ConfigError(f"[model] needs {missing} (or preset = NAME); known presets: {sorted(MODEL_PRESETS)}")
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path, section: str = "model") -> ModelSpec:
        """Read the ``[model]`` section of a ``tokenbucket.toml`` file."""
        return cls.from_dict(load_toml_section(path, section))

    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """A named preset (see ``MODEL_PRESETS``)."""
        if name not in MODEL_PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known presets: {sorted(MODEL_PRESETS)}")
        return MODEL_PRESETS[name]


MODEL_PRESETS: dict[str, ModelSpec] = {
    # The design document's worked model: 24 layers, D=1024, 16 heads, bf16.
    "design-24L-1024": ModelSpec(name="design-24L-1024", hidden=1024, layers=24, heads=16),
    # Backbone-sized presets (block stack only; add encoders with extra_params).
    "vit-l-24L-1024": ModelSpec(name="vit-l-24L-1024", hidden=1024, layers=24, heads=16, precision="amp"),
    "gemma-2b-18L-2048": ModelSpec(
        name="gemma-2b-18L-2048", hidden=2048, layers=18, heads=8, kv_heads=1, mlp_ratio=8.0, gated_mlp=True
    ),
    "llama-7b-32L-4096": ModelSpec(
        name="llama-7b-32L-4096", hidden=4096, layers=32, heads=32, mlp_ratio=11008 / 4096, gated_mlp=True
    ),
    "qwen2-0.5b-24L-896": ModelSpec(
        name="qwen2-0.5b-24L-896", hidden=896, layers=24, heads=14, kv_heads=2, mlp_ratio=4864 / 896, gated_mlp=True
    ),
}
