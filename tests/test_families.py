"""The family registry and the moved families' exact counts, against the pinned transformers processors.

Every family's per-image rule (tokenbucket/models/) is checked here or in its own
``tests/test_family_<name>.py`` over a grid of sizes and aspect ratios: the oracle is the image
processor of the pinned ``transformers`` built from the config values in the test (no tokenizer,
no download), or, where the count lives only in the processor class, that class's own counting
method. The metadata breakdown (the vectorised path) must give the same counts.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import transformers

from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.tokens.breakdown import breakdown_sample, breakdown_table
from tokenbucket.tokens.hf import image_tokens, token_spec_from_hf, vision_inputs
from tokenbucket.tokens.spec import TokenSpec

# (height, width): tiny, square, portrait, landscape, camera sizes, extreme ratios, large
GRID = [
    (28, 28), (56, 300), (100, 100), (224, 224), (240, 320), (300, 200), (333, 517), (336, 336), (360, 640),
    (384, 384), (448, 448), (480, 640), (512, 512), (600, 90), (640, 480), (720, 1280), (768, 1024), (800, 800),
    (900, 1600), (1008, 336), (1024, 768), (1080, 1920), (1200, 300), (1365, 1365), (1500, 1000), (2000, 2000),
    (37, 1500), (1500, 37), (513, 1025), (2048, 1152),
]  # fmt: skip
SMOLVLM_256M = {"model_type": "smolvlm", "scale_factor": 4, "vision_config": {"image_size": 512, "patch_size": 16}}
SMOLVLM_PRE = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}


def _pixels(h: int, w: int) -> Any:
    return np.zeros((h, w, 3), dtype=np.uint8)


def _proc(name: str, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, name + "Pil")(**kwargs)


def _table(sizes: list[tuple[int, int]]) -> pa.Table:
    return pa.table({
        "key": [f"s{i}" for i in range(len(sizes))], "cameras": [1] * len(sizes), "frames": [1] * len(sizes),
        "height": [h for h, _ in sizes], "width": [w for _, w in sizes],
    })  # fmt: skip


def _mismatches(cfg: HFConfig, expected: dict[tuple[int, int], int]) -> list[Any]:
    """Sizes where image_tokens, the spec's scalar path or its vectorised path differ from ``expected``."""
    spec = token_spec_from_hf(cfg)
    sizes = list(expected)
    out = breakdown_table(_table(sizes), spec)
    assert out.rejected.num_rows == 0
    table = out.table.column("vision").to_pylist()
    bad = []
    for (h, w), tokens, vec in zip(sizes, [expected[s] for s in sizes], table, strict=True):
        one = breakdown_sample({"cameras": 1, "frames": 1, "height": h, "width": w}, spec).vision
        if not image_tokens(cfg, h, w) == one == vec == tokens:
            bad.append(((h, w), tokens, image_tokens(cfg, h, w), one, vec))
    return bad


def test_registry_knows_every_family_and_refuses_others_in_one_line() -> None:
    exported = set(dir(transformers))  # the lazy module's names: no modeling module is imported
    for mt in models.SUPPORTED_MODEL_TYPES:
        family = models.family(mt)
        assert mt in family.model_types and mt in family.hf_classes
        assert family.hf_classes[mt] in exported
    with pytest.raises(ConfigError, match=r"^model_type 'mamba' is not supported; supported: .*qwen2_vl"):
        models.family("mamba")


def test_every_family_that_reads_its_samples_image_count_says_so() -> None:
    # NOTE [ Images of a sample ]: the breakdown runs sample_rule_inputs with the row's image
    # count only for a family that sets counts_images; one that overrides the method without it
    # would be priced as if each image were its sample's lone one
    for mt in models.SUPPORTED_MODEL_TYPES:
        family = models.family(mt)
        overrides = type(family).sample_rule_inputs is not models.Family.sample_rule_inputs
        assert family.counts_images == overrides, mt
    assert models.family("llava_onevision").counts_images


def test_qwen2_vl_counts_equal_the_processor_over_the_grid() -> None:
    proc = _proc("Qwen2VLImageProcessor")
    sizes = [s for s in GRID if min(s) >= 28]
    expected = {}
    for h, w in sizes:
        grid = proc(_pixels(h, w), return_tensors="np")["image_grid_thw"][0]
        expected[(h, w)] = int(np.prod(grid)) // 4
    assert _mismatches(HFConfig("<q>", {"model_type": "qwen2_vl"}), expected) == []
    assert len(expected) == len(sizes) >= 29


