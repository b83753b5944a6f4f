"""Per-bucket monitoring while training: latency, tokens/s, predicted vs measured memory, OOM risk,
drift of the plan, and OOM capture that loses no sample.

    monitor = BucketMonitor(plan, sinks=["run.jsonl"], cost_model=cost, data=data)
    train = monitor.guard(train_step, policy="split")      # OOM-safe, and timed per bucket
    for batch in loader:
        train(batch)                                        # or: with monitor.step(batch["info"], batch): ...
    print(format_summary(monitor.summary()))

Events (one dict each, to every sink; JSON-ready):

* ``start``: ``budget_bytes``, ``risk_threshold``, ``drift_margin``, ``plan_mode``, ``gpu`` (the
  cost model's GPU name, or ``None``),
  ``step_time`` (the cost model's :class:`~tokenbucket.cost.step_time.StepTime`, or ``None``), ``buckets``
  (``bucket``, ``bound``, ``batch_size``, ``predicted_peak_bytes`` each, and in a 2D plan
  ``vision_bound``: NOTE [ Two-dimensional buckets ]).
* ``step``: ``step``, ``bucket``, ``rows``, ``length``, ``real_tokens``, ``padded_tokens``,
  ``latency_s``, ``tokens_per_s`` (real tokens), ``predicted_bytes``, ``measured_bytes`` and
  ``reserved_bytes`` (``torch.cuda.max_memory_allocated`` / ``_reserved`` since the step began;
  ``None`` without a memory reader, e.g. on CPU), ``risk`` (predicted / budget), and with a
  cost model that counts FLOPs ``flops`` (training FLOPs at the step's shape) and
  ``predicted_s`` (its predicted seconds; ``None`` without a GPU), which ``tokenbucket
  calibrate`` fits (NOTE [ Calibration fit ]); ``compiles``: frames TorchDynamo compiled during
  the step (:func:`~tokenbucket.train.warmup.compile_count`; after a static plan's warm-up, 0);
  in a 2D plan ``vision_bound``, the bucket's image-token bound (FLOPs and seconds are at it);
  under ``torch.distributed`` with more than one rank, each rank's ``rank_predicted_s`` and
  ``rank_latency_s`` (lists by rank), ``rank_imbalance_predicted`` / ``_measured`` (slowest ÷
  mean − 1) and the sampler's ``epoch`` (NOTE [ Rank balance ] in :mod:`tokenbucket.monitor.ranks`).
* ``risk``: a batch above ``risk_threshold``: ``keys``, ``tokens`` by modality, ``cameras``.
* ``oom``: an out-of-memory error: the batch's ``keys``, ``tokens``, ``cameras``, ``policy``,
  ``message`` (and ``replay`` when its keys went to the replay file).
* ``drift``: measured / predicted of a bucket rose past ``1 + drift_margin`` (then past each
  further margin): ``ratio``, ``suggested_factor``.
* ``adapt``: a bucket's batch size lowered after an OOM (``old_batch_size``, ``new_batch_size``).
* ``resume``, ``summary`` (at :meth:`BucketMonitor.close`: the per-bucket table; ``ranks``, the
  run's and each epoch's rank imbalance, where the monitor gathered).

NOTE [ Latency ]
A batch on a GPU is timed with CUDA events recorded around the step and read when it ends (one
synchronisation per step, which the measured peak needs anyway); anything else with
``time.perf_counter``. The latency is the step's, not the loader's wait.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import torch

from tokenbucket._exceptions import ConfigError, OOMRiskWarning, PlanDriftWarning, StateError
from tokenbucket.monitor._split import split_batch
from tokenbucket.monitor.ranks import RankBalance, distributed_world_size, gather_step_times
from tokenbucket.monitor.report import _is_cut
from tokenbucket.monitor.sinks import CUT_EVENT, JsonlSink, append_line
from tokenbucket.monitor.stats import RunStats
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets_2d import SupportsCost2D
from tokenbucket.train.batch import BatchInfo
from tokenbucket.train.risk import check_risk_options, check_vision_cost
from tokenbucket.train.sampler import state_count
from tokenbucket.train.warmup import compile_count

__all__ = [
    "BucketMonitor",
    "CameraTokens",
    "CudaMemory",
    "MemoryReader",
    "is_oom",
    "read_replay",
    "split_batch",
]

OOM_POLICIES = ("raise", "skip", "split")


class MemoryReader(Protocol):
    """Peak device memory of a step: ``reset()`` when it starts, ``read()`` when it ends
    (``(allocated, reserved)`` bytes, or ``None`` when there is nothing to measure)."""

    def reset(self) -> None: ...

    def read(self) -> tuple[int, int] | None: ...


class CudaMemory:
    """The CUDA caching allocator's peaks (``max_memory_allocated`` / ``max_memory_reserved``)."""

    def __init__(self, device: int | str | torch.device | None = None) -> None:
        self.device = device

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> tuple[int, int]:
        return torch.cuda.max_memory_allocated(self.device), torch.cuda.max_memory_reserved(self.device)


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error: ``torch.OutOfMemoryError`` or the ``RuntimeError`` older stacks raise."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# -- the replay file ----------------------------------------------------------------------------


