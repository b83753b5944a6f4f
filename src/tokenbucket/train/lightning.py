"""Lightning: ``set_epoch`` that reaches the batch sampler, the sampler's position in the
trainer's checkpoint (exact mid-epoch resume), and the monitor around each training step.

    sampler = data.sampler(seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=BucketCollate(data))
    trainer = Trainer(use_distributed_sampler=False, callbacks=[BucketSamplerCallback(sampler, monitor=monitor)])
    trainer.fit(model, loader)                      # resume: trainer.fit(model, loader, ckpt_path=path)

NOTE [ Lightning and a batch sampler ]
With ``use_distributed_sampler=True`` (Lightning's default) and more than one process, Lightning
rebuilds the DataLoader around a ``DistributedSampler`` and tries to re-create the batch sampler
with ``sampler=`` and ``batch_size=``; a bucket sampler has neither (its batches are the plan's,
one bucket per step across ranks, and it already yields only this rank's batches), so Lightning
raises its own TypeError, and a second split would drop samples anyway. The callback therefore
refuses that setting at ``fit`` with one line naming the fix, ``Trainer(use_distributed_sampler=False)``.
Lightning's own ``set_epoch`` reaches ``loader.sampler`` and ``loader.batch_sampler.sampler`` only,
never the batch sampler itself: the callback calls it as each epoch starts.

NOTE [ Lightning resumes mid-epoch ]
``fit(ckpt_path=...)`` restores Lightning's batch counter but, for a plain ``DataLoader``, replays
the loader from the start of the epoch (it skips batches only for a loader that has
``state_dict`` / ``load_state_dict`` itself, such as torchdata's ``StatefulDataLoader``). So the
callback keeps the sampler's state in the checkpoint (``Callback.state_dict``, under the
callback's ``state_key``) and loads it back into the sampler before the first batch of the
resumed run is drawn: the loader then yields exactly the batches not yet trained, and Lightning's
counter, starting at the saved batch index, ends the epoch with them (Lightning still warns
that the "dataloader is not resumable": the sampler is, through this callback). The state saved is the one
after the last batch *trained* (its ``BatchInfo.position``, NOTE [ Position through the workers ]
in sampler.py), not the sampler's own count, which a loader's prefetch runs ahead. Lightning
writes the checkpoint from rank 0 only; every rank has taken the same number of steps of the
same epoch, so rank 0's position is every rank's. Give the sampler to the callback: a sampler
found only through ``trainer.train_dataloader`` is known once the loader has been built, after
a loader with workers has started drawing from it, so that case refuses to resume. With a
``StatefulDataLoader`` Lightning saves the loader's state itself: leave ``sampler`` unset and
give the callback no sampler state to keep (``checkpoint=False``).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import lightning
from torch.utils.data import DataLoader

from tokenbucket._exceptions import ConfigError, StateError
from tokenbucket.train.batch import BatchInfo
from tokenbucket.train.packing import PackedBatchSampler
from tokenbucket.train.sampler import BucketBatchSampler

__all__ = ["BucketSamplerCallback", "StepMonitor", "check_trainer", "find_sampler"]

BatchSampler = BucketBatchSampler | PackedBatchSampler
SAMPLER_KEY, MONITOR_KEY = "sampler", "monitor"


class StepMonitor(Protocol):
    """What the callback needs of a monitor (``tokenbucket.BucketMonitor``)."""

    def step(self, info: BatchInfo, batch: object = None) -> AbstractContextManager[None]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def check_trainer(trainer: lightning.Trainer) -> None:
    """Refuses Lightning's distributed-sampler injection for a bucket sampler (NOTE [ Lightning
    and a batch sampler ]) with a ConfigError naming the fix."""
    connector = getattr(trainer, "_accelerator_connector", None)
    if getattr(connector, "use_distributed_sampler", False) and getattr(connector, "is_distributed", False):
        raise ConfigError(
            "use_distributed_sampler=True cannot wrap a tokenbucket batch sampler (it already splits batches by "
            "rank, one bucket per step): build the trainer with Trainer(use_distributed_sampler=False)"
        )


def find_sampler(loaders: object) -> BatchSampler:
    """The tokenbucket batch sampler of a train dataloader (a DataLoader, or a list, tuple or
    dict of them as ``trainer.train_dataloader`` returns), through wrappers that keep it as
    ``batch_sampler``, ``batches`` or ``sampler``."""
    found: list[BatchSampler] = []
    todo = list(loaders.values()) if isinstance(loaders, Mapping) else [loaders]
    while todo:
        item = todo.pop()
        if isinstance(item, BucketBatchSampler | PackedBatchSampler):
            found.append(item)
        elif isinstance(item, list | tuple):
            todo.extend(item)
        elif item is not None:
            todo.extend(getattr(item, name, None) for name in ("batch_sampler", "batches", "sampler"))
    if len(found) != 1:
        what = "no tokenbucket batch sampler" if not found else f"{len(found)} tokenbucket batch samplers"
        raise ConfigError(
            f"the train dataloader has {what}: pass the one to follow as BucketSamplerCallback(sampler=...)"
        )
    return found[0]


def _info_of(batch: object) -> BatchInfo | None:
    info = batch.get("info") if isinstance(batch, Mapping) else getattr(batch, "info", None)
    return info if isinstance(info, BatchInfo) else None


class BucketSamplerCallback(lightning.Callback):
    """Keeps a tokenbucket batch sampler in step with a Lightning ``Trainer``.

    Args:
        sampler: the ``BucketBatchSampler`` / ``PackedBatchSampler`` of the train loader; found
            through ``trainer.train_dataloader`` when left out (see NOTE [ Lightning resumes
            mid-epoch ] for why giving it is better).
        monitor: a ``BucketMonitor`` to run around each training batch; its state goes into the
            checkpoint too.
        checkpoint: keep the sampler's position in the trainer's checkpoint.

    State keys (in the trainer checkpoint, under :attr:`state_key`): ``sampler`` (the sampler's
    ``state_dict``) and ``monitor`` (the monitor's, when given).

    Raises:
        ConfigError: at ``fit``, for ``use_distributed_sampler=True`` on more than one process,
            or a train loader without one tokenbucket batch sampler.
        StateError: a checkpoint that cannot be resumed exactly (see the sampler's ``load_state_dict``).
    """

    def __init__(
        self, sampler: BatchSampler | None = None, *, monitor: StepMonitor | None = None, checkpoint: bool = True
    ) -> None:
        if sampler is not None and not isinstance(sampler, BucketBatchSampler | PackedBatchSampler):
            raise ConfigError(
                f"sampler should be a BucketBatchSampler or PackedBatchSampler (dataset.sampler()), "
                f"but got sampler={type(sampler).__name__}"
            )
        self.sampler, self.monitor, self.checkpoint = sampler, monitor, checkpoint
        self._given = sampler is not None
        self._pending: dict[str, Any] | None = None  # a loaded state for a sampler not found yet
        self._last: BatchInfo | None = None  # the last batch started this epoch
        self._scope: AbstractContextManager[None] | None = None

    # -- the run ---------------------------------------------------------------------------------

    def setup(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, stage: str) -> None:
        if stage == "fit":
            check_trainer(trainer)

    def on_train_start(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        if self._given:
            return
        self.sampler = find_sampler(trainer.train_dataloader)
        if self._pending is not None:
            loaders = trainer.train_dataloader
            if any(isinstance(dl, DataLoader) and dl.num_workers > 0 for dl in _flat(loaders)):
                raise StateError(
                    "cannot resume exactly: the loader's workers drew batches before the sampler was found; "
                    "pass it as BucketSamplerCallback(sampler=...)"
                )
            self.sampler.load_state_dict(self._pending)
            self._pending = None

    def on_train_epoch_start(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        if self.sampler is None:
            self.sampler = find_sampler(trainer.train_dataloader)
        self.sampler.set_epoch(trainer.current_epoch)  # NOTE [ Lightning and a batch sampler ]: not Lightning's
        self._last = None

    def on_train_batch_start(
        self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, batch: object, batch_idx: int
    ) -> None:
        info = _info_of(batch)
        self._last = info if info is not None else self._last
        if self.monitor is not None and info is not None:
            self._scope = self.monitor.step(info, batch)
            self._scope.__enter__()

    def on_train_batch_end(
        self,
        trainer: lightning.Trainer,
        pl_module: lightning.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(None, None, None)

    def on_exception(
        self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, exception: BaseException
    ) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:  # an OOM inside the step is recorded by the monitor
            scope.__exit__(type(exception), exception, exception.__traceback__)

    # -- the checkpoint --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.checkpoint and self.sampler is not None:
            after = self._last if self._last is not None and self._last.position is not None else None
            state[SAMPLER_KEY] = self.sampler.state_dict(after=after)  # NOTE [ Lightning resumes mid-epoch ]
        if self.monitor is not None:
            state[MONITOR_KEY] = self.monitor.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        sampler_state, monitor_state = state.pop(SAMPLER_KEY, None), state.pop(MONITOR_KEY, None)
        if state:
            raise StateError(f"unexpected keys in the BucketSamplerCallback state: {sorted(state)}")
        if self.checkpoint and sampler_state is None:
            raise StateError(
                "cannot resume: the checkpoint holds no sampler state (saved without BucketSamplerCallback, or with "
                "checkpoint=False)"
            )
        if self.checkpoint and sampler_state is not None:
            if self.sampler is not None:
                self.sampler.load_state_dict(sampler_state)
            else:
                self._pending = sampler_state
        if self.monitor is not None and monitor_state is not None:
            self.monitor.load_state_dict(monitor_state)


def _flat(loaders: object) -> list[object]:
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    if isinstance(loaders, list | tuple):
        return list(loaders)
    return [loaders]
