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
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from tokenbucket._batching import dynamic_batches, max_batches_at
from tokenbucket._exceptions import ConfigError, TokenbucketError

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

PLAN_FORMAT = 1
Mode = Literal["static", "dynamic", "packed"]


class OversizeError(TokenbucketError, ValueError):
    """Samples that do not fit the budget even alone (with ``on_oversize="error"``)."""


class SupportsCost(Protocol):
    """What the planner asks a cost model (``CostModel`` and friends answer it)."""

    def memory(self, batch: int, length: int) -> Any: ...

    def max_batch(self, length: int, budget_bytes: int) -> int: ...


# -- lengths ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthHistogram:
    """Exact counts per distinct length; merging two is exact, so parts plan like the whole.

    Example:
        >>> a = LengthHistogram.from_lengths([5, 7, 7])
        >>> b = LengthHistogram.from_lengths([7, 9])
        >>> a.merge(b) == LengthHistogram.from_lengths([5, 7, 7, 7, 9])
        True
    """

    values: np.ndarray  # sorted distinct lengths (int64)
    counts: np.ndarray  # samples per length (int64)

    def __post_init__(self) -> None:
        # histograms come from other engines too (a group-by is unordered): sort, merge, drop empties
        values = np.asarray(self.values, dtype=np.int64).reshape(-1)
        counts = np.asarray(self.counts, dtype=np.int64).reshape(-1)
        if len(values) != len(counts):
            raise ConfigError(f"a length histogram needs one count per value, but got {len(values)} values "
                              f"and {len(counts)} counts")
        if counts.size and counts.min() < 0:
            bad = int(np.flatnonzero(counts < 0)[0])
            raise ConfigError(f"counts should not be negative, but got counts[{bad}]={int(counts[bad])}")
        used = counts > 0
        if used.any() and values[used].min() < 1:
            bad = int(np.flatnonzero(used & (values < 1))[0])
            raise ConfigError(f"lengths should be positive, but got values[{bad}]={int(values[bad])}")
        if not (used.all() and (values.size < 2 or bool((np.diff(values) > 0).all()))):
            merged, inverse = np.unique(values[used], return_inverse=True)
            counts = np.bincount(inverse, weights=counts[used], minlength=len(merged)).astype(np.int64)
            values = merged.astype(np.int64)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "counts", counts)

    @classmethod
    def from_lengths(cls, lengths: Iterable[int] | np.ndarray) -> LengthHistogram:
        arr = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths), dtype=np.int64)
        if arr.size and arr.min() < 1:
            bad = int(np.flatnonzero(arr < 1)[0])
            raise ConfigError(f"lengths should be positive, but got lengths[{bad}]={int(arr[bad])}")
        values, counts = np.unique(arr, return_counts=True)
        return cls(values.astype(np.int64), counts.astype(np.int64))

    def merge(self, other: LengthHistogram) -> LengthHistogram:
        values = np.concatenate([self.values, other.values])
        counts = np.concatenate([self.counts, other.counts])
        merged, inverse = np.unique(values, return_inverse=True)
        return LengthHistogram(merged, np.bincount(inverse, weights=counts, minlength=len(merged)).astype(np.int64))

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, LengthHistogram) and np.array_equal(self.values, other.values)
                and np.array_equal(self.counts, other.counts))

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, list[int]]:
        return {"values": self.values.tolist(), "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, list[int]]) -> LengthHistogram:
        return cls(np.asarray(data["values"], np.int64), np.asarray(data["counts"], np.int64))


# -- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """One bucket: samples with ``lower < L_total <= bound``, batched ``batch_size`` at a time.

    ``predicted_peak_bytes`` is at ``(batch_size, bound)``; ``fill`` is that over the budget;
    ``padding_efficiency`` is real tokens over the tokens the batches carry (static: every
    batch at ``(batch_size, bound)``; dynamic: each batch at its own longest sample).
    """

    bound: int
    batch_size: int
    samples: int
    batches: int
    tokens: int
    padded_tokens: int
    predicted_peak_bytes: int
    fill: float
    padding_efficiency: float
    step_seconds: float

    @property
    def seconds(self) -> float:
        return self.batches * self.step_seconds


@dataclass(frozen=True)
class BucketPlan:
    """Sorted bucket bounds with their batch sizes and predictions; serialisable.

    Attributes:
        mode: ``static`` or ``dynamic``.
        budget_bytes: the memory budget every batch was checked against.
        buckets: in increasing bound order.
        oversize: count, largest length and its predicted bytes alone, of the samples that did
            not fit even alone (``on_oversize="reject"``; they are in no bucket).
        meta: the model, GPU, and anything else the caller records (JSON-ready).
    """

    mode: str
    budget_bytes: int
    buckets: tuple[Bucket, ...]
    oversize: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    format: int = PLAN_FORMAT

    @property
    def bounds(self) -> np.ndarray:
        return np.array([b.bound for b in self.buckets], dtype=np.int64)

    @property
    def batch_sizes(self) -> np.ndarray:
        return np.array([b.batch_size for b in self.buckets], dtype=np.int64)

    def assign(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """Bucket index of each length (the first bound ≥ it), ``-1`` above the last bound."""
        arr = np.asarray(lengths, dtype=np.int64)
        idx = np.searchsorted(self.bounds, arr, side="left")
        return np.where(idx < len(self.buckets), idx, -1).astype(np.int64)

    def summary(self) -> dict[str, Any]:
        tokens = sum(b.tokens for b in self.buckets)
        padded = sum(b.padded_tokens for b in self.buckets)
        batches = sum(b.batches for b in self.buckets)
        fills = [b.fill for b in self.buckets for _ in range(b.batches)]
        return {
            "samples": sum(b.samples for b in self.buckets),
            "rejected": int(self.oversize.get("count", 0)),
            "batches": batches,
            "shapes": len(self.buckets) if self.mode == "static" else None,
            "padding_efficiency": tokens / padded if padded else 1.0,
            "mean_fill": float(np.mean(fills)) if fills else 0.0,
            "predicted_epoch_seconds": sum(b.seconds for b in self.buckets),
            "over_budget_batches": sum(b.batches for b in self.buckets if b.predicted_peak_bytes > self.budget_bytes),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "mode": self.mode, "budget_bytes": self.budget_bytes,
                "buckets": [asdict(b) for b in self.buckets], "oversize": dict(self.oversize),
                "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BucketPlan:
        if data.get("format") != PLAN_FORMAT:
            raise ConfigError(f"plan format should be {PLAN_FORMAT}, but got format={data.get('format')!r}")
        return cls(mode=data["mode"], budget_bytes=int(data["budget_bytes"]),
                   buckets=tuple(Bucket(**b) for b in data["buckets"]), oversize=dict(data.get("oversize", {})),
                   meta=dict(data.get("meta", {})))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> BucketPlan:
        return cls.from_dict(json.loads(text))


# -- cost tables -----------------------------------------------------------------------------


def _step_cost(cost: Any, batch: int, length: int) -> float:
    """Seconds per step; without a GPU, training FLOPs at 1 PFLOP/s (the ranking is the same)."""
    if getattr(cost, "gpu", None) is not None:
        return float(cost.step_seconds(batch, length))
    return float(cost.flops(batch, length).training) / 1e15


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
    cost_model: Any,
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
        cost_model: a :class:`~tokenbucket.cost.CostModel` (with a GPU, times are seconds;
            without, FLOPs at 1 PFLOP/s).
        budget_bytes: the memory every batch must fit.
        max_buckets: at most this many buckets (static mode: this many shapes).
        mode: ``static``, ``dynamic`` (see the module docstring) or ``packed``
            (:func:`tokenbucket.packing.plan_packing`: one row shape, samples packed whole).
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
        from tokenbucket.packing import plan_packing

        return plan_packing(lengths, cost_model, budget_bytes, pack_length=pack_length, on_oversize=on_oversize,
                            seed=seed, multiple=multiple, meta=meta)
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
    top_fit = _longest_fitting(cost_model, int(hist.values[-1]), budget_bytes)
    over = hist.values > top_fit
    oversize: dict[str, int] = {}
    if over.any():
        count = int(hist.counts[over].sum())
        largest = int(hist.values[-1])
        need = int(cost_model.memory(1, largest).total)
        if on_oversize == "error":
            raise OversizeError(
                f"{count:,} sample(s) do not fit the budget even alone: the largest has {largest:,} tokens and "
                f"needs {need / 2**30:,.2f} GiB against a budget of {budget_bytes / 2**30:,.2f} GiB (the longest "
                f"that fits is {top_fit:,} tokens). Fewer frames or cameras, a lower resolution or a larger "
                f"patch/merge, activation checkpointing, flash attention, or a bigger GPU would make them fit; "
                f"or pass on_oversize='reject' to plan without them"
            )
        oversize = {"count": count, "largest": largest, "largest_bytes": need, "longest_fitting": int(top_fit)}
        hist = LengthHistogram(hist.values[~over], hist.counts[~over])
        if raw is not None:
            raw = raw[raw <= top_fit]
        if hist.total == 0:
            return BucketPlan(mode, budget_bytes, (), oversize, dict(meta or {}))

    cands = _candidates(hist, max_candidates, multiple)
    # rounding up to `multiple` must not cross the longest length that fits alone
    cap = _longest_fitting(cost_model, int(cands[-1]), budget_bytes)
    cands = np.unique(np.minimum(cands, cap))
    bsz = max_batches_at(cost_model, cands, budget_bytes)
    usable = bsz > 0
    cands, bsz = cands[usable], bsz[usable]
    if not len(cands) or cands[-1] < hist.values[-1]:
        raise AssertionError("the top candidate must cover the longest fitting sample")
    step = np.array([_step_cost(cost_model, int(b), int(u)) for b, u in zip(bsz, cands, strict=True)])

    # samples per candidate interval (c_{j-1}, c_j]
    pos = np.searchsorted(cands, hist.values, side="left")
    n_at = np.bincount(pos, weights=hist.counts, minlength=len(cands))
    prefix = np.concatenate([[0.0], np.cumsum(n_at)])
    chosen = _dp(prefix, bsz.astype(np.float64), step, max_buckets)
    bounds = cands[chosen]
    return _describe(mode, bounds, bsz[chosen], hist, raw, cost_model, budget_bytes, oversize, meta,
                     pool_batches, seed)


def _longest_fitting(cost: SupportsCost, longest: int, budget: int) -> int:
    if cost.memory(1, longest).total <= budget:
        return longest
    lo, hi = 0, longest  # fits(lo) or lo == 0; not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost.memory(1, mid).total <= budget:
            lo = mid
        else:
            hi = mid
    return lo


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
    cost: Any,
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
            step = _step_cost(cost, b, u)
        else:
            batches, padded, seconds = stats[k]
            step = seconds / batches if batches else 0.0
        buckets.append(Bucket(
            bound=int(u), batch_size=int(b), samples=int(samples[k]), batches=int(batches), tokens=int(tokens[k]),
            padded_tokens=int(padded), predicted_peak_bytes=peak, fill=peak / budget,
            padding_efficiency=float(tokens[k] / padded) if padded else 1.0, step_seconds=float(step),
        ))
    return BucketPlan(mode, budget, tuple(b for b in buckets if b.samples), oversize, dict(meta or {}))


def _simulate_dynamic(
    lengths: np.ndarray, bounds: np.ndarray, cost: Any, budget: int, pool_batches: int, seed: int
) -> list[tuple[int, int, float]]:
    """Per bucket ``(batches, padded tokens, seconds)`` of dynamic batching (see the module
    docstring): shuffled pools, sorted, cut greedily while the batch at its longest fits."""
    rng = np.random.default_rng(seed)
    bucket_of = np.searchsorted(bounds, lengths, side="left")
    out = []
    for k in range(len(bounds)):
        members = lengths[bucket_of == k]
        batches = dynamic_batches(members, cost, budget, pool_batches=pool_batches, rng=rng)
        padded = sum(len(idx) * int(members[idx].max()) for idx in batches)
        seconds = sum(_step_cost(cost, len(idx), int(members[idx].max())) for idx in batches)
        out.append((len(batches), padded, seconds))
    return out


def check_plan(plan_or_bounds: BucketPlan | Sequence[int], batch_sizes: Sequence[int] | None, cost_model: Any,
               budget_bytes: int) -> None:
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
    cost_model: Any,
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
        raise ConfigError(f"plan_from_bounds takes mode 'static' or 'dynamic', but got mode={mode!r} "
                          f"(for packing use plan_buckets(mode='packed', pack_length=...))")
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
        oversize = {"count": int(hist.counts[over].sum()), "largest": largest,
                    "largest_bytes": int(cost_model.memory(1, largest).total), "longest_fitting": top}
        hist = LengthHistogram(hist.values[~over], hist.counts[~over])
        raw = raw[raw <= top] if raw is not None else None
    return _describe(mode, np.asarray(bounds, np.int64), np.asarray(batch_sizes, np.int64), hist, raw, cost_model,
                     budget_bytes, oversize, meta, pool_batches, seed)

