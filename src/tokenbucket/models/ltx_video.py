"""LTX-Video (diffusers' ``LTXVideoTransformer3DModel``): a video DiT on one token per latent pixel that cross-attends to T5 text states.

Its pipelines (``LTXPipeline``, ``LTXImageToVideoPipeline``, ``LTXConditionPipeline``) encode a
clip with ``AutoencoderKLLTXVideo``: 8 frames a latent frame after the first and 32 pixels a side
(the VAE's ``temporal_compression_ratio`` and ``spatial_compression_ratio``: the config keys, or,
where a 0.9.0/0.9.1 config leaves them out, its ``patch_size`` / ``patch_size_t`` times two per
``spatio_temporal_scaling`` block), 128 latent channels. The latent frames are ``(F - 1) // 8 +
1``, as ``prepare_latents`` counts them. The pipeline packs the latents into tokens itself
(``_pack_latents``, with the transformer's ``patch_size`` and ``patch_size_t``, both 1 in every
published checkpoint) and hands the transformer ``[B, tokens, C]`` with the latent grid beside it
(``num_frames``, ``height``, ``width``) for the rotary positions; the grid it passes is the
unpatched one, so a patch other than 1 would not match the tokens, and is refused here.
``LTXPipeline.check_inputs`` refuses a height or width that is not a multiple of 32.

The text (T5, padded by the pipeline to ``max_sequence_length`` 128 with a mask) is
cross-attended: the sequence is the video tokens alone.

NOTE [ What an LTX-Video block keeps ]
Per video token, a block keeps ``78 D + 8 heads + 20`` bytes in full training. Its q and k
RMSNorms (across heads) and the rotary positions run in fp32: eight fp32 copies of q and k on
their way through norm and rotation (32 D); in bf16 the inputs of the five projections the video
meets (self q/k/v, its output, cross q, its output, the MLP's first: 10 D), and q, k, v and
outputs as the attention kernels keep them, the modulated norms' outputs and the gated outputs
(20 D); the MLP's GELU input and output (16 D: it is ``4 D`` wide); a head's fp32 log-sum-exp in
each attention (8 bytes); the norms' fp32 rstd (20).
Per text token the cross-attention's keys and values: their fp32 norm input and output (8 D), the
normed keys and values in bf16 (4 D), the text mask's additive bias a head (2 bytes) and the
keys' rstd (4). Under LoRA: ``48 D + 8 heads + 12 r + 20`` and ``8 D + 2 heads + 4 r + 4`` (the
frozen projections keep no inputs, the six adapters the video meets and the two the text meets
keep their rank-``r`` middles). The blocks' text input is one tensor, the caption projection's
output, kept once outside them.

Outside the blocks, a video token keeps the rotary cosines and sines (fp32, ``8 D``), the head's
norm input and normalised output and ``proj_out``'s input (``6 D``), ``proj_in``'s input and the
fp32 loss's difference; a text token the caption projection's input, its GELU's input and output
and its output (``6 D + 2 x caption_channels``). Under LoRA, ``4 D`` besides the loss (the rotary
tables less what the first block, whose input needs no gradient, does not keep) and ``2 D`` a text
token, and the step peaks in the last block's MLP backward (NOTE [ LoRA's peak is in the last
block's MLP backward ] in :mod:`tokenbucket.models._dit_terms`). Under checkpointing the
measuring tracker holds ``2 D`` a video token for each of the other blocks, unsharded and under
FSDP (NOTE [ Gradients the tracker holds through backward ] there); the backward's working set
beyond that is ``14 D`` unsharded, fitted to the measured peaks, and none under FSDP.

Example:
    >>> from tokenbucket import DiTConfig
    >>> cfg = DiTConfig("ltx", "LTXVideoTransformer3DModel", {}, DIT.published_vae)
    >>> DIT.latents(cfg, 161, 512, 768)  # 21 latent frames of 16 x 24, one token each
    Latents(frames=21, height=16, width=24, tokens=8064)
    >>> DIT.latents(cfg, 121, 704, 1280)  # 16 latent frames of 22 x 40
    Latents(frames=16, height=22, width=40, tokens=14080)
"""

