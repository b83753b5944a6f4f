"""The analytic cost model: bytes and FLOPs of one training (or inference) step.

For a stack of pre-norm blocks (:class:`~tokenbucket.cost.model.ModelSpec`) at batch ``B`` and
padded length ``L`` (``T = B·L`` tokens), with ``a`` = bytes of the residual stream (the
weights' dtype), ``c`` = bytes of compute (bf16 = 2, fp32 = 4), ``p`` = bytes of a parameter:

Static
    weights ``p·P`` (plus, under ``amp``, the bf16 copies autocast makes of every matrix,
    ``c·P_matmul``, alive from forward to backward); gradients ``p·P``; optimizer states
    ``states·p·P``; AdamW's ``foreach`` step needs one more ``p·P`` temporary.

Activations kept for backward, per layer (NOTE [ What a block saves ])
    ``T·(a·D + n₁·c·D + c·D + 2·c·D_kv + c·D + a·D + n₂·c·D + m·c·F)`` plus LayerNorm
    statistics (``16·T``), with ``n₁ = 3, n₂ = 1 (+1 gated)`` under ``amp`` (each projection
    casts its own input) and ``n₁ = n₂ = 1`` otherwise, ``m = 2`` (GELU: hidden and its
    activation) or ``4`` (SwiGLU). That is ``32·T·D`` in bf16 and ``40·T·D`` under amp for
    D_kv = D and F = 4D.

Attention
    flash keeps a fp32 log-sum-exp, ``4·B·H·L``; eager keeps ``(4 + c)·B·H·L²`` per layer
    (fp32 softmax and the probabilities cast back; ``4`` in fp32) and with GQA repeats K and V
    to all heads.

Transients (the largest working set on top of what is kept)
    forward: the fp32 copy of the output for the loss (``4·T·D`` when the stream is bf16), or
    eager's scores ``(c + 4)·B·H·L²`` more while softmax runs; backward: the gradient stream
    plus the MLP's hidden gradient and ``dW₂`` at the last layer, or eager's ``8·B·H·L²``
    softmax-backward working set; inference: one layer's working set.

KV cache (inference)
    ``N · 2 · B · L · D_kv · c``.

FLOPs
    forward ``2·T·P_matmul + N·4·B·L·L_att·D`` with ``L_att = min(L, window)``; training
    ``3 x`` that, with flash's backward recompute making the attention part ``3.5 x``, and one
    more forward under full checkpointing.

Backward transients: NOTE [ Backward walks the layers ] in :meth:`CostModel.memory`.

The model is checked against :mod:`tokenbucket.cost.profile` on the reference block in
``tests/test_cost.py`` (±5 % without checkpointing, ±8 % with) and on a larger sweep in
``benchmarks/bench_cost_model.py``.

Example (the design document's model):
    >>> from tokenbucket.cost.model import ModelSpec
    >>> cm = CostModel(ModelSpec.preset("design-24L-1024"))
    >>> cm.flops(1, 16384).attention_per_layer == 2**40
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tokenbucket._exceptions import ConfigError
from tokenbucket._search import grow_then_bisect
from tokenbucket.cost.gpus import GPU, get_gpu
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.step_time import KERNELS_PER_BLOCK, FixedCost, StepSeconds, StepTime, optimizer_io_bytes

__all__ = ["CostModel", "FlopsEstimate", "MemoryEstimate"]

MEMORY_ITEMS = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "attention_scores",
    "kv_cache",
    "transients",
    "extra",
)


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak bytes of one step, itemised.

    The items are what is live at the peak, so they add up to ``total``; ``phase`` says where
    the peak falls (``forward``, ``backward``, ``optimizer``, or ``inference``).
    """

    weights: int
    gradients: int
    optimizer: int
    activations: int
    attention_scores: int
    kv_cache: int
    transients: int
    extra: int
    total: int
    phase: str
    batch: int
    length: int

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)


