"""Hugging Face ``transformers.Trainer``: the train loader over tokenbucket's batch sampler (one
rank split, not two), only model inputs passed to ``model(**inputs)``, the sampler's position
kept in each checkpoint and checked on resume, and the monitor around each training step.

    data = TokenBucketDataset(items, metadata=meta, spec=spec, plan=plan)
    trainer = BucketTrainer(model=model, args=TrainingArguments(...), train_dataset=data,
                            data_collator=BucketCollate(data), sampler=data.sampler(seed=0))
    trainer.train()                                   # resume: trainer.train(resume_from_checkpoint=path)

NOTE [ HF Trainer shards twice ]
``Trainer.get_train_dataloader`` builds a ``DataLoader(batch_size=..., sampler=...)`` and hands it
to ``accelerator.prepare``, which splits its batches by process. A bucket sampler has no single
batch size and already yields only this rank's batches (NOTE [ Rank at iteration ] in
sampler.py), so :class:`BucketTrainer` builds ``DataLoader(batch_sampler=sampler)`` itself and
prepares it with :func:`tokenbucket.train.accelerate.prepare_loader` (NOTE [ Accelerate shards
twice ]). ``set_epoch`` needs nothing more: the Trainer calls it on the prepared loader and on
its batch sampler as each epoch starts, and :class:`~tokenbucket.train.accelerate.FollowEpoch`
passes it on to the sampler.

NOTE [ What reaches the model ]
A tokenbucket batch carries bookkeeping next to the model inputs: ``info`` (a ``BatchInfo``),
``meta`` and other lists, ``index`` / ``row_mask`` tensors. ``remove_unused_columns`` filters a
``datasets.Dataset`` only, so the trainer filters the batch itself in ``_prepare_inputs`` (the
one place both training and evaluation go through before ``model(**inputs)``): with
``model_keys`` given, exactly those keys; else every tensor entry the model's ``forward`` names
(all tensor entries when ``forward`` takes ``**kwargs``). Non-tensor entries never reach it.

NOTE [ HF Trainer resumes mid-epoch ]
``train(resume_from_checkpoint=...)`` restores ``global_step`` and skips the trained batches of
the current epoch with accelerate's ``skip_first_batches``. Over a loader with a batch sampler
that skip drops *index lists* only (``SkipBatchSampler``: no sample is read or collated), it
counts the batches the Trainer trained (not the sampler's count, which prefetch runs ahead), and
it keeps the Trainer's own step counter, gradient-accumulation boundaries and RNG reload right.
So the Trainer skips and the sampler's position is *not* loaded (loading it too would skip the
batches twice); ``ignore_data_skip=True`` is refused on resume for that reason. What the
checkpoint adds (``tokenbucket_sampler.json``, written by rank 0 next to the Trainer's files) is
the check: on resume the sampler's identity must match (plan, world size, seed: else the
Trainer's skip would land on other batches) and the first batch trained must be the one after
the saved position; either failing raises a StateError instead of training on other samples.
The Trainer assumes every epoch has as many batches as the first; a dynamic-mode plan whose
epochs differ in length is caught by that same check.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import torch
import transformers
from torch.utils.data import DataLoader
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from tokenbucket._exceptions import ConfigError, StateError
from tokenbucket.train.accelerate import prepare_loader
from tokenbucket.train.batch import BatchInfo
from tokenbucket.train.collate import BucketCollate, TokenBucketDataset
from tokenbucket.train.packing import PackedBatchSampler
from tokenbucket.train.sampler import BucketBatchSampler, resume_position, sampler_state

__all__ = ["STATE_FILE", "BucketTrainer", "SamplerCheckpoint", "StepMonitor", "monitor_file"]

STATE_FILE = "tokenbucket_sampler.json"
SAMPLER_KEY, LENGTH_KEY = "sampler", "batches_in_epoch"
BatchSampler = BucketBatchSampler | PackedBatchSampler


class StepMonitor(Protocol):
    """What the trainer needs of a monitor (``tokenbucket.BucketMonitor``)."""

    def step(self, info: BatchInfo, batch: object = None) -> AbstractContextManager[None]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def flush(self) -> None: ...


def monitor_file(rank: int) -> str:
    """The file in a checkpoint folder that holds rank ``rank``'s monitor state."""
    return f"tokenbucket_monitor-{rank}.json"


