"""ModalityCollate: LeRobot-shaped and Qwen2-VL-shaped items through a real plan, sampler and
DataLoader; every key's shape, padding and mask per bucket; items that disagree with their metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.tokens.spec import CountRule
from tokenbucket.train.batch import Batch, BatchInfo
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.modal import ModalityCollate, ModalityKeys

COST = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention="eager"))
BUDGET = 2**19  # 2 buckets of 2-12 rows over these tiny samples
CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
STATE, ACTION = 6, 7

# -- LeRobot-shaped items ------------------------------------------------------------------------

LEROBOT_SPEC = TokenSpec(
    patch=14, text=CountRule(count=0), proprio=CountRule(count=1), action=CountRule(column="chunk")
)


def lerobot_meta(n: int) -> pa.Table:
    """Per-camera metadata as ``lerobot_rows`` writes it: 2 or 3 cameras named by their item keys."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        frames = int(rng.choice([1, 2]))
        cams = [
            {"name": name, "frames": frames, "height": int(rng.choice([28, 56])), "width": 42}
            for name in CAMS[: int(rng.choice([2, 3]))]
        ]
        rows.append({"key": f"ep{i // 10}_{i % 10}", "cameras": cams, "chunk": int(rng.choice([3, 5]))})
    return pa.Table.from_pylist(rows)


