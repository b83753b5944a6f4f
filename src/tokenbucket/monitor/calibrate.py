"""Calibration from a run: the monitor's log (or a live monitor) fitted into a :class:`Calibration`.

    tokenbucket calibrate run.jsonl --out calibration.json       # then: plan ... --calibration calibration.json

The log's ``step`` events carry each step's shape, measured seconds and peak, and (with a cost
model that counts FLOPs) its training FLOPs; the ``start`` event carries the plan's bucket
bounds and the step-time model the run was planned with. :func:`calibrate_steps` fits NOTE
[ Calibration fit ] to them and measures, per bucket, how far the mean step time was from the
prediction before (the run's own model; ``None`` on a CPU, which has no GPU model), from a fit
of FLOPs alone (step time proportional to FLOPs: the old flat-utilisation model, given its
best constant), and after.

Example:
    >>> steps = [StepRecord(b, 1, n, 0.01 + n * 1e-6, n * 1e6, None, None, None)
    ...          for b, n in [(0, 100), (1, 400), (2, 900)] for _ in range(3)]
    >>> cal = calibrate_steps(steps, bounds={0: 100, 1: 400, 2: 900})
    >>> round(cal.step_time.fixed_seconds, 4), cal.stats["steps_used"]
    (0.01, 6)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.calibration import CalibratedCostModel, Calibration, fit_step_time
from tokenbucket.cost.step_time import FixedCost
from tokenbucket.monitor.report import RunLog, read_events
from tokenbucket.plan._search import SupportsCost
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets

__all__ = [
    "StepRecord",
    "calibrate_log",
    "calibrate_steps",
    "compare",
    "measured_peaks",
    "plan_buckets_of",
    "replan",
    "step_records",
]


@dataclass(frozen=True)
class StepRecord:
    """One measured step: its bucket, shape, seconds, FLOPs and bytes (``None`` where unknown)."""

    bucket: int
    rows: int
    length: int
    seconds: float
    flops: float | None
    predicted_s: float | None
    predicted_bytes: int | None
    measured_bytes: int | None


def step_records(log: RunLog) -> list[StepRecord]:
    """The log's steps, in order; a step without its shape (``rows``, ``length``) is a one-line
    ConfigError naming the file."""
    steps = log.of("step")
    for e in steps:
        if e.get("rows") is None or e.get("length") is None:
            raise ConfigError(
                f"run log {str(log.path)!r}: step {e['step']} has no rows or length (its shape), which calibration needs"
            )
    return [_record(e) for e in steps]


def plan_buckets_of(log: RunLog) -> list[tuple[int, int, int]]:
    """``(bucket, bound, batch_size)`` of the plan the run's last ``start`` event records; a
    missing or malformed start is a one-line ConfigError naming the file."""
    starts = log.of("start")
    where = f"run log {str(log.path)!r}"
    if not starts:
        raise ConfigError(f"{where} has no start event; is it a tokenbucket monitor log?")
    buckets = starts[-1].get("buckets")
    out: list[tuple[int, int, int]] = []
    for i, b in enumerate(buckets if isinstance(buckets, list) else [None]):
        values = [b.get(k) for k in ("bucket", "bound", "batch_size")] if isinstance(b, dict) else []
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
        if len(ints) != 3:
            raise ConfigError(f"{where}: the start event's buckets[{i}] should hold bucket, bound and batch_size")
        out.append((ints[0], ints[1], ints[2]))
    return out


def _record(e: Mapping[str, Any]) -> StepRecord:
    return StepRecord(
        int(e["bucket"]), int(e["rows"]), int(e["length"]), float(e["latency_s"]),
        e.get("flops"), e.get("predicted_s"), e.get("predicted_bytes"), e.get("measured_bytes"),
    )  # fmt: skip


def calibrate_log(path: str | Path | RunLog) -> Calibration:
    """Read a monitor log (or take one already read) and fit it (:func:`calibrate_steps`); the
    file's problems are one-line ConfigErrors naming it."""
    log = path if isinstance(path, RunLog) else read_events(path)
    path = log.path
    bounds = {k: bound for k, bound, _ in plan_buckets_of(log)}
    start = log.of("start")[-1]
    step_time = start.get("step_time")
    peak = _positive(step_time, "peak_flops")  # a hand-edited value that is no number reads as absent
    prior = _positive(step_time, "knee_tokens") or 0.0
    steps = step_records(log)
    if not steps:
        raise ConfigError(f"run log {str(path)!r} has no step events to calibrate from")
    if all(s.flops is None for s in steps):
        raise ConfigError(
            f"run log {str(path)!r}: its steps carry no FLOPs; give the BucketMonitor a cost model "
            "(cost_model=...) so each step records its FLOPs"
        )
    cal = calibrate_steps(steps, bounds=bounds, peak_flops=peak, prior_knee=prior, source=str(path))
    if "gpu" in start:  # what the run's steps were timed on; plan --calibration checks it
        cal.stats["gpu"] = start["gpu"]
    return cal


