"""TokenSpec and CountRule: parsing, TOML, round trips, overrides."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

import tokenbucket
from tokenbucket import (
    CameraSpec,
    ColumnMap,
    ConfigError,
    CountRule,
    MetadataError,
    TokenSpec,
    breakdown_sample,
    breakdown_table,
)


def test_spec_public_api_all_is_sorted_and_importable() -> None:
    assert tokenbucket.__all__ == sorted(tokenbucket.__all__)
    for name in tokenbucket.__all__:
        assert hasattr(tokenbucket, name)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("48", CountRule(count=48)),
        (48, CountRule(count=48)),
        ("text_tokens", CountRule(column="text_tokens")),
        ("text_tokens?", CountRule(column="text_tokens", optional=True)),
        ("50*2", CountRule(count=50, tokens_per_unit=2)),
        ("frames*3", CountRule(column="frames", tokens_per_unit=3)),
        ({"horizon": 50, "tokens_per_step": 7}, CountRule(count=50, tokens_per_unit=7)),
        ({"column": "frames", "tokens_per_step": 2}, CountRule(column="frames", tokens_per_unit=2)),
    ],
)
def test_spec_count_rule_parse_forms(text: object, rule: CountRule) -> None:
    parsed = CountRule.parse(text)  # type: ignore[arg-type]
    assert parsed == rule
    assert CountRule.parse(parsed.describe()) == parsed


@pytest.mark.parametrize("bad", ["", "a b", "-3", "x*y", True, 1.5, {"horizon": 5, "bogus": 1}])
def test_spec_count_rule_parse_rejects_garbage(bad: object) -> None:
    with pytest.raises(ConfigError):
        CountRule.parse(bad)  # type: ignore[arg-type]


def test_spec_camera_spec_applies_overrides_by_name_only() -> None:
    spec = TokenSpec(patch=14, overrides={"wrist": {"patch": 16, "tubelet": 2}})
    assert spec.camera_spec("wrist") == CameraSpec(patch=16, tubelet=2)
    assert spec.camera_spec("top") == CameraSpec(patch=14)
    assert spec.camera_spec(None) == spec.base_camera()


def test_spec_slot_names_default_and_given() -> None:
    spec = TokenSpec(camera_names=("top", "wrist"))
    assert [spec.slot_name(j) for j in range(3)] == ["top", "wrist", "camera2"]


def test_spec_dict_round_trip_is_identity() -> None:
    spec = TokenSpec(
        patch=16,
        resize="max_pixels",
        max_pixels=448 * 448,
        min_pixels=3136,
        merge=2,
        tubelet=2,
        causal_first_frame=True,
        special_per_frame=1,
        special_per_camera=2,
        camera_slots=3,
        camera_names=("top", "wrist"),
        overrides={"wrist": {"tokens_per_frame": 64}},
        text=48,
        action="50*7",
        extras={"register": 4},
        columns=ColumnMap(key=None, cameras="views"),
    )
    again = TokenSpec.from_dict(spec.to_dict())
    assert again == spec
    assert hash(again) == hash(spec)


def test_spec_from_toml_reads_tokens_section(tmp_path: Path) -> None:
    path = tmp_path / "tokenbucket.toml"
    path.write_text(
        """
[tokens]
patch = 14
resize = "fixed"
fixed_size = [224, 224]
camera_slots = 3
camera_names = ["base", "left_wrist", "right_wrist"]
text = 48
proprio = 1
action = { horizon = 50, tokens_per_step = 1 }

[tokens.overrides.left_wrist]
tokens_per_frame = 64

[tokens.columns]
key = "episode_id"

[model]
hidden = 1024
"""
    )
    spec = TokenSpec.from_toml(path)
    assert spec.fixed_size == (224, 224)
    assert spec.action == CountRule(count=50, tokens_per_unit=1)
    assert spec.camera_spec("left_wrist").tokens_per_frame == 64
    assert spec.columns.key == "episode_id"


def test_spec_from_toml_unknown_key_and_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[tokens]\npatchsize = 14\n")
    with pytest.raises(ConfigError, match="patchsize"):
        TokenSpec.from_toml(path)
    path.write_text("[tokens\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        TokenSpec.from_toml(path)
    with pytest.raises(ConfigError, match="does not exist"):
        TokenSpec.from_toml(tmp_path / "missing.toml")


def test_spec_is_frozen() -> None:
    spec = TokenSpec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.patch = 16  # type: ignore[misc]


# NOTE [ Token presets ]: the published counts of ../shared/data/SOURCES.md, written out
@pytest.mark.parametrize(
    ("name", "row", "published"),
    [
        ("pi0", {"cameras": 3, "frames": 1, "height": 480, "width": 640}, 3 * 256 + 48 + 1 + 50),
        ("pi0", {"cameras": 1, "frames": 1, "height": 224, "width": 224}, 3 * 256 + 48 + 1 + 50),  # empty slots cost
        ("openvla", {"cameras": 1, "frames": 1, "height": 224, "width": 224, "text_tokens": 20}, 256 + 20 + 7),
        ("vjepa", {"cameras": 1, "frames": 16, "height": 224, "width": 224}, 8 * 14 * 14),
        ("cosmos-dv4x8x8", {"cameras": 1, "frames": 9, "height": 512, "width": 512}, 3 * 64 * 64),
    ],
)
def test_token_presets_match_published_counts(name: str, row: dict[str, int], published: int) -> None:
    spec = TokenSpec.preset(name)
    assert breakdown_sample(row, spec).total == published
    table = pa.Table.from_pylist([{"key": "s0", **row}])
    assert breakdown_table(table, spec).totals.tolist() == [published]  # the vectorised path agrees


def test_token_presets_by_name_in_toml_and_their_errors(tmp_path: Path) -> None:
    path = tmp_path / "tokenbucket.toml"
    path.write_text('[tokens]\npreset = "pi0"\naction = 10\n')
    spec = TokenSpec.from_toml(path)
    assert spec.camera_slots == 3 and spec.action == CountRule(count=10)  # the preset, changed
    with pytest.raises(ConfigError, match="known presets"):
        TokenSpec.preset("pi-zero")
    with pytest.raises(MetadataError):  # four cameras do not fit pi0's three slots
        breakdown_sample({"cameras": 4, "frames": 1, "height": 224, "width": 224}, TokenSpec.preset("pi0"))


@pytest.mark.parametrize("bad", [32, "224x224", (224,), (224, 0)])
def test_spec_fixed_size_that_is_not_a_pair_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="fixed_size"):
        TokenSpec(resize="fixed", fixed_size=bad)  # type: ignore[arg-type]
