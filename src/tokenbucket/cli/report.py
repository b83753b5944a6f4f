"""``tokenbucket report``: per-bucket latency, memory and risk of a training run's JSONL log.

tokenbucket report RUN.jsonl [--json] [--out DIR]

A log with no step events is an error (there is nothing to report); lines a killed run cut short
are skipped, each with a warning on stderr. ``--out`` replaces only report files an earlier
report wrote (NOTE [ Report folder ] in :mod:`tokenbucket.monitor.report`).

Risk, in the table and the plots, is a batch's predicted peak memory / the plan's budget (NOTE
[ Risk ] in :mod:`tokenbucket.monitor.report`).

A 2D run (its buckets bound image tokens too) shows each bucket's two bounds in the table, then
its buckets as a grid, a row per length bound and a column per image-token bound (``grid`` in
``--json``; NOTE [ The 2D report grid ] in :mod:`tokenbucket.monitor._grid`).

A distributed run's log (its steps carry every rank's times) adds the rank imbalance, slowest
rank / mean - 1 summed over the run and per epoch, measured and predicted (``ranks`` in
``--json``; NOTE [ Rank balance ] in :mod:`tokenbucket.monitor.ranks`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenbucket._exceptions import ConfigError
from tokenbucket.cli._common import progress_from_args
from tokenbucket.monitor._grid import format_grid
from tokenbucket.monitor.ranks import format_rank_balance, rank_balance_of_events
from tokenbucket.monitor.report import check_report_dir, read_events, run_grid, write_report
from tokenbucket.monitor.stats import format_summary, summarize_events

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = "tokenbucket report tokenbucket-demo/run.jsonl --out report"

# shown under `tokenbucket report --help` (NOTE [ Risk ])
RISK_HELP = """\
risk = a batch's predicted peak memory / the plan's budget (the budget is already about 10 % under the
GPU's usable memory). The plan keeps its own batches at or below 1.0; the monitor's
risk_threshold (BucketMonitor(risk_threshold=1.0), the dashed line on risk.png) flags batches
above it. If the drift column (measured / predicted peak) runs above 1, set the threshold to
about 1 / drift (0.9 for a model 10 % low); above 1.0 it hides batches that may OOM."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = f"{parser.description}\n\n{RISK_HELP}"
    parser.add_argument("run", type=Path, help="the monitor's RUN.jsonl")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the per-bucket rows as one JSON object (a 2D run's also its bucket grid, under 'grid')",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="also write five PNG plots (latency, memory, risk, throughput, and buckets.png: peak memory "
        "per bucket against the budget beside its step time) and a self-contained report.html here "
        "(a new folder, or an earlier report's)",
    )


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        check_report_dir(args.out, name="--out")  # before any work, and before anything is printed
    log = read_events(args.run)
    if not log.of("step"):
        raise ConfigError(
            f"run log {str(args.run)!r} holds no step events ({len(log.events)} events of other types): "
            "nothing to report"
        )
    for line in log.skipped_lines:
        print(
            f"tokenbucket report: warning: run log {str(args.run)!r} line {line} was cut short "
            "(killed run?) and was skipped",
            file=sys.stderr,
        )
    rows = summarize_events(log.events)
    counts = log.counts()
    grid = run_grid(log, rows)  # None for a 1D run, whose output stays as it was
    ranks = rank_balance_of_events(log.events)  # None for a one-process run, whose output stays as it was
    if args.json:
        out = {
            "buckets": rows,
            "events": counts,
            "partial_last_line": log.partial_last_line,
            "skipped_lines": list(log.skipped_lines),
        }
        if grid is not None:
            out["grid"] = grid
        if ranks is not None:
            out["ranks"] = ranks
        print(json.dumps(out))
    else:
        print(format_summary(rows))
        if grid is not None:
            print(f"\n{format_grid(grid)}\n")
        print(f"events: {len(log.of('step')):,} steps, " + ", ".join(f"{k} {n:,}" for k, n in counts.items()))
        if ranks is not None:
            print(format_rank_balance(ranks))
    if args.out is not None:
        files = write_report(log, args.out, progress=progress_from_args(args))
        if not args.json:
            print(f"report written to {files.html} (plots beside it)")
    return 0
