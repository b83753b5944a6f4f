"""The stages a family's config describes: vision towers and projectors (plumbing of :mod:`tokenbucket.models`).

:class:`~tokenbucket.cost.hf_model.StagedModel` assembles them with the text backbone; the
cost model prices them (:mod:`tokenbucket.cost._stage_units`). Parameter counts are exact for
every supported family (the family tests compare them with transformers on the meta device).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._hf_json import HFConfig

__all__ = [
    "MAX_MLP_RATIO",
    "Norm",
    "Projector",
    "VisionTower",
    "linear_params",
    "norm_params",
    "unused_layers",
    "vit_tower",
    "window_squares",
]

Norm = Literal["layernorm", "rmsnorm"]

MAX_MLP_RATIO = 64  # a Qwen2-VL tower's MLP width over its width (4 in every published config)


def norm_params(kind: Norm, dim: int) -> int:
    return 2 * dim if kind == "layernorm" else dim


def linear_params(d_in: int, d_out: int, bias: bool) -> int:
    return d_in * d_out + (d_out if bias else 0)


@dataclass(frozen=True, kw_only=True)
class VisionTower:
    """One ViT: ``layers`` pre-norm blocks of width ``hidden`` over ``patch``-pixel patches.

    ``tokens_per_image`` is the tower's own sequence for a fixed-size tower (CLIP at 336: 576
    patches + the class token = 577); ``None`` for a dynamic-resolution tower (Qwen2-VL).
    ``unused_layers`` are the blocks after the layer the projector reads (LLaVA's
    ``vision_feature_layer=-2`` skips the last one) and ``post_norm_used`` says whether the final
    norm feeds the projector (CLIP's only normalises the pooled class token); a VLM never reads
    SigLIP's ``pooling_head``. All three still run, but get no gradient (NOTE [ Tower blocks
    past the feature layer ] in ``_stage_units``). ``position_rows`` is a learned position table
    of that many rows that a dynamic-resolution tower interpolates to each image's grid (Qwen3-VL's
    ``num_position_embeddings``; ``learned_positions`` is the fixed-size tower's own table).

    ``qkv_bias``: the q/k/v projections carry biases; ``linear_bias``: the attention output and
    MLP projections do (Pixtral has neither); ``qk_norm``: q and k pass through an RMSNorm over the
    full width before the heads split (InternViT-6B's); ``layer_scale``: a learned per-channel
    scale on each residual branch; ``batch_mask``: the tower runs every image of the batch as one
    sequence under a block-diagonal ``[1, 1, S, S]`` mask (Pixtral).

    ``window``: the side of the square windows most blocks attend within, in merged units
    (Qwen2.5-VL's ``window_size // spatial_merge_size // patch_size``; 0: every block attends
    over the whole pass); ``full_attention_blocks``: the blocks that attend over the whole pass
    all the same (``fullatt_block_indexes``). NOTE [ Windowed tower attention ].
    """

    name: str
    hidden: int
    layers: int
    heads: int
    ffn: int
    patch: int
    image_size: int | None = None
    temporal_patch: int = 1
    merge: int = 1
    channels: int = 3
    gated_mlp: bool = False
    norm: Norm = "layernorm"
    class_token: bool = False
    register_tokens: int = 0
    learned_positions: bool = True
    class_position: bool = True
    patch_bias: bool = True
    qkv_bias: bool = True
    qk_norm: bool = False
    pre_norm: bool = False
    post_norm: bool = True
    layer_scale: bool = False
    pooling_head: bool = False
    unused_layers: int = 0
    post_norm_used: bool = True
    position_rows: int = 0
    linear_bias: bool = True
    batch_mask: bool = False
    window: int = 0
    full_attention_blocks: tuple[int, ...] = ()

    @property
    def tokens_per_image(self) -> int | None:
        if self.image_size is None:
            return None
        return (self.image_size // self.patch) ** 2 + int(self.class_token) + self.register_tokens

    @property
    def layer_params(self) -> int:
        d, f = self.hidden, self.ffn
        lb = int(self.linear_bias)
        mlp = 3 * d * f + lb * (2 * f + d) if self.gated_mlp else 2 * d * f + lb * (f + d)
        attn = 4 * d * d + 3 * d * int(self.qkv_bias) + d * lb + (2 * d if self.qk_norm else 0)
        return attn + mlp + 2 * norm_params(self.norm, d) + (2 * d if self.layer_scale else 0)

    @property
    def params(self) -> int:
        d = self.hidden
        total = self.layers * self.layer_params
        total += self.channels * self.temporal_patch * self.patch**2 * d + (d if self.patch_bias else 0)
        if self.learned_positions:
            if self.image_size is None:
                raise AssertionError("learned positions need a fixed image size")
            total += ((self.image_size // self.patch) ** 2 + int(self.class_token and self.class_position)) * d
        total += (int(self.class_token) + self.register_tokens) * d
        total += self.position_rows * d  # a learned table interpolated to each image's grid (Qwen3-VL)
        total += norm_params(self.norm, d) * (int(self.pre_norm) + int(self.post_norm))
        return total + self.head_params

    @property
    def head_params(self) -> int:
        """The attention-pooling head's parameters: probe, attention (in/out), LayerNorm, MLP."""
        d = self.hidden
        return d + 4 * d * d + 4 * d + 2 * d + 2 * d * self.ffn + self.ffn + d if self.pooling_head else 0

    def attention_pairs(self, patches: int, grid: tuple[int, int] | None = None) -> int:
        """The (query, key) pairs one pass of ``patches`` tokens scores, summed over the blocks:
        ``layers x patches^2`` for a tower that attends over the whole pass, less for a windowing
        one (NOTE [ Windowed tower attention ]), which needs the pass's pre-merge patch ``grid``
        ``(rows, cols)``.

        Example:
            >>> t = VisionTower(name="w", hidden=64, layers=4, heads=4, ffn=128, patch=14, merge=2,
            ...                 window=4, full_attention_blocks=(3,))
            >>> t.attention_pairs(20 * 20, (20, 20))  # 1 full block; 3 windowed over 3 x 3 windows (4, 4, 2 units)
            222208
            >>> t.attention_pairs(20 * 20, (20, 20)) == 400**2 + 3 * 2**4 * (2 * 4**2 + 2**2) ** 2
            True
        """
        whole = self.layers * patches**2
        if not self.window:
            return whole
        if grid is None or grid[0] * grid[1] != patches or grid[0] % self.merge or grid[1] % self.merge:
            raise AssertionError(f"a windowing tower needs the pass's patch grid in whole merged units, got {grid}")
        m, full = self.merge, len(self.full_attention_blocks)
        windowed = m**4 * window_squares(grid[0] // m, self.window) * window_squares(grid[1] // m, self.window)
        return full * patches**2 + (self.layers - full) * windowed

    @property
    def unused_params(self) -> int:
        """Parameters that never get a gradient: the unused blocks, an unused final norm, the pooling head."""
        unused_norm = 0 if self.post_norm_used or not self.post_norm else norm_params(self.norm, self.hidden)
        return self.unused_layers * self.layer_params + unused_norm + self.head_params


# NOTE [ Windowed tower attention ]
# Qwen2.5-VL's tower (transformers' get_vision_window_index) cuts each tower pass (an image, or
# one temporal group of a clip) into square windows of w = window_size // spatial_merge_size //
# patch_size merged units a side (112 px, 2, 14: 4, so 8 x 8 pre-merge patches), laid from the
# top-left corner; the windows on the right and bottom edges hold what is left (an edge of n
# merged units is n // w whole windows and one of n % w). The blocks in fullatt_block_indexes
# attend over the whole pass, as Qwen2-VL's do; every other block attends within each window
# only. So a pass of rows x cols pre-merge patches (R x C merged units, m = the merge) scores
#     full blocks:     (rows x cols)^2 pairs each,
#     windowed blocks: m^4 x S(R) x S(C) pairs each, S(n) = (n // w) x w^2 + (n % w)^2,
# the windows' squared lengths summed (the window grid is a product, so the sum factors). An
# image within one window scores as under full attention; a large one about (w m)^2 / (rows x
# cols) as much in its windowed blocks. Attention FLOPs are 4 x hidden per pair (NOTE [ Staged
# FLOPs ]). No byte moves: sdpa and flash keep per token what they keep (a log-sum-exp per head),
# whatever the span, and the staged model prices no eager tower. tests/test_tower_windows.py
# holds the pairs to transformers' own tower, counted by torch's FlopCounterMode.


def window_squares(units: int, window: int) -> int:
    """The squared lengths of the windows along one edge of ``units`` merged units, summed
    (NOTE [ Windowed tower attention ]): ``units // window`` whole windows and one partial."""
    return (units // window) * window**2 + (units % window) ** 2


@dataclass(frozen=True, kw_only=True)
class Projector:
    """Vision features → LLM width: ``in_dim → *hidden_dims → out_dim`` linear layers.

    ``merge`` is the spatial fold it applies before the first layer (Qwen2-VL's PatchMerger folds
    2x2, so ``in_dim = 4 x vision hidden``; Idefics3's pixel shuffle folds ``scale_factor``²).
    ``deepstack`` more copies of its linear layers read intermediate tower blocks, each with a
    LayerNorm over its folded input (Qwen3-VL's DeepStack mergers, NOTE [ DeepStack mergers ] in
    ``tokenbucket.cost._stage_units``).
    """

    kind: str
    in_dim: int
    out_dim: int
    hidden_dims: tuple[int, ...] = ()
    bias: bool = True
    merge: int = 1
    norm: Norm | None = None
    norm_dim: int = 0
    extra_params: int = 0
    deepstack: int = 0

    @property
    def params(self) -> int:
        dims = (self.in_dim, *self.hidden_dims, self.out_dim)
        layers = sum(linear_params(a, b, self.bias) for a, b in itertools.pairwise(dims))
        total = layers + (norm_params(self.norm, self.norm_dim) if self.norm else 0) + self.extra_params
        return total + self.deepstack_params(layers)

    def deepstack_params(self, layers: int | None = None) -> int:
        """Qwen3-VL's DeepStack mergers: copies of the linear layers, each normalising its folded input."""
        if not self.deepstack:
            return 0
        if layers is None:
            dims = (self.in_dim, *self.hidden_dims, self.out_dim)
            layers = sum(linear_params(a, b, self.bias) for a, b in itertools.pairwise(dims))
        return self.deepstack * (layers + norm_params(self.norm or "layernorm", self.in_dim))


def vit_tower(
    cfg: HFConfig, table: dict[str, Any], where: str, defaults: Mapping[str, Any], *, reads_hidden: bool
) -> VisionTower:
    """A CLIP / SigLIP / Idefics3-style ViT read from ``vision_config`` (``table``): CLIP keeps a
    class token and a pre-norm; SigLIP may carry its attention-pooling head. ``reads_hidden``:
    the projector reads ``hidden_states[vision_feature_layer]`` (LLaVA), so the blocks after it
    and the final norm get no gradient (NOTE [ Tower blocks past the feature layer ])."""
    vt = str(table["model_type"])

    def num(key: str) -> int:
        return int(cfg.get(table, where, key, defaults.get(key)))

    width, heads = num("hidden_size"), num("num_attention_heads")
    cfg.check_divides(where, "num_attention_heads", heads, "hidden_size", width)
    clip = vt == "clip_vision_model"
    use_head = vt == "siglip_vision_model" and bool(cfg.get(table, where, "vision_use_head", True, bool))
    layers = num("num_hidden_layers")
    return VisionTower(
        name=vt, hidden=width, layers=layers, heads=heads, ffn=num("intermediate_size"), patch=num("patch_size"),
        image_size=num("image_size"), channels=num("num_channels"), class_token=clip, patch_bias=not clip,
        pre_norm=clip, pooling_head=use_head, unused_layers=unused_layers(cfg, layers) if reads_hidden else 0,
        post_norm_used=not reads_hidden and not clip,
    )  # fmt: skip


def unused_layers(cfg: HFConfig, layers: int, default: int = -2) -> int:
    """Blocks after the deepest ``vision_feature_layer`` (hidden_states[0] is the embedding output;
    ``default`` is the family's config default: LLaVA's -2, Mistral 3's -1)."""
    raw = cfg.config.get("vision_feature_layer", default)
    picks = raw if isinstance(raw, list) else [raw]
    if not picks or not all(isinstance(k, int) and not isinstance(k, bool) and -layers - 1 <= k <= layers
                            for k in picks):  # fmt: skip
        raise ConfigError(
            f"config.json {cfg.path!r}: key 'vision_feature_layer' should be a layer index in "
            f"[{-layers - 1}, {layers}] or a list of them, but got {raw!r}"
        )
    deepest = max(k if k >= 0 else layers + 1 + k for k in picks)
    return layers - int(deepest)
