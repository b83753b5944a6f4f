"""TokenBucketDataset and BucketCollate: shapes, masks, empty rows, layout, metadata lies."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tokenbucket import ConfigError, CostModel, ModelSpec, StateError, TokenSpec, breakdown_sample, breakdown_table
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.manifest import build_manifest
from tokenbucket.train.collate import BucketCollate, EmptyRow, TokenBucketDataset, token_layout
from tokenbucket.train.modal import ModalityCollate
from tokenbucket.train.packing import PackedCollate

from .tables import small_meta

SPEC = TokenSpec(patch=56, special_per_frame=1, special_per_camera=2)
COST = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention="eager"))
BUDGET = 8 * 2**20


class Seqs(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, lengths: np.ndarray, lie_at: int | None = None) -> None:
        self.lengths, self.lie_at = lengths, lie_at

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        n = int(self.lengths[i]) + (3 if i == self.lie_at else 0)
        return {"tokens": torch.full((n, 4), float(i + 1))}


def setup(mode: str = "static", lie_at: int | None = None) -> tuple[TokenBucketDataset, Any]:
    table = small_meta(60)
    lengths = breakdown_table(table, SPEC).totals
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=3, multiple=8, mode=mode)  # type: ignore[arg-type]
    return TokenBucketDataset(Seqs(lengths, lie_at), metadata=table, spec=SPEC, plan=plan), plan


def test_collate_static_pads_to_the_bucket_shape_with_masks() -> None:
    data, plan = setup()
    collate = BucketCollate(data)
    sampler = data.sampler(world_size=3, rank=2, seed=1)
    for indices in sampler:
        batch = collate([data[i] for i in indices])
        info = batch["info"]
        b = plan.buckets[info.bucket]
        assert batch["tokens"].shape == (b.batch_size, b.bound, 4) and info.shape == (b.batch_size, b.bound)
        real = [i for i in indices if i < len(data)]
        assert int(batch["row_mask"].sum()) == len(real)
        for r, i in enumerate(real):
            n = int(data.lengths[i])
            assert bool(batch["attention_mask"][r, :n].all()) and not bool(batch["attention_mask"][r, n:].any())
            assert bool((batch["tokens"][r, :n] == i + 1).all()) and bool((batch["tokens"][r, n:] == 0).all())
        assert info.real_tokens == int(batch["attention_mask"].sum())
        assert info.keys == tuple(f"s{i:03d}" for i in real)
        assert info.risk == pytest.approx(info.predicted_peak_bytes / plan.budget_bytes)
        assert info.predicted_peak_bytes <= plan.budget_bytes


def test_collate_empty_row_only_batch_keeps_the_shape() -> None:
    data, plan = setup()
    n = len(data)
    _, item = data[n + 1]
    assert isinstance(item, EmptyRow) and item.bucket == 1
    batch = BucketCollate(data)([data[n + 1]])
    assert batch["tokens"].shape[:2] == (plan.buckets[1].batch_size, plan.buckets[1].bound)
    assert not bool(batch["row_mask"].any()) and batch["info"].keys == ()


def test_collate_dynamic_pads_to_the_longest_in_the_batch() -> None:
    data, _ = setup("dynamic")
    batch = BucketCollate(data)([data[i] for i in (0, 1, 2)])
    assert batch["tokens"].shape[:2] == (3, int(max(data.lengths[:3])))


def test_collate_metadata_lie_names_key_expected_and_actual() -> None:
    data, _ = setup(lie_at=5)
    with pytest.raises(
        ConfigError,
        match=r"sample 5 \(key 's005'\): its metadata says (\d+) tokens but its 'tokens' tensor has shape \(\d+, 4\)",
    ):
        BucketCollate(data)([data[5]])


def test_collate_layout_covers_every_token_by_camera_frame_and_modality() -> None:
    data, _ = setup()
    pair = tuple(int(i) for i in np.flatnonzero(data.buckets == data.buckets[0])[:2])  # a static batch: one bucket
    batch = BucketCollate(data, with_layout=True)([data[i] for i in pair])
    for segs, i in zip(batch["layout"], pair, strict=True):
        bd = breakdown_sample(small_meta(60).slice(i, 1).to_pylist()[0], SPEC)
        assert segs[0].start == 0 and segs[-1].stop == bd.total
        assert all(a.stop == b.start for a, b in itertools.pairwise(segs))  # contiguous
        frames = [s for s in segs if s.modality == "vision"]
        assert len(frames) == sum(c.temporal for c in bd.cameras)
        assert {s.stop - s.start for s in frames} == {c.spatial + 1 for c in bd.cameras}  # + special per frame
        assert sum(s.stop - s.start for s in segs if s.modality == "text") == bd.text
    assert token_layout(breakdown_sample({"cameras": 0, "frames": 1, "height": 1, "width": 1}, SPEC), SPEC) == []


def test_dataset_metadata_as_callable_or_column() -> None:
    table = small_meta(60)
    lengths = breakdown_table(table, SPEC).totals
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=3, multiple=8)
    rows = table.to_pylist()
    del rows[0]["text_tokens"]  # an optional column the first sample lacks still counts for the others
    lengths = np.array([breakdown_sample(r, SPEC).total for r in rows])
    assert (
        lengths[0] < breakdown_table(table, SPEC).totals[0] and (table.column("text_tokens").to_numpy()[1:] > 0).all()
    )
    a = TokenBucketDataset(Seqs(lengths), metadata=lambda i: rows[i], spec=SPEC, plan=plan)

    class WithColumn(Seqs):
        def __getitem__(self, i: Any) -> Any:
            return rows if i == "meta" else super().__getitem__(i)

    b = TokenBucketDataset(WithColumn(lengths), metadata="meta", spec=SPEC, plan=plan)
    assert np.array_equal(a.buckets, b.buckets) and np.array_equal(a.lengths, lengths)
    with pytest.raises(ConfigError, match="no column 'nope'"):
        TokenBucketDataset(Seqs(lengths), metadata="nope", spec=SPEC, plan=plan)


def test_dataset_refuses_a_manifest_of_another_dataset(tmp_path: Path) -> None:
    table = small_meta(60)
    src = tmp_path / "m.parquet"
    pq.write_table(table, src)
    m = build_manifest(src, SPEC, COST, tmp_path / "manifest.parquet", budget_bytes=BUDGET)
    lengths = m.table.column("total").to_numpy()
    ok = TokenBucketDataset(Seqs(lengths), metadata=table, spec=SPEC, manifest=m)
    assert np.array_equal(ok.buckets, m.table.column("bucket").to_numpy())
    keys = table.column("key").to_pylist()
    keys[17] = "zzz"
    with pytest.raises(ConfigError, match=r"index 17 has key 'zzz' in the dataset but 's017' in the manifest"):
        TokenBucketDataset(Seqs(lengths), metadata=table.set_column(0, "key", pa.array(keys)), spec=SPEC, manifest=m)
    with pytest.raises(ConfigError, match="60 rows but the dataset has 59"):
        TokenBucketDataset(Seqs(lengths[:59]), spec=SPEC, manifest=m)


def test_dataset_sampler_collate_in_a_dataloader_with_workers() -> None:
    data, _ = setup()
    loader = DataLoader(data, batch_sampler=data.sampler(seed=2), collate_fn=BucketCollate(data), num_workers=2)
    seen = sorted(int(i) for batch in loader for i in batch["index"].tolist() if i >= 0)
    assert seen == list(range(len(data)))


def test_collate_static_batch_that_mixes_buckets_is_refused() -> None:
    data, _ = setup()
    a = int(np.flatnonzero(data.buckets == data.buckets.min())[0])
    b = int(np.flatnonzero(data.buckets > data.buckets.min())[0])  # another bucket's sample
    with pytest.raises(ConfigError, match=rf"a batch mixes buckets: sample {a} is in bucket \d+ but sample {b}"):
        BucketCollate(data)([data[a], data[b]])


def _positions_run(data: TokenBucketDataset, stop: int | None, state: dict[str, Any] | None, after: bool) -> Any:
    """Batches (their dataset indices) of one epoch through a DataLoader with 2 workers; with ``stop``,
    the state taken after ``stop`` trained batches (from the last one's info, or the sampler's count)."""
    sampler = data.sampler(seed=5)
    if state is not None:
        sampler.load_state_dict(state)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=BucketCollate(data), num_workers=2, prefetch_factor=2)
    seen = []
    for batch in loader:
        seen.append(batch["info"].indices)
        if stop is not None and len(seen) == stop:
            return seen, sampler.state_dict(after=batch["info"] if after else None)
    return seen, None


@pytest.mark.slow
def test_plain_dataloader_with_workers_resumes_exactly_from_the_last_batch_info() -> None:
    table = small_meta(300)
    lengths = breakdown_table(table, SPEC).totals
    plan = plan_buckets(lengths, COST, BUDGET // 16, max_buckets=3, multiple=8)  # small batches: many steps
    data = TokenBucketDataset(Seqs(lengths), metadata=table, spec=SPEC, plan=plan)
    full, _ = _positions_run(data, None, None, after=False)
    head, state = _positions_run(data, 3, None, after=True)
    rest, _ = _positions_run(data, None, state, after=False)
    assert len(full) > 10 and head + rest == full  # exact: nothing prefetched is lost, nothing repeated
    # the sampler has drawn the prefetched batches too, yet its own state counts the batches the loader
    # handed out (NOTE [ Who draws the batches ]): the same position as after= gives
    _, own = _positions_run(data, 3, None, after=False)
    assert own is not None and state is not None and own["step"] == state["step"] == 3
    # a batch that did not come through the sampler and the dataset carries no position
    plain = BucketCollate(data)([data[i] for i in full[0]])
    with pytest.raises(StateError, match=r"carries no sampler position.*StatefulDataLoader"):
        data.sampler().state_dict(after=plain["info"])


# -- every item key reaches the batch (NOTE [ Every item key reaches the batch ]) -------------------

ACTION_CHUNK, ACTION_DIM, STATE_DIM = 50, 32, 6


class WithKeys(Seqs):
    """Items as a classifier or a LeRobot dataset gives them: the tokens beside a ``label`` (int),
    a ``uid`` (str), an ``action`` chunk [50, 32], ``observation.state`` [6], the ``task``,
    LeRobot's frame ``index`` and a ``trace`` whose length differs by sample."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            **super().__getitem__(i),
            "label": i % 5,
            "uid": f"u{i:03d}",
            "action": torch.full((ACTION_CHUNK, ACTION_DIM), float(i)),
            "observation.state": torch.full((STATE_DIM,), float(i)),
            "task": f"pick the cube {i}",
            "index": torch.tensor(1000 + i),
            "trace": torch.ones(i % 3 + 1, 2),
        }


