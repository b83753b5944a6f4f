"""Cosmos 1.0, Predict2 and Predict2.5 (diffusers' ``CosmosTransformer3DModel``): a video DiT that cross-attends to T5 (or Qwen) text states.

One transformer class, two VAEs. Cosmos-Predict2 and Predict2.5 (``Cosmos2VideoToWorldPipeline``,
``Cosmos2TextToImagePipeline``, ``Cosmos2_5_PredictBasePipeline``) encode a clip with the Wan 2.1
VAE (``AutoencoderKLWan``), whose factors the pipelines' ``__init__`` compute from its
``temperal_downsample`` flags: ``2 ** sum(flags)`` = 4 frames a latent frame after the first and
``2 ** len(flags)`` = 8 pixels a side, ``z_dim`` 16 channels. Cosmos 1.0
(``CosmosTextToWorldPipeline``, ``CosmosVideoToWorldPipeline``) encodes with its own CV8x8x8 VAE
(``AutoencoderKLCosmos``): ``temporal_compression_ratio`` 8 and ``spatial_compression_ratio`` 8
from its config, ``latent_channels`` 16. Without a VAE config the Predict2 factors apply. The
latent frames are ``(F - 1) // t + 1`` as every Cosmos ``prepare_latents`` counts them, and the
transformer cuts ``(1, 2, 2)`` patches (``patch_size``). Every Cosmos pipeline's ``check_inputs``
refuses a height or width that is not a multiple of 16.

The transformer's own channels: its ``in_channels`` is the latents plus, for the video-to-world
checkpoints (``in_channels`` = ``out_channels`` + 1), the pipeline's conditioning mask
(``condition_mask``); with ``concat_padding_mask`` it adds one more, a ``padding_mask`` the
pipeline passes at pixel size and the transformer resizes to the latents with
``torchvision.transforms``: the measured mode (``tokenbucket profile``) of a Cosmos config with
``concat_padding_mask`` needs torchvision installed beside torch, as diffusers' own forward does
(the truth measurements here stand in for that resize: NOTE [ Cosmos's padding-mask resize ] in
:mod:`tokenbucket.cost.dit_profile`).

Positions bound the sizes: the rotary table holds ``max(max_size / patch_size)`` positions an axis
(128 for ``max_size`` (128, 240, 240)), and Cosmos 1.0's learned positions
(``extra_pos_embed_type`` "learnable") ``max_size / patch_size`` per axis (128 latent frames, 120
x 120 patches): a clip past them is refused, as the transformer fails on it.

NOTE [ What a Cosmos block keeps ]
Per video token, a block keeps ``60 D + 4 ffn + 20 heads + 12`` bytes in full training: the fp32
inputs of its three per-head RMSNorms (self q and k, cross q: 12 D); in bf16 the three modulated
LayerNorms' inputs and outputs and the three gated outputs (18 D), the inputs of the five
projections the video meets (10 D), the normed and rotated q and k, v and the attention outputs as
the kernels keep them (20 D); the MLP's GELU input and output (``4 ffn``); a head's fp32 RMSNorm
rstd of q and k, and a log-sum-exp of each attention (20 bytes); the LayerNorms' statistics (12).
Per text token, the cross-attention's keys and values: the keys' fp32 norm input, the normed keys
and the values (``12 D + 4 heads``). Under LoRA, ``40 D + 2 ffn + 20 heads + 12 r + 12`` and
``10 D + 4 heads + 4 r``: the frozen projections keep no inputs and the frozen modulations no norm
outputs; the adapters keep their rank-``r`` middles (six the video meets, two the text meets).
The blocks' text input, the prompt's states, is one tensor kept once.

Outside the blocks, a video token keeps the head's norm input and normalised output and
``proj_out``'s input (``6 D``), the rotary cosines and sines (fp32, a head's width each:
``8 x head_dim``), the patch embedding's input and the fp32 loss's difference; a text token its
states (``2 x text_embed_dim``). Under LoRA the rotary tables and the loss, and the step peaks in
the last block's MLP backward (NOTE [ LoRA's peak is in the last block's MLP backward ] in
:mod:`tokenbucket.models._dit_terms`). Under checkpointing the measuring tracker holds ``6 D`` a
video token for each of the other blocks unsharded, ``2 D`` under FSDP (NOTE [ Gradients the
tracker holds through backward ] there); the backward's working set beyond that is ``8 D``
unsharded, fitted to the measured peaks (Predict2 2B and 14B), and none under FSDP.

Example:
    >>> from tokenbucket import DiTConfig
    >>> cfg = DiTConfig("cosmos", "CosmosTransformer3DModel", {"patch_size": [1, 2, 2]}, DIT.published_vae)
    >>> DIT.latents(cfg, 93, 704, 1280)  # Predict2: 24 latent frames of 88 x 160, 1 x 2 x 2 patches
    Latents(frames=24, height=88, width=160, tokens=84480)
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
    patch_triple,
)
from tokenbucket.models._dit_terms import held_inputs, lora_mlp_peak, mlp_width

if TYPE_CHECKING:
    import torch

__all__ = ["DIT"]

# Cosmos2VideoToWorldPipeline.__call__'s default frame rate (it only scales the rotary time positions)
FPS = 16


class Cosmos(VideoDiT):
    name = "cosmos"
    class_names = ("CosmosTransformer3DModel",)
    published_vae: ClassVar[VAEFactors] = VAEFactors(4, 8, 16, "published (Cosmos-Predict2: Wan 2.1 VAE)")
    joint_text = False

    def vae_factors(self, vae: Mapping[str, Any], where: str) -> VAEFactors:
        kind = vae.get("_class_name", "AutoencoderKLWan")
        if kind == "AutoencoderKLCosmos":
            # Cosmos 1.0's CV8x8x8 VAE: its own defaults, ratios 8 and 8, 16 channels
            return VAEFactors(
                config_int(vae, "temporal_compression_ratio", 8, where),
                config_int(vae, "spatial_compression_ratio", 8, where),
                config_int(vae, "latent_channels", 16, where),
                where,
            )
        if kind != "AutoencoderKLWan":
            raise ConfigError(
                f"{where}: Cosmos pipelines encode with AutoencoderKLWan or AutoencoderKLCosmos, but got {kind!r}"
            )
        # AutoencoderKLWan's own default flags, read as the Cosmos pipelines' __init__ read them
        flags = vae.get("temperal_downsample", [False, True, True])
        if not isinstance(flags, list | tuple) or not flags:
            raise ConfigError(f"{where}: key 'temperal_downsample' should be a non-empty list, but got {flags!r}")
        return VAEFactors(
            2 ** sum(bool(x) for x in flags),
            2 ** len(flags),
            config_int(vae, "z_dim", 16, where),
            where,
        )

    def patch_sizes(self, cfg: DiTConfig) -> tuple[int, int, int]:
        return patch_triple(cfg, (1, 2, 2))

    def _max_size(self, cfg: DiTConfig) -> tuple[int, int, int]:
        value = cfg.get("max_size", [128, 240, 240])
        if (
            not isinstance(value, list | tuple)
            or len(value) != 3
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)
        ):
            raise ConfigError(
                f"config.json {cfg.path!r}: key 'max_size' should be three positive integers, got {value!r}"
            )
        return int(value[0]), int(value[1]), int(value[2])

    def latents(self, cfg: DiTConfig, frames: int, height: int, width: int) -> Latents:
        check_clip(frames, height, width)
        p_t, p_h, p_w = patch = self.patch_sizes(cfg)
        t, s = cfg.vae.temporal, cfg.vae.spatial
        if height % 16 or width % 16:
            raise ConfigError(
                f"Cosmos takes height and width that are multiples of 16 (the Cosmos pipelines' check_inputs), "
                f"but got {height} x {width}"
            )
        lf, lh, lw = (frames - 1) // t + 1, height // s, width // s
        if lh % p_h or lw % p_w:
            raise ConfigError(
                f"Cosmos's latents of a {height} x {width} clip are not whole {p_h} x {p_w} patches: height and width "
                f"should be multiples of {s * p_h} x {s * p_w} (VAE {s} x patch)"
            )
        if lf % p_t:
            raise ConfigError(f"Cosmos's {lf} latent frames of a {frames}-frame clip are not whole {p_t}-frame patches")
        axes = (lf // p_t, lh // p_h, lw // p_w)
        table = [m // q for m, q in zip(self._max_size(cfg), patch, strict=True)]
        if cfg.transformer.get("extra_pos_embed_type", "learnable") == "learnable":  # an explicit null: none
            limits, rule = table, "learned positions (extra_pos_embed_type 'learnable'): max_size / patch_size"
        else:
            limits, rule = [max(table)] * 3, "rotary table: max(max_size / patch_size) an axis"
        if any(a > m for a, m in zip(axes, limits, strict=True)):
            raise ConfigError(
                f"Cosmos's {rule} reaches {limits[0]} x {limits[1]} x {limits[2]} patches, but a {frames}-frame "
                f"{height} x {width} clip makes {axes[0]} x {axes[1]} x {axes[2]}"
            )
        return Latents(lf, lh, lw, axes[0] * axes[1] * axes[2])

    # -- the cost model --------------------------------------------------------------------------

    def _dims(self, cfg: DiTConfig) -> dict[str, int]:
        where = f"config.json {cfg.path!r}"
        if cfg.get("img_context_dim_in"):
            raise ConfigError(f"{where}: Cosmos's image context (img_context_dim_in) is not priced yet")
        heads = config_int(cfg.transformer, "num_attention_heads", 32, where)
        head_dim = config_int(cfg.transformer, "attention_head_dim", 128, where)
        return {
            "D": heads * head_dim,
            "heads": heads,
            "head_dim": head_dim,
            "ffn": mlp_width(cfg, heads * head_dim),
            "layers": config_int(cfg.transformer, "num_layers", 28, where),
            "in": config_int(cfg.transformer, "in_channels", 16, where),
            "out": config_int(cfg.transformer, "out_channels", 16, where),
            "text": config_int(cfg.transformer, "text_embed_dim", 1024, where),
            "adaln": config_int(cfg.transformer, "adaln_lora_dim", 256, where),
        }

    def params(self, cfg: DiTConfig, lora_rank: int = 16) -> DiTParams:
        d = self._dims(cfg)
        D, A, hd, text = d["D"], d["adaln"], d["head_dim"], d["text"]
        cells = math.prod(self.patch_sizes(cfg))
        # no biases anywhere in the blocks; three modulations (a rank-A bottleneck to three D-vectors),
        # the self-attention, the cross-attention (keys and values from the text), RMSNorms of q and k
        # per head, a GELU MLP
        block = 3 * (D * A + A * 3 * D) + 4 * D * D + 2 * D * D + 2 * text * D + 4 * hd + 2 * D * d["ffn"]
        padding = 1 if cfg.get("concat_padding_mask", True) else 0
        learned = 0
        if cfg.transformer.get("extra_pos_embed_type", "learnable") == "learnable":  # Cosmos 1.0
            learned = sum(m // q for m, q in zip(self._max_size(cfg), self.patch_sizes(cfg), strict=True)) * D
        projection = 0
        if cfg.get("use_crossattn_projection", False):  # Predict2.5: Qwen states down to the blocks' text width
            where = f"config.json {cfg.path!r}"
            channels = config_int(cfg.transformer, "encoder_hidden_states_channels", 1024, where)
            projection = config_int(cfg.transformer, "crossattn_proj_in_channels", 1024, where) * channels + channels
        outside = (
            (d["in"] + padding) * cells * D  # the patch embedding (the padding mask one more channel)
            + learned
            + D * D + D * 3 * D + D  # the time embedding and its RMSNorm
            + D * A + A * 2 * D  # norm_out
            + D * cells * d["out"]  # proj_out
            + projection
        )  # fmt: skip
        # NOTE [ Modules kept in fp32 ]: the learned positions (learnable_pos_embed)
        lora = (
            d["layers"] * lora_rank * (6 * 2 * D + 2 * (text + D))
        )  # as LTX-Video's: self q k v out, cross q out, k v
        return DiTParams(d["layers"] * block + outside, learned, block, lora)

    def step_terms(self, cfg: DiTConfig, train: str, lora_rank: int = 16) -> StepTerms:
        # NOTE [ What a Cosmos block keeps ]
        d = self._dims(cfg)
        D, H, ffn, r = d["D"], d["heads"], d["ffn"], lora_rank
        if train == "lora":
            video, text = 40 * D + 2 * ffn + 20 * H + 12 * r + 12, 10 * D + 4 * H + 4 * r
        else:
            video, text = 60 * D + 4 * ffn + 20 * H + 12, 12 * D + 4 * H
        held, unsharded = held_inputs(D, d["layers"]), held_inputs(D, d["layers"], per_block=6) + 8 * D
        block = BlockTerms(d["layers"], video, text, checkpoint=2 * D, backward=unsharded, fsdp_backward=held)
        cells = math.prod(self.patch_sizes(cfg))
        padding = 1 if cfg.get("concat_padding_mask", True) else 0
        rotary, loss = 8 * d["head_dim"], 4 * d["out"] * cells
        if train == "lora":
            outside = rotary + loss + lora_mlp_peak(ffn)
        else:
            outside = 6 * D + rotary + 2 * (d["in"] + padding) * cells + loss + 4
        return StepTerms((block,), outside=outside, outside_text=2 * d["text"])

    # -- the measured mode ----------------------------------------------------------------------

    def inputs(
        self, cfg: DiTConfig, batch: int, latents: Latents, text_tokens: int, dtype: torch.dtype
    ) -> dict[str, Any]:
        import torch  # optional: the measured mode only

        where = f"config.json {cfg.path!r}"
        text_dim = config_int(cfg.transformer, "text_embed_dim", 1024, where)
        if cfg.get("use_crossattn_projection", False):  # Predict2.5: projects Qwen states down to text_embed_dim
            text_dim = config_int(cfg.transformer, "crossattn_proj_in_channels", 1024, where)
        channels = config_int(cfg.transformer, "in_channels", 16, where)
        out = config_int(cfg.transformer, "out_channels", 16, where)
        grid = (latents.frames, latents.height, latents.width)
        conditioned = channels == out + 1  # video-to-world: the last channel is the pipeline's condition mask
        kwargs: dict[str, Any] = {
            "hidden_states": torch.empty(batch, out if conditioned else channels, *grid, dtype=dtype),
            "timestep": torch.empty(batch, dtype=dtype),
            "encoder_hidden_states": torch.empty(batch, text_tokens, text_dim, dtype=dtype),
            "fps": FPS,
        }
        if conditioned:
            kwargs["condition_mask"] = torch.zeros(batch, 1, *grid, dtype=dtype)
        if cfg.get("concat_padding_mask", True):
            s = cfg.vae.spatial
            kwargs["padding_mask"] = torch.zeros(1, 1, latents.height * s, latents.width * s, dtype=dtype)
        kwargs["target"] = torch.empty(batch, out, *grid, dtype=dtype)
        return kwargs


DIT = Cosmos()
