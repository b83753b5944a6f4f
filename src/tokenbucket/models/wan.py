"""Wan 2.1 and 2.2 (diffusers' ``WanTransformer3DModel``): a video DiT that cross-attends to umT5 text states.

Its pipelines (``WanPipeline``) encode a clip with ``AutoencoderKLWan``: 4 frames a latent frame
after the first (``scale_factor_temporal``), 8 pixels a side (``scale_factor_spatial``; 16 for
Wan 2.2 TI2V-5B's VAE, with 48 latent channels), then the transformer cuts ``(1, 2, 2)`` patches.
``WanPipeline.check_inputs`` refuses a height or width that is not a multiple of 16, and its
``__call__`` cuts a side down to a multiple of VAE x patch: a clip whose latents the patches do
not tile is refused here (the transformer's output would not match them). The latent frames are
``(F - 1) // 4 + 1``, as ``prepare_latents`` and the VAE's encoder count them; a count that is not
``4k + 1`` keeps that many latents (the encoder drops the frames past the last whole group).

NOTE [ What a Wan block keeps ]
Per video token, a block keeps about ``68 D + 4 ffn`` bytes for backward in full training: its
norms and gated residuals run in fp32 (``hidden_states.float()``, the fp32 modulation ``(1 +
scale) * norm(x) + shift`` and ``x + out * gate`` with fp32 gates), so the residual stream is kept
several times at 4 bytes a value beside the bf16 inputs of every projection, the RMS-normed
queries and keys, flash attention's output and the MLP's GELU input and output (2 bytes a value of
the MLP width each). Per text token, the cross-attention keeps its keys and values and their norm's
inputs: ``12 D``. Under LoRA the frozen projections keep no inputs for their weights' gradients,
and each adapter keeps its rank-``r`` middle: ``40.125 D + 2 ffn + 12 r`` and ``8 D + 4 r``. These are counted by ``tests/test_dit_cost.py`` from the
tensors autograd saves in diffusers' own block (1 and 2 blocks, two token counts, two widths and
two MLP widths). Outside the blocks the head's fp32 norm and modulation and the fp32 loss keep
about ``16 D`` a video token. Under checkpointing a block keeps its bf16 input (``2 D``).

Its backward's working set (NOTE [ The peaks of a DiT step ] in :mod:`tokenbucket.cost.dit`) is
``4 D`` a video token for every block of the model, ``2 D`` under FSDP: it grows with the number
of blocks, not with the heads or the MLP width. The measured peak falls at the first block's
backward, once its recompute is done, and what it counts as backward temporaries there is
nothing of that block's own: it is two bf16 gradients ``T x D`` per block whose backward is
already over. Both are the gradients of a module input that shares its module with a tensor
every block reads: the block's own input (beside the text states and the time embedding) and the
cross-attention's normed query input (beside the text states). PyTorch's module tracker
(``ModTracker``, inside ``MemTracker``) waits on each module's inputs with a multi-gradient hook
that buffers every gradient until all of them have arrived, and the text states' gradient is whole
only when the last block's backward is done; so each block's two gradients stay live until the
end of backward. Under FSDP the peak holds one such gradient a block (which of the two was not
pinned down). Measured with diffusers' model on fake tensors, 75,600 video tokens, at width 1536
with 1, 2, 4 and 8 blocks, at widths 3072 and 5120 (24 and 40 heads; MLP 14336 and 13824) with 2
blocks, and in the published 30- and 40-block models: the backward temporaries at the peak are
``4.00 D`` a block at every width to a hundredth of ``D`` (``2.00 D`` under FSDP from 4 blocks up;
one and two blocks measure ``4 D`` and ``6 D`` there). This is why Wan 2.1 14B (40 blocks) measures ``160 D`` where the 30-block 1.3B and
5B measure ``120 D``. Because this memory is held by the measuring hooks, a run with no tracker
should not hold it: compare with ``torch.cuda.max_memory_allocated``
(``benchmarks/gpu_check_dit.py``) before trusting the checkpointed peak on a GPU.

Example:
    >>> from tokenbucket import DiTConfig
    >>> cfg = DiTConfig("wan", "WanTransformer3DModel", {"patch_size": [1, 2, 2]}, DIT.published_vae)
    >>> DIT.latents(cfg, 81, 480, 832)  # 21 latent frames of 60 x 104, 2 x 2 patches
    Latents(frames=21, height=60, width=104, tokens=32760)
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

if TYPE_CHECKING:
    import torch

__all__ = ["DIT", "WAN22_VAE"]

WAN22_VAE = VAEFactors(4, 16, 48, "published (Wan 2.2 VAE: its transformer takes 48 latent channels)")


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

    def default_vae(self, transformer: Mapping[str, Any]) -> VAEFactors:
        # Wan 2.2 TI2V-5B's VAE (16 pixels a latent, 48 channels) is the one whose latents have 48 channels
        if transformer.get("in_channels") == WAN22_VAE.channels:
            return WAN22_VAE
        return self.published_vae

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

    # -- the cost model --------------------------------------------------------------------------

    def _dims(self, cfg: DiTConfig) -> dict[str, int]:
        where = f"config.json {cfg.path!r}"
        if cfg.get("image_dim") is not None or cfg.get("added_kv_proj_dim") is not None:
            raise ConfigError(f"{where}: Wan's image conditioning (image_dim, added_kv_proj_dim) is not priced yet")
        heads = config_int(cfg.transformer, "num_attention_heads", 40, where)
        head_dim = config_int(cfg.transformer, "attention_head_dim", 128, where)
        channels = config_int(cfg.transformer, "in_channels", 16, where)
        return {
            "D": heads * head_dim,
            "heads": heads,
            "ffn": config_int(cfg.transformer, "ffn_dim", 13824, where),
            "layers": config_int(cfg.transformer, "num_layers", 40, where),
            "in": channels,
            "out": config_int(cfg.transformer, "out_channels", channels, where),
            "text": config_int(cfg.transformer, "text_dim", 4096, where),
            "freq": config_int(cfg.transformer, "freq_dim", 256, where),
        }

    def width(self, cfg: DiTConfig) -> int:
        return self._dims(cfg)["D"]

    def params(self, cfg: DiTConfig, lora_rank: int = 16) -> DiTParams:
        d = self._dims(cfg)
        D, ffn, patch = d["D"], d["ffn"], math.prod(self.patch_sizes(cfg))
        qk_norm = 2 * D if cfg.get("qk_norm", "rms_norm_across_heads") else 0
        cross_norm = 2 * D if cfg.get("cross_attn_norm", True) else 0
        attention = 4 * (D * D + D) + qk_norm
        block = 2 * attention + cross_norm + (D * ffn + ffn) + (ffn * D + D) + 6 * D
        time_embedder = d["freq"] * D + D + D * D + D
        outside = (
            d["in"] * patch * D + D  # the patch embedding
            + time_embedder + 6 * D * D + 6 * D  # the time embedding and its projection
            + d["text"] * D + D + D * D + D  # the text projection
            + D * d["out"] * patch + d["out"] * patch + 2 * D  # the output head and its scale-shift table
        )  # fmt: skip
        # NOTE [ Modules kept in fp32 ]: the time embedder, the scale-shift tables and norm2
        fp32 = time_embedder + 2 * D + d["layers"] * (6 * D + cross_norm)
        lora = d["layers"] * 8 * lora_rank * 2 * D  # q, k, v and out of both attentions, D -> D each
        return DiTParams(d["layers"] * block + outside, fp32, block, lora)

    def matmul_params(self, cfg: DiTConfig) -> tuple[int, int]:
        # a video token meets self-attention's four projections, cross-attention's query and output,
        # the MLP, the patch embedding and the head; a text token cross-attention's keys and values
        # and the text projection
        d = self._dims(cfg)
        D, patch = d["D"], math.prod(self.patch_sizes(cfg))
        video = d["layers"] * (6 * D * D + 2 * D * d["ffn"]) + d["in"] * patch * D + D * d["out"] * patch
        return video, d["layers"] * 2 * D * D + d["text"] * D + D * D

    def step_terms(self, cfg: DiTConfig, train: str, lora_rank: int = 16) -> StepTerms:
        # NOTE [ What a Wan block keeps ]
        d = self._dims(cfg)
        D, ffn = d["D"], d["ffn"]
        if train == "lora":
            video, text = 40.125 * D + 2 * ffn + 12 * lora_rank + 36, 8 * D + 4 * lora_rank + 4
        else:
            video, text = 68.125 * D + 4 * ffn + 36, 12 * D + 4
        # NOTE [ What a Wan block keeps ]: at the checkpointed peak the tracker's hooks hold two bf16
        # gradients a video token for every block (one under FSDP)
        layers = d["layers"]
        block = BlockTerms(layers, video, text, checkpoint=2 * D, backward=4 * D * layers,
                           fsdp_backward=2 * D * layers)  # fmt: skip
        return StepTerms((block,), outside=16 * D, outside_text=4 * D)

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
