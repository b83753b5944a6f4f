"""Calibration: a run's measured step times and peaks, turned into a file ``plan`` takes.

:func:`fit_step_time` fits NOTE [ Step time ]'s fixed cost, saturated FLOP/s and ``T_knee`` to
measured steps; :class:`Calibration` holds that fit and per-bucket memory offsets (measured peak
minus predicted) and is saved as JSON; :class:`CalibratedCostModel` wraps any cost model the
planner takes with them. ``tokenbucket calibrate RUN.jsonl`` makes the file from a monitor log.

NOTE [ Calibration fit ]
``seconds = F + a x FLOPs x max(1, T_knee / T)`` (NOTE [ Step time ], ``a = 1 / (peak x mfu)``) is
linear in ``(F, a)`` once ``T_knee`` is fixed, so the fit is least squares at each candidate knee
(none, every distinct ``T`` in the log, then a golden-section search between the best one's
neighbours), keeping the knee with the least error. Each step is weighted by the inverse of its
time (relative errors: a 10 ms step counts as much as a 10 s one), then once more without the
steps more than three robust standard deviations (and 2 %) off (a step slowed by a garbage
collection or a neighbour on the machine). ``F < 0`` is refitted as 0;
``a <= 0`` means the times do not grow with FLOPs and nothing is fitted. A log whose steps all
lie above the knee cannot place it (any knee below its smallest step fits as well): the fit
keeps ``prior_knee`` (the run's own model's) capped at that smallest step, and says so in
``knee_found``. The first step of every shape is left out (it pays compilation, autotuning and
the allocator's first requests). ``mfu`` is ``1 / (a x peak)`` with the log's peak FLOP/s, or the
nominal 1 PFLOP/s the planner ranks by when the run had none (a CPU).

Memory offsets are applied only where the run measured more than predicted (a positive offset
lowers that bucket's batch size); a negative one is reported, not used: one run's slack is no
promise for a larger batch.

Example:
    >>> import numpy as np
    >>> tokens = np.array([128, 256, 512, 1024, 4096, 8192]); flops = 2e9 * tokens
    >>> truth = StepTime(peak_flops=1e14, mfu=0.5, knee_tokens=700, fixed_seconds=0.01)
    >>> fixed = FixedCost(0, 0, 0)
    >>> seconds = np.array([truth.seconds(f, t, fixed=fixed).total for f, t in zip(flops, tokens)])
    >>> fit, found = fit_step_time(seconds, flops, tokens, peak_flops=1e14)
    >>> round(fit.fixed_seconds, 4), round(fit.mfu, 3), round(fit.knee_tokens), found
    (0.01, 0.5, 700, True)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import GPU
from tokenbucket.cost.memory import FlopsEstimate
from tokenbucket.cost.step_time import FixedCost, StepSeconds, StepTime

__all__ = ["CALIBRATION_FORMAT", "CalibratedCostModel", "Calibration", "fit_step_time", "load_calibration"]

CALIBRATION_FORMAT = "tokenbucket-calibration/1"
NOMINAL_PEAK = 1e15  # what the planner ranks by without a GPU (plan._search.step_cost)


def fit_step_time(
    seconds: np.ndarray,
    flops: np.ndarray,
    tokens: np.ndarray,
    *,
    peak_flops: float | None = None,
    prior_knee: float = 0.0,
    source: str = "",
) -> tuple[StepTime, bool]:
    """The step-time model that best explains measured steps (NOTE [ Calibration fit ]), and
    whether the log placed the knee.

    Args:
        seconds, flops, tokens: per step, its measured seconds, training FLOPs and padded tokens.
        peak_flops: the GPU's peak the run's ``mfu`` is a share of (``None``: 1 PFLOP/s).
        prior_knee: the knee to keep (capped at the smallest step) when the log cannot place it.
        source: recorded in the result.
    """
    t = np.asarray(seconds, dtype=np.float64)
    f = np.asarray(flops, dtype=np.float64)
    n = np.asarray(tokens, dtype=np.float64)
    ok = (t > 0) & (f > 0) & (n > 0)
    t, f, n = t[ok], f[ok], n[ok]
    if len(np.unique(f)) < 2:
        raise ConfigError(
            f"calibration needs steps of at least two shapes with different FLOPs, but got {len(np.unique(f))}"
        )

    fixed, a, knee = _fit(t, f, n)
    # one refit without the outliers (a step slowed by a collection, a neighbour, a checkpoint)
    rel = (fixed + a * f * np.maximum(1.0, knee / n)) / t - 1 if knee else (fixed + a * f) / t - 1
    spread = max(3 * 1.4826 * float(np.median(np.abs(rel - np.median(rel)))), 0.02)
    keep = np.abs(rel - np.median(rel)) <= spread
    if keep.sum() >= 3 and not keep.all() and len(np.unique(f[keep])) >= 2:
        t, f, n = t[keep], f[keep], n[keep]
        fixed, a, knee = _fit(t, f, n)
    found = knee > float(n.min())
    if not found:
        knee = min(float(prior_knee), float(n.min()))
    if a <= 0:
        raise ConfigError("the measured step times do not grow with the steps' FLOPs; nothing to calibrate")
    peak = NOMINAL_PEAK if peak_flops is None else float(peak_flops)
    mfu = 1.0 / (a * peak)
    if mfu > 1:  # a run faster than the peak it names: keep the throughput, raise the peak
        peak, mfu = 1.0 / a, 1.0
    return StepTime(peak_flops=peak, mfu=mfu, knee_tokens=knee, fixed_seconds=fixed, source=source), found


def _fit(t: np.ndarray, f: np.ndarray, n: np.ndarray) -> tuple[float, float, float]:
    """``(fixed, a, knee)`` of least relative squared error (NOTE [ Calibration fit ])."""

    def solve(knee: float) -> tuple[float, float, float]:
        g = f * np.maximum(1.0, knee / n)
        design = np.stack([np.ones_like(t), g], axis=1) / t[:, None]
        scale = np.linalg.norm(design, axis=0)  # FLOPs are ~1e12 x the ones column: scale, then solve
        solved, *_ = np.linalg.lstsq(design / scale, np.ones_like(t), rcond=None)
        fixed, a = solved / scale
        if fixed < 0:  # no measurable fixed cost
            fixed, a = 0.0, float((g / t).sum() / ((g / t) ** 2).sum())
        residual = float((((fixed + a * g) / t - 1) ** 2).sum())
        return residual, float(fixed), float(a)

    candidates = np.unique(n)
    fits = [(solve(0.0), 0.0)] + [(solve(float(k)), float(k)) for k in candidates]
    (best, knee) = min(fits, key=lambda x: x[0][0])
    where = int(np.searchsorted(candidates, knee))
    if knee > 0:  # golden section between the neighbours of the best candidate
        lo = float(candidates[where - 1]) if where > 0 else 0.0
        hi = float(candidates[where + 1]) if where + 1 < len(candidates) else knee
        ratio = (5**0.5 - 1) / 2
        for _ in range(40):
            x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
            if solve(x1)[0] <= solve(x2)[0]:
                hi = x2
            else:
                lo = x1
        mid = (lo + hi) / 2
        if solve(mid)[0] < best[0]:
            best, knee = solve(mid), mid
    _, fixed, a = best
    return fixed, a, knee


@dataclass(frozen=True)
class Calibration:
    """A run's fit: its step-time model and per-bucket memory offsets (NOTE [ Calibration fit ]).

    Args:
        step_time: the fitted model (``fixed_seconds`` set).
        memory_offsets: ``{bound: measured - predicted bytes}`` per bucket bound the run measured.
        source: the log it came from.
        stats: how well it fits (steps used, per-bucket errors before and after), for people.
    """

    step_time: StepTime
    memory_offsets: dict[int, int] = field(default_factory=dict)
    source: str = ""
    stats: dict[str, Any] = field(default_factory=dict)

    def offset(self, length: int) -> int:
        """Bytes to add to a predicted peak at ``length``: the largest positive offset among the
        measured bounds at or above it (the longest bound's beyond them)."""
        if not self.memory_offsets:
            return 0
        bounds = sorted(self.memory_offsets)
        above = [self.memory_offsets[b] for b in bounds if b >= length] or [self.memory_offsets[bounds[-1]]]
        return max(0, max(above))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CALIBRATION_FORMAT,
            "step_time": self.step_time.to_dict(),
            "memory_offsets": {str(k): v for k, v in sorted(self.memory_offsets.items())},
            "source": self.source,
            "stats": self.stats,
        }

    @classmethod
    def from_dict(cls, data: object, *, source: str = "calibration") -> Calibration:
        if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
            raise ConfigError(f"{source} is not a tokenbucket calibration (format {CALIBRATION_FORMAT!r})")
        step = data.get("step_time")
        if not isinstance(step, dict):
            raise ConfigError(f"{source}: step_time should be an object, but got {step!r}")
        st = StepTime.from_dict(step, source=source)
        if st.fixed_seconds is None:
            raise ConfigError(f"{source}: step_time.fixed_seconds is missing (a calibration fits it)")
        raw = data.get("memory_offsets", {})
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: memory_offsets should be an object, but got {raw!r}")
        offsets: dict[int, int] = {}
        for k, v in raw.items():
            if not str(k).isdigit() or int(k) < 1 or isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{source}: memory_offsets[{k!r}] should map a bound to bytes, but got {v!r}")
            offsets[int(k)] = v
        stats = data.get("stats", {})
        return cls(st, offsets, str(data.get("source", "")), stats if isinstance(stats, dict) else {})

    def save(self, path: str | Path) -> None:
        """Write JSON atomically; an existing file is replaced only if it is a calibration."""
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"{str(path)!r} is a directory; give a file name for the calibration")
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                old = None
            if not (isinstance(old, dict) and old.get("format") == CALIBRATION_FORMAT):
                raise ConfigError(f"{str(path)!r} exists and is not a calibration; give a new file name")
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ConfigError(f"calibration {str(path)!r} cannot be written: {exc.strerror or exc}") from None


