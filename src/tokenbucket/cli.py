"""The ``tokenbucket`` command: thin wrappers over the library's functions.

    tokenbucket tokens METADATA [--config F] [--json] [spec flags]
    tokenbucket tokens --sample '{"cameras":4,"frames":16,"height":224,"width":224}' --patch 14 --json
    tokenbucket demo [--out DIR] [--samples N] [--seed S]

Every :class:`~tokenbucket.spec.TokenSpec` field has a flag, so a quick question needs no
config file; flags override ``--config``'s ``[tokens]`` section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import ConfigError, TokenbucketError

__all__ = ["main"]


def _size(text: str) -> tuple[int, int]:
    parts = text.lower().replace("×", "x").split("x")
    try:
        if len(parts) == 1:
            return int(parts[0]), int(parts[0])
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH or SIDE, got {text!r}")


def _add_spec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("token spec (each overrides --config)")
    g.add_argument("--config", type=Path, help="tokenbucket.toml whose [tokens] section is the base spec")
    g.add_argument("--patch", type=int, help="patch side in pixels (default 14)")
    g.add_argument("--resize", choices=["pad", "crop", "fixed", "max_pixels"], help="resize policy")
    g.add_argument("--fixed-size", type=_size, metavar="HxW", help="frame size for --resize fixed")
    g.add_argument("--min-pixels", type=int, help="lower pixel bound for --resize max_pixels")
    g.add_argument("--max-pixels", type=int, help="upper pixel bound for --resize max_pixels")
    g.add_argument("--merge", type=int, help="spatial token merger side (2 = 2x2)")
    g.add_argument("--tubelet", type=int, help="frames per temporal token")
    g.add_argument("--causal-first-frame", action=argparse.BooleanOptionalAction, default=None,
                   help="keep frame 0 apart: 1 + ceil((frames-1)/tubelet)")
    g.add_argument("--tokens-per-frame", type=int, help="resampler output per frame (replaces patches)")
    g.add_argument("--special-per-frame", type=int, help="special tokens per temporal token")
    g.add_argument("--special-per-camera", type=int, help="special tokens per camera")
    g.add_argument("--camera-slots", type=int, help="fixed camera slots (empty ones still cost)")
    g.add_argument("--camera-names", help="comma-separated names of the flat schema's camera positions")
    g.add_argument("--override", action="append", default=[], metavar="CAMERA:FIELD=VALUE",
                   help="per-camera override, e.g. wrist:tokens_per_frame=64 (repeatable)")
    for name in ("text", "proprio", "action", "memory"):
        g.add_argument(f"--{name}", metavar="RULE",
                       help=f"{name} tokens: N, COLUMN, N*K, COLUMN*K; '?' after a column makes it optional")
    g.add_argument("--extra", action="append", default=[], metavar="NAME=RULE", help="named extra modality (repeatable)")
    g.add_argument("--column", action="append", default=[], metavar="FIELD=NAME",
                   help="metadata column mapping, e.g. key=episode_id or cameras=views (repeatable)")


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"{flag} should look like NAME=VALUE, but got {flag} {item!r}")
        out.append((name.strip(), value.strip()))
    return out


def spec_from_args(args: argparse.Namespace) -> Any:
    """The :class:`TokenSpec` that ``--config`` and the spec flags describe."""
    from tokenbucket.spec import TokenSpec

    data: dict[str, Any] = {}
    if args.config is not None:
        from tokenbucket._config import load_toml_section

        data = load_toml_section(args.config, "tokens")
    flags = {
        "patch": args.patch,
        "resize": args.resize,
        "fixed_size": args.fixed_size,
        "min_pixels": args.min_pixels,
        "max_pixels": args.max_pixels,
        "merge": args.merge,
        "tubelet": args.tubelet,
        "causal_first_frame": args.causal_first_frame,
        "tokens_per_frame": args.tokens_per_frame,
        "special_per_frame": args.special_per_frame,
        "special_per_camera": args.special_per_camera,
        "camera_slots": args.camera_slots,
        "text": args.text,
        "proprio": args.proprio,
        "action": args.action,
        "memory": args.memory,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.resize == "fixed" and args.fixed_size is None and "fixed_size" not in data:
        raise ConfigError("--resize fixed needs --fixed-size HxW")
    if args.camera_names:
        data["camera_names"] = [n.strip() for n in args.camera_names.split(",") if n.strip()]
    overrides = {k: dict(v) for k, v in data.get("overrides", {}).items()}
    for item in args.override:
        camera, sep, rest = item.partition(":")
        if not sep:
            raise ConfigError(f"--override should look like CAMERA:FIELD=VALUE, but got --override {item!r}")
        for fld, value in _pairs([rest], "--override"):
            overrides.setdefault(camera, {})[fld] = _parse_value(value)
    if overrides:
        data["overrides"] = overrides
    if args.extra:
        extras = dict(data.get("extras", {}))
        extras.update(_pairs(args.extra, "--extra"))
        data["extras"] = extras
    if args.column:
        columns = dict(data.get("columns", {}))
        columns.update(_pairs(args.column, "--column"))
        data["columns"] = columns
    return TokenSpec.from_dict(data)


def _print_summary(summary: dict[str, Any], source: str, out: Any = None) -> None:
    out = out or sys.stdout
    print(f"{source}: {summary['count']:,} samples, {summary['rejected']:,} rejected, "
          f"{summary['tokens']:,} tokens", file=out)
    if summary["count"]:
        print("L_total   " + "  ".join(f"{k}={summary[k]:,}" for k in ("min", "p50", "p90", "p99", "max"))
              + f"  mean={summary['mean']:,.0f}", file=out)
    print("share     " + "  ".join(f"{k} {v:6.1%}" for k, v in summary["share"].items()), file=out)


def _cmd_tokens(args: argparse.Namespace) -> int:
    from tokenbucket.breakdown import breakdown_sample, breakdown_table
    from tokenbucket.metadata import read_metadata

    spec = spec_from_args(args)
    if args.sample is not None:
        if args.metadata is not None:
            raise ConfigError("give either METADATA or --sample, not both")
        try:
            sample = json.loads(args.sample)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--sample should be a JSON object, but got {args.sample!r} ({exc})") from None
        if not isinstance(sample, dict):
            raise ConfigError(f"--sample should be a JSON object, but got {args.sample!r}")
        bd = breakdown_sample(sample, spec)
        if args.json:
            print(json.dumps(bd.to_dict()))
        else:
            for k, v in bd.to_dict().items():
                if k != "cameras":
                    print(f"{k:>8}  {v:,}" if isinstance(v, int) else f"{k:>8}  {v}")
            for c in bd.cameras:
                print(f"  {c.name}: {c.frames} frames {c.height}x{c.width} -> {c.temporal} x {c.spatial} "
                      f"= {c.tokens:,}{' (empty slot)' if c.empty_slot else ''}")
        return 0
    if args.metadata is None:
        raise ConfigError("tokens needs METADATA (a file or directory) or --sample JSON")
    table = read_metadata(args.metadata)
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


def _histogram(totals: Any, width: int = 40) -> str:
    import numpy as np

    edges = 2 ** np.arange(int(np.log2(max(totals.min(), 1))), int(np.ceil(np.log2(totals.max() + 1))) + 1)
    counts, _ = np.histogram(totals, bins=edges)
    peak = counts.max()
    lines = []
    for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True):
        bar = "#" * max(1 if c else 0, round(width * c / peak))
        lines.append(f"  {int(lo):>8,} - {int(hi) - 1:>8,}  {c:>9,}  {bar}")
    return "\n".join(lines)


def _cmd_demo(args: argparse.Namespace) -> int:
    import time

    import pyarrow.parquet as pq

    from tokenbucket.breakdown import breakdown_table
    from tokenbucket.metadata import read_metadata
    from tokenbucket.spec import TokenSpec
    from tokenbucket.testing import mixture_a

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metadata.parquet"
    print(f"1. writing {args.samples:,} samples of mixture A (multi-camera, seed {args.seed}) to {path}")
    pq.write_table(mixture_a(args.samples, seed=args.seed), path)
    spec = TokenSpec(patch=14)
    print(f"2. token spec: patch {spec.patch}, resize {spec.resize}; text/proprio/action/memory from columns")
    start = time.perf_counter()
    result = breakdown_table(read_metadata(path), spec, per_camera=True)
    seconds = time.perf_counter() - start
    print(f"3. read + validated + counted in {seconds:.2f} s ({args.samples / seconds:,.0f} rows/s)\n")
    _print_summary(result.summary(), str(path))
    print("\nL_total histogram (log2 bins; the tail is what a fixed batch size OOMs on):")
    print(_histogram(result.totals))
    biggest = result.table.sort_by([("total", "descending")]).slice(0, 3).to_pylist()
    print("\nlargest samples (the ones that OOM a naive batch):")
    meta = read_metadata(path).take([r["index"] for r in biggest]).to_pylist()
    for r, m in zip(biggest, meta, strict=True):
        print(f"  {r['key']}: {m['cameras']} cameras x {m['frames']} frames x {m['height']}px "
              f"-> {r['total']:,} tokens (vision {r['vision']:,})")
    wd = dataclasses.replace(spec, tubelet=2)
    halved = breakdown_table(read_metadata(path), wd).summary()
    print(f"\nwith tubelet=2 the p99 drops from {result.summary()['p99']:,} to {halved['p99']:,} tokens")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenbucket", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    tokens = sub.add_parser("tokens", help="token breakdown of a metadata file or of one --sample")
    tokens.add_argument("metadata", nargs="?", help="Parquet/JSONL/CSV file or a directory of parts")
    tokens.add_argument("--sample", help="one sample as a JSON object")
    tokens.add_argument("--json", action="store_true", help="print JSON")
    tokens.add_argument("--on-invalid", choices=["raise", "reject"], default="raise",
                        help="stop at the first bad row, or report bad rows and go on")
    _add_spec_flags(tokens)
    tokens.set_defaults(func=_cmd_tokens)

    demo = sub.add_parser("demo", help="the main job on a realistic multi-camera dataset")
    demo.add_argument("--out", default="tokenbucket-demo", help="directory for the demo's files")
    demo.add_argument("--samples", type=int, default=200_000, help="number of samples")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except TokenbucketError as exc:
        print(f"tokenbucket {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
