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
from tokenbucket.cost.calibration import Calibration, fit_step_time
from tokenbucket.cost.step_time import FixedCost
from tokenbucket.monitor.report import RunLog, read_events

__all__ = ["StepRecord", "calibrate_log", "calibrate_steps", "step_records"]


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
    """The log's steps, in order."""
    return [
        StepRecord(
            int(e["bucket"]), int(e["rows"]), int(e["length"]), float(e["latency_s"]),
            e.get("flops"), e.get("predicted_s"), e.get("predicted_bytes"), e.get("measured_bytes"),
        )  # fmt: skip
        for e in log.of("step")
    ]


def calibrate_log(path: str | Path) -> Calibration:
    """Read a monitor log and fit it (:func:`calibrate_steps`); the file's problems are one-line
    ConfigErrors naming it."""
    log = read_events(path)
    starts = log.of("start")
    if not starts:
        raise ConfigError(f"run log {str(path)!r} has no start event; is it a tokenbucket monitor log?")
    start = starts[-1]
    bounds = {int(b["bucket"]): int(b["bound"]) for b in start.get("buckets", [])}
    step_time = start.get("step_time")
    peak = step_time.get("peak_flops") if isinstance(step_time, dict) else None
    steps = step_records(log)
    if not steps:
        raise ConfigError(f"run log {str(path)!r} has no step events to calibrate from")
    if all(s.flops is None for s in steps):
        raise ConfigError(
            f"run log {str(path)!r}: its steps carry no FLOPs; give the BucketMonitor a cost model "
            "(cost_model=...) so each step records its FLOPs"
        )
    return calibrate_steps(steps, bounds=bounds, peak_flops=peak, source=str(path))


def calibrate_steps(
    steps: Sequence[StepRecord], *, bounds: Mapping[int, int], peak_flops: float | None = None, source: str = ""
) -> Calibration:
    """Fit the step-time model and memory offsets to ``steps`` (NOTE [ Calibration fit ]).

    Args:
        steps: measured steps (those without FLOPs are left out of the time fit).
        bounds: each bucket's bound (the offsets are keyed by it).
        peak_flops: the run's GPU peak (``None``: a CPU run).
        source: recorded in the result.
    """
    seen: set[tuple[int, int]] = set()
    used: list[StepRecord] = []
    for s in steps:
        shape = (s.rows, s.length)
        if shape not in seen:  # the first step of a shape pays its warm-up
            seen.add(shape)
            continue
        if s.flops is not None and s.seconds > 0:
            used.append(s)
    if not used:
        raise ConfigError(f"{source or 'the run'}: no step with FLOPs after each shape's first; run longer")
    seconds = np.array([s.seconds for s in used])
    flops = np.array([float(s.flops or 0) for s in used])
    tokens = np.array([s.rows * s.length for s in used], dtype=np.float64)
    st = fit_step_time(seconds, flops, tokens, peak_flops=peak_flops, source=source)
    # the old model's form, step time = k x FLOPs, with its best k (relative least squares)
    ratio = flops / seconds
    k = float(ratio.sum() / (ratio**2).sum())
    none = FixedCost(0, 0, 0)
    rows: list[dict[str, Any]] = []
    for bucket in sorted({s.bucket for s in used}):
        mine = [s for s in used if s.bucket == bucket]
        measured = float(np.mean([s.seconds for s in mine]))
        after = float(np.mean([st.seconds(float(s.flops or 0), s.rows * s.length, fixed=none).total for s in mine]))
        flat = float(np.mean([k * float(s.flops or 0) for s in mine]))
        before = [s.predicted_s for s in mine if s.predicted_s is not None]
        rows.append(
            {
                "bucket": bucket,
                "bound": bounds.get(bucket),
                "steps": len(mine),
                "measured_s": measured,
                "planned_s": float(np.mean(before)) if before else None,
                "flops_only_s": flat,
                "calibrated_s": after,
            }
        )
    stats = {
        "steps_used": len(used),
        "steps_skipped": len(steps) - len(used),
        "buckets": rows,
        "error_planned": _mean_error(rows, "planned_s"),
        "error_flops_only": _mean_error(rows, "flops_only_s"),
        "error_calibrated": _mean_error(rows, "calibrated_s"),
    }
    return Calibration(st, _offsets(steps, bounds), source, stats)


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
