"""A two-cap packed plan (:func:`~tokenbucket.plan.packing_2d.plan_packing_2d`) written to a
manifest and read back, so a staged (vision-tower) model goes from ``tokenbucket plan --mode
packed`` to a ``DataLoader`` (``PackedBatchSampler2D.from_manifest``).

NOTE [ A two-cap packed manifest ]
A two-cap packed plan is its caps and the samples it packs; which samples share a row is each
epoch's (NOTE [ Two-cap packing each epoch ]), so the manifest stores what re-packing takes, not
the rows:

- the footer's plan is :meth:`PackedPlan2D.bucket_plan` (one ``packed`` bucket: bound
  ``row_tokens``, batch size ``rows_per_batch``), its ``meta`` adding ``row_patches``,
  ``row_image_tokens``, ``world_size``, ``pack_seed``, ``pack_pool`` and ``step_cost``
  (:class:`~tokenbucket.cost.staged_packed.PackedStepCost`: a padding token's FLOPs and the
  step-time model, which price each epoch's batches for the rank balance);
- each sample's loads are columns beside its breakdown: ``patches``, ``image_tokens``,
  ``passes`` (int64), ``flops``, ``vision_flops`` (float64), null on an invalid row; its LLM
  tokens are ``total`` (the token spec's count is the sequence the collate lays out, so the
  staged model is asked for a sample of ``total - image tokens`` text tokens: an image's start
  and end tokens are priced as text);
- ``bucket`` is 0 for a packed sample, -1 with its reason for a rejected one.

The loads are stored, not recomputed at training time, because the manifest does not hold what
they are computed from: the image shapes are metadata columns, not manifest columns, and the
model's ``config.json`` need not be on the training machine. Stored, the manifest alone re-packs
every epoch, and the content hash covers the loads and the step cost as it covers every column
and the plan (NOTE [ Content hash ]); it costs 40 bytes a row before compression. Nothing in the
format changes for other plans: a manifest without these columns reads as before, and
:func:`packed_plan_of` refuses it in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.staged import Sample
from tokenbucket.cost.staged_packed import PackedStepCost, SampleLoads, StagedPackedModel
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.manifest import Manifest, _SeenKeys, build_manifest, counting_spec
from tokenbucket.plan.packing_2d import PackedPlan2D, balance_steps, batch_seconds, pack_rows_2d, plan_packing_2d
from tokenbucket.tokens.breakdown import breakdown_table
from tokenbucket.tokens.metadata import iter_metadata_batches, metadata_paths
from tokenbucket.tokens.spec import TokenSpec

__all__ = ["LOAD_COLUMNS", "PackedManifest2D", "build_packed_manifest_2d", "is_two_cap", "packed_plan_of"]

LOAD_COLUMNS = ("patches", "image_tokens", "passes", "flops", "vision_flops")
_INT_LOADS = ("patches", "image_tokens", "passes")


@dataclass(frozen=True)
class PackedManifest2D:
    """What a two-cap packed manifest gives back: the plan (epoch 0 re-packed from the stored
    loads: the planner's own batches), every manifest row's loads (zeros on an invalid row) and
    the step cost that prices them."""

    plan: PackedPlan2D
    loads: SampleLoads
    step_cost: PackedStepCost


class _PackedRows:
    """Each planned input row's bucket, reason and loads (a ``RowAssignment``)."""

    def __init__(self, rows: np.ndarray, plan: PackedPlan2D, loads: SampleLoads) -> None:
        self.where = {int(r): k for k, r in enumerate(rows.tolist())}
        self.rejected = plan.rejected
        self.loads = loads

    def rows(self, index: np.ndarray) -> tuple[np.ndarray, pa.Array, dict[str, pa.Array]]:
        k = np.array([self.where.get(int(i), -1) for i in index.tolist()], dtype=np.int64)
        known = k >= 0
        bucket = np.where(known, 0, -1)  # a row pass 1 did not plan is refused in pass 2 (a repeated key)
        reasons: list[str | None] = [None] * len(k)
        for j in np.flatnonzero(known).tolist():
            why = self.rejected.get(int(k[j]))
            if why is not None:
                bucket[j], reasons[j] = -1, f"oversize: {why}"
        safe = np.where(known, k, 0)
        cols = {name: pa.array(getattr(self.loads, name)[safe], mask=~known) for name in LOAD_COLUMNS}
        return bucket, pa.array(reasons, pa.string()), cols


def _samples(table: pa.Table, spec: TokenSpec, local: np.ndarray, totals: np.ndarray, cost: StagedPackedModel,
             feed: str | None) -> list[Sample]:  # fmt: skip
    """The staged model's view of rows ``local`` of ``table``: their cameras as images (or clips,
    as the family feeds them), and the rest of ``totals`` as text (NOTE [ A two-cap packed manifest ])."""
    cols = spec.columns
    if pa.types.is_list(table.schema.field(cols.cameras).type) or pa.types.is_large_list(
        table.schema.field(cols.cameras).type
    ):
        raise ConfigError(
            f"two-cap packing reads one camera shape a sample (flat {cols.cameras!r}, {cols.frames!r}, "
            f"{cols.height!r}, {cols.width!r} columns), but column {cols.cameras!r} holds a list of cameras a sample"
        )
    take = pa.array(local)
    cams, frames, h, w = (table.column(c).take(take).to_numpy() for c in (cols.cameras, cols.frames, cols.height,
                                                                          cols.width))  # fmt: skip
    staged = cost.staged
    out: list[Sample] = []
    for c, f, hh, ww, n in zip(cams.tolist(), frames.tolist(), h.tolist(), w.tolist(), totals.tolist(), strict=True):
        if not c:
            out.append(Sample(text_tokens=n))
            continue
        shape = {"cameras": c, "frames": f, "height": hh, "width": ww}
        s = Sample.stills(**shape) if feed == "images" or f == 1 else Sample.video(**shape)
        image = staged.sample_vision(s).llm_tokens
        if image > n:
            raise AssertionError(f"the staged model counts {image} image tokens in a sample of {n} tokens")
        out.append(replace(s, text_tokens=n - image))
    return out


def build_packed_manifest_2d(
    sources: str | Path | Sequence[str | Path],
    spec: TokenSpec,
    cost: StagedPackedModel,
    out: str | Path,
    *,
    budget_bytes: int,
    world_size: int = 1,
    rows_per_batch: tuple[int, ...] = (1, 2, 4),
    on_oversize: Literal["error", "reject"] = "error",
    on_invalid: str = "raise",
    feed: str | None = None,
    seed: int = 0,
    batch_rows: int = 1_000_000,
    part_rows: int | None = None,
    progress: bool | None = None,
    meta: dict[str, Any] | None = None,
    force: bool = False,
) -> Manifest:
    """Plan two-cap packed rows for the metadata in ``sources`` and write the manifest (NOTE
    [ A two-cap packed manifest ]).

    Every valid row's loads come from ``cost`` (pass 1, every sample held: the planner packs the
    samples themselves), :func:`~tokenbucket.plan.packing_2d.plan_packing_2d` chooses the caps on
    ``world_size`` ranks, and :func:`~tokenbucket.plan.manifest.build_manifest` writes every row
    packed (bucket 0) or rejected with its reason. ``feed``: ``"images"`` when every frame reaches
    the model as an image (a token spec of ``feed="images"``); otherwise a camera of two frames or
    more is a clip. The other arguments are :func:`build_manifest`'s and :func:`plan_packing_2d`'s.

    Raises:
        ConfigError: a list-typed cameras column, no valid rows, or what the planner or the
            writer refuse.
        OversizeError: with ``on_oversize="error"``, a sample that fits not even alone.
    """
    paths = metadata_paths(sources)
    counting, _ = counting_spec(spec, on_invalid == "reject")
    seen = _SeenKeys()  # NOTE [ Duplicate keys across batches ]: planned rows are the rows kept
    rows: list[np.ndarray] = []
    samples: list[Sample] = []
    offset = 0
    for table in iter_metadata_batches(paths, batch_rows=batch_rows, key=spec.columns.key,
                                       absent=spec.absent_as_zero()):  # fmt: skip
        good = breakdown_table(table, counting, on_invalid="reject", min_total=1).table
        local = good.column("index").to_numpy()
        totals = good.column("total").to_numpy()
        if counting.columns.key is not None:
            dup = seen.add(good.column("key"), refuse=True)
            if dup is not None:
                local, totals = local[~dup], totals[~dup]
        samples += _samples(table, spec, local, totals, cost, feed)
        rows.append(local + offset)
        offset += table.num_rows
    if not samples:
        raise ConfigError("the metadata inputs hold no valid rows to pack")
    loads = cost.loads(samples)
    plan = plan_packing_2d(loads, cost, budget_bytes, world_size=world_size, rows_per_batch=rows_per_batch,
                           on_oversize=on_oversize, seed=seed, meta=meta)  # fmt: skip
    bucket_plan = plan.bucket_plan(loads)
    extra = {"world_size": plan.world_size, "step_cost": cost.step_cost().to_dict()}
    bucket_plan = replace(bucket_plan, meta={**bucket_plan.meta, **extra})
    assigned = _PackedRows(np.concatenate(rows), plan, loads)
    return build_manifest(paths, spec, bucket_plan, out, on_oversize=on_oversize, on_invalid=on_invalid,
                          batch_rows=batch_rows, part_rows=part_rows, progress=progress, meta=meta, force=force,
                          assigned=assigned)  # fmt: skip


def is_two_cap(plan: BucketPlan) -> bool:
    """Whether ``plan`` is a two-cap packed plan as a manifest stores it (NOTE [ A two-cap packed manifest ])."""
    return plan.mode == "packed" and "row_patches" in plan.meta and "step_cost" in plan.meta


def packed_plan_of(manifest: Manifest) -> PackedManifest2D:
    """The two-cap packed plan a manifest holds, its loads and step cost (NOTE [ A two-cap packed
    manifest ]); epoch 0's batches and steps re-packed as the planner packed them.

    Raises:
        ConfigError: the manifest holds another plan (a bucket plan, a 1D packed plan), in one line.
    """
    plan = manifest.plan
    missing = [c for c in LOAD_COLUMNS if c not in manifest.table.column_names]
    if not is_two_cap(plan) or missing:
        kind = "a 1D packed plan" if plan.mode == "packed" else f"a {plan.mode} bucket plan"
        raise ConfigError(
            f"manifest {str(manifest.path)!r} holds {kind}, not a two-cap packed plan: plan it with "
            f"`tokenbucket plan ... --hf-config DIR --mode packed` (or read it with "
            f"{'PackedBatchSampler' if plan.mode == 'packed' else 'BucketBatchSampler'}.from_manifest)"
        )
    t = manifest.table
    m = plan.meta
    step_cost = PackedStepCost.from_dict(m["step_cost"])
    cols = {c: t.column(c).fill_null(0).to_numpy() for c in ("total", *LOAD_COLUMNS)}
    loads = SampleLoads(*(cols[c].astype(np.int64) for c in ("total", *_INT_LOADS)),
                        *(cols[c].astype(np.float64) for c in ("flops", "vision_flops")))  # fmt: skip
    bucket = t.column("bucket").to_numpy()
    members = np.flatnonzero(bucket >= 0)
    reasons = t.column("reason").to_pylist()
    rejected = {int(i): str(reasons[i]) for i in np.flatnonzero(bucket < 0).tolist()}
    b = plan.buckets[0]
    r, tokens, patches = b.batch_size, b.bound, int(m["row_patches"])
    seed, pool, world = int(m.get("pack_seed", 0)), int(m.get("pack_pool", 8192)), int(m.get("world_size", 1))
    packed = pack_rows_2d(loads.llm_tokens[members], loads.patches[members], tokens, patches, seed=seed, pool=pool)
    batches = [[members[row] for row in packed[k : k + r]] for k in range(0, len(packed), r)]
    seconds = batch_seconds(batches, loads, step_cost, r, tokens)
    empty = step_cost.step_seconds(r * tokens * step_cost.pad_flops_per_token, r * tokens)
    two_cap = PackedPlan2D(
        row_tokens=tokens, row_patches=patches, row_image_tokens=int(m["row_image_tokens"]), rows_per_batch=r,
        world_size=world, budget_bytes=plan.budget_bytes, predicted_peak_bytes=b.predicted_peak_bytes,
        batches=batches, seconds=seconds, empty_seconds=empty, steps=balance_steps(seconds, world, seed=seed),
        rejected=rejected, meta=dict(m),
    )  # fmt: skip
    return PackedManifest2D(two_cap, loads, step_cost)
