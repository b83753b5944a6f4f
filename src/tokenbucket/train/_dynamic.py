"""How a dynamic-mode :class:`~tokenbucket.train.sampler.BucketBatchSampler` cuts a bucket's
samples into batches each epoch: by length (:class:`DynamicFill`, NOTE [ Sorted pools ]) or by
length and image tokens (:class:`DynamicFill2D`, NOTE [ Two-dimensional dynamic batches ]).
The planner simulates the same cut, so what a dynamic plan predicts is what training gets."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import OversizeSampleError, PredictsMemory, dynamic_batches
from tokenbucket.plan.buckets_2d import SupportsCost2D, dynamic_batches_2d

__all__ = ["DynamicFill", "DynamicFill2D", "cut_dynamic", "dynamic_mode"]


class DynamicFill(NamedTuple):
    """How a dynamic-mode sampler fills its batches (a plain 4-tuple in this order works too)."""

    lengths: np.ndarray
    cost_model: PredictsMemory
    budget_bytes: int
    pool_batches: int


class DynamicFill2D(NamedTuple):
    """How a sampler fills the batches of a 2D dynamic plan (``plan_buckets_2d(mode="dynamic")``):
    every sample's ``L_total`` and image tokens (the breakdown's ``vision``), the cost model
    that prices both (a ``StagedLengthModel``), the budget and the batches per pool; a plain
    5-tuple in this order works too. With the plan's ``seed`` and ``pool_batches``, epoch 0 is the
    plan's own batches (NOTE [ Two-dimensional dynamic batches ])."""

    lengths: np.ndarray
    vision: np.ndarray
    cost_model: SupportsCost2D
    budget_bytes: int
    pool_batches: int


def dynamic_mode(dynamic: DynamicFill | DynamicFill2D | tuple[object, ...] | None) -> str:
    """The sampler's ``mode`` state value for ``dynamic``: a 1D and a 2D fill cut other batches."""
    if dynamic is None:
        return "static"
    if len(dynamic) not in (4, 5):
        raise ConfigError(
            f"dynamic should be a DynamicFill (lengths, cost_model, budget_bytes, pool_batches) or a DynamicFill2D "
            f"(lengths, vision, cost_model, budget_bytes, pool_batches), but got a tuple of {len(dynamic)}"
        )
    return "dynamic_2d" if len(dynamic) == 5 else "dynamic"


def cut_dynamic(
    dynamic: DynamicFill | DynamicFill2D,
    members: np.ndarray,
    *,
    rng: np.random.Generator,
    seed: int,
    epoch: int,
) -> list[np.ndarray]:
    """One bucket's ``members`` (dataset indices) cut into batches, as positions into ``members``.

    A 1D fill draws its pools from ``rng`` (NOTE [ Sorted pools ]); a 2D fill seeds its own by
    ``(seed, epoch)``, so the plan, which knows no plan id, predicts epoch 0 exactly (NOTE
    [ Two-dimensional dynamic batches ]).
    """
    budget = int(dynamic[-2])
    try:
        if len(dynamic) == 5:
            two = DynamicFill2D(*dynamic)
            return dynamic_batches_2d(
                two.lengths[members],
                two.vision[members],
                two.cost_model,
                budget,
                pool_batches=two.pool_batches,
                seed=seed,
                epoch=epoch,
            )
        one = DynamicFill(*dynamic)
        return dynamic_batches(one.lengths[members], one.cost_model, budget, pool_batches=one.pool_batches, rng=rng)
    except OversizeSampleError as exc:
        images = f", {int(dynamic[1][members[exc.position]]):,} image tokens" if len(dynamic) == 5 else ""
        raise ConfigError(
            f"sample {int(members[exc.position])} ({exc.length:,} tokens{images}) fits not even alone under the "
            f"sampler's cost model and budget ({budget / 2**30:.2f} GiB): the plan was made with another model or "
            f"budget; plan again with this one"
        ) from None
