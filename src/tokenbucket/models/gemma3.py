"""Gemma 3: a SigLIP tower at 896 px, an average-pool + RMSNorm + linear projector, a Gemma 3 backbone.

NOTE [ Gemma 3 crops ]
The image processor resizes every image to the tower's square (896 x 896 for the published
checkpoints); with ``do_pan_and_scan`` it first cuts an image whose aspect ratio is at least
``pan_and_scan_min_ratio_to_activate`` into ``n`` crops along its long side (``n`` = the ratio
rounded half up, at most ``long side // pan_and_scan_min_crop_size``, clamped to
``[2, pan_and_scan_max_num_crops]``; none when a crop would be under the minimum size), decided
on the original size. The image and each crop are one tower pass of ``(image_size // patch)**2``
patches (4,096), which the projector pools 4 x 4 into ``mm_tokens_per_image`` (256) LLM tokens.
``Gemma3Processor`` fills the ``null`` values of ``preprocessor_config.json`` with its own
defaults: pan-and-scan off, min crop 256 px, at most 4 crops, ratio 1.2.

NOTE [ Gemma 3 wrapper tokens ]
The processor wraps each pass's 256 image tokens in ``\\n\\n<start_of_image>`` ...
``<end_of_image>\\n\\n`` and, with crops, a sentence naming them. Those are ordinary text
tokens of the prompt: ``llm_tokens`` counts the 256 per pass only, and the caller counts the
wrappers with its text.

NOTE [ Gemma 3 image attention ]
The processor returns ``token_type_ids`` (1 on image tokens) and training passes them: an
image's tokens then attend both ways within the image, so every text layer runs under an
explicit ``B x 1 x S x S`` mask (its sliding window and the causal rule folded in), not sdpa's
causal flag. The cost model prices it as PaliGemma's prefix-LM mask (``explicit_mask``).

NOTE [ Gemma 3 packed masks ]
Alone, ``Gemma3Model`` (transformers 5.24) turns ``token_type_ids`` into one block a run of
image tokens and builds two masks: ``"full_attention"`` = causal OR same image block, and
``"sliding_attention"`` = that AND ``kv > q - sliding_window`` (so an image token sees its whole
block ahead of it, but behind it only the window). Its forward takes ``attention_mask`` as a
dict keyed by layer type as it is (the path ``generate`` uses) and hands each layer its type's
mask. A packed row gets, per layer type, each sample's own mask on the block diagonal: the
rows' causal block-diagonal mask, OR the image blocks (runs of ``token_type_ids`` 1, a run cut
where a sample starts), and for the sliding layers AND the window over row indices, which
inside one sample are its position differences. With positions restarting at 0 per sample, the
row computes per sample what the sample alone computes, under SDPA (bool) and eager (additive)
(tests/test_packed_gemma.py). Without ``token_type_ids`` the model alone is causal in both
masks, and so is the row. Flash-attn has no such path: ``_supports_flash_attn`` is False (it
drops the image blocks) and ``cu_seqlens`` say causal blocks only, so a padding-free row is
refused. ``use_bidirectional_attention`` (EmbeddingGemma's text-only switch) is refused.

Example (gemma-3-4b's tower; pan-and-scan on for the second count):
    >>> from tokenbucket.models._hf_json import HFConfig
    >>> config = {"model_type": "gemma3", "vision_config": {"image_size": 896, "patch_size": 14}}
    >>> FAMILY.vision_inputs(HFConfig("<g>", config), 480, 1280)
    VisionInputs(tower_images=1, patches_per_image=4096, llm_tokens=256)
    >>> FAMILY.vision_inputs(HFConfig("<g>", config, {"do_pan_and_scan": True}), 480, 1280)
    VisionInputs(tower_images=4, patches_per_image=4096, llm_tokens=1024)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import (
    Family,
    Inputs,
    PackedAttention,
    Shape,
    TowerImage,
    VisionInputs,
    fixed_square,
    token_ids,
)
from tokenbucket.models._hf_json import HFConfig, is_side
from tokenbucket.models._stages import Projector, VisionTower, vit_tower
from tokenbucket.models.llava import VIT_DEFAULTS, image_token

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

__all__ = ["FAMILY", "GEMMA3_PAN_AND_SCAN", "Gemma3", "crops"]

# Gemma3Processor's images_kwargs: what a null (or absent) preprocessor value becomes
GEMMA3_PAN_AND_SCAN: dict[str, Any] = {
    "do_pan_and_scan": False,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


def crops(rule: Mapping[str, Any], height: int, width: int) -> int:
    """Pan-and-scan crops of one ``height x width`` image, the image itself not counted (NOTE [ Gemma 3 crops ])."""
    if not rule["pan_and_scan"]:
        return 0
    min_crop, max_crops, min_ratio = int(rule["min_crop"]), int(rule["max_crops"]), float(rule["min_ratio"])
    long, short = (width, height) if width >= height else (height, width)
    if long / short < min_ratio:
        return 0
    n = math.floor(long / short + 0.5)  # the processor's half-up rounding, in its float arithmetic
    n = min(math.floor(long / min_crop), n)
    n = min(max_crops, max(2, n))
    if min(math.ceil(long / n), short) < min_crop:
        return 0
    return n


class Gemma3(Family):
    name = "gemma3"
    unpacked_reason = None  # NOTE [ Gemma 3 packed masks ]
    model_types = ("gemma3",)
    hf_classes = {"gemma3": "Gemma3ForConditionalGeneration"}
    vision_attr = "vision_tower"
    text_type = "gemma3_text"
    vision_types = {"siglip_vision_model": VIT_DEFAULTS["siglip_vision_model"]}
    absent_vision = {"gemma3": {"model_type": "siglip_vision_model"}}  # transformers: SiglipVisionConfig()
    bidirectional_images = True  # NOTE [ Gemma 3 image attention ]

    def _tokens(self, cfg: HFConfig) -> int:
        return int(cfg.get(cfg.config, "", "mm_tokens_per_image", 256))

    def image_rule(self, cfg: HFConfig) -> dict[str, Any]:
        """The processor's pan-and-scan values (NOTE [ Gemma 3 crops ]), the tower's patches per
        pass and ``mm_tokens_per_image``."""
        side, patch = self.vision_int(cfg, "image_size"), self.vision_int(cfg, "patch_size")
        pre = {k: (v if (v := cfg.preprocessor.get(k)) is not None else d) for k, d in GEMMA3_PAN_AND_SCAN.items()}
        where = f"preprocessor_config.json next to {cfg.path!r}"
        if not isinstance(pre["do_pan_and_scan"], bool):
            raise ConfigError(f"{where}: key 'do_pan_and_scan' should be a bool, but got {pre['do_pan_and_scan']!r}")
        for key in ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops"):
            if not is_side(pre[key]):
                raise ConfigError(f"{where}: key {key!r} should be a positive integer, but got {pre[key]!r}")
        ratio = pre["pan_and_scan_min_ratio_to_activate"]
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio > 0:
            raise ConfigError(
                f"{where}: key 'pan_and_scan_min_ratio_to_activate' should be a positive number, but got {ratio!r}"
            )
        return {
            "pan_and_scan": pre["do_pan_and_scan"], "min_crop": pre["pan_and_scan_min_crop_size"],
            "max_crops": pre["pan_and_scan_max_num_crops"], "min_ratio": float(ratio),
            "side": side, "patch": patch, "patches": (side // patch) ** 2, "tokens": self._tokens(cfg),
        }  # fmt: skip

    def rule_inputs(self, rule: Mapping[str, Any], height: int, width: int) -> VisionInputs:
        passes = 1 + crops(rule, height, width)  # NOTE [ Gemma 3 wrapper tokens ]: the 256 image tokens only
        return VisionInputs(passes, int(rule["patches"]), passes * int(rule["tokens"]))

    def spec_fields(self, cfg: HFConfig) -> dict[str, Any] | None:
        rule = self.image_rule(cfg)
        if rule["pan_and_scan"]:
            return None  # the size decides the crops: the rule itself (resize="model")
        return fixed_square(rule)

    def default_image(self, cfg: HFConfig) -> tuple[int, int]:
        return self.tower_square(cfg)

    def tower_image(self, cfg: HFConfig) -> TowerImage:
        """One tower pass (the image, or one pan-and-scan crop): ``pixel_values`` holds a sample's
        passes, image after image (NOTE [ Gemma 3 crops ])."""
        rule = self.image_rule(cfg)
        channels = self.vision_int(cfg, "num_channels")
        return TowerImage(channels=channels, side=rule["side"], patches=rule["patches"], llm_tokens=rule["tokens"])

    def packed_attention(self, text: object) -> PackedAttention | None:
        """The two masks a packed row's layers take (NOTE [ Gemma 3 packed masks ])."""
        if getattr(text, "use_bidirectional_attention", False):
            raise ConfigError(
                "config (model_type='gemma3'): its text model sets use_bidirectional_attention, whose masks a packed "
                "row does not build (NOTE [ Gemma 3 packed masks ])"
            )
        window = getattr(text, "sliding_window", None)
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigError(
                f"config (model_type='gemma3'): sliding_window should be a positive integer, but got {window!r}"
            )
        return PackedAttention(masks=functools.partial(_packed_masks, window), windows=True)

    def vision_towers(self, cfg: HFConfig) -> tuple[VisionTower, ...]:
        table, where = self.vision_section(cfg)
        return (vit_tower(cfg, table, where, self.vision_types[str(table["model_type"])], reads_hidden=False),)

    def projector(self, cfg: HFConfig, tower: VisionTower, width: int) -> Projector | None:
        # Gemma3MultiModalProjector: avg-pool (image_size // patch) / sqrt(tokens) square, RMSNorm
        # over the tower width, a bias-free [tower width, LLM width] matrix
        if tower.image_size is None:
            raise AssertionError("a Gemma 3 tower has a fixed image size")
        per_side, tokens = tower.image_size // tower.patch, self._tokens(cfg)
        pool = per_side // max(1, math.isqrt(tokens))
        if pool < 1 or math.isqrt(tokens) ** 2 != tokens or (per_side // pool) ** 2 != tokens:
            raise ConfigError(
                f"config.json {cfg.path!r}: key 'mm_tokens_per_image' should be a square whose side divides "
                f"vision_config.image_size // patch_size = {per_side}, but got {tokens!r}"
            )
        return Projector(kind="pool_norm_linear", in_dim=tower.hidden, out_dim=width, bias=False, merge=pool,
                         norm="rmsnorm", norm_dim=tower.hidden)  # fmt: skip

    def tied(self, cfg: HFConfig, text_tie: bool) -> bool:
        # Gemma3Config ties the head to the embedding unless the root flag says otherwise
        return bool(cfg.get(cfg.config, "", "tie_word_embeddings", True, bool))

    def inputs(self, cfg: HFConfig, tconfig: PretrainedConfig, shape: Shape, dtype: torch.dtype) -> Inputs:
        vi = self.vision_inputs(cfg, shape.height, shape.width)
        n = vi.llm_tokens * shape.images
        ids = token_ids(shape, n)
        ids[:, :n] = image_token(tconfig)
        # NOTE [ Gemma 3 image attention ]: token_type_ids mark the image tokens, which attend
        # both ways within an image (the processor returns them; training passes them)
        tt = ids.new_zeros(ids.shape)
        tt[:, :n] = 1
        side = int(tconfig.vision_config.image_size)
        return {"input_ids": ids, "token_type_ids": tt}, {
            "pixel_values": ((vi.tower_images * shape.images * shape.batch, 3, side, side), dtype)
        }


def _packed_masks(
    window: int | None, causal: torch.Tensor, segment_ids: torch.Tensor, token_type_ids: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """``{"full_attention", "sliding_attention"}`` bool ``[R, 1, P, P]`` of packed rows (NOTE [ Gemma 3 packed masks ])."""
    import torch  # optional: the packed collate only (NOTE [ Families defer torch ])

    allowed = causal
    if token_type_ids is not None:
        image = token_type_ids == 1
        before = torch.nn.functional.pad(image, (1, 0))[:, :-1]
        starts = segment_ids != torch.nn.functional.pad(segment_ids, (1, 0), value=-1)[:, :-1]
        block = torch.where(image, (image & (~before | starts)).cumsum(-1), 0)  # 1, 2, ... a run; 0: text
        allowed = allowed | ((block[:, :, None] == block[:, None, :]) & image[:, :, None])[:, None]
    if window is None:
        return {"full_attention": allowed, "sliding_attention": allowed}
    index = torch.arange(segment_ids.shape[1], device=segment_ids.device)
    near = index[None, :] > index[:, None] - window  # [q, kv]: kv > q - window
    return {"full_attention": allowed, "sliding_attention": allowed & near}


FAMILY = Gemma3()
