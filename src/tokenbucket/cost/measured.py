"""Measured profiles as plain data: a :class:`Profile` (peaks over a grid of batch shapes, saved
by ``tokenbucket profile --save``), :class:`MeasuredCostModel` (the fit the planner asks), and
:class:`ProfiledCostModel` (the fit's memory with the analytic model's step time).

No torch here: ``tokenbucket plan --profile`` reads a profile without importing it (measuring
one is :mod:`tokenbucket.cost.profile`'s job).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import GPU, get_gpu
from tokenbucket.cost.memory import CostModel, FlopsEstimate, MemoryEstimate, _check_shape
from tokenbucket.cost.model import ModelSpec

__all__ = [
    "PROFILE_FORMAT",
    "MeasuredCostModel",
    "Profile",
    "ProfiledCostModel",
    "SteppedCostModel",
    "read_profile",
]

PROFILE_FORMAT = 1


@dataclass(frozen=True)
class Profile:
    """Measured peaks over a grid of ``(batch, length)`` points, with where they were measured.

    ``target`` is the GPU the profile stands for (``"fake-cpu"`` measures allocations, which
    do not depend on the GPU), ``dtype`` the precision, ``model`` the model's hash; a planner
    refuses a profile made for another target or model.
    """

    points: tuple[tuple[int, int, int], ...]  # (batch, length, peak bytes)
    target: str
    dtype: str
    torch_version: str
    model: str
    device: str
    format: int = PROFILE_FORMAT
    # a staged model's profile: how each length's sample was made ({"vision_share", "image", "steps"})
    staged: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["points"] = [list(p) for p in self.points]
        if self.staged is None:
            del out["staged"]
        return out

    @classmethod
    def from_dict(cls, data: object, *, source: str = "the profile") -> Profile:
        """The profile ``to_dict`` wrote; ``source`` names it in errors (``"profile 'p.json'"``).

        Raises:
            ConfigError: not a JSON object, another format number, a missing key, or a point
                that is not three positive integers ``[batch, length, peak bytes]``.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source} should be a JSON object, but holds a {type(data).__name__}")
        if data.get("format") != PROFILE_FORMAT:
            raise ConfigError(
                f"{source} should be profile format {PROFILE_FORMAT}, but has format={data.get('format')!r} "
                f"(is it a profile saved by `tokenbucket profile --save`?)"
            )
        for key in _PROFILE_KEYS:
            if key not in data:
                raise ConfigError(f"{source} has no {key!r} key (a profile holds {', '.join(_PROFILE_KEYS)})")
        for key in _PROFILE_KEYS[1:]:
            if not isinstance(data[key], str):
                raise ConfigError(f"{source}: {key} should be a string, but got {key}={data[key]!r}")
        points = data["points"]
        if not isinstance(points, list):
            raise ConfigError(f"{source}: points should be a list, but got points={points!r}")
        for i, point in enumerate(points):
            if not (
                isinstance(point, list)
                and len(point) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in point)
            ):
                raise ConfigError(
                    f"{source}: points[{i}] should be [batch, length, peak bytes] of positive integers, "
                    f"but got {point!r}"
                )
        fields_ = {k: data[k] for k in _PROFILE_KEYS[1:]}
        staged = data.get("staged")
        if staged is not None and not (
            isinstance(staged, dict) and isinstance(staged.get("vision_share"), (int, float))
            and (staged.get("image") is None or isinstance(staged.get("image"), list))
        ):  # fmt: skip
            raise ConfigError(f"{source}: staged should be {{vision_share, image, steps}}, but got staged={staged!r}")
        return cls(points=tuple((p[0], p[1], p[2]) for p in points), **fields_, staged=staged)

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (a temporary file, then a rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """The profile saved at ``path`` (see :func:`read_profile`)."""
        return read_profile(path)[0]

    @property
    def lengths(self) -> tuple[int, int]:
        """The shortest and the longest measured length, in tokens."""
        measured = [p[1] for p in self.points]
        return min(measured, default=0), max(measured, default=0)


_PROFILE_KEYS = ("points", "target", "dtype", "torch_version", "model", "device")


def read_profile(path: str | Path, *, source: str | None = None) -> tuple[Profile, str]:
    """The profile saved at ``path`` and the SHA-256 (hex) of the bytes it was read from.

    The bytes are read once, so the hash is that of what was parsed (a plan records it).
    ``source`` names the file in errors (default ``"profile 'PATH'"``).

    Raises:
        ConfigError: the file cannot be read, is not JSON, or is not a profile
            (:meth:`Profile.from_dict`).
    """
    source = source or f"profile {str(path)!r}"
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{source} cannot be read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # (nested too deeply)
        raise ConfigError(f"{source} is not JSON ({exc})") from None
    return Profile.from_dict(data, source=source), hashlib.sha256(raw).hexdigest()


def _gpu_name(name: str) -> str:
    """A GPU target's registry name where it has one (``h100-sxm`` -> ``H100-SXM``), else as given."""
    try:
        return get_gpu(name).name
    except ConfigError:
        return name


class MeasuredCostModel:
    """Answers :class:`~tokenbucket.cost.memory.CostModel`'s memory questions from a :class:`Profile`.

    Peaks are fitted, by least squares over the measured points, to
    ``static + B·(α·L + β·L²)`` — the shape the analytic model has (weights and states, per
    token activations, eager attention's scores) — so any ``(B, L)`` gets an answer; the fit's
    largest relative error on the measured points is ``fit_error``.

    Args:
        profile: the measurements: at least 3 points, at 2 or more lengths (one length cannot
            tell the per-token part from the per-token² part).
        target: the GPU the caller plans for; a profile made for another GPU is refused
            (``fake-cpu`` profiles hold for any target; names match as :func:`get_gpu` matches).
        model: the hash the caller expects (:func:`model_hash`); a different one is refused.
        source: how errors name the profile (default ``"this profile"``).
    """

    def __init__(
        self, profile: Profile, *, target: str | None = None, model: str | None = None, source: str | None = None
    ) -> None:
        name = source or "this profile"
        self._check_made_for(profile, target, model, name)
        if len(profile.points) < 3:
            raise ConfigError(
                f"a measured cost model needs at least 3 points, but {name} has {len(profile.points)}; "
                f"profile again with two or more lengths"
            )
        if len({p[1] for p in profile.points}) < 2:
            raise ConfigError(
                f"a measured cost model needs points at 2 or more lengths, but {name} measured only "
                f"{profile.points[0][1]:,} tokens; profile again with two or more lengths"
            )
        self.profile = profile
        b = np.array([p[0] for p in profile.points], dtype=np.float64)
        length = np.array([p[1] for p in profile.points], dtype=np.float64)
        peak = np.array([p[2] for p in profile.points], dtype=np.float64)
        design = np.stack([np.ones_like(b), b * length, b * length * length], axis=1)
        # relative least squares: every point counts alike, small or large
        coef, *_ = np.linalg.lstsq(design / peak[:, None], np.ones_like(peak), rcond=None)
        self.static, self.per_token, self.per_token_length = (float(c) for c in coef)
        fitted = design @ coef
        self.fit_error = float(np.max(np.abs(fitted / peak - 1)))

    @staticmethod
    def _check_made_for(profile: Profile, target: str | None, model: str | None, name: str) -> None:
        if target is not None and profile.target != "fake-cpu" and _gpu_name(profile.target) != _gpu_name(target):
            raise ConfigError(
                f"{name} was made for {profile.target!r}, not for {target!r}; profile again "
                f"(a fake-cpu profile, made without --gpu, holds for any GPU)"
            )
        if model is not None and profile.model != model:
            raise ConfigError(f"{name} was made for model {profile.model}, not {model}; profile again")

    def memory_bytes(self, batch: int, length: int) -> int:
        return int(self.static + batch * (self.per_token * length + self.per_token_length * length * length))

    def memory(self, batch: int, length: int) -> MemoryEstimate:
        """A :class:`~tokenbucket.cost.memory.MemoryEstimate` from the fit: the static part under
        ``weights`` (weights, gradients and states together), the part linear in ``L`` under
        ``activations``, the quadratic part under ``attention_scores``; phase ``measured``."""
        _check_shape(batch, length)
        items = {
            "weights": int(self.static),
            "activations": int(batch * self.per_token * length),
            "attention_scores": int(batch * self.per_token_length * length * length),
        }
        zero = dict.fromkeys(("gradients", "optimizer", "kv_cache", "transients", "extra"), 0)
        return MemoryEstimate(**items, **zero, total=sum(items.values()), phase="measured", batch=batch, length=length)

    def max_batch(self, length: int, budget_bytes: int) -> int:
        """The largest batch whose fitted peak at ``length`` fits ``budget_bytes`` (0 if none)."""
        per_sample = self.per_token * length + self.per_token_length * length * length
        if per_sample <= 0:
            raise ConfigError("the profile's fit does not grow with the batch; measure more points")
        return max(0, int((budget_bytes - self.static) // per_sample))


class SteppedCostModel:
    """A staged model's profile answered without a fit: affine in the batch at each measured
    length, and a length between two measured ones priced at the longer one.

    NOTE [ A staged profile is a step function ]
    A staged model's worst sample of ``L`` tokens holds whole images (NOTE [ The worst sample of
    a length ]), so its peak steps up where one more image fits, and a smooth fit over a few
    lengths under-prices the lengths just past a step (measured: a fit through 1,024 and 4,608
    tokens put a 960-token bucket 6 % over budget). At one sample shape the peak is exactly
    ``static + B x per_sample``, so each measured length gets that line from its batches, and any
    length up to it borrows it: memory grows with the length, so the next measured length is an
    upper bound. Measure the lengths you want as bucket bounds: the planner's cheapest bounds land
    on them.

    Args:
        profile: at least two batch sizes at every measured length.
        target, model, source: as :class:`MeasuredCostModel`'s.
    """

    def __init__(
        self, profile: Profile, *, target: str | None = None, model: str | None = None, source: str | None = None
    ) -> None:
        name = source or "this profile"
        MeasuredCostModel._check_made_for(profile, target, model, name)
        by_length: dict[int, list[tuple[int, int]]] = {}
        for b, length, peak in profile.points:
            by_length.setdefault(length, []).append((b, peak))
        self.profile = profile
        self.lines: dict[int, tuple[float, float]] = {}
        worst = 0.0
        for length, pts in sorted(by_length.items()):
            if len({b for b, _ in pts}) < 2:
                raise ConfigError(
                    f"{name} measured one batch size at {length:,} tokens; a staged profile needs two or more at "
                    f"every length (profile --save measures batch 1, 2 and --batch)"
                )
            bs = np.array([b for b, _ in pts], dtype=np.float64)
            peaks = np.array([p for _, p in pts], dtype=np.float64)
            slope, static = np.polyfit(bs, peaks, 1)
            if slope <= 0:
                raise ConfigError(f"{name}: the peak at {length:,} tokens does not grow with the batch; profile again")
            self.lines[length] = (float(round(static)), float(round(slope)))  # whole bytes: no float dust
            worst = max(worst, float(np.max(np.abs((static + slope * bs) / peaks - 1))))
        self.fit_error = worst
        self._lengths = sorted(self.lines)

    def _line(self, length: int) -> tuple[float, float]:
        i = int(np.searchsorted(self._lengths, length))
        if i == len(self._lengths):
            raise ConfigError(f"{length:,} tokens is past the profile's longest length, {self._lengths[-1]:,}")
        return self.lines[self._lengths[i]]

    def memory_bytes(self, batch: int, length: int) -> int:
        static, slope = self._line(length)
        return math.ceil(static + batch * slope)

    def memory(self, batch: int, length: int) -> MemoryEstimate:
        """The next measured length's line at ``batch``: ``weights`` its static part, ``activations``
        the per-sample part; phase ``measured``."""
        _check_shape(batch, length)
        static, slope = self._line(length)
        items = {"weights": math.ceil(static), "activations": math.ceil(batch * slope)}
        zero = dict.fromkeys(("attention_scores", "gradients", "optimizer", "kv_cache", "transients", "extra"), 0)
        return MemoryEstimate(**items, **zero, total=sum(items.values()), phase="measured", batch=batch, length=length)

    def max_batch(self, length: int, budget_bytes: int) -> int:
        static, slope = self._line(length)
        return max(0, int((budget_bytes - static) // slope))


class _StepTimes(Protocol):
    """What a profiled plan takes from the analytic model: its GPU, FLOPs and step time."""

    @property
    def gpu(self) -> GPU | None: ...

    def flops(self, batch: int, length: int) -> FlopsEstimate: ...

    def step_seconds(self, batch: int, length: int) -> float: ...


class ProfiledCostModel:
    """Plans from a measured profile: memory and batch sizes from ``measured``, FLOPs and step
    time (what the planner ranks plans by) from ``analytic``. Answers the planner's
    :class:`~tokenbucket.plan._search.SupportsCost`; ``gpu`` and ``model`` are ``analytic``'s.

    NOTE [ A profile is not extrapolated ]
    The fit ``static + B·(α·L + β·L²)`` is exact only where it was measured: past the longest
    measured length the split between the linear and the quadratic term, and any phase whose
    peak overtakes another at long lengths, are guesses, and a plan built on a guess is no
    longer memory-safe. So a length past the longest measured one is refused (a ConfigError that
    names the measured range and the length asked), not answered: profiling that length once
    costs seconds, an OOM hours in costs the run. Shorter lengths are answered; the static part
    anchors them.

    Args:
        measured: the profile's fit.
        analytic: the analytic model of the same model (its GPU gives step seconds): a
            :class:`~tokenbucket.cost.memory.CostModel`, or a staged model's
            :class:`~tokenbucket.cost.staged_length.StagedLengthModel`.
        source: how errors name the profile (default ``"the profile"``).
        multiple: the planner's bound multiple: a refusal asks for the length rounded up to it
            (profiling just the longest sample would be refused again at its rounded bound).
    """

    def __init__(
        self, measured: MeasuredCostModel | SteppedCostModel, analytic: _StepTimes, *, source: str | None = None,
        multiple: int = 64,
    ) -> None:  # fmt: skip
        self.measured = measured
        self.analytic = analytic
        self.source = source or "the profile"
        self.multiple = multiple
        self.max_length = measured.profile.lengths[1]

    @property
    def gpu(self) -> GPU | None:
        return self.analytic.gpu

    @property
    def model(self) -> ModelSpec:
        if not isinstance(self.analytic, CostModel):  # a staged model: a manifest records it from meta
            raise AttributeError("a staged model's profiled plan has no block ModelSpec")
        return self.analytic.model

    def _check_length(self, length: int) -> None:
        if length > self.max_length:  # NOTE [ A profile is not extrapolated ]
            low, high = self.measured.profile.lengths
            rounded = -(-length // self.multiple) * self.multiple
            raise ConfigError(
                f"{self.source} measured lengths {low:,}..{high:,} tokens, but the plan needs {length:,}; "
                f"its fit is not extrapolated: profile again up to a length of {rounded:,} or more (bounds are "
                f"rounded up to multiples of {self.multiple})"
            )

    def memory(self, batch: int, length: int) -> MemoryEstimate:
        self._check_length(length)
        return self.measured.memory(batch, length)

    def max_batch(self, length: int, budget_bytes: int) -> int:
        self._check_length(length)
        return self.measured.max_batch(length, budget_bytes)

    def flops(self, batch: int, length: int) -> FlopsEstimate:
        return self.analytic.flops(batch, length)

    def step_seconds(self, batch: int, length: int) -> float:
        return self.analytic.step_seconds(batch, length)

    def record(self, sha256: str) -> dict[str, object]:
        """What a manifest records about the profile it was planned from (JSON-ready)."""
        prof = self.measured.profile
        return {
            "sha256": sha256,
            "model": prof.model,
            "target": prof.target,
            "dtype": prof.dtype,
            "torch_version": prof.torch_version,
            "device": prof.device,
            "points": len(prof.points),
            "lengths": list(prof.lengths),
            "fit_error": self.measured.fit_error,
            **({"staged": prof.staged} if prof.staged is not None else {}),
        }
