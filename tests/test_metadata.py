"""Metadata readers: real Parquet, JSONL and CSV files, single files and part directories,
flat and per-camera schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from tokenbucket import ConfigError, TokenSpec, breakdown_table, read_metadata
from tokenbucket.testing import mixture_a

SPEC = TokenSpec(patch=14)


def write(table: pa.Table, path: Path) -> None:
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    elif path.suffix == ".csv":
        pcsv.write_csv(table, path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_metadata_single_file_gives_same_breakdown_as_table(tmp_path: Path, suffix: str) -> None:
    table = mixture_a(500, seed=2)
    path = tmp_path / f"meta{suffix}"
    write(table, path)
    got = breakdown_table(read_metadata(path), SPEC).table
    want = breakdown_table(table, SPEC).table
    assert got.column("total").to_pylist() == want.column("total").to_pylist()
    assert got.column("key").to_pylist() == want.column("key").to_pylist()


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_metadata_directory_of_parts_reads_in_name_order(tmp_path: Path, suffix: str) -> None:
    table = mixture_a(900, seed=4)
    for i, start in enumerate(range(0, 900, 300)):
        write(table.slice(start, 300), tmp_path / f"part-{i:03d}{suffix}")
    (tmp_path / "README.txt").write_text("not metadata")
    got = read_metadata(tmp_path)
    assert got.num_rows == 900
    assert got.column("key").to_pylist() == table.column("key").to_pylist()


def test_metadata_per_camera_schema_through_parquet_and_jsonl(tmp_path: Path) -> None:
    rows = [
        {
            "key": "a",
            "cameras": [
                {"name": "top", "frames": 16, "height": 480, "width": 640},
                {"name": "wrist", "frames": 16, "height": 224, "width": 224},
            ],
        },
        {"key": "b", "cameras": [{"name": "top", "frames": 8, "height": 480, "width": 640}]},
    ]
    spec = TokenSpec(patch=14, overrides={"wrist": {"tokens_per_frame": 64}})
    for suffix in (".parquet", ".jsonl"):
        path = tmp_path / f"cams{suffix}"
        write(pa.Table.from_pylist(rows), path)
        out = breakdown_table(read_metadata(path), spec, per_camera=True).table.to_pylist()
        top = 35 * 46  # ceil(480/14) x ceil(640/14)
        assert out[0]["camera_tokens"] == [16 * top, 16 * 64]
        assert out[1]["vision"] == 8 * top


def test_metadata_columns_projection_reads_only_what_is_asked(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    write(mixture_a(10), path)
    got = read_metadata(path, columns=["key", "frames", "not_there"])
    assert got.column_names == ["key", "frames"]


def test_metadata_bad_sources_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_metadata(tmp_path / "nope.parquet")
    with pytest.raises(ConfigError, match="holds no"):
        read_metadata(tmp_path)
    (tmp_path / "m.txt").write_text("x")
    with pytest.raises(ConfigError, match="cannot tell the format"):
        read_metadata(tmp_path / "m.txt")
    with pytest.raises(ConfigError, match="format should be"):
        read_metadata(tmp_path / "m.txt", format="xml")


def test_metadata_csv_with_a_bad_cell_is_reported_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("key,cameras,frames,height,width\na,1,8,224,224\nb,1,eight,224,224\nc,2,4,224,224\n")
    result = breakdown_table(read_metadata(path), SPEC, on_invalid="reject")
    assert result.table.column("key").to_pylist() == ["a", "c"]
    bad = result.rejected.to_pylist()[0]
    assert (bad["index"], bad["key"], bad["column"], bad["value"]) == (1, "b", "frames", "'eight'")


def test_metadata_unparseable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    path.write_text('[{"key": "a"}]')  # a JSON array, not one object per line
    with pytest.raises(ConfigError, match=r"meta\.json.*one object per line"):
        read_metadata(path)


def test_metadata_empty_table_gives_empty_breakdown(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    write(mixture_a(0), path)
    result = breakdown_table(read_metadata(path), SPEC, per_camera=True)
    assert result.table.num_rows == 0 and result.rejected.num_rows == 0
    assert result.summary()["count"] == 0


def test_table_from_rows_keeps_keys_the_first_row_lacks() -> None:
    from tokenbucket.tokens.metadata import table_from_rows

    rows = [{"a": 1}, {"a": 2, "t": 5}, {"a": 3, "t": None}]
    assert table_from_rows(rows).to_pylist() == [{"a": 1, "t": None}, {"a": 2, "t": 5}, {"a": 3, "t": None}]
    # absent keys take the given value; a key present with None stays null (an error downstream)
    assert table_from_rows(rows, {"t": 0}).column("t").to_pylist() == [0, 5, None]
    assert table_from_rows([]).num_rows == 0


def test_absent_as_zero_names_the_columns_only_optional_rules_read() -> None:
    from tokenbucket.tokens.spec import CountRule

    assert TokenSpec().absent_as_zero() == {
        "action_tokens": 0,
        "memory_tokens": 0,
        "proprio_tokens": 0,
        "text_tokens": 0,
    }
    spec = TokenSpec(
        text=CountRule(column="text_tokens"),
        proprio=CountRule(column="frames", optional=True),
        extras={"lang": CountRule(column="text_tokens", optional=True)},
    )
    assert "text_tokens" not in spec.absent_as_zero()  # a required rule reads it too
    assert "frames" not in spec.absent_as_zero()  # frames: absent means the cameras' longest, not 0


def test_csv_keys_stay_text(tmp_path: Path) -> None:
    from tokenbucket.tokens.metadata import iter_metadata_batches

    path = tmp_path / "meta.csv"
    path.write_text("key,cameras,frames,height,width\n001,1,16,224,224\n1,1,16,224,224\n")
    for table in (read_metadata(path), next(iter_metadata_batches(path))):
        result = breakdown_table(table, TokenSpec(patch=14), on_invalid="reject")
        assert result.table.column("key").to_pylist() == ["001", "1"] and result.rejected.num_rows == 0
    custom = tmp_path / "custom.csv"  # a renamed key column
    custom.write_text("id,cameras,frames,height,width\n007,1,16,224,224\n")
    assert read_metadata(custom, key="id").column("id").to_pylist() == ["007"]


def test_parts_lacking_an_optional_column_count_as_they_do_alone(tmp_path: Path) -> None:
    from tokenbucket.tokens.metadata import iter_metadata_batches

    table = mixture_a(40, seed=3)
    pq.write_table(table.slice(0, 20), tmp_path / "part-0.parquet")
    pq.write_table(table.slice(20).drop_columns(["text_tokens"]), tmp_path / "part-1.parquet")
    spec = TokenSpec(patch=14)
    per_part = [t for b in iter_metadata_batches(tmp_path) for t in breakdown_table(b, spec).totals.tolist()]
    whole = breakdown_table(read_metadata(tmp_path, absent=spec.absent_as_zero()), spec, on_invalid="reject")
    assert whole.rejected.num_rows == 0 and whole.totals.tolist() == per_part
    assert (
        per_part[20:]
        == (breakdown_table(table.slice(20), spec).totals - table.column("text_tokens").to_numpy()[20:]).tolist()
    )
