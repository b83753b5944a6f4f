"""The plan as a value: a length histogram in, sorted buckets with their batch sizes out.

:class:`LengthHistogram` is what a planner reads (exact counts per distinct length, mergeable,
so parts of a dataset plan like the whole); :class:`BucketPlan` is what it hands the sampler and
the manifest (serialisable, with a format version).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from tokenbucket._exceptions import ConfigError

__all__ = ["PLAN_FORMAT", "Bucket", "BucketPlan", "LengthHistogram", "Mode"]

PLAN_FORMAT = 1
Mode = Literal["static", "dynamic", "packed"]


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
            raise ConfigError(
                f"a length histogram needs one count per value, but got {len(values)} values and {len(counts)} counts"
            )
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
        return (
            isinstance(other, LengthHistogram)
            and np.array_equal(self.values, other.values)
            and np.array_equal(self.counts, other.counts)
        )

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

    A two-dimensional plan's bucket also bounds the sample's image tokens: it holds the samples
    with ``L_total <= bound`` and ``vision <= vision_bound`` that no earlier bucket holds
    (NOTE [ Two-dimensional buckets ]); ``vision_bound`` is ``None`` in a 1D plan.
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
    vision_bound: int | None = None

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

    @property
    def two_d(self) -> bool:
        """Whether the buckets also bound each sample's image tokens (NOTE [ Two-dimensional buckets ])."""
        return any(b.vision_bound is not None for b in self.buckets)

    @property
    def vision_bounds(self) -> np.ndarray | None:
        """Each bucket's bound on image tokens (a 2D plan), else ``None``."""
        if not self.two_d:
            return None
        return np.array([b.vision_bound for b in self.buckets], dtype=np.int64)

    def assign(
        self, lengths: Sequence[int] | np.ndarray, vision: Sequence[int] | np.ndarray | None = None
    ) -> np.ndarray:
        """Bucket index of each length (the first bound ≥ it), ``-1`` above the last bound.

        A 2D plan needs every sample's image tokens too: a sample goes to the first bucket whose
        both bounds hold it (NOTE [ Two-dimensional buckets ]), ``-1`` when none does.
        """
        arr = np.asarray(lengths, dtype=np.int64)
        vb = self.vision_bounds
        if vb is None:
            idx = np.searchsorted(self.bounds, arr, side="left")
            return np.where(idx < len(self.buckets), idx, -1).astype(np.int64)
        if vision is None:
            raise ConfigError("a 2D plan assigns buckets by length and image tokens: pass vision= as well")
        vis = np.asarray(vision, dtype=np.int64)
        if vis.shape != arr.shape:
            raise ConfigError(
                f"lengths and vision should have one value per sample, but got {arr.shape} and {vis.shape}"
            )
        out = np.full(arr.shape, -1, dtype=np.int64)
        for k, (u, v) in enumerate(zip(self.bounds.tolist(), vb.tolist(), strict=True)):
            out[(out < 0) & (arr <= u) & (vis <= v)] = k
        return out

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
        return {
            "format": self.format,
            "mode": self.mode,
            "budget_bytes": self.budget_bytes,
            # a 1D bucket writes no vision_bound: its JSON (and every hash over it) is as before
            "buckets": [
                {k: v for k, v in asdict(b).items() if k != "vision_bound" or v is not None} for b in self.buckets
            ],
            "oversize": dict(self.oversize),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BucketPlan:
        if data.get("format") != PLAN_FORMAT:
            raise ConfigError(f"plan format should be {PLAN_FORMAT}, but got format={data.get('format')!r}")
        return cls(
            mode=data["mode"],
            budget_bytes=int(data["budget_bytes"]),
            buckets=tuple(Bucket(**b) for b in data["buckets"]),
            oversize=dict(data.get("oversize", {})),
            meta=dict(data.get("meta", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> BucketPlan:
        return cls.from_dict(json.loads(text))
