"""``plan`` and ``inspect`` for a video diffusion transformer (plumbing of the CLI).

    tokenbucket plan CLIPS.parquet --hf-config PIPELINE --gpu H100-SXM --out plan.parquet
        [--frame-buckets 1,17,33,49,81] [--sizes 480x832,720x1280] [--export opensora bucket_config.json]
    tokenbucket inspect bucket_config.json --hf-config PIPELINE --gpu H100-SXM

Buckets of resolution x frames with the largest batch each that fits (NOTE [ Video buckets ] in
:mod:`tokenbucket.plan.video_buckets`), an Open-Sora ``bucket_config`` written from them, and one
read back and checked against a GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenbucket._config import read_json_file
from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket.cli._common import _budget, _gib
from tokenbucket.cli._dit import dit_cost_from_args, is_dit
from tokenbucket.plan.video_buckets import FRAME_BUCKETS, check_bucket_config, plan_video_buckets, write_video_plan
from tokenbucket.tokens.metadata import read_metadata

__all__ = ["add_video_flags", "refuse_video_flags", "run_bucket_config", "run_dit_plan"]


# -- plan ----------------------------------------------------------------------------------------

VIDEO_FLAGS = ("frame_buckets", "sizes", "export", "view_layout")
# plan flags of the length planner that a video DiT's plan does not take: (attribute, default)
_LENGTH_ONLY = (
    ("lerobot", None), ("lerobot_policy", None), ("plan_mode", "static"), ("buckets", "1d"), ("profile", None),
    ("calibration", None), ("engine", "local"), ("vision_share", None), ("feed", None), ("stills", None),
    ("on_invalid", "raise"),
)  # fmt: skip


def add_video_flags(parser: argparse.ArgumentParser) -> None:
    """``plan``'s flags for a video DiT's buckets."""
    video = parser.add_argument_group("a video DiT (--hf-config PIPELINE): buckets of resolution x frames")
    video.add_argument(
        "--frame-buckets",
        metavar="F,F,...",
        help="the frame counts a clip is trimmed down to (default 1,17,33,...,257: 8k+1, whole for every VAE)",
    )
    video.add_argument(
        "--sizes",
        metavar="HxW,HxW,...",
        help="the bucket sizes a clip is cut down to, the largest that fits inside it (default: its own size, "
        "cut to the pipeline's multiple)",
    )
    video.add_argument(
        "--export",
        nargs=2,
        metavar=("FORMAT", "PATH"),
        help="also write the plan as FORMAT to PATH (a new file): opensora (Open-Sora's bucket_config JSON)",
    )
    video.add_argument(
        "--view-layout",
        choices=["time", "batch"],
        help="a sample's cameras (a cameras or views column) laid along the latent time axis, one sequence "
        "(default), or as a batch of views",
    )


_FLAG = {"plan_mode": "--mode"}


def refuse_video_flags(args: argparse.Namespace) -> None:
    """The video DiT plan's flags given to any other plan: one line naming them."""
    given = [f"--{n.replace('_', '-')}" for n in VIDEO_FLAGS if getattr(args, n, None) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} go with a video DiT's plan: give --hf-config PIPELINE")


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} should be comma-separated positive integers, but got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} should be comma-separated positive integers, but got {text!r}")
    return values


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        try:
            h, w = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise UsageError(f"--sizes should be HxW,HxW,... in pixels (e.g. 480x832), but got {part!r}") from None
        if h < 1 or w < 1:
            raise UsageError(f"--sizes should be positive HxW, but got {part!r}")
        out.append((h, w))
    return out


