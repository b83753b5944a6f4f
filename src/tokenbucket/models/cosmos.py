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
pipeline passes at pixel size and the transformer resizes to the latents (with torchvision).

Positions bound the sizes: the rotary table holds ``max(max_size / patch_size)`` positions an axis
(128 for ``max_size`` (128, 240, 240)), and Cosmos 1.0's learned positions
(``extra_pos_embed_type`` "learnable") ``max_size / patch_size`` per axis (128 latent frames, 120
x 120 patches): a clip past them is refused, as the transformer fails on it.

Example:
    >>> from tokenbucket.models._dit import DiTConfig
    >>> cfg = DiTConfig("cosmos", "CosmosTransformer3DModel", {"patch_size": [1, 2, 2]}, DIT.published_vae)
    >>> DIT.latents(cfg, 93, 704, 1280)  # Predict2: 24 latent frames of 88 x 160, 1 x 2 x 2 patches
    Latents(frames=24, height=88, width=160, tokens=84480)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._dit import DiTConfig, Latents, VAEFactors, VideoDiT, check_clip, config_int
from tokenbucket.models.wan import patch_triple

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
