"""Measured mode: run the user's own model and read its memory, with or without a GPU.

On a CPU, :func:`profile_memory` builds the model under
``torch._subclasses.fake_tensor.FakeTensorMode`` — tensors carry shapes, dtypes and strides but
no data — runs training steps (forward, backward, optimizer step) and tracks the bytes of live
tensor storage, rounded up to 512 B as the CUDA caching allocator rounds, per phase. Seconds per
point, no GPU. On a CUDA device the same call measures ``torch.cuda.max_memory_allocated``.

NOTE [ Fake CPU stands in for CUDA ]
A fake ``cuda`` device aborts the whole process on a CPU-only torch build (it cannot be caught),
so the fake run stays on ``cpu``, and what differs between CPU and CUDA kernels is chosen
explicitly by the model (see ``tokenbucket.cost.reference``): the flash-attention op, autocast's
casts, and AdamW with ``foreach=True`` (the CUDA default).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from tokenbucket._exceptions import ConfigError
from tokenbucket._progress import progress as progress_bar
from tokenbucket._search import largest_fitting
from tokenbucket.cost.gpus import GPU, get_gpu
from tokenbucket.cost.memory import CostModel, FlopsEstimate, MemoryEstimate, _check_shape
from tokenbucket.cost.model import ModelSpec

if TYPE_CHECKING:  # typing_extensions comes with torch; Unpack is in typing from 3.11
    from typing_extensions import Unpack

__all__ = [
    "MeasuredCostModel",
    "MemoryProfile",
    "Profile",
    "ProfiledCostModel",
    "StorageTracker",
    "max_batch_measured",
    "model_hash",
    "profile_memory",
    "profile_points",
    "read_profile",
]

ALLOCATOR_ROUND = 512


def _round(nbytes: int) -> int:
    return -(-nbytes // ALLOCATOR_ROUND) * ALLOCATOR_ROUND


class StorageTracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sums the bytes of live tensor storages created while it is active; keeps the peak.

    Each new storage is counted once (views share it) and uncounted when Python frees it.
    ``phase`` labels what runs now; ``peaks[phase]`` is the highest total seen in it.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live = 0
        self.peak = 0
        self.phase = "setup"
        self.peaks: dict[str, int] = {}
        self._seen: dict[int, weakref.finalize[Any, Any]] = {}

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.peaks[phase] = max(self.peaks.get(phase, 0), self.live)

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.pop(key, None)

    def track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._seen:
            return
        nbytes = _round(storage.nbytes())
        self.live += nbytes
        self._seen[key] = weakref.finalize(storage, self._free, key, nbytes)
        if self.live > self.peak:
            self.peak = self.live
        if self.live > self.peaks.get(self.phase, 0):
            self.peaks[self.phase] = self.live

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.track(item)
        return out


@dataclass(frozen=True)
class MemoryProfile:
    """Measured peaks of one (batch, length) point, in bytes.

    Attributes:
        peaks: per phase (``setup``, ``forward``, ``backward``, ``optimizer``; ``forward`` only
            in inference) the highest live total.
        peak: the highest of them.
        device: ``"fake-cpu"`` or the CUDA device name.
    """

    batch: int
    length: int
    peak: int
    peaks: dict[str, int]
    device: str
    meta: dict[str, Any] = field(default_factory=dict)


ModelFactory = Callable[[], torch.nn.Module]
BatchFactory = Callable[[int, int], Any]


class StepOptions(TypedDict, total=False):
    """What :func:`profile_memory` runs at each point (see its arguments)."""

    train: bool
    optimizer: str
    steps: int
    loss_fn: Callable[[Any], torch.Tensor]


def _default_loss(out: object) -> torch.Tensor:
    tensor = out[0] if isinstance(out, (tuple, list)) else out
    if isinstance(tensor, dict):
        tensor = tensor.get("loss", next(iter(tensor.values())))
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"the model returned {type(tensor).__name__}, not a tensor; pass loss_fn= to reduce it")
    loss: torch.Tensor = tensor.float().mean() if tensor.dim() else tensor.float()
    return loss


def _adopt(model: torch.nn.Module) -> None:
    """Rebind parameters and buffers that belong to another fake mode to the active one.

    NOTE [ deepcopy under FakeTensorMode ]
    ``copy.deepcopy`` of a fake tensor (``nn.TransformerEncoder`` deep-copies its layer) yields
    a tensor bound to a different fake mode, and the first op mixing the two fails. Shapes,
    dtypes and strides are all the profiler needs, so such tensors are replaced by fresh ones.
    """
    modes = [m for m in _get_current_dispatch_mode_stack() if type(m).__name__ == "FakeTensorMode"]
    if not modes:
        return
    mode = modes[-1]
    for module in model.modules():
        tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
        for table in tables:
            for name, tensor in list(table.items()):
                if isinstance(tensor, FakeTensor) and tensor.fake_mode is not mode:
                    fresh = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype)
                    if isinstance(tensor, torch.nn.Parameter):
                        fresh = torch.nn.Parameter(fresh, requires_grad=tensor.requires_grad)
                    table[name] = fresh


def _run_steps(
    model_factory: ModelFactory,
    make_batch: BatchFactory,
    batch: int,
    length: int,
    *,
    train: bool,
    optimizer: str,
    steps: int,
    loss_fn: Callable[[Any], torch.Tensor],
    mark: Callable[[str], None],
) -> None:
    model = model_factory()
    # NOTE [ deepcopy under FakeTensorMode ]: fake tensors from another mode are rebound here
    _adopt(model)
    opt: torch.optim.Optimizer | None = None
    if train and optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    elif train and optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, foreach=True)
    for _ in range(steps if train else 1):
        inputs = make_batch(batch, length)
        mark("forward")
        if not train:
            with torch.no_grad():
                out = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
            del out
            continue
        out = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
        loss = loss_fn(out)
        del out
        mark("backward")
        loss.backward()  # type: ignore[no-untyped-call]
        del loss
        mark("optimizer")
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        del inputs
        mark("idle")


def profile_memory(
    model_factory: ModelFactory,
    make_batch: BatchFactory,
    batch: int,
    length: int,
    *,
    train: bool = True,
    optimizer: str = "adamw",
    steps: int = 2,
    loss_fn: Callable[[Any], torch.Tensor] = _default_loss,
    device: str = "fake",
) -> MemoryProfile:
    """Peak memory of ``steps`` training steps (or one inference forward) at ``(batch, length)``.

    Args:
        model_factory: builds the model (called under the fake mode, or on the CUDA device).
        make_batch: ``(batch, length) -> input`` (a tensor or a tuple of positional inputs).
        train: forward + backward + optimizer step, or an inference forward under ``no_grad``.
        optimizer: ``adamw`` or ``sgd`` (momentum 0.9), both ``foreach=True``; or ``none``.
        steps: training steps (the second one has optimizer states, so its peak is the real one).
        loss_fn: model output → scalar loss (default: mean of the output in fp32).
        device: ``"fake"`` (CPU fake tensors) or ``"cuda"``.
    """

    def run(mark: Callable[[str], None]) -> None:
        _run_steps(
            model_factory,
            make_batch,
            batch,
            length,
            train=train,
            optimizer=optimizer,
            steps=steps,
            loss_fn=loss_fn,
            mark=mark,
        )

    if device == "cuda":
        return _profile_cuda(run, batch, length)
    tracker = StorageTracker()
    # NOTE [ Fake CPU stands in for CUDA ]: fake tensors on cpu, never a fake cuda device
    with FakeTensorMode(), tracker, warnings.catch_warnings():
        # nn.Transformer* layers probe data pointers for their fast path; fake tensors have none
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        run(tracker.set_phase)
    peaks = {k: v for k, v in tracker.peaks.items() if k != "idle"}
    return MemoryProfile(batch, length, tracker.peak, peaks, "fake-cpu")


def _profile_cuda(run: Callable[[Callable[[str], None]], None], batch: int, length: int) -> MemoryProfile:
    """``run(mark)`` on the CUDA device, its peak per phase from ``max_memory_allocated``."""
    peaks: dict[str, int] = {}
    phase = ["setup"]

    def mark(name: str) -> None:
        torch.cuda.synchronize()
        peaks[phase[0]] = max(peaks.get(phase[0], 0), torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        phase[0] = name

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.device("cuda"):
        run(mark)
    mark("idle")
    peaks = {k: v - base for k, v in peaks.items() if k != "idle"}
    return MemoryProfile(batch, length, max(peaks.values()), peaks, torch.cuda.get_device_name())


# -- saved profiles and the measured cost model ------------------------------------------------

PROFILE_FORMAT = 1


def model_hash(model: torch.nn.Module) -> str:
    """A short hash of a model's structure: module tree, parameter names, shapes and dtypes."""
    h = hashlib.sha256(repr(model).encode())
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
    return h.hexdigest()[:16]


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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["points"] = [list(p) for p in self.points]
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
        return cls(points=tuple((p[0], p[1], p[2]) for p in points), **fields_)

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
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{source} is not JSON ({exc})") from None
    return Profile.from_dict(data, source=source), hashlib.sha256(raw).hexdigest()


