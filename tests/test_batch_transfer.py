"""BatchInfo and the collated batch through the trainers' batch-transfer utilities (Lightning,
Fabric, Accelerate), ``.to``, pickling and a pinned-memory DataLoader; BatchInfo's API kept."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
import torch
from accelerate.utils import send_to_device  # type: ignore[import-untyped]
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import DataLoader

from tokenbucket._exceptions import TokenbucketError
from tokenbucket.train.batch import Batch, BatchInfo, FrozenFieldError
from tokenbucket.train.collate import BucketCollate
from tokenbucket.train.modal import ModalityCollate

from .test_collate import setup as tokens_setup
from .test_modal_collate import lerobot_setup, qwen_setup

INFO = BatchInfo(
    bucket=1,
    shape=(2, 8),
    keys=("a", "b"),
    tokens={"vision": 6, "text": 4},
    real_tokens=10,
    padded_tokens=16,
    predicted_peak_bytes=100,
    risk=0.5,
    indices=(3, 4),
    lengths=(6, 4),
    row_tokens=((4, 2), (2, 2)),
)


def test_batch_info_keeps_its_api_and_stays_immutable() -> None:
    assert [f.name for f in dataclasses.fields(BatchInfo)][:4] == ["bucket", "shape", "keys", "tokens"]
    assert dataclasses.replace(INFO, cameras={"top": 6}).cameras == {"top": 6} and INFO.cameras is None
    assert INFO.subset([1]).keys == ("b",) and INFO.subset([1]).real_tokens == 4
    assert pickle.loads(pickle.dumps(INFO)) == INFO and INFO != dataclasses.replace(INFO, risk=0.6)
    with pytest.raises(
        dataclasses.FrozenInstanceError, match=r"^BatchInfo is immutable: cannot assign to field .bucket."
    ):
        INFO.bucket = 2
    with pytest.raises(FrozenFieldError):  # a family member, and a FrozenInstanceError
        del INFO.risk
    assert issubclass(FrozenFieldError, TokenbucketError)
    INFO.bucket = 1  # an equal value is a no-op (NOTE [ BatchInfo through the trainers ])
    assert INFO.bucket == 1


def double(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def check_moved(before: dict[str, Any], after: Any, *, cast: bool) -> None:
    assert type(after) is type(before) and set(after) == set(before)
    assert after["info"] == before["info"] and isinstance(after["info"], BatchInfo)
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            want = torch.float64 if cast and value.is_floating_point() else value.dtype
            assert after[key].dtype == want and torch.equal(after[key].to(value.dtype), value), key
        elif key != "info":
            assert after[key] == value, key


@pytest.mark.parametrize("source", ["lerobot", "qwen", "tokens"])
def test_batch_through_lightning_accelerate_and_to(source: str) -> None:
    if source == "tokens":  # the old flattened-tokens path returns a plain dict with the same info
        data, _ = tokens_setup()
        batch = BucketCollate(data)([data[0]])
    else:
        data = lerobot_setup()[0] if source == "lerobot" else qwen_setup()[0]
        batch = ModalityCollate(data, layout="patches" if source == "qwen" else "stacked")([data[0]])
    # Lightning: apply_to_collection (the batch, and the batch inside a user's structure)
    check_moved(batch, apply_to_collection(batch, torch.Tensor, double), cast=True)
    nested = apply_to_collection({"batch": batch, "step": 3}, torch.Tensor, double)
    check_moved(batch, nested["batch"], cast=True)
    check_moved(batch, apply_to_collection(batch, torch.Tensor, double, allow_frozen=True), cast=True)
    # Lightning / Fabric: move_data_to_device (the batch's own .to for a Batch)
    check_moved(batch, move_data_to_device(batch, torch.device("cpu")), cast=False)
    # Accelerate
    check_moved(batch, send_to_device(batch, torch.device("cpu"), non_blocking=True), cast=False)
    check_moved(batch, send_to_device(batch, "cpu", skip_keys="info"), cast=False)
    if isinstance(batch, Batch):
        check_moved(batch, batch.to("cpu", torch.float64, non_blocking=True), cast=True)
        assert batch.to(dtype=torch.float64)["pixel_values"].dtype == torch.float64


def test_batch_through_a_pinned_memory_dataloader_with_workers() -> None:
    data, _ = lerobot_setup(12)
    kwargs: dict[str, Any] = {"batch_sampler": data.sampler(seed=0), "collate_fn": ModalityCollate(data)}
    if torch.cuda.is_available():  # pinned for real
        batches = list(DataLoader(data, pin_memory=True, **kwargs))
        assert all(b["pixel_values"].is_pinned() for b in batches)
    else:  # no accelerator: torch says so and skips pinning; the batches still arrive whole
        with pytest.warns(UserWarning, match="pin_memory"):
            batches = list(DataLoader(data, pin_memory=True, **kwargs))
    assert all(isinstance(b, Batch) and isinstance(b["info"], BatchInfo) for b in batches)
    workers = list(DataLoader(data, num_workers=2, **{**kwargs, "batch_sampler": data.sampler(seed=0)}))
    assert sorted(i for b in workers for i in b["info"].indices) == list(range(len(data)))
    assert [b["info"] for b in workers] == [b["info"] for b in batches]


def test_batch_pin_memory_pins_every_tensor_where_pinning_exists() -> None:
    batch = Batch(x=torch.ones(2), nested=[torch.zeros(1), "s"], info=INFO)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):  # CPU-only torch has no pinned memory
            batch.pin_memory()
        return
    pinned = batch.pin_memory()
    assert pinned["x"].is_pinned() and pinned["nested"][0].is_pinned() and pinned["nested"][1] == "s"
    assert pinned["info"] is INFO
