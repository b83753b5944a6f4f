"""A Hugging Face ``datasets.Dataset`` as metadata and as item source (NOTE [ Arrow-backed datasets ]).

Invariants: the breakdowns are those of the same rows in the same order (also after
``.shuffle()`` / ``.select()``, in memory and memory-mapped); every sample comes once per epoch;
the extra columns (label, uid) reach the batch, right per row; the metadata is never read as
Python rows; a missing column is named.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

from tokenbucket import ConfigError, CostModel, MissingColumnError, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.train.collate import BucketCollate, TokenBucketDataset

from .tables import small_meta

SPEC = TokenSpec(patch=56, special_per_frame=1, special_per_camera=2)
COST = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention="eager"))
BUDGET = 8 * 2**20
N = 40

View = Callable[[datasets.Dataset], datasets.Dataset]
VIEWS: dict[str, View] = {
    "stored": lambda ds: ds,
    "shuffle": lambda ds: ds.shuffle(seed=3),
    "select": lambda ds: ds.select([7, 3, 3 + 30, 0, 12, 25, 8, 39, 1, 20]),
    "shuffle_select": lambda ds: ds.shuffle(seed=5).select(range(5, 31)),
}


def source_table(n: int = N) -> pa.Table:
    """Metadata plus extras: ``orig`` (the stored row), ``label`` (int), ``uid`` (str), ``score`` (float)."""
    meta = small_meta(n)
    return (
        meta.append_column("orig", pa.array(np.arange(n)))
        .append_column("label", pa.array(np.arange(n) % 7))
        .append_column("uid", pa.array([f"u{i}" for i in range(n)]))
        .append_column("score", pa.array(np.arange(n) / 4))
    )


def with_tokens(table: pa.Table) -> datasets.Dataset:
    """A Dataset of ``table`` plus a ``tokens`` column ``[L_i, 2]`` filled with the row's ``orig``."""
    totals = breakdown_table(table, SPEC).totals
    tokens = [[[float(i), float(i)]] * int(n) for i, n in enumerate(totals)]
    return datasets.Dataset(table.append_column("tokens", pa.array(tokens, pa.list_(pa.list_(pa.float32())))))


def planned(view: datasets.Dataset, **kwargs: Any) -> TokenBucketDataset:
    totals = breakdown_table(source_table(), SPEC).totals
    plan = plan_buckets(totals, COST, BUDGET, max_buckets=3, multiple=8)
    return TokenBucketDataset(view, spec=SPEC, plan=plan, **kwargs)


def order_of(view: datasets.Dataset) -> list[int]:
    """The stored rows of ``view`` in its order, through datasets' own public (copying) path."""
    table = view.with_format("arrow")[:]
    assert isinstance(table, pa.Table)
    return [int(v) for v in table.column("orig").to_pylist()]


def mtimes(folder: Path) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> datasets.Dataset:
    """The dataset saved and loaded back: memory-mapped, as a user's ``load_from_disk`` gives it."""
    folder = tmp_path_factory.mktemp("hf")
    with_tokens(source_table()).save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder))


@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("memory_mapped", [False, True])
def test_hf_dataset_breakdowns_match_breakdown_table_of_the_same_rows(
    name: str, memory_mapped: bool, stored: datasets.Dataset
) -> None:
    base = stored if memory_mapped else with_tokens(source_table())
    view = VIEWS[name](base)
    order = order_of(view)
    if name == "select":
        assert order == [7, 3, 33, 0, 12, 25, 8, 39, 1, 20]  # the rows asked for, in that order
    data = planned(view)
    expected = breakdown_table(source_table().take(pa.array(order)), SPEC).table
    assert len(data) == len(order) == data.breakdowns.num_rows
    for column in ("key", "vision", "text", "total"):
        assert data.breakdowns.column(column).to_pylist() == expected.column(column).to_pylist(), column
    assert data.meta_columns == ("orig", "label", "uid", "score")  # scalar, not read by the spec; not tokens
    assert data.breakdown(0).total == int(expected.column("total")[0].as_py())


