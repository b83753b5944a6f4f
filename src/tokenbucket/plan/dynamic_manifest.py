"""A 2D dynamic plan (``plan_buckets_2d(mode="dynamic")``) in a manifest and read back, so a
staged (vision-tower) model goes from ``tokenbucket plan --buckets 2d --mode dynamic`` to a
``DataLoader`` with the manifest alone (``BucketBatchSampler.from_manifest``).

NOTE [ A two-dimensional dynamic manifest ]
A 2D dynamic plan fixes each sample's bucket; the batches are each epoch's: the sampler cuts a
bucket's members (index order) into batches padded to their own longest and most image tokens,
shuffled by ``(seed, epoch)`` in pools of ``pool_batches`` batches, each as large as the cost model
lets fit (NOTE [ Two-dimensional dynamic batches ]). So the manifest stores what the cut reads,
not the batches:

- every row's ``total``, ``vision`` and ``bucket`` (-1 with its reason when rejected), as in any
  2D manifest;
- in the plan's ``meta["dynamic_2d"]`` (:func:`~tokenbucket.plan.buckets_2d.dynamic_record`):
  ``pool_batches``, ``seed`` (epoch 0 at that seed is the plan's own cut, which its buckets'
  figures describe) and ``cost_model``, the cost model's ``to_dict()`` (a ``StagedLengthModel``:
  its preset, or its ``config.json`` and processor tables, with the training setup).

The cut asks the cost model about whatever (batch, longest, most image tokens) a pool forms, so
a table of its answers would not be small; the model is rebuilt instead. Kept in the plan, it is
covered by the content hash (NOTE [ Content hash ]), and the config files need not be on the
training machine. A model rebuilt by another tokenbucket might price otherwise and cut other
batches, so :func:`dynamic_plan_of` prices every bucket again at its batch size and both bounds
and refuses the manifest in one line when a peak is not the recorded one. A cost model that
cannot write itself down (a ``StagedModel`` built by hand) is recorded as ``None``: then the
sampler needs it passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets_2d import DYNAMIC_2D_KEY, SupportsCost2D
from tokenbucket.plan.manifest import Manifest
from tokenbucket.plan.packed_manifest import is_two_cap

__all__ = ["DynamicManifest2D", "dynamic_plan_of", "is_dynamic_2d", "rebuilt_cost_model", "recorded_cut"]

# plan_buckets_2d's defaults: a 2D dynamic plan handed to build_manifest without its record
_DEFAULT_POOL_BATCHES, _DEFAULT_SEED = 64, 0


@dataclass(frozen=True)
class DynamicManifest2D:
    """What a 2D dynamic manifest gives a sampler (``DynamicFill2D`` and the seed): every row's
    ``lengths`` and ``vision`` (0 on an invalid row), the cost model and budget that cut the
    batches, and the plan's ``pool_batches`` and ``seed``."""

    lengths: np.ndarray
    vision: np.ndarray
    cost_model: SupportsCost2D
    budget_bytes: int
    pool_batches: int
    seed: int


def is_dynamic_2d(plan: BucketPlan) -> bool:
    """Whether ``plan`` is a 2D dynamic plan (NOTE [ A two-dimensional dynamic manifest ])."""
    return plan.mode == "dynamic" and plan.two_d


def _kind(plan: BucketPlan) -> tuple[str, str]:
    """What ``plan`` is, in words, and the sampler that reads it."""
    if is_two_cap(plan):
        return "a two-cap packed plan", "PackedBatchSampler2D.from_manifest"
    if plan.mode == "packed":
        return "a 1D packed plan", "PackedBatchSampler.from_manifest"
    return f"a {plan.mode} {'2D' if plan.two_d else '1D'} bucket plan", "BucketBatchSampler.from_manifest"


def dynamic_plan_of(manifest: Manifest, *, cost_model: SupportsCost2D | None = None) -> DynamicManifest2D:
    """What re-cuts a 2D dynamic manifest's batches each epoch (NOTE [ A two-dimensional dynamic
    manifest ]): the cost model it stores, rebuilt and checked against the plan's peaks, unless
    ``cost_model`` is given (a recalibrated model, say: then it is taken as it is).

    Raises:
        ConfigError: the manifest holds another plan; it records no cost model and none is given;
            or the rebuilt model prices a bucket otherwise than the plan did (one line each).
    """
    plan = manifest.plan
    where = f"manifest {str(manifest.path)!r}"
    if not is_dynamic_2d(plan):
        kind, reader = _kind(plan)
        raise ConfigError(
            f"{where} holds {kind}, not a 2D dynamic plan: read it with {reader}, or plan it with "
            f"`tokenbucket plan ... --hf-config DIR --buckets 2d --mode dynamic`"
        )
    cost_model, pool_batches, seed = recorded_cut(where, plan, cost_model)
    t = manifest.table
    lengths = t.column("total").fill_null(0).to_numpy()
    vision = t.column("vision").fill_null(0).to_numpy()
    return DynamicManifest2D(lengths, vision, cost_model, plan.budget_bytes, pool_batches, seed)


def recorded_cut(
    where: str, plan: BucketPlan, cost_model: SupportsCost2D | None = None
) -> tuple[SupportsCost2D, int, int]:
    """A 2D dynamic plan's cut as it records it: ``(cost model, pool_batches, seed)``, the model
    rebuilt by :func:`rebuilt_cost_model` unless ``cost_model`` is given (then taken as it is)."""
    record: dict[str, Any] = dict(plan.meta.get(DYNAMIC_2D_KEY) or {})
    pool_batches = int(record.get("pool_batches", _DEFAULT_POOL_BATCHES))
    seed = int(record.get("seed", _DEFAULT_SEED))
    if cost_model is None:
        cost_model = rebuilt_cost_model(where, plan, record.get("cost_model"))
    return cost_model, pool_batches, seed


def rebuilt_cost_model(where: str, plan: BucketPlan, record: object) -> StagedLengthModel:
    """The cost model a 2D dynamic plan records (``meta["dynamic_2d"]["cost_model"]``), rebuilt and
    refused in one line (naming ``where``) when it does not price the plan's buckets as the plan did."""
    if record is None:
        raise ConfigError(
            f"{where} records no cost model to cut its batches with (it was planned with one that cannot be "
            f"written down): pass cost_model= (the model it was planned with)"
        )
    if not isinstance(record, dict):
        raise ConfigError(f"{where} has a damaged footer: its dynamic_2d cost_model is {record!r:.60}")
    try:
        cost = StagedLengthModel.from_dict(record)
    except ConfigError as exc:
        raise ConfigError(f"{where}: its cost model cannot be rebuilt ({exc}); pass cost_model=") from None
    for k, b in enumerate(plan.buckets):
        peak = int(cost.memory(b.batch_size, b.bound, b.vision_bound).total)
        if peak != b.predicted_peak_bytes:
            raise ConfigError(
                f"{where}: its cost model, rebuilt here, prices bucket {k} ({b.batch_size} x {b.bound:,} tokens, "
                f"{b.vision_bound:,} image tokens) at {peak:,} bytes, but the plan at {b.predicted_peak_bytes:,} "
                f"(another tokenbucket?), so its batches would not be the plan's: plan again, or pass cost_model="
            )
    return cost
