"""HunyuanVideo (diffusers' ``HunyuanVideoTransformer3DModel``): a video DiT whose dual-stream, then single-stream blocks join Llama text states and video patches.

Its pipeline (``HunyuanVideoPipeline``) encodes a clip with ``AutoencoderKLHunyuanVideo``: 4
frames a latent frame after the first (``temporal_compression_ratio``), 8 pixels a side
(``spatial_compression_ratio``), 16 latent channels; the latent frames are ``(F - 1) // 4 + 1``
as ``prepare_latents`` counts them. The transformer cuts ``1 x 2 x 2`` patches (``patch_size_t``,
``patch_size``) with a strided convolution, which floors latents the patches do not tile: such a
clip is refused here (the output would not match the latents). ``HunyuanVideoPipeline.check_inputs``
refuses a height or width that is not a multiple of 16.

The text and the video meet in one attention sequence (``joint_text``): the first
(``transformer_blocks``, dual-stream) blocks take the video tokens (``hidden_states``) and the text
(``encoder_hidden_states``, after the token refiner) apart and attend them jointly, the
single-stream blocks take them concatenated. The pipeline pads each prompt to
``max_sequence_length`` (256) Llama tokens with a mask, the cache holds what it encoded: the text
positions are what the cache holds (:meth:`VideoDiT.text_tokens`), and :attr:`Latents.tokens`
counts the video only.

NOTE [ What a HunyuanVideo block keeps ]
A dual-stream block runs the video and the text through twin halves (their own modulations,
projections and MLPs) and one attention over both, so it keeps as much a text token as a video
token: ``40 D + 4 ffn + 12 heads + 10`` bytes in full training. That is the fp32 inputs of the
per-head RMSNorms of q and k (8 D); in bf16 the modulated LayerNorms' inputs and outputs, the
gated outputs, the projections' inputs, the normed and rotated q and k, v and the attention's
output (32 D); the MLP's GELU input and output (``4 ffn``); a head's fp32 rstd of q and k and the
memory-efficient kernel's log-sum-exp (the prompt mask rules flash attention out: 12 bytes); the
mask's additive bias and the LayerNorms' statistics (10). A single-stream block keeps ``36 D + 4
ffn + 12 heads + 6`` a token of the joined sequence: its MLP input projection's output (the GELU
input), the joined attention and GELU output that ``proj_out`` takes (``2 D + 2 ffn``), and the
rest as a dual-stream block has it for one stream. Under LoRA (adapters on the video stream's q,
k, v, out in a dual-stream block, on the joined q, k, v in a single-stream one):
``26 D + 2 ffn + 12 heads + 8 r + 10`` a video token and ``24 D + 2 ffn + 12 heads + 10`` a text
token in a dual-stream block, ``24 D + 2 ffn + 12 heads + 6 r + 6`` in a single-stream one.

Outside the blocks, a video token keeps the head's norm input and normalised output and
``proj_out``'s input (``6 D``), the rotary cosines and sines (fp32, ``8 x head_dim``), the patch
embedding's input and the fp32 loss's difference; a text token the token refiner's: ``38 D`` a
refiner block (its LayerNorms, attention and SiLU MLP four times the width) and its input
(``2 x text_embed_dim``); ``22 D`` a refiner block under LoRA. The step peaks before backward
starts, at the end of the last single-stream block's forward, where tensors it does not keep are
still live beside everything kept: its GELU output (which it copies into the joined tensor
``proj_out`` takes) and the attention output's pieces, ``2 ffn + 2 D`` a video token; under LoRA
also the joined tensor itself, which the frozen ``proj_out`` does not keep, ``4 ffn + 10 D`` in
all. Both are fitted to the measured peaks (real-width copies with 1 to 3 blocks of each kind: the
peak's slope in the tokens is the blocks' and the head's saved bytes and that, to a few tenths of
``D``, whatever the blocks), and counted outside the blocks. Under checkpointing the measuring
tracker holds ``2 D`` a video token for each of the other blocks of both kinds, unsharded and under
FSDP (NOTE [ Gradients the tracker holds through backward ] in :mod:`tokenbucket.models._dit_terms`);
the backward's working set beyond that is ``8 D`` unsharded, fitted to the measured peaks; under
FSDP it is none, less the forward's transients above (gone by then).

Example:
    >>> from tokenbucket import DiTConfig
    >>> cfg = DiTConfig("hunyuan", "HunyuanVideoTransformer3DModel", {}, DIT.published_vae)
    >>> DIT.latents(cfg, 129, 720, 1280)  # 33 latent frames of 90 x 160, 1 x 2 x 2 patches
    Latents(frames=33, height=90, width=160, tokens=118800)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._dit import (
    BlockTerms,
    DiTConfig,
    DiTParams,
    Latents,
    StepTerms,
    VAEFactors,
    VideoDiT,
    check_clip,
    config_int,
)
from tokenbucket.models._dit_terms import held_inputs, mlp_width

if TYPE_CHECKING:
    import torch

__all__ = ["DIT"]

# HunyuanVideoPipeline.__call__'s default guidance scale: distilled configs embed it (times 1000)
GUIDANCE = 6.0


class HunyuanVideo(VideoDiT):
    name = "hunyuan_video"
    class_names = ("HunyuanVideoTransformer3DModel",)
    published_vae: ClassVar[VAEFactors] = VAEFactors(4, 8, 16, "published (HunyuanVideo VAE)")
    joint_text = True

    def vae_factors(self, vae: Mapping[str, Any], where: str) -> VAEFactors:
        # AutoencoderKLHunyuanVideo's own defaults: ratios 4 and 8, 16 channels
        return VAEFactors(
            config_int(vae, "temporal_compression_ratio", 4, where),
            config_int(vae, "spatial_compression_ratio", 8, where),
            config_int(vae, "latent_channels", 16, where),
            where,
        )

    def patch_sizes(self, cfg: DiTConfig) -> tuple[int, int, int]:
        where = f"config.json {cfg.path!r}"
        p = config_int(cfg.transformer, "patch_size", 2, where)
        return config_int(cfg.transformer, "patch_size_t", 1, where), p, p

    def latents(self, cfg: DiTConfig, frames: int, height: int, width: int) -> Latents:
        check_clip(frames, height, width)
        p_t, p_h, p_w = self.patch_sizes(cfg)
        t, s = cfg.vae.temporal, cfg.vae.spatial
        if height % 16 or width % 16:
            raise ConfigError(
                f"HunyuanVideo takes height and width that are multiples of 16 (HunyuanVideoPipeline.check_inputs), "
                f"but got {height} x {width}"
            )
        lh, lw = height // s, width // s
        if lh % p_h or lw % p_w:
            raise ConfigError(
                f"HunyuanVideo's latents of a {height} x {width} clip are not whole {p_h} x {p_w} patches: height and "
                f"width should be multiples of {s * p_h} x {s * p_w} (VAE {s} x patch)"
            )
        lf = (frames - 1) // t + 1
        if lf % p_t:
            raise ConfigError(
                f"HunyuanVideo's {lf} latent frames of a {frames}-frame clip are not whole {p_t}-frame patches"
            )
        return Latents(lf, lh, lw, (lf // p_t) * (lh // p_h) * (lw // p_w))

    # -- the cost model --------------------------------------------------------------------------

    def _dims(self, cfg: DiTConfig) -> dict[str, int]:
        where = f"config.json {cfg.path!r}"
        if cfg.get("image_condition_type") is not None:
            raise ConfigError(f"{where}: HunyuanVideo's image conditioning (image_condition_type) is not priced yet")
        heads = config_int(cfg.transformer, "num_attention_heads", 24, where)
        head_dim = config_int(cfg.transformer, "attention_head_dim", 128, where)
        channels = config_int(cfg.transformer, "in_channels", 16, where)
        return {
            "D": heads * head_dim,
            "heads": heads,
            "head_dim": head_dim,
            "ffn": mlp_width(cfg, heads * head_dim),
            "dual": config_int(cfg.transformer, "num_layers", 20, where),
            "single": config_int(cfg.transformer, "num_single_layers", 40, where),
            "refiner": config_int(cfg.transformer, "num_refiner_layers", 2, where),
            "in": channels,
            "out": config_int(cfg.transformer, "out_channels", channels, where),
            "text": config_int(cfg.transformer, "text_embed_dim", 4096, where),
            "pooled": config_int(cfg.transformer, "pooled_projection_dim", 768, where),
        }

    def params(self, cfg: DiTConfig, lora_rank: int = 16) -> DiTParams:
        d = self._dims(cfg)
        D, ffn, hd = d["D"], d["ffn"], d["head_dim"]
        linear = D * D + D
        mlp = D * ffn + ffn + ffn * D + D
        # dual-stream: a modulation (six D-vectors) per stream, q k v out per stream, RMSNorm of q and k
        # per head per stream, an MLP per stream
        dual = 2 * (D * 6 * D + 6 * D) + 8 * linear + 4 * hd + 2 * mlp
        # single-stream: a modulation (three D-vectors), q k v, RMSNorm of q and k, the MLP's input and
        # one output projection of attention and MLP together
        single = D * 3 * D + 3 * D + 3 * linear + 2 * hd + D * ffn + ffn + (D + ffn) * D + D
        # the token refiner's blocks: LayerNorms, q k v out, a SiLU MLP four times the width, two gates
        refiner_mlp = D * 4 * D + 4 * D + 4 * D * D + D
        refiner = 2 * 2 * D + 4 * linear + refiner_mlp + D * 2 * D + 2 * D
        timestep = 256 * D + D + linear  # a TimestepEmbedding from 256 sinusoid channels
        cells = math.prod(self.patch_sizes(cfg))  # latent pixels a patch
        outside = (
            d["in"] * cells * D + D  # the patch embedding (a strided Conv3d)
            + timestep + d["text"] * D + D + linear + d["text"] * D + D  # the text refiner's embeddings, proj_in
            + d["refiner"] * refiner
            + timestep + d["pooled"] * D + D + linear  # the time and pooled-text condition
            + (timestep if cfg.get("guidance_embeds", True) else 0)  # the guidance embedding
            + D * 2 * D + 2 * D  # norm_out
            + D * d["out"] * cells + d["out"] * cells  # proj_out
        )  # fmt: skip
        total = d["dual"] * dual + d["single"] * single + outside
        # to_q, to_k, to_v, to_out.0 (D -> D each): the video stream's four in a dual-stream block (the
        # text stream's add_*_proj and to_add_out are other names), q k v in a single-stream block (it
        # has no to_out: its proj_out is another name), all four in each refiner block
        lora = lora_rank * 2 * D * (4 * d["dual"] + 3 * d["single"] + 4 * d["refiner"])
        return DiTParams(total, 0, max(dual, single), lora)

    def step_terms(self, cfg: DiTConfig, train: str, lora_rank: int = 16) -> StepTerms:
        # NOTE [ What a HunyuanVideo block keeps ]
        d = self._dims(cfg)
        D, H, ffn, r = d["D"], d["heads"], d["ffn"], lora_rank
        if train == "lora":
            dual_video, dual_text = 26 * D + 2 * ffn + 12 * H + 8 * r + 10, 24 * D + 2 * ffn + 12 * H + 10
            single = 24 * D + 2 * ffn + 12 * H + 6 * r + 6
        else:
            dual_video = dual_text = 40 * D + 4 * ffn + 12 * H + 10
            single = 36 * D + 4 * ffn + 12 * H + 6
        # NOTE [ What a HunyuanVideo block keeps ]: the forward's peak transients, counted outside the
        # blocks, are gone when the checkpointed backward peaks: FSDP's working set gives them back
        transient = 4 * ffn + 10 * D if train == "lora" else 2 * ffn + 2 * D
        held = held_inputs(D, d["dual"] + d["single"])  # both kinds are checkpointed
        working, sharded = held + 8 * D, held - transient
        blocks = (
            BlockTerms(d["dual"], dual_video, dual_text, checkpoint=2 * D, backward=working, fsdp_backward=sharded),
            BlockTerms(d["single"], single, single, checkpoint=2 * D, backward=working, fsdp_backward=sharded),
        )
        cells = math.prod(self.patch_sizes(cfg))
        rotary, loss = 8 * d["head_dim"], 4 * d["out"] * cells
        # NOTE [ What a HunyuanVideo block keeps ]: the peak falls in the last single-stream block's forward
        if train == "lora":
            outside, outside_text = rotary + loss + transient, 22 * D * d["refiner"]
        else:
            outside = 6 * D + rotary + 2 * d["in"] * cells + loss + 4 + transient
            outside_text = 38 * D * d["refiner"] + 2 * d["text"]
        return StepTerms(blocks, outside=outside, outside_text=outside_text)

    # -- the measured mode ----------------------------------------------------------------------

    def inputs(
        self, cfg: DiTConfig, batch: int, latents: Latents, text_tokens: int, dtype: torch.dtype
    ) -> dict[str, Any]:
        import torch  # optional: the measured mode only

        where = f"config.json {cfg.path!r}"
        text_dim = config_int(cfg.transformer, "text_embed_dim", 4096, where)
        pooled = config_int(cfg.transformer, "pooled_projection_dim", 768, where)
        channels = config_int(cfg.transformer, "in_channels", 16, where)
        out = config_int(cfg.transformer, "out_channels", channels, where)
        grid = (latents.frames, latents.height, latents.width)
        return {
            "hidden_states": torch.empty(batch, channels, *grid, dtype=dtype),
            "timestep": torch.empty(batch, dtype=torch.long),
            "encoder_hidden_states": torch.empty(batch, text_tokens, text_dim, dtype=dtype),
            # the pipeline's prompt mask: every cached state counts
            "encoder_attention_mask": torch.ones(batch, text_tokens, dtype=dtype),
            "pooled_projections": torch.empty(batch, pooled, dtype=dtype),  # CLIP's pooled prompt
            "guidance": torch.full((batch,), GUIDANCE * 1000.0, dtype=dtype),  # the pipeline passes it always
            "target": torch.empty(batch, out, *grid, dtype=dtype),
        }


DIT = HunyuanVideo()
