"""``tokenbucket inspect``: the plan and length histogram of a manifest.

    tokenbucket inspect manifest.parquet [--json] [--plot hist.png]

(The module is ``inspect_``, not ``inspect``: a file named like the standard library's ``inspect``
would shadow it whenever this folder is on ``sys.path``, e.g. ``python src/tokenbucket/cli/main.py``.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokenbucket.cli._tables import _histogram, _plan_json, _print_plan
from tokenbucket.monitor.report import pyplot
from tokenbucket.plan.manifest import Manifest, load_manifest

if TYPE_CHECKING:  # matplotlib is the optional `plot` extra: imported only by pyplot()
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["EXAMPLE", "add_arguments", "plan_figure", "run"]

EXAMPLE = "tokenbucket inspect manifest.parquet --plot hist.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "manifest", type=Path, help="a manifest `tokenbucket plan` wrote (.parquet or a folder of parts)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan and summary as one JSON object")
    parser.add_argument(
        "--plot",
        type=Path,
        help="write a PNG: the L_total histogram with the bucket bounds (rejected samples shaded) beside "
        "each bucket's predicted peak memory against the budget (needs the `plot` extra: matplotlib)",
    )


def run(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.manifest)  # verified; no spec to compare here (none is given)
    summary = manifest.summary()  # as `plan` printed it: rows refused as invalid count as rejected
    if args.json:
        out = {**_plan_json(manifest.plan), "summary": summary}
        out["rows"] = len(manifest)
        out["meta"] = manifest.meta.get("meta", {})
        print(json.dumps(out))
    else:
        print(
            f"{args.manifest}: {len(manifest):,} rows, created {manifest.meta.get('created')}, "
            f"hash {manifest.content_hash[:12]}"
        )
        _print_plan(manifest.plan, summary)
        totals = manifest.table.column("total").drop_null().to_numpy()
        if len(totals):
            print("\nL_total histogram (log2 bins):")
            print(_histogram(totals))
    if args.plot is not None:
        _plot(manifest, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def plan_figure(manifest: Manifest) -> Figure:
    """The manifest as a picture: the ``L_total`` histogram with the bucket bounds, beside each
    bucket's predicted peak memory against the budget.

    Left: samples per length (log bins; the samples in a bucket in blue, those rejected, bucket
    -1, shaded red), a vertical line at each bucket bound. Right: one bar per bucket at its
    predicted peak, a horizontal line at the plan's budget. Rows rejected as invalid have no
    length and are counted in the legend only.

    Raises:
        ConfigError: matplotlib (the ``plot`` extra) is not installed.
    """
    plt = pyplot()
    table = manifest.table.select(["total", "bucket"])
    bucket = table.column("bucket").to_numpy()
    totals = table.column("total").fill_null(0).to_numpy()
    has_length = table.column("total").is_valid().to_numpy(zero_copy_only=False)
    kept, rejected = totals[bucket >= 0], totals[(bucket < 0) & has_length]
    invalid = int(((bucket < 0) & ~has_length).sum())
    plan = manifest.plan

    fig: Figure
    lengths: Axes
    memory: Axes
    fig, (lengths, memory) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    shown = np.concatenate([kept, rejected])
    shown = shown[shown > 0]
    if len(shown):
        bins = np.geomspace(max(1, int(shown.min())), int(shown.max()) + 1, 80).tolist()
        lengths.hist(kept, bins=bins, color="#4c72b0", label=f"in a bucket ({len(kept):,})")
        if len(rejected):
            lengths.hist(rejected, bins=bins, color="#c44e52", alpha=0.6, label=f"rejected ({len(rejected):,})")
        lengths.set_xscale("log")
    for k, b in enumerate(plan.buckets):
        lengths.axvline(b.bound, color="#dd8452", lw=0.9, label="bucket bounds" if k == 0 else None)
    if invalid:
        lengths.plot([], [], " ", label=f"invalid rows, no length ({invalid:,})")  # a legend entry only
    lengths.set(
        xlabel="L_total (tokens)", ylabel="samples", title=f"{len(manifest):,} samples, {len(plan.buckets)} buckets"
    )
    lengths.legend(fontsize="small")

    top = max([plan.budget_bytes, *(b.predicted_peak_bytes for b in plan.buckets)])
    unit, scale = ("GiB", 2.0**30) if top >= 2**30 else ("MiB", 2.0**20)
    x = list(range(len(plan.buckets)))
    bars = memory.bar(
        x, [b.predicted_peak_bytes / scale for b in plan.buckets], 0.6, color="#4c72b0", label="predicted peak"
    )
    if len(plan.buckets) <= 16:  # more labels than that run into each other
        memory.bar_label(bars, labels=[f"x{b.batch_size}" for b in plan.buckets], fontsize="x-small", padding=1)
    budget = plan.budget_bytes / scale
    memory.axhline(budget, color="#c44e52", lw=1.2, ls="--", label=f"budget {budget:,.2f} {unit}")
    step = max(1, len(x) // 12)  # at most about a dozen tick labels
    memory.set_xticks(x[::step], [f"{plan.buckets[i].bound:,}" for i in x[::step]], rotation=45, fontsize="small")
    labelled = "; bar label: batch size" if len(plan.buckets) <= 16 else ""
    memory.set(xlabel=f"bucket bound (tokens){labelled}", ylabel=f"predicted peak ({unit})")
    memory.set_ylim(0, top / scale * 1.2)  # room above the budget line for the legend
    memory.set_title("predicted peak per bucket vs the budget")
    memory.legend(fontsize="small", loc="upper right", ncols=2)
    fig.tight_layout()
    return fig


def _plot(manifest: Manifest, path: Path) -> None:
    fig = plan_figure(manifest)
    try:
        fig.savefig(path, dpi=110)
    finally:
        pyplot().close(fig)
