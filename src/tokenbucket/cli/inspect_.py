"""``tokenbucket inspect``: the plan and length histogram of a manifest.

    tokenbucket inspect manifest.parquet [--json] [--plot hist.png]
    tokenbucket inspect bucket_config.json --hf-config PIPELINE --gpu NAME [--text-tokens T] [--json]

An Open-Sora-style ``bucket_config`` (a ``.json`` of ``{"HxW": {frames: [probability, batch]}}``)
is checked against a GPU with a video DiT's cost model: every bucket that overflows, by how much,
and the largest batch that fits (:func:`tokenbucket.plan.video_buckets.check_bucket_config`).

A 2D manifest (its buckets bound image tokens too) plots the samples' (L_total, image tokens)
as a 2D histogram with each bucket drawn as a rectangle (NOTE [ The 2D report grid ]).

(The module is ``inspect_``, not ``inspect``: a file named like the standard library's ``inspect``
would shadow it whenever this folder is on ``sys.path``, e.g. ``python src/tokenbucket/cli/main.py``.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket.cli._common import positive_float
from tokenbucket.cli._packed_2d import is_two_cap, packed_report, print_packed
from tokenbucket.cli._staged import add_staged_flags
from tokenbucket.cli._tables import _histogram, _plan_json, _print_plan, dynamic_2d_line
from tokenbucket.cli._video_plan import run_bucket_config
from tokenbucket.monitor.report import pyplot
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.manifest import Manifest, load_manifest

if TYPE_CHECKING:  # matplotlib is the optional `plot` extra: imported only by pyplot()
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["EXAMPLE", "add_arguments", "bucket_rectangles", "plan_figure", "plan_figure_2d", "run"]

EXAMPLE = "tokenbucket inspect manifest.parquet --plot hist.png"


def _text_tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"should be a non-negative integer, but got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "manifest", type=Path, help="a manifest `tokenbucket plan` wrote (.parquet or a folder of parts)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan and summary as one JSON object")
    parser.add_argument(
        "--plot",
        type=Path,
        help="write a PNG: the L_total histogram with the bucket bounds (rejected samples shaded) beside "
        "each bucket's predicted peak memory against the budget; for a 2D plan, a 2D histogram of "
        "(L_total, image tokens) with each bucket drawn as a rectangle (needs the `plot` extra: matplotlib)",
    )
    group = parser.add_argument_group("an Open-Sora bucket_config (.json) checked for a video DiT on a GPU")
    group.add_argument("--gpu", help="the GPU the table is checked for (or --budget-gib)")
    group.add_argument("--budget-gib", type=positive_float, help="memory budget in GiB instead of a GPU's")
    group.add_argument("--text-tokens", type=_text_tokens, default=512, help="cached text tokens a clip (512)")
    add_staged_flags(parser)


def run(args: argparse.Namespace) -> int:
    if args.manifest.suffix == ".json":
        return run_bucket_config(args)
    if args.hf_config is not None or args.gpu is not None or args.budget_gib is not None:
        raise UsageError(
            "--hf-config, --gpu and --budget-gib check a bucket_config .json; a manifest holds its own plan"
        )
    manifest = load_manifest(args.manifest)  # verified; no spec to compare here (none is given)
    summary = manifest.summary()  # as `plan` printed it: rows refused as invalid count as rejected
    packed = packed_report(manifest) if is_two_cap(manifest.plan) else None  # NOTE [ A two-cap packed manifest ]
    if args.json:
        out = {**_plan_json(manifest.plan), "summary": summary, **({"packed_2d": packed} if packed else {})}
        out["rows"] = len(manifest)
        out["meta"] = manifest.meta.get("meta", {})
        print(json.dumps(out))
    else:
        print(
            f"{args.manifest}: {len(manifest):,} rows, created {manifest.meta.get('created')}, "
            f"hash {manifest.content_hash[:12]}"
        )
        if packed is not None:
            print_packed(packed, summary)
        else:
            _print_plan(manifest.plan, summary)
            if line := dynamic_2d_line(manifest.plan):
                print(line)
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

    A 2D plan's manifest is drawn by :func:`plan_figure_2d`.

    Raises:
        ConfigError: matplotlib (the ``plot`` extra) is not installed.
    """
    if manifest.plan.two_d:
        return plan_figure_2d(manifest)
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
    _peaks(memory, plan, [f"{b.bound:,}" for b in plan.buckets], "bucket bound (tokens)")
    fig.tight_layout()
    return fig


def _peaks(memory: Axes, plan: BucketPlan, names: list[str], what: str) -> None:
    """One bar per bucket at its predicted peak (labelled with its batch size), the budget a line."""
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
    memory.set_xticks(x[::step], [names[i] for i in x[::step]], rotation=45, fontsize="small")
    labelled = "; bar label: batch size" if len(plan.buckets) <= 16 else ""
    memory.set(xlabel=f"{what}{labelled}", ylabel=f"predicted peak ({unit})")
    memory.set_ylim(0, top / scale * 1.2)  # room above the budget line for the legend
    memory.set_title("predicted peak per bucket vs the budget")
    memory.legend(fontsize="small", loc="upper right", ncols=2)