class SamplerCheckpoint(transformers.TrainerCallback):
    """Writes ``tokenbucket_sampler.json`` into each checkpoint folder (rank 0 only): the
    sampler's state after the last batch trained, and its epoch's batch count; with a monitor,
    every rank writes its monitor's state to ``tokenbucket_monitor-RANK.json`` beside it, and
    flushes the monitor's sinks when training ends.

    State keys (in the file): ``sampler`` (the sampler's ``state_dict``), ``batches_in_epoch``.
    """

    def __init__(self, trainer: BucketTrainer) -> None:
        self.trainer = trainer

    def on_save(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: object,
    ) -> None:
        if args.output_dir is None:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not folder.is_dir():
            return
        if state.is_world_process_zero:
            (folder / STATE_FILE).write_text(json.dumps(self.trainer.sampler_position()))
        if self.trainer.monitor is not None:  # each rank's own statistics
            monitor_state = self.trainer.monitor.state_dict()
            (folder / monitor_file(args.process_index)).write_text(json.dumps(monitor_state))

    def on_train_end(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: object,
    ) -> None:
        if self.trainer.monitor is not None:  # the run's log is whole when train() returns
            self.trainer.monitor.flush()


class BucketTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` fed by a tokenbucket batch sampler.

    Takes the Trainer's arguments, plus:

    Args:
        sampler: the ``BucketBatchSampler`` / ``PackedBatchSampler`` of ``train_dataset``;
            ``train_dataset.sampler(seed=args.seed)`` when left out.
        monitor: a ``BucketMonitor`` to run around each training step; its state is saved with
            each checkpoint (one file per rank) and loaded on resume.
        model_keys: the batch keys passed to the model (NOTE [ What reaches the model ]).

    ``data_collator`` defaults to ``BucketCollate(train_dataset)``. See NOTE [ HF Trainer shards
    twice ] and NOTE [ HF Trainer resumes mid-epoch ].

    Raises:
        ConfigError: no tokenbucket sampler (and ``train_dataset`` not a ``TokenBucketDataset``),
            or a resume with ``ignore_data_skip=True``.
        StateError: a checkpoint without ``tokenbucket_sampler.json``, of another plan or world
            size, or whose position the Trainer's skip does not reach.
    """

    def __init__(
        self,
        *args: object,
        sampler: BatchSampler | None = None,
        monitor: StepMonitor | None = None,
        model_keys: Sequence[str] | None = None,
        **kwargs: object,
    ) -> None:
        data = kwargs.get("train_dataset")
        if kwargs.get("data_collator") is None and isinstance(data, TokenBucketDataset):
            kwargs["data_collator"] = BucketCollate(data)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # the Trainer's own arguments
        if sampler is None and isinstance(data, TokenBucketDataset):
            sampler = data.sampler(seed=self.args.seed)
        if not isinstance(sampler, BucketBatchSampler | PackedBatchSampler):
            raise ConfigError(
                f"BucketTrainer needs sampler= a BucketBatchSampler or PackedBatchSampler (dataset.sampler()), "
                f"or train_dataset= a TokenBucketDataset, but got sampler={type(sampler).__name__}"
            )
        self.sampler, self.monitor = sampler, monitor
        self.model_keys = None if model_keys is None else frozenset(model_keys)
        self.last_info: BatchInfo | None = None  # the info of the last batch trained
        self._expect: tuple[int, int] | None = None  # the position the resumed run must reach first
        self.add_callback(SamplerCheckpoint(self))

    # -- the loader ------------------------------------------------------------------------------

    def get_train_dataloader(self) -> DataLoader[Any]:
        """This rank's batches, prepared once (NOTE [ HF Trainer shards twice ])."""
        if self.train_dataset is None:
            raise ConfigError("BucketTrainer needs train_dataset= to train")
        args = self.args
        workers = args.dataloader_num_workers
        loader = DataLoader(
            self.train_dataset,
            batch_sampler=self.sampler,
            collate_fn=self.data_collator,
            num_workers=workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None,
            multiprocessing_context=args.dataloader_multiprocessing_context if workers > 0 else None,
        )
        return prepare_loader(self.accelerator, loader, checkpoint=False)  # the Trainer checkpoints itself

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Only model inputs go on (NOTE [ What reaches the model ])."""
        prepared: dict[str, Any] = super()._prepare_inputs(inputs)
        keys = self.model_keys if self.model_keys is not None else self._forward_keys()
        return {k: v for k, v in prepared.items() if isinstance(v, torch.Tensor) and (keys is None or k in keys)}

    def _forward_keys(self) -> frozenset[str] | None:
        if self.model is None:
            return None
        params = inspect.signature(self.model.forward).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        return frozenset(p.name for p in params)

    # -- the step --------------------------------------------------------------------------------

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        info = inputs.get("info") if isinstance(inputs, Mapping) else None
        if isinstance(info, BatchInfo):
            self._check_resumed(info)
            self.last_info = info
        scope = self.monitor.step(info, inputs) if self.monitor is not None and isinstance(info, BatchInfo) else None
        with scope if scope is not None else nullcontext():
            loss: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)
        return loss

    # -- the checkpoint --------------------------------------------------------------------------

    def sampler_position(self) -> dict[str, Any]:
        """What :class:`SamplerCheckpoint` writes: the sampler state after the last batch trained."""
        return {SAMPLER_KEY: self.sampler.state_dict(after=self.last_info), LENGTH_KEY: len(self.sampler)}

    def train(
        self, resume_from_checkpoint: str | bool | None = None, *args: object, **kwargs: object
    ) -> transformers.trainer_utils.TrainOutput:
        """``Trainer.train``; a resume is checked against the checkpoint's sampler state
        (NOTE [ HF Trainer resumes mid-epoch ])."""
        self.last_info, self._expect = None, None
        path = resume_from_checkpoint
        if path is True:
            path = get_last_checkpoint(self.args.output_dir)  # type: ignore[no-untyped-call]
        if isinstance(path, str):
            self._expect = self._saved_next(Path(path))
            saved_monitor = Path(path) / monitor_file(self.args.process_index)
            if self.monitor is not None and saved_monitor.is_file():
                self.monitor.load_state_dict(json.loads(saved_monitor.read_text()))
        return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[arg-type]

    def _saved_next(self, folder: Path) -> tuple[int, int]:
        if self.args.ignore_data_skip:
            raise ConfigError(
                "ignore_data_skip=True would replay the trained batches of the epoch: BucketTrainer resumes through "
                "the Trainer's own skip; leave ignore_data_skip=False"
            )
        file = folder / STATE_FILE
        if not file.is_file():
            raise StateError(
                f"cannot resume exactly: {file} is missing (the checkpoint was not saved by BucketTrainer)"
            )
        saved = json.loads(file.read_text())
        mine = sampler_state(self.sampler, self.sampler.STATE_KEYS, identity_only=True)
        epoch, step = resume_position(saved[SAMPLER_KEY], mine, "sampler")
        return (epoch + 1, 1) if step >= int(saved[LENGTH_KEY]) else (epoch, step + 1)

    def _check_resumed(self, info: BatchInfo) -> None:
        expect, self._expect = self._expect, None
        if expect is not None and info.position is not None and info.position != expect:
            raise StateError(
                f"cannot resume exactly: the Trainer's skip reached batch {info.position} (epoch, step) but the "
                f"checkpoint's sampler continues at {expect}; epochs of different lengths or a changed gradient "
                f"accumulation make the Trainer's count wrong"
            )
