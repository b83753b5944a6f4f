"""InternVL 3: InternViT over 448-px tiles (dynamic tiling and a thumbnail), pixel shuffle 0.5, a Qwen2 backbone.

NOTE [ InternVL tiles ]
``InternVLProcessor`` always asks its image processor (``GotOcr2ImageProcessor``) to crop to
patches. Among the ``cols x rows`` grids with ``min_patches <= cols * rows <= max_patches``
(1 and 12 by default; sorted by tile count), it takes the one whose ``cols / rows`` is closest to
the image's ``width / height``; on a tie, the later (larger) grid wins while the image's area is
more than half the grid's pixels (``get_optimal_tiled_canvas``). The image is resized to that
grid and cut into ``size`` tiles (448 x 448), and a thumbnail (the whole image at 448) follows
when there is more than one tile. Each tile is one tower pass of ``(448 / 14)**2`` patches and
the class token; the pixel shuffle (``downsample_ratio`` 0.5) folds 2 x 2 patches, so a tile is
``(32 / 2)**2 = 256`` LLM tokens (``image_seq_length``). The ``<img>``/``</img>`` wrappers around
each image are text (NOTE [ HF image tokens ] in :mod:`tokenbucket.tokens.hf`).

Example (InternVL3-1B's processor; a 480 x 640 camera frame is 12 tiles and the thumbnail):
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> FAMILY.vision_inputs(HFConfig("<i>", {"model_type": "internvl"}), 480, 640)
    VisionInputs(tower_images=13, patches_per_image=1025, llm_tokens=3328)
    >>> FAMILY.vision_inputs(HFConfig("<i>", {"model_type": "internvl"}, {"max_patches": 6}), 480, 640).tower_images
    7
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import Family, Inputs, Shape, TowerImage, VisionInputs, token_ids
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.models._stages import Projector, VisionTower, unused_layers
from tokenbucket.models.llava import image_token

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "INTERNVL_PATCHES", "InternVL", "tile_grid"]

INTERNVL_PATCHES = (1, 12)  # GotOcr2ImageProcessor: (min_patches, max_patches)
# InternVLVisionConfig's defaults (InternViT-300M)
_TOWER: dict[str, Any] = {
    "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
    "attention_bias": False, "use_qk_norm": False, "norm_type": "layer_norm", "image_size": 448, "patch_size": 14,
    "num_channels": 3, "use_mask_token": False, "use_absolute_position_embeddings": True, "use_mean_pooling": True,
}  # fmt: skip


@lru_cache(maxsize=64)
def _arrangements(least: int, most: int) -> tuple[tuple[int, int], ...]:
    """``(cols, rows)`` grids of ``least..most`` tiles, by tile count (then cols, then rows)."""
    grids = [(c, r) for c in range(1, most + 1) for r in range(1, most + 1) if least <= c * r <= most]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def tile_grid(height: int, width: int, tile: int, least: int, most: int) -> tuple[int, int]:
    """The ``(cols, rows)`` grid the processor cuts a ``height x width`` image into (NOTE [ InternVL tiles ])."""
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in _arrangements(least, most):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * tile * tile * cols * rows:
            best = (cols, rows)
    return best


class InternVL(Family):
    name = "internvl"
    model_types = ("internvl",)
    hf_classes = {"internvl": "InternVLForConditionalGeneration"}
    vision_attr = "vision_tower"
    text_type = "qwen2"
    vision_types = {"internvl_vision": _TOWER}
    absent_vision = {"internvl": {"model_type": "internvl_vision"}}
    unpacked_reason = None

    def _square(self, cfg: HFConfig, key: str) -> int:
        """``image_size`` / ``patch_size``: an integer or an ``[h, w]`` pair, square (InternVL
        folds the tower's features as a square grid)."""
        table, where = self.vision_section(cfg)
        raw = table.get(key, _TOWER[key])
        pair = raw if isinstance(raw, list) and len(raw) == 2 else [raw, raw]
        if not all(type(v) is int and v > 0 for v in pair) or pair[0] != pair[1]:
            raise ConfigError(
                f"config.json {cfg.path!r}: key '{where}.{key}' should be a positive integer or a square [h, w] "
                f"pair, but got {raw!r}"
            )
        return int(pair[0])

    def merge(self, cfg: HFConfig) -> int:
        """``1 / downsample_ratio``: the pixel shuffle folds ``merge x merge`` patches into one token."""
        ratio = float(cfg.get(cfg.config, "", "downsample_ratio", 0.5, float))
        if not 0 < ratio <= 1 or abs(1 / ratio - round(1 / ratio)) > 1e-9:
            raise ConfigError(
                f"config.json {cfg.path!r}: key 'downsample_ratio' should be 1 / n for a positive integer n "
                f"(0.5 folds 2 x 2 patches), but got {ratio!r}"
            )
        return round(1 / ratio)

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        """The processor's tile (``size``; the tower's ``image_size`` when the preprocessor names none,
        since GotOcr2's own 384 does not fold into InternVL's square grid), ``min_patches`` and
        ``max_patches`` (1 and 12), and the tower's sequence and LLM tokens per tile."""
        side, patch, merge = self._square(cfg, "image_size"), self._square(cfg, "patch_size"), self.merge(cfg)
        tile_h, tile_w = cfg.sides("size", "height", side), cfg.sides("size", "width", side)
        if tile_h != tile_w:
            raise ConfigError(
                f"preprocessor_config.json next to {cfg.path!r}: key 'size' should be a square tile (InternVL folds "
                f"each tile's features as a square grid), but got height={tile_h}, width={tile_w}"
            )
        grid = tile_h // patch
        if grid < merge or grid % merge:
            raise ConfigError(
                f"config.json {cfg.path!r}: a {tile_h}-px tile is {grid} patches of {patch} px a side, which the "
                f"pixel shuffle cannot fold {merge} x {merge} (downsample_ratio={1 / merge:g})"
            )
        counts = []
        for key, default in zip(("min_patches", "max_patches"), INTERNVL_PATCHES, strict=True):
            value = cfg.preprocessor.get(key, default)
            if type(value) is not int or not 1 <= value <= 256:
                raise ConfigError(
                    f"preprocessor_config.json next to {cfg.path!r}: key {key!r} should be an integer in [1, 256], "
                    f"but got {value!r}"
                )
            counts.append(value)
        return {"tile": tile_h, "min": counts[0], "max": counts[1], "patches": grid * grid + 1,
                "seq": (grid // merge) ** 2}  # fmt: skip

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        cols, rows = tile_grid(height, width, int(rule["tile"]), int(rule["min"]), int(rule["max"]))
        n = cols * rows + (1 if cols * rows > 1 else 0)  # the thumbnail
        return VisionInputs(n, int(rule["patches"]), n * int(rule["seq"]))

    def tower_image(self, cfg: HFConfig) -> TowerImage:
        """One tile (the thumbnail is one too): ``pixel_values`` holds a sample's tiles, image after image."""
        rule = self.image_rule(cfg)
        channels = int(cfg.get(*self.vision_section(cfg), "num_channels", _TOWER["num_channels"]))
        return TowerImage(channels=channels, side=rule["tile"], patches=rule["patches"], llm_tokens=rule["seq"])

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        """The grid image with the most tiles (NOTE [ The worst sample of a length ])."""
        rule = self.image_rule(cfg)
        tile = int(rule["tile"])
        sizes = [(rows * tile, cols * tile) for cols, rows in _arrangements(int(rule["min"]), int(rule["max"]))]
        return max(sizes or [(tile, tile)], key=lambda hw: self.rule_inputs(rule, *hw).llm_tokens)

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)

        def num(key: str) -> int:
            return int(cfg.get(table, where, key, _TOWER[key]))

        def flag(key: str) -> bool:
            return bool(cfg.get(table, where, key, _TOWER[key], bool))

        width, heads, layers = num("hidden_size"), num("num_attention_heads"), num("num_hidden_layers")
        cfg.check_divides(where, "num_attention_heads", heads, "hidden_size", width)
        norm = cfg.get(table, where, "norm_type", _TOWER["norm_type"], str)
        if norm not in ("layer_norm", "rms_norm"):
            raise ConfigError(
                f"config.json {cfg.path!r}: key '{where}.norm_type' should be 'layer_norm' or 'rms_norm', "
                f"but got {norm!r}"
            )
        if flag("use_mask_token"):
            raise ConfigError(
                f"config.json {cfg.path!r}: key '{where}.use_mask_token'=true (masked image pre-training) is not "
                f"supported"
            )
        post_norm = not flag("use_mean_pooling")
        if post_norm and norm == "rms_norm":
            raise ConfigError(
                f"config.json {cfg.path!r}: use_mean_pooling=false with norm_type='rms_norm' (a LayerNorm after "
                f"RMSNorm blocks) is not supported"
            )
        # NOTE [ Tower blocks past the feature layer ]: -1 reads the normed last state; another
        # layer reads hidden_states[k], past the final norm
        feature = cfg.config.get("vision_feature_layer", -1)
        unused = unused_layers(cfg, layers) if feature != -1 else 0
        return (
            VisionTower(
                name="internvl_vision", hidden=width, layers=layers, heads=heads, ffn=num("intermediate_size"),
                patch=self._square(cfg, "patch_size"), image_size=self._square(cfg, "image_size"),
                channels=num("num_channels"), norm="rmsnorm" if norm == "rms_norm" else "layernorm",
                class_token=True, learned_positions=flag("use_absolute_position_embeddings"),
                qkv_bias=flag("attention_bias"), qk_norm=flag("use_qk_norm"), layer_scale=True, post_norm=post_norm,
                unused_layers=unused, post_norm_used=feature == -1,
            ),
        )  # fmt: skip

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        # multi_modal_projector: LayerNorm over the shuffled features, then linear, GELU, linear
        merge = self.merge(cfg)
        folded = tower.hidden * merge * merge
        return Projector(kind="mlp", in_dim=folded, out_dim=width, hidden_dims=(width,), merge=merge,
                         norm="layernorm", norm_dim=folded)  # fmt: skip

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        # InternVLConfig's root tie_word_embeddings defaults to true (InternVL3-1B-hf sets false: an untied head)
        return bool(cfg.get(cfg.config, "", "tie_word_embeddings", True, bool))

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        vi = self.vision_inputs(cfg, shape.height, shape.width)
        n = vi.llm_tokens * shape.images
        ids = token_ids(shape, n)
        ids[:, :n] = image_token(tconfig)
        side = int(self.image_rule(cfg)["tile"])
        count = vi.tower_images * shape.images * shape.batch
        return {"input_ids": ids}, {"pixel_values": ((count, 3, side, side), dtype)}


FAMILY = InternVL()
