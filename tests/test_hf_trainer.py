"""HF Trainer: a 2-process gloo run (2 epochs), every sample once per epoch, equal steps, one bucket
per step across ranks, a new order in epoch 2, and an exact mid-epoch resume through
``train(resume_from_checkpoint=...)``; the batch keys that reach the model; resume refusals."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import transformers

from tests._dist import end_process_group, free_port, spawn
from tokenbucket import ConfigError, StateError
from tokenbucket.monitor.hooks import BucketMonitor
from tokenbucket.train.hf_trainer import STATE_FILE, BucketTrainer, monitor_file

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "examples") not in sys.path:  # importable by name in the spawned workers
    sys.path.insert(0, str(ROOT / "examples"))
example = importlib.import_module("hf_trainer_train")

N = 160


class Recorder(transformers.TrainerCallback):
    """Writes each step's (epoch, step, bucket, sample ids) to ``out/<tag>_<rank>.jsonl``."""

    def __init__(self, out: str, tag: str, rank: int) -> None:
        self.path = Path(out) / f"{tag}_{rank}.jsonl"
        self.trainer: BucketTrainer | None = None

    def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
        assert self.trainer is not None
        info = self.trainer.last_info
        assert info is not None and info.position is not None
        row = {"epoch": info.position[0], "step": info.position[1], "bucket": info.bucket, "ids": list(info.indices)}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _train(out: Path, tag: str, rank: int, *, stop: int | None = None, ckpt: str | None = None) -> None:
    data, collate = example.build(N)
    sampler = data.sampler(seed=3)
    options: dict[str, object] = {"num_train_epochs": 2, "ddp_backend": "gloo", "seed": 1}
    if stop is not None:  # save after `stop` steps, and end there
        options.update(max_steps=stop, save_strategy="steps", save_steps=stop)
    recorder = Recorder(str(out), tag, rank)
    trainer = BucketTrainer(
        model=example.Denoiser(),
        args=example.arguments(out / "run", **options),
        train_dataset=data,
        data_collator=collate,
        sampler=sampler,
        callbacks=[recorder],
    )
    recorder.trainer = trainer
    trainer.train(resume_from_checkpoint=ckpt)


def _worker(rank: int, port: int, out: str, stop: int | None, ckpt: str | None, tag: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    _train(Path(out), tag, rank, stop=stop, ckpt=ckpt)
    end_process_group()  # the Trainer made the group; it does not end it (NOTE [ Process group teardown ])


def _spawn(out: Path, tag: str, *, stop: int | None = None, ckpt: str | None = None) -> list[list[dict[str, Any]]]:
    spawn(_worker, args=(free_port(), str(out), stop, ckpt, tag), nprocs=2)
    return [[json.loads(line) for line in (out / f"{tag}_{r}.jsonl").read_text().splitlines()] for r in (0, 1)]


@pytest.mark.slow
def test_hf_trainer_gloo_two_epochs_and_mid_epoch_resume_are_exact(tmp_path: Path) -> None:
    full = _spawn(tmp_path, "full")
    assert len(full[0]) == len(full[1])  # equal step counts on both ranks
    orders = []
    for epoch in (0, 1):
        steps = [[row for row in rows if row["epoch"] == epoch] for rows in full]
        assert len(steps[0]) == len(steps[1]) > 2
        for a, b in zip(*steps, strict=True):
            assert a["step"] == b["step"] and a["bucket"] == b["bucket"]  # one bucket per step across ranks
        seen = Counter(i for rows in steps for row in rows for i in row["ids"])
        assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}  # every sample exactly once
        orders.append([row["ids"] for row in steps[0]])
    assert orders[0] != orders[1]  # set_epoch reached the sampler: epoch 2 reshuffled

    stop = len(orders[0]) + 2  # mid-way through the second epoch
    first = _spawn(tmp_path, "first", stop=stop)
    ckpt = tmp_path / "run" / f"checkpoint-{stop}"
    saved = json.loads((ckpt / STATE_FILE).read_text())
    assert (saved["sampler"]["epoch"], saved["sampler"]["step"]) == (1, 2)  # after the last batch trained
    resumed = _spawn(tmp_path, "resumed", ckpt=str(ckpt))
    for r in (0, 1):
        assert len(first[r]) == stop
        assert first[r] + resumed[r] == full[r]  # nothing replayed, nothing skipped, same order


def _one(tmp_path: Path, monitor: BucketMonitor | None = None, **options: object) -> tuple[BucketTrainer, Any]:
    data, collate = example.build(48)
    trainer = BucketTrainer(
        model=example.Denoiser(),
        args=example.arguments(tmp_path / "run", **options),
        train_dataset=data,
        data_collator=collate,
        sampler=data.sampler(seed=0),
        monitor=monitor,
    )
    return trainer, data


def test_hf_trainer_passes_the_model_only_its_tensor_inputs(tmp_path: Path) -> None:
    trainer, data = _one(tmp_path, max_steps=1)
    batch = next(iter(trainer.get_train_dataloader()))
    assert {"info", "meta", "row_mask", "index"} <= set(batch)
    assert set(trainer._prepare_inputs(batch)) == {"tokens", "attention_mask"}  # what forward names
    picked = BucketTrainer(
        model=example.Denoiser(),
        args=example.arguments(tmp_path / "run"),
        train_dataset=data,
        sampler=data.sampler(seed=0),
        model_keys=["tokens", "row_mask", "meta"],
    )
    assert set(picked._prepare_inputs(batch)) == {"tokens", "row_mask"}  # meta is no tensor
    assert sum(int(m) for m in batch["row_mask"]) == len(batch["info"].indices)  # no sample missing


