"""``tokenbucket plan METADATA --hf-config DIR | --preset STAGED --mode packed``: two-cap packed
rows for a staged model (NOTE [ Two-cap packed rows ]), written to a manifest (NOTE [ A two-cap
packed manifest ]), and how ``plan`` and ``inspect`` show such a manifest.

    tokenbucket plan meta.parquet --preset qwen2-vl-2b --mode packed --sharding ddp --world-size 8 \\
        --gpu H100-SXM --out manifest.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import OversizeError, UsageError
from tokenbucket.cli._common import _gib, progress_from_args
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.plan.manifest import Manifest
from tokenbucket.plan.packed_manifest import build_packed_manifest_2d, is_two_cap, packed_plan_of
from tokenbucket.tokens.spec import TokenSpec

__all__ = ["is_two_cap", "packed_report", "print_packed", "refuse_packed_flags", "run_packed_2d"]


def refuse_packed_flags(args: argparse.Namespace) -> None:
    """One line naming every flag that does not go with two-cap packing."""
    refused = [
        ("--buckets 2d", args.buckets == "2d"),  # a packed row bounds both counts itself
        ("--profile", args.profile is not None),  # a profile measures padded batches, not packed rows
        ("--calibration", args.calibration is not None),
        ("--engine ray", args.engine == "ray"),
        ("--vision-share", args.vision_share is not None),  # each sample is priced as itself
        ("--stills", args.stills is not None),  # one camera shape a sample
        ("--lerobot", args.lerobot is not None),
    ]
    given = [flag for flag, bad in refused if bad]
    if given:
        raise UsageError(
            f"--mode packed with a staged model packs each sample as itself under two caps, here; drop {', '.join(given)}"
        )


def run_packed_2d(
    args: argparse.Namespace,
    staged: StagedCostModel,
    spec: TokenSpec,
    sources: list[str | Path],
    budget: int,
    meta: dict[str, Any],
) -> Manifest:
    """Plan and write the two-cap packed manifest (the world size balanced over: ``--world-size``)."""
    cost = StagedPackedModel(StagedLengthModel(staged))
    try:
        return build_packed_manifest_2d(
            sources, spec, cost, args.out, budget_bytes=budget, world_size=staged.setup.world_size,
            on_oversize=args.on_oversize, on_invalid=args.on_invalid, feed=args.feed, meta=meta, force=args.force,
            progress=progress_from_args(args),
        )  # fmt: skip
    except OversizeError as exc:  # the way out in this command's words, not the library's
        raise OversizeError(exc.worded("--on-oversize reject")) from None


def packed_report(manifest: Manifest) -> dict[str, Any]:
    """The caps, rows per batch and the predicted epoch of a two-cap packed manifest (its epoch 0,
    re-packed from the stored loads: the planner's)."""
    packed = packed_plan_of(manifest)
    p = packed.plan
    return {
        "row_tokens": p.row_tokens, "row_patches": p.row_patches, "row_image_tokens": p.row_image_tokens,
        "rows_per_batch": p.rows_per_batch, "world_size": p.world_size, "predicted_peak_bytes": p.predicted_peak_bytes,
        "budget_bytes": p.budget_bytes, **p.summary(packed.loads),
        # every batch is priced at the caps (NOTE [ Two-cap packed rows ]): all over or none
        "over_budget_batches": len(p.batches) if p.predicted_peak_bytes > p.budget_bytes else 0,
    }  # fmt: skip


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:,.2f} h" if seconds >= 3600 else f"{seconds:,.1f} s"


def print_packed(report: dict[str, Any], summary: dict[str, Any]) -> None:
    r = report
    print(
        f"two-cap packed rows: {r['row_tokens']:,} LLM tokens and {r['row_patches']:,} patches a row (at most "
        f"{r['row_image_tokens']:,} image tokens), {r['rows_per_batch']} row(s) a batch; peak at the caps "
        f"{_gib(r['predicted_peak_bytes'])} of {_gib(r['budget_bytes'])}"
    )
    invalid = f", {summary['invalid']:,} of them invalid rows" if summary.get("invalid") else ""
    print(
        f"{summary['samples']:,} samples in {r['batches']:,} batches, {r['steps']:,} steps on {r['world_size']} "
        f"rank(s); predicted epoch {_duration(r['predicted_epoch_seconds'])}, rank imbalance "
        f"{r['rank_imbalance']:.2%}, LLM token efficiency {r['llm_efficiency']:.1%}, patch cap fill "
        f"{r['vision_cap_fill']:.1%}; over budget: {r['over_budget_batches']}; rejected {summary['rejected']:,}{invalid}"
    )
