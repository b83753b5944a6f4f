"""Cutting samples into batches under a memory budget (shared by the planner's simulation and
the samplers, so what the plan predicts is what training gets)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from tokenbucket._exceptions import OversizeError
from tokenbucket._search import largest_fitting


def max_batches_at(cost: PredictsMemory, bounds: np.ndarray, budget: int) -> np.ndarray:
    """Largest batch at each (ascending) bound. Memory grows with length, so the largest batch
    shrinks: start each search from the previous answer (one or two checks per bound)."""
    out = np.zeros(len(bounds), dtype=np.int64)
    prev: int | None = None
    for i, bound in enumerate(bounds.tolist()):
        if prev is None:
            prev = cost.max_batch(bound, budget)
        elif prev > 0 and cost.memory(prev, bound).total > budget:

            def fits(batch: int, length: int = bound) -> bool:
                return bool(cost.memory(batch, length).total <= budget)

            prev = largest_fitting(fits, 0, prev)  # fits(0) stands as the floor, not fits(prev)
        out[i] = prev
    return out


def max_batch_table(cost: PredictsMemory, lengths: np.ndarray, budget: int) -> np.ndarray:
    """The largest batch at each length, via :func:`max_batches_at` over the distinct ones."""
    values, inverse = np.unique(lengths, return_inverse=True)
    return max_batches_at(cost, values, budget)[inverse]


class OversizeSampleError(OversizeError):
    """A sample (position ``position`` of the lengths given) that fits not even alone."""

    def __init__(self, position: int, length: int, message: str | None = None) -> None:
        super().__init__(message or f"a sample of {length:,} tokens fits not even alone")
        self.position, self.length = position, length


def dynamic_batches(
    lengths: np.ndarray, cost: PredictsMemory, budget: int, *, pool_batches: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Indices into ``lengths`` cut into batches padded to their own longest sample.

    NOTE [ Sorted pools ]
    Samples are shuffled, taken ``pool_batches`` batches' worth at a time, sorted by length
    within the pool and cut greedily: a batch grows while the batch at its longest member still
    fits. Neighbours in a batch then have similar lengths (little padding), while the pool
    boundaries keep the order random from epoch to epoch.
    """
    n = len(lengths)
    if n == 0:
        return []
    caps = max_batch_table(cost, lengths, budget)
    if not caps.min(initial=1):  # a sample that fits not even alone would make an empty batch
        i = int(np.argmin(caps))
        raise OversizeSampleError(i, int(lengths[i]))
    typical = max(1, int(np.median(caps)))
    pool = max(1, pool_batches * typical)
    order = rng.permutation(n)
    batches: list[np.ndarray] = []
    for start in range(0, n, pool):
        chunk = order[start : start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        chunk_caps = caps[chunk].tolist()
        begin = 0
        for i in range(len(chunk)):
            # sorted ascending: sample i is the longest so far, its cap bounds the batch
            if i + 1 - begin > chunk_caps[i]:
                batches.append(chunk[begin:i])
                begin = i
        batches.append(chunk[begin:])
    return batches


# -- what the planner asks a cost model ---------------------------------------------------


class MemoryTotal(Protocol):
    """A predicted peak: ``total`` bytes (``CostModel.memory`` returns a ``MemoryEstimate``)."""

    @property
    def total(self) -> float: ...


class PredictsMemory(Protocol):
    """What batching, risk checks and the monitor ask a cost model: a peak and the largest batch
    under a budget (``CostModel`` and ``MeasuredCostModel`` answer it)."""

    def memory(self, batch: int, length: int) -> MemoryTotal: ...

    def max_batch(self, length: int, budget_bytes: int) -> int: ...


class SupportsCost(PredictsMemory, Protocol):
    """What the planner asks a cost model: memory, and the step time it ranks plans by."""

    def flops(self, batch: int, length: int) -> Any: ...

    def step_seconds(self, batch: int, length: int) -> float: ...


def step_cost(cost: SupportsCost, batch: int, length: int) -> float:
    """Seconds per step (NOTE [ Step time ]); without a GPU or a calibrated step time, training
    FLOPs at 1 PFLOP/s (a ranking by FLOPs alone)."""
    if getattr(cost, "gpu", None) is not None or getattr(cost, "step_time", None) is not None:
        return float(cost.step_seconds(batch, length))
    return float(cost.flops(batch, length).training) / 1e15


def longest_fitting(cost: PredictsMemory, longest: int, budget: int) -> int:
    """The longest length up to ``longest`` whose one-sample batch fits ``budget`` (0 if none)."""
    if cost.memory(1, longest).total <= budget:
        return longest
    return largest_fitting(lambda n: bool(cost.memory(1, n).total <= budget), 0, longest)


def oversize_record(
    cost: PredictsMemory, count: int, largest: int, longest: int, budget: int, on_oversize: str, *, why: str, fix: str
) -> dict[str, int]:
    """The one oversize check: ``count`` samples (the largest of ``largest`` tokens) are longer than
    ``longest``, the most that fits. With ``on_oversize="error"`` an OversizeError says how many,
    what the largest needs against the budget (``why`` says what the limit is) and ``fix``;
    else the record a plan keeps (``BucketPlan.oversize``).
    """
    need = int(cost.memory(1, largest).total)
    if on_oversize == "error":
        raise OversizeError(
            f"{count:,} sample(s) {why}: the largest has {largest:,} tokens and needs {need / 2**30:,.2f} GiB "
            f"against a budget of {budget / 2**30:,.2f} GiB (the longest that fits is {longest:,} tokens). {fix}; "
            f"or pass {OversizeError.REJECT} to plan without them"
        )
    return {"count": count, "largest": largest, "largest_bytes": need, "longest_fitting": int(longest)}