def read_replay(path: str | Path) -> list[dict[str, Any]]:
    """The replay file's records (``keys``, ``indices``, ``bucket``, ``step``, ``reason``): the samples a
    guard did not train, to run again (e.g. ``torch.utils.data.Subset(dataset, indices)``)."""
    out = []
    try:
        lines = Path(path).read_bytes().decode("utf-8", "replace").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read replay file {str(path)!r}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if _is_cut(line.strip()):  # a killed run's last write (NOTE [ Cut lines ]): nothing to replay
                continue
            raise ConfigError(f"replay file {str(path)!r} line {number} is not a JSON record: {exc}") from None
        if not isinstance(record, dict):
            raise ConfigError(f"replay file {str(path)!r} line {number} should be a JSON object, but got {line!r}")
        if record.get("event") == CUT_EVENT:  # a cut line kept in a record (NOTE [ Cut records ])
            continue
        out.append(record)
    return out


# -- the monitor -------------------------------------------------------------------------------


class CameraTokens(Protocol):
    """What the monitor asks the data for an OOM event (:class:`~tokenbucket.train.collate.TokenBucketDataset` answers it)."""

    def camera_tokens(self, indices: Sequence[int]) -> dict[str, int] | None: ...


def _on_cuda(batch: object) -> bool:
    if isinstance(batch, torch.Tensor):
        return batch.is_cuda
    if isinstance(batch, Mapping):
        return any(isinstance(v, torch.Tensor) and v.is_cuda for v in batch.values())
    return False