def bucket_rectangles(plan: BucketPlan) -> list[tuple[int, int, int, int]]:
    """Each 2D bucket's ``(length_lo, length_hi, vision_lo, vision_hi)``, in plan order: from the
    previous band's bound to its bound, from its band's previous level (0 for the first) to its
    ``vision_bound`` (NOTE [ The 2D report grid ]).

    Example:
        >>> from tokenbucket.plan.bucket_plan import Bucket
        >>> def b(u, v): return Bucket(u, 1, 0, 0, 0, 0, 0, 0.0, 1.0, 0.0, vision_bound=v)
        >>> bucket_rectangles(BucketPlan("static", 1, (b(512, 0), b(512, 256), b(2048, 1024))))
        [(0, 512, 0, 0), (0, 512, 0, 256), (512, 2048, 0, 1024)]
    """
    vb = plan.vision_bounds
    if vb is None:
        raise ConfigError("bucket rectangles are a 2D plan's; this plan bounds lengths only")
    bounds, levels = plan.bounds.tolist(), vb.tolist()
    out = []
    for u, v in zip(bounds, levels, strict=True):
        below = [lv for w, lv in zip(bounds, levels, strict=True) if w == u and lv < v]
        out.append((max([w for w in bounds if w < u], default=0), u, max(below, default=0), v))
    return out


LINEAR_TOKENS = 64  # the 2D plot's axes are linear below this many tokens, logarithmic above


def _symlog_edges(top: int, bins: int) -> np.ndarray:
    """``bins`` histogram bins from 0 to ``top``: 4 linear ones to ``LINEAR_TOKENS``, geometric above."""
    if top <= LINEAR_TOKENS:
        return np.linspace(0, top, bins + 1)
    return np.concatenate([np.linspace(0, LINEAR_TOKENS, 5)[:-1], np.geomspace(LINEAR_TOKENS, top, bins - 3)])


def plan_figure_2d(manifest: Manifest) -> Figure:
    """A 2D plan's manifest as a picture: the samples' (L_total, image tokens) with the buckets,
    beside each bucket's predicted peak memory against the budget.

    Left: a 2D histogram of the samples in a bucket (colour: samples per cell, log scale; both
    axes linear up to ``LINEAR_TOKENS`` and logarithmic above), the
    rejected samples as red crosses, each bucket a rectangle (:func:`bucket_rectangles`) numbered
    at its top right corner. Right: as in :func:`plan_figure`, the bars labelled by both bounds.
    Rows rejected as invalid have no length and are counted in the legend only.

    Raises:
        ConfigError: matplotlib (the ``plot`` extra) is not installed.
    """
    plt = pyplot()
    table = manifest.table.select(["total", "vision", "bucket"])
    bucket = table.column("bucket").to_numpy()
    totals = table.column("total").fill_null(0).to_numpy()
    vision = table.column("vision").fill_null(0).to_numpy()
    has_length = table.column("total").is_valid().to_numpy(zero_copy_only=False)
    kept, rejected = bucket >= 0, (bucket < 0) & has_length
    invalid = int(((bucket < 0) & ~has_length).sum())
    plan = manifest.plan
    boxes = bucket_rectangles(plan)

    fig: Figure
    samples: Axes
    memory: Axes
    fig, (samples, memory) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
    x_top = max([1, *(hi for _, hi, _, _ in boxes), *totals[kept | rejected].tolist()])
    y_top = max([1, *(hi for _, _, _, hi in boxes), *vision[kept | rejected].tolist()])
    if kept.any():
        counts, xs, ys = np.histogram2d(
            totals[kept], vision[kept], bins=(_symlog_edges(x_top, 80), _symlog_edges(y_top, 60))
        )
        mesh = samples.pcolormesh(xs, ys, np.ma.masked_equal(counts.T, 0), cmap="Blues", norm="log")
        fig.colorbar(mesh, ax=samples, label=f"samples in a bucket ({int(kept.sum()):,})")
    if rejected.any():
        samples.scatter(
            totals[rejected],
            vision[rejected],
            s=8,
            marker="x",
            color="#c44e52",
            label=f"rejected ({int(rejected.sum()):,})",
        )
    for k, (l_lo, l_hi, v_lo, v_hi) in enumerate(boxes):
        samples.add_patch(
            plt.Rectangle(
                (l_lo, v_lo), l_hi - l_lo, v_hi - v_lo, fill=False, edgecolor="#dd8452", lw=1.2,
                label="buckets" if k == 0 else None,
            )
        )  # fmt: skip
        samples.annotate(str(k), (l_hi, v_hi), fontsize="x-small", ha="right", va="top", color="#dd8452")
    if invalid:
        samples.plot([], [], " ", label=f"invalid rows, no length ({invalid:,})")  # a legend entry only
    # most samples are short: both axes linear up to LINEAR_TOKENS, logarithmic above
    samples.set_xscale("symlog", linthresh=LINEAR_TOKENS)
    samples.set_yscale("symlog", linthresh=LINEAR_TOKENS)
    samples.set(
        xlim=(0, x_top * 1.1),
        ylim=(0, y_top * 1.1),
        xlabel="L_total (tokens)",
        ylabel="image tokens",
        title=f"{len(manifest):,} samples, {len(plan.buckets)} 2D buckets",
    )
    samples.legend(fontsize="small", loc="upper left")
    names = [f"{b.bound:,}/{b.vision_bound:,}" for b in plan.buckets]
    _peaks(memory, plan, names, "bucket bounds (tokens/image tokens)")
    fig.tight_layout()
    return fig


def _plot(manifest: Manifest, path: Path) -> None:
    fig = plan_figure(manifest)
    try:
        fig.savefig(path, dpi=110)
    finally:
        pyplot().close(fig)
