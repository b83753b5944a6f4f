"""Rank balance under data parallelism: each rank's predicted and measured step time, gathered
every step, and how far the slowest rank runs ahead of the mean, per step and per epoch.

    monitor = BucketMonitor(plan, sinks=["run-rank0.jsonl"], cost_model=cost)   # on every rank
    ...                                                                          # train as usual
    monitor.rank_balance()["imbalance_measured"]       # sum of slowest / sum of mean - 1, the run
    print(format_rank_balance(monitor.rank_balance()))

NOTE [ Rank balance ]
Under data parallelism a step ends when its slowest rank does, so what a step wastes is the
slowest rank's time over the mean rank's. For a step with rank times t_0 .. t_{W-1}:

    imbalance = max(t) / mean(t) - 1                          (0: balanced; 0.25: the slowest takes 25 % over the mean)

and for an epoch (or the run), weighting each step by its length rather than averaging ratios:

    imbalance = sum over steps of max(t) / sum over steps of mean(t) - 1

both for the predicted times (``predicted_s`` of each rank's batch, from the cost model, which
needs a GPU to give seconds) and for the measured ones (``latency_s``, NOTE [ Latency ]). A
step's figure is ``None`` where the mean is 0 or a rank has no prediction; the epoch's predicted
figure sums only the steps every rank predicted. The epoch is the sampler's
(``BatchInfo.position``); batches without a position count under epoch ``None``.

The gather: after each step, where ``torch.distributed`` is initialised with a world size above
1, every rank's monitor all-gathers one float64 tensor of two numbers (predicted, measured;
NaN for no prediction) over the default process group: a CPU tensor for gloo and MPI, one on
the current CUDA device for NCCL. It is one small collective a step (16 bytes a rank), and
nothing at all outside a distributed run. What it costs is one collective's latency, not its
bytes: on 2 gloo CPU processes on the shared 2-core VM it adds 0.49 to 0.96 ms a step (two runs
under other load), where a bare gloo barrier takes 0.35 ms there (benchmarks/bench_rank_balance.py),
so at most about 1 % of a 100 ms step; NCCL on GPUs was not measured here. It is also a
collective: every rank must run a monitor and end the same steps (``on_batch_end``), or the
ranks wait on each other. A monitor on one rank only, or a step skipped on one rank, needs
``BucketMonitor(rank_balance=False)``.

What the measured figure sees: the monitor times the step it wraps. Where the step itself waits
for the other ranks (DDP's gradient all-reduce inside ``backward``), a fast rank's time already
includes its wait, the measured times converge and the measured imbalance reads low; the
predicted figure (and the measured one of a scope that ends before the gradient sync) is the
rank's own work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from tokenbucket._exceptions import ConfigError, StateError

__all__ = [
    "RankBalance",
    "distributed_world_size",
    "format_rank_balance",
    "gather_step_times",
    "rank_balance_of_events",
    "step_imbalance",
]

# the step event's fields, present only where the monitor gathered (NOTE [ Rank balance ])
RANK_FIELDS = ("rank_predicted_s", "rank_latency_s", "rank_imbalance_predicted", "rank_imbalance_measured")


def step_imbalance(seconds: Sequence[float | None]) -> float | None:
    """``max / mean - 1`` of one step's rank times (NOTE [ Rank balance ]); ``None`` where a rank
    has no time or the mean is not positive.

    Example:
        >>> step_imbalance([1.0, 1.0, 4.0])  # mean 2, slowest 4
        1.0
        >>> step_imbalance([0.5, None]) is None
        True
    """
    if not seconds or any(t is None for t in seconds):
        return None
    times = [float(t) for t in seconds if t is not None]
    mean = sum(times) / len(times)
    return max(times) / mean - 1.0 if mean > 0 else None


def distributed_world_size() -> int:
    """The default process group's world size, or 1 where ``torch.distributed`` is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def _gather_device() -> torch.device:
    backend = str(dist.get_backend()).lower()
    if "gloo" in backend or "mpi" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())  # NCCL takes device tensors only