@pytest.mark.parametrize(("model_type", "config", "pre", "proc_kwargs"), [
    ("idefics3", {"model_type": "idefics3"}, {}, {}),
    ("smolvlm", SMOLVLM_256M, SMOLVLM_PRE, {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}),
    ("smolvlm", SMOLVLM_256M, {**SMOLVLM_PRE, "do_image_splitting": False},
     {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}, "do_image_splitting": False}),
])  # fmt: skip
@pytest.mark.slow
def test_idefics3_tiles_equal_the_processor_over_the_grid(
    model_type: str, config: dict[str, Any], pre: dict[str, Any], proc_kwargs: dict[str, Any]
) -> None:
    cfg = HFConfig("<i>", config, pre)
    per_tile = models.of(cfg).image_rule(cfg)["seq"]
    proc = _proc("SmolVLMImageProcessor" if model_type == "smolvlm" else "Idefics3ImageProcessor", **proc_kwargs)
    sizes = GRID[::2]  # the processor resizes real pixels: half the grid keeps this under a few seconds
    expected = {(h, w): proc(_pixels(h, w), return_tensors="np")["pixel_values"].shape[1] * per_tile for h, w in sizes}
    assert _mismatches(cfg, expected) == []


def test_smolvlm_512_square_is_1088_tokens_split_and_64_unsplit_from_one_code_path(tmp_path: Path) -> None:
    # the same spec path (token_spec_from_hf -> breakdown) and the processor, splitting on and off
    (tmp_path / "config.json").write_text(json.dumps(SMOLVLM_256M))
    got = {}
    for split in (True, False):
        (tmp_path / "preprocessor_config.json").write_text(json.dumps({**SMOLVLM_PRE, "do_image_splitting": split}))
        spec = token_spec_from_hf(tmp_path)
        assert spec.resize == "model"
        tiles = _proc("SmolVLMImageProcessor", size={"longest_edge": 2048}, max_image_size={"longest_edge": 512},
                      do_image_splitting=split)(_pixels(512, 512), return_tensors="np")["pixel_values"].shape[1]  # fmt: skip
        row = breakdown_sample({"cameras": 1, "frames": 1, "height": 512, "width": 512}, spec).vision
        assert row == tiles * 64 == vision_inputs(tmp_path, 512, 512).llm_tokens
        got[split] = row
    assert got == {True: 1088, False: 64}


def test_llava_next_counts_equal_the_processor_method_over_the_grid() -> None:
    pins = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
    proc = transformers.LlavaNextProcessor.__new__(transformers.LlavaNextProcessor)
    proc.image_processor = _proc("LlavaNextImageProcessor", image_grid_pinpoints=pins)
    proc.patch_size, proc.num_additional_image_tokens = 14, 1
    expected = {}
    for strategy, extra in (("default", -1), ("full", 0)):
        proc.vision_feature_select_strategy = strategy
        cfg = HFConfig("<n>", {"model_type": "llava_next", "vision_feature_select_strategy": strategy,
                               "image_grid_pinpoints": pins})  # fmt: skip
        expected = {(h, w): proc._get_number_of_features(h, w, 336, 336) + extra for h, w in GRID}
        assert _mismatches(cfg, expected) == [], strategy
    assert len(expected) == len(GRID)


def test_fixed_squares_equal_the_processor_output_size() -> None:
    for model_type, name, side in (("llava", "CLIPImageProcessor", 336), ("paligemma", "SiglipImageProcessor", 224)):
        proc = _proc(name, size={"height": side, "width": side}, crop_size={"height": side, "width": side})
        cfg = HFConfig("<f>", {"model_type": model_type})
        for h, w in GRID[::6]:
            pixels = proc(_pixels(h, w), return_tensors="np")["pixel_values"]
            assert pixels.shape[-2:] == (side, side)
        expected = {(h, w): (side // 14) ** 2 for h, w in GRID}
        assert _mismatches(cfg, expected) == [], model_type


def test_a_model_rule_spec_round_trips_and_refuses_a_bad_rule() -> None:
    cfg = HFConfig("<s>", SMOLVLM_256M, SMOLVLM_PRE)
    spec = token_spec_from_hf(cfg)
    again = TokenSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert (
        again == spec
        and breakdown_sample({"cameras": 1, "frames": 1, "height": 512, "width": 512}, again).vision == 1088
    )
    with pytest.raises(ConfigError, match=r"image_rule should be JSON naming a model family"):
        TokenSpec(resize="model", image_rule='{"family": "nope"}')
    with pytest.raises(ConfigError, match=r'image_rule is read only with resize="model"'):
        TokenSpec(patch=14, image_rule=spec.image_rule)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"resize": "model", "image_rule": '{"family": "qwen2_vl"}'}, ("image_rule is not a qwen2_vl rule", "patch")),
        ({"feed": "video", "video_rule": '{"family": "qwen2_vl"}'}, ("video_rule is not a qwen2_vl rule",)),
        ({"feed": "video", "video_rule": '{"family": "llava"}'}, ("video_rule names llava", "no video path")),
    ],
)
def test_a_hand_written_rule_without_its_familys_parameters_is_a_config_error(
    fields: dict[str, str], words: tuple[str, ...]
) -> None:
    """A TOML spec's rule JSON is the user's: a rule missing the family's parameters, or a video
    rule naming a family without a video path, ends in one ConfigError, not a KeyError."""
    spec = TokenSpec(**fields)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        breakdown_sample({"cameras": 1, "frames": 4, "height": 224, "width": 224}, spec)
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="video_rule should be a family's rule as JSON"):
        TokenSpec(feed="video", video_rule=5)  # type: ignore[arg-type]
