"""ModelSpec: validation, derived sizes, presets, TOML."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tokenbucket import ConfigError
from tokenbucket.cost.model import MODEL_PRESETS, ModelSpec


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hidden": 1000, "layers": 2, "heads": 16}, r"heads should divide hidden, but got hidden=1000, heads=16"),
        ({"hidden": 1024, "layers": 2, "heads": 16, "kv_heads": 3}, r"kv_heads should divide heads.*kv_heads=3"),
        ({"hidden": 1024, "layers": 0, "heads": 16}, r"layers should be a positive integer, but got layers=0"),
        ({"hidden": -8, "layers": 2, "heads": 2}, r"hidden should be a positive integer"),
        ({"hidden": 64, "layers": 2, "heads": 2, "precision": "fp16"}, r"precision should be one of"),
        ({"hidden": 64, "layers": 2, "heads": 2, "attention": "linear"}, r"attention should be one of"),
        ({"hidden": 64, "layers": 2, "heads": 2, "mlp_ratio": 0}, r"mlp_ratio should be a positive finite number"),
        (
            {"hidden": 64, "layers": 2, "heads": 2, "mlp_ratio": float("nan")},
            r"positive finite number, but got mlp_ratio=nan",
        ),
        (
            {"hidden": 64, "layers": 2, "heads": 2, "mlp_ratio": float("inf")},
            r"positive finite number, but got mlp_ratio=inf",
        ),
        ({"hidden": 64, "layers": 2, "heads": 2, "window": 0}, r"window should be a positive integer"),
    ],
)
def test_model_spec_bad_input_names_field_and_value(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelSpec(**kwargs)


def test_model_spec_sizes_of_the_design_model() -> None:
    m = ModelSpec.preset("design-24L-1024")
    assert (m.head_dim, m.kv_dim, m.ffn) == (64, 1024, 4096)
    assert m.layer_matmul_params == 12 * 1024 * 1024
    assert m.params == 24 * (12 * 1024 * 1024 + 4 * 1024)


def test_model_spec_gqa_and_gated_mlp_sizes() -> None:
    m = ModelSpec(hidden=2048, layers=1, heads=16, kv_heads=4, mlp_ratio=3.0, gated_mlp=True)
    assert m.kv_dim == 512
    assert m.layer_matmul_params == 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 6144


def test_model_spec_presets_are_valid_and_named() -> None:
    for name, spec in MODEL_PRESETS.items():
        assert spec.name == name
        assert ModelSpec.preset(name) is spec
    with pytest.raises(ConfigError, match="known presets"):
        ModelSpec.preset("gpt-5")


def test_model_spec_from_toml_preset_with_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokenbucket.toml"
    path.write_text('[model]\npreset = "design-24L-1024"\nattention = "eager"\nkv_heads = 4\n')
    m = ModelSpec.from_toml(path)
    assert (m.hidden, m.attention, m.kv_heads) == (1024, "eager", 4)
    path.write_text("[model]\nhidden = 64\n")
    with pytest.raises(ConfigError, match="needs"):
        ModelSpec.from_toml(path)
    path.write_text("[model]\nhidden = 64\nlayers = 2\nheads = 2\nbogus = 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        ModelSpec.from_toml(path)


def test_model_spec_round_trips_through_dict() -> None:
    m = dataclasses.replace(ModelSpec.preset("qwen2-0.5b-24L-896"), checkpointing="full")
    assert ModelSpec.from_dict(m.to_dict()) == m