class BucketMonitor:
    """Records every training step per bucket and guards steps against OOMs.

    Args:
        plan: the :class:`~tokenbucket.plan.buckets.BucketPlan` the batches come from (budget, buckets).
        sinks: where events go: paths (a :class:`~tokenbucket.monitor.sinks.JsonlSink` each), sinks, or any
            callables taking the event dict. Default: ``["tokenbucket-run.jsonl"]``; ``[]`` for none.
        risk_threshold: a batch's risk is its predicted peak memory / the plan's budget
            (``budget_bytes``, itself already about 10 % under the GPU's usable memory: see
            :func:`~tokenbucket.cost.gpus.gpu_budget_bytes`); a batch above this threshold is
            reported as risky (a ``risk`` event with its keys). The plan's own batches sit at or
            below 1 by construction, so the default 1.0 flags only a batch whose prediction passes
            the budget (a cost model other than the plan's, a changed budget). If the report's
            ``drift`` column (measured / predicted) runs above 1, set it to about
            ``1 / drift`` (0.9 for a model 10 % low) so the batches that could really OOM are
            the ones flagged; going above 1 silences real warnings.
        drift_margin: measured / predicted may exceed 1 by this much before a drift warning.
        memory: ``"auto"`` (CUDA peaks when CUDA is available), a :class:`MemoryReader`, or ``None``.
        cost_model: re-predicts the parts of a split batch and suggests batch sizes after drift;
            for a 2D plan it must price image tokens (``vision=``: a ``StagedLengthModel``).
        data: the :class:`~tokenbucket.train.collate.TokenBucketDataset`, for per-camera tokens in OOM events.
        replay_path: where a guard writes the keys it did not train (default: the first JSONL
            sink's path with ``.replay.jsonl``).
        clock: the timer for CPU steps (a fake one in tests).
        rank_balance: under ``torch.distributed`` with more than one rank, all-gather each step's
            predicted and measured seconds so every rank logs them all (NOTE [ Rank balance ]):
            a collective, so every rank must run a monitor; ``False`` to gather nothing.

    State keys: ``step``, ``stats``, ``drift_levels``, ``limits``, and ``ranks`` (optional on load).
    """

    STATE_KEYS = ("step", "stats", "drift_levels", "limits")

    def __init__(
        self,
        plan: BucketPlan,
        *,
        sinks: Sequence[Any] | None = None,
        risk_threshold: float = 1.0,
        drift_margin: float = 0.1,
        memory: MemoryReader | Literal["auto"] | None = "auto",
        cost_model: PredictsMemory | None = None,
        data: CameraTokens | None = None,
        replay_path: str | Path | None = None,
        clock: Callable[[], float] = time.perf_counter,
        rank_balance: bool = True,
    ) -> None:
        check_risk_options(risk_threshold, "warn")
        if not isinstance(rank_balance, bool):
            raise ConfigError(f"rank_balance should be True or False, but got rank_balance={rank_balance!r}")
        if not drift_margin >= 0:
            raise ConfigError(f"drift_margin should be a non-negative number, but got drift_margin={drift_margin!r}")
        check_vision_cost(plan, cost_model, ("memory", "max_batch"))  # a 2D plan's model takes vision=
        self.plan, self.cost_model, self.data = plan, cost_model, data
        self.budget_bytes = int(plan.budget_bytes)
        self.risk_threshold, self.drift_margin = float(risk_threshold), float(drift_margin)
        if memory == "auto":
            memory = CudaMemory() if torch.cuda.is_available() else None
        self.memory: MemoryReader | None = memory
        self.clock = clock
        self._cuda = torch.cuda.is_available()  # without CUDA no batch needs the device check
        self.sinks = [
            JsonlSink(s) if isinstance(s, (str, Path)) else s
            for s in (["tokenbucket-run.jsonl"] if sinks is None else sinks)
        ]
        for s in self.sinks:
            if not callable(s):
                raise ConfigError(f"a sink should be a path or a callable taking the event dict, but got {s!r}")
        if replay_path is None:
            jsonl = next((s for s in self.sinks if isinstance(s, JsonlSink)), None)
            replay_path = jsonl.path.with_suffix(".replay.jsonl") if jsonl is not None else None
        self.replay_path = None if replay_path is None else Path(replay_path)
        self.stats = RunStats()
        self.rank_balance_on, self.ranks = rank_balance, RankBalance()
        self.step_count = 0
        self.drift_levels: dict[int, float] = {}
        self.limits: dict[int, int] = {}  # batch sizes lowered after OOMs (adapt=True)
        self._info: BatchInfo | None = None
        self._start = 0.0
        self._events: tuple[Any, Any] | None = None
        self._times: dict[tuple[int, int, int | None], dict[str, float | None]] = {}
        self._compiles = 0
        self._emit(
            {
                "event": "start",
                "time": time.time(),
                "budget_bytes": self.budget_bytes,
                "risk_threshold": self.risk_threshold,
                "drift_margin": self.drift_margin,
                "plan_mode": plan.mode,
                "gpu": getattr(getattr(cost_model, "gpu", None), "name", None),
                "step_time": _step_time_dict(cost_model),
                "buckets": [
                    {
                        "bucket": k,
                        "bound": b.bound,
                        # NOTE [ The 2D report grid ]: a 2D bucket is placed by both bounds
                        **({"vision_bound": b.vision_bound} if b.vision_bound is not None else {}),
                        "batch_size": b.batch_size,
                        "predicted_peak_bytes": b.predicted_peak_bytes,
                    }
                    for k, b in enumerate(plan.buckets)
                ],
            }
        )

    # -- events ----------------------------------------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        self.stats.add(event)
        for sink in self.sinks:
            sink(event)

    def _batch_fields(self, info: BatchInfo) -> dict[str, Any]:
        return {
            "bucket": info.bucket,
            "rows": info.shape[0],
            "length": info.shape[1],
            "keys": list(info.keys),
            "tokens": dict(info.tokens),
            "cameras": info.cameras or self._cameras(info),
        }

    def _cameras(self, info: BatchInfo) -> dict[str, int]:
        if self.data is None or not info.indices:
            return {}
        return self.data.camera_tokens(info.indices) or {}

    # -- hooks around a step -----------------------------------------------------------------------

    def on_batch_start(self, info: BatchInfo, batch: object = None) -> None:
        """Call before the step with the batch's :class:`~tokenbucket.train.collate.BatchInfo` (and the batch,
        so a batch on a GPU is timed with CUDA events)."""
        if info.risk > self.risk_threshold:
            self._emit(
                {
                    "event": "risk",
                    "step": self.step_count,
                    "time": time.time(),
                    **self._batch_fields(info),
                    "risk": info.risk,
                    "threshold": self.risk_threshold,
                }
            )
        self._info = info
        self._compiles = compile_count()
        if self.memory is not None:
            self.memory.reset()
        if self._cuda and batch is not None and _on_cuda(batch):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            self._events = (start, end)
        else:
            self._events = None
            # NOTE [ Latency ]: the step's own time, from here to on_batch_end
            self._start = self.clock()

    def on_batch_end(self) -> None:
        """Call after the step (its backward and optimizer step included)."""
        info, self._info = self._info, None
        if info is None:
            raise ConfigError("on_batch_end() without on_batch_start()")
        if self._events is not None:
            start, end = self._events
            end.record()
            end.synchronize()
            latency = start.elapsed_time(end) / 1e3
        else:
            latency = self.clock() - self._start
        reading = self.memory.read() if self.memory is not None else None
        measured, reserved = reading if reading is not None else (None, None)
        step = self.step_count
        self.step_count += 1
        tokens_per_s = info.real_tokens / latency if latency > 0 else 0.0
        predicted = self._predicted_time(info.shape[0], info.shape[1], info.vision_bound)
        balance: dict[str, Any] = {}
        if self.rank_balance_on and distributed_world_size() > 1:  # NOTE [ Rank balance ]
            epoch = info.position[0] if info.position is not None else None
            balance = self.ranks.add(*gather_step_times(predicted.get("predicted_s"), latency), epoch)
            balance["epoch"] = epoch
        self.stats.add_step(
            info.bucket,
            latency,
            info.real_tokens,
            info.padded_tokens,
            info.predicted_peak_bytes,
            measured,
            reserved,
            info.risk,
        )
        if self.sinks:
            event = {
                "event": "step",
                "step": step,
                "time": time.time(),
                "bucket": info.bucket,
                "rows": info.shape[0],
                "length": info.shape[1],
                "real_tokens": info.real_tokens,
                "padded_tokens": info.padded_tokens,
                "latency_s": latency,
                "tokens_per_s": tokens_per_s,
                "predicted_bytes": info.predicted_peak_bytes,
                "measured_bytes": measured,
                "reserved_bytes": reserved,
                "risk": info.risk,
                **predicted,
                "compiles": compile_count() - self._compiles,
                **balance,
            }
            if info.vision_bound is not None:
                event["vision_bound"] = info.vision_bound
            for sink in self.sinks:
                sink(event)
        if measured is not None:
            self._check_drift(info.bucket, measured / info.predicted_peak_bytes, step)

    def _predicted_time(self, rows: int, length: int, vision: int | None = None) -> dict[str, float | None]:
        """``flops`` (training FLOPs at the step's shape, a 2D bucket's at its ``vision`` bound) and
        ``predicted_s`` for the log, which ``tokenbucket calibrate`` fits (NOTE [ Calibration fit ]);
        empty without a cost model that counts FLOPs."""
        key = (rows, length, vision)
        if key not in self._times:
            cost: Any = self.cost_model
            if cost is None or not hasattr(cost, "flops") or rows < 1 or length < 1:
                self._times[key] = {}
            else:
                timed = getattr(cost, "gpu", None) is not None or getattr(cost, "step_time", None) is not None
                shape = (rows, length) if vision is None else (rows, length, min(vision, length))
                self._times[key] = {
                    "flops": float(cost.flops(*shape).training),
                    "predicted_s": float(cost.step_seconds(*shape)) if timed else None,
                }
        return self._times[key]

    def step(self, info: BatchInfo, batch: object = None) -> _StepScope:
        """``with monitor.step(batch["info"], batch): ...`` — times and records the step; an OOM
        inside is recorded (policy ``raise``) and re-raised."""
        return _StepScope(self, info, batch)

    # -- drift -------------------------------------------------------------------------------------

    def _check_drift(self, bucket: int, ratio: float, step: int) -> None:
        level = self.drift_levels.get(bucket, 1.0 + self.drift_margin)
        if ratio <= level:
            return
        # re-armed one margin higher: creeping memory warns again, a steady offset warns once
        self.drift_levels[bucket] = ratio + self.drift_margin
        factor = math.ceil(ratio * 100) / 100
        self._emit(
            {
                "event": "drift",
                "step": step,
                "time": time.time(),
                "bucket": bucket,
                "ratio": ratio,
                "margin": self.drift_margin,
                "suggested_factor": factor,
            }
        )
        warnings.warn(
            f"bucket {bucket}: measured peak is {ratio:.3f}x the predicted one (margin "
            f"{self.drift_margin:g}); the plan may no longer hold. {self._advice(factor)}",
            PlanDriftWarning,
            stacklevel=4,
        )

    def _advice(self, factor: float) -> str:
        return (
            f"Recalibrate: replan with budget_bytes={int(self.budget_bytes / factor):,} "
            f"(the budget / {factor:.2f}), or profile the model (tokenbucket profile)."
        )

    def recalibration(self) -> dict[str, Any] | None:
        """The measured factor to put into the plan (the largest measured / predicted over buckets) and,
        with a cost model and a static plan, each bucket's batch size under ``budget / factor``."""
        ratios = [b.max_ratio for b in self.stats.buckets.values() if b.max_ratio is not None]
        if not ratios:
            return None
        factor = math.ceil(max(ratios) * 100) / 100
        out: dict[str, Any] = {
            "factor": factor,
            "budget_bytes": int(self.budget_bytes / factor),
            "advice": self._advice(factor),
        }
        if self.cost_model is not None and self.plan.mode == "static":
            budget, cost = int(self.budget_bytes / factor), self.cost_model
            out["batch_sizes"] = {
                k: {
                    "planned": b.batch_size,
                    # a 2D bucket at its image-token bound too (NOTE [ Two-dimensional buckets ])
                    "suggested": cost.max_batch(b.bound, budget)
                    if b.vision_bound is None
                    else cast(SupportsCost2D, cost).max_batch(b.bound, budget, b.vision_bound),
                }
                for k, b in enumerate(self.plan.buckets)
            }
        return out

    # -- the OOM guard -----------------------------------------------------------------------------

    def guard(
        self,
        step_fn: Callable[[Any], Any],
        *,
        policy: str = "raise",
        adapt: bool = False,
        split_fn: Callable[[Any, int], list[Any]] | None = None,
    ) -> Callable[[Any], Any]:
        """``step_fn`` wrapped: timed under :meth:`step` and safe against out-of-memory errors.

        On an OOM the guard frees what it can (``gc``, the CUDA cache), records an ``oom`` event
        with the batch's bucket, shape, keys and breakdown, then by ``policy``:

        * ``"raise"``: re-raises (after recording);
        * ``"skip"``: writes the keys and indices to the replay file and goes on (returns ``None``);
        * ``"split"``: runs the batch as two halves, recursively; a single sample that still does not
          fit goes to the replay file. Returns the list of the parts' results.

        With ``adapt=True`` the bucket's batch size is halved for the rest of the run (the guard
        runs its later batches in parts of that size; an ``adapt`` event and a warning say so).

        Under ``torch.distributed`` a split or skip changes how often ``step_fn`` runs on that
        rank; a step that all-reduces inside would then wait on the others. Use ``raise`` there,
        or all-reduce outside ``step_fn``.
        """
        if policy not in OOM_POLICIES:
            raise ConfigError(f"policy should be one of {OOM_POLICIES}, but got policy={policy!r}")
        if policy != "raise" and self.replay_path is None:
            raise ConfigError(
                f"policy={policy!r} writes skipped keys to a replay file: give the monitor replay_path= or a JSONL sink"
            )
        split = split_fn or (lambda batch, parts: split_batch(batch, parts, cost_model=self.cost_model))

        def run(batch: Mapping[str, Any], info: BatchInfo) -> object:
            n = len(info.keys)
            limit = self.limits.get(info.bucket)
            if limit is not None and n > limit:
                return _Parts(r for part in split(batch, -(-n // limit)) for r in _flat(run(part, part["info"])))
            try:
                return step_fn(batch)
            except BaseException as exc:
                if not is_oom(exc):
                    raise
                self._record_oom(info, exc, policy if n > 1 or policy == "raise" else "skip")
                if policy == "raise":
                    raise
            # out of the except block: the error's frames (and the tensors they hold) are released
            _free_memory()
            if adapt and n > 1:
                self._lower(info.bucket, n)
            if policy == "skip" or n <= 1:
                return None
            return _Parts(r for part in split(batch, 2) for r in _flat(run(part, part["info"])))

        def guarded(batch: Mapping[str, Any]) -> Any:
            info = batch["info"]
            if self._info is not None:  # already inside monitor.step()
                result = run(batch, info)
            else:
                with self.step(info, batch):
                    result = run(batch, info)
            return list(result) if isinstance(result, _Parts) else result

        return guarded

    def _record_oom(self, info: BatchInfo, exc: BaseException, policy: str) -> None:
        # mark the error, not keep it: a reference would keep its traceback's frames (the failed
        # step's tensors) alive through the retry
        with contextlib.suppress(AttributeError):
            setattr(exc, _RECORDED, True)
        event = {
            "event": "oom",
            "step": self.step_count,
            "time": time.time(),
            **self._batch_fields(info),
            "policy": policy,
            "message": str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__,
        }
        if policy == "skip":
            assert self.replay_path is not None
            # NOTE [ Cut records ]: a cut last line is kept, in a cut record (read_replay skips it)
            append_line(
                self.replay_path,
                json.dumps(
                    {
                        "keys": list(info.keys),
                        "indices": list(info.indices),
                        "bucket": info.bucket,
                        "step": self.step_count,
                        "reason": "oom",
                    }
                ),
            )
            event["replay"] = str(self.replay_path)
        self._emit(event)

    def _lower(self, bucket: int, rows: int) -> None:
        old = self.limits.get(bucket, self.plan.buckets[bucket].batch_size)
        new = max(1, min(old, rows) // 2)
        if new >= old:
            return
        self.limits[bucket] = new
        self._emit(
            {
                "event": "adapt",
                "step": self.step_count,
                "time": time.time(),
                "bucket": bucket,
                "old_batch_size": old,
                "new_batch_size": new,
            }
        )
        warnings.warn(
            f"bucket {bucket}: out of memory at {rows} samples; its batches run in parts of {new} for the "
            f"rest of the run (planned {self.plan.buckets[bucket].batch_size})",
            OOMRiskWarning,
            stacklevel=4,
        )

    # -- results and state -----------------------------------------------------------------------

    def summary(self) -> list[dict[str, Any]]:
        """Per bucket: steps, latency p50/p95/max, tokens/s, padding efficiency, predicted and measured
        peak, max risk, drift ratio, risky batches and OOMs (see :func:`tokenbucket.monitor.stats.format_summary`)."""
        return self.stats.rows()

    def rank_balance(self) -> dict[str, Any] | None:
        """The run's and each epoch's rank imbalance (:meth:`~tokenbucket.monitor.ranks.RankBalance.report`);
        ``None`` where nothing was gathered (one process, or ``rank_balance=False``)."""
        return self.ranks.report()

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step_count,
            "stats": self.stats.state_dict(),
            "drift_levels": {str(k): v for k, v in self.drift_levels.items()},
            "limits": {str(k): v for k, v in self.limits.items()},
            "ranks": self.ranks.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [k for k in self.STATE_KEYS if k not in state]
        if missing:
            raise StateError(f"cannot resume: the saved monitor state has no {missing} (it holds {sorted(state)})")
        state = dict(state)
        self.step_count = state_count(state, "step", "monitor")
        del state["step"]
        self.stats.load_state_dict(state.pop("stats"))
        self.drift_levels = {int(k): float(v) for k, v in state.pop("drift_levels").items()}
        self.limits = {int(k): int(v) for k, v in state.pop("limits").items()}
        self.ranks.load_state_dict(state.pop("ranks", {}))  # absent from a state saved before it
        if state:
            raise StateError(f"unexpected keys in the monitor state: {sorted(state)}")
        self._emit({"event": "resume", "step": self.step_count, "time": time.time()})

    def flush(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "flush"):
                sink.flush()

    def close(self) -> None:
        """Writes the ``summary`` event and flushes and closes the sinks."""
        event = {"event": "summary", "time": time.time(), "buckets": self.summary()}
        ranks = self.rank_balance()  # NOTE [ Rank balance ]
        self._emit(event if ranks is None else {**event, "ranks": ranks})
        for sink in self.sinks:
            if hasattr(sink, "close"):
                sink.close()

    def __enter__(self) -> BucketMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StepScope:
    """What :meth:`BucketMonitor.step` returns (a class, not ``@contextmanager``: it runs every step)."""

    __slots__ = ("batch", "info", "monitor")

    def __init__(self, monitor: BucketMonitor, info: BatchInfo, batch: object) -> None:
        self.monitor, self.info, self.batch = monitor, info, batch

    def __enter__(self) -> None:
        self.monitor.on_batch_start(self.info, self.batch)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        monitor = self.monitor
        if exc is None:
            monitor.on_batch_end()
            return
        monitor._info = None
        if is_oom(exc) and not getattr(exc, _RECORDED, False):
            monitor._record_oom(self.info, exc, "raise")


_RECORDED = "_tokenbucket_oom_recorded"


class _Parts(list[Any]):
    """The results of a batch run in parts (told apart from a step function that returns a list)."""


def _step_time_dict(cost: object) -> dict[str, Any] | None:
    """The step-time model a cost model prices steps with (NOTE [ Step time ]), for the log."""
    st = getattr(cost, "step_time", None)
    return st.to_dict() if st is not None and hasattr(st, "to_dict") else None


def _flat(result: object) -> list[object]:
    return list(result) if isinstance(result, _Parts) else [result]


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()
