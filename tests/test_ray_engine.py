"""The Ray engine writes the local engine's manifest: same rows, order, buckets and content hash.

Invariants: for the same inputs and arguments, ``build_manifest_ray`` and ``build_manifest``
give equal plans and equal content hashes (so equal columns, rows in input order); every input
row is in the manifest once (in a bucket or rejected); an error is the local engine's error;
nothing that was on disk before a failed build changes; no Ray is left running.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from tokenbucket import ConfigError, CostModel, MetadataError, ModelSpec, TokenSpec, gpu_budget_bytes  # noqa: E402
from tokenbucket.plan.buckets import plan_buckets  # noqa: E402
from tokenbucket.plan.manifest import Manifest, build_manifest, length_histogram, load_manifest  # noqa: E402
from tokenbucket.plan.ray_engine import build_manifest_ray  # noqa: E402

SPEC = TokenSpec(patch=14)
COST = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray for this module's tests, shut down after them (none is left running)."""
    assert not ray.is_initialized()
    ray.init(num_cpus=2, object_store_memory=2 << 30, include_dashboard=False, log_to_driver=False)
    with warnings.catch_warnings():  # Ray's first DataContext warns of its own deprecated field
        warnings.simplefilter("ignore", DeprecationWarning)
        ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()
    assert not ray.is_initialized()


