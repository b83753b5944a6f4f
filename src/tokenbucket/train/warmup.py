"""Static-shape warm-up for ``torch.compile``: every bucket's shape compiled once, before training.

A static plan batches bucket ``k`` at exactly ``(batch_size_k, bound_k)`` (the last partial batch
keeps the shape with empty rows), so a run sees at most K shapes. A model compiled with
``dynamic=False`` compiles one graph per shape; :func:`warm_up` runs the train step once per
bucket shape before the real data arrives, so that

* the compile time is paid up front and measured per shape (:class:`WarmupRecord`);
* the shape with the largest predicted peak runs first: a real out-of-memory shows in the first
  minute, not hours into the run when the longest bucket first comes up;
* the training that follows compiles nothing more: :func:`compile_count` before and after a step
  (the monitor records it) stays put, and any recompile it does see is a shape or guard the plan
  did not predict.

:func:`compile_count` is how many frames TorchDynamo has compiled in this process: it reads
``torch._dynamo.utils.counters["frames"]["ok"]``, which grows by one for every frame dynamo
converts (a first compile, each recompile, and each resume function after a graph break). It
does not import dynamo (an import of over a second): a process that never compiled reads 0.

Example (``step`` runs for real; here forward and backward, the gradients dropped after):
    >>> import numpy as np
    >>> from tokenbucket import CostModel, ModelSpec
    >>> from tokenbucket.plan.buckets import plan_buckets
    >>> cost = CostModel(ModelSpec(hidden=32, layers=1, heads=4, precision="fp32", attention="eager"))
    >>> lengths = np.random.default_rng(0).integers(8, 200, 48)
    >>> plan = plan_buckets(lengths, cost, 8 * 2**20, max_buckets=3, multiple=32)
    >>> torch.compiler.reset()  # as a fresh process: no earlier compile of Linear.forward is cached
    >>> model = torch.nn.Linear(32, 32)
    >>> compiled = torch.compile(model, backend="aot_eager", dynamic=False)  # inductor on a GPU
    >>> def step(batch):
    ...     compiled(batch["tokens"]).square().mean().backward()
    ...     model.zero_grad(set_to_none=True)
    >>> def make_batch(batch_size, bound):  # the collate's tensors, at the bucket's shape
    ...     return {"tokens": torch.randn(batch_size, bound, 32)}
    >>> records = warm_up(step, plan, make_batch)
    >>> [r.bucket for r in records] == warmup_order(plan), [r.compiles for r in records]
    (True, [1, 1, 1])
    >>> [r.compiles for r in warm_up(step, plan, make_batch)]  # every shape compiled already
    [0, 0, 0]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar, cast

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan.bucket_plan import BucketPlan

__all__ = ["ORDERS", "WarmupOrder", "WarmupRecord", "compile_count", "warm_up", "warmup_order"]

WarmupOrder = Literal["largest_first", "plan"]
ORDERS: tuple[str, ...] = ("largest_first", "plan")

BatchT = TypeVar("BatchT")

# the module dynamo keeps its counters in; it is in sys.modules once anything was compiled
_DYNAMO_UTILS = "torch._dynamo.utils"


def compile_count() -> int:
    """Frames TorchDynamo has compiled in this process so far: the first compile of each frame,
    every recompile, and each resume function after a graph break.

    Reads ``torch._dynamo.utils.counters["frames"]["ok"]`` (a frame dynamo converted; a frame
    whose compile failed and ran eagerly counts only in ``"total"``, and ``stats.unique_graphs``
    misses a compiled frame without tensor operations). The count only grows, even across
    ``torch._dynamo.reset()``; only clearing the counters themselves sets it back. Dynamo is not
    imported here: before anything is compiled (dynamo not yet loaded) the count is 0.

    Example:
        >>> before = compile_count()
        >>> plus_one = torch.compile(lambda x: x + 1, backend="aot_eager")
        >>> _ = plus_one(torch.ones(2))
        >>> compile_count() - before
        1
    """
    utils = sys.modules.get(_DYNAMO_UTILS)
    counters = getattr(utils, "counters", None)
    if not isinstance(counters, Mapping):
        return 0
    frames = counters.get("frames")
    return int(frames.get("ok", 0)) if isinstance(frames, Mapping) else 0


@dataclass(frozen=True)
class WarmupRecord:
    """One bucket's warm-up step.

    Attributes:
        bucket: the bucket's index in ``plan.buckets`` (increasing bound order).
        batch_size: the rows of its batches.
        bound: the length (tokens) of its batches.
        predicted_peak_bytes: the plan's predicted peak at ``(batch_size, bound)``.
        seconds: wall time of the step (compiling included; CUDA synchronised when in use).
        compiles: frames TorchDynamo compiled during the step (:func:`compile_count`); 0 when
            an earlier step already compiled this shape or nothing is compiled.
    """

    bucket: int
    batch_size: int
    bound: int
    predicted_peak_bytes: int
    seconds: float
    compiles: int
    vision_bound: int | None = None  # a 2D bucket's image-token bound (NOTE [ Two-dimensional buckets ])


def _check_plan(plan: BucketPlan, order: str) -> None:
    if order not in ORDERS:
        raise ConfigError(f"order should be one of {list(ORDERS)}, but got order={order!r}")
    if plan.mode != "static":
        raise ConfigError(
            f"warm_up needs a static plan (every batch one of its buckets' shapes), but got mode={plan.mode!r}; "
            f"plan with mode='static' to warm up, or skip the warm-up and compile with dynamic=True"
        )


def warmup_order(plan: BucketPlan, order: WarmupOrder = "largest_first") -> list[int]:
    """The bucket indices in the order :func:`warm_up` runs them.

    ``"largest_first"``: by predicted peak, largest first (ties: the longer bound first, then
    the plan's order), so the riskiest shape runs first. ``"plan"``: the plan's own order
    (increasing bound).

    Raises:
        ConfigError: a non-static plan, or an order that is neither of the two.
    """
    _check_plan(plan, order)
    indices = list(range(len(plan.buckets)))
    if order == "plan":
        return indices
    return sorted(indices, key=lambda k: (-plan.buckets[k].predicted_peak_bytes, -plan.buckets[k].bound, k))


def _synchronize() -> None:
    """Waits for the GPU's queued work, so a step's time includes it (nothing without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()


def warm_up(
    step: Callable[[BatchT], object],
    plan: BucketPlan,
    make_batch: Callable[[int, int], BatchT] | Callable[[int, int, int], BatchT],
    *,
    order: WarmupOrder = "largest_first",
) -> list[WarmupRecord]:
    """Runs ``step(make_batch(batch_size, bound))`` once per bucket shape of a static plan.

    ``step`` runs for real: pass the train step the run will use, so that the same compiled
    code (the same model, the same guards) is what gets compiled. Best is a step that does the
    forward and backward and drops the gradients without the optimizer update; a step with the
    update makes one update per bucket on dummy data, which a run may accept (or reload the
    weights after). ``make_batch(batch_size, bound)`` builds a batch of that shape with the
    tensors' dtypes, devices and layout exactly as the run's collate hands them over (other
    values are fine: the compiled code guards on shapes and dtypes, not on data).

    The steps run largest predicted peak first (``order="largest_first"``, the default), so an
    out-of-memory happens now and names its bucket (a note on the exception, Python 3.11+), or
    in the plan's bucket order (``order="plan"``).

    Args:
        step: the train step; its return value is ignored.
        plan: a static :class:`~tokenbucket.plan.bucket_plan.BucketPlan`.
        make_batch: ``(batch_size, bound) -> batch``; for a 2D plan ``(batch_size, bound,
            vision_bound) -> batch``, the patch stream padded as the collate pads it (NOTE
            [ Two-dimensional buckets ]).
        order: ``"largest_first"`` or ``"plan"``.

    Returns:
        One :class:`WarmupRecord` per bucket, in the order the steps ran.

    Raises:
        ConfigError: a dynamic or packed plan (its batches have no fixed shapes), or a bad
            ``order``. Whatever ``step`` or ``make_batch`` raises propagates.
    """
    records: list[WarmupRecord] = []
    for k in warmup_order(plan, order):
        bucket = plan.buckets[k]
        if bucket.vision_bound is None:
            batch = cast("Callable[[int, int], BatchT]", make_batch)(bucket.batch_size, bucket.bound)
        else:
            batch = cast("Callable[[int, int, int], BatchT]", make_batch)(
                bucket.batch_size, bucket.bound, bucket.vision_bound
            )
        _synchronize()
        before, start = compile_count(), time.perf_counter()
        try:
            step(batch)
            _synchronize()
        except BaseException as exc:
            if sys.version_info >= (3, 11):
                exc.add_note(
                    f"tokenbucket warm_up: in the step of bucket {k} (batch {bucket.batch_size} x {bucket.bound} "
                    f"tokens, predicted peak {bucket.predicted_peak_bytes:,} bytes)"
                )
            raise
        seconds = time.perf_counter() - start
        del batch
        records.append(
            WarmupRecord(
                bucket=k,
                batch_size=bucket.batch_size,
                bound=bucket.bound,
                predicted_peak_bytes=bucket.predicted_peak_bytes,
                seconds=seconds,
                compiles=compile_count() - before,
                vision_bound=bucket.vision_bound,
            )
        )
    return records
