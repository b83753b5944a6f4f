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

Example:
    >>> from tokenbucket.models._dit import DiTConfig
    >>> cfg = DiTConfig("hunyuan", "HunyuanVideoTransformer3DModel", {}, DIT.published_vae)
    >>> DIT.latents(cfg, 129, 720, 1280)  # 33 latent frames of 90 x 160, 1 x 2 x 2 patches
    Latents(frames=33, height=90, width=160, tokens=118800)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._dit import DiTConfig, Latents, VAEFactors, VideoDiT, check_clip, config_int

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