def keyed_setup(mode: str) -> TokenBucketDataset:
    table = small_meta(60)
    lengths = breakdown_table(table, SPEC).totals
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=3, multiple=8, mode=mode)  # type: ignore[arg-type]
    return TokenBucketDataset(WithKeys(lengths), metadata=table, spec=SPEC, plan=plan)


def check_item_keys(batch: dict[str, Any], data: TokenBucketDataset) -> None:
    """Every item key is in the batch: real rows hold the items' values, empty rows zeros / None."""
    real = [int(i) for i in batch["index"] if i >= 0]
    rows, n = batch["index"].shape[0], len(real)
    empty: list[object] = [None] * (rows - n)
    assert batch["label"] == [i % 5 for i in real] + empty
    assert batch["uid"] == [f"u{i:03d}" for i in real] + empty
    assert batch["task"] == [f"pick the cube {i}" for i in real] + empty
    assert batch["action"].shape == (rows, ACTION_CHUNK, ACTION_DIM)
    assert batch["observation.state"].shape == (rows, STATE_DIM)
    for r, i in enumerate(real):
        assert batch["action"][r].eq(i).all() and batch["observation.state"][r].eq(i).all()
        length = i % 3 + 1
        if "trace_mask" in batch:  # ragged across the batch's rows: padded, with its mask
            assert batch["trace_mask"][r].tolist() == [c < length for c in range(batch["trace"].shape[1])]
        assert batch["trace"][r, :length].eq(1).all() and batch["trace"][r, length:].eq(0).all()
    assert batch["action"][n:].eq(0).all() and batch["observation.state"][n:].eq(0).all()
    assert batch["trace"][n:].eq(0).all()
    # LeRobot's "index" is kept beside the collate's own (-1 on empty rows)
    assert batch["item.index"].tolist() == [1000 + i for i in real] + [0] * (rows - n)
    assert batch["index"].tolist() == real + [-1] * (rows - n)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_collate_every_item_key_reaches_the_batch_with_empty_rows(mode: str) -> None:
    data = keyed_setup(mode)
    n = len(data)
    bucket = int(np.argmax(data.plan.batch_sizes))  # room for empty rows after two real ones in static mode
    a, b = (int(i) for i in np.flatnonzero((data.buckets == bucket) & (np.arange(n) % 3 != 2))[:2])
    batch = BucketCollate(data)([data[a], data[b], data[n + bucket]])  # two real rows, one empty row
    rows = batch["index"].shape[0]
    assert rows == (data.plan.buckets[bucket].batch_size if mode == "static" else 3) and rows > 2
    assert batch["tokens"].shape[0] == rows and batch["row_mask"].tolist() == [True, True] + [False] * (rows - 2)
    check_item_keys(batch, data)
    assert "trace_mask" in batch and batch["trace_mask"][2:].sum() == 0  # the traces differ: padded with a mask
    # through the sampler (its empty rows too) and a DataLoader
    loader = DataLoader(data, batch_sampler=data.sampler(world_size=3, rank=2, seed=1), collate_fn=BucketCollate(data))
    for batch in loader:
        check_item_keys(batch, data)


