"""Qwen2.5-VL's windowed vision tower priced as it windows (NOTE [ Windowed tower attention ]).

The oracle is transformers' own ``Qwen2_5_VisionTransformerPretrainedModel``, built in the test
from the same tiny ``vision_config`` the cost model reads (no download, no weights), run on real
CPU tensors with eager attention under torch's ``FlopCounterMode``: eager attention is two
``bmm`` per window or pass (scores and the weighted sum), so the counter's ``bmm`` FLOPs are the
tower's attention FLOPs, which ours must equal exactly. The grids fed to it are the family's
token rule's (``pass_grid``), which tests/test_families.py and tests/test_video_tokens.py hold to
transformers' image and video processors.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import StagedModel, staged_from_config
from tokenbucket.cost.staged import Sample, StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.models._hf_json import HFConfig

torch = pytest.importorskip("torch")
flop_counter = pytest.importorskip("torch.utils.flop_counter")
qwen2_5_vl = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")


def _config(**vision: Any) -> dict[str, Any]:
    return {
        "model_type": "qwen2_5_vl", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1024, "tie_word_embeddings": True,
        "vision_config": {"hidden_size": 64, "intermediate_size": 128, "out_hidden_size": 128, "num_heads": 4,
                          **vision},
    }  # fmt: skip


# the published layout scaled down (112-px windows: 4 merged units, 8 x 8 patches a side; the
# last block full), then other values the tower must be priced by: 84-px windows (3 units) with
# two full blocks, and 10-px patches with 100-px windows (5 units)
Q25 = _config(depth=4, window_size=112, fullatt_block_indexes=[3])
Q25_W3 = _config(depth=3, window_size=84, fullatt_block_indexes=[0, 2])
Q25_P10 = _config(depth=3, patch_size=10, window_size=100, fullatt_block_indexes=[1])

CASES = [
    # (config, sample, each pass's grid in merged units)
    pytest.param(Q25, Sample(images=1, height=112, width=112), (4, 4), id="w4-4x4-one-window"),
    pytest.param(Q25, Sample(images=1, height=84, width=140), (3, 5), id="w4-3x5-partial"),
    pytest.param(Q25, Sample(images=1, height=308, width=196), (11, 7), id="w4-11x7-partial"),
    pytest.param(Q25, Sample(images=2, height=336, width=336), (12, 12), id="w4-12x12-whole-two-images"),
    pytest.param(
        Q25, Sample(videos=1, frames=5, height=280, width=420, fps=2.0), (10, 15), id="w4-video-3-groups-10x15"
    ),
    pytest.param(Q25_W3, Sample(images=1, height=308, width=196), (11, 7), id="w3-11x7"),
    pytest.param(Q25_W3, Sample(images=1, height=84, width=84), (3, 3), id="w3-3x3-one-window"),
    pytest.param(Q25_W3, Sample(images=1, height=448, width=616), (16, 22), id="w3-16x22"),
    pytest.param(Q25_P10, Sample(images=1, height=220, width=140), (11, 7), id="p10-w5-11x7"),
]
# Our tower FLOPs (forward: 2 x parameters per patch in the blocks, 2 x the merger's per LLM
# token, attention 4 x hidden per pair) over the counter's matmuls: the counter leaves out bias
# adds and norm weights, which ours count as 2 FLOPs a parameter; at width 64 they are 1.7 % of
# a block (0.04 % at Qwen2.5-VL-7B's 1280). The patch embedding's convolution is left out of
# both (NOTE [ Staged FLOPs ]).
TOTAL_BAND = (0.0, 2.0)  # percent


def _hf_tower(config: dict[str, Any]) -> Any:
    vc = qwen2_5_vl.Qwen2_5_VLVisionConfig(**config["vision_config"])
    vc._attn_implementation = "eager"  # two bmm per span, which FlopCounterMode counts (sdpa's CPU kernel it does not)
    torch.manual_seed(0)
    return qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel(vc).eval()


def _counted(config: dict[str, Any], grid_thw: list[list[int]]) -> dict[str, int]:
    """transformers' tower forward on real tensors of ``grid_thw``: FLOPs by aten op."""
    tower = _hf_tower(config)
    vc = tower.config
    patches = sum(t * h * w for t, h, w in grid_thw)
    x = torch.randn(patches, vc.in_channels * vc.temporal_patch_size * vc.patch_size**2)
    with torch.no_grad(), flop_counter.FlopCounterMode(display=False) as counter:
        out = tower(x, grid_thw=torch.tensor(grid_thw))
    assert out.pooler_output.shape[0] == patches // vc.spatial_merge_size**2
    return {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}


def _cost(config: dict[str, Any]) -> StagedCostModel:
    cfg = HFConfig(f"<tiny {config['vision_config']}>", config)
    return StagedCostModel(staged_from_config(cfg), config=cfg)


def _tower_forward(cost: StagedCostModel, sample: Sample) -> int:
    """Our forward FLOPs of ``sample``'s tower and merger: the sample's less its text alone."""
    length = StagedLengthModel(cost)
    seq = cost.sample_vision(sample).llm_tokens + sample.text_tokens
    return length.sample_flops(1, sample).forward - length.sample_flops(1, Sample(text_tokens=seq)).forward


