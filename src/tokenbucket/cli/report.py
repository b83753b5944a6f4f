"""``tokenbucket report``: per-bucket latency, memory and risk of a training run's JSONL log.

tokenbucket report RUN.jsonl [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenbucket.monitor.report import read_events, write_report
from tokenbucket.monitor.stats import format_summary, summarize_events

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="the monitor's RUN.jsonl")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, help="also write four PNG plots and a self-contained report.html here")


def run(args: argparse.Namespace) -> int:
    log = read_events(args.run)
    rows = summarize_events(log.events)
    counts = log.counts()
    if args.json:
        print(json.dumps({"buckets": rows, "events": counts, "partial_last_line": log.partial_last_line}))
    else:
        print(format_summary(rows))
        print(f"events: {len(log.of('step')):,} steps, " + ", ".join(f"{k} {n:,}" for k, n in counts.items()))
        if log.partial_last_line:
            print(f"note: the last line of {args.run} was cut short (killed run?) and was skipped")
    if args.out is not None:
        files = write_report(log, args.out)
        if not args.json:
            print(f"report written to {files.html} (plots beside it)")
    return 0
