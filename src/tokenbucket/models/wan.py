"""Wan 2.1 and 2.2 (diffusers' ``WanTransformer3DModel``): a video DiT that cross-attends to umT5 text states.

Its pipelines (``WanPipeline``) encode a clip with ``AutoencoderKLWan``: 4 frames a latent frame
after the first (``scale_factor_temporal``), 8 pixels a side (``scale_factor_spatial``; 16 for
Wan 2.2 TI2V-5B's VAE, with 48 latent channels), then the transformer cuts ``(1, 2, 2)`` patches.
``WanPipeline.check_inputs`` refuses a height or width that is not a multiple of 16, and its
``__call__`` cuts a side down to a multiple of VAE x patch: a clip whose latents the patches do
not tile is refused here (the transformer's output would not match them). The latent frames are
``(F - 1) // 4 + 1``, as ``prepare_latents`` and the VAE's encoder count them; a count that is not
``4k + 1`` keeps that many latents (the encoder drops the frames past the last whole group).

Example:
    >>> from tokenbucket.models._dit import DiTConfig
    >>> cfg = DiTConfig("wan", "WanTransformer3DModel", {"patch_size": [1, 2, 2]}, DIT.published_vae)
    >>> DIT.latents(cfg, 81, 480, 832)  # 21 latent frames of 60 x 104, 2 x 2 patches
    Latents(frames=21, height=60, width=104, tokens=32760)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._dit import DiTConfig, Latents, VAEFactors, VideoDiT, check_clip, config_int

if TYPE_CHECKING:
    import torch

__all__ = ["DIT"]


def patch_triple(cfg: DiTConfig, default: tuple[int, int, int]) -> tuple[int, int, int]:
    """A ``patch_size`` key given as three positive integers ``(p_t, p_h, p_w)``."""
    value = cfg.get("patch_size", list(default))
    if (
        not isinstance(value, list | tuple)
        or len(value) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)
    ):
        raise ConfigError(
            f"config.json {cfg.path!r}: key 'patch_size' should be three positive integers, got {value!r}"
        )
    return int(value[0]), int(value[1]), int(value[2])


class Wan(VideoDiT):
    name = "wan"
    class_names = ("WanTransformer3DModel",)
    published_vae: ClassVar[VAEFactors] = VAEFactors(4, 8, 16, "published (Wan 2.1 VAE)")
    joint_text = False

    def vae_factors(self, vae: Mapping[str, Any], where: str) -> VAEFactors:
        # AutoencoderKLWan's own defaults: scale factors 4 and 8, z_dim 16
        return VAEFactors(
            config_int(vae, "scale_factor_temporal", 4, where),
            config_int(vae, "scale_factor_spatial", 8, where),
            config_int(vae, "z_dim", 16, where),
            where,
        )

    def patch_sizes(self, cfg: DiTConfig) -> tuple[int, int, int]:
        return patch_triple(cfg, (1, 2, 2))

    def latents(self, cfg: DiTConfig, frames: int, height: int, width: int) -> Latents:
        check_clip(frames, height, width)
        p_t, p_h, p_w = self.patch_sizes(cfg)
        t, s = cfg.vae.temporal, cfg.vae.spatial
        if height % 16 or width % 16:
            raise ConfigError(
                f"Wan takes height and width that are multiples of 16 (WanPipeline.check_inputs), "
                f"but got {height} x {width}"
            )
        if height % (s * p_h) or width % (s * p_w):
            raise ConfigError(
                f"Wan's latents of a {height} x {width} clip are not whole {p_h} x {p_w} patches: height and width "
                f"should be multiples of {s * p_h} x {s * p_w} (VAE {s} x patch; WanPipeline cuts them down)"
            )
        lf = (frames - 1) // t + 1
        if lf % p_t:
            raise ConfigError(f"Wan's {lf} latent frames of a {frames}-frame clip are not whole {p_t}-frame patches")
        lh, lw = height // s, width // s
        return Latents(lf, lh, lw, (lf // p_t) * (lh // p_h) * (lw // p_w))

    def inputs(
        self, cfg: DiTConfig, batch: int, latents: Latents, text_tokens: int, dtype: torch.dtype
    ) -> dict[str, Any]:
        import torch  # optional: the measured mode only

        text_dim = config_int(cfg.transformer, "text_dim", 4096, f"config.json {cfg.path!r}")
        channels = config_int(cfg.transformer, "in_channels", 16, f"config.json {cfg.path!r}")
        out = config_int(cfg.transformer, "out_channels", channels, f"config.json {cfg.path!r}")
        grid = (latents.frames, latents.height, latents.width)
        return {
            "hidden_states": torch.empty(batch, channels, *grid, dtype=dtype),
            "timestep": torch.empty(batch, dtype=torch.long),
            "encoder_hidden_states": torch.empty(batch, text_tokens, text_dim, dtype=dtype),
            "target": torch.empty(batch, out, *grid, dtype=dtype),
        }


DIT = Wan()