@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("fmt", [None, "torch", "numpy"])
def test_hf_dataset_epoch_yields_every_sample_once_with_extra_columns_per_row(name: str, fmt: str | None) -> None:
    view = VIEWS[name](with_tokens(source_table()))
    if fmt is not None:
        view = view.with_format(fmt)
    order = order_of(view)
    data = planned(view)
    loader = DataLoader(data, batch_sampler=data.sampler(seed=0), collate_fn=BucketCollate(data))
    seen: list[int] = []
    for batch in loader:
        rows = int(batch["row_mask"].sum())
        index = batch["index"][:rows].tolist()
        seen += index
        meta = batch["meta"]
        assert set(meta) == {"orig", "label", "uid", "score"}
        width = batch["tokens"].shape[0]
        assert meta["label"].dtype == torch.int64 and meta["label"].shape == (width,)
        assert meta["score"].dtype == torch.float64 and len(meta["uid"]) == width
        for r, i in enumerate(index):
            row = order[i]
            assert int(meta["orig"][r]) == row and int(meta["label"][r]) == row % 7
            assert meta["uid"][r] == f"u{row}" and float(meta["score"][r]) == row / 4
            assert bool((batch["tokens"][r, : int(data.lengths[i])] == row).all())  # the item is that row too
        assert meta["uid"][rows:] == [None] * (width - rows)  # empty rows: None / 0
        assert not bool(meta["label"][rows:].any())
    assert sorted(seen) == list(range(len(order)))  # each sample exactly once


def test_hf_dataset_metadata_is_never_read_as_python_rows(
    monkeypatch: pytest.MonkeyPatch, stored: datasets.Dataset
) -> None:
    calls: list[str] = []
    for method in ("__getitem__", "_getitem", "__iter__", "iter", "to_dict", "to_list", "to_pandas"):
        original = getattr(datasets.Dataset, method)

        def counting(self: datasets.Dataset, *args: Any, _m: str = method, _o: Any = original, **kw: Any) -> Any:
            calls.append(_m)
            return _o(self, *args, **kw)

        monkeypatch.setattr(datasets.Dataset, method, counting)
    data = planned(stored.shuffle(seed=1).select(range(30)))
    assert calls == []  # construction read only Arrow buffers
    data.metadata_columns([0, 5, 9])
    assert calls == []  # so do a batch's extra columns
    # stored order: the metadata's columns are the memory-mapped buffers themselves (no copy)
    plain = planned(stored)
    assert plain._metadata is not None
    ours = plain._metadata.column("frames").chunk(0).buffers()[1]
    theirs = stored.data.table.column("frames").chunk(0).buffers()[1]
    assert ours is not None and theirs is not None and ours.address == theirs.address
    assert calls == []


def test_hf_dataset_missing_required_column_is_named(tmp_path: Path) -> None:
    ds = with_tokens(source_table()).remove_columns("height")
    ds.save_to_disk(str(tmp_path / "ds"))
    loaded = datasets.load_from_disk(str(tmp_path / "ds")).shuffle(seed=0)  # writes its indices file
    before = mtimes(tmp_path)
    with pytest.raises(MissingColumnError, match=r"column 'height' is required but missing") as err:
        planned(loaded)
    assert err.value.column == "height" and "width" in err.value.available
    assert mtimes(tmp_path) == before  # nothing rewritten
    assert loaded.num_rows == N  # no sample went missing


def test_hf_dataset_unknown_meta_column_is_named() -> None:
    ds = with_tokens(source_table())
    with pytest.raises(MissingColumnError, match=r"column 'nope' is required but missing"):
        planned(ds, meta_columns=["label", "nope"])
    with pytest.raises(ConfigError, match=r"meta_columns should be a list of column names, but got meta_columns='uid'"):
        planned(ds, meta_columns="uid")
    assert ds.num_rows == N


