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


def _histogram(totals: npt.NDArray[np.integer[Any]], width: int = 40) -> str:
    edges = 2 ** np.arange(int(np.log2(max(totals.min(), 1))), int(np.ceil(np.log2(totals.max() + 1))) + 1)
    counts, _ = np.histogram(totals, bins=edges)
    peak = counts.max()
    lines = []
    for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True):
        bar = "#" * max(1 if c else 0, round(width * c / peak))
        lines.append(f"  {int(lo):>8,} - {int(hi) - 1:>8,}  {c:>9,}  {bar}")
    return "\n".join(lines)
