"""The two plots docs/guides/workflow.md shows, made from real runs of the library (nothing drawn by hand).

Command (what docs/img/ holds):

    .venv/bin/python benchmarks/make_screenshots.py [--out docs/img] [--samples 20000]

* ``inspect.png``: ``tokenbucket inspect --plot`` of a manifest planned for an H100-SXM (the
  design document's 24-layer model, patch 14) over ``--samples`` rows of mixture A, samples
  that fit not even alone rejected: the ``L_total`` histogram with the bucket bounds and the
  rejected tail shaded, beside each bucket's predicted peak against the budget.
* ``report.png``: the report's ``buckets.png`` of the demo's short CPU training run under the
  monitor (:func:`tokenbucket.cli.demo.train_under_monitor`): peak memory per bucket against the
  budget beside the step time per bucket. A CPU run has no memory reader, so it shows the
  predicted peaks only; a GPU run adds the measured ones beside them.

Reference (2 CPU cores): about 30 s; inspect.png about 50 KB, report.png about 40 KB (the
script fails if either passes 150 KB).
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from matplotlib.figure import Figure

from tokenbucket.cli.demo import train_under_monitor
from tokenbucket.cli.inspect_ import plan_figure
from tokenbucket.cost.gpus import gpu_budget_bytes
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.monitor.report import bucket_figure, pyplot, read_events
from tokenbucket.plan.manifest import build_manifest
from tokenbucket.testing import mixture_a
from tokenbucket.tokens.spec import TokenSpec

MAX_BYTES = 150 * 1024
DPI = 90  # small files that still read well at the page's width


def _save(fig: Figure, path: Path) -> int:
    """Save ``fig`` as a PNG at ``path``; returns its size in bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    pyplot().close(fig)
    data = buffer.getvalue()
    if len(data) > MAX_BYTES:
        raise SystemExit(f"{path} would be {len(data):,} bytes, more than {MAX_BYTES:,}: lower DPI")
    path.write_bytes(data)
    return len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="folder for the PNGs")
    parser.add_argument("--samples", type=int, default=20_000, help="rows of mixture A to plan")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tokenbucket-screenshots-") as tmp:
        table = mixture_a(args.samples, seed=0)
        pq.write_table(table, Path(tmp) / "metadata.parquet")
        cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
        manifest = build_manifest(
            Path(tmp) / "metadata.parquet",
            TokenSpec(patch=14),
            cost,
            Path(tmp) / "manifest.parquet",
            budget_bytes=gpu_budget_bytes("H100-SXM"),
            on_oversize="reject",
        )
        size = _save(plan_figure(manifest), args.out / "inspect.png")
        print(f"{args.out / 'inspect.png'}: {size:,} bytes ({len(manifest.plan.buckets)} buckets)")

        training = train_under_monitor(table, Path(tmp))
        size = _save(bucket_figure(read_events(training["log"])), args.out / "report.png")
        print(f"{args.out / 'report.png'}: {size:,} bytes ({training['steps']} steps)")
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
