"""``tokenbucket calibrate``: fit the step-time model and memory offsets to a training run's log.

tokenbucket calibrate RUN.jsonl [--out CALIBRATION.json] [--check OTHER.jsonl] [--json]

The fit (NOTE [ Calibration fit ]) is the fixed cost per step, the saturated FLOP/s and the
utilisation curve's half point, from the monitor's step events (each shape's first step left
out); per bucket the mean step time measured beside the run's own prediction, step time
proportional to FLOPs (its best constant) and the calibrated model. ``--check`` scores the
calibration on another run's log (held out). ``plan --calibration FILE`` plans with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tokenbucket.monitor.calibrate import calibrate_log, compare, plan_buckets_of, step_records
from tokenbucket.monitor.report import read_events

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = "tokenbucket calibrate tokenbucket-demo/run.jsonl --out calibration.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="the monitor's RUN.jsonl (its step events carry FLOPs)")
    parser.add_argument(
        "--out",
        type=Path,
        metavar="CALIBRATION.json",
        help="write the calibration here (replaces only an earlier calibration); `plan --calibration` takes it",
    )
    parser.add_argument(
        "--check", type=Path, metavar="OTHER.jsonl", help="also score the calibration on another run's log (held out)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")


def run(args: argparse.Namespace) -> int:
    cal = calibrate_log(args.run)
    held: dict[str, Any] | None = None
    if args.check is not None:
        log = read_events(args.check)
        bounds = {k: bound for k, bound, _ in plan_buckets_of(log)}
        held = compare(cal, step_records(log), bounds=bounds)
    if args.out is not None:
        cal.save(args.out)
    if args.json:
        print(json.dumps({**cal.to_dict(), **({"check": held} if held is not None else {})}))
        return 0
    _print(cal.stats, f"fitted on {args.run}")
    if held is not None:
        _print(held, f"held out: {args.check}")
    st = cal.step_time
    print(
        f"\nstep time = {st.fixed_seconds * 1e3 if st.fixed_seconds is not None else 0:,.2f} ms fixed + FLOPs / "
        f"({st.peak_flops * st.mfu:.3e} FLOP/s x min(1, T / {st.knee_tokens:,.0f})), T = padded tokens per step"
    )
    if not cal.stats.get("knee_found", True):
        print("  (every step lay above the knee, so the log cannot place it: the run's own knee is kept)")
    offsets = cal.memory_offsets
    if offsets:
        worst = max(offsets.items(), key=lambda kv: kv[1])
        print(
            f"memory: measured - predicted peak per bound, largest {worst[1] / 2**20:+,.1f} MiB at {worst[0]:,} tokens "
            f"({len(offsets)} bounds measured; a positive offset lowers that bucket's batch size)"
        )
    else:
        print("memory: no measured peaks in the log (a CPU run), so no memory offsets")
    if args.out is not None:
        print(f"calibration: {args.out} (plan ... --calibration {args.out})")
    return 0


def _print(stats: dict[str, Any], title: str) -> None:
    print(f"{title}: {stats['steps_used']} steps (each shape's first left out)")
    print(
        f"  {'bucket':>6} {'bound':>7} {'steps':>6} {'measured ms':>12} {'planned':>9} {'FLOPs only':>11} {'calibrated':>11}"
    )

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:,.1f}"

    for r in stats["buckets"]:
        bound = "-" if r["bound"] is None else f"{r['bound']:,}"
        print(
            f"  {r['bucket']:>6} {bound:>7} {r['steps']:>6} {ms(r['measured_s']):>12} {ms(r['planned_s']):>9} "
            f"{ms(r['flops_only_s']):>11} {ms(r['calibrated_s']):>11}"
        )

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    print(
        f"  mean error per bucket: planned {pct(stats['error_planned'])}, FLOPs only {pct(stats['error_flops_only'])}, "
        f"calibrated {pct(stats['error_calibrated'])}"
    )
