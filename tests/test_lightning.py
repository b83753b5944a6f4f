"""Lightning: a 2-process gloo run (ddp_spawn, ``use_distributed_sampler=False``), every sample
once per epoch, equal steps, one bucket per step across ranks, a new order in epoch 2, and an
exact mid-epoch resume through ``fit(ckpt_path=)``; the default ``use_distributed_sampler=True``
refused at ``fit`` with the fix."""

from __future__ import annotations

import importlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning
from torch.utils.data import DataLoader

from tokenbucket import ConfigError
from tokenbucket.train.lightning import BucketSamplerCallback, check_trainer, find_sampler

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "examples") not in sys.path:  # importable by name: ddp_spawn pickles its classes for the workers
    sys.path.insert(0, str(ROOT / "examples"))
example = importlib.import_module("lightning_train")

N = 96
LIGHTNING_WARNINGS = pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated",  # Lightning's own, under this torch
    "ignore:Be aware that when using `ckpt_path`",  # the resumed run needs no ModelCheckpoint
    "ignore:You're resuming from a checkpoint that ended before",  # the callback resumes the sampler
)


class Recorder(example.Denoiser):  # type: ignore[misc,name-defined]
    """Writes each rank's steps (epoch, batch index, bucket, sample ids) to ``out/<tag>_<rank>.jsonl``."""

    def __init__(self, out: str, tag: str) -> None:
        super().__init__()
        self.out, self.tag = out, tag

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        info = batch["info"]
        row = {"epoch": self.current_epoch, "batch": batch_idx, "bucket": info.bucket, "ids": list(info.indices)}
        with open(Path(self.out) / f"{self.tag}_{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        return super().training_step(batch, batch_idx)  # type: ignore[no-any-return]


def _fit(
    out: Path,
    tag: str,
    *,
    ckpt: str | None = None,
    stop: int | None = None,
    distributed_sampler: bool = False,
    devices: int = 2,
) -> None:
    """``fit`` 2 epochs on ``devices`` CPU processes (ddp_spawn for more than one); with ``stop``,
    Lightning's checkpoint ``out/ckpt/stop.ckpt`` after that many steps, and the run ends there."""
    data, collate, _ = example.build(N)
    sampler = data.sampler(seed=3)  # built before the process group (NOTE [ Rank at iteration ])
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    callbacks: list[lightning.Callback] = [BucketSamplerCallback(sampler)]
    if stop is not None:  # saves Lightning's checkpoint after `stop` steps, and ends there
        callbacks.append(
            lightning.pytorch.callbacks.ModelCheckpoint(
                dirpath=out / "ckpt", filename="stop", every_n_train_steps=stop, save_top_k=-1
            )
        )
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        use_distributed_sampler=distributed_sampler,
        max_epochs=2,
        max_steps=stop if stop is not None else -1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=stop is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Recorder(str(out), tag), loader, ckpt_path=ckpt)


def _read(out: Path, tag: str, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / f"{tag}_{rank}.jsonl").read_text().splitlines()]


@pytest.mark.slow
@LIGHTNING_WARNINGS
def test_lightning_ddp_two_epochs_and_mid_epoch_resume_are_exact(tmp_path: Path) -> None:
    _fit(tmp_path, "full")
    full = [_read(tmp_path, "full", r) for r in (0, 1)]
    assert len(full[0]) == len(full[1])  # equal step counts on both ranks
    orders = []
    for epoch in (0, 1):
        steps = [[row for row in rows if row["epoch"] == epoch] for rows in full]
        assert len(steps[0]) == len(steps[1]) > 0
        for a, b in zip(*steps, strict=True):
            assert a["batch"] == b["batch"] and a["bucket"] == b["bucket"]  # one bucket per step
        seen = Counter(i for rows in steps for row in rows for i in row["ids"])
        assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}  # every sample exactly once
        orders.append([row["ids"] for row in steps[0]])
    assert orders[0] != orders[1]  # set_epoch reached the batch sampler: epoch 2 reshuffled

    per_epoch = sum(row["epoch"] == 0 for row in full[0])
    stop = per_epoch + 2  # mid-way through the second epoch
    _fit(tmp_path, "first", stop=stop)
    ckpt = tmp_path / "ckpt" / "stop.ckpt"
    assert ckpt.exists()
    _fit(tmp_path, "resumed", ckpt=str(ckpt))
    for r in (0, 1):
        first, resumed = _read(tmp_path, "first", r), _read(tmp_path, "resumed", r)
        assert len(first) == stop
        assert first + resumed == full[r]  # nothing replayed, nothing skipped, same order


@LIGHTNING_WARNINGS
def test_lightning_default_distributed_sampler_refused_with_the_fix(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("x")
    before = kept.stat().st_mtime_ns
    trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    with pytest.raises(ConfigError, match=r"Trainer\(use_distributed_sampler=False\)") as err:
        BucketSamplerCallback().setup(trainer, Recorder(str(tmp_path), "x"), "fit")
    assert "\n" not in str(err.value)
    assert kept.read_text() == "x" and kept.stat().st_mtime_ns == before
    fine = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", use_distributed_sampler=False, logger=False
    )
    check_trainer(fine)  # the fix passes
    check_trainer(lightning.Trainer(accelerator="cpu", devices=1, logger=False))  # one process: nothing to split


def test_lightning_find_sampler_through_wrappers_and_its_error() -> None:
    data, collate, _ = example.build(N)
    sampler = data.sampler(seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    assert find_sampler(loader) is sampler
    assert find_sampler({"a": [loader]}) is sampler
    with pytest.raises(ConfigError, match=r"has no tokenbucket batch sampler: pass .*sampler=") as err:
        find_sampler(DataLoader(list(range(4)), batch_size=2))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="sampler should be a BucketBatchSampler"):
        BucketSamplerCallback(loader)  # type: ignore[arg-type]
    assert len(sampler) > 0 and sum(len(b) for b in sampler) >= N  # nothing went missing


@LIGHTNING_WARNINGS
def test_lightning_one_process_set_epoch_and_exact_resume(tmp_path: Path) -> None:
    # one process, in this interpreter: epoch order changes, and a resume from a mid-epoch checkpoint is exact
    def run(tag: str, *, stop: int | None = None, ckpt: str | None = None) -> list[dict[str, Any]]:
        _fit(tmp_path, tag, stop=stop, ckpt=ckpt, devices=1)
        return _read(tmp_path, tag, 0)

    full = run("one_full")
    epochs = [[row["ids"] for row in full if row["epoch"] == e] for e in (0, 1)]
    assert epochs[0] != epochs[1]
    for ids in epochs:
        assert sorted(i for batch in ids for i in batch) == list(range(N))
    stop = len(epochs[0]) // 2
    first = run("one_first", stop=stop)
    resumed = run("one_resumed", ckpt=str(tmp_path / "ckpt" / "stop.ckpt"))
    assert len(first) == stop and first + resumed == full


@pytest.mark.slow
@LIGHTNING_WARNINGS
def test_lightning_default_distributed_sampler_fails_the_real_fit_before_a_step(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"cannot wrap a tokenbucket batch sampler.*use_distributed_sampler=False"):
        _fit(tmp_path, "default", distributed_sampler=True)  # 2 spawned gloo processes, Lightning's default
    assert not list(tmp_path.glob("default_*.jsonl"))  # refused at fit: no step was trained on any rank