def _positive(data: object, key: str) -> float | None:
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        return None
    return float(value)


def calibrate_steps(
    steps: Sequence[StepRecord],
    *,
    bounds: Mapping[int, int],
    peak_flops: float | None = None,
    prior_knee: float = 0.0,
    source: str = "",
) -> Calibration:
    """Fit the step-time model and memory offsets to ``steps`` (NOTE [ Calibration fit ]).

    Args:
        steps: measured steps (those without FLOPs are left out of the time fit).
        bounds: each bucket's bound (the offsets are keyed by it).
        peak_flops: the run's GPU peak (``None``: a CPU run).
        prior_knee: the run's own model's knee, kept when the log cannot place one.
        source: recorded in the result.
    """
    used = _after_warm_up(steps)
    if not used:
        raise ConfigError(f"{source or 'the run'}: no step with FLOPs after each shape's first; run longer")
    seconds = np.array([s.seconds for s in used])
    flops = np.array([float(s.flops or 0) for s in used])
    tokens = np.array([s.rows * s.length for s in used], dtype=np.float64)
    st, found = fit_step_time(seconds, flops, tokens, peak_flops=peak_flops, prior_knee=prior_knee, source=source)
    # the old model's form, step time = k x FLOPs, with its best k (relative least squares)
    ratio = flops / seconds
    k = float(ratio.sum() / (ratio**2).sum())
    cal = Calibration(st, _offsets(steps, bounds), source, {"flops_only_seconds_per_flop": k, "knee_found": found})
    stats = compare(cal, steps, bounds=bounds)
    return Calibration(st, cal.memory_offsets, source, {**cal.stats, **stats, "steps_skipped": len(steps) - len(used)})


def compare(calibration: Calibration, steps: Sequence[StepRecord], *, bounds: Mapping[int, int]) -> dict[str, Any]:
    """Per bucket of ``steps`` (each shape's first step left out): the mean measured seconds beside
    the run's own prediction (``planned_s``), step time proportional to FLOPs with the
    calibration's constant (``flops_only_s``) and the calibrated model (``calibrated_s``); and
    each one's mean error over the buckets. ``steps`` may be another run's (a held-out check)."""
    used = _after_warm_up(steps)
    st = calibration.step_time
    k = float(calibration.stats.get("flops_only_seconds_per_flop", 0.0))
    none = FixedCost(0, 0, 0)
    rows: list[dict[str, Any]] = []
    for bucket in sorted({s.bucket for s in used}):
        mine = [s for s in used if s.bucket == bucket]
        before = [s.predicted_s for s in mine if s.predicted_s is not None]
        rows.append(
            {
                "bucket": bucket,
                "bound": bounds.get(bucket),
                "steps": len(mine),
                "measured_s": float(np.mean([s.seconds for s in mine])),
                "planned_s": float(np.mean(before)) if len(before) == len(mine) else None,
                "flops_only_s": float(np.mean([k * float(s.flops or 0) for s in mine])) if k else None,
                "calibrated_s": float(
                    np.mean([st.seconds(float(s.flops or 0), s.rows * s.length, fixed=none).total for s in mine])
                ),
            }
        )
    return {
        "steps_used": len(used),
        "buckets": rows,
        "error_planned": _mean_error(rows, "planned_s"),
        "error_flops_only": _mean_error(rows, "flops_only_s"),
        "error_calibrated": _mean_error(rows, "calibrated_s"),
    }


