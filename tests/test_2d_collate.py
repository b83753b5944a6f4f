"""The collate side of 2D buckets (NOTE [ Two-dimensional buckets ]): a static bucket's patch
stream padded to ``rows x vision_bound x merge²`` with ``patch_mask`` (NOTE [ Patch stream of a 2D
bucket ]), the predicted peak and the risk split at the bucket's image-token bound, and 1D plans
left as they were."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tokenbucket import ConfigError, CostModel, ModelSpec, OOMRiskWarning, TokenSpec, breakdown_table
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.bucket_plan import Bucket, BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.buckets_2d import plan_buckets_2d
from tokenbucket.train.batch import Batch
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.modal import ModalityCollate
from tokenbucket.train.risk import RiskSplitSampler, static_split
from tokenbucket.train.shaping import BatchShape

SPEC = TokenSpec(patch=14, merge=2, tubelet=2)  # Qwen2-VL's patch, merger and tubelet
MERGE2 = SPEC.merge**2
WIDTH = 3 * 2 * 14 * 14  # C·t·p·p
CAMS = ("observation.images.top", "observation.images.wrist")
SIDES = ((56, 56), (56, 112), (112, 112))  # multiples of patch x merge: 4, 8 and 16 tokens a frame
BUDGET = 22 * 2**30  # image buckets of 3 rows, text-only ones of 15-18 under Qwen2-VL-2B on an H100
N = 48


def tv_meta(n: int = N) -> pa.Table:
    """A small text + vision workload: 60% robot samples (1-2 cameras, 1-2 frames, short text), the
    rest text-only (0 cameras, 60-200 tokens of text)."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        if rng.random() < 0.6:
            h, w = SIDES[int(rng.integers(len(SIDES)))]
            cams, frames, text = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(3, 20))
        else:
            (h, w), cams, frames, text = SIDES[0], 0, 1, int(rng.integers(60, 200))
        rows.append({"key": f"s{i}", "cameras": cams, "frames": frames, "height": h, "width": w, "text_tokens": text})
    return pa.Table.from_pylist(rows)


class TVItems(Dataset[dict[str, Any]]):
    """Items of ``tv_meta``: raw frames ``[T, 3, H, W]`` per camera (``form="frames"``, cut by the
    patches layout) or a Qwen2-VL processor's ``pixel_values`` / ``image_grid_thw``
    (``form="processor"``); text-only samples carry only their ids."""

    def __init__(self, meta: pa.Table, form: str) -> None:
        self.rows, self.form = meta.to_pylist(), form

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        item: dict[str, Any] = {"input_ids": torch.arange(row["text_tokens"]) + 10, "uid": f"u{i}"}
        f, h, w, cams = row["frames"], row["height"], row["width"], row["cameras"]
        if self.form == "frames":
            for c in range(cams):
                item[CAMS[c]] = torch.full((f, 3, h, w), i + 1 + c / 10)
        elif cams:
            gh, gw = h // 14, w // 14  # one temporal patch: frames <= tubelet
            item["pixel_values"] = torch.cat([torch.full((gh * gw, WIDTH), i + 1 + c / 10) for c in range(cams)])
            item["image_grid_thw"] = torch.tensor([[1, gh, gw]] * cams)
        return item


def counts(meta: pa.Table, spec: TokenSpec = SPEC) -> tuple[np.ndarray, np.ndarray]:
    result = breakdown_table(meta, spec)
    return result.totals.astype(np.int64), result.table.column("vision").to_numpy().astype(np.int64)


@pytest.fixture(scope="module")
def cost() -> StagedLengthModel:
    return StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM"))


@pytest.fixture(scope="module")
def plan_2d(cost: StagedLengthModel) -> BucketPlan:
    lengths, vision = counts(tv_meta())
    plan = plan_buckets_2d(lengths, vision, cost, BUDGET, max_buckets=4, multiple=8, vision_multiple=4)
    # the workload must give both kinds of bucket, or the tests below check nothing
    assert plan.two_d and {b.vision_bound == 0 for b in plan.buckets} == {True, False}
    return plan


def dataset(plan: BucketPlan, form: str = "frames", spec: TokenSpec = SPEC) -> TokenBucketDataset:
    meta = tv_meta()
    return TokenBucketDataset(TVItems(meta, form), metadata=meta, spec=spec, plan=plan)


def manual_2d_plan(*bounds: tuple[int, int, int]) -> BucketPlan:
    """A static 2D plan of buckets ``(bound, vision_bound, batch_size)``, in that order."""
    return BucketPlan(
        "static", BUDGET, tuple(Bucket(u, b, 0, 0, 0, 0, 0, 0.0, 1.0, 0.0, vision_bound=v) for u, v, b in bounds)
    )


