"""``tokenbucket tokens``: the token breakdown of a metadata file, or of one ``--sample``.

tokenbucket tokens METADATA [--config F] [--json] [spec flags]
tokenbucket tokens --sample '{"cameras":4,"frames":16,"height":224,"width":224}' --patch 14 --json
"""

from __future__ import annotations

import argparse
import json

from tokenbucket._exceptions import UsageError
from tokenbucket.cli._common import _add_spec_flags, _sample_arg, spec_from_args
from tokenbucket.cli._tables import _print_summary
from tokenbucket.tokens.breakdown import breakdown_sample, breakdown_table
from tokenbucket.tokens.metadata import read_metadata

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = 'tokenbucket tokens --sample \'{"cameras":4,"frames":16,"height":224,"width":224}\' --patch 14'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("metadata", nargs="?", help="Parquet/JSONL/CSV file or a directory of parts")
    parser.add_argument("--sample", help="one sample as a JSON object (inline or @file.json)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--on-invalid",
        choices=["raise", "reject"],
        default="raise",
        help="stop at the first bad row, or report bad rows and go on",
    )
    _add_spec_flags(parser)


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    if args.sample is not None:
        if args.metadata is not None:
            raise UsageError("give either METADATA or --sample, not both")
        bd = breakdown_sample(_sample_arg(args.sample), spec)
        if args.json:
            print(json.dumps(bd.to_dict()))
        else:
            for k, v in bd.to_dict().items():
                if k != "cameras":
                    print(f"{k:>8}  {v:,}" if isinstance(v, int) else f"{k:>8}  {v}")
            for c in bd.cameras:
                print(
                    f"  {c.name}: {c.frames} frames {c.height}x{c.width} -> {c.temporal} x {c.spatial} "
                    f"= {c.tokens:,}{' (empty slot)' if c.empty_slot else ''}"
                )
        return 0
    if args.metadata is None:
        raise UsageError("tokens needs METADATA (a file or directory) or --sample JSON")
    table = read_metadata(args.metadata, key=spec.columns.key, absent=spec.absent_as_zero())
    result = breakdown_table(table, spec, on_invalid=args.on_invalid)
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary, str(args.metadata))
        for row in result.rejected.slice(0, 5).to_pylist():
            print(f"  rejected: {row['message']}")
        if result.rejected.num_rows > 5:
            print(f"  ... and {result.rejected.num_rows - 5:,} more rejected rows")
    return 0
