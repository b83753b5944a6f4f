"""Hugging Face Accelerate: a loader prepared without sharding it twice, resume through
``accelerator.save_state`` / ``load_state``, and monitor events to the accelerator's trackers.

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_loader(accelerator, DataLoader(data, batch_sampler=sampler, collate_fn=collate))
    monitor = BucketMonitor(plan, sinks=[tracker_sink(accelerator)])
    accelerator.load_state(ckpt)                        # when resuming: the sampler goes on from its step
    for epoch in range(sampler.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader: ...

NOTE [ Accelerate shards twice ]
``accelerator.prepare(loader)`` wraps the loader's batch sampler in ``BatchSamplerShard``, which
keeps every ``num_processes``-th batch for this process. Our batch sampler already yields only
this rank's batches (NOTE [ Rank at iteration ] in sampler.py), so the second split drops about
half of the samples and sets ranks on different buckets at the same step. Accelerate splits
nothing when it prepares for one process, so :func:`prepare_loader` hands the loader to
accelerate's ``prepare_data_loader`` with ``num_processes=1``: device placement, the
end-of-dataloader state for gradient accumulation and ``set_epoch`` are accelerate's, the rank
split stays ours. ``even_batches`` needs nothing: every rank already takes the same number of
steps. A loader that ``accelerator.prepare`` already wrapped is unwrapped and prepared again.

NOTE [ Accelerate's epoch counter ]
A prepared loader calls ``set_epoch(n)`` as each pass starts, ``n`` counting its own passes from
0 in this process (or the last ``loader.set_epoch``). After ``load_state`` in a fresh process
that would send a sampler resumed in epoch 2 back to epoch 0, step 0. The batch sampler is
therefore given to accelerate behind :class:`FollowEpoch`, which passes on only an epoch later
than the sampler's own, or the next one for a sampler resumed at the end of its epoch; after a
pass the sampler moves on to its next epoch by itself (NOTE [ An epoch moves on by itself ] in
sampler.py). Resuming is the sampler's: its ``load_state_dict`` skips the done batches itself,
so do not also call ``accelerator.skip_first_batches`` (it would skip them twice).

The ordinary path, ``accelerator.prepare(model, optimizer, loader)`` over a tokenbucket batch
sampler, is refused as its first batch is drawn, naming :func:`prepare_loader` (NOTE [ Who draws
the batches ] in sampler.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from accelerate import Accelerator  # type: ignore[import-untyped]
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader  # type: ignore[import-untyped]
from torch.utils.data import DataLoader, Sampler

from tokenbucket._exceptions import ConfigError
from tokenbucket.train.sampler import resplit_error

__all__ = ["FollowEpoch", "LoaderPosition", "RankAwareBatches", "check_not_resharded", "prepare_loader", "tracker_sink"]


@runtime_checkable
class RankAwareBatches(Protocol):
    """A batch sampler that yields only this rank's batches and can resume (``BucketBatchSampler``,
    ``PackedBatchSampler``)."""

    epoch: int
    step: int

    def __iter__(self) -> Iterator[list[int]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class FollowEpoch(Sampler[list[int]]):
    """The batch sampler as accelerate sees it (NOTE [ Accelerate's epoch counter ]).

    Args:
        sampler: the rank-aware batch sampler; iteration, length and state are its own.
    """

    def __init__(self, sampler: RankAwareBatches) -> None:
        self.batches = sampler  # not .sampler: accelerate would call its set_epoch directly

    def set_epoch(self, epoch: int) -> None:
        s = self.batches
        if int(epoch) > s.epoch:  # never back (NOTE [ Accelerate's epoch counter ])
            s.set_epoch(int(epoch))
        elif s.step > 0 and s.step >= len(s):  # resumed at the end of its epoch: the next pass is the next epoch
            s.set_epoch(s.epoch + 1)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def state_dict(self) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state)


def _rank_aware(loader: DataLoader[Any]) -> RankAwareBatches:
    """The loader's rank-aware batch sampler, through accelerate's and our wrappers."""
    batches: object = loader.batch_sampler
    while isinstance(batches, BatchSamplerShard | FollowEpoch):
        batches = batches.batch_sampler if isinstance(batches, BatchSamplerShard) else batches.batches
    if not isinstance(batches, RankAwareBatches):
        raise ConfigError(
            f"prepare_loader needs a DataLoader(batch_sampler=...) with a tokenbucket batch sampler "
            f"(dataset.sampler()), but got batch_sampler={type(batches).__name__}"
        )
    return batches


def prepare_loader(
    accelerator: Accelerator,
    loader: DataLoader[Any],
    *,
    device_placement: bool | None = None,
    checkpoint: bool = True,
) -> DataLoader[Any]:
    """``loader`` prepared by ``accelerator`` without a second rank split (NOTE [ Accelerate shards twice ]).

    Args:
        accelerator: the ``Accelerator`` of the run (the loader may have been built before it).
        loader: a ``DataLoader(batch_sampler=sampler)`` over a tokenbucket sampler, or that
            loader after ``accelerator.prepare``.
        device_placement: move batches to ``accelerator.device``; defaults to the accelerator's.
        checkpoint: register the sampler with ``accelerator.register_for_checkpointing``, so
            ``save_state`` / ``load_state`` carry its position (register it once).

    Returns:
        The prepared loader: this rank's batches, on the device, one bucket per step across ranks.

    Raises:
        ConfigError: the loader has no tokenbucket batch sampler.
    """
    sampler = _rank_aware(loader)
    plain = DataLoader(
        loader.dataset,
        batch_sampler=FollowEpoch(sampler),
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
    )
    place = accelerator.device_placement if device_placement is None else device_placement
    prepared: DataLoader[Any] = prepare_data_loader(
        plain,
        accelerator.device,
        num_processes=1,  # NOTE [ Accelerate shards twice ]: the sampler splits by rank itself
        process_index=0,
        put_on_device=place,
        rng_types=None,
        dispatch_batches=False,
        non_blocking=accelerator.non_blocking,
    )
    if checkpoint:
        if loader.num_workers > 0:
            raise ConfigError(
                f"prepare_loader(checkpoint=True) counts the batches handed out with num_workers=0 only, but the "
                f"loader has num_workers={loader.num_workers}: build it with num_workers=0, or checkpoint=False"
            )
        accelerator.register_for_checkpointing(LoaderPosition(sampler, prepared))
    return prepared


class LoaderPosition:
    """What ``accelerator.save_state`` keeps: the sampler's state at the batches the prepared
    loader *handed out* (NOTE [ Accelerate looks one batch ahead ]).

    NOTE [ Accelerate looks one batch ahead ]
    A prepared loader fetches batch ``n + 1`` before it hands out batch ``n`` (to know which is
    the last), so mid-epoch the sampler has yielded one batch more than the training loop saw.
    """

    def __init__(self, sampler: RankAwareBatches, loader: DataLoader[Any]) -> None:
        self.sampler, self.loader = sampler, loader

    def state_dict(self) -> dict[str, Any]:
        state = self.sampler.state_dict()
        ahead = state["step"] > 0 and not getattr(self.loader, "end_of_dataloader", True)
        state["step"] -= int(ahead)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def check_not_resharded(loader: DataLoader[Any]) -> None:
    """Raise if ``accelerator.prepare`` split a tokenbucket loader again (NOTE [ Accelerate shards twice ]);
    the sampler itself refuses such a loader as its first batch is drawn, this says it before.

    Raises:
        ConfigError: naming :func:`prepare_loader` as the fix.
    """
    shard = loader.batch_sampler
    if isinstance(shard, BatchSamplerShard) and shard.num_processes > 1:
        inner = shard.batch_sampler
        if isinstance(inner, RankAwareBatches | FollowEpoch):
            raise resplit_error(shard.num_processes)


def tracker_sink(accelerator: Accelerator, *, prefix: str = "tokenbucket/") -> Callable[[Mapping[str, object]], None]:
    """A ``BucketMonitor`` sink that logs each ``step`` event's numbers with ``accelerator.log``.

    Only the main process logs (the others' sink does nothing). Keys are ``{prefix}{field}``
    plus ``{prefix}bucket{k}/{field}`` for the step's bucket; ``None`` fields are left out.
    Other events (``drift``, ``oom``, ``adapt``) are logged as a count under ``{prefix}{kind}``.
    """

    def sink(event: Mapping[str, object]) -> None:
        if not accelerator.is_main_process:
            return
        kind = event.get("event")
        step = event.get("step")
        values: dict[str, float] = {}
        if kind == "step":
            bucket = event.get("bucket")
            for key, value in event.items():
                if isinstance(value, bool) or not isinstance(value, int | float) or key in ("step", "bucket"):
                    continue
                values[f"{prefix}{key}"] = float(value)
                values[f"{prefix}bucket{bucket}/{key}"] = float(value)
        elif kind in ("drift", "oom", "adapt", "risk"):
            values[f"{prefix}{kind}"] = 1.0
        if values:
            accelerator.log(values, step=step if isinstance(step, int) and not isinstance(step, bool) else None)

    return sink
