"""``tokenbucket inspect``: the plan and length histogram of a manifest.

    tokenbucket inspect manifest.parquet [--json] [--plot hist.png]

(The module is ``inspect_``, not ``inspect``: a file named like the standard library's ``inspect``
would shadow it whenever this folder is on ``sys.path``, e.g. ``python src/tokenbucket/cli/main.py``.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.cli._common import _histogram, _plan_json, _print_plan
from tokenbucket.plan.manifest import Manifest, load_manifest

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = "tokenbucket inspect manifest.parquet --plot hist.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "manifest", type=Path, help="a manifest `tokenbucket plan` wrote (.parquet or a folder of parts)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan and summary as one JSON object")
    parser.add_argument("--plot", type=Path, help="write a PNG histogram with the bucket bounds")


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
        _plot_histogram(manifest, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _plot_histogram(manifest: Manifest, path: Path) -> None:
    try:
        import matplotlib.pyplot as plt  # optional: the `plot` extra; only --plot needs it
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'tokenbucket[plot]'") from None
    plt.switch_backend("Agg")

    totals = manifest.table.column("total").drop_null().to_numpy()
    fig, ax = plt.subplots(figsize=(10, 4))
    bins = np.geomspace(max(1, totals.min()), totals.max() + 1, 120).tolist()
    ax.hist(totals, bins=bins, color="#4c72b0")
    for b in manifest.plan.buckets:
        ax.axvline(b.bound, color="#dd8452", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("L_total (tokens); orange lines: bucket bounds")
    ax.set_ylabel("samples")
    ax.set_title(f"{len(manifest):,} samples, {len(manifest.plan.buckets)} buckets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
