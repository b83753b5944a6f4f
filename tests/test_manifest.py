"""Manifests: written atomically from real Parquet inputs, nothing lost, hash-checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.manifest import build_manifest, load_manifest
from tokenbucket.testing import mixture_a

SPEC = TokenSpec(patch=14)
COST = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture
def metadata(tmp_path: Path) -> Path:
    path = tmp_path / "meta.parquet"
    pq.write_table(mixture_a(20_000, seed=3), path, row_group_size=4_000)
    return path


def test_manifest_every_sample_once_in_a_bucket_or_rejected(metadata: Path, tmp_path: Path) -> None:
    out = tmp_path / "manifest.parquet"
    m = build_manifest(metadata, SPEC, COST, out, budget_bytes=BUDGET, on_oversize="reject", batch_rows=3_000)
    table = m.table
    assert table.column("index").to_pylist() == list(range(20_000))
    assert table.column("key").to_pylist() == pq.read_table(metadata).column("key").to_pylist()
    bucket = table.column("bucket").to_numpy()
    reason = table.column("reason")
    assert np.array_equal(bucket < 0, reason.is_valid().to_numpy(zero_copy_only=False))
    totals = table.column("total").to_numpy()
    assert np.array_equal(m.plan.assign(totals), bucket)
    # the same numbers as a one-shot breakdown of the whole table
    want = breakdown_table(pq.read_table(metadata), SPEC).totals
    assert np.array_equal(totals, want)


def test_manifest_batched_build_plans_like_one_pass(metadata: Path, tmp_path: Path) -> None:
    a = build_manifest(
        metadata, SPEC, COST, tmp_path / "a.parquet", budget_bytes=BUDGET, on_oversize="reject", batch_rows=1_500
    )
    b = build_manifest(
        metadata, SPEC, COST, tmp_path / "b.parquet", budget_bytes=BUDGET, on_oversize="reject", batch_rows=50_000
    )
    assert a.plan == b.plan
    assert a.content_hash == b.content_hash


def test_manifest_records_plan_spec_meta_and_hash(metadata: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.parquet"
    build_manifest(
        metadata,
        SPEC,
        COST,
        out,
        budget_bytes=BUDGET,
        on_oversize="reject",
        meta={"gpu": "H100-SXM", "model": "design-24L-1024"},
    )
    info = json.loads(pq.ParquetFile(out).metadata.metadata[b"tokenbucket"])
    assert info["format"] == 1 and info["rows"] == 20_000
    assert info["meta"] == {"gpu": "H100-SXM", "model": "design-24L-1024"}  # the caller's words win
    assert TokenSpec.from_dict(info["token_spec"]) == SPEC
    assert len(info["content_hash"]) == 64


def test_manifest_invalid_rows_are_kept_with_their_reason(tmp_path: Path) -> None:
    table = mixture_a(100, seed=4)
    frames = table.column("frames").to_pylist()
    frames[7] = -1
    table = table.set_column(2, "frames", pa.array(frames))
    src = tmp_path / "bad.parquet"
    pq.write_table(table, src)
    with pytest.raises(Exception, match="row 7"):
        build_manifest(src, SPEC, COST, tmp_path / "x.parquet", budget_bytes=BUDGET, on_oversize="reject")
    assert not (tmp_path / "x.parquet").exists()  # nothing half-written
    m = build_manifest(
        src, SPEC, COST, tmp_path / "y.parquet", budget_bytes=BUDGET, on_oversize="reject", on_invalid="reject"
    )
    row = m.table.slice(7, 1).to_pylist()[0]
    assert row["bucket"] == -1 and row["total"] is None and "frames" in row["reason"]
    assert m.table.num_rows == 100


def test_manifest_with_a_given_plan_and_oversize_error(metadata: Path, tmp_path: Path) -> None:
    lengths = breakdown_table(pq.read_table(metadata), SPEC).totals
    plan = plan_buckets(lengths[lengths < 20_000], COST, BUDGET, max_buckets=8)
    with pytest.raises(ConfigError, match="above the plan's last bound"):
        build_manifest(metadata, SPEC, plan, tmp_path / "m.parquet")
    m = build_manifest(metadata, SPEC, plan, tmp_path / "m.parquet", on_oversize="reject")
    assert m.plan == plan
    assert (m.table.column("bucket").to_numpy() < 0).sum() == (lengths > plan.bounds[-1]).sum()


def test_manifest_duplicate_keys_across_batches_are_refused(tmp_path: Path) -> None:
    table = mixture_a(1000, seed=5)
    keys = table.column("key").to_pylist()
    keys[900] = keys[10]
    src = tmp_path / "dup.parquet"
    pq.write_table(table.set_column(0, "key", pa.array(keys)), src)
    with pytest.raises(ConfigError, match=r"row 900: key .* earlier row"):
        build_manifest(
            src, SPEC, COST, tmp_path / "m.parquet", budget_bytes=BUDGET, batch_rows=100, on_oversize="reject"
        )
    # on_invalid="reject": the later row is refused with its reason, within a batch or across batches
    keys[50] = keys[40]
    pq.write_table(table.set_column(0, "key", pa.array(keys)), src)
    for batch_rows in (100, 1000):
        m = build_manifest(
            src,
            SPEC,
            COST,
            tmp_path / f"r{batch_rows}.parquet",
            budget_bytes=BUDGET,
            batch_rows=batch_rows,
            on_oversize="reject",
            on_invalid="reject",
        )
        rows = m.table.to_pylist()
        refused = {r["index"]: r["reason"] for r in rows if r["reason"] and "unique" in r["reason"]}
        assert len(rows) == 1000 and set(refused) == {50, 900}
        assert all(rows[i]["bucket"] == -1 and rows[i]["total"] is None for i in refused)
        assert (
            refused[900]
            == f"invalid: row 900 key {keys[10]!r}: column 'key' should be unique, but got key={keys[10]!r}"
        )
        assert rows[10]["bucket"] >= 0 and rows[40]["bucket"] >= 0  # the first holders keep their place


def test_manifest_load_refuses_foreign_truncated_and_edited_files(metadata: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a tokenbucket manifest"):
        load_manifest(metadata)
    out = tmp_path / "m.parquet"
    build_manifest(metadata, SPEC, COST, out, budget_bytes=BUDGET, on_oversize="reject")
    data = out.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        load_manifest(cut)
    # an edited copy with the original footer metadata: the hash catches it
    table = pq.read_table(out)
    kv = pq.ParquetFile(out).metadata.metadata
    buckets = table.column("bucket").to_numpy().copy()
    buckets[0] = (buckets[0] + 1) % 4
    edited = table.set_column(table.schema.get_field_index("bucket"), "bucket", pa.array(buckets))
    path = tmp_path / "edited.parquet"
    with pq.ParquetWriter(path, edited.schema) as w:
        w.write_table(edited)
        w.add_key_value_metadata({b"tokenbucket".decode(): kv[b"tokenbucket"].decode()})
    with pytest.raises(ConfigError, match="content hash"):
        load_manifest(path)


def _part_histogram(args: tuple[str, dict[str, object]]) -> dict[str, list[int]]:
    from tokenbucket.plan.manifest import length_histogram

    path, spec = args
    return length_histogram(path, TokenSpec.from_dict(spec)).to_dict()


@pytest.mark.slow
def test_manifest_parts_counted_in_parallel_processes_plan_like_one_pass(tmp_path: Path) -> None:
    import multiprocessing as mp

    from tokenbucket.plan.buckets import LengthHistogram

    table = mixture_a(12_000, seed=6)
    parts = []
    src = tmp_path / "parts"
    src.mkdir()
    for i, start in enumerate(range(0, 12_000, 4_000)):
        path = src / f"part-{i}.parquet"
        pq.write_table(table.slice(start, 4_000), path)
        parts.append(str(path))
    with mp.get_context("spawn").Pool(2) as pool:
        dicts = pool.map(_part_histogram, [(p, SPEC.to_dict()) for p in parts])
    merged = LengthHistogram.from_dict(dicts[0])
    for d in dicts[1:]:
        merged = merged.merge(LengthHistogram.from_dict(d))
    plan = plan_buckets(merged, COST, BUDGET, on_oversize="reject")
    one_pass = build_manifest(src, SPEC, COST, tmp_path / "m.parquet", budget_bytes=BUDGET, on_oversize="reject")
    assert one_pass.plan == plan
    m = build_manifest(src, SPEC, plan, tmp_path / "n.parquet", on_oversize="reject")
    assert m.content_hash == one_pass.content_hash


def test_manifest_directory_of_parts_round_trip(metadata: Path, tmp_path: Path) -> None:
    single = build_manifest(metadata, SPEC, COST, tmp_path / "one.parquet", budget_bytes=BUDGET, on_oversize="reject")
    out = tmp_path / "manifest_dir"
    m = build_manifest(
        metadata, SPEC, COST, out, budget_bytes=BUDGET, on_oversize="reject", batch_rows=3_000, part_rows=6_000
    )
    files = sorted(out.glob("part-*.parquet"))
    assert len(files) == 4 and len(m) == 20_000  # parts start at batch boundaries and m.plan == single.plan
    again = load_manifest(out)
    assert again.table.column("key").to_pylist() == single.table.column("key").to_pylist()
    assert again.table.column("bucket").to_pylist() == single.table.column("bucket").to_pylist()
    # rebuilding over an existing directory replaces it whole
    build_manifest(
        metadata, SPEC, COST, out, budget_bytes=BUDGET, on_oversize="reject", batch_rows=5_000, part_rows=10_000
    )
    assert len(sorted(out.glob("part-*.parquet"))) == 2
    # parts go by number (part-100000 after part-99999), and each must sit where it was written
    (out / "part-00001.parquet").rename(out / "part-100000.parquet")
    assert load_manifest(out).table.column("key").to_pylist() == single.table.column("key").to_pylist()
    (out / "part-00000.parquet").rename(out / "part-200000.parquet")
    with pytest.raises(ConfigError, match="holds part 1 but sits at position 0"):
        load_manifest(out)
    (out / "part-100000.parquet").rename(out / "part-00001.parquet")
    (out / "part-200000.parquet").rename(out / "part-00000.parquet")
    (out / "part-00001.parquet").unlink()
    with pytest.raises(ConfigError, match="should hold 2 parts"):
        load_manifest(out)


def test_manifest_records_the_cost_models_model_and_gpu(metadata: Path, tmp_path: Path) -> None:
    m = build_manifest(metadata, SPEC, COST, tmp_path / "m.parquet", budget_bytes=BUDGET, on_oversize="reject")
    assert m.meta["meta"]["gpu"] == "H100-SXM"
    assert ModelSpec.from_dict(m.meta["meta"]["model"]) == COST.model