from __future__ import annotations

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
from tokenbucket.models._dit_terms import held_inputs, lora_mlp_peak

if TYPE_CHECKING:
    import torch

__all__ = ["DIT"]

# LTXPipeline.__call__'s default frame rate: the rotary positions scale time by VAE ratio / frame rate
FRAME_RATE = 25


class LTXVideo(VideoDiT):
    name = "ltx_video"
    class_names = ("LTXVideoTransformer3DModel",)
    published_vae: ClassVar[VAEFactors] = VAEFactors(8, 32, 128, "published (LTX-Video VAE)")
    joint_text = False

    def vae_factors(self, vae: Mapping[str, Any], where: str) -> VAEFactors:
        # AutoencoderKLLTXVideo's own defaults: patch 4 x 4 x 1 (space, time), three of four blocks
        # halving both (spatio_temporal_scaling), 128 channels; explicit ratios win
        scaling = vae.get("spatio_temporal_scaling", [True, True, True, False])
        if not isinstance(scaling, list | tuple):
            raise ConfigError(
                f"{where}: key 'spatio_temporal_scaling' should be a list of booleans, but got {scaling!r}"
            )
        halvings = 2 ** sum(bool(x) for x in scaling)
        if vae.get("temporal_compression_ratio") is None:
            temporal = config_int(vae, "patch_size_t", 1, where) * halvings
        else:
            temporal = config_int(vae, "temporal_compression_ratio", None, where)
        if vae.get("spatial_compression_ratio") is None:
            spatial = config_int(vae, "patch_size", 4, where) * halvings
        else:
            spatial = config_int(vae, "spatial_compression_ratio", None, where)
        return VAEFactors(temporal, spatial, config_int(vae, "latent_channels", 128, where), where)

    def patch_sizes(self, cfg: DiTConfig) -> tuple[int, int, int]:
        where = f"config.json {cfg.path!r}"
        p = config_int(cfg.transformer, "patch_size", 1, where)
        return config_int(cfg.transformer, "patch_size_t", 1, where), p, p

    def latents(self, cfg: DiTConfig, frames: int, height: int, width: int) -> Latents:
        check_clip(frames, height, width)
        p_t, p_h, p_w = self.patch_sizes(cfg)
        t, s = cfg.vae.temporal, cfg.vae.spatial
        if height % 32 or width % 32:
            raise ConfigError(
                f"LTX-Video takes height and width that are multiples of 32 (LTXPipeline.check_inputs), "
                f"but got {height} x {width}"
            )
        if (p_t, p_h, p_w) != (1, 1, 1):
            raise ConfigError(
                f"config.json {cfg.path!r}: LTXPipeline gives the transformer's rotary positions the unpatched "
                f"latent grid, so it takes patch_size and patch_size_t 1 only, but got {p_h} and {p_t}"
            )
        lh, lw = height // s, width // s  # as prepare_latents floors them
        lf = (frames - 1) // t + 1
        return Latents(lf, lh, lw, lf * lh * lw)

    # -- the cost model --------------------------------------------------------------------------

    def _dims(self, cfg: DiTConfig) -> dict[str, int]:
        where = f"config.json {cfg.path!r}"
        heads = config_int(cfg.transformer, "num_attention_heads", 32, where)
        channels = config_int(cfg.transformer, "in_channels", 128, where)
        return {
            "D": heads * config_int(cfg.transformer, "attention_head_dim", 64, where),
            "heads": heads,
            "layers": config_int(cfg.transformer, "num_layers", 28, where),
            "cross": config_int(cfg.transformer, "cross_attention_dim", 2048, where),
            "caption": config_int(cfg.transformer, "caption_channels", 4096, where),
            "in": channels,
            "out": config_int(cfg.transformer, "out_channels", channels, where),
        }

    def params(self, cfg: DiTConfig, lora_rank: int = 16) -> DiTParams:
        d = self._dims(cfg)
        D, cross = d["D"], d["cross"]
        bias = D if cfg.get("attention_bias", True) else 0
        out_bias = D if cfg.get("attention_out_bias", True) else 0
        norms = 2 * D  # the RMSNorm of q and of k across heads (the blocks' own norms have no weights)
        self_attention = 4 * D * D + 3 * bias + out_bias + norms
        cross_attention = 2 * D * D + 2 * cross * D + 3 * bias + out_bias + norms  # keys and values from the text
        mlp = D * 4 * D + 4 * D + 4 * D * D + D  # FeedForward: four times the width
        block = self_attention + cross_attention + mlp + 6 * D  # and the scale-shift table
        time = 256 * D + D + D * D + D + D * 6 * D + 6 * D  # AdaLayerNormSingle: the timestep MLP, six D-vectors
        outside = (
            d["in"] * D + D + 2 * D  # proj_in and the head's scale-shift table
            + time
            + d["caption"] * D + D + D * D + D  # the caption projection
            + D * d["out"] + d["out"]  # proj_out
        )  # fmt: skip
        # q, k, v and out of the self-attention (D -> D); q and out of the cross-attention, and its
        # keys and values from the text (cross -> D)
        lora = d["layers"] * lora_rank * (6 * 2 * D + 2 * (cross + D))
        return DiTParams(d["layers"] * block + outside, 0, block, lora)

    def step_terms(self, cfg: DiTConfig, train: str, lora_rank: int = 16) -> StepTerms:
        # NOTE [ What an LTX-Video block keeps ]
        d = self._dims(cfg)
        D, H = d["D"], d["heads"]
        if train == "lora":
            video, text = 48 * D + 8 * H + 12 * lora_rank + 20, 8 * D + 2 * H + 4 * lora_rank + 4
        else:
            video, text = 78 * D + 8 * H + 20, 12 * D + 2 * H + 4
        held = held_inputs(D, d["layers"])
        block = BlockTerms(d["layers"], video, text, checkpoint=2 * D, backward=held + 14 * D, fsdp_backward=held)
        loss = 4 * d["out"]  # the fp32 loss's difference
        if train == "lora":
            outside, outside_text = 4 * D + loss + lora_mlp_peak(4 * D), 2 * D
        else:
            outside, outside_text = 14 * D + 2 * d["in"] + loss + 4, 6 * D + 2 * d["caption"]
        return StepTerms((block,), outside=outside, outside_text=outside_text)

    # -- the measured mode ----------------------------------------------------------------------

    def inputs(
        self, cfg: DiTConfig, batch: int, latents: Latents, text_tokens: int, dtype: torch.dtype
    ) -> dict[str, Any]:
        import torch  # optional: the measured mode only

        where = f"config.json {cfg.path!r}"
        text_dim = config_int(cfg.transformer, "caption_channels", 4096, where)
        channels = config_int(cfg.transformer, "in_channels", 128, where)
        out = config_int(cfg.transformer, "out_channels", 128, where)
        t, s = cfg.vae.temporal, cfg.vae.spatial
        return {
            # the pipeline's packed latents: one token per latent pixel
            "hidden_states": torch.empty(batch, latents.tokens, channels, dtype=dtype),
            "encoder_hidden_states": torch.empty(batch, text_tokens, text_dim, dtype=dtype),
            "timestep": torch.empty(batch, dtype=torch.long),
            "encoder_attention_mask": torch.ones(batch, text_tokens, dtype=torch.bool),
            "num_frames": latents.frames,
            "height": latents.height,
            "width": latents.width,
            "rope_interpolation_scale": (t / FRAME_RATE, s, s),
            "target": torch.empty(batch, latents.tokens, out, dtype=dtype),
        }


DIT = LTXVideo()