@dataclass(frozen=True)
class FlopsEstimate:
    """FLOPs of one step (multiply-add = 2 FLOPs)."""

    forward: int
    attention: int
    attention_per_layer: int
    training: int
    #: the part of ``training`` spent in attention scores (forward, backward, recompute)
    training_attention: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _check_shape(batch: int, length: int) -> None:
    for name, value in (("batch", batch), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} should be a positive integer, but got {name}={value!r}")


def _shape(batch: int | Sequence[int], length: int | None) -> tuple[int, int]:
    """``(B, L)``; a batch given as per-sample lengths is padded to its longest (or ``length``)."""
    if isinstance(batch, Sequence):
        lengths = list(batch)
        if not lengths:
            raise ConfigError("batch should hold at least one sample length, but got []")
        for i, n in enumerate(lengths):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"sample lengths should be positive integers, but got lengths[{i}]={n!r}")
        longest = max(lengths)
        if length is not None and length < longest:
            raise ConfigError(f"length={length} is shorter than the batch's longest sample ({longest})")
        return len(lengths), longest if length is None else length
    if length is None:
        raise ConfigError("length is required when batch is a number")
    _check_shape(batch, length)
    return batch, length


class CostModel:
    """Bytes and FLOPs of a batch shape on a model (and, with a GPU, time and fit).

    Args:
        model: the :class:`ModelSpec`.
        gpu: a GPU name or :class:`GPU` (for ``step_seconds`` and ``fits``); optional.
        mfu: the saturated FLOPs utilisation of ``step_seconds`` (default: the GPU's, from the
            registry; NOTE [ Step-time defaults ]).
        step_time: a :class:`StepTime` (a calibration's) instead of the GPU's defaults; with it,
            ``step_seconds`` needs no GPU.
    """

    def __init__(
        self, model: ModelSpec, gpu: str | GPU | None = None, *, mfu: float | None = None,
        step_time: StepTime | None = None,
    ) -> None:  # fmt: skip
        if not isinstance(model, ModelSpec):
            raise ConfigError(f"model should be a ModelSpec, but got {type(model).__name__}")
        if mfu is not None and (isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1):
            raise ConfigError(f"mfu should be in (0, 1], but got mfu={mfu}")
        if step_time is not None and not isinstance(step_time, StepTime):
            raise ConfigError(f"step_time should be a StepTime, but got {type(step_time).__name__}")
        self.model = model
        self.gpu = get_gpu(gpu) if gpu is not None else None
        if step_time is None and self.gpu is not None:
            # V100 + bf16 fails here, not mid-plan
            step_time = StepTime.for_gpu(self.gpu, precision=model.precision, mfu=mfu)
        self.step_time = step_time
        self.mfu = step_time.mfu if step_time is not None else (0.4 if mfu is None else mfu)

    def __repr__(self) -> str:
        return f"CostModel({self.model!r}, gpu={self.gpu.name if self.gpu else None!r}, mfu={self.mfu})"

    # -- pieces ------------------------------------------------------------------------------

    @property
    def _flash_kernel(self) -> bool:
        """Flash attention proper (bf16 compute); fp32 falls back to the memory-efficient kernel."""
        return self.model.attention in ("flash", "sdpa") and self.model.compute_bytes == 2

    def layer_activation_bytes(self, batch: int, length: int) -> int:
        """Bytes one block keeps for backward, without the attention scores.

        NOTE [ What a block saves ]
        LayerNorm 1 keeps its input x; the Q, K, V projections keep their input (each its own
        bf16 cast under amp); attention keeps Q, K, V and its output (eager: the copies its
        matmuls make, K and V repeated to all heads); the residual keeps nothing; LayerNorm 2
        keeps x₁; the MLP keeps its input, the hidden and the activation (SwiGLU: both
        hiddens, the SiLU and the product).

        NOTE [ QKV layout ]
        What attention keeps depends on what the kernel is handed. ``views``: Q, K, V are views
        of the projections (nanoGPT's fused ``split``, a 5-D ``permute``, separate projections,
        the reference block); a flash kernel writes its output in Q's ``[B, L, H, Dh]`` memory
        layout, folding the heads back is a view, and the output projection keeps the tensor
        attention keeps. ``contiguous``: Q, K, V made contiguous in ``[B, H, L, Dh]`` after the
        transpose; the output comes back in that layout, the fold copies it, and the projection
        keeps the copy: one more ``c·D`` per token and block. ``fused_rotary``: a fused QKV
        projection whose Q and K go through a rotary embedding; the rotated Q and K are new
        tensors, while V, a view, keeps the whole projection output alive: ``c·(D + D_kv)``
        more (GPT-NeoX-style blocks; 7-12 % of the peak under-predicted without it). Eager
        attention copies its ``P@V`` output in any layout and is counted already.
        """
        m = self.model
        t = batch * length
        a, c, d, f = m.stream_bytes, m.compute_bytes, m.hidden, m.ffn
        kv = m.kv_dim if self._flash_kernel else m.hidden  # other kernels get K, V repeated to all heads
        amp = m.precision == "amp"
        n1 = 3 if amp else 1
        n2 = (2 if m.gated_mlp else 1) if amp else 1
        mlp = (4 if m.gated_mlp else 2) * c * f
        per_token = a * d + n1 * c * d + c * d + 2 * c * kv + c * d + a * d + n2 * c * d + mlp
        if m.attention != "eager":  # NOTE [ QKV layout ]
            per_token += {"contiguous": c * d, "fused_rotary": c * (d + m.kv_dim)}.get(m.qkv_layout or "views", 0)
        return t * per_token + 16 * t

    def layer_score_bytes(self, batch: int, length: int) -> int:
        """Bytes one block keeps for attention: eager's scores, or flash's log-sum-exp.

        NOTE [ CPU and CUDA attention kernels ]
        The fake-tensor truth runs SDPA's CPU kernel unless ``attention_kernels("cuda")``
        (``cost/_kernels.py``) routes it to the CUDA ops' metas. For a bf16 causal block both
        keep the same per token and block: Q, K and V as they are handed over (views of a fused
        QKV ``split``, of a ``permute`` or of separate projections: the flash op needs only a
        unit last stride and copies none of them), the output written ``[B, L, H, Dh]`` in
        memory (folding the heads back is a view, kept once: ``c·D``) and a fp32 log-sum-exp of
        ``4·H`` bytes. The CUDA flash op adds only its philox seed and offset, two 8-byte
        tensors per block (1 KiB after the allocator's rounding), left out here. Measured on the
        held-out blocks of ``benchmarks/bench_block_kernels.py`` (fused split, permute, separate,
        rotary, contiguous; GELU; bf16; 36 points each), each at its own ``qkv_layout``: the two
        kernels' peaks differ by under 0.01 %, and the model is within -1.2 % … +0.1 % of both
        (the -1.2 %: a model's one rotary table, outside the blocks), so the bf16 flash family
        needs no margin of its own. A head dim off the multiple of 8 is padded by
        the CUDA flash path (Q, K, V and the output copied wider), which this model leaves out.
        """
        m = self.model
        if m.attention == "eager":
            per = 4 + (m.compute_bytes if m.compute_bytes != 4 else 0)
            return per * batch * m.heads * length * length
        rows = length if self._flash_kernel else 32 * math.ceil(length / 32)
        return 4 * batch * m.heads * rows

    def kv_cache_bytes(self, batch: int, length: int) -> int:
        """``layers x 2 x B x L x D_kv x c``: every layer's K and V."""
        m = self.model
        return m.layers * 2 * batch * length * m.kv_dim * m.compute_bytes

    def _static(self) -> tuple[int, int, int, int, int]:
        """``(weights, autocast copies, gradients, optimizer states, optimizer temporary)``."""
        m = self.model
        w = m.param_bytes * m.params
        copies = m.compute_bytes * m.layers * m.layer_matmul_params if m.precision == "amp" else 0
        train = m.mode == "train"
        g = w if train else 0
        o = m.optimizer_states * w
        tmp = w if train and m.optimizer == "adamw" else 0
        return w, copies, g, o, tmp

    # -- the public questions ----------------------------------------------------------------

    def memory(self, batch: int | Sequence[int], length: int | None = None) -> MemoryEstimate:
        """The predicted peak bytes of one step at ``(batch, length)``, itemised.

        ``batch`` may be a list of per-sample lengths: they are padded to the longest (or to
        ``length``) and the batch size is their count.
        """
        b, length = _shape(batch, length)
        m = self.model
        t, a, c, d, f = b * length, m.stream_bytes, m.compute_bytes, m.hidden, m.ffn
        w, copies, g, o, tmp = self._static()
        extra = m.extra_bytes
        layer_act = self.layer_activation_bytes(b, length)
        layer_scores = self.layer_score_bytes(b, length)
        bhl2 = b * m.heads * length * length
        eager = m.attention == "eager"
        # eager's softmax at its widest: the scores, their fp32 copy and the fp32 softmax
        # (in fp32 there is no copy): 10 bytes per score in bf16, 8 in fp32
        eager_work = (c + 8 if c != 4 else 8) * bhl2
        inputs = a * t * d  # the batch input [B, L, D], held by the caller

        if m.mode == "infer":
            kv = self.kv_cache_bytes(b, length)
            # one layer's working set at its MLP: the stream twice, the norm, the attention and
            # projection outputs, and the MLP's hiddens (SwiGLU: both, the SiLU and the product)
            norm_fp32 = a * d if m.precision == "amp" else 0
            work = t * (2 * a * d + 3 * c * d + norm_fp32 + (4 if m.gated_mlp else 2) * c * f)
            if eager:
                work = max(work, t * (a * d + 2 * c * d) + eager_work)
            return self._estimate(
                b, length, "inference", weights=w, activations=inputs, kv_cache=kv, transients=work, extra=extra
            )

        ckpt = m.checkpointing == "full"
        # forward: the model's output and the loss's fp32 copy of it, or eager's softmax working set
        fwd_t = a * t * d + (4 * t * d if a != 4 else 0)
        if eager:
            fwd_t = max(fwd_t, eager_work - layer_scores)
        # backward, last layer first: gradient stream, the MLP's hidden gradient and dW2 ...
        grad_stream = a * t * d + (c * t * d if a != c else 0)
        dw2 = c * d * f
        bwd_t = grad_stream + (2 if m.gated_mlp else 1) * c * t * f + dw2
        if eager:
            # ... or the softmax backward, once the MLP and output projection are done; the
            # bf16 probabilities are freed once P@V's backward has run (fp32 has no copy)
            freed = t * (a * d + c * d + (4 if m.gated_mlp else 2) * c * f + c * d)
            done = (3 if m.gated_mlp else 2) * d * f + d * d  # MLP and output projection
            grads = m.param_bytes * done - (c * done if copies else 0)  # amp: their bf16 copies are gone
            cast = c if c != 4 else 0
            bwd_t = max(bwd_t, grad_stream + c * t * d + (8 - cast) * bhl2 + grads - freed)
        # NOTE [ Backward walks the layers ]
        # When layer k runs its backward, layers < k still hold what they keep and layers > k
        # already hold their gradients. Both are linear in k, so the peak is at one end: the
        # last layer (every other layer's activations) or the first (every other layer's
        # gradients, which wins for short sequences and under checkpointing).
        copies_layer = copies // m.layers
        grads_layer = m.param_bytes * m.layer_params
        if ckpt:
            # NOTE [ Full checkpointing ]
            # Forward keeps only each block's input (the batch input is block 0's). Backward
            # recomputes a block in full before running its backward, so one block's
            # activations, scores and autocast weight copies are live again.
            keep_act, keep_scores, keep_copies = inputs, 0, 0
            cur_act = layer_act - inputs
            held = inputs
            fwd_t = max(fwd_t, layer_act - inputs + (eager_work if eager else 0))
        else:
            keep_act, keep_scores, keep_copies = layer_act, layer_scores, copies_layer
            cur_act = layer_act
            held = 0  # the batch input is block 0's saved input, already in layer_act
        others = m.layers - 1
        by_activations = others * (keep_act + keep_scores + keep_copies)
        by_gradients = others * grads_layer
        if by_activations >= by_gradients:
            carried = (others * keep_act, others * keep_scores, others * keep_copies, 0)
        else:
            carried = (0, 0, 0, by_gradients)
        act, sc, cp, gr = carried
        phases = {
            "forward": (w + m.layers * keep_copies, 0, o, held + m.layers * keep_act, m.layers * keep_scores, fwd_t),
            "backward": (w + cp + copies_layer, gr, o, held + act + cur_act, sc + layer_scores, bwd_t),
            "optimizer": (w, g, o, inputs, 0, tmp),
        }
        phase = max(phases, key=lambda k: sum(phases[k]))
        pw, pg, po, pa, ps, pt = phases[phase]
        return self._estimate(
            b,
            length,
            phase,
            weights=pw,
            gradients=pg,
            optimizer=po,
            activations=pa,
            attention_scores=ps,
            transients=pt,
            extra=extra,
        )

    def _estimate(self, batch: int, length: int, phase: str, **items: int) -> MemoryEstimate:
        full = {name: int(items.get(name, 0)) for name in MEMORY_ITEMS}
        return MemoryEstimate(**full, total=sum(full.values()), phase=phase, batch=batch, length=length)

    def flops(self, batch: int | Sequence[int], length: int | None = None) -> FlopsEstimate:
        """FLOPs of one step; see the module docstring for the formulas."""
        b, length = _shape(batch, length)
        m = self.model
        span = min(length, m.window) if m.window is not None and m.attention != "eager" else length
        attention_layer = 4 * b * length * span * m.hidden
        attention = m.layers * attention_layer
        dense = 2 * b * length * m.layers * m.layer_matmul_params + 2 * b * length * m.extra_params
        forward = dense + attention
        if m.mode == "infer":
            training, training_attention = forward, attention
        else:
            att_mult = 3.5 if m.attention in ("flash", "sdpa", "mem_efficient") else 3.0
            training_attention = int(att_mult * attention)
            training = int(3 * dense) + training_attention
            # NOTE [ Full checkpointing ]: one more forward for the recompute
            if m.checkpointing == "full":
                training += forward
                training_attention += attention
        return FlopsEstimate(
            forward=forward,
            attention=attention,
            attention_per_layer=attention_layer,
            training=training,
            training_attention=training_attention,
        )

    def fixed_cost(self) -> FixedCost:
        """What every step pays on the GPU whatever its tokens (NOTE [ Step time ]): one rank,
        unsharded."""
        _, _, gradients, optimizer, _ = self._static()
        kernels = KERNELS_PER_BLOCK * self.model.layers if self.model.mode == "train" else 0
        return FixedCost(optimizer_io_bytes(optimizer, gradients), 0, kernels)

    def step_time_parts(self, batch: int | Sequence[int], length: int | None = None) -> StepSeconds:
        """Predicted seconds of one step, itemised (NOTE [ Step time ])."""
        if self.step_time is None:
            raise ConfigError("step_seconds needs a GPU: CostModel(model, gpu='H100-SXM')")
        b, n = _shape(batch, length)
        return self.step_time.seconds(self.flops(b, n).training, b * n, fixed=self.fixed_cost())

    def step_seconds(self, batch: int | Sequence[int], length: int | None = None) -> float:
        """Predicted seconds per step: fixed costs plus FLOPs at the utilisation of its tokens."""
        return self.step_time_parts(batch, length).total

    def fits(self, batch: int | Sequence[int], length: int | None, budget_bytes: int) -> bool:
        return self.memory(batch, length).total <= budget_bytes

    def max_batch(self, length: int, budget_bytes: int) -> int:
        """The largest batch size whose predicted peak at ``length`` fits ``budget_bytes`` (0 if none).

        Memory grows with the batch, so a doubling-then-bisection search is exact.
        """
        _check_shape(1, length)
        if budget_bytes <= 0:
            return 0
        return grow_then_bisect(lambda b: self.fits(b, length, budget_bytes), what="max_batch")