def metadata(n: int, seed: int, *, invalid: bool = True, shuffle: bool = False) -> pa.Table:
    """Realistic metadata: key, cameras, frames, height, width, text_tokens; with ``invalid``, a
    few bad rows (negative frames, null height, zero cameras, a repeated key in and across
    batches); with ``shuffle``, keys out of order."""
    rng = np.random.default_rng(seed)
    keys = np.char.add("ep", np.char.zfill(np.arange(n).astype(str), 9)).astype(object)
    if shuffle:
        keys = keys[rng.permutation(n)]
    cols = {
        "key": keys,
        "cameras": rng.integers(1, 4, n),
        "frames": rng.choice([1, 2, 4, 8, 16], n),
        "height": rng.choice([224, 336, 448], n).astype(object),
        "width": rng.choice([224, 336], n),
        "text_tokens": rng.integers(0, 400, n),
    }
    if invalid:
        cols["frames"][n // 3] = -4
        cols["height"][n // 2] = None
        cols["cameras"][n - 1], cols["text_tokens"][n - 1] = 0, 0  # a sample of 0 tokens
        cols["key"][n // 4 + 1] = cols["key"][n // 4]  # repeated within a batch
        cols["key"][n - 2] = cols["key"][5]  # repeated across batches
    return pa.table({k: pa.array(list(v) if v.dtype == object else v) for k, v in cols.items()})


def snapshot(directory: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(directory.iterdir()) if p.is_file()}


def both(src: Path | list[Path], out_dir: Path, name: str, **kw: object) -> tuple[Manifest, Manifest]:
    local = build_manifest(src, SPEC, COST, out_dir / f"local-{name}", budget_bytes=BUDGET, **kw)  # type: ignore[arg-type]
    on_ray = build_manifest_ray(src, SPEC, COST, out_dir / f"ray-{name}", budget_bytes=BUDGET, **kw)  # type: ignore[arg-type]
    return local, on_ray


def assert_same(local: Manifest, on_ray: Manifest, rows: int) -> None:
    assert on_ray.plan == local.plan
    assert on_ray.content_hash == local.content_hash
    assert len(on_ray) == len(local) == rows  # every input row, once
    assert [f.relative_to(on_ray.path) for f in on_ray.files] == [f.relative_to(local.path) for f in local.files]
    assert on_ray.table.equals(local.table)
    load_manifest(on_ray.path)  # the hash verifies from disk


@pytest.mark.slow
def test_ray_engine_thousand_rows_with_rejects_matches_local(local_ray: None, tmp_path: Path) -> None:
    src = tmp_path / "meta.parquet"
    pq.write_table(metadata(1_000, seed=1, shuffle=True), src, row_group_size=170)
    local, on_ray = both(src, tmp_path, "m.parquet", batch_rows=150, on_invalid="reject", on_oversize="reject")
    assert_same(local, on_ray, 1_000)
    reasons = on_ray.table.column("reason").to_pylist()
    refused = {i for i, r in enumerate(reasons) if r is not None and r.startswith("invalid")}
    assert {333, 500, 999, 251, 998} <= refused  # frames, height, empty, repeated in / across batches
    assert "should be unique" in reasons[998] and "row 998" in reasons[998]  # the later row, global index
    assert on_ray.summary() == local.summary()


@pytest.mark.slow
def test_ray_engine_directory_of_parts_in_and_out_matches_local(local_ray: None, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    table = metadata(1_000, seed=2)
    for i, start in enumerate(range(0, 1_000, 300)):  # a Parquet part, a JSONL part, Parquet again
        part = table.slice(start, 300)
        if i == 1:
            lines = [json.dumps(r) for r in part.to_pylist()]
            (inputs / f"part-{i}.jsonl").write_text("\n".join(lines) + "\n")
        else:
            pq.write_table(part, inputs / f"part-{i}.parquet", row_group_size=64)
    local, on_ray = both(
        inputs, tmp_path, "m", batch_rows=128, part_rows=250, on_invalid="reject", on_oversize="reject"
    )
    assert len(on_ray.files) > 1 and on_ray.path.is_dir()
    assert_same(local, on_ray, 1_000)
    assert on_ray.table.column("index").to_pylist() == list(range(1_000))


def test_ray_engine_given_plan_and_dynamic_mode_match_local(local_ray: None, tmp_path: Path) -> None:
    src = tmp_path / "meta.parquet"
    pq.write_table(metadata(2_000, seed=3, shuffle=True), src, row_group_size=500)
    plan = plan_buckets(length_histogram(src, SPEC, batch_rows=400), COST, BUDGET, max_buckets=4)
    kw: dict[str, object] = {"batch_rows": 400, "on_invalid": "reject", "on_oversize": "reject"}
    local = build_manifest(src, SPEC, plan, tmp_path / "lp.parquet", **kw)  # type: ignore[arg-type]
    on_ray = build_manifest_ray(src, SPEC, plan, tmp_path / "rp.parquet", **kw)  # type: ignore[arg-type]
    assert_same(local, on_ray, 2_000)
    local, on_ray = both(src, tmp_path, "dyn.parquet", mode="dynamic", max_buckets=4, **kw)
    assert_same(local, on_ray, 2_000)


@pytest.mark.slow
def test_ray_engine_invalid_row_raises_the_local_error_and_changes_nothing(local_ray: None, tmp_path: Path) -> None:
    src = tmp_path / "meta.parquet"
    pq.write_table(metadata(1_000, seed=4), src, row_group_size=100)
    out = tmp_path / "m.parquet"
    out.write_bytes(b"not a manifest")  # a stranger's file: never replaced
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="exists and is not a tokenbucket manifest"):
        build_manifest_ray(src, SPEC, COST, out, budget_bytes=BUDGET, batch_rows=100)
    out.unlink()
    before = snapshot(tmp_path)
    kw: dict[str, object] = {"budget_bytes": BUDGET, "batch_rows": 100, "on_oversize": "reject"}
    with pytest.raises(MetadataError) as local_error:
        build_manifest(src, SPEC, COST, out, **kw)  # type: ignore[arg-type]
    with pytest.raises(MetadataError) as ray_error:
        build_manifest_ray(src, SPEC, COST, out, **kw)  # type: ignore[arg-type]
    assert type(ray_error.value) is type(local_error.value)
    assert str(ray_error.value) == str(local_error.value)
    assert "row 251 " in str(ray_error.value)  # the input row (a key repeated in batch 2), not the batch's row 51
    assert snapshot(tmp_path) == before  # no manifest, no temporary, no scratch left


@pytest.mark.slow
def test_ray_engine_repeated_key_across_batches_raises_like_local(local_ray: None, tmp_path: Path) -> None:
    table = metadata(1_000, seed=5, invalid=False, shuffle=True)
    keys = table.column("key").to_pylist()
    keys[900] = keys[10]
    src = tmp_path / "dup.parquet"
    pq.write_table(table.set_column(0, "key", pa.array(keys)), src)
    before = snapshot(tmp_path)
    kw: dict[str, object] = {"budget_bytes": BUDGET, "batch_rows": 100, "on_oversize": "reject"}
    with pytest.raises(ConfigError, match=r"row 900: key .* earlier row") as local_error:
        build_manifest(src, SPEC, COST, tmp_path / "m.parquet", **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"row 900: key .* earlier row") as ray_error:
        build_manifest_ray(src, SPEC, COST, tmp_path / "m.parquet", **kw)  # type: ignore[arg-type]
    assert str(ray_error.value) == str(local_error.value)
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_ray_engine_replaces_an_old_manifest_in_place(local_ray: None, tmp_path: Path) -> None:
    src = tmp_path / "meta.parquet"
    pq.write_table(metadata(500, seed=6), src)
    out = tmp_path / "m.parquet"
    first = build_manifest_ray(src, SPEC, COST, out, budget_bytes=BUDGET, on_invalid="reject", on_oversize="reject")
    again = build_manifest_ray(src, SPEC, COST, out, budget_bytes=BUDGET, on_invalid="reject", on_oversize="reject")
    assert again.content_hash == first.content_hash and len(again) == 500
    assert sorted(os.listdir(tmp_path)) == ["m.parquet", "meta.parquet"]  # no temporary or scratch left


@pytest.mark.slow
def test_ray_engine_million_rows_same_manifest_as_local(local_ray: None, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    table = metadata(1_000_000, seed=7)
    for i in range(4):
        pq.write_table(table.slice(i * 250_000, 250_000), inputs / f"part-{i:02d}.parquet", row_group_size=50_000)
    local, on_ray = both(inputs, tmp_path, "m.parquet", batch_rows=100_000, on_invalid="reject", on_oversize="reject")
    assert_same(local, on_ray, 1_000_000)
    assert on_ray.summary()["invalid"] == local.summary()["invalid"] == 5


@pytest.mark.slow
def test_cli_plan_engine_ray_writes_the_local_engines_manifest(
    local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenbucket.cli.main import main

    src = tmp_path / "meta.parquet"
    pq.write_table(metadata(2_000, seed=4), src)
    flags = ["--patch", "14", "--preset", "design-24L-1024", "--gpu", "h100-sxm", "--on-invalid", "reject"]
    flags += ["--on-oversize", "reject", "--quiet"]
    assert main(["plan", str(src), *flags, "--out", str(tmp_path / "local.parquet")]) == 0
    assert main(["plan", str(src), *flags, "--engine", "ray", "--out", str(tmp_path / "ray.parquet")]) == 0
    local, on_ray = load_manifest(tmp_path / "local.parquet"), load_manifest(tmp_path / "ray.parquet")
    assert on_ray.content_hash == local.content_hash and len(on_ray) == 2_000
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:  # argparse-style usage error: exit status 2
        code = main(["plan", str(src), *flags, "--ray-address", "auto", "--out", str(tmp_path / "x.parquet")])
        raise SystemExit(code)
    assert done.value.code == 2
    assert "--ray-address goes with --engine ray" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()
