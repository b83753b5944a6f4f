"""The cost of a video diffusion transformer's fine-tuning step, from its diffusers config.

A video DiT is one kind of block repeated over one sequence of video tokens (the clip's latent
patches; NOTE [ Video DiT tokens ] in :mod:`tokenbucket.models._dit`), beside the text states it
cross-attends to or joins. :class:`DiTCostModel` prices the step the fine-tuning scripts run on
cached latents and text states (NOTE [ The fine-tuning step ] in
:mod:`tokenbucket.cost.dit_profile`): the transformer's weights, gradients and AdamW states (in
each parameter's own dtype: bf16, and fp32 for the modules the class keeps there), what each block
keeps for backward per video token and per text token (the family's count, NOTE [ What a DiT block
keeps ]), and the peak of the step's phases. Setups: full or LoRA (adapters on the attention
projections), diffusers' own gradient checkpointing, and DDP or FSDP over ``world_size`` ranks.
Every number is checked against the same step of diffusers' own class on fake tensors
(``tests/data/dit_truth.json``, ``benchmarks/dit_truth.py``).

NOTE [ What a DiT block keeps ]
A block's forward keeps, for backward, tensors whose sizes are a token count times the width
``D``, the MLP width, or a head count: nothing is quadratic in the sequence under flash attention
(the CUDA kernel a bf16 step runs). So a family states its block's saved bytes as bytes per video
token and per text token, linear in ``D`` and the MLP width, counted from its ``forward`` (its
casts to fp32 for the norms and the gated residuals are most of it) and checked at small sizes
against the tensors autograd saves (``tests/test_dit_cost.py``). Under gradient checkpointing a
block keeps its input alone, and backward recomputes one block at a time.

NOTE [ DiT FLOPs ]
A forward multiplies each token by the weights it meets (``2 T P``: a video token the blocks'
projections and MLPs, the patch embedding and the head; a text token the text projection and the
keys and values that attend to it, :meth:`VideoDiT.matmul_params`), and each block's
attention costs ``4 T^2 D`` (scores and the weighted sum) over its sequence: the video tokens, with
the text joined for CogVideoX and HunyuanVideo; a cross-attention adds ``4 T_video T_text D``.
Training is three forwards (backward twice the forward), four under checkpointing (the recompute).

NOTE [ The peaks of a DiT step ]
The steady-state step peaks in one of two places. At the start of backward: the weights, AdamW's
states and every block's saved tensors are live, the gradients not yet (``zero_grad`` set them to
None). Or, under checkpointing, at the end of backward: every gradient is live beside the first
block's recomputed tensors and its backward's working set. The optimizer step adds one
parameter-sized temporary beside the gradients (AdamW ``foreach``). Under FSDP with checkpointing
the gradients are sharded, so the activations decide: the measured peak (FSDPMemTracker) holds, beside
the first block's recomputed tensors and its backward's working set, the tensors saved outside the
blocks (the head's, freed only when the root unit's backward ends), one block's unsharded bf16
gradients and the reduce-scatter's buffer; the working set there is smaller than unsharded (the
family's ``fsdp_backward``). These last terms are fitted to Wan's measured peaks at 1.3B and 14B.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tokenbucket._exceptions import ConfigError
from tokenbucket._search import grow_then_bisect
from tokenbucket.cost.gpus import GPU, get_gpu
from tokenbucket.cost.step_time import FixedCost, StepSeconds, StepTime, comm_bytes, optimizer_io_bytes
from tokenbucket.models import dit_family
from tokenbucket.models._dit import DiTConfig, DiTParams

__all__ = ["DiTCostModel", "DiTEstimate", "DiTSetup"]

TRAINS = ("full", "lora")
SHARDINGS = ("none", "ddp", "fsdp")


@dataclass(frozen=True, kw_only=True)
class DiTSetup:
    """How the transformer is trained.

    Args:
        train: ``full`` or ``lora`` (rank ``lora_rank`` on the attention projections).
        checkpointing: diffusers' ``enable_gradient_checkpointing()`` (every block recomputed).
        sharding: ``none``, ``ddp`` or ``fsdp`` (FSDP2, one unit per block), over ``world_size`` ranks.
    """

    train: str = "full"
    lora_rank: int = 16
    checkpointing: bool = False
    sharding: str = "none"
    world_size: int = 1

    def __post_init__(self) -> None:
        for name, choice, choices in (("train", self.train, TRAINS), ("sharding", self.sharding, SHARDINGS)):
            if choice not in choices:
                raise ConfigError(f"{name} should be one of {list(choices)} for a video DiT, but got {name}={choice!r}")
        for name, count in (("lora_rank", self.lora_rank), ("world_size", self.world_size)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigError(f"{name} should be a positive integer, but got {name}={count!r}")
        if self.sharding == "none" and self.world_size != 1:
            raise ConfigError(f"world_size={self.world_size} needs sharding ddp or fsdp")


@dataclass(frozen=True)
class DiTEstimate:
    """A priced step (per rank): ``peak_bytes`` and its ``items`` (bytes each, at the peak)."""

    peak_bytes: int
    items: dict[str, int]
    video_tokens: int
    text_tokens: int
    phase: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    sequences_per_sample: int = 1  # a sample's views laid as a batch (NOTE [ Views of a sample ])

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "items": dict(self.items), "video_tokens": self.video_tokens,
                "text_tokens": self.text_tokens, "phase": self.phase, "notes": list(self.notes)}  # fmt: skip


class DiTCostModel:
    """A video DiT's fine-tuning step priced from its config (NOTE [ The peaks of a DiT step ]).

    Example:
        >>> from tokenbucket import DiTConfig, VAEFactors
        >>> cfg = DiTConfig("wan-1.3b", "WanTransformer3DModel", {"num_attention_heads": 12,
        ...     "ffn_dim": 8960, "num_layers": 30}, VAEFactors(4, 8, 16, "published"))
        >>> model = DiTCostModel(cfg)
        >>> model.params.total  # Wan 2.1 T2V 1.3B
        1418996800
        >>> est = model.sample_memory(1, frames=81, height=480, width=832, text_tokens=512)
        >>> est.video_tokens, round(est.peak_bytes / 2**30, 1)
        (32760, 137.6)
    """

    def __init__(self, cfg: DiTConfig, setup: DiTSetup | None = None) -> None:
        self.cfg = cfg
        self.setup = DiTSetup() if setup is None else setup
        self.family = dit_family(cfg.class_name)
        self.params: DiTParams = self.family.params(cfg, self.setup.lora_rank)

    # -- static ---------------------------------------------------------------------------------

    def static_bytes(self) -> dict[str, int]:
        """Weights, gradients and AdamW states per rank (NOTE [ Modules kept in fp32 ] in
        :mod:`tokenbucket.cost.dit_profile`: FSDP trains every parameter in bf16)."""
        p, s = self.params, self.setup
        fsdp = s.sharding == "fsdp"
        bf16, fp32 = (p.total, 0) if fsdp else (p.bf16, p.fp32)
        weights = 2 * bf16 + 4 * fp32
        if s.train == "lora":
            lora = 2 * p.lora  # the adapters: bf16 like the layers they sit on
            weights += lora
            trained = lora
        else:
            trained = weights
        world = s.world_size if fsdp else 1
        out = {"weights": _ceil_div(weights, world), "gradients": _ceil_div(trained, world),
               "optimizer": _ceil_div(2 * trained, world)}  # fmt: skip
        if fsdp:  # the unsharded units in flight: the block being computed and the next one prefetched
            out["gathered"] = 2 * p.block * 2
        if s.sharding == "ddp":  # DDP's gradient buckets: a second copy of the gradients, made at wrap time
            out["ddp buckets"] = trained
        if p.buffers:  # tables the model builds (FSDP shards parameters only)
            out["buffers"] = p.buffers
        return out

    # -- per sample -----------------------------------------------------------------------------

    def memory(self, batch: int, video_tokens: int, text_tokens: int) -> DiTEstimate:
        """The step's peak for ``batch`` samples of ``video_tokens`` and ``text_tokens`` each."""
        for name, value in (("batch", batch), ("video_tokens", video_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} should be a positive integer, but got {name}={value!r}")
        if isinstance(text_tokens, bool) or not isinstance(text_tokens, int) or text_tokens < 0:
            raise ConfigError(f"text_tokens should be a non-negative integer, but got text_tokens={text_tokens!r}")
        s = self.setup
        terms = self.family.step_terms(self.cfg, s.train, s.lora_rank)
        static = self.static_bytes()
        v, t = batch * video_tokens, batch * text_tokens
        saved = [int(k.video * v + k.text * t) for k in terms.blocks]
        outside = int(terms.outside * v + terms.outside_text * t)
        base = (
            static["weights"]
            + static["optimizer"]
            + sum(static.get(k, 0) for k in ("gathered", "ddp buckets", "buffers"))
        )
        if not s.checkpointing:
            items = {"weights": static["weights"], "optimizer": static["optimizer"],
                     "saved activations": sum(k.count * n for k, n in zip(terms.blocks, saved, strict=True)),
                     "outside the blocks": outside}  # fmt: skip
            for key in ("gathered", "ddp buckets", "buffers"):
                if key in static:
                    items[key] = static[key]
            phase = "start of backward"
            fwd = sum(items.values())
        else:
            # NOTE [ The peaks of a DiT step ]: the first block's input, its recomputed tensors and
            # its backward's working set (the family's, unsharded or under FSDP), the largest kind's
            fsdp = s.sharding == "fsdp"
            items = {**static, "block input": max(int(k.checkpoint * v) for k in terms.blocks),
                     "recomputed block": max(saved),
                     "backward working set": max(int((k.fsdp_backward if fsdp else k.backward) * v)
                                                 for k in terms.blocks)}  # fmt: skip
            if fsdp:  # NOTE [ The peaks of a DiT step ]: what FSDP adds at the first block's backward
                items["reduce-scatter"] = 2 * self.params.block
                items["block gradients"] = 2 * self.params.block
                items["outside the blocks"] = outside
            phase = "end of backward"
            fwd = sum(items.values())
        opt = base - static.get("gathered", 0) + 2 * static["gradients"]  # and AdamW's foreach temporary
        if opt > fwd:
            items = {**static, "foreach temporary": static["gradients"]}
            items.pop("gathered", None)
            phase = "optimizer step"
        return DiTEstimate(max(fwd, opt), items, video_tokens, text_tokens, phase)

    # -- time -----------------------------------------------------------------------------------

    def flops(self, batch: int, video_tokens: int, text_tokens: int) -> float:
        """Training FLOPs of one step (NOTE [ DiT FLOPs ])."""
        terms = self.family.step_terms(self.cfg, self.setup.train, self.setup.lora_rank)
        blocks = sum(k.count for k in terms.blocks)
        width = self.family.width(self.cfg)
        joint = self.family.joint_text
        seq = video_tokens + (text_tokens if joint else 0)
        per_video, per_text = self.family.matmul_params(self.cfg)
        linear = 2.0 * batch * (video_tokens * per_video + text_tokens * per_text)
        attention = 4.0 * batch * blocks * width * (seq * seq + (0 if joint else video_tokens * text_tokens))
        passes = 4.0 if self.setup.checkpointing else 3.0  # backward twice the forward; a recompute once more
        return passes * (linear + attention)

    def step_seconds(self, batch: int, video_tokens: int, text_tokens: int, gpu: str | GPU) -> StepSeconds:
        """One step's seconds on ``gpu`` (NOTE [ Step time ] in :mod:`tokenbucket.cost.step_time`)."""
        g = get_gpu(gpu)
        static = self.static_bytes()
        world = self.setup.world_size
        full = 1 if self.setup.sharding != "fsdp" else world
        fixed = FixedCost(
            optimizer_bytes=optimizer_io_bytes(static["optimizer"], static["gradients"]),
            comm_bytes=comm_bytes(self.setup.sharding, world, static["weights"] * full, static["gradients"] * full),
            kernels=40 * sum(k.count for k in self.family.step_terms(self.cfg, "full").blocks),
        )
        return StepTime.for_gpu(g).seconds(self.flops(batch, video_tokens, text_tokens), batch * video_tokens,
                                           fixed=fixed)  # fmt: skip

    def max_batch(self, video_tokens: int, text_tokens: int, budget_bytes: int) -> int:
        """The largest batch of samples of this size whose peak is within ``budget_bytes`` (0: none;
        NOTE [ Doubling then bisection ])."""
        return grow_then_bisect(
            lambda b: self.memory(b, video_tokens, text_tokens).peak_bytes <= budget_bytes, what="a video DiT's batch"
        )

    def sample_memory(
        self, batch: int, *, frames: int, height: int, width: int, text_tokens: int, views: int = 1,
        view_layout: str = "time",
    ) -> DiTEstimate:  # fmt: skip
        """:meth:`memory` for ``batch`` samples of ``views`` clips (cameras) of ``frames`` frames of
        ``height x width`` (the family's own latent and patch rule; the views laid as
        ``view_layout`` says, NOTE [ Views of a sample ]) and ``text_tokens`` cached text states."""
        latents = self.family.latents(self.cfg, frames, height, width)
        laid, per_sample = self.family.laid_views(self.cfg, latents, views, view_layout)
        est = self.memory(batch * per_sample, laid.tokens, self.family.text_tokens(self.cfg, text_tokens))
        return dataclasses.replace(est, sequences_per_sample=per_sample)


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)
