"""``tokenbucket replan``: a new plan for a manifest's samples from a training run's measured figures.

tokenbucket replan MANIFEST --from-log RUN.jsonl [--near F] [--calibration-out FILE] [--json]

Calibrates from the log (``tokenbucket calibrate``: NOTE [ Calibration fit ]), plans the
manifest's samples again with the model and GPU it records, wrapped in that calibration, and
prints the difference: per bucket the bound, batch size and seconds per step before and after,
the predicted epoch (the old plan as planned, the old plan under the calibration, the new plan),
and the old buckets whose measured peak came within ``--near`` of the budget. It writes no
manifest: ``plan METADATA ... --calibration FILE`` does, from the metadata.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.cli._common import unit_fraction
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.monitor.calibrate import calibrate_log, measured_peaks, plan_buckets_of, replan, step_records
from tokenbucket.monitor.report import read_events
from tokenbucket.plan.manifest import load_manifest

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = "tokenbucket replan tokenbucket-demo/manifest.parquet --from-log run.jsonl --calibration-out cal.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", type=Path, help="the manifest the run trained from (a block model's plan)")
    parser.add_argument(
        "--from-log", type=Path, required=True, metavar="RUN.jsonl", help="the monitor's log of the run"
    )
    parser.add_argument(
        "--near",
        type=unit_fraction,
        default=0.9,
        help="flag old buckets whose measured peak reached this share of the budget (default 0.9)",
    )
    parser.add_argument(
        "--calibration-out",
        type=Path,
        metavar="FILE",
        help="also write the calibration (replaces only an earlier calibration), for plan --calibration",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")


def run(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.manifest)
    where = f"manifest {str(args.manifest)!r}"
    recorded = manifest.meta.get("meta", {})
    model_dict = recorded.get("model")
    if not isinstance(model_dict, dict) or "hidden" not in model_dict:
        raise ConfigError(
            f"{where} records no block model (a staged or custom model's plan): replan it with "
            "`tokenbucket calibrate RUN.jsonl --out FILE` and `tokenbucket plan ... --calibration FILE`"
        )
    try:
        model = ModelSpec.from_dict(model_dict)
    except ConfigError as exc:
        raise ConfigError(f"{where}: its model: {exc}") from None
    cost = CostModel(model, recorded.get("gpu"))
    log = read_events(args.from_log)
    ran = [(bound, batch) for _, bound, batch in plan_buckets_of(log)]
    planned = [(b.bound, b.batch_size) for b in manifest.plan.buckets]
    if ran != planned:
        raise ConfigError(
            f"run log {str(args.from_log)!r} is not a run of {where}'s plan: its buckets (bound, batch size) "
            f"{ran[:3]}... differ from the manifest's {planned[:3]}..."
        )
    cal = calibrate_log(log)
    table = manifest.table
    buckets = table.column("bucket").to_numpy()
    lengths = np.asarray(table.column("total").to_numpy(zero_copy_only=False)[buckets >= 0], dtype=np.int64)
    peaks = measured_peaks(step_records(log))
    _, diff = replan(manifest.plan, lengths, cost, cal, measured_peaks=peaks, near=args.near)
    if args.calibration_out is not None:
        cal.save(args.calibration_out)
    if args.json:
        print(json.dumps({"calibration": cal.to_dict(), **diff}))
        return 0
    _print(diff, len(lengths), str(args.from_log))
    if args.calibration_out is not None:
        print(
            f"calibration: {args.calibration_out} (tokenbucket plan METADATA ... --calibration {args.calibration_out})"
        )
    return 0


def _print(diff: dict[str, Any], samples: int, log: str) -> None:
    old, new = diff["old"], diff["new"]
    print(f"replanned {samples:,} samples from {log}: {len(old)} buckets before, {len(new)} after")
    print(f"  {'#':>3} {'bound':>8} {'batch':>6} {'ms/step':>9}  ->  {'bound':>8} {'batch':>6} {'ms/step':>9}")
    for k in range(max(len(old), len(new))):
        a = old[k] if k < len(old) else None
        b = new[k] if k < len(new) else None

        def cells(r: dict[str, Any] | None) -> str:
            if r is None:
                return f"{'':>8} {'':>6} {'':>9}"
            return f"{r['bound']:>8,} {r['batch_size']:>6} {r['step_s'] * 1e3:>9,.1f}"

        print(f"  {k:>3} {cells(a)}  ->  {cells(b)}")
    e = diff["epoch_s"]
    planned = "(planned without a GPU: ranked by FLOPs)" if e["old_as_planned"] is None else (
        f"{e['old_as_planned'] / 3600:,.3f} h as planned"
    )  # fmt: skip
    print(
        f"predicted epoch: {planned}; {e['old_calibrated'] / 3600:,.3f} h under the calibration; "
        f"{e['new_calibrated'] / 3600:,.3f} h replanned"
    )
    near = diff["near_budget"]
    if near:
        for r in near:
            print(
                f"bucket {r['bucket']} (bound {r['bound']:,}) measured {r['measured_bytes'] / 2**30:,.2f} GiB, "
                f"{r['of_budget']:.0%} of the budget"
            )
    else:
        print(f"no bucket's measured peak reached {diff['near']:.0%} of the budget (or the run measured none)")
