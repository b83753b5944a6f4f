"""Manifests: written atomically from real Parquet inputs, nothing lost, hash-checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tokenbucket import ConfigError, CostModel, MetadataError, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes
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
    assert info["format"] == 2 and info["rows"] == 20_000  # 2: the hash covers every column and the plan
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


# -- issue 17: integrity of every column, damaged footers, the spec and model it was planned for,
# and counts that agree when duplicates are rejected ------------------------------------------


def _stamp(path: Path) -> dict[str, object]:
    return dict(json.loads(pq.ParquetFile(path).metadata.metadata[b"tokenbucket"]))


def _rewrite(src: Path, dst: Path, table: pa.Table | None = None, footer: bytes | None = None) -> None:
    """``src``'s rows (or ``table``) under ``src``'s footer (or ``footer``), as an editor would leave them."""
    rows = (pq.read_table(src) if table is None else table).replace_schema_metadata(None)
    raw = pq.ParquetFile(src).metadata.metadata[b"tokenbucket"] if footer is None else footer
    with pq.ParquetWriter(dst, rows.schema) as w:
        w.write_table(rows)
        w.add_key_value_metadata({b"tokenbucket": raw})


@pytest.fixture
def built(metadata: Path, tmp_path: Path) -> Path:
    out = tmp_path / "built.parquet"
    build_manifest(metadata, SPEC, COST, out, budget_bytes=BUDGET, on_oversize="reject")
    assert (pq.read_table(out).column("bucket").to_numpy() < 0).any()  # some rows carry a reason
    return out


def _edit(table: pa.Table, column: str, how: str) -> pa.Table:
    """One cell of ``column`` changed: ``value`` (another value), ``to_null`` or ``from_null``."""
    col = table.column(column)
    values = col.to_pylist()
    valid = [i for i, v in enumerate(values) if v is not None]
    nulls = [i for i, v in enumerate(values) if v is None]
    if how == "value":
        i = valid[0]
        values[i] = values[i] + "x" if isinstance(values[i], str) else values[i] + 1
    elif how == "to_null":
        values[valid[0]] = None
    else:
        values[nulls[0]] = "x" if pa.types.is_string(col.type) else 0
    return table.set_column(table.schema.get_field_index(column), column, pa.array(values, col.type))


@pytest.mark.parametrize(
    ("column", "how"),
    [
        ("key", "value"),
        ("index", "value"),
        ("vision", "value"),
        ("text", "value"),
        ("total", "value"),
        ("bucket", "value"),
        ("reason", "value"),
        ("reason", "from_null"),  # a kept row made to look rejected
        ("vision", "to_null"),
    ],
)
def test_manifest_hash_covers_every_column_edit_is_refused(built: Path, tmp_path: Path, column: str, how: str) -> None:
    before = built.read_bytes()
    edited = tmp_path / "edited.parquet"
    _rewrite(built, edited, table=_edit(pq.read_table(built), column, how))
    with pytest.raises(ConfigError, match=r"edited\.parquet.*does not match its content hash"):
        load_manifest(edited)
    assert built.read_bytes() == before
    _rewrite(built, edited)  # the same rows under the same footer: still verifies
    assert load_manifest(edited).content_hash == load_manifest(built).content_hash


@pytest.mark.parametrize(("field", "change"), [("plan", "batch_size"), ("token_spec", "patch")])
def test_manifest_hash_covers_the_plan_and_token_spec(built: Path, tmp_path: Path, field: str, change: str) -> None:
    before, stamp = built.read_bytes(), _stamp(built)
    if field == "plan":
        stamp["plan"]["buckets"][0]["batch_size"] += 1  # type: ignore[index]
    else:
        stamp["token_spec"]["patch"] = 16  # type: ignore[index]
    edited = tmp_path / "edited.parquet"
    _rewrite(built, edited, footer=json.dumps(stamp).encode())
    with pytest.raises(ConfigError, match="content hash"):
        load_manifest(edited)
    assert built.read_bytes() == before


def test_manifest_hash_ignores_batch_boundaries(built: Path) -> None:
    from tokenbucket.plan._manifest_io import ContentHash

    table, stamp = pq.read_table(built), _stamp(built)
    one, many = ContentHash(), ContentHash()
    one.update(table)
    for start in range(0, table.num_rows, 777):  # slices cut through nulls and strings alike
        many.update(table.slice(start, 777))
    assert one.hexdigest(stamp) == many.hexdigest(stamp) == stamp["content_hash"]


def test_manifest_old_format_is_a_clear_error(built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokenbucket.cli.main import main

    stamp = {**_stamp(built), "format": 1}
    old = tmp_path / "old.parquet"
    _rewrite(built, old, footer=json.dumps(stamp).encode())
    before = old.read_bytes()
    with pytest.raises(ConfigError, match=r"'.*old\.parquet' is a manifest of format 1, .*older.*re-run plan"):
        load_manifest(old)
    assert main(["inspect", str(old)]) == 1
    err = capsys.readouterr().err
    assert "re-run plan" in err and err.count("\n") == 1 and "Traceback" not in err
    assert old.read_bytes() == before


@pytest.mark.parametrize(
    ("footer", "message"),
    [
        (b'{"format": 2, "rows": ', "is not JSON"),
        (b"\xff\xfe", "is not JSON"),
        (b"[1, 2]", "a JSON object was expected"),
        ("drop:rows", "field 'rows' should be an integer, but got nothing"),
        ("set:rows='many'", "field 'rows' should be an integer, but got 'many'"),
        ("set:content_hash=7", "field 'content_hash' should be a string, but got 7"),
        ("set:plan=[]", "field 'plan' should be a JSON object"),
        ("set:format=true", "field 'format' should be an integer"),
        ("set:part=3", "part=3 of parts=1"),
        ("set:plan={}", "its plan cannot be read"),
    ],
)
def test_manifest_damaged_footer_is_a_one_line_error_naming_the_file(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], footer: bytes | str, message: str
) -> None:
    from tokenbucket.cli.main import main

    if isinstance(footer, str):
        stamp = _stamp(built)
        action, _, rest = footer.partition(":")
        if action == "drop":
            del stamp[rest]
        else:
            name, _, value = rest.partition("=")
            stamp[name] = json.loads(value.replace("'", '"'))
        footer = json.dumps(stamp).encode()
    damaged = tmp_path / "damaged.parquet"
    _rewrite(built, damaged, footer=footer)
    before = damaged.read_bytes()
    with pytest.raises(ConfigError, match=r"'.*damaged\.parquet' has a damaged footer") as info:
        load_manifest(damaged, verify=False)
    assert message in str(info.value)
    assert main(["inspect", str(damaged)]) == 1
    err = capsys.readouterr().err
    assert "damaged.parquet" in err and err.count("\n") == 1 and "Traceback" not in err
    assert damaged.read_bytes() == before


def test_manifest_used_with_another_spec_or_model_is_refused_or_warned(built: Path) -> None:
    import dataclasses

    from tokenbucket.plan.manifest import ManifestMismatchWarning
    from tokenbucket.train.collate import TokenBucketDataset

    model, before = COST.model, built.read_bytes()
    same = load_manifest(built, spec=SPEC, model=model)  # what it was planned for: silent
    assert len(same) == 20_000
    with pytest.raises(ConfigError, match=r"another token spec: token_spec\.patch: 14 in the manifest, 16 given"):
        load_manifest(built, spec=TokenSpec(patch=16))
    deeper = dataclasses.replace(model, layers=48)
    with pytest.raises(ConfigError, match=r"another model: model\.layers: 24 in the manifest, 48 given"):
        load_manifest(built, model=deeper)
    with pytest.raises(ConfigError, match=r"token spec and model: .*patch.*layers.*allow_mismatch=True"):
        load_manifest(built, spec=TokenSpec(patch=16), model=deeper)
    with pytest.warns(ManifestMismatchWarning, match=r"model\.layers: 24 in the manifest, 48 given"):
        m = load_manifest(built, model=deeper, allow_mismatch=True)
    assert len(m) == 20_000
    # a model renamed, or columns mapped under other names, plans the same
    load_manifest(built, model=dataclasses.replace(model, name="mine"))
    # the dataset compares the spec it is handed with the manifest's
    n = len(same)
    with pytest.raises(ConfigError, match=r"token_spec\.patch: 14 in the manifest, 16 given"):
        TokenBucketDataset(list(range(n)), spec=TokenSpec(patch=16), manifest=same)
    assert len(TokenBucketDataset(list(range(n)), spec=SPEC, manifest=same)) == n
    with pytest.warns(ManifestMismatchWarning, match=r"token_spec\.patch: 14 in the manifest, 16 given"):
        allowed = TokenBucketDataset(list(range(n)), spec=TokenSpec(patch=16), manifest=same, allow_mismatch=True)
    assert len(allowed) == n
    assert built.read_bytes() == before


def test_manifest_duplicate_key_rejected_counts_agree_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokenbucket.cli.main import main
    from tokenbucket.train.sampler import BucketBatchSampler

    table = mixture_a(60, seed=8)
    keys = table.column("key").to_pylist()
    keys[42] = keys[5]
    src = tmp_path / "dup.parquet"
    pq.write_table(table.set_column(0, "key", pa.array(keys)), src)
    before = src.read_bytes()
    out = tmp_path / "m.parquet"
    argv = ["plan", str(src), "--budget-gib", "200", "--on-invalid", "reject", "--out", str(out), "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    m = load_manifest(out)
    bucket = m.table.column("bucket").to_numpy()
    assert m.table.num_rows == 60 and (bucket >= 0).sum() == 59 and (bucket < 0).sum() == 1
    assert "should be unique" in m.table.column("reason")[42].as_py()
    # the plan the CLI printed, the plan in the manifest and the manifest's rows say the same
    assert data["summary"]["samples"] == sum(b["samples"] for b in data["buckets"]) == 59
    assert data["summary"]["rejected"] == 1 and data["summary"]["invalid"] == 1
    assert m.plan.summary()["samples"] == 59
    assert [b.samples for b in m.plan.buckets] == np.bincount(
        bucket[bucket >= 0], minlength=len(m.plan.buckets)
    ).tolist()
    assert sum(len(b) for b in BucketBatchSampler.from_manifest(m)) == 59  # the sampler holds the same 59
    assert main(["inspect", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["summary"]
    assert (shown["samples"], shown["rejected"], shown["invalid"]) == (59, 1, 1)
    assert src.read_bytes() == before


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_manifest_duplicates_across_batches_and_null_keys_plan_only_the_kept_rows(tmp_path: Path, mode: str) -> None:
    table = mixture_a(60, seed=9)
    keys: list[str | None] = table.column("key").to_pylist()
    keys[50] = keys[3]  # a repeat in a later batch
    keys[20] = None  # a row without a key
    src = tmp_path / "dup.parquet"
    pq.write_table(table.set_column(0, "key", pa.array(keys, pa.string())), src)
    m = build_manifest(
        src,
        SPEC,
        COST,
        tmp_path / "m.parquet",
        budget_bytes=BUDGET,
        batch_rows=16,
        mode=mode,
        on_invalid="reject",
        on_oversize="reject",
    )
    bucket = m.table.column("bucket").to_numpy()
    invalid = set(np.flatnonzero(pc.starts_with(m.table.column("reason").fill_null(""), "invalid")))
    assert len(bucket) == 60 and invalid == {20, 50}
    assert m.plan.summary()["samples"] == (bucket >= 0).sum() == 58 - m.plan.summary()["rejected"]
    assert m.summary()["rejected"] == (bucket < 0).sum() and m.summary()["invalid"] == 2


@pytest.mark.parametrize("batch_rows", [200, 1_000])
def test_manifest_invalid_row_is_named_by_its_input_row_whatever_the_batch(tmp_path: Path, batch_rows: int) -> None:
    """A reason or error names the row of the input, not of the batch it was read in."""
    n = 600
    table = pa.table(
        {
            "key": [f"k{i:04d}" for i in range(n)],
            "cameras": [1] * n,
            "frames": [-3 if i == 251 else 1 for i in range(n)],
            "height": [224] * n,
            "width": [224] * n,
        }
    )
    src = tmp_path / "m.parquet"
    pq.write_table(table, src)
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    kw: dict[str, Any] = {"budget_bytes": gpu_budget_bytes("H100-SXM"), "batch_rows": batch_rows}
    m = build_manifest(src, TokenSpec(patch=14), cost, tmp_path / "out.parquet", on_invalid="reject", **kw)
    reasons = [r for r in m.table.column("reason").to_pylist() if r]
    assert reasons == ["invalid: row 251 key 'k0251': column 'frames' should be at least 1, but got frames=-3"]
    with pytest.raises(MetadataError, match=r"row 251 key 'k0251'"):
        build_manifest(src, TokenSpec(patch=14), cost, tmp_path / "raise.parquet", **kw)
    assert not (tmp_path / "raise.parquet").exists()
