"""A plan from a sample of the stream: buckets planned from the first ``n`` samples' metadata,
with how far to trust them (:class:`PlanEstimate`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import SupportsCost
from tokenbucket.plan.bucket_plan import BucketPlan, Mode
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.stream.counting import ChunkCounter, Meta
from tokenbucket.tokens.spec import TokenSpec

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["PlanEstimate", "PlanOptions", "estimate_plan"]


@dataclass(frozen=True)
class PlanEstimate:
    """A plan made from the first ``n`` samples of a stream, and how far to trust it.

    ``beyond_max_95``: with 95 % confidence, the share of the whole stream longer than the
    longest sample seen is below this (the rule of three, 3/n) — those samples will be
    rejected as ``oversize`` unless ``headroom`` covered them. ``bucket_share_95``: a 95 %
    (Wilson) interval on each bucket's share of samples; batch counts scale with it.
    """

    plan: BucketPlan
    n: int
    rejected: int
    max_seen: int
    beyond_max_95: float
    bucket_share_95: tuple[tuple[float, float], ...]

    def describe(self) -> str:
        lines = [
            f"plan estimated from {self.n:,} samples ({self.rejected:,} invalid); longest seen "
            f"{self.max_seen:,} tokens; with 95 % confidence under {self.beyond_max_95:.2%} of the stream is "
            f"longer. A sample of the first shards is only representative if the shards are shuffled."
        ]
        for k, (lo, hi) in enumerate(self.bucket_share_95):
            lines.append(f"  bucket {k} (<= {self.plan.buckets[k].bound:,}): share {lo:.1%} .. {hi:.1%}")
        return "\n".join(lines)


class PlanOptions(TypedDict, total=False):
    """The keyword arguments :func:`estimate_plan` passes on to
    :func:`~tokenbucket.plan.buckets.plan_buckets` (its ``meta`` aside: here ``meta`` is the
    samples' metadata field)."""

    max_buckets: int
    mode: Mode
    on_oversize: Literal["error", "reject"]
    multiple: int
    max_candidates: int
    pool_batches: int
    seed: int
    pack_length: int | None


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def estimate_plan(
    stream: Iterable[object],
    n: int,
    spec: TokenSpec,
    cost_model: SupportsCost,
    budget_bytes: int,
    *,
    meta: Meta = "json",
    headroom: float = 1.0,
    **plan_kwargs: Unpack[PlanOptions],
) -> PlanEstimate:
    """Plan buckets from the first ``n`` samples of ``stream`` (their metadata only).

    ``headroom`` > 1 stretches the last bucket's bound so samples somewhat longer than any seen
    still fit (at the batch size the cost model allows there).
    """
    if n < 1:
        raise ConfigError(f"n should be a positive integer, but got n={n}")
    counter = ChunkCounter(spec, meta=meta)
    taken: list[tuple[object, str]] = []
    for sample in stream:
        taken.append((sample, counter.key(sample, len(taken))))
        if len(taken) == n:
            break
    seen = np.array([c[2] for c in counter.count(taken)], dtype=np.int64)
    if not len(seen):
        raise ConfigError(f"none of the first {len(taken)} samples had valid metadata")
    longest = int(seen.max())
    lengths = np.concatenate([seen, [math.ceil(longest * headroom)]]) if headroom > 1 else seen
    plan = plan_buckets(lengths, cost_model, budget_bytes, **plan_kwargs)
    buckets = plan.assign(seen)
    shares = tuple(_wilson(int((buckets == k).sum()), len(seen)) for k in range(len(plan.buckets)))
    return PlanEstimate(
        plan=plan,
        n=len(taken),
        rejected=counter.invalid,
        max_seen=longest,
        beyond_max_95=min(1.0, 3 / len(seen)),
        bucket_share_95=shares,
    )
