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

NOTE [ What a CogVideoX block keeps ]
A block runs its text and video tokens through the same ops (the attention over the joined
sequence, and one MLP over the joined norm outputs), so it keeps as much a text token as a video
token: ``46 D + 12 heads + 8`` bytes in full training. That is the bf16 inputs of q/k/v (the
joined sequence), of the output projection (the attention output, copied when its heads are
merged) and of the MLP (2 D each); q and k before and after their per-head LayerNorm, v and flash
attention's output (12 D); the two modulated LayerNorms' inputs and outputs (8 D); the attention's
and the MLP's outputs, which their gates multiply (4 D); the MLP's GELU input and output (16 D: it
is ``4 D`` wide); a head's fp32 log-sum-exp and the bf16 mean and rstd of its q and k LayerNorms
(12 bytes: fake CPU tensors record LayerNorm statistics in the input's dtype); the two LayerNorms'
statistics (8). The rotary positions of 5B and 1.5 keep nothing in a block (the tables are inputs,
kept once). Under LoRA, ``28 D + 12 heads + 8 r + 8``: the frozen modulations and projections keep
no norm outputs and no GELU output, and the four adapters keep their rank-``r`` middles.

Outside the blocks, a video token keeps ``8 D`` in the head (the inputs of ``norm_final``, of
``norm_out`` and of ``proj_out``, and ``norm_out``'s normalised output), the patch embedding's input
and the fp32 loss's difference; a text token the text projection's input (``2 x text_embed_dim``).
Under LoRA the head keeps ``2 D``, the first block nothing for its frozen input (``-2 D - 4`` a
token, text too), and the step peaks in the last block's MLP backward (NOTE [ LoRA's peak is in
the last block's MLP backward ] in :mod:`tokenbucket.models._dit_terms`). Under checkpointing the
measuring tracker holds ``4 D`` a video token for each of the other blocks unsharded, ``2 D``
under FSDP (NOTE [ Gradients the tracker holds through backward ] there); the backward's working
set beyond that is ``7 D`` a video token unsharded, fitted to the measured peaks, and none under
FSDP. These counts are checked by ``tests/test_dit_cost.py`` against the tensors autograd saves in
diffusers' own block.

NOTE [ CogVideoX's position table ]
With sin-cos positions (2B) or learned ones (5B-I2V) the patch embedding holds a table of
``(max_text_seq_length + sample latent tokens) x D`` values as a buffer, built in float64 (273 MB
for 2B): :attr:`DiTParams.buffers`. It is not a parameter, so FSDP leaves it whole on every rank.
The class builds it so; a script that casts the whole transformer to bf16 holds a quarter of it.

Example:
    >>> from tokenbucket import DiTConfig
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

    # -- the cost model --------------------------------------------------------------------------

    def _dims(self, cfg: DiTConfig) -> dict[str, int]:
        where = f"config.json {cfg.path!r}"
        heads = config_int(cfg.transformer, "num_attention_heads", 30, where)
        head_dim = config_int(cfg.transformer, "attention_head_dim", 64, where)
        p_t, p, _ = self.patch_sizes(cfg)
        ofs = cfg.get("ofs_embed_dim") or 0
        return {
            "D": heads * head_dim,
            "heads": heads,
            "head_dim": head_dim,
            "layers": config_int(cfg.transformer, "num_layers", 30, where),
            "in": config_int(cfg.transformer, "in_channels", 16, where),
            "out": config_int(cfg.transformer, "out_channels", 16, where) * p_t * p * p,
            "patch": p_t * p * p,
            "text": config_int(cfg.transformer, "text_embed_dim", 4096, where),
            "time": config_int(cfg.transformer, "time_embed_dim", 512, where),
            "ofs": int(ofs),
        }

    def params(self, cfg: DiTConfig, lora_rank: int = 16) -> DiTParams:
        d = self._dims(cfg)
        D, T, hd = d["D"], d["time"], d["head_dim"]
        affine = 2 * D if cfg.get("norm_elementwise_affine", True) else 0  # a LayerNorm's weight and bias
        qkv_bias = 3 * D if cfg.get("attention_bias", True) else 0
        modulation = T * 6 * D + 6 * D + affine  # CogVideoXLayerNormZero: six D-vectors from the time embedding
        attention = 4 * D * D + qkv_bias + D + 2 * 2 * hd  # q, k, v, out; LayerNorm of q and k per head
        mlp = D * 4 * D + 4 * D + 4 * D * D + D  # FeedForward: four times the width
        block = 2 * modulation + attention + mlp
        if self._temporal_patch(cfg) is None:  # a Conv2d, its bias per patch_bias
            patch = d["in"] * d["patch"] * D + (D if cfg.get("patch_bias", True) else 0)
        else:  # CogVideoX 1.5: a Linear, always biased (patch_bias only reaches the Conv2d)
            patch = d["in"] * d["patch"] * D + D
        ofs = 2 * (d["ofs"] * d["ofs"] + d["ofs"])  # CogVideoX 1.5 I2V's frame-offset embedding
        outside = (
            patch + d["text"] * D + D  # the patch embedding and the text projection
            + D * T + T + T * T + T + ofs  # the time embedding
            + affine + T * 2 * D + 2 * D + affine  # norm_final, norm_out (scale and shift from the time embedding)
            + D * d["out"] + d["out"]  # proj_out
        )  # fmt: skip
        lora = d["layers"] * 4 * lora_rank * 2 * D  # q, k, v and out of the one attention, D -> D each
        return DiTParams(d["layers"] * block + outside, 0, block, lora, self._table_bytes(cfg, d))

    def _table_bytes(self, cfg: DiTConfig, d: dict[str, int]) -> int:
        """NOTE [ CogVideoX's position table ]: the buffer's bytes (none with rotary positions only)."""
        rotary = bool(cfg.get("use_rotary_positional_embeddings", False))
        if rotary and not cfg.get("use_learned_positional_embeddings", False):
            return 0
        where = f"config.json {cfg.path!r}"
        _, p, _ = self.patch_sizes(cfg)
        frames = config_int(cfg.transformer, "sample_frames", 49, where)
        ratio = config_int(cfg.transformer, "temporal_compression_ratio", 4, where)
        sample = (
            (config_int(cfg.transformer, "sample_height", 60, where) // p)
            * (config_int(cfg.transformer, "sample_width", 90, where) // p)
            * ((frames - 1) // ratio + 1)
        )
        text = config_int(cfg.transformer, "max_text_seq_length", 226, where)
        return 8 * d["D"] * (text + sample)  # float64

    def step_terms(self, cfg: DiTConfig, train: str, lora_rank: int = 16) -> StepTerms:
        # NOTE [ What a CogVideoX block keeps ]
        d = self._dims(cfg)
        D, H, ffn = d["D"], d["heads"], 4 * d["D"]
        # the pipeline's rotary cosines and sines (fp32, a head's width each), kept once for every block
        rotary = 8 * d["head_dim"] if cfg.get("use_rotary_positional_embeddings", False) else 0
        if train == "lora":
            token = 28 * D + 12 * H + 8 * lora_rank + 8
            outside, outside_text = 2 * D + rotary + 4 * d["out"] + 4 + lora_mlp_peak(ffn), -2 * D - 4
        else:
            token = 46 * D + 12 * H + 8
            outside = 8 * D + rotary + 2 * d["in"] * d["patch"] + 4 * d["out"] + 8
            outside_text = 2 * d["text"]
        held, unsharded = held_inputs(D, d["layers"]), held_inputs(D, d["layers"], per_block=4) + 7 * D
        block = BlockTerms(d["layers"], token, token, checkpoint=2 * D, backward=unsharded, fsdp_backward=held)
        return StepTerms((block,), outside=outside, outside_text=outside_text)

    # -- the measured mode ----------------------------------------------------------------------

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
            # the pipeline's rotary table: a cosine and a sine per video token and head channel, fp32
            kwargs["image_rotary_emb"] = (
                torch.empty(latents.tokens, heads_dim, dtype=torch.float32),
                torch.empty(latents.tokens, heads_dim, dtype=torch.float32),
            )
        if cfg.get("ofs_embed_dim"):  # CogVideoX 1.5 I2V's frame-offset condition
            kwargs["ofs"] = torch.empty(batch, dtype=dtype)
        kwargs["target"] = torch.empty(batch, latents.frames, out, *grid, dtype=dtype)
        return kwargs


DIT = CogVideoX()