def run_dit_plan(args: argparse.Namespace) -> int:
    """``tokenbucket plan METADATA --hf-config PIPELINE --gpu NAME --out plan.parquet``."""

    given = [
        _FLAG.get(n, f"--{n.replace('_', '-')}") for n, default in _LENGTH_ONLY if getattr(args, n, default) != default
    ]
    if given:
        raise UsageError(f"{', '.join(given)} plan by token lengths; a video DiT's plan buckets resolution x frames")
    if not args.metadata:
        raise UsageError("plan needs METADATA (files or directories with frames, height, width per clip)")
    budget = _budget(args)
    if budget is None:
        raise UsageError("plan needs a budget: --gpu NAME or --budget-gib X")
    export = None
    if args.export is not None:
        fmt, path = args.export
        if fmt != "opensora":
            raise UsageError(f"--export {fmt!r} is not a format tokenbucket writes; give opensora")
        export = Path(path)
        if export.exists():
            raise UsageError(f"--export {path!r} exists: tokenbucket writes a new file only (give another path)")
    cfg, cost = dit_cost_from_args(args)
    frames = _ints(args.frame_buckets, "--frame-buckets") if args.frame_buckets else list(FRAME_BUCKETS)
    sizes = _sizes(args.sizes) if args.sizes else None
    sources = [Path(m) for m in args.metadata]
    table = read_metadata(sources)
    plan = plan_video_buckets(table, cost, budget, frame_buckets=frames, sizes=sizes,
                              gpu=getattr(args, "gpu", None), view_layout=args.view_layout or "time", where=", ".join(map(str, args.metadata)))  # fmt: skip
    if plan.rejected and args.on_oversize == "error":
        row, why = plan.rejected[0]
        raise UsageError(
            f"{len(plan.rejected)} clip(s) cannot be planned, the first row {row}: {why} "
            "(give --on-oversize reject to plan the rest and list them)"
        )
    plan_json = {**plan.to_dict(), "model": cfg.class_name, "pipeline": str(args.hf_config), "setup": vars(cost.setup)}
    keys = table.column("key") if "key" in table.column_names else None
    try:
        write_video_plan(plan, args.out, keys=keys, meta={k: plan_json[k] for k in ("model", "pipeline", "setup")},
                         inputs=sources, force=args.force)  # fmt: skip
    except ConfigError as exc:  # a mistake in --out: "out ... exists and is not ..." as the flag says it
        raise UsageError(f"--{exc}") from None
    if export is not None:
        export.write_text(json.dumps(plan.to_opensora(), indent=1) + "\n")
    if args.json:
        print(json.dumps(plan_json))
        return 0
    s = cost.setup
    print(
        f"{cfg.class_name}: {len(table):,} clips -> {sum(1 for x in plan.buckets if x.batch_size)} buckets, "
        f"{len(plan.rejected):,} rejected; train {s.train}{', checkpointing' if s.checkpointing else ''}, "
        f"sharding {s.sharding} x {s.world_size}; budget {_gib(budget)}"
    )
    print(f"  {'frames':>6} {'size':>13} {'samples':>7} {'batch':>6} {'tokens':>9} {'peak':>12} {'step s':>8}")
    for x in plan.buckets:
        step = f"{x.step_seconds:.2f}" if x.step_seconds is not None else "-"
        size = f"{x.height}x{x.width}" + (f"x{x.views}v" if x.views > 1 else "")
        print(f"  {x.frames:>6} {size:>13} {x.samples:>7,} {x.batch_size:>6} "
              f"{x.video_tokens:>9,} {_gib(x.peak_bytes):>12} {step:>8}")  # fmt: skip
    if plan.epoch_seconds is not None:
        print(f"  predicted epoch on one rank: {plan.epoch_seconds:,.0f} s")
    print(f"wrote {args.out}" + (f" and {export} (Open-Sora bucket_config)" if export else ""))
    return 0


def run_bucket_config(args: argparse.Namespace) -> int:
    """A bucket_config checked against ``--gpu`` for the video DiT of ``--hf-config``."""
    if not is_dit(args):
        raise UsageError(f"{args.manifest} is a bucket_config: give the video DiT it is for, --hf-config PIPELINE")
    budget = _budget(args)
    if budget is None:
        raise UsageError("a bucket_config is checked against a GPU: give --gpu NAME or --budget-gib X")
    config = read_json_file(args.manifest, "bucket_config")
    cfg, cost = dit_cost_from_args(args)
    rows = check_bucket_config(config, cost, budget, text_tokens=args.text_tokens, where=str(args.manifest))
    over = [r for r in rows if not r["fits"]]
    if args.json:
        print(json.dumps({"model": cfg.class_name, "budget_bytes": budget, "buckets": rows, "overflowing": len(over)}))
        return 0
    print(
        f"{args.manifest}: {len(rows)} buckets for {cfg.class_name} checked against {_gib(budget)}: {len(over)} overflow"
    )
    print(f"  {'size':>11} {'frames':>6} {'batch':>6} {'peak':>12} {'over by':>12} {'fits at':>8}")
    for r in rows:
        size = f"{r['height']}x{r['width']}"
        over_by = _gib(r["over_bytes"]) if not r["fits"] else "-"
        pct = f" ({r['over_percent']:+.0f} %)" if not r["fits"] else ""
        print(f"  {size:>11} {r['frames']:>6} {r['batch_size']:>6} {_gib(r['peak_bytes']):>12} {over_by:>12}{pct} "
              f"{r['max_batch']:>8}")  # fmt: skip
    return 0