def load_calibration(path: str | Path) -> Calibration:
    """The calibration saved at ``path``; a one-line ConfigError naming the file otherwise."""
    source = f"calibration {str(path)!r}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{source} cannot be read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # (nested too deeply)
        raise ConfigError(f"{source} is not JSON ({exc})") from None
    return Calibration.from_dict(data, source=source)


@dataclass(frozen=True)
class _Total:
    total: int
    phase: str = "calibrated"


class CalibratedCostModel:
    """Any cost model the planner takes, with a calibration's step time and memory offsets.

    ``memory`` adds the offset at the length; ``max_batch`` plans under the budget less it;
    ``step_seconds`` is the fitted model over the wrapped model's FLOPs (NOTE [ Calibration fit ]).
    ``gpu`` and ``model`` are the wrapped model's.
    """

    def __init__(self, cost: Any, calibration: Calibration) -> None:
        if not hasattr(cost, "flops") or not hasattr(cost, "max_batch"):
            raise ConfigError(f"cost should be a cost model with flops and max_batch, but got {type(cost).__name__}")
        self.cost, self.calibration = cost, calibration
        self.step_time = calibration.step_time

    def __repr__(self) -> str:
        return f"CalibratedCostModel({self.cost!r}, source={self.calibration.source!r})"

    @property
    def gpu(self) -> GPU | None:
        return getattr(self.cost, "gpu", None)

    @property
    def model(self) -> Any:
        return self.cost.model

    def memory(self, batch: int, length: int) -> _Total:
        return _Total(int(self.cost.memory(batch, length).total) + self.calibration.offset(length))

    def max_batch(self, length: int, budget_bytes: int) -> int:
        return int(self.cost.max_batch(length, budget_bytes - self.calibration.offset(length)))

    def flops(self, batch: int, length: int) -> FlopsEstimate:
        flops: FlopsEstimate = self.cost.flops(batch, length)
        return flops

    def step_time_parts(self, batch: int, length: int) -> StepSeconds:
        return self.step_time.seconds(self.flops(batch, length).training, batch * length, fixed=FixedCost(0, 0, 0))

    def step_seconds(self, batch: int, length: int) -> float:
        return self.step_time_parts(batch, length).total