def epoch(data: TokenBucketDataset, collate: ModalityCollate) -> list[Batch]:
    """Every batch of both ranks of a 2-rank epoch (a rank's short bucket gives empty rows)."""
    return [
        batch
        for rank in range(2)
        for batch in DataLoader(data, batch_sampler=data.sampler(world_size=2, rank=rank, seed=3), collate_fn=collate)
    ]


@pytest.mark.parametrize("form", ["frames", "processor"])
def test_2d_collate_patch_stream_padded_to_the_bucket_bound(plan_2d: BucketPlan, form: str) -> None:
    data = dataset(plan_2d, form)
    _, vision = counts(tv_meta())
    seen: list[int] = []
    text_only = padded = 0
    for batch in epoch(data, ModalityCollate(data, layout="patches")):
        info = batch["info"]
        b = plan_2d.buckets[info.bucket]
        rows = batch["index"].shape[0]
        assert rows == b.batch_size and info.vision_bound == b.vision_bound
        real = [int(i) for i in batch["index"] if i >= 0]
        seen += real
        patches = MERGE2 * int(vision[real].sum())  # each image token is merge² patches (no special tokens here)
        if b.vision_bound == 0:  # a text-only bucket: no image, so no patch stream at all
            assert patches == 0 and {"pixel_values", "patch_mask", "image_grid_thw"}.isdisjoint(batch)
            text_only += 1
            continue
        px, mask = batch["pixel_values"], batch["patch_mask"]
        # one shape per bucket: rows x vision_bound x merge² patches, whatever the batch holds
        assert px.shape == (b.batch_size * b.vision_bound * MERGE2, WIDTH)
        assert mask.dtype == torch.bool and mask.shape == (px.shape[0],)
        assert int(mask.sum()) == patches and bool(mask[:patches].all()) and px[patches:].eq(0).all()
        padded += patches < px.shape[0]
        # the grid, cu_seqlens and image_rows describe the real images only
        grid = batch["image_grid_thw"]
        assert int(grid.prod(1).sum()) == patches == int(batch["cu_seqlens"][-1])
        assert batch["image_rows"].tolist() == [r for r, i in enumerate(real) for _ in data.breakdown(i).cameras]
        if form == "processor":
            have = [data.dataset[i]["pixel_values"] for i in real if "pixel_values" in data.dataset[i]]
            assert torch.equal(px[mask], torch.cat(have) if have else torch.empty(0, WIDTH))
    assert sorted(seen) == list(range(N))  # every sample once over the ranks
    assert text_only > 0 and padded > 0


@pytest.mark.parametrize("form", ["frames", "processor"])
def test_2d_collate_batch_without_images_in_an_image_bucket_keeps_the_shape(form: str) -> None:
    lengths, vision = counts(tv_meta())
    v = int(vision.max())
    plan = manual_2d_plan((int(lengths.max()), v, 3))
    data = dataset(plan, form)
    collate = ModalityCollate(data, layout="patches")
    texts = [int(i) for i in np.flatnonzero(vision == 0)[:2]]
    for batch in (collate([data[i] for i in texts]), collate([data[N]])):  # text rows only; empty rows only
        assert batch["pixel_values"].shape == (3 * v * MERGE2, WIDTH) and batch["pixel_values"].eq(0).all()
        assert batch["patch_mask"].shape == (3 * v * MERGE2,) and not batch["patch_mask"].any()
        assert batch["image_grid_thw"].shape == (0, 3) and batch["cu_seqlens"].tolist() == [0]
    # the stacked layout pads to the batch's largest, in a 2D plan too: no patch stream, no patch_mask
    images = [int(i) for i in np.flatnonzero(vision > 0)[:2]]
    if form == "frames":
        stacked = ModalityCollate(data)([data[i] for i in images])
        bds = [data.breakdown(i) for i in images]
        assert "patch_mask" not in stacked and stacked["pixel_values"].shape[:3] == (
            3,
            max(len(bd.cameras) for bd in bds),
            max(c.frames for bd in bds for c in bd.cameras),
        )