class LeRobotLike(Dataset[dict[str, Any]]):
    """Items as ``LeRobotDataset.__getitem__`` returns them (v2/v3, with ``delta_timestamps`` on
    the cameras and the action): frames ``[T, C, H, W]`` float in [0, 1] (``[C, H, W]`` when T=1),
    ``<camera>_is_pad``, state, action chunk and ``action_is_pad``, 0-d index tensors, the task."""

    def __init__(self, meta: pa.Table, extra_camera_at: int | None = None, lie: dict[int, str] | None = None) -> None:
        self.rows = meta.to_pylist()
        self.extra_camera_at, self.lie = extra_camera_at, lie or {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        item: dict[str, Any] = {}
        cams = list(row["cameras"])
        if i == self.extra_camera_at:
            cams.append({"name": CAMS[len(cams)], "frames": cams[0]["frames"], "height": 28, "width": 42})
        for c, cam in enumerate(cams):
            f, h, w = cam["frames"], cam["height"], cam["width"]
            if self.lie.get(i) == "frames" and c == 0:
                f += 1
            if self.lie.get(i) == "height" and c == 0:
                h += 28
            frames = torch.full((f, 3, h, w), (i + 1) / 1000 + c / 10)
            item[cam["name"]] = frames[0] if f == 1 else frames
            item[f"{cam['name']}_is_pad"] = torch.zeros(f, dtype=torch.bool)
        chunk = row["chunk"]
        item["observation.state"] = torch.full((STATE,), float(i))
        item["action"] = torch.full((chunk, ACTION), float(i))
        item["action_is_pad"] = torch.zeros(chunk, dtype=torch.bool)
        item["timestamp"] = torch.tensor(i / 30)
        item["frame_index"] = torch.tensor(i % 10)
        item["episode_index"] = torch.tensor(i // 10)
        item["index"] = torch.tensor(1000 + i)  # LeRobot's global frame index
        item["task_index"] = torch.tensor(0)
        item["task"] = f"pick the cube {i}"
        return item


def lerobot_setup(
    n: int = 40, tmp_path: Path | None = None, mode: str = "static", **kwargs: Any
) -> tuple[TokenBucketDataset, LeRobotLike]:
    meta = lerobot_meta(n)
    if tmp_path is not None:  # the metadata as a file, to show a refused batch leaves it alone
        pq.write_table(meta, tmp_path / "meta.parquet")
        meta = pq.read_table(tmp_path / "meta.parquet")
    items = LeRobotLike(meta, **kwargs)
    plan = plan_for(meta, LEROBOT_SPEC, mode)
    return TokenBucketDataset(items, metadata=meta, spec=LEROBOT_SPEC, plan=plan), items


def plan_for(meta: pa.Table, spec: TokenSpec, mode: str = "static") -> BucketPlan:
    """A real plan of 2 buckets over the metadata's breakdowns."""
    lengths = breakdown_table(meta, spec).totals
    return plan_buckets(lengths, COST, BUDGET, max_buckets=2, multiple=8, mode=mode)  # type: ignore[arg-type]


def mates(data: TokenBucketDataset, bucket: int, count: int) -> list[int]:
    """The first ``count`` samples of ``bucket``: what the sampler puts in one batch."""
    return [int(i) for i in np.flatnonzero(data.buckets == bucket)[:count]]


def loader(data: TokenBucketDataset, collate: ModalityCollate, **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(data, batch_sampler=data.sampler(**kwargs), collate_fn=collate)


def check_common(batch: Batch, data: TokenBucketDataset) -> list[int]:
    """index / row_mask / info agree with the plan; returns the real indices."""
    info = batch["info"]
    assert isinstance(batch, Batch) and isinstance(info, BatchInfo)
    b = data.plan.buckets[info.bucket]
    rows = batch["index"].shape[0]
    assert info.shape == (rows, b.bound) and rows == b.batch_size  # static: the bucket decides
    real = [int(i) for i in batch["index"] if i >= 0]
    assert batch["row_mask"].tolist() == [True] * len(real) + [False] * (rows - len(real))
    assert batch["index"][len(real) :].eq(-1).all()
    assert list(info.indices) == real and all(int(data.buckets[i]) == info.bucket for i in real)
    return real


LEROBOT_KEYS = {
    # camera frames -> pixel_values and masks; every other item key kept under its own name
    "observation.images.top_is_pad",
    "observation.images.wrist_is_pad",
    "observation.state",
    "action",
    "action_mask",
    "action_is_pad",
    "timestamp",
    "frame_index",
    "episode_index",
    "item.index",
    "task_index",
    "task",
    "pixel_values",
    "camera_keys",
    "index",
    "row_mask",
    "info",
}


def test_modal_collate_lerobot_stacked_every_key_padded_and_masked() -> None:
    data, items = lerobot_setup()
    seen: list[int] = []
    for batch in loader(data, ModalityCollate(data), world_size=3, rank=0, seed=1):
        real = check_common(batch, data)
        seen += real
        rows, n = batch["index"].shape[0], len(real)
        # no key dropped: every key of every item (the side camera's _is_pad when present) is there
        expected = LEROBOT_KEYS | {"camera_mask", "frame_mask", "image_sizes"}
        if any(k == "observation.images.side" for i in real for k in items[i]):
            expected |= {"observation.images.side_is_pad"}
        assert set(batch) >= expected, expected - set(batch)
        bds = [data.breakdown(i) for i in real]
        cams = max(len(bd.cameras) for bd in bds)
        t = max(c.frames for bd in bds for c in bd.cameras)
        h = max(c.height for bd in bds for c in bd.cameras)
        px = batch["pixel_values"]
        assert px.shape == (rows, cams, t, 3, h, 42) and px.dtype == torch.float32
        for r, (i, bd) in enumerate(zip(real, bds, strict=True)):
            item = items[i]
            assert batch["camera_keys"][r] == [c.name for c in bd.cameras]
            for j, cam in enumerate(bd.cameras):
                x = item[cam.name] if cam.frames > 1 else item[cam.name][None]
                assert torch.equal(px[r, j, : cam.frames, :, : cam.height], x)
                assert px[r, j, cam.frames :].abs().sum() == 0 and px[r, j, :, :, cam.height :].abs().sum() == 0
                assert batch["frame_mask"][r, j].tolist() == [f < cam.frames for f in range(t)]
                assert batch["image_sizes"][r, j].tolist() == [cam.height, cam.width]
            assert batch["camera_mask"][r].tolist() == [j < len(bd.cameras) for j in range(cams)]
            chunk = item["action"].shape[0]
            assert torch.equal(batch["action"][r, :chunk], item["action"]) and batch["action"][r, chunk:].eq(0).all()
            assert batch["action_mask"][r].tolist() == [c < chunk for c in range(batch["action"].shape[1])]
            assert torch.equal(batch["observation.state"][r], item["observation.state"])
            assert batch["task"][r] == item["task"] and int(batch["item.index"][r]) == 1000 + i
            assert int(batch["episode_index"][r]) == i // 10 and float(batch["timestamp"][r]) == pytest.approx(i / 30)
        # empty rows: zero pixels, masks off, None in the lists
        assert not batch["camera_mask"][n:].any() and not batch["frame_mask"][n:].any()
        assert px[n:].abs().sum() == 0 and batch["task"][n:] == [None] * (rows - n)
        assert batch["observation.state"].shape == (rows, STATE) and batch["episode_index"].shape == (rows,)
        assert batch["action"].shape[0] == rows and batch["action"].shape[2] == ACTION
    assert sorted(seen) == sorted(set(seen)) and len(seen) > 0  # each sample of this rank once


def test_modal_collate_lerobot_all_ranks_see_every_sample_once() -> None:
    data, _ = lerobot_setup()
    seen = [
        i
        for rank in range(2)
        for b in loader(data, ModalityCollate(data), world_size=2, rank=rank)
        for i in b["info"].indices
    ]
    assert sorted(seen) == list(range(len(data)))


def test_modal_collate_lerobot_patches_cut_as_qwen2vl_does() -> None:
    spec = TokenSpec(
        patch=14, tubelet=2, text=CountRule(count=0), proprio=CountRule(count=1), action=CountRule(column="chunk")
    )
    meta = lerobot_meta(24)
    items = LeRobotLike(meta)
    plan = plan_for(meta, spec)
    data = TokenBucketDataset(items, metadata=meta, spec=spec, plan=plan)
    total_images = 0
    for batch in loader(data, ModalityCollate(data, layout="patches"), seed=3):
        real = check_common(batch, data)
        bds = [data.breakdown(i) for i in real]
        grids = batch["image_grid_thw"]
        assert grids.shape == (sum(len(bd.cameras) for bd in bds), 3)
        # the patch count is the breakdown's vision tokens before merge (merge 1 here)
        assert batch["pixel_values"].shape == (sum(bd.vision for bd in bds), 3 * 2 * 14 * 14)
        cu = batch["cu_seqlens"]
        assert cu.dtype == torch.int32 and cu.tolist() == [0, *np.cumsum(grids.prod(1).tolist()).tolist()]
        assert batch["image_rows"].tolist() == [r for r, bd in enumerate(bds) for _ in bd.cameras]
        assert batch["camera_keys"][: len(real)] == [[c.name for c in bd.cameras] for bd in bds]
        assert {"camera_mask", "frame_mask"}.isdisjoint(batch) and LEROBOT_KEYS - {
            "observation.images.top_is_pad"
        } <= set(batch) | {"observation.images.top_is_pad"}
        # the first patch of the first image: frames 0..1 (frame 0 repeated when T=1), C,t,p,p order
        x = data.dataset[real[0]][bds[0].cameras[0].name]
        x = x[None] if x.ndim == 3 else x
        x = torch.cat([x, x[-1:]]) if x.shape[0] == 1 else x
        assert torch.equal(batch["pixel_values"][0], x[:2, :, :14, :14].permute(1, 0, 2, 3).reshape(-1))
        total_images += grids.shape[0]
    assert total_images == sum(len(data.breakdown(i).cameras) for i in range(len(data)))


# -- Qwen2-VL-shaped items -----------------------------------------------------------------------

QWEN_SPEC = TokenSpec(
    patch=14, merge=2, tubelet=2, resize="max_pixels", min_pixels=56 * 56, max_pixels=28 * 28 * 64, special_per_camera=2
)
SIDES = [(56, 84), (112, 56), (84, 84), (56, 56)]


def qwen_meta(n: int) -> pa.Table:
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        h, w = SIDES[int(rng.integers(len(SIDES)))]
        rows.append(
            {
                "key": f"q{i}",
                "cameras": 1,
                "frames": 1,
                "height": h,
                "width": w,
                "text_tokens": int(rng.integers(3, 30)),
            }
        )
    return pa.Table.from_pylist(rows)


class QwenLike(Dataset[dict[str, Any]]):
    """Items as a Qwen2-VL processor returns them (``return_tensors="pt"``, one image): patches
    ``[t·h·w, 3·2·14·14]``, ``image_grid_thw`` ``[1, 3]``, ``input_ids`` / ``attention_mask``
    ``[1, L]`` with the image placeholders expanded (L = the breakdown's total), and labels."""

    def __init__(self, meta: pa.Table, wrong_grid_at: int | None = None) -> None:
        self.rows, self.wrong_grid_at = meta.to_pylist(), wrong_grid_at

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        gh, gw = row["height"] // 14, row["width"] // 14
        if i == self.wrong_grid_at:
            gw += 2
        length = 2 + gh * gw // 4 + row["text_tokens"]
        ids = torch.arange(length)[None] + 10
        labels = ids.clone()
        labels[0, :-3] = -100  # only the answer is learnt
        return {
            "pixel_values": torch.full((gh * gw, 3 * 2 * 14 * 14), float(i)),
            "image_grid_thw": torch.tensor([[1, gh, gw]]),
            "input_ids": ids,
            "attention_mask": torch.ones(1, length, dtype=torch.long),
            "labels": labels,
            "uid": f"u{i}",
        }


def qwen_setup(mode: str = "static", **kwargs: Any) -> tuple[TokenBucketDataset, QwenLike]:
    meta = qwen_meta(30)
    items = QwenLike(meta, **kwargs)
    plan = plan_for(meta, QWEN_SPEC, mode)
    return TokenBucketDataset(items, metadata=meta, spec=QWEN_SPEC, plan=plan), items


def test_modal_collate_qwen2vl_items_concatenated_with_cu_seqlens() -> None:
    data, items = qwen_setup()
    seen, empties = [], 0
    for batch in loader(data, ModalityCollate(data), world_size=2, rank=1, seed=2):
        real = check_common(batch, data)
        seen += real
        rows, n, bound = batch["index"].shape[0], len(real), batch["info"].shape[1]
        assert set(batch) == {
            "pixel_values", "image_grid_thw", "cu_seqlens", "image_rows", "camera_keys",
            "input_ids", "attention_mask", "labels", "uid", "index", "row_mask", "info", "meta",
        }  # fmt: skip
        src = [items[i] for i in real]
        if not src:  # a rank's padding batch of empty rows only: no image, the text shape kept
            empties += 1
            assert batch["pixel_values"].shape == (0, 1176) and batch["image_grid_thw"].shape == (0, 3)
            assert batch["cu_seqlens"].tolist() == [0] and not batch["attention_mask"].any()
            assert batch["input_ids"].shape == (rows, bound) and batch["labels"].eq(-100).all()
            continue
        assert torch.equal(batch["pixel_values"], torch.cat([s["pixel_values"] for s in src]))
        assert torch.equal(batch["image_grid_thw"], torch.cat([s["image_grid_thw"] for s in src]))
        sizes = [s["pixel_values"].shape[0] for s in src]
        assert batch["cu_seqlens"].tolist() == [0, *np.cumsum(sizes).tolist()]
        # input_ids carry the whole sequence: padded to the bucket's bound (one shape per bucket)
        assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (rows, bound)
        for r, s in enumerate(src):
            length = s["input_ids"].shape[1]
            assert length == data.lengths[real[r]]
            assert torch.equal(batch["input_ids"][r, :length], s["input_ids"][0])
            assert batch["input_ids"][r, length:].eq(0).all() and batch["labels"][r, length:].eq(-100).all()
            assert torch.equal(batch["labels"][r, :length], s["labels"][0])
            assert batch["attention_mask"][r].tolist() == [c < length for c in range(bound)]
        assert not batch["attention_mask"][n:].any() and batch["uid"] == [f"u{i}" for i in real] + [None] * (rows - n)
    assert len(seen) == len(set(seen)) > 0


def test_modal_collate_qwen2vl_dynamic_pads_text_to_the_longest() -> None:
    data, items = qwen_setup("dynamic")
    picked = mates(data, 0, 3)
    batch = ModalityCollate(data)([data[i] for i in picked])
    longest = max(items[i]["input_ids"].shape[1] for i in picked)
    assert batch["input_ids"].shape == (3, longest) and batch["info"].shape == (3, longest)


def test_modal_collate_patch_count_mismatch_names_the_key_and_sample(tmp_path: Path) -> None:
    data, _ = qwen_setup(wrong_grid_at=4)
    collate = ModalityCollate(data)
    mates = [int(i) for i in np.flatnonzero(data.buckets == data.buckets[4]) if i != 4][:2]
    with pytest.raises(ConfigError) as err:
        collate([data[4], *(data[i] for i in mates)])
    assert str(err.value) == (
        "sample 4 (key 'q4'): its 'pixel_values' image 0 (image_grid_thw[0]=[1, 4, 8]) makes 32 patches "
        "(grid t,h,w = 1,4,8), but its metadata's camera 'camera0' says 24 before merge "
        "(1 temporal x 6 tokens x merge 2²)"
    )
    assert collate([data[i] for i in mates])["info"].indices == tuple(mates)  # the others still collate


def test_modal_collate_batch_mixing_buckets_is_refused() -> None:
    data, _ = qwen_setup()
    a, b = (int(np.flatnonzero(data.buckets == k)[0]) for k in (0, 1))
    with pytest.raises(
        ConfigError, match=rf"^a batch mixes buckets: sample {a} is in bucket 0 but sample {b} in bucket 1"
    ):
        ModalityCollate(data)([data[a], data[b]])


def test_modal_collate_metadata_two_cameras_item_three_is_refused(tmp_path: Path) -> None:
    data, _ = lerobot_setup(tmp_path=tmp_path, extra_camera_at=None)
    two = next(i for i in range(len(data)) if len(data.breakdown(i).cameras) == 2)
    data, _ = lerobot_setup(tmp_path=tmp_path, extra_camera_at=two)
    before = (tmp_path / "meta.parquet").read_bytes()
    n = len(data)
    with pytest.raises(ConfigError) as err:
        ModalityCollate(data)([data[two]])
    message = str(err.value)
    assert message == (
        f"sample {two} (key {data.key(two)!r}): its metadata says 2 cameras "
        f"['observation.images.top', 'observation.images.wrist'] but the item holds 3 images "
        f"['observation.images.top', 'observation.images.wrist', 'observation.images.side']: "
        f"'observation.images.side' has no camera in the metadata"
    )
    assert (tmp_path / "meta.parquet").read_bytes() == before and len(data) == n  # nothing changed or lost
    others = [int(i) for i in np.flatnonzero(data.buckets == data.buckets[two]) if i != two][:2]
    assert ModalityCollate(data)([data[i] for i in others])["info"].indices == tuple(others)


@pytest.mark.parametrize("lie", ["frames", "height"])
@pytest.mark.parametrize("layout", ["stacked", "patches"])
def test_modal_collate_pixels_disagreeing_with_metadata_are_refused(lie: str, layout: str) -> None:
    data, _ = lerobot_setup(lie={3: lie})
    with pytest.raises(ConfigError, match=r"^sample 3 \(key 'ep0_3'\): its 'observation.images.top' ") as err:
        ModalityCollate(data, layout=layout)([data[3]])  # type: ignore[arg-type]
    want = "but its metadata says frames=" if lie == "frames" else "as already-resized pixels it makes"
    assert want in str(err.value)


def test_modal_collate_patches_refuses_pixels_off_the_patch_grid() -> None:
    spec = TokenSpec(patch=16, text=CountRule(count=0), proprio=CountRule(count=1), action=CountRule(column="chunk"))
    meta = lerobot_meta(6)
    data = TokenBucketDataset(LeRobotLike(meta), metadata=meta, spec=spec, plan=plan_for(meta, spec))
    with pytest.raises(
        ConfigError,
        match=r"sample 0 \(key 'ep0_0'\): its 'observation.images.top' is \d+x42 pixels, not a multiple of patch",
    ):
        ModalityCollate(data, layout="patches")([data[0]])
    assert ModalityCollate(data)([data[0]])["camera_mask"][0].all()  # stacked takes them


def test_modal_collate_empty_rows_only_batch_keeps_the_shape() -> None:
    data, _ = lerobot_setup()
    n = len(data)
    bucket = 1
    full = ModalityCollate(data)([data[i] for i in np.flatnonzero(data.buckets == bucket)[:1]])
    empty = ModalityCollate(data)([data[n + bucket]])
    assert set(empty) == set(full)
    assert not empty["row_mask"].any() and empty["index"].eq(-1).all() and empty["info"].indices == ()
    assert empty["pixel_values"].shape[0] == full["pixel_values"].shape[0] and empty["pixel_values"].abs().sum() == 0
    assert empty["action"].shape == full["action"].shape and not empty["action_mask"].any()
    assert empty["task"] == [None] * full["index"].shape[0]


def test_modal_collate_ragged_other_keys_pad_or_list() -> None:
    meta = lerobot_meta(6)

    class WithTrace(LeRobotLike):
        def __getitem__(self, i: int) -> dict[str, Any]:
            return {**super().__getitem__(i), "trace": torch.ones(i + 1, 2), "meta": {"i": i}}

    data = TokenBucketDataset(WithTrace(meta), metadata=meta, spec=LEROBOT_SPEC, plan=plan_for(meta, LEROBOT_SPEC))
    a, b = mates(data, 0, 2)
    batch = ModalityCollate(data)([data[a], data[b]])
    assert batch["trace"].shape == (batch["index"].shape[0], b + 1, 2)
    assert batch["trace_mask"][:2].tolist() == [[c <= a for c in range(b + 1)], [True] * (b + 1)]
    # an item key the collate fills itself ("meta": the metadata's extra columns) comes as "item.<key>"
    assert batch["item.meta"][:2] == [{"i": a}, {"i": b}]
    assert batch["item.meta"][2:] == [None] * (batch["index"].shape[0] - 2)
    listed = ModalityCollate(data, ragged="list")([data[a], data[b]])
    assert "trace_mask" not in listed and [t.shape[0] for t in listed["trace"][:2]] == [a + 1, b + 1]


def test_modal_collate_options_are_checked() -> None:
    data, _ = lerobot_setup(8)
    with pytest.raises(ConfigError, match="layout should be one of"):
        ModalityCollate(data, layout="flat")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ragged should be"):
        ModalityCollate(data, ragged="drop")  # type: ignore[arg-type]
    keys = ModalityKeys(images="cam_*")  # type: ignore[arg-type]  # one pattern as a str is taken too
    assert keys.images == ("cam_*",) and keys.is_image("cam_a") and not keys.is_image("observation.images.top")
