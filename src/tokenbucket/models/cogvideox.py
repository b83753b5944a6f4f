"""CogVideoX 1.0 and 1.5 (diffusers' ``CogVideoXTransformer3DModel``): a video DiT that joins T5 text states and video patches in one sequence.

Its pipeline (``CogVideoXPipeline``) encodes a clip with ``AutoencoderKLCogVideoX``: 4 frames a
latent frame after the first (``temporal_compression_ratio``), ``2 ** (len(block_out_channels) -
1)`` = 8 pixels a side, 16 latent channels; the latent frames are ``(F - 1) // 4 + 1`` as
``prepare_latents`` counts them. CogVideoX 1.0 (2B, 5B) cuts ``2 x 2`` patches of each latent
frame; CogVideoX 1.5 (``patch_size_t`` 2) cuts ``2 x 2 x 2`` patches, and ``CogVideoXPipeline``
pads the latent frames up to a multiple of ``patch_size_t`` (its ``__call__`` adds the frames
before ``prepare_latents``): the padded frames are tokens too, and :attr:`Latents.frames` counts
them. ``CogVideoXPipeline.check_inputs`` refuses a height or width that is not a multiple of 8; a
clip whose latents the patches do not tile is refused here (the transformer floors them or fails).

The text and the video meet in one attention sequence (``joint_text``): the patch embedding puts
the projected text states before the video patches, and each block takes the two apart again
(``hidden_states``, the video, and ``encoder_hidden_states``, the text); :attr:`Latents.tokens`
counts the video only. The text is always ``max_text_seq_length`` (226) states: the pipeline pads
and cuts every prompt to that many T5 tokens, and the sin-cos (2B) and learned (5B-I2V) position
tables are laid out for exactly that many, so :meth:`CogVideoX.text_tokens` answers it whatever
the cache says.

Positions bound the sizes: the learned table of CogVideoX-5B-I2V (``use_learned_positional_embeddings``)
takes its ``sample_height x sample_width`` latents only (480 x 720 pixels; the patch embedding
refuses any other), and CogVideoX 1.5's rotary table (``_prepare_rotary_positional_embeddings``)
reaches ``sample_height / 2 x sample_width / 2`` patches (300 x 300 latents: 2400 x 2400 pixels).

Example:
    >>> from tokenbucket.models._dit import DiTConfig
    >>> cfg = DiTConfig("cogvideox", "CogVideoXTransformer3DModel", {"patch_size": 2}, DIT.published_vae)
    >>> DIT.latents(cfg, 49, 480, 720)  # 13 latent frames of 60 x 90, 2 x 2 patches
    Latents(frames=13, height=60, width=90, tokens=17550)
    >>> v15 = {"patch_size_t": 2, "use_rotary_positional_embeddings": True, "sample_height": 300, "sample_width": 300}
    >>> cfg15 = DiTConfig("cogvideox1.5", "CogVideoXTransformer3DModel", v15, DIT.published_vae)
    >>> DIT.latents(cfg15, 81, 768, 1360)  # 21 latent frames padded to 22, 2 x 2 x 2 patches
    Latents(frames=22, height=96, width=170, tokens=44880)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._dit import DiTConfig, Latents, VAEFactors, VideoDiT, check_clip, config_int

if TYPE_CHECKING:
    import torch

__all__ = ["DIT"]


class CogVideoX(VideoDiT):
    name = "cogvideox"
    class_names = ("CogVideoXTransformer3DModel",)
    published_vae: ClassVar[VAEFactors] = VAEFactors(4, 8, 16, "published (CogVideoX VAE)")
    joint_text = True

    def vae_factors(self, vae: Mapping[str, Any], where: str) -> VAEFactors:
        # AutoencoderKLCogVideoX's own defaults: temporal ratio 4, four blocks (three halvings), 16 channels
        blocks = vae.get("block_out_channels", [128, 256, 256, 512])
        if not isinstance(blocks, list | tuple) or not blocks:
            raise ConfigError(f"{where}: key 'block_out_channels' should be a non-empty list, but got {blocks!r}")
        return VAEFactors(
            config_int(vae, "temporal_compression_ratio", 4, where),
            2 ** (len(blocks) - 1),
            config_int(vae, "latent_channels", 16, where),
            where,
        )

    def _temporal_patch(self, cfg: DiTConfig) -> int | None:
        """``patch_size_t`` (CogVideoX 1.5), or ``None``: no temporal patch (CogVideoX 1.0)."""
        if cfg.transformer.get("patch_size_t") is None:
            return None
        return config_int(cfg.transformer, "patch_size_t", None, f"config.json {cfg.path!r}")

    def patch_sizes(self, cfg: DiTConfig) -> tuple[int, int, int]:
        p = config_int(cfg.transformer, "patch_size", 2, f"config.json {cfg.path!r}")
        return self._temporal_patch(cfg) or 1, p, p

    def latents(self, cfg: DiTConfig, frames: int, height: int, width: int) -> Latents:
        check_clip(frames, height, width)
        where = f"config.json {cfg.path!r}"
        p_t, p, _ = self.patch_sizes(cfg)
        t, s = cfg.vae.temporal, cfg.vae.spatial
        if height % 8 or width % 8:
            raise ConfigError(
                f"CogVideoX takes height and width that are multiples of 8 (CogVideoXPipeline.check_inputs), "
                f"but got {height} x {width}"
            )
        lh, lw = height // s, width // s
        if lh % p or lw % p:
            raise ConfigError(
                f"CogVideoX's latents of a {height} x {width} clip are not whole {p} x {p} patches: height and width "
                f"should be multiples of {s * p} x {s * p} (VAE {s} x patch)"
            )
        rotary = bool(cfg.get("use_rotary_positional_embeddings", False))
        if cfg.get("use_learned_positional_embeddings", False):
            sh = config_int(cfg.transformer, "sample_height", 60, where)
            sw = config_int(cfg.transformer, "sample_width", 90, where)
            if (lh, lw) != (sh, sw):
                raise ConfigError(
                    f"CogVideoX's learned positions (use_learned_positional_embeddings) take latents of "
                    f"sample_height x sample_width = {sh} x {sw} only (CogVideoXPatchEmbed.forward), "
                    f"but a {height} x {width} clip makes {lh} x {lw}"
                )
        lf = (frames - 1) // t + 1
        if self._temporal_patch(cfg) is not None:
            if not rotary:
                raise ConfigError(
                    f"{where}: CogVideoX's sin-cos position table has no temporal patches: "
                    f"patch_size_t needs use_rotary_positional_embeddings"
                )
            sh = config_int(cfg.transformer, "sample_height", 60, where)
            sw = config_int(cfg.transformer, "sample_width", 90, where)
            if lh // p > sh // p or lw // p > sw // p:
                raise ConfigError(
                    f"CogVideoX's rotary table reaches {sh // p} x {sw // p} patches "
                    f"(sample_height x sample_width / patch_size; "
                    f"CogVideoXPipeline._prepare_rotary_positional_embeddings), "
                    f"but a {height} x {width} clip makes {lh // p} x {lw // p}"
                )
            lf += -lf % p_t  # CogVideoXPipeline.__call__ pads the latent frames to whole temporal patches
        return Latents(lf, lh, lw, (lf // p_t) * (lh // p) * (lw // p))

    def text_tokens(self, cfg: DiTConfig, text_tokens: int) -> int:
        # the pipeline pads (and cuts) every prompt to max_sequence_length, the transformer's max_text_seq_length
        return config_int(cfg.transformer, "max_text_seq_length", 226, f"config.json {cfg.path!r}")

    def inputs(
        self, cfg: DiTConfig, batch: int, latents: Latents, text_tokens: int, dtype: torch.dtype
    ) -> dict[str, Any]:
        import torch  # optional: the measured mode only

        where = f"config.json {cfg.path!r}"
        text_dim = config_int(cfg.transformer, "text_embed_dim", 4096, where)
        channels = config_int(cfg.transformer, "in_channels", 16, where)
        out = config_int(cfg.transformer, "out_channels", 16, where)
        heads_dim = config_int(cfg.transformer, "attention_head_dim", 64, where)
        # CogVideoX lays its latents out frames first: [B, F', C, H', W']
        grid = (latents.height, latents.width)
        kwargs: dict[str, Any] = {
            "hidden_states": torch.empty(batch, latents.frames, channels, *grid, dtype=dtype),
            "encoder_hidden_states": torch.empty(batch, self.text_tokens(cfg, text_tokens), text_dim, dtype=dtype),
            "timestep": torch.empty(batch, dtype=torch.long),
        }
        if cfg.get("use_rotary_positional_embeddings", False):
            # the pipeline's rotary table: a cosine and a sine per video token and head channel
            kwargs["image_rotary_emb"] = (
                torch.empty(latents.tokens, heads_dim),
                torch.empty(latents.tokens, heads_dim),
            )
        if cfg.get("ofs_embed_dim"):  # CogVideoX 1.5 I2V's frame-offset condition
            kwargs["ofs"] = torch.empty(batch, dtype=dtype)
        kwargs["target"] = torch.empty(batch, latents.frames, out, *grid, dtype=dtype)
        return kwargs


DIT = CogVideoX()