def test_hf_dataset_accepted_as_metadata_of_other_items() -> None:
    meta = datasets.Dataset(source_table()).shuffle(seed=2)  # was "should be a table, a column name or a callable"
    order = order_of(meta)
    totals = breakdown_table(source_table(), SPEC).totals
    items = [{"tokens": torch.full((int(totals[r]), 2), float(r))} for r in order]
    data = planned(items, metadata=meta)
    batch = BucketCollate(data)([data[i] for i in range(4)])
    assert batch["meta"]["orig"][:4].tolist() == order[:4]
    assert [data.key(i) for i in range(4)] == [f"s{r:03d}" for r in order[:4]]
    with pytest.raises(ConfigError, match=rf"the metadata has {N:,} rows but the dataset has 39 samples"):
        planned(items[:39], metadata=meta)


def test_hf_dataset_arrow_slice_as_metadata_brings_extras() -> None:
    ds = with_tokens(source_table()).select([4, 2, 9])
    table = ds.with_format("arrow")[:]
    items = [{"tokens": torch.zeros(int(n), 2)} for n in breakdown_table(table, SPEC).totals]
    data = planned(items, metadata=table)
    assert data.meta_columns == ("orig", "label", "uid", "score")  # tokens: a list column, stays in the items
    got = data.metadata_columns([2, 0], rows=3)
    assert got["orig"].tolist() == [9, 4, 0] and got["uid"] == ["u9", "u4", None]  # type: ignore[union-attr]


def test_hf_dataset_meta_columns_chosen_nulls_and_none() -> None:
    table = source_table(12).append_column("maybe", pa.array([1, None] * 6, pa.int64()))
    ds = with_tokens(table)
    data = planned(ds, meta_columns=["maybe", "tokens"])
    got = data.metadata_columns([0, 1])
    assert got["maybe"] == [1, None]  # a null: a list, not a tensor with a made-up value
    assert isinstance(got["tokens"], list) and len(got["tokens"][1]) == int(data.lengths[1])  # type: ignore[arg-type]
    none = planned(ds, meta_columns=())
    batch = BucketCollate(none)([none[i] for i in range(2)])
    assert batch["meta"] == {} and none.metadata_columns([0]) == {}


def test_hf_dataset_python_and_torch_items_give_the_same_batch() -> None:
    ds = with_tokens(source_table()).shuffle(seed=4)
    a, b = planned(ds), planned(ds.with_format("torch"))
    for indices in itertools.islice(iter(a.sampler(seed=1)), 3):
        x = BucketCollate(a)([a[i] for i in indices])
        y = BucketCollate(b)([b[i] for i in indices])
        assert x["tokens"].dtype == y["tokens"].dtype == torch.float32
        assert torch.equal(x["tokens"], y["tokens"]) and torch.equal(x["attention_mask"], y["attention_mask"])
        assert x["meta"]["uid"] == y["meta"]["uid"]


def test_hf_dataset_with_a_manifest_checks_keys_and_brings_extras(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tokenbucket.plan.manifest import build_manifest

    pq.write_table(source_table(), tmp_path / "meta.parquet")
    m = build_manifest(tmp_path / "meta.parquet", SPEC, COST, tmp_path / "manifest.parquet", budget_bytes=BUDGET)
    ds = with_tokens(source_table())
    data = TokenBucketDataset(ds, spec=SPEC, manifest=m)  # its own columns: keys checked, extras carried
    assert data.meta_columns == ("orig", "label", "uid", "score") and data.breakdown(3).total == int(data.lengths[3])
    assert data.metadata_columns([3])["uid"] == ["u3"]
    with pytest.raises(ConfigError, match=r"the manifest does not match the dataset: index 0 has key 's001'"):
        TokenBucketDataset(ds.select([1, 0, *range(2, N)]), spec=SPEC, manifest=m)  # reordered: refused
    bare = TokenBucketDataset(ds.remove_columns(["cameras"]), spec=SPEC, manifest=m)  # not metadata: items only
    assert bare.meta_columns == () and len(bare) == N
