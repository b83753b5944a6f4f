"""Bad input: one test per error class; each message names the row (index and key), the
column and the value. ``on_invalid="reject"`` keeps every bad row with its reason."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tokenbucket import (
    ConfigError,
    DuplicateKeyError,
    ImageTooSmallError,
    InvalidValueError,
    MetadataError,
    MissingColumnError,
    TokenbucketError,
    TokenSpec,
    breakdown_sample,
    breakdown_table,
)

SPEC = TokenSpec(patch=14)


def table_with(row: int, column: str, value: Any, n: int = 5, type: pa.DataType | None = None) -> pa.Table:
    data: dict[str, list[Any]] = {
        "key": [f"ep{i}" for i in range(n)],
        "cameras": [2] * n,
        "frames": [8] * n,
        "height": [224] * n,
        "width": [224] * n,
        "text_tokens": [10] * n,
    }
    if type == pa.string():
        data[column] = [str(v) for v in data[column]]
    data[column][row] = value
    fields = {c: (type if c == column and type is not None else None) for c in data}
    return pa.table({c: pa.array(v, type=fields[c]) for c, v in data.items()})


def assert_names(exc: MetadataError, row: int, key: str, column: str, value_text: str) -> None:
    message = str(exc)
    assert f"row {row}" in message
    assert repr(key) in message
    assert repr(column) in message
    assert value_text in message
    assert (exc.row, exc.key, exc.column) == (row, key, column)


@pytest.mark.parametrize(
    ("column", "value", "type", "reason", "value_text"),
    [
        ("frames", None, pa.int64(), "should not be null", "frames=None"),
        ("height", float("nan"), pa.float64(), "should not be NaN", "height=nan"),
        ("cameras", -2, None, "should not be negative", "cameras=-2"),
        ("frames", 0, None, "should be at least 1", "frames=0"),
        ("width", 223.5, pa.float64(), "should hold an integer", "width=223.5"),
        ("text_tokens", "many", pa.string(), "should hold an integer", "text_tokens='many'"),
        ("height", 10**9, None, "should be at most 32768", "height=1000000000"),
        # huge floats, beyond int64, keep their sign: never counted as the minimum
        ("frames", 1e20, pa.float64(), "should be at most 1048576", "frames=1e+20"),
        ("frames", -1e19, pa.float64(), "should be at least 1", "frames=-1e+19"),
        ("text_tokens", -1e19, pa.float64(), "should not be negative", "text_tokens=-1e+19"),
        ("frames", 2**64 - 1, pa.uint64(), "should be at most 1048576", "frames=18446744073709551615"),
        ("frames", "99999999999999999999", pa.string(), "should be at most 1048576", "'99999999999999999999'"),
        ("frames", "\u0665", pa.string(), "should hold an integer", "frames="),  # a non-ASCII digit
    ],
)
def test_validation_bad_value_names_row_key_column_value(
    column: str, value: Any, type: pa.DataType | None, reason: str, value_text: str
) -> None:
    table = table_with(3, column, value, type=type)
    with pytest.raises(InvalidValueError) as info:
        breakdown_table(table, SPEC)
    assert_names(info.value, 3, "ep3", column, value_text)
    assert info.value.reason == reason
    # the scalar path says the same of the same row
    with pytest.raises(InvalidValueError) as scalar:
        breakdown_sample(table.to_pylist()[3], SPEC, index=3)
    assert str(scalar.value) == str(info.value)


@pytest.mark.parametrize("text", ["+5", " 7 ", "0000000000000000000000012", "-0"])
def test_validation_integer_strings_count_the_same_on_both_paths(text: str) -> None:
    table = table_with(3, "text_tokens", text, type=pa.string())
    totals = breakdown_table(table, SPEC).totals
    assert totals[3] == breakdown_sample(table.to_pylist()[3], SPEC).total == totals[0] - 10 + int(text)


def test_validation_missing_column_names_it_and_lists_the_others() -> None:
    table = table_with(0, "frames", 8).drop_columns(["width"])
    with pytest.raises(MissingColumnError) as info:
        breakdown_table(table, SPEC)
    assert "'width'" in str(info.value) and "'frames'" in str(info.value)
    with pytest.raises(MissingColumnError):
        breakdown_table(table, SPEC, on_invalid="reject")  # a whole column cannot be rejected row by row


def test_validation_missing_required_rule_column_raises() -> None:
    spec = TokenSpec(patch=14, action="action_tokens")  # required: no '?'
    with pytest.raises(MissingColumnError, match="action_tokens"):
        breakdown_table(table_with(0, "frames", 8), spec)
    with pytest.raises(MissingColumnError, match="action_tokens"):
        breakdown_sample({"cameras": 1, "frames": 1, "height": 14, "width": 14}, spec)


def test_validation_duplicate_key_names_the_second_row() -> None:
    table = table_with(4, "key", "ep1")
    with pytest.raises(DuplicateKeyError) as info:
        breakdown_table(table, SPEC)
    assert_names(info.value, 4, "ep1", "key", "key='ep1'")


def test_validation_image_below_one_patch_under_crop() -> None:
    table = table_with(2, "width", 13)
    with pytest.raises(ImageTooSmallError) as info:
        breakdown_table(table, TokenSpec(patch=14, resize="crop"))
    assert_names(info.value, 2, "ep2", "width", "width=13")
    # the same image under pad is one patch wide, not an error
    assert breakdown_table(table, TokenSpec(patch=14, resize="pad")).table.num_rows == 5


def test_validation_per_camera_field_names_the_camera() -> None:
    table = pa.Table.from_pylist(
        [
            {"key": "a", "cameras": [{"name": "top", "frames": 4, "height": 224, "width": 224}]},
            {
                "key": "b",
                "cameras": [
                    {"name": "top", "frames": 4, "height": 224, "width": 224},
                    {"name": "wrist", "frames": -1, "height": 224, "width": 224},
                ],
            },
        ]
    )
    with pytest.raises(InvalidValueError) as info:
        breakdown_table(table, SPEC)
    assert_names(info.value, 1, "b", "cameras[1].frames", "cameras[1].frames=-1")


def test_validation_more_cameras_than_slots() -> None:
    with pytest.raises(InvalidValueError, match="camera_slots") as info:
        breakdown_table(table_with(1, "cameras", 4), TokenSpec(patch=14, camera_slots=3))
    assert info.value.row == 1


def test_validation_first_bad_row_is_reported() -> None:
    table = table_with(3, "frames", -1)
    table = table.set_column(3, "height", pa.array([224, 224, 224, 224, None]))
    with pytest.raises(InvalidValueError) as info:
        breakdown_table(table, SPEC)
    assert info.value.row == 3


def test_validation_reject_keeps_every_row_accounted_for() -> None:
    n = 10
    table = table_with(2, "frames", -1, n=n)
    table = table.set_column(3, "height", pa.array([224] * 6 + [None] + [224] * 3, pa.int64()))
    table = table.set_column(0, "key", pa.array([f"ep{i}" for i in range(9)] + ["ep0"]))
    result = breakdown_table(table, TokenSpec(patch=14, resize="crop"), on_invalid="reject")
    rejected = {r["index"]: r for r in result.rejected.to_pylist()}
    assert sorted(rejected) == [2, 6, 9]
    assert rejected[2]["reason"] == "should be at least 1" and rejected[2]["column"] == "frames"
    assert rejected[6]["reason"] == "should not be null" and rejected[6]["value"] == "None"
    assert rejected[9]["reason"] == "should be unique" and rejected[9]["key"] == "ep0"
    assert "row 9" in rejected[9]["message"]
    # nothing lost: kept + rejected = input
    kept = result.table.column("index").to_pylist()
    assert sorted(kept + list(rejected)) == list(range(n))


def test_validation_zero_patch_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"patch should be a positive integer, but got patch=0"):
        TokenSpec(patch=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"resize": "stretch"}, "resize should be one of"),
        ({"resize": "fixed"}, "needs fixed_size"),
        ({"resize": "max_pixels"}, "needs max_pixels"),
        ({"resize": "max_pixels", "max_pixels": 100}, "at least one merged patch"),
        ({"tubelet": 0}, "tubelet should be a positive integer"),
        ({"merge": -1}, "merge should be a positive integer"),
        ({"tokens_per_frame": 0}, "tokens_per_frame"),
        ({"camera_slots": 0}, "camera_slots"),
        ({"overrides": {"wrist": {"patchsize": 16}}}, "unknown fields"),
        ({"overrides": {"wrist": {"patch": 0}}}, r"overrides\[.wrist.\]: patch should be a positive integer"),
        ({"text": "12 tokens"}, "a token rule should look like"),
        ({"extras": {"text": 4}}, "built-in name"),
    ],
)
def test_validation_bad_spec_names_field_and_value(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TokenSpec(**kwargs)


def test_validation_errors_share_one_family() -> None:
    for cls in (
        ConfigError,
        MetadataError,
        MissingColumnError,
        InvalidValueError,
        DuplicateKeyError,
        ImageTooSmallError,
    ):
        assert issubclass(cls, TokenbucketError)
        assert issubclass(cls, ValueError)


def test_validation_on_invalid_must_be_known() -> None:
    with pytest.raises(ConfigError, match="on_invalid"):
        breakdown_table(table_with(0, "frames", 8), SPEC, on_invalid="skip")  # type: ignore[arg-type]


def test_validation_duplicate_key_found_in_sorted_and_unsorted_keys() -> None:
    # sorted input takes the one-pass proof; a repeat breaks "strictly increasing" and is found
    for keys, dup_row in ((["a", "b", "b", "c"], 2), (["c", "a", "b", "a"], 3)):
        table = pa.table({"key": keys, "cameras": [1] * 4, "frames": [1] * 4, "height": [14] * 4, "width": [14] * 4})
        with pytest.raises(DuplicateKeyError) as info:
            breakdown_table(table, SPEC)
        assert info.value.row == dup_row
    unique = pa.table(
        {"key": ["c", "a", "b"], "cameras": [1] * 3, "frames": [1] * 3, "height": [14] * 3, "width": [14] * 3}
    )
    assert breakdown_table(unique, SPEC).table.num_rows == 3
