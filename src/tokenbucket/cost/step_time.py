"""Step time: what one training step costs in seconds, fixed costs and a utilisation curve.

NOTE [ Step time ]
A step's seconds on one rank are::

    seconds = fixed + FLOPs / (peak x u(T)),     u(T) = mfu x min(1, T / T_knee)

with ``T`` the step's padded tokens (rows x length) and ``FLOPs`` its training FLOPs. ``fixed``
is what the step pays whatever its tokens:

* launch: ``kernels x launch_seconds`` (eager PyTorch launches about 40 kernels per block per
  training step, a few microseconds each; assumed, not measured);
* optimizer: the bytes the optimizer step reads and writes (its states twice, the weights it
  updates twice, the gradients once) over the GPU's memory bandwidth;
* communication: the bytes each rank sends in the step's collectives over the GPU's link (DDP's
  ring all-reduce sends ``2 (N-1)/N`` of the gradients; FSDP / ZeRO-3 all-gather the weights
  twice and reduce-scatter the gradients, ``(N-1)/N`` each; ZeRO-2 reduce-scatters the gradients
  and all-gathers the updated weights), counted in full: overlap with compute is left to
  calibration.

``mfu`` (the saturated share of peak) and the link come from the GPU registry, with their
sources (NOTE [ Step-time defaults ]). ``T_knee`` defaults to the GPU's ridge point, peak FLOP/s
over memory bandwidth: the token count below which a bf16 weight matmul is bound by reading its
weights rather than by arithmetic (the roofline, Williams, Waterman & Patterson 2009), so below
it a step's compute time stops shrinking with its tokens. With a fixed cost and the knee, batch
size 1 is no longer free: a plan of many small batches pays ``fixed`` per step, and a step under
the knee pays for tokens it does not have.

Calibration (``tokenbucket calibrate``) fits ``fixed``, the saturated FLOP/s and ``T_knee`` to a
run's log (NOTE [ Calibration fit ]).

Example:
    >>> from tokenbucket.cost.gpus import get_gpu
    >>> st = StepTime.for_gpu(get_gpu("H100-SXM"))
    >>> round(st.knee_tokens)
    295
    >>> parts = st.seconds(6e12, 4096, fixed=FixedCost(optimizer_bytes=0, comm_bytes=0, kernels=0))
    >>> round(parts.total * 1e3, 2)
    15.17
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import GPU

__all__ = ["LAUNCH_SECONDS", "FixedCost", "StepSeconds", "StepTime", "comm_bytes", "optimizer_io_bytes"]

LAUNCH_SECONDS = 4e-6  # per kernel launch (eager PyTorch; assumed)
KERNELS_PER_BLOCK = 40  # forward + backward + optimizer kernels per transformer block (assumed)


@dataclass(frozen=True)
class FixedCost:
    """What one step costs on one rank whatever its tokens: the optimizer's memory traffic, the
    bytes its collectives send, and the kernels it launches."""

    optimizer_bytes: int
    comm_bytes: int
    kernels: int


@dataclass(frozen=True)
class StepSeconds:
    """One step's predicted seconds, itemised (NOTE [ Step time ])."""

    launch: float
    optimizer: float
    communication: float
    compute: float
    utilisation: float

    @property
    def fixed(self) -> float:
        return self.launch + self.optimizer + self.communication

    @property
    def total(self) -> float:
        return self.fixed + self.compute

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "fixed": self.fixed, "total": self.total}


def _number(name: str, value: object, *, low: float, high: float = math.inf, open_low: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} should be a finite number, but got {name}={value!r}")
    if (value <= low if open_low else value < low) or value > high:
        bound = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise ConfigError(f"{name} should be in {bound}, but got {name}={value!r}")
    return float(value)