@pytest.mark.parametrize(("config", "sample", "merged"), CASES)
def test_tower_windows_flops_match_transformers_tower(
    config: dict[str, Any], sample: Sample, merged: tuple[int, int]
) -> None:
    cost = _cost(config)
    tower = cost.model.vision[0]
    vi = cost.sample_vision(sample)
    rows, cols = grid = cost.pass_grid(sample) or (0, 0)
    assert (rows // tower.merge, cols // tower.merge) == merged  # the case is the shape it says
    groups = vi.tower_images // (sample.videos or sample.images)  # temporal groups a clip, 1 an image
    grid_thw = [[groups, rows, cols]] * (sample.videos or sample.images)
    counted = _counted(config, grid_thw)
    ours_attention = 4 * tower.hidden * vi.tower_images * tower.attention_pairs(vi.patches_per_image, grid)
    assert ours_attention == counted["aten.bmm"]
    matmuls = counted["aten.bmm"] + counted["aten.addmm"]
    err = 100 * (_tower_forward(cost, sample) - matmuls) / matmuls
    assert TOTAL_BAND[0] <= err <= TOTAL_BAND[1], err


# Qwen/Qwen2.5-VL-7B-Instruct's tower and processor bounds (config.json, preprocessor_config.json)
Q25_7B = {
    **_config(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, window_size=112,
              fullatt_block_indexes=[7, 15, 23, 31]),
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
}  # fmt: skip
Q25_7B_PIXELS = {"min_pixels": 56 * 56, "max_pixels": 16384 * 28 * 28}


@pytest.mark.parametrize(
    ("sample", "grid_thw"),
    [
        (Sample(images=1, height=1080, width=1920), [1, 78, 138]),  # 39 x 69 merged: 10 x 18 windows
        (Sample(videos=1, frames=16, height=448, width=448, fps=2.0), [8, 32, 32]),
    ],
    ids=["1080p", "clip-16x448"],
)
def test_tower_windows_pairs_match_transformers_window_index_at_7b_sizes(sample: Sample, grid_thw: list[int]) -> None:
    # no tower built: the spans transformers' forward attends over, from its own bookkeeping
    # (get_vision_cu_seqlens for the full blocks, get_vision_window_index for the others)
    vision_utils = pytest.importorskip("transformers.vision_utils")
    cfg = HFConfig("<qwen2.5-vl-7b>", Q25_7B, Q25_7B_PIXELS)
    cost = StagedCostModel(staged_from_config(cfg), config=cfg)
    tower, vi = cost.model.vision[0], cost.sample_vision(sample)
    assert [vi.tower_images, *(cost.pass_grid(sample) or ())] == grid_thw
    thw = torch.tensor([grid_thw])
    _, cu_windows = vision_utils.get_vision_window_index(thw, spatial_merge_size=2, window_size=112, patch_size=14)

    def squares(cu: Any) -> int:
        return int((cu[1:] - cu[:-1]).long().pow(2).sum())

    full = len(tower.full_attention_blocks)
    theirs = full * squares(vision_utils.get_vision_cu_seqlens(thw)) + (32 - full) * squares(cu_windows)
    assert vi.tower_images * tower.attention_pairs(vi.patches_per_image, cost.pass_grid(sample)) == theirs


def test_tower_windows_price_below_full_attention_for_a_large_image_and_equal_within_one_window() -> None:
    cfg = HFConfig("<qwen2.5-vl-7b defaults>", {"model_type": "qwen2_5_vl"})
    windowed = StagedCostModel(staged_from_config(cfg), config=cfg)
    tower = windowed.model.vision[0]
    assert (tower.window, tower.full_attention_blocks) == (4, (7, 15, 23, 31))
    whole = StagedCostModel(dataclasses.replace(windowed.model, vision=(dataclasses.replace(tower, window=0),)),
                            config=cfg)  # fmt: skip
    large, one = Sample(images=1, height=1080, width=1920), Sample(images=1, height=112, width=112)
    assert _tower_forward(windowed, large) < 0.85 * _tower_forward(whole, large)
    assert _tower_forward(windowed, one) == _tower_forward(whole, one) > 0
    # a packed sample's loads take the same price (NOTE [ A packed row's price ])
    packed = StagedPackedModel(StagedLengthModel(windowed)).loads([large])
    assert packed.vision_flops[0] < StagedPackedModel(StagedLengthModel(whole)).loads([large]).vision_flops[0]


def test_tower_windows_leave_a_tower_that_does_not_window_at_full_attention() -> None:
    cost = StagedCostModel(StagedModel.preset("qwen2-vl-2b"))
    tower = cost.model.vision[0]
    sample = Sample(images=1, height=1080, width=1920)
    assert tower.window == 0 and cost.pass_grid(sample) is None
    p = cost.sample_vision(sample).patches_per_image
    assert tower.attention_pairs(p) == tower.layers * p**2


@pytest.mark.parametrize(
    ("vision", "match"),
    [
        ({"window_size": 27}, r"window_size should hold at least one merged patch \(28 px\), but got 27"),
        ({"depth": 4, "fullatt_block_indexes": [1, 4]}, r"fullatt_block_indexes should be a list of block indexes in \[0, 3\]"),
        ({"fullatt_block_indexes": 7}, "fullatt_block_indexes should be a list"),
    ],
)  # fmt: skip
def test_tower_windows_refuse_a_window_the_tower_cannot_run(vision: dict[str, Any], match: str) -> None:
    cfg = HFConfig("<bad windows>", {"model_type": "qwen2_5_vl", "vision_config": vision})
    with pytest.raises(ConfigError, match=match) as err:
        staged_from_config(cfg)
    assert "\n" not in str(err.value)


def test_tower_windows_without_a_config_to_find_the_grid_are_refused_in_one_line() -> None:
    base = StagedModel.preset("llava-1.5-7b")  # no config: a fixed tower, priced from the model alone
    model = dataclasses.replace(base, vision=(dataclasses.replace(base.vision[0], window=4),))
    with pytest.raises(ConfigError, match="windowing vision tower, whose FLOPs need each pass's patch grid") as err:
        StagedLengthModel(StagedCostModel(model)).sample_flops(1, Sample(images=1, height=336, width=336))
    assert "\n" not in str(err.value)