def test_2d_collate_cost_model_prices_the_bucket_at_its_image_bound(
    plan_2d: BucketPlan, cost: StagedLengthModel
) -> None:
    data = dataset(plan_2d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a text-only bucket priced as all-image would warn here
        batches = epoch(data, ModalityCollate(data, layout="patches", cost_model=cost))
    for batch in batches:
        info = batch["info"]
        assert info.predicted_peak_bytes == plan_2d.buckets[info.bucket].predicted_peak_bytes and info.risk <= 1
    shape = BatchShape(data, cost_model=cost, on_risk="split")
    for k, b in enumerate(plan_2d.buckets):
        assert b.vision_bound is not None
        mates = [int(i) for i in np.flatnonzero(data.buckets == k)[: b.batch_size]]
        info = shape.info(mates, k, b.batch_size, b.bound)
        assert (
            info.predicted_peak_bytes
            == b.predicted_peak_bytes
            == cost.memory(b.batch_size, b.bound, b.vision_bound).total
        )
        assert static_split(plan_2d, cost, k, 1.0) == (1, b.batch_size)  # fits: no split
        if b.vision_bound == 0:  # by length alone the model takes every token for an image token
            assert cost.memory(b.batch_size, b.bound).total > BUDGET
    # a lower threshold still splits and warns, and the report names the image-token bound
    image = next(k for k, b in enumerate(plan_2d.buckets) if b.vision_bound)
    b = plan_2d.buckets[image]
    parts, rows = static_split(plan_2d, cost, image, 0.95)
    assert parts > 1 and cost.memory(rows, b.bound, b.vision_bound).total <= 0.95 * BUDGET
    first = int(np.flatnonzero(data.buckets == image)[0])
    with pytest.warns(OOMRiskWarning, match=rf"batch {b.batch_size}x{b.bound} \(at most {b.vision_bound} image"):
        ModalityCollate(data, cost_model=cost, risk_threshold=0.5)([data[first]])


def test_2d_collate_cost_model_without_image_tokens_is_refused(plan_2d: BucketPlan) -> None:
    data = dataset(plan_2d)
    flat = CostModel(ModelSpec(hidden=16, layers=1, heads=2))
    with pytest.raises(ConfigError, match=r"^a 2D plan's buckets bound each sample's image tokens too .*CostModel"):
        ModalityCollate(data, cost_model=flat)
    with pytest.raises(ConfigError, match="memory taking vision="):
        RiskSplitSampler(data.sampler(), data, flat)  # type: ignore[arg-type]


def test_2d_collate_patches_over_the_bound_name_the_sample_and_bucket() -> None:
    lengths, vision = counts(tv_meta())
    plan = manual_2d_plan((int(lengths.max()), 4, 3), (int(lengths.max()), int(vision.max()), 3))
    data = dataset(plan)
    big = int(np.flatnonzero(vision > 4)[0])
    assert int(data.buckets[big]) == 1
    data.buckets[big] = 0  # the bucket and the metadata disagree
    with pytest.raises(ConfigError) as err:
        ModalityCollate(data, layout="patches")([data[big]])
    assert str(err.value) == (
        f"bucket 0 pads its patch stream to 16 patches a row (4 image tokens x merge 2²), but sample {big} "
        f"(key 's{big}', {MERGE2 * int(vision[big])} patches) holds more: the plan's bound and the metadata "
        f"disagree (a plan made from other metadata?)"
    )


def test_2d_collate_patches_need_one_merge() -> None:
    spec = TokenSpec(patch=14, merge=2, tubelet=2, overrides={"camera1": {"merge": 1}})
    lengths, vision = counts(tv_meta(), spec)
    data = dataset(manual_2d_plan((int(lengths.max()), int(vision.max()), 3)), spec=spec)
    with pytest.raises(ConfigError) as err:
        ModalityCollate(data, layout="patches")
    assert str(err.value) == (
        "2D patch padding needs one merge for every camera (NOTE [ Patch stream of a 2D bucket ]), but the spec "
        "merges 2 and overrides['camera1'] merges 1; use one merge, or layout='stacked'"
    )
    assert "patch_mask" not in ModalityCollate(data)([data[0]])  # the stacked layout does not pad patches


def test_2d_collate_1d_plan_unchanged() -> None:
    lengths, vision = counts(tv_meta())
    flat = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, flat, 2**21, max_buckets=2, multiple=8)
    assert not plan.two_d
    data = dataset(plan, "processor")
    for batch in epoch(data, ModalityCollate(data, layout="patches", cost_model=flat)):
        assert "patch_mask" not in batch and batch["info"].vision_bound is None
        real = [int(i) for i in batch["index"] if i >= 0]
        if "pixel_values" in batch:  # the real patches only, unpadded
            assert batch["pixel_values"].shape[0] == MERGE2 * int(vision[real].sum())
        rows, length = batch["info"].shape
        assert batch["info"].predicted_peak_bytes == flat.memory(rows, length).total
