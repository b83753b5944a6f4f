"""Phase 2/3 of building a manifest, shared by the local and the Ray engines: the plan from pass
1's counts, 1D (:func:`~tokenbucket.plan.buckets.plan_buckets`) or 2D
(:func:`~tokenbucket.plan.buckets_2d.plan_buckets_2d`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket._progress import progress as progress_bar
from tokenbucket.plan.bucket_plan import BucketPlan, LengthHistogram
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.buckets_2d import plan_buckets_2d

__all__ = ["make_plan"]


def make_plan(
    lengths: LengthHistogram | np.ndarray,
    cost: object,
    budget_bytes: int,
    *,
    max_buckets: int,
    mode: str,
    on_oversize: str,
    meta: dict[str, Any] | None,
    progress: bool | None,
    vision: np.ndarray | None = None,
    multiple: int = 64,
) -> BucketPlan:
    """Phase 2/3: the plan from pass 1's histogram (or lengths), shown as one step; with
    ``vision`` (every sample's image tokens) a 2D plan (NOTE [ Two-dimensional buckets ])."""
    # one vectorised call: its bar is one step, not a fake count (NOTE [ Progress on stderr ])
    step = progress_bar(1, desc="2/3 planning", unit="step", enabled=progress)
    try:
        if vision is not None:
            if isinstance(lengths, LengthHistogram) or mode not in ("static", "dynamic"):
                raise ConfigError(
                    f"a 2D plan is static or dynamic and needs every sample's lengths, but got mode={mode!r}"
                )
            plan = plan_buckets_2d(
                lengths,
                vision,
                cost,  # type: ignore[arg-type]
                budget_bytes,
                max_buckets=max_buckets,
                mode=mode,  # type: ignore[arg-type]
                on_oversize=on_oversize,  # type: ignore[arg-type]
                meta=meta,
            )
        else:
            plan = plan_buckets(
                lengths,
                cost,  # type: ignore[arg-type]
                budget_bytes,
                max_buckets=max_buckets,
                mode=mode,  # type: ignore[arg-type]
                on_oversize=on_oversize,  # type: ignore[arg-type]
                meta=meta,
                multiple=multiple,
            )
        step.update(1)
    finally:
        step.close()
    return plan