def _after_warm_up(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """The steps with FLOPs, each shape's first left out (it pays its warm-up)."""
    seen: set[tuple[int, int]] = set()
    used: list[StepRecord] = []
    for s in steps:
        shape = (s.rows, s.length)
        if shape not in seen:
            seen.add(shape)
            continue
        if s.flops is not None and s.seconds > 0:
            used.append(s)
    return used


def _mean_error(rows: list[dict[str, Any]], key: str) -> float | None:
    """Mean over buckets of |predicted - measured| / measured (``None`` if a bucket has none)."""
    if not rows or any(r[key] is None for r in rows):
        return None
    return float(np.mean([abs(r[key] - r["measured_s"]) / r["measured_s"] for r in rows]))


def _offsets(steps: Sequence[StepRecord], bounds: Mapping[int, int]) -> dict[int, int]:
    """``{bound: max(measured - predicted)}`` over the steps that measured their peak."""
    out: dict[int, int] = {}
    for s in steps:
        if s.measured_bytes is None or s.predicted_bytes is None or s.bucket not in bounds:
            continue
        bound = bounds[s.bucket]
        delta = int(s.measured_bytes) - int(s.predicted_bytes)
        out[bound] = max(out.get(bound, delta), delta)
    return out


def replan(
    plan: BucketPlan,
    lengths: np.ndarray,
    cost: SupportsCost,
    calibration: Calibration,
    *,
    measured_peaks: Mapping[int, int] | None = None,
    near: float = 0.9,
) -> tuple[BucketPlan, dict[str, Any]]:
    """A new plan of ``lengths`` from measured figures, and what changed.

    The new plan has the old one's mode, budget and number of buckets, with ``cost`` wrapped in
    the calibration (:class:`~tokenbucket.cost.calibration.CalibratedCostModel`): its step times
    rank the plans, its memory offsets lower the batch sizes where the run measured more than
    predicted. Bounds are multiples of the largest of 64, 32, 16, 8 dividing every old bound.

    Returns:
        the new plan, and ``{"old": [...], "new": [...], "epoch_s": {...}, "near_budget": [...]}``:
        per bucket its bound, batch size, batches and seconds per step; the predicted epoch of
        the old plan as it was planned, of the old plan under the calibration, and of the new
        plan; and the old buckets whose measured peak (``measured_peaks``: bucket -> bytes)
        reached ``near`` x the budget.
    """
    if plan.mode not in ("static", "dynamic"):
        raise ConfigError(f"replan takes a static or dynamic plan, but this one is {plan.mode!r}")
    calibrated = CalibratedCostModel(cost, calibration)
    bounds = [b.bound for b in plan.buckets]
    multiple = next((m for m in (64, 32, 16, 8) if all(u % m == 0 for u in bounds)), 1)
    new = plan_buckets(
        lengths, calibrated, plan.budget_bytes, max_buckets=max(1, len(plan.buckets)), mode=plan.mode,  # type: ignore[arg-type]
        on_oversize="reject", multiple=multiple,
    )  # fmt: skip

    def rows(p: BucketPlan) -> list[dict[str, Any]]:
        return [
            {"bound": b.bound, "batch_size": b.batch_size, "batches": b.batches, "step_s": b.step_seconds}
            for b in p.buckets
        ]

    # without a GPU the old plan ranked by FLOPs at a nominal 1 PFLOP/s: not seconds
    timed = getattr(cost, "gpu", None) is not None or getattr(cost, "step_time", None) is not None
    old_recosted = sum(b.batches * calibrated.step_seconds(b.batch_size, b.bound) for b in plan.buckets)
    peaks = measured_peaks or {}
    near_budget = [
        {"bucket": k, "bound": plan.buckets[k].bound, "measured_bytes": int(v), "of_budget": v / plan.budget_bytes}
        for k, v in sorted(peaks.items())
        if 0 <= k < len(plan.buckets) and v >= near * plan.budget_bytes
    ]
    diff = {
        "old": rows(plan),
        "new": rows(new),
        "epoch_s": {
            "old_as_planned": sum(b.batches * b.step_seconds for b in plan.buckets) if timed else None,
            "old_calibrated": old_recosted,
            "new_calibrated": sum(b.batches * b.step_seconds for b in new.buckets),
        },
        "near_budget": near_budget,
        "near": near,
    }
    return new, diff


def measured_peaks(steps: Sequence[StepRecord]) -> dict[int, int]:
    """The largest measured peak per bucket (buckets without a measurement left out)."""
    out: dict[int, int] = {}
    for s in steps:
        if s.measured_bytes is not None:
            out[s.bucket] = max(out.get(s.bucket, 0), int(s.measured_bytes))
    return out
