"""Token accounting: the worked examples, public test vectors, every rule, and the property
that the scalar and vectorised paths agree on every input (valid or not)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenbucket import (
    ColumnMap,
    ConfigError,
    CountRule,
    InvalidValueError,
    MetadataError,
    TokenSpec,
    breakdown_sample,
    breakdown_table,
)
from tokenbucket.testing import mixture_a

from .strategies import flat_rows, list_rows, token_specs

BASE = {"cameras": 4, "frames": 16, "height": 224, "width": 224}


def vision(sample: dict[str, Any], **spec: Any) -> int:
    return breakdown_sample(sample, TokenSpec(**spec)).vision


# -- the design document's worked example -------------------------------------------------------


def test_breakdown_worked_example_4cams_16frames_224_is_16384() -> None:
    bd = breakdown_sample(BASE, TokenSpec(patch=14))
    assert bd.vision == 16_384
    assert bd.total == 16_384
    assert [c.spatial for c in bd.cameras] == [256] * 4


def test_breakdown_worked_example_scaling_rules_hold() -> None:
    assert vision({**BASE, "frames": 32}, patch=14) == 2 * 16_384
    assert vision({**BASE, "cameras": 8}, patch=14) == 2 * 16_384
    assert vision({**BASE, "height": 448, "width": 448}, patch=14) == 4 * 16_384
    assert vision(BASE, patch=28) == 16_384 // 4
    assert vision(BASE, patch=14, tokens_per_frame=64) == 4_096


def test_breakdown_worked_example_vectorised_matches() -> None:
    table = pa.table({k: [v] for k, v in {"key": "x", **BASE}.items()})
    assert breakdown_table(table, TokenSpec(patch=14)).table.column("vision").to_pylist() == [16_384]


# -- public model vectors (shared/data/SOURCES.md) -----------------------------------------------


def test_breakdown_openvla_one_camera_256_plus_7_actions() -> None:
    spec = TokenSpec(patch=14, resize="fixed", fixed_size=(224, 224), action=7)
    bd = breakdown_sample({"cameras": 1, "frames": 1, "height": 480, "width": 640}, spec)
    assert (bd.vision, bd.action, bd.total) == (256, 7, 263)


def test_breakdown_pi0_three_slots_empty_ones_still_cost_867() -> None:
    spec = TokenSpec(patch=14, resize="fixed", fixed_size=(224, 224), camera_slots=3, text=48, proprio=1, action=50)
    for cams in (1, 2, 3):
        bd = breakdown_sample({"cameras": cams, "frames": 1, "height": 480, "width": 640}, spec)
        assert bd.total == 867
        assert sum(c.empty_slot for c in bd.cameras) == 3 - cams


def test_breakdown_vjepa_16_frames_tubelet2_patch16_is_1568() -> None:
    assert vision({"cameras": 1, "frames": 16, "height": 224, "width": 224}, patch=16, tubelet=2) == 1_568


def test_breakdown_cosmos_causal_9_frames_is_12288() -> None:
    sample = {"cameras": 1, "frames": 9, "height": 512, "width": 512}
    assert vision(sample, patch=8, tubelet=4, causal_first_frame=True) == 12_288
    # without the causal first frame: ceil(9/4) = 3 as well; at 8 frames the two differ
    assert vision({**sample, "frames": 8}, patch=8, tubelet=4, causal_first_frame=True) == 3 * 4096
    assert vision({**sample, "frames": 8}, patch=8, tubelet=4) == 2 * 4096


# -- each rule -------------------------------------------------------------------------------


def test_breakdown_pad_rounds_up_crop_rounds_down() -> None:
    sample = {"cameras": 1, "frames": 1, "height": 230, "width": 100}
    assert vision(sample, patch=14, resize="pad") == 17 * 8
    assert vision(sample, patch=14, resize="crop") == 16 * 7


def test_breakdown_merge_divides_by_merge_squared() -> None:
    assert vision(BASE, patch=14, merge=2) == 16_384 // 4
    # pad: a 15x15 patch grid needs ceil(15/2)=8 merged rows and columns
    assert vision({"cameras": 1, "frames": 1, "height": 210, "width": 210}, patch=14, merge=2) == 64


def test_breakdown_max_pixels_keeps_area_within_bounds() -> None:
    spec = dict(patch=14, merge=2, resize="max_pixels", min_pixels=56 * 56, max_pixels=448 * 448)
    big = breakdown_sample({"cameras": 1, "frames": 1, "height": 1080, "width": 1920}, TokenSpec(**spec))
    cam = big.cameras[0]
    assert cam.spatial * 28 * 28 <= 448 * 448
    assert cam.spatial * 28 * 28 >= 0.8 * 448 * 448  # close to the cap, not far below
    small = breakdown_sample({"cameras": 1, "frames": 1, "height": 20, "width": 30}, TokenSpec(**spec))
    assert small.cameras[0].spatial * 28 * 28 >= 56 * 56
    # within bounds: just rounded to multiples of patch*merge = 28
    mid = breakdown_sample({"cameras": 1, "frames": 1, "height": 280, "width": 336}, TokenSpec(**spec))
    assert mid.cameras[0].spatial == 10 * 12


def test_breakdown_special_tokens_per_frame_and_camera() -> None:
    bd = breakdown_sample(
        {"cameras": 2, "frames": 4, "height": 28, "width": 28},
        TokenSpec(patch=14, special_per_frame=1, special_per_camera=2),
    )
    assert bd.vision == 2 * (4 * (4 + 1) + 2)


def test_breakdown_override_by_camera_name_flat_and_list_agree() -> None:
    spec = TokenSpec(patch=14, camera_names=("top", "wrist"), overrides={"wrist": {"tokens_per_frame": 64}})
    flat = breakdown_sample({"cameras": 2, "frames": 8, "height": 224, "width": 224}, spec)
    assert [c.tokens for c in flat.cameras] == [8 * 256, 8 * 64]
    listed = breakdown_sample(
        {
            "cameras": [
                {"name": "top", "frames": 8, "height": 224, "width": 224},
                {"name": "wrist", "frames": 8, "height": 224, "width": 224},
            ]
        },
        spec,
    )
    assert listed.vision == flat.vision


def test_breakdown_empty_slot_is_the_camera_the_sample_lacks() -> None:
    # a sample listing only its wrist camera lacks the top slot, priced by top's override
    spec = TokenSpec(patch=14, camera_slots=3, camera_names=("top", "wrist"), overrides={"top": {"patch": 7}})
    cam = {"frames": 1, "height": 224, "width": 224}
    rows = [
        {"key": "w", "cameras": [{"name": "wrist", **cam}]},
        {"key": "t", "cameras": [{"name": "top", **cam}]},
        {"key": "n", "cameras": [cam]},
    ]  # unnamed: by position, so it is top
    # top 32² = 1,024, wrist 16² = 256, the third slot has no name: camera2, 256
    expected = {
        "w": [("wrist", 256, False), ("top", 1024, True), ("camera2", 256, True)],
        "t": [("top", 1024, False), ("wrist", 256, True), ("camera2", 256, True)],
        "n": [("top", 1024, False), ("wrist", 256, True), ("camera2", 256, True)],
    }
    for row in rows:
        assert [(c.name, c.tokens, c.empty_slot) for c in breakdown_sample(row, spec).cameras] == expected[row["key"]]
    assert_paths_agree(rows, spec, pa.Table.from_pylist(rows))


def test_breakdown_per_camera_sums_are_exact_past_float_precision() -> None:
    # 15 cameras of 2**50 + 1 tokens: 2**53.9, where a float64 sum loses the low bits
    spec = TokenSpec(patch=1, special_per_camera=1)
    row = {"key": "a", "cameras": 15, "frames": 2**20, "height": 2**15, "width": 2**15}
    exact = 15 * (2**50 + 1)
    assert breakdown_sample(row, spec).vision == exact
    for per_camera in (False, True):
        assert (
            breakdown_table(pa.Table.from_pylist([row]), spec, per_camera=per_camera).table["vision"][0].as_py()
            == exact
        )


def test_breakdown_rules_column_fixed_product_and_extras() -> None:
    spec = TokenSpec(
        patch=14,
        text="text_tokens",
        proprio=CountRule(column="frames", tokens_per_unit=2),
        action=CountRule(count=50, tokens_per_unit=7),
        memory=64,
        extras={"register": 4, "reward": "reward_tokens?"},
    )
    bd = breakdown_sample({"cameras": 1, "frames": 8, "height": 14, "width": 14, "text_tokens": 33}, spec)
    assert (bd.text, bd.proprio, bd.action, bd.memory) == (33, 16, 350, 64)
    assert bd.extras == {"register": 4, "reward": 0}
    assert bd.total == 8 + 33 + 16 + 350 + 64 + 4


def test_breakdown_proprio_frames_rule_uses_longest_camera_in_list_schema() -> None:
    spec = TokenSpec(patch=14, proprio="frames*1", columns=ColumnMap(key=None))
    sample = {"cameras": [{"frames": 4, "height": 14, "width": 14}, {"frames": 9, "height": 14, "width": 14}]}
    assert breakdown_sample(sample, spec).proprio == 9
    table = pa.Table.from_pylist([sample])
    assert breakdown_table(table, spec).table.column("proprio").to_pylist() == [9]


def test_breakdown_table_doubling_frames_doubles_every_vision_count() -> None:
    table = mixture_a(2_000, seed=3)
    spec = TokenSpec(patch=14)
    v1 = breakdown_table(table, spec).table.column("vision").to_numpy()
    doubled = table.set_column(2, "frames", pa.compute.multiply(table.column("frames"), 2))
    v2 = breakdown_table(doubled, spec).table.column("vision").to_numpy()
    np.testing.assert_array_equal(v2, 2 * v1)


def test_breakdown_table_summary_shares_sum_to_one_and_percentiles_ordered() -> None:
    s = breakdown_table(mixture_a(5_000), TokenSpec(patch=14)).summary()
    assert s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"]
    assert abs(sum(s["share"].values()) - 1) < 1e-9
    assert s["share"]["vision"] > 0.9


# -- the two paths agree ------------------------------------------------------------------------


def scalar_outcomes(rows: list[dict[str, Any]], spec: TokenSpec) -> tuple[dict[int, Any], dict[int, tuple[str, str]]]:
    good, bad = {}, {}
    for i, row in enumerate(rows):
        try:
            good[i] = breakdown_sample(row, spec, index=i)
        except MetadataError as exc:
            bad[i] = (exc.column, exc.reason)
    return good, bad


def assert_paths_agree(rows: list[dict[str, Any]], spec: TokenSpec, table: pa.Table) -> None:
    # scalar inputs are the rows as the table holds them (a column with a NaN holds floats)
    rows = table.to_pylist()
    good, bad = scalar_outcomes(rows, spec)
    for per_camera in (False, True):
        result = breakdown_table(table, spec, on_invalid="reject", per_camera=per_camera)
        rejected = {r["index"]: (r["column"], r["reason"]) for r in result.rejected.to_pylist()}
        assert rejected == bad
        out = result.table.to_pylist()
        assert [r["index"] for r in out] == sorted(good)
        for r in out:
            bd = good[r["index"]]
            assert r["vision"] == bd.vision
            assert r["total"] == bd.total
            assert (r["text"], r["proprio"], r["action"], r["memory"]) == (bd.text, bd.proprio, bd.action, bd.memory)
            for name, value in bd.extras.items():
                assert r[name] == value
            if per_camera:
                assert r["camera_tokens"] == [c.tokens for c in bd.cameras]


@pytest.mark.slow
@given(spec=token_specs(), rows=st.integers(1, 12).flatmap(lambda n: flat_rows(n)))
def test_breakdown_paths_agree_on_valid_flat_rows(spec: TokenSpec, rows: list[dict[str, Any]]) -> None:
    assert_paths_agree(rows, spec, pa.Table.from_pylist(rows))


@pytest.mark.slow
@given(spec=token_specs(), rows=st.integers(1, 12).flatmap(lambda n: flat_rows(n, bad=True)))
def test_breakdown_paths_agree_on_invalid_flat_rows(spec: TokenSpec, rows: list[dict[str, Any]]) -> None:
    assert_paths_agree(rows, spec, pa.Table.from_pylist(rows))


@pytest.mark.slow
@given(spec=token_specs(), rows=st.integers(1, 8).flatmap(lambda n: list_rows(n)))
def test_breakdown_paths_agree_on_valid_per_camera_rows(spec: TokenSpec, rows: list[dict[str, Any]]) -> None:
    assert_paths_agree(rows, spec, pa.Table.from_pylist(rows))


@pytest.mark.slow
@given(spec=token_specs(), rows=st.integers(1, 8).flatmap(lambda n: list_rows(n, bad=True)))
def test_breakdown_paths_agree_on_invalid_per_camera_rows(spec: TokenSpec, rows: list[dict[str, Any]]) -> None:
    schema = pa.schema(
        [
            ("key", pa.string()),
            (
                "cameras",
                pa.list_(
                    pa.struct(
                        [
                            ("name", pa.string()),
                            ("frames", pa.float64()),
                            ("height", pa.float64()),
                            ("width", pa.float64()),
                        ]
                    )
                ),
            ),
            ("text_tokens", pa.float64()),
            ("action_tokens", pa.float64()),
        ]
    )
    assert_paths_agree(rows, spec, pa.Table.from_pylist(rows, schema=schema))


def test_breakdown_paths_agree_on_mixture_a() -> None:
    table = mixture_a(3_000, seed=7)
    spec = TokenSpec(patch=14, camera_names=("top", "wrist"), overrides={"wrist": {"patch": 28}}, camera_slots=8)
    assert_paths_agree([], spec, table)


def test_breakdown_spec_replace_makes_a_variant() -> None:
    spec = TokenSpec(patch=14)
    assert dataclasses.replace(spec, patch=28).patch == 28
    assert spec.patch == 14


def test_breakdown_table_accepts_numpy_columns() -> None:
    cols = {
        "key": ["a", "b"],
        "cameras": np.array([4, 1]),
        "frames": np.array([16, 1]),
        "height": np.array([224, 448]),
        "width": np.array([224, 448]),
    }
    assert breakdown_table(cols, TokenSpec(patch=14)).totals.tolist() == [16_384, 1_024]


def test_breakdown_total_past_2_62_is_an_invalid_row_not_a_wrapped_int() -> None:
    # 10,000 cameras of 2**50 tokens each add up past int64; the row is refused, the others kept
    huge = [{"frames": 2**20, "height": 2**15, "width": 2**15}] * 10_000
    small = [{"frames": 1, "height": 14, "width": 14}]
    table = pa.table({"key": ["a", "b", "c"], "cameras": [small, huge, small], "text_tokens": [1, 1, 2]})
    spec = TokenSpec(patch=1)
    result = breakdown_table(table, spec, on_invalid="reject")
    assert result.table.column("key").to_pylist() == ["a", "c"]
    assert result.table.column("total").to_pylist() == [197, 198]
    assert result.rejected.num_rows == 1 and result.table.num_rows + result.rejected.num_rows == 3
    assert result.rejected.column("column").to_pylist() == ["total"]
    assert "less than 2**62 tokens" in result.rejected.column("message")[0].as_py()
    with pytest.raises(InvalidValueError, match=r"row 1 key 'b': column 'total' should add up to less than 2\*\*62"):
        breakdown_table(table, spec)
    with pytest.raises(InvalidValueError, match="less than 2\\*\\*62"):  # the one-sample path agrees
        breakdown_sample(table.slice(1, 1).to_pylist()[0], spec, index=1)


def test_breakdown_rules_that_add_up_past_2_62_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"tokens_per_unit should be at most 2147483648 \(2\*\*31\)"):
        CountRule(column="steps", tokens_per_unit=2**40)  # one rule's product always fits int64
    per = 2**31
    spec = TokenSpec(
        patch=14,
        action=CountRule(column="steps", tokens_per_unit=per),
        memory=CountRule(column="steps", tokens_per_unit=per),
    )
    table = pa.table(
        {
            "key": ["a", "b"],
            "cameras": [1, 1],
            "frames": [1, 1],
            "height": [14, 14],
            "width": [14, 14],
            "steps": [2**31, 1],
        }
    )
    result = breakdown_table(table, spec, on_invalid="reject")  # 2 x 2**62 would wrap int64
    assert result.table.column("key").to_pylist() == ["b"] and result.rejected.column("key").to_pylist() == ["a"]
    assert "less than 2**62" in result.rejected.column("reason")[0].as_py()
