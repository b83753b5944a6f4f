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

Example:
    >>> from tokenbucket.models._dit import DiTConfig
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
from tokenbucket.models._dit import DiTConfig, Latents, VAEFactors, VideoDiT, check_clip, config_int

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