@dataclass(frozen=True)
class StepTime:
    """The step-time model of NOTE [ Step time ].

    Args:
        peak_flops: FLOP/s the ``mfu`` share is of (the GPU's peak at the model's precision; a
            calibration from a CPU run keeps the nominal 1 PFLOP/s the planner ranks by).
        mfu: the share of ``peak_flops`` a large step reaches, in (0, 1].
        knee_tokens: tokens per step below which utilisation falls in proportion (0: flat).
        bandwidth: memory bytes/s the optimizer's traffic is priced at (0: free).
        link: bytes/s one rank's collectives run at (0: free).
        launch_seconds: seconds per kernel launch.
        fixed_seconds: a measured fixed cost per step that replaces launch + optimizer +
            communication (calibration sets it); ``None`` derives them.
        source: where the numbers come from (the GPU registry, or the run a calibration read).
    """

    peak_flops: float
    mfu: float
    knee_tokens: float
    bandwidth: float = 0.0
    link: float = 0.0
    launch_seconds: float = LAUNCH_SECONDS
    fixed_seconds: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        _number("peak_flops", self.peak_flops, low=0)
        _number("mfu", self.mfu, low=0, high=1)
        for name in ("knee_tokens", "bandwidth", "link", "launch_seconds"):
            _number(name, getattr(self, name), low=0, open_low=False)
        if self.fixed_seconds is not None:
            _number("fixed_seconds", self.fixed_seconds, low=0, open_low=False)

    @classmethod
    def for_gpu(cls, gpu: GPU, *, precision: str = "bf16", mfu: float | None = None) -> StepTime:
        """The registry's defaults for ``gpu`` (NOTE [ Step-time defaults ]); ``mfu`` overrides its
        saturated utilisation."""
        peak = gpu.peak_flops(precision)
        bandwidth = gpu.bandwidth_tbs * 1e12
        return cls(
            peak_flops=peak,
            mfu=gpu.mfu if mfu is None else mfu,
            knee_tokens=peak / bandwidth,
            bandwidth=bandwidth,
            link=gpu.link_gbs * 1e9,
            source=f"{gpu.name}: " + ("--mfu as given" if mfu is not None else gpu.mfu_source),
        )

    def flat(self) -> StepTime:
        """The same peak and ``mfu`` with no fixed cost and no knee: step time proportional to
        FLOPs, as tokenbucket timed steps before NOTE [ Step time ] (for comparisons)."""
        return replace(self, knee_tokens=0.0, fixed_seconds=0.0, source=f"{self.source} (flat)")

    def utilisation(self, tokens: float) -> float:
        """``u(T)``: the share of ``peak_flops`` a step of ``tokens`` padded tokens reaches."""
        if tokens <= 0:
            return self.mfu
        return self.mfu * min(1.0, tokens / self.knee_tokens) if self.knee_tokens else self.mfu

    def seconds(self, flops: float, tokens: float, *, fixed: FixedCost) -> StepSeconds:
        """One step's seconds: ``flops`` training FLOPs over ``tokens`` padded tokens, plus ``fixed``."""
        u = self.utilisation(tokens)
        compute = flops / (self.peak_flops * u)
        if self.fixed_seconds is not None:
            return StepSeconds(self.fixed_seconds, 0.0, 0.0, compute, u)
        return StepSeconds(
            launch=fixed.kernels * self.launch_seconds,
            optimizer=fixed.optimizer_bytes / self.bandwidth if self.bandwidth else 0.0,
            communication=fixed.comm_bytes / self.link if self.link else 0.0,
            compute=compute,
            utilisation=u,
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object], *, source: str = "step time") -> StepTime:
        """The inverse of :meth:`to_dict`; a wrong or missing field is a one-line ConfigError
        naming ``source``."""
        names = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"{source}: unknown step-time field(s) {', '.join(unknown)}")
        try:
            return cls(**data)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None


def optimizer_io_bytes(optimizer_bytes: int, gradient_bytes: int) -> int:
    """Bytes one optimizer step moves on a rank: its states read and written, the weights it
    updates read and written (as many bytes as their gradients), the gradients read."""
    return 2 * optimizer_bytes + 3 * gradient_bytes if optimizer_bytes else 0


def comm_bytes(sharding: str, world_size: int, weight_bytes: int, gradient_bytes: int) -> int:
    """Bytes one rank sends per step in its collectives (NOTE [ Step time ]); ``weight_bytes`` and
    ``gradient_bytes`` are the whole model's (unsharded)."""
    if world_size <= 1 or sharding == "none":
        return 0
    share = (world_size - 1) / world_size
    if sharding == "ddp":
        return int(2 * share * gradient_bytes)
    if sharding in ("fsdp", "zero3"):
        return int(share * (2 * weight_bytes + gradient_bytes))
    if sharding == "zero2":
        return int(share * (weight_bytes + gradient_bytes))
    raise ConfigError(f"sharding should be none, ddp, fsdp, zero2 or zero3, but got sharding={sharding!r}")
