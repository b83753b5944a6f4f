"""The tables the CLI prints: a length histogram, a bucket plan, a token summary.

Apart from ``_common`` because they need numpy and the plan, which the verbs that price one
shape (``cost``, ``ledger``) do not load: those answer in well under 0.2 s.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from tokenbucket.cli._common import _gib
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets_2d import DYNAMIC_2D_KEY


def _print_summary(summary: dict[str, Any], source: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    print(
        f"{source}: {summary['count']:,} samples, {summary['rejected']:,} rejected, {summary['tokens']:,} tokens",
        file=out,
    )
    if summary["count"]:
        print(
            "L_total   "
            + "  ".join(f"{k}={summary[k]:,}" for k in ("min", "p50", "p90", "p99", "max"))
            + f"  mean={summary['mean']:,.0f}",
            file=out,
        )
    print("share     " + "  ".join(f"{k} {v:6.1%}" for k, v in summary["share"].items()), file=out)


def _plan_json(plan: BucketPlan) -> dict[str, Any]:
    return {
        "budget_bytes": plan.budget_bytes,
        "mode": plan.mode,
        "buckets": [
            {
                "bound": b.bound,
                **({"vision_bound": b.vision_bound} if b.vision_bound is not None else {}),
                "batch_size": b.batch_size,
                "samples": b.samples,
                "batches": b.batches,
                "predicted_peak_bytes": b.predicted_peak_bytes,
                "fill": b.fill,
                "padding_efficiency": b.padding_efficiency,
                "step_seconds": b.step_seconds,
            }
            for b in plan.buckets
        ],
        "summary": plan.summary(),
        "oversize": plan.oversize,
        **_dynamic_2d_json(plan),
    }


def _dynamic_2d_json(plan: BucketPlan) -> dict[str, Any]:
    """A 2D dynamic plan's cut in ``--json`` (NOTE [ A two-dimensional dynamic manifest ]): its pools,
    seed and whether the cost model is stored (the record itself is in the manifest's footer)."""
    if plan.mode != "dynamic" or not plan.two_d:
        return {}
    record = plan.meta.get(DYNAMIC_2D_KEY) or {}
    return {
        "dynamic_2d": {
            "pool_batches": record.get("pool_batches"),
            "seed": record.get("seed"),
            "cost_model_stored": record.get("cost_model") is not None,
        }
    }


def _print_plan(plan: BucketPlan, counts: Mapping[str, int] | None = None) -> None:
    """The bucket table and a summary line; ``counts`` (a manifest's ``summary()``: ``samples``,
    ``rejected`` and ``invalid`` as written) replace the plan's own."""
    two_d = plan.two_d  # a 2D plan's buckets bound the image tokens too (NOTE [ Two-dimensional buckets ])
    print(
        f"{'bucket':>6} {'bound':>8} " + (f"{'images':>8} " if two_d else "") + f"{'batch':>6} {'samples':>9} "
        f"{'batches':>8} {'peak':>11} {'fill':>6} {'padding eff':>12} {'step ms':>9}"
    )
    for k, b in enumerate(plan.buckets):
        images = f"{b.vision_bound:>8,} " if two_d else ""
        print(
            f"{k:>6} {b.bound:>8,} {images}{b.batch_size:>6} {b.samples:>9,} {b.batches:>8,} "
            f"{_gib(b.predicted_peak_bytes):>11} {b.fill:>6.1%} {b.padding_efficiency:>12.1%} {b.step_seconds * 1e3:>9.1f}"
        )
    s = {**plan.summary(), **(counts or {})}
    invalid = f", {s['invalid']:,} of them invalid rows" if s.get("invalid") else ""
    shapes = s["shapes"] if s["shapes"] is not None else "dynamic"
    print(
        f"{s['samples']:,} samples in {s['batches']:,} batches, {shapes} shapes, padding efficiency "
        f"{s['padding_efficiency']:.1%}, mean fill {s['mean_fill']:.1%}, predicted epoch "
        f"{s['predicted_epoch_seconds'] / 3600:,.2f} h, over budget: {s['over_budget_batches']}; "
        f"rejected {s['rejected']:,}{invalid} (budget {_gib(plan.budget_bytes)})"
    )
    if plan.oversize and "largest_vision" in plan.oversize:
        o = plan.oversize
        print(
            f"oversize: {o['count']:,} samples fit not even alone (the longest, {o['largest']:,} tokens of which "
            f"{o['largest_vision']:,} image tokens, needs {_gib(o['largest_bytes'])} alone)"
        )
    elif plan.oversize:
        o = plan.oversize
        print(
            f"oversize: {o['count']:,} samples longer than {o['longest_fitting']:,} tokens (the largest, "
            f"{o['largest']:,} tokens, needs {_gib(o['largest_bytes'])} alone)"
        )


def dynamic_2d_line(plan: BucketPlan) -> str | None:
    """What ``plan`` and ``inspect`` say of a 2D dynamic plan's cut (NOTE [ A two-dimensional
    dynamic manifest ]); ``None`` for any other plan."""
    if plan.mode != "dynamic" or not plan.two_d:
        return None
    record = plan.meta.get(DYNAMIC_2D_KEY) or {}
    stored = record.get("cost_model") is not None
    how = "the manifest alone" if stored else "the manifest and the cost model (cost_model=: none is stored)"
    return (
        f"2D dynamic: each batch padded to its own longest and most image tokens, as many as fit, cut from "
        f"shuffled pools of {record.get('pool_batches', '?')} batches; the figures are the sampler's epoch 0 at "
        f"seed {record.get('seed', '?')}; BucketBatchSampler.from_manifest re-cuts every epoch from {how}"
    )


def _histogram(totals: npt.NDArray[np.integer[Any]], width: int = 40) -> str:
    edges = 2 ** np.arange(int(np.log2(max(totals.min(), 1))), int(np.ceil(np.log2(totals.max() + 1))) + 1)
    counts, _ = np.histogram(totals, bins=edges)
    peak = counts.max()
    lines = []
    for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True):
        bar = "#" * max(1 if c else 0, round(width * c / peak))
        lines.append(f"  {int(lo):>8,} - {int(hi) - 1:>8,}  {c:>9,}  {bar}")
    return "\n".join(lines)