def profile_points(
    model_factory: ModelFactory,
    make_batch: BatchFactory,
    points: Sequence[tuple[int, int]],
    *,
    target: str = "fake-cpu",
    dtype: str = "bf16",
    device: str = "fake",
    progress: bool | None = None,
    **kwargs: Unpack[StepOptions],
) -> Profile:
    """Measure :func:`profile_memory` at each ``(batch, length)`` and bundle a :class:`Profile`.

    ``progress``: a bar on stderr, one step per point (default: when stderr is a terminal;
    NOTE [ Progress on stderr ]).
    """
    if device == "cuda":
        with torch.device("cuda"):
            digest = model_hash(model_factory())
    else:
        with FakeTensorMode(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            digest = model_hash(model_factory())
    measured = []
    for b, length in progress_bar(points, desc="profiling", unit="points", enabled=progress):
        prof = profile_memory(model_factory, make_batch, b, length, device=device, **kwargs)
        measured.append((b, length, prof.peak))
    dev = "fake-cpu" if device != "cuda" else torch.cuda.get_device_name()
    return Profile(tuple(measured), target, dtype, torch.__version__, digest, dev)


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
        if target is not None and profile.target != "fake-cpu" and _gpu_name(profile.target) != _gpu_name(target):
            raise ConfigError(
                f"{name} was made for {profile.target!r}, not for {target!r}; profile again "
                f"(a fake-cpu profile, made without --gpu, holds for any GPU)"
            )
        if model is not None and profile.model != model:
            raise ConfigError(f"{name} was made for model {profile.model}, not {model}; profile again")
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
        analytic: the analytic model of the same model (its GPU gives step seconds).
        source: how errors name the profile (default ``"the profile"``).
        multiple: the planner's bound multiple: a refusal asks for the length rounded up to it
            (profiling just the longest sample would be refused again at its rounded bound).
    """

    def __init__(
        self, measured: MeasuredCostModel, analytic: CostModel, *, source: str | None = None, multiple: int = 64
    ) -> None:
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
        }


def max_batch_measured(
    model_factory: ModelFactory,
    make_batch: BatchFactory,
    length: int,
    *,
    budget_bytes: int | None = None,
    device: str = "cuda",
    limit: int = 1 << 16,
    **kwargs: Unpack[StepOptions],
) -> int:
    """The largest batch that runs at ``length``: doubling, then bisection.

    On ``cuda`` a batch fits when it runs without ``torch.OutOfMemoryError`` (and, with
    ``budget_bytes``, peaks under it); on ``fake`` when its measured peak is under
    ``budget_bytes`` (required there).
    """
    if device != "cuda" and budget_bytes is None:
        raise ConfigError("max_batch_measured on fake tensors needs budget_bytes")

    def fits(b: int) -> bool:
        try:
            peak = profile_memory(model_factory, make_batch, b, length, device=device, **kwargs).peak
        except torch.OutOfMemoryError:
            if device == "cuda":
                torch.cuda.empty_cache()
            return False
        return budget_bytes is None or peak <= budget_bytes

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    return largest_fitting(fits, lo, hi)
