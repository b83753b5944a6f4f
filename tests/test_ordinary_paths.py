"""The ordinary ways of driving a sampler, without the project's helpers: epochs that move on with no
``set_epoch`` (a plain loop, Lightning's ``Trainer.fit(model, loader)`` without the callback, the HF
``Trainer`` handed a plain loader), and the position a plain multi-worker ``DataLoader`` leaves
(NOTE [ An epoch moves on by itself ], NOTE [ Who draws the batches ])."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tests.test_sampler import PLAN_ID, Indices, mixture_buckets
from tokenbucket import StateError
from tokenbucket.train.packing import PackedBatchSampler
from tokenbucket.train.sampler import BucketBatchSampler

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))


def _ids(batches: list[list[int]], n: int) -> list[int]:
    return sorted(i for b in batches for i in b if i < n)


@pytest.mark.parametrize("packed", [False, True])
def test_sampler_second_pass_without_set_epoch_is_the_next_epoch_and_state_follows(packed: bool) -> None:
    buckets, sizes = mixture_buckets(400)
    n = len(buckets)

    def make() -> BucketBatchSampler | PackedBatchSampler:
        if packed:
            return PackedBatchSampler([1 + i % 37 for i in range(n)], 64, 2, plan_id=PLAN_ID, seed=2)
        return BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, seed=2)

    sampler = make()
    first = [list(b) for b in sampler]
    second = [list(b) for b in sampler]  # no set_epoch in between
    assert first != second and sampler.epoch == 1  # a new order, and the sampler says so
    assert _ids(first, n) == _ids(second, n)  # each pass holds every sample once
    explicit = make()
    explicit.set_epoch(1)
    assert [list(b) for b in explicit] == second  # the same epoch as set_epoch(1) gives
    # a break mid-pass, then a new pass: the next epoch again; a state taken mid-pass resumes exactly
    it = iter(sampler)
    head = [list(next(it)) for _ in range(3)]
    state = sampler.state_dict()
    assert state["epoch"] == 2 and state["step"] == 3
    resumed = make()
    resumed.load_state_dict(state)
    explicit.set_epoch(2)
    third = [list(b) for b in explicit]
    assert head + [list(b) for b in resumed] == third
    # an explicit set_epoch wins over moving on: the epoch under way, again from its start
    sampler.set_epoch(2)
    assert [list(b) for b in sampler] == third


def test_sampler_len_between_passes_is_the_next_pass() -> None:
    lengths = np.random.default_rng(0).integers(1, 64, 300)
    sampler = PackedBatchSampler(lengths, 64, 1, plan_id=PLAN_ID, seed=0, pool=16)  # epochs differ in length
    counts = []
    for _ in range(4):
        expected = len(sampler)
        counts.append(len(list(sampler)))
        assert counts[-1] == expected
    assert len(set(counts)) > 1


LIGHTNING_WARNINGS = pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated",  # Lightning's own, under this torch
)


@LIGHTNING_WARNINGS
def test_lightning_fit_with_a_plain_loader_and_no_callback_reshuffles_each_epoch() -> None:
    lightning = pytest.importorskip("lightning")
    example = importlib.import_module("lightning_train")
    seen: list[list[list[int]]] = [[], []]

    class Recorder(example.Denoiser):  # type: ignore[misc,name-defined]
        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            seen[self.current_epoch].append(list(batch["info"].indices))
            return super().training_step(batch, batch_idx)  # type: ignore[no-any-return]

    data, collate, _ = example.build(64)
    loader = DataLoader(data, batch_sampler=data.sampler(seed=1), collate_fn=collate)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Recorder(), train_dataloaders=loader)  # no BucketSamplerCallback: nothing calls set_epoch
    assert seen[0] != seen[1]  # epoch 2 is not epoch 1 again
    for batches in seen:
        assert _ids(batches, len(data)) == list(range(len(data)))


def test_hf_trainer_given_a_plain_loader_reshuffles_each_epoch(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    example = importlib.import_module("hf_trainer_train")
    data, collate = example.build(48)
    seen: list[list[int]] = []

    class Model(example.Denoiser):  # type: ignore[misc,name-defined]
        def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor, **rest: Any) -> dict[str, torch.Tensor]:
            seen.append(list(rest["info"].indices))
            return super().forward(tokens, attention_mask)  # type: ignore[no-any-return]

    loader = DataLoader(data, batch_sampler=data.sampler(seed=0), collate_fn=collate)

    class Trainer(transformers.Trainer):  # type: ignore[misc,name-defined]
        def get_train_dataloader(self) -> DataLoader[Any]:
            return loader

    Trainer(model=Model(), args=example.arguments(tmp_path, num_train_epochs=2)).train()
    steps = len(loader)
    epochs = [seen[:steps], seen[steps:]]
    assert len(seen) == 2 * steps and epochs[0] != epochs[1]
    for batches in epochs:
        assert _ids(batches, len(data)) == list(range(len(data)))


def test_plain_worker_loader_state_counts_the_batches_handed_out() -> None:
    buckets, sizes = mixture_buckets(600)
    n = len(buckets)

    def loader() -> tuple[BucketBatchSampler, DataLoader[Any]]:
        sampler = BucketBatchSampler(buckets, sizes, plan_id=PLAN_ID, seed=9)
        return sampler, DataLoader(Indices(n), batch_sampler=sampler, collate_fn=list, num_workers=2)

    sampler, plain = loader()
    full = [list(b) for b in plain]
    sampler, plain = loader()
    head: list[list[int]] = []
    for batch in plain:
        head.append(list(batch))
        if len(head) == 5:
            state = sampler.state_dict()  # the workers have drawn more than 5 batches by now
            assert sampler.step > 5 and state["step"] == 5
            break
    with pytest.raises(StateError, match=r"drew this epoch's batches ahead of training and is gone.*after="):
        sampler.state_dict()  # the loader is gone mid-epoch: which batches were trained is unknown
    resumed, plain = loader()
    resumed.load_state_dict(state)
    assert head + [list(b) for b in plain] == full