def gather_step_times(predicted_s: float | None, latency_s: float) -> tuple[list[float | None], list[float]]:
    """Every rank's ``(predicted_s, latency_s)`` of this step, by rank: one all-gather of two
    float64 numbers over the default group (NOTE [ Rank balance ]). A collective: every rank calls
    it once a step."""
    world = dist.get_world_size()
    device = _gather_device()
    mine = torch.tensor([math.nan if predicted_s is None else predicted_s, latency_s], dtype=torch.float64)
    parts = [torch.empty(2, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(parts, mine.to(device))
    values = torch.cat(parts).tolist()  # one copy to the host for all of them
    predicted = [None if math.isnan(v) else float(v) for v in values[0::2]]
    return predicted, [float(v) for v in values[1::2]]


@dataclass
class _Sums:
    """One epoch's sums over steps (NOTE [ Rank balance ]): the slowest and the mean rank's time."""

    steps: int = 0
    slowest_s: float = 0.0
    mean_s: float = 0.0
    predicted_steps: int = 0  # the steps every rank predicted
    slowest_predicted_s: float = 0.0
    mean_predicted_s: float = 0.0

    def row(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "imbalance_measured": self.slowest_s / self.mean_s - 1.0 if self.mean_s > 0 else None,
            "imbalance_predicted": (
                self.slowest_predicted_s / self.mean_predicted_s - 1.0 if self.mean_predicted_s > 0 else None
            ),
            **asdict(self),
        }


class RankBalance:
    """Across-rank step times summed per epoch: the monitor's, and the report's from a log.

    State keys: ``world_size``, ``epochs`` (a list of each epoch's sums, with its ``epoch``).
    """

    STATE_KEYS = ("world_size", "epochs")

    def __init__(self) -> None:
        self.world_size = 0
        self.epochs: dict[int | None, _Sums] = {}

    def add(self, predicted_s: Sequence[float | None], latency_s: Sequence[float], epoch: int | None) -> dict[str, Any]:
        """Count one step's rank times; returns the step event's fields (``rank_predicted_s``,
        ``rank_latency_s``, ``rank_imbalance_predicted``, ``rank_imbalance_measured``)."""
        self.world_size = len(latency_s)
        sums = self.epochs.get(epoch)
        if sums is None:
            sums = self.epochs[epoch] = _Sums()
        sums.steps += 1
        sums.slowest_s += max(latency_s)
        sums.mean_s += sum(latency_s) / len(latency_s)
        imbalance_predicted = step_imbalance(predicted_s)
        if imbalance_predicted is not None:
            known = [float(t) for t in predicted_s if t is not None]
            sums.predicted_steps += 1
            sums.slowest_predicted_s += max(known)
            sums.mean_predicted_s += sum(known) / len(known)
        return {
            "rank_predicted_s": list(predicted_s),
            "rank_latency_s": list(latency_s),
            "rank_imbalance_predicted": imbalance_predicted,
            "rank_imbalance_measured": step_imbalance(latency_s),
        }

    def report(self) -> dict[str, Any] | None:
        """``world_size``, the run's ``steps``, ``imbalance_measured`` and ``imbalance_predicted``
        (NOTE [ Rank balance ]) and the same per epoch under ``epochs``; ``None`` before a step was
        gathered (one process, or ``rank_balance=False``)."""
        if not self.epochs:
            return None
        run = _Sums()
        for sums in self.epochs.values():
            for name, value in asdict(sums).items():
                setattr(run, name, getattr(run, name) + value)
        ordered = sorted(self.epochs.items(), key=lambda item: (item[0] is None, item[0] or 0))
        run_row = run.row()
        return {
            "world_size": self.world_size,
            "steps": run.steps,
            "imbalance_measured": run_row["imbalance_measured"],
            "imbalance_predicted": run_row["imbalance_predicted"],
            "epochs": [{"epoch": epoch, **sums.row()} for epoch, sums in ordered],
        }

    def state_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "epochs": [{"epoch": e, **asdict(s)} for e, s in self.epochs.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = sorted(set(state) - set(self.STATE_KEYS))
        if unknown:
            raise StateError(f"unexpected keys in the rank balance state: {unknown}")
        self.world_size = int(state.get("world_size", 0))
        self.epochs = {}
        for record in state.get("epochs", []):
            record = dict(record)
            epoch = record.pop("epoch", None)
            try:
                self.epochs[epoch] = _Sums(**record)
            except TypeError:
                raise StateError(f"cannot resume: a rank balance epoch record holds {sorted(record)}") from None


def _is_time(value: object, nullable: bool) -> bool:
    if value is None:
        return nullable
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value >= 0


def _times(event: Mapping[str, Any], name: str, i: int, world: int | None) -> list[Any]:
    """A step event's list of rank times, checked (a prediction may be ``None``)."""
    values = event.get(name)
    if (
        not isinstance(values, list)
        or not values
        or (world is not None and len(values) != world)
        or not all(_is_time(v, name == "rank_predicted_s") for v in values)
    ):
        what = "a list of finite numbers >= 0" + (f", one per rank ({world})" if world is not None else "")
        raise ConfigError(f"event {i}: the step event's {name!r} should be {what}, but got {values!r}"[:300])
    return values


def rank_balance_of_events(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The rank balance of a run log's step events (what :meth:`RankBalance.report` gives for the
    run), or ``None`` where no step event carries the ranks' times (a one-process run).

    Raises:
        ConfigError: a step event's ``rank_latency_s`` or ``rank_predicted_s`` is not a list of
            numbers >= 0 of the same length (the message names the event by its 0-based position).
    """
    balance = RankBalance()
    for i, event in enumerate(events):
        if event.get("event") != "step" or "rank_latency_s" not in event:
            continue
        latency = _times(event, "rank_latency_s", i, None)
        predicted = _times(event, "rank_predicted_s", i, len(latency))
        epoch = event.get("epoch")
        balance.add(predicted, [float(t) for t in latency], epoch if type(epoch) is int else None)
    return balance.report()


def format_rank_balance(report: Mapping[str, Any] | None) -> str:
    """The rank balance as text, a line for the run and one per epoch (empty for ``None``).

    Example:
        >>> b = RankBalance()
        >>> _ = b.add([0.1, 0.1], [1.0, 3.0], epoch=0)
        >>> print(format_rank_balance(b.report()))
        rank balance over 2 ranks, 1 steps: slowest rank / mean - 1 = +50.0 % measured, +0.0 % predicted
          epoch 0: 1 steps, +50.0 % measured, +0.0 % predicted
    """
    if report is None:
        return ""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:+.1f} %"

    lines = [
        f"rank balance over {report['world_size']} ranks, {report['steps']} steps: slowest rank / mean - 1 = "
        f"{pct(report['imbalance_measured'])} measured, {pct(report['imbalance_predicted'])} predicted"
    ]
    for row in report["epochs"]:
        lines.append(
            f"  epoch {'-' if row['epoch'] is None else row['epoch']}: {row['steps']} steps, "
            f"{pct(row['imbalance_measured'])} measured, {pct(row['imbalance_predicted'])} predicted"
        )
    return "\n".join(lines)