def test_hf_trainer_one_process_epochs_cover_every_sample(tmp_path: Path) -> None:
    trainer, data = _one(tmp_path, num_train_epochs=2)
    seen: list[list[int]] = [[], []]
    original = trainer.training_step

    def record(model: torch.nn.Module, inputs: dict[str, Any], n: torch.Tensor | int | None = None) -> torch.Tensor:
        info = inputs["info"]
        seen[info.position[0]].append(list(info.indices))
        return original(model, inputs, n)

    trainer.training_step = record  # type: ignore[method-assign,assignment]
    trainer.train()
    for ids in seen:
        assert sorted(i for b in ids for i in b) == list(range(len(data)))
    assert seen[0] != seen[1]


def test_hf_trainer_needs_a_sampler(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"BucketTrainer needs sampler= .*got sampler=NoneType") as err:
        BucketTrainer(model=example.Denoiser(), args=example.arguments(tmp_path), train_dataset=list(range(4)))
    assert "\n" not in str(err.value)


def test_hf_trainer_resume_refusals_leave_the_checkpoint(tmp_path: Path) -> None:
    trainer, _ = _one(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    trainer.train()
    ckpt = tmp_path / "run" / "checkpoint-2"
    files = {p: p.read_bytes() for p in ckpt.iterdir()}

    skip, _ = _one(tmp_path, max_steps=4, ignore_data_skip=True)
    with pytest.raises(ConfigError, match="ignore_data_skip=True would replay"):
        skip.train(resume_from_checkpoint=str(ckpt))

    other = tmp_path / "other"
    shutil.copytree(ckpt, other)
    saved = json.loads((other / STATE_FILE).read_text())
    saved["sampler"]["world_size"] = 2
    (other / STATE_FILE).write_text(json.dumps(saved))
    wrong, _ = _one(tmp_path, max_steps=4)
    with pytest.raises(StateError, match=r"saved world_size=2 but this sampler has world_size=1"):
        wrong.train(resume_from_checkpoint=str(other))

    (other / STATE_FILE).unlink()
    bare, _ = _one(tmp_path, max_steps=4)
    with pytest.raises(StateError, match=rf"{STATE_FILE} is missing") as err:
        bare.train(resume_from_checkpoint=str(other))
    assert "\n" not in str(err.value)
    assert {p: p.read_bytes() for p in ckpt.iterdir()} == files  # the checkpoint is untouched


def test_hf_trainer_resume_at_an_epoch_end_goes_on_with_the_next_epoch(tmp_path: Path) -> None:
    trainer, _ = _one(tmp_path, num_train_epochs=2)
    per_epoch = len(trainer.get_train_dataloader())
    full, _ = _one(tmp_path, num_train_epochs=2)
    full.train()
    first, _ = _one(tmp_path, num_train_epochs=2, max_steps=per_epoch, save_strategy="steps", save_steps=per_epoch)
    first.train()
    resumed, _ = _one(tmp_path, num_train_epochs=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{per_epoch}"))
    assert resumed.last_info is not None and full.last_info is not None
    assert resumed.last_info.indices == full.last_info.indices and resumed.last_info.position == (1, per_epoch)


def test_hf_trainer_monitor_records_every_step_and_resumes_with_the_checkpoint(tmp_path: Path) -> None:
    def monitored(name: str, **options: object) -> tuple[BucketTrainer, BucketMonitor, Path]:
        data, _ = example.build(48)
        log = tmp_path / f"{name}.jsonl"
        monitor = BucketMonitor(data.plan, sinks=[log], memory=None)
        return _one(tmp_path, monitor, **options)[0], monitor, log

    def steps_per_bucket(monitor: BucketMonitor) -> dict[int, int]:
        return {int(row["bucket"]): int(row["steps"]) for row in monitor.summary() if row["steps"]}

    full, whole, log = monitored("whole", num_train_epochs=2)
    trained: list[int] = []
    original = full.training_step

    def record(model: torch.nn.Module, inputs: dict[str, Any], n: torch.Tensor | int | None = None) -> torch.Tensor:
        trained.append(inputs["info"].bucket)
        return original(model, inputs, n)

    full.training_step = record  # type: ignore[method-assign,assignment]
    full.train()
    assert whole.step_count == len(trained) > 4
    assert steps_per_bucket(whole) == dict(Counter(trained))  # every step, under its own bucket
    assert sum(1 for line in log.read_text().splitlines() if json.loads(line).get("event") == "step") == len(trained)

    head, first, _ = monitored("head", num_train_epochs=2, max_steps=3, save_strategy="steps", save_steps=3)
    head.train()
    ckpt = tmp_path / "run" / "checkpoint-3"
    assert json.loads((ckpt / monitor_file(0)).read_text()) == first.state_dict()
    rest, resumed, _ = monitored("rest", num_train_epochs=2)
    rest.train(resume_from_checkpoint=str(ckpt))
    assert resumed.step_count == whole.step_count  # the 3 saved steps and the rest: the whole run's count
    assert steps_per_bucket(resumed) == steps_per_bucket(whole)
