"""The units a staged step walks through, with the bytes each keeps (plumbing of :mod:`tokenbucket.cost.staged`).

A :class:`Unit` is one FSDP-sized piece of a :class:`~tokenbucket.cost.hf_model.StagedModel` at
one batch shape: a vision block, a decoder layer, or a piece of the root module (patch
embedding, projector, token embedding, final norm and head, the loss). Formulas are bytes per
token of pure bf16 training with sdpa attention, as transformers 5 runs these models; each was
checked against PyTorch's ``MemTracker`` on fake tensors (``benchmarks/hf_truth.py``), see
NOTE [ What an HF block saves ].
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokenbucket.cost.hf_model import StagedModel, VisionTower

__all__ = ["Unit", "build_units"]

BF16 = 2
FP32 = 4


@dataclass(frozen=True)
class Unit:
    """One piece of the step.

    Args:
        stage: ``vision``, ``projector``, ``backbone``, ``head_loss`` or ``action_expert``.
        params: parameters it holds (all of them, trainable or not).
        trainable: parameters that get gradients and optimizer state.
        saved: bytes its forward keeps for backward.
        fwd_work: bytes live only while its forward runs (on top of ``saved``).
        bwd_work: bytes live while its backward runs, before its parameter gradients exist.
        bwd_grad_work: bytes live while its backward runs, next to its parameter gradients.
        own_unit: an FSDP unit of its own (a block in a ``layers``/``blocks`` list); the rest
            belongs to the root unit, gathered for the whole step.
        backward: whether its backward runs at all (a frozen tower with no trainable input does not).
        keeps_grad: gradient bytes it makes for a parameter owned elsewhere (a tied head's), live
            until the owner's backward.
        releases_grad: those bytes, folded into its own gradient when its backward ends.
        keeps_saved: what it saved outlives the step (its output reaches no loss, so no backward
            frees it: NOTE [ Tower blocks past the feature layer ]).
    """

    stage: str
    params: int
    trainable: int
    saved: int
    fwd_work: int = 0
    bwd_work: int = 0
    bwd_grad_work: int = 0
    own_unit: bool = False
    backward: bool = True
    keeps_grad: int = 0
    releases_grad: int = 0
    keeps_saved: bool = False


# NOTE [ What an HF block saves ]
# Per token, bf16, sdpa (CPU/GPU flash: Q, K, V, the output and a fp32 log-sum-exp per head):
# - Llama/Qwen2 RMSNorm upcasts: it keeps x in fp32 (4D), rsqrt (4), the normalised bf16 (2D,
#   only when its weight trains) and its output (2D, the projections' input): 8D + 4. Gemma's
#   keeps the normalised fp32 instead (4D): 10D + 4.
# - attention: q and k after rope (2Q + 2KV), v (2KV; K and V repeated to all heads when sdpa
#   cannot take GQA: a mask, or head_dim > 256), the output (2Q), 4H of log-sum-exp.
# - SwiGLU MLP: gate, act, up, product: 8F. CLIP/Qwen2-VL QuickGELU: fc1, sigmoid, product:
#   6F; GELU-tanh (SigLIP): 4F. Vision LayerNorm: input and output, 4D + 4.
# - Qwen2-VL's vision attention keeps the whole qkv output (6D, v is a view of it), q and k
#   after the fp32 rope (4D), the per-image sdpa outputs and their concatenation (4D).
# - a prefix-LM mask (PaliGemma's bidirectional image + prompt prefix): sdpa gets a boolean
#   (B, 1, S, S) mask, so transformers repeats K and V to all heads, and every layer's sdpa
#   converts the mask to bf16 and keeps it: 2S more per token per layer. Gemma 3's image tokens
#   attend both ways within an image (``StagedModel.explicit_mask``): the same.
# - q/k norm (Qwen3, Gemma 3, ``StagedModel.qk_norm``): an RMSNorm per head keeps its fp32 input
#   (4Q, 4KV), rsqrt (4 per head) and, when its weight trains, the normalised bf16 (Qwen3) or
#   fp32 (Gemma 3: 4Q, 4KV).
# Checked: Qwen2-0.5B layer 57,408 B/token (exact), Gemma-2B 181,304 (+16), CLIP-L 41,032,
# Qwen2-VL block 58,952.

# NOTE [ DeepStack mergers ]
# Qwen3-VL's tower runs one more patch merger after each block in ``deepstack_visual_indexes``
# (a LayerNorm over the 2x2-folded features, fc1, GELU, fc2) and adds its output to the image
# positions of decoder layer 0, 1, 2, ... (NOTE [ DeepStack on fake tensors ] in
# ``tokenbucket.cost._fake_step``). Each keeps what the main merger keeps, except that a
# training tower's next block already keeps the LayerNorm's input (2D per patch). They are the
# projector's: they train with it, also under a frozen tower (transformers' frozen-vision setup
# here keeps ``merger`` and ``deepstack_merger_list`` trainable). The add into the hidden states
# keeps nothing. Measured on Qwen3-VL-2B (benchmarks/hf_truth.py): every point within 0.7 %.

PREFIX_LM = ("paligemma", "pi0")  # text attention under an explicit prefix-LM mask


def decoder_layer_saved(model: StagedModel, *, norm_trains: bool, lora_rank: int, first: bool, seq_len: int) -> int:
    """Bytes per token one decoder layer keeps at ``seq_len`` tokens a sample (NOTE [ What an HF block saves ])."""
    spec = model.backbone
    d, f, h = spec.hidden, spec.ffn, spec.heads
    q = h * model.head_dim
    kv = int(spec.kv_heads or h) * model.head_dim
    masked = model.explicit_mask or model.model_type in PREFIX_LM
    kv_eff = kv if model.head_dim <= 256 and not masked else q
    gemma = model.model_type.startswith("gemma") or model.model_type in ("paligemma", "pi0")
    norm = FP32 * d + 4 + BF16 * d + (((FP32 if gemma else BF16) * d) if norm_trains else 0)
    first_norm = BF16 * d if first and lora_rank else norm  # LoRA: nothing upstream wants layer 0's input grad
    attn = BF16 * (2 * q + 2 * kv_eff) + FP32 * h
    mlp = 4 * BF16 * f
    lora = 7 * BF16 * lora_rank
    # Gemma 2's post-attention and post-MLP norms: their fp32 input and rsqrt, and with a trained
    # weight the normalised fp32 output; their bf16 output goes straight into the residual add
    post = (model.norms_per_layer - 2) * (FP32 * d + 4 + (FP32 * d if norm_trains else 0))
    qk = qk_norm_saved(model, norm_trains=norm_trains, fp32_normed=gemma) if model.qk_norm else 0
    return first_norm + norm + attn + mlp + lora + post + qk + (16 if gemma else 0) + (BF16 * seq_len if masked else 0)


def qk_norm_saved(model: StagedModel, *, norm_trains: bool, fp32_normed: bool = False) -> int:
    """Bytes per token the per-head q/k RMSNorms keep (Qwen3, Gemma 3): each upcasts, keeping its
    fp32 input and one fp32 rsqrt per head, and with a trained weight the normalised bf16 too
    (fp32 for Gemma's norm, ``fp32_normed``); the projections' bf16 outputs are not kept."""
    spec = model.backbone
    heads = spec.heads + int(spec.kv_heads or spec.heads)
    width = heads * model.head_dim
    return FP32 * width + FP32 * heads + (((FP32 if fp32_normed else BF16) * width) if norm_trains else 0)


def vision_layer_saved(tower: VisionTower) -> int:
    """Bytes per token one vision block keeps (NOTE [ What an HF block saves ])."""
    d, f, h = tower.hidden, tower.ffn, tower.heads
    if tower.name.startswith(("qwen2", "qwen3")):
        norms = (2 * (FP32 * d + 4 + 2 * BF16 * d)) if tower.norm == "rmsnorm" else 2 * (2 * BF16 * d + 4)
        attn = 14 * d + FP32 * h  # qkv storage 6D, roped q/k 4D, sdpa outputs and their cat 4D
        mlp = 4 * BF16 * f if tower.gated_mlp else 3 * BF16 * f
        if tower.name.startswith("qwen3"):  # GELU-tanh: fc1's output and GELU's
            mlp = 2 * BF16 * f
        return norms + attn + mlp
    act = 3 * BF16 * f if tower.name.startswith("clip") else 2 * BF16 * f
    if tower.gated_mlp:  # SwiGLU (Pixtral): gate, act, up and their product
        act = 4 * BF16 * f
    # an RMSNorm keeps its fp32 input and rsqrt, the normalised bf16 (its weight's gradient) and
    # its output; a q/k norm the same but its output, which sdpa keeps as q / k; a layer scale
    # keeps the branch output it multiplies (attention's and the MLP's)
    norm = FP32 * d + 4 + 2 * BF16 * d if tower.norm == "rmsnorm" else 2 * BF16 * d + 4
    qk = 2 * (FP32 * d + 4 + BF16 * d) if tower.qk_norm else 0
    scale = 2 * BF16 * d if tower.layer_scale else 0
    return 2 * norm + 4 * BF16 * d + FP32 * h + act + qk + scale


# NOTE [ One sequence under a block mask ]
# Pixtral runs every image of the batch as one sequence of all their patches (S tokens) and
# builds a bf16 block-diagonal mask [1, 1, S, S] that every block's sdpa takes (and keeps for
# backward when the tower trains): 2 S^2 bytes, live through the tower's forward, and to the end
# of its backward when it trains. Each block's saved bytes are per token as in NOTE [ What an
# HF block saves ] (RMSNorm as in the decoder, SwiGLU 8F): 24D + 8F + 4H + 8 per token, measured
# 57,416 B at Pixtral-L (D 1024, F 4096, H 16) on fake tensors, exact. Its backward peaks in the
# SwiGLU before the block's weight gradients exist (2D + 4.5F a token); a frozen tower keeps
# nothing and its forward peaks at 2D + 8F a token beside the mask (both fitted on a 1-3 block
# Pixtral-L under a small Mistral, 1-4 images of 448-896 px: within -3 %..+5 %).


# NOTE [ Tower blocks past the feature layer ]
# LLaVA and LLaVA-NeXT project hidden_states[vision_feature_layer] (-2 by default): CLIP still
# runs its last block (and its post-LayerNorm on the pooled class token), but nothing from
# them reaches the loss. They get no gradient and no optimizer state, and since no backward
# passes through them, what the last block saved stays live until the step's outputs are
# dropped: through the optimizer step (measured: LLaVA-NeXT-0.5B keeps exactly one CLIP block,
# 41,032 B per tower token, at its optimizer peak). The same holds for SigLIP's attention-pooling
# head, which transformers runs on every image though no VLM reads it: no gradients for its
# 15.2M parameters (so400m), and its input with the keys and values it made (3 x 2D per tower
# token) live to the end (PaliGemma-3B: 1.80 MB measured for 256 tokens, 1.77 MB predicted).


def _vision_units(model: StagedModel, images: int, patches: int, trains: bool) -> list[Unit]:
    units: list[Unit] = []
    tokens = images * patches
    for tower in model.vision:
        layers = tower.layers
        root = tower.params - layers * tower.layer_params - tower.head_params
        root_trains = root - (tower.unused_params - tower.unused_layers * tower.layer_params - tower.head_params)
        inputs = BF16 * tokens * tower.channels * tower.temporal_patch * tower.patch**2
        # the stem's saved output, and its norm's: Pixtral's ln_pre is an RMSNorm (fp32 input, bf16 normalised)
        stem = (FP32 + BF16) * tower.hidden if tower.batch_mask else BF16 * tower.hidden
        embed_saved = (stem + BF16 * tower.hidden + 4) * tokens if trains else 0
        mask = BF16 * tokens * tokens if tower.batch_mask else 0  # NOTE [ One sequence under a block mask ]
        units.append(Unit("vision", root, root_trains if trains else 0, inputs + embed_saved + (mask if trains else 0),
                          fwd_work=BF16 * tokens * tower.hidden))  # fmt: skip
        per = vision_layer_saved(tower) * tokens if trains else 0
        work = BF16 * tokens * (4 * tower.hidden + 2 * tower.ffn) + (0 if trains else mask)
        grad_work = BF16 * tokens * (4 * tower.hidden + 2 * tower.ffn)
        bwd_work = 0
        if tower.batch_mask:  # NOTE [ One sequence under a block mask ]: the SwiGLU backward peaks first
            bwd_work, grad_work = tokens * (2 * tower.hidden + 9 * tower.ffn // 2), BF16 * tokens * tower.hidden
            if not trains:  # a frozen block's forward: its SwiGLU's four F-wide tensors at once
                work = tokens * (2 * tower.hidden + 8 * tower.ffn) + mask
        for i in range(layers):
            used = i < layers - tower.unused_layers
            units.append(Unit("vision", tower.layer_params, tower.layer_params if trains and used else 0, per,
                              fwd_work=work, bwd_work=bwd_work, bwd_grad_work=grad_work, own_unit=True, backward=trains and used,
                              keeps_saved=not used))  # fmt: skip
        if tower.pooling_head:  # transformers' SigLIP runs it; OpenVLA's timm tower stops before it
            runs = tower.name == "siglip_vision_model" and trains
            head_saved = 3 * BF16 * tower.hidden * tokens if runs else 0
            units.append(Unit("vision", tower.head_params, 0, head_saved, backward=False, keeps_saved=True))
    return units


def _projector_unit(
    model: StagedModel, images: int, patches: int, llm_image: int, trains: bool, tower_trains: bool = False
) -> Unit:
    proj = model.projector
    if proj is None:
        return Unit("projector", 0, 0, 0)
    dv = model.vision[0].hidden if model.vision else proj.in_dim
    n_in = images * patches
    if proj.kind == "patch_merger":  # LayerNorm in and out, fc1 input, GELU input and output
        saved = (8 * dv + 4) * n_in
        # NOTE [ DeepStack mergers ]: the same again per merger, less its LayerNorm input when
        # the tower trains (the next block keeps that one)
        saved += proj.deepstack * ((6 if tower_trains else 8) * dv + 4) * n_in
    elif proj.kind == "merger_mlp":  # Mistral 3: RMSNorm, the merging layer's input, then the MLP's
        # the norm keeps its fp32 input and rsqrt only for a gradient into a training tower
        norm = (FP32 * dv + 4 + 2 * BF16 * dv) if tower_trains else BF16 * dv
        merged = n_in // proj.merge**2
        saved = (norm + BF16 * dv) * n_in + (BF16 * dv + 2 * BF16 * sum(proj.hidden_dims or (proj.out_dim,))) * merged
    elif proj.kind in ("mlp", "fused_mlp"):  # fc1 input, GELU input, fc2 input
        # a LayerNorm over the folded features first (InternVL's): its input, its stats and its
        # output, which is fc1's input (measured: 20,484 B per LLM token, InternVL3-1B)
        first = (2 * BF16 * proj.in_dim + 4) * llm_image if proj.norm is not None else BF16 * dv * n_in
        saved = first + 2 * BF16 * sum(proj.hidden_dims or (proj.out_dim,)) * llm_image
    elif proj.kind == "pool_norm_linear":  # Gemma 3: NOTE [ Gemma 3's projector ]
        pool = BF16 * dv * n_in if tower_trains else 0
        norm = (FP32 * dv + 4 + FP32 * dv) if tower_trains else FP32 * dv
        saved = pool + (norm + BF16 * dv) * llm_image
    else:  # one linear: its (pixel-shuffled) input
        saved = BF16 * dv * n_in
    return Unit("projector", proj.params, proj.params if trains else 0, saved if trains else 0,
                fwd_work=BF16 * proj.out_dim * llm_image)  # fmt: skip


def build_units(
    model: StagedModel,
    *,
    batch: int,
    tower_images: int,
    patches: int,
    llm_image_tokens: int,
    seq_len: int,
    train: str,
    lora_rank: int,
    backbone_checkpointing: bool,
    vision_checkpointing: bool,
    gathered: bool,
) -> list[Unit]:
    """Every unit of one step at ``batch`` samples, in forward order.

    ``tower_images`` and ``patches`` are per batch and per tower image; ``llm_image_tokens`` and
    ``seq_len`` are per batch and per sample.
    """
    full = train == "full"
    vision_trains = full
    units: list[Unit] = []
    spec = model.backbone
    d, v = spec.hidden, model.vocab
    t = batch * seq_len
    rank = lora_rank if train == "lora" else 0
    vd = v * d
    trainable_embed = vd if not rank else 0
    tied = BF16 * vd if model.tied_embeddings and not rank else 0
    ids = 2 * 8 * t  # input_ids and labels (int64)
    # a tied weight's two gradients are summed into a third, sharded or not (NOTE [ FSDP units in
    # flight ]); unsharded it is the peak only where nothing bigger is live at the end of backward:
    # SGD at short lengths (Qwen2-0.5B, 256 tokens, steady state: 3.268 GiB measured, 3.014 GiB
    # priced without it, exact with it)
    units.append(Unit("backbone", vd, trainable_embed, ids, fwd_work=BF16 * d * t,
                      bwd_grad_work=tied, releases_grad=tied))  # fmt: skip
    images = batch * tower_images  # the tower runs after the embedding (so its backward runs before)
    if model.vision and images:
        tower = _vision_units(model, images, patches, vision_trains)
        if vision_checkpointing and vision_trains:
            tower = [_checkpointed(u, BF16 * images * patches * model.vision[0].hidden) for u in tower]
        units += tower
        units.append(_projector_unit(model, images, patches, batch * llm_image_tokens, train != "lora",
                                     tower_trains=vision_trains))  # fmt: skip
    layer_p = model.decoder_layer_params
    lora_p = rank * (
        7 * d + 2 * spec.heads * model.head_dim + 2 * int(spec.kv_heads or 1) * model.head_dim + 3 * spec.ffn
    )
    f = spec.ffn
    for i in range(spec.layers):
        full_saved = decoder_layer_saved(model, norm_trains=not rank, lora_rank=rank, first=i == 0, seq_len=seq_len) * t
        saved = BF16 * d * t if backbone_checkpointing else full_saved
        units.append(Unit("backbone", layer_p + lora_p, layer_p if not rank else lora_p, saved,
                          fwd_work=(FP32 + BF16) * d * t, bwd_grad_work=BF16 * t * (4 * d + 3 * f), own_unit=True))  # fmt: skip
        if backbone_checkpointing:
            units[-1] = _replace_work(units[-1], full_saved)
    # the final norm and the head; the loss after it: NOTE [ The loss holds three vocab-wide tensors ]
    head_p = 0 if model.tied_embeddings else vd
    norm_saved = (FP32 * d + 4 + (2 * BF16 * d if not rank else 0)) * t
    if model.logit_softcap:  # tanh keeps its bf16 output for backward
        norm_saved += BF16 * v * t
    head_trains = 0 if rank else head_p + d
    units.append(Unit("head_loss", head_p + d, head_trains, norm_saved,
                      bwd_work=(FP32 + BF16) * v * t, bwd_grad_work=BF16 * v * t + BF16 * d * t + tied,
                      keeps_grad=tied))  # fmt: skip
    # NOTE [ The loss holds three vocab-wide tensors ]
    # transformers' ForCausalLMLoss upcasts the bf16 logits (2V per token) to fp32 (4V) and
    # cross-entropy keeps its fp32 log-softmax (4V): 10V per token at the top of forward, 4V
    # kept; its backward holds the kept 4V, the incoming gradient and log-softmax's (4V each).
    units.append(Unit("head_loss", 0, 0, FP32 * v * t, fwd_work=(BF16 + FP32) * v * t, bwd_work=2 * FP32 * v * t))
    if model.action_expert is not None:
        units.append(_action_unit(model, batch, train))
    return units


def _action_unit(model: StagedModel, batch: int, train: str) -> Unit:
    ex = model.action_expert
    if ex is None:
        raise AssertionError("no action expert")
    tokens = batch * ex.horizon
    width = ex.width
    saved = 0
    if ex.spec is not None:
        saved = ex.spec.layers * tokens * (20 * width + 8 * ex.spec.ffn)
    trains = ex.params if train != "lora" else 0
    return Unit("action_expert", ex.params, trains, saved if train != "lora" else 0, fwd_work=BF16 * tokens * width)


def _checkpointed(unit: Unit, block_input: int) -> Unit:
    if not unit.own_unit:
        return unit
    return _replace_work(replace(unit, saved=block_input), unit.saved)


def _replace_work(unit: Unit, recomputed: int) -> Unit:
    """Full checkpointing: the block's own saved tensors come back during its backward."""
    return replace(unit, bwd_work=unit.bwd_work + recomputed)


# NOTE [ Gemma 3's projector ]
# Gemma3MultiModalProjector reshapes the tower's output to a contiguous (B, D, 64, 64) copy,
# average-pools it 4 x 4 (avg_pool2d keeps its input for backward: 2D per tower token), runs a
# Gemma RMSNorm over the pooled tokens (its fp32 input, rsqrt and normalised fp32: 8D + 4 per
# LLM token) and multiplies by the bias-free projection (its bf16 input: 2D). Under a frozen
# tower nothing upstream wants a gradient: only what the norm's weight and the matrix need
# stays (the normalised fp32 and the bf16 input, 6D per LLM token).