def test_collate_empty_row_only_batch_has_every_item_key_of_its_bucket() -> None:
    data = keyed_setup("static")
    n = len(data)
    full = BucketCollate(data)([data[int(np.flatnonzero(data.buckets == 1)[0])]])
    empty = BucketCollate(data)([data[n + 1]])
    assert set(empty) == set(full) and not empty["row_mask"].any()
    assert empty["label"] == empty["uid"] == empty["task"] == [None] * empty["index"].shape[0]
    assert empty["action"].shape == full["action"].shape and empty["action"].eq(0).all()
    assert empty["observation.state"].shape == full["observation.state"].shape


def test_collate_ragged_item_keys_listed_and_the_option_checked() -> None:
    data = keyed_setup("dynamic")
    batch = BucketCollate(data, ragged="list")([data[0], data[1]])
    assert "trace_mask" not in batch and [t.shape[0] for t in batch["trace"]] == [1, 2]
    with pytest.raises(ConfigError, match="ragged should be 'pad' or 'list', but got ragged='drop'"):
        BucketCollate(data, ragged="drop")  # type: ignore[arg-type]


# -- a cost model beside its manifest (NOTE [ A cost model beside its manifest ]) ------------------

DESIGN = ModelSpec.preset("design-24L-1024")


def test_collates_refuse_a_cost_model_of_another_model_than_the_manifest_was_planned_for(tmp_path: Path) -> None:
    table = small_meta(60)
    src = tmp_path / "m.parquet"
    pq.write_table(table, src)
    m = build_manifest(src, SPEC, CostModel(DESIGN), tmp_path / "manifest.parquet", budget_bytes=80 * 2**30)
    data = TokenBucketDataset(Seqs(m.table.column("total").to_numpy()), metadata=table, spec=SPEC, manifest=m)
    other = CostModel(dataclasses.replace(DESIGN, layers=48, hidden=4096))
    makers = {
        "BucketCollate": lambda cost: BucketCollate(data, cost_model=cost),
        "ModalityCollate": lambda cost: ModalityCollate(data, cost_model=cost),
        "PackedCollate": lambda cost: PackedCollate(data, 4096, cost_model=cost),
    }
    for make in makers.values():
        with pytest.raises(ConfigError) as caught:
            make(other)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(
            f"cost_model prices another model than manifest {str(tmp_path / 'manifest.parquet')!r} was planned for "
            "(model.hidden: 1024 in the manifest, 4096 given; model.layers: 24 in the manifest, 48 given)"
        )
        assert "plan again with this model, or pass the cost model it was planned with" in message
        # the model it was planned with is taken, also under another name, and so is no cost model
        make(CostModel(DESIGN))
        make(CostModel(dataclasses.replace(DESIGN, name="mine")))
        make(None)
    info = BucketCollate(data, cost_model=CostModel(DESIGN))([data[0]])["info"]
    assert 0 < info.risk <= 1
