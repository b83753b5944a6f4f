"""Bucket planning: memory-safe shape buckets that minimise predicted epoch time.

Input: every sample's ``L_total`` (or a mergeable :class:`LengthHistogram` of them), a cost
model and a memory budget. Output: a :class:`BucketPlan` — sorted bucket upper bounds, a batch
size per bucket (from the cost model's memory at the bound, quadratic attention included), and
per bucket the counts and predictions — plus the oversize samples.

NOTE [ The objective ]
Epoch time = Σ over buckets of ``ceil(n_k / B_k) x step_seconds(B_k, U_k)``, with ``B_k`` the
largest batch whose predicted peak at the bound ``U_k`` fits the budget. Padding (a wide bucket
pays its top length for every sample) and unused memory (a small last batch still pays a full
step) both show up in it, so one objective trades them. Bounds are chosen among candidate
lengths (every distinct length, or a compressed grid of them) by exact dynamic programming:
``best[k][j] = min_i best[k-1][i] + cost(i, j)``, vectorised over ``i`` and ``j``.

Modes: ``static`` — every batch of bucket k is ``(B_k, U_k)``; the last partial batch keeps the
shape with empty rows, so a run sees at most K shapes. ``dynamic`` — batches are padded to their
own longest sample and filled up to the budget; within a bucket samples are drawn in shuffled
pools that are sorted by length before they are cut into batches, so neighbours in a batch have
similar lengths (the prediction simulates exactly that).

Example:
    >>> import numpy as np
    >>> from tokenbucket import CostModel, ModelSpec
    >>> lengths = np.random.default_rng(0).integers(500, 20_000, 10_000)
    >>> plan = plan_buckets(lengths, CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM"),
    ...                     40 * 2**30, max_buckets=8)
    >>> len(plan.buckets) <= 8 and plan.summary()["over_budget_batches"] == 0
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from tokenbucket._exceptions import ConfigError, OversizeError
from tokenbucket.cost.memory import CostModel
from tokenbucket.plan._search import (
    SupportsCost,
    dynamic_batches,
    longest_fitting,
    max_batches_at,
    oversize_record,
    step_cost,
)
from tokenbucket.plan.bucket_plan import PLAN_FORMAT, Bucket, BucketPlan, LengthHistogram, Mode
from tokenbucket.plan.packing import plan_packing

__all__ = [
    "PLAN_FORMAT",
    "Bucket",
    "BucketPlan",
    "LengthHistogram",
    "OversizeError",
    "check_plan",
    "plan_buckets",
    "plan_from_bounds",
]

# -- cost tables -----------------------------------------------------------------------------


def _candidates(hist: LengthHistogram, max_candidates: int, multiple: int) -> np.ndarray:
    """Candidate bounds: every distinct length rounded up to ``multiple``, compressed to at most
    ``max_candidates`` by keeping equal-count quantiles and a geometric grid; the top always stays."""
    rounded = np.unique(-(-hist.values // multiple) * multiple)
    if len(rounded) <= max_candidates:
        return rounded
    half = max_candidates // 2
    cum = np.cumsum(hist.counts)
    qs = np.searchsorted(cum, np.linspace(0, cum[-1], half, endpoint=False)[1:], side="left")
    by_count = -(-hist.values[qs] // multiple) * multiple
    geo = np.geomspace(rounded[0], rounded[-1], half)
    by_length = rounded[np.minimum(np.searchsorted(rounded, geo, side="left"), len(rounded) - 1)]
    return np.unique(np.concatenate([by_count, by_length, rounded[-1:]]))


# -- planning --------------------------------------------------------------------------------


def plan_buckets(
    lengths: Sequence[int] | np.ndarray | LengthHistogram,
    cost_model: SupportsCost,
    budget_bytes: int,
    *,
    max_buckets: int = 32,
    mode: Mode = "static",
    on_oversize: Literal["error", "reject"] = "error",
    multiple: int = 64,
    max_candidates: int = 3000,
    pool_batches: int = 32,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    pack_length: int | None = None,
) -> BucketPlan:
    """Plan at most ``max_buckets`` memory-safe buckets minimising predicted epoch time.

    Args:
        lengths: every sample's ``L_total`` (or their :class:`LengthHistogram`; dynamic mode
            needs the lengths themselves to simulate its batches).
        cost_model: a :class:`~tokenbucket.cost.memory.CostModel` (with a GPU or a calibrated step
            time, times are seconds, NOTE [ Step time ]; without, FLOPs at 1 PFLOP/s).
        budget_bytes: the memory every batch must fit.
        max_buckets: at most this many buckets (static mode: this many shapes).
        mode: ``static``, ``dynamic`` (see the module docstring) or ``packed``
            (:func:`tokenbucket.train.packing.plan_packing`: one row shape, samples packed whole).
        on_oversize: ``error`` (default) or ``reject`` for samples that fit not even alone.
        multiple: bounds are multiples of this (64: tensor-core friendly shapes).
        max_candidates: candidate bounds for the dynamic programme.
        pool_batches: dynamic mode: batches per shuffled, sorted pool.
        seed: dynamic mode: the pool shuffle of the simulation.
        meta: recorded in the plan (model, GPU, ...).
        pack_length: packed mode: the row length (default: chosen by predicted epoch time).

    Raises:
        OversizeError: with ``on_oversize="error"`` when some sample does not fit alone; the
            message says how many, the largest, its bytes against the budget, and what helps.
    """
    if isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 1:
        raise ConfigError(f"max_buckets should be a positive integer, but got max_buckets={max_buckets!r}")
    if mode not in ("static", "dynamic", "packed"):
        raise ConfigError(f"mode should be 'static', 'dynamic' or 'packed', but got mode={mode!r}")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
        raise ConfigError(f"budget_bytes should be a positive integer, but got budget_bytes={budget_bytes!r}")
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ConfigError(f"multiple should be a positive integer, but got multiple={multiple!r}")
    if mode == "packed":
        if isinstance(lengths, LengthHistogram):
            raise ConfigError("packed mode packs the samples themselves: give the lengths, not a histogram")
        if not isinstance(cost_model, CostModel):
            raise ConfigError(
                f"packed mode needs a CostModel (its FLOPs depend on the attention kernel), but got "
                f"cost_model={type(cost_model).__name__}"
            )
        return plan_packing(
            lengths,
            cost_model,
            budget_bytes,
            pack_length=pack_length,
            on_oversize=on_oversize,
            seed=seed,
            multiple=multiple,
            meta=meta,
        )
    if on_oversize not in ("error", "reject"):
        raise ConfigError(f"on_oversize should be 'error' or 'reject', but got on_oversize={on_oversize!r}")
    raw: np.ndarray | None = None
    if isinstance(lengths, LengthHistogram):
        hist = lengths
        if mode == "dynamic":
            raise ConfigError("dynamic mode simulates its batches: give the lengths, not a histogram")
    else:
        raw = np.asarray(lengths, dtype=np.int64)
        hist = LengthHistogram.from_lengths(raw)
    if hist.total == 0:
        raise ConfigError("there are no samples to plan")

    # Oversize: longer than the longest length that fits alone.
    top_fit = longest_fitting(cost_model, int(hist.values[-1]), budget_bytes)
    over = hist.values > top_fit
    oversize: dict[str, int] = {}
    if over.any():
        oversize = oversize_record(
            cost_model,
            int(hist.counts[over].sum()),
            int(hist.values[-1]),
            top_fit,
            budget_bytes,
            on_oversize,
            why="do not fit the budget even alone",
            fix="Fewer frames or cameras, a lower resolution or a larger patch/merge, activation checkpointing, "
            "flash attention, or a bigger GPU would make them fit",
        )
        hist = LengthHistogram(hist.values[~over], hist.counts[~over])
        if raw is not None:
            raw = raw[raw <= top_fit]
        if hist.total == 0:
            return BucketPlan(mode, budget_bytes, (), oversize, dict(meta or {}))

    cands = _candidates(hist, max_candidates, multiple)
    # rounding up to `multiple` must not cross the longest length that fits alone
    cap = longest_fitting(cost_model, int(cands[-1]), budget_bytes)
    cands = np.unique(np.minimum(cands, cap))
    bsz = max_batches_at(cost_model, cands, budget_bytes)
    usable = bsz > 0
    cands, bsz = cands[usable], bsz[usable]
    if not len(cands) or cands[-1] < hist.values[-1]:
        raise AssertionError("the top candidate must cover the longest fitting sample")
    step = np.array([step_cost(cost_model, int(b), int(u)) for b, u in zip(bsz, cands, strict=True)])

    # samples per candidate interval (c_{j-1}, c_j]
    pos = np.searchsorted(cands, hist.values, side="left")
    n_at = np.bincount(pos, weights=hist.counts, minlength=len(cands))
    prefix = np.concatenate([[0.0], np.cumsum(n_at)])
    # NOTE [ The objective ]: exact DP over the candidate bounds
    chosen = _dp(prefix, bsz.astype(np.float64), step, max_buckets)
    bounds = cands[chosen]
    return _describe(mode, bounds, bsz[chosen], hist, raw, cost_model, budget_bytes, oversize, meta, pool_batches, seed)


def _dp(prefix: np.ndarray, bsz: np.ndarray, step: np.ndarray, max_buckets: int) -> np.ndarray:
    """Indices of the chosen candidate bounds (always including the last)."""
    m = len(bsz)
    # cost[i, j]: bucket (c_{i-1}, c_j] for i <= j, i.e. samples prefix[j+1] - prefix[i]
    n = prefix[None, 1:] - prefix[:-1, None]
    cost = np.ceil(np.maximum(n, 0) / bsz[None, :]) * step[None, :]
    cost[np.tril_indices(m, -1)] = np.inf
    best = cost[0].copy()  # one bucket covering (0, c_j]
    back = []
    for _ in range(1, min(max_buckets, m)):
        # new[j] = min_i best[i-1] + cost[i, j] for i >= 1
        totals = best[:-1, None] + cost[1:, :]
        arg = np.argmin(totals, axis=0)
        new = totals[arg, np.arange(m)]
        improved = new < best
        back.append(np.where(improved, arg, -1))
        best = np.where(improved, new, best)
    # walk back from the last candidate
    chosen = [m - 1]
    j = m - 1
    for k in range(len(back) - 1, -1, -1):
        i = back[k][j]
        if i >= 0:
            j = int(i)  # previous bucket ends at candidate i (row i+1 started at i+1)
            chosen.append(j)
    return np.array(sorted(chosen), dtype=np.int64)


def _describe(
    mode: str,
    bounds: np.ndarray,
    batch_sizes: np.ndarray,
    hist: LengthHistogram,
    raw: np.ndarray | None,
    cost: SupportsCost,
    budget: int,
    oversize: dict[str, int],
    meta: dict[str, Any] | None,
    pool_batches: int,
    seed: int,
) -> BucketPlan:
    pos = np.searchsorted(bounds, hist.values, side="left")
    samples = np.bincount(pos, weights=hist.counts, minlength=len(bounds)).astype(np.int64)
    tokens = np.bincount(pos, weights=hist.counts * hist.values, minlength=len(bounds)).astype(np.int64)
    buckets = []
    if mode == "dynamic":
        if raw is None:
            raise AssertionError("dynamic mode needs raw lengths")
        stats = _simulate_dynamic(raw, bounds, cost, budget, pool_batches, seed)
    for k, (u, b) in enumerate(zip(bounds.tolist(), batch_sizes.tolist(), strict=True)):
        peak = int(cost.memory(b, u).total)
        if mode == "static":
            batches = -(-int(samples[k]) // b)
            padded = batches * b * u
            step = step_cost(cost, b, u)
        else:
            batches, padded, seconds = stats[k]
            step = seconds / batches if batches else 0.0
        buckets.append(
            Bucket(
                bound=int(u),
                batch_size=int(b),
                samples=int(samples[k]),
                batches=int(batches),
                tokens=int(tokens[k]),
                padded_tokens=int(padded),
                predicted_peak_bytes=peak,
                fill=peak / budget,
                padding_efficiency=float(tokens[k] / padded) if padded else 1.0,
                step_seconds=float(step),
            )
        )
    return BucketPlan(mode, budget, tuple(b for b in buckets if b.samples), oversize, dict(meta or {}))


def _simulate_dynamic(
    lengths: np.ndarray, bounds: np.ndarray, cost: SupportsCost, budget: int, pool_batches: int, seed: int
) -> list[tuple[int, int, float]]:
    """Per bucket ``(batches, padded tokens, seconds)`` of dynamic batching (see the module
    docstring): shuffled pools, sorted, cut greedily while the batch at its longest fits."""
    rng = np.random.default_rng(seed)
    bucket_of = np.searchsorted(bounds, lengths, side="left")
    out = []
    for k in range(len(bounds)):
        members = lengths[bucket_of == k]
        # NOTE [ Sorted pools ]: simulated as the sampler will cut them
        batches = dynamic_batches(members, cost, budget, pool_batches=pool_batches, rng=rng)
        padded = sum(len(idx) * int(members[idx].max()) for idx in batches)
        seconds = sum(step_cost(cost, len(idx), int(members[idx].max())) for idx in batches)
        out.append((len(batches), padded, seconds))
    return out


def check_plan(
    plan_or_bounds: BucketPlan | Sequence[int],
    batch_sizes: Sequence[int] | None,
    cost_model: SupportsCost,
    budget_bytes: int,
) -> None:
    """Check a hand-made plan (bounds and batch sizes) against the cost model.

    Raises:
        ConfigError: unsorted bounds, mismatched lengths, or a bucket whose batch at its bound is
            predicted over budget (the message names the bucket, its shape and the bytes).
    """
    if isinstance(plan_or_bounds, BucketPlan):
        bounds = plan_or_bounds.bounds.tolist()
        sizes = plan_or_bounds.batch_sizes.tolist()
    else:
        bounds = [int(b) for b in plan_or_bounds]
        sizes = [int(b) for b in (batch_sizes or [])]
    if len(bounds) != len(sizes) or not bounds:
        raise ConfigError(f"a plan needs one batch size per bound, but got {len(bounds)} bounds and {len(sizes)} sizes")
    if any(b2 <= b1 for b1, b2 in itertools.pairwise(bounds)):
        raise ConfigError(f"bounds should be strictly increasing, but got {bounds}")
    for k, (u, b) in enumerate(zip(bounds, sizes, strict=True)):
        if b < 1 or u < 1:
            raise ConfigError(f"bucket {k}: bound and batch size should be positive, but got ({b}, {u})")
        need = int(cost_model.memory(b, u).total)
        if need > budget_bytes:
            fit = cost_model.max_batch(u, budget_bytes)
            raise ConfigError(
                f"bucket {k} (batch {b} x bound {u:,}) is predicted to need {need / 2**30:,.2f} GiB, over the "
                f"budget of {budget_bytes / 2**30:,.2f} GiB; the largest batch that fits at this bound is {fit}"
            )


def plan_from_bounds(
    bounds: Sequence[int],
    batch_sizes: Sequence[int],
    lengths: Sequence[int] | np.ndarray | LengthHistogram,
    cost_model: SupportsCost,
    budget_bytes: int,
    *,
    mode: Mode = "static",
    pool_batches: int = 32,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> BucketPlan:
    """A plan given by hand: :func:`check_plan` first (each bucket's batch at its bound must fit),
    then the same predictions :func:`plan_buckets` makes. Samples above the last bound are
    reported under ``oversize``.

    Example:
        >>> from tokenbucket import CostModel, ModelSpec
        >>> cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
        >>> plan_from_bounds([4096, 16384], [16, 4], [1000, 5000, 9000], cost, 70 * 2**30).summary()["batches"]
        2
    """
    if mode not in ("static", "dynamic"):  # a packed plan is one row shape: plan_buckets(mode="packed")
        raise ConfigError(
            f"plan_from_bounds takes mode 'static' or 'dynamic', but got mode={mode!r} "
            f"(for packing use plan_buckets(mode='packed', pack_length=...))"
        )
    check_plan(bounds, batch_sizes, cost_model, budget_bytes)
    if isinstance(lengths, LengthHistogram):
        hist, raw = lengths, None
        if mode == "dynamic":
            raise ConfigError("dynamic mode simulates its batches: give the lengths, not a histogram")
    else:
        raw = np.asarray(lengths, dtype=np.int64)
        hist = LengthHistogram.from_lengths(raw)
    top = int(bounds[-1])
    over = hist.values > top
    oversize: dict[str, int] = {}
    if over.any():
        largest = int(hist.values[-1])
        oversize = {
            "count": int(hist.counts[over].sum()),
            "largest": largest,
            "largest_bytes": int(cost_model.memory(1, largest).total),
            "longest_fitting": top,
        }
        hist = LengthHistogram(hist.values[~over], hist.counts[~over])
        raw = raw[raw <= top] if raw is not None else None
    return _describe(
        mode,
        np.asarray(bounds, np.int64),
        np.asarray(batch_sizes, np.int64),
        hist,
        raw,
        cost_model,
        budget_bytes,
        oversize,
        meta,
        pool_batches,
        seed,
    )
