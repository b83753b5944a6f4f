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

import contextlib
import hashlib
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from tokenbucket._exceptions import ConfigError
from tokenbucket._progress import progress as progress_bar
from tokenbucket._search import largest_fitting
from tokenbucket.cost.measured import MeasuredCostModel, Profile, ProfiledCostModel, read_profile

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


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """``dtype`` as torch's default while a model is built: under fake tensors ``.to(dtype)``
    cannot swap a parameter, so a model is made in its training dtype from the start."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def fake_safe_to() -> Iterator[None]:
    """``Module.to(dtype)`` (and ``.bfloat16()`` / ``.half()`` / ``.float()``, which call it) that
    works on fake tensors while a model is built.

    NOTE [ .to() under fake tensors ]
    ``Module.to`` converts a parameter by swapping its tensor in place, and a fake tensor cannot be
    swapped (``_apply(): Couldn't swap Embedding.weight``): ``Qwen2ForCausalLM(cfg).to(torch.bfloat16)``
    fails under the profiler. Values do not matter on fake tensors, so here a dtype change replaces
    each floating parameter and buffer by a new fake one of that dtype (a Parameter stays a
    Parameter with its ``requires_grad``); the device is ignored (fake tensors stand for it).
    """
    orig = torch.nn.Module.to

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is None:
            return self
        for module in self.modules():
            tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
            for table in tables:
                for name, t in list(table.items()):
                    if t is None or not t.is_floating_point() or t.dtype == dtype:
                        continue
                    fresh = torch.empty_strided(t.shape, t.stride(), dtype=dtype)
                    table[name] = (
                        torch.nn.Parameter(fresh, t.requires_grad) if isinstance(t, torch.nn.Parameter) else fresh
                    )
        return self

    torch.nn.Module.to = to  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.to = orig  # type: ignore[method-assign]


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


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    """The model on ``make_batch``'s inputs: a dict as keywords, a tuple as positionals, else one input."""
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


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
    fake = any(type(m).__name__ == "FakeTensorMode" for m in _get_current_dispatch_mode_stack())
    with fake_safe_to() if fake else contextlib.nullcontext():  # NOTE [ .to() under fake tensors ]
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
                out = _call(model, inputs)
            del out
            continue
        out = _call(model, inputs)
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


def model_hash(model: torch.nn.Module) -> str:
    """A short hash of a model's structure: module tree, parameter names, shapes and dtypes."""
    h = hashlib.sha256(repr(model).encode())
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
    return h.hexdigest()[:16]


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
