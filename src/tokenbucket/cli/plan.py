"""``tokenbucket plan``: plan memory-safe buckets and write the manifest.

tokenbucket plan METADATA... [--config F] [--gpu NAME | --budget-gib X] [--max-buckets K]
                 [--mode static|dynamic] [--on-oversize error|reject] [--profile PROFILE.json]
                 --out manifest.parquet [--force] [--json]
tokenbucket plan --lerobot [NAME=]DATASET[:WEIGHT] [--lerobot ...] [--delta-timestamps JSON|@FILE.json]
                 [--cameras A,B] [--seed N] [plan flags as above]
tokenbucket plan --lerobot [NAME=]DATASET[:WEIGHT] ... --lerobot-policy DIR|pi0|pi05|smolvla [plan flags as above]
tokenbucket plan METADATA... --hf-config DIR | --preset STAGED [--train ...] [--sharding S --world-size N]
                 [--vision-share F] [--profile PROFILE.json (with --hf-config)] [--buckets 1d|2d]
                 [plan flags as above]
tokenbucket plan METADATA... --hf-config DIR | --preset STAGED --buckets 2d --mode dynamic [plan flags as above]

With a staged model (a Hugging Face config.json, or a staged preset) the token spec follows from
the model, and each bucket bound is priced as its worst sample: up to the vision share of its
tokens as images, the rest text (:class:`~tokenbucket.cost.staged_length.StagedLengthModel`).
With ``--buckets 2d`` each bucket bounds the image tokens as well, and is priced at both bounds
(NOTE [ Two-dimensional buckets ]); with ``--mode dynamic`` too, each batch is padded to its own
longest and most image tokens, and the manifest stores what cuts every epoch's batches, the
staged model included (NOTE [ A two-dimensional dynamic manifest ]).

With ``--lerobot-policy`` the LeRobot policy (pi0, pi0.5, SmolVLA as LeRobot 0.4.4 trains them)
counts each sample's tokens and prices each bucket
(:class:`~tokenbucket.cost.lerobot_plan.PolicyLengthModel`, NOTE [ A policy's lengths ]): a batch
size per bucket of a mixture of embodiments.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from tokenbucket._exceptions import ConfigError, OversizeError, UsageError
from tokenbucket.cli._common import (
    _add_model_flags,
    _add_spec_flags,
    _budget,
    _json_object_arg,
    _pairs,
    gpu_from_args,
    model_from_args,
    positive_float,
    positive_int,
    progress_from_args,
    share,
    spec_from_args,
)
from tokenbucket.cli._dit import is_dit
from tokenbucket.cli._lerobot import lerobot_policy_arg
from tokenbucket.cli._packed_2d import packed_report, print_packed, refuse_packed_flags, run_packed_2d
from tokenbucket.cli._staged import (
    add_staged_flags,
    is_staged,
    refuse_staged_flags,
    staged_cost_from_args,
    staged_record,
    staged_token_spec,
)
from tokenbucket.cli._tables import _plan_json, _print_plan, dynamic_2d_line
from tokenbucket.cli._video_plan import add_video_flags, refuse_video_flags, run_dit_plan
from tokenbucket.cost.calibration import CalibratedCostModel, Calibration, load_calibration
from tokenbucket.cost.gpus import GPU
from tokenbucket.cost.lerobot_plan import PolicyLengthModel
from tokenbucket.cost.lerobot_policy import LeRobotPolicy
from tokenbucket.cost.measured import MeasuredCostModel, ProfiledCostModel, SteppedCostModel, read_profile
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.staged import ERROR_BAND, StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel, measure_vision_share, staged_profile_key
from tokenbucket.plan.manifest import Manifest, build_manifest
from tokenbucket.tokens.lerobot import lerobot_rows
from tokenbucket.tokens.lerobot_mix import LeRobotSource, lerobot_mixture
from tokenbucket.tokens.spec import TokenSpec

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = (
    "tokenbucket plan tokenbucket-demo/metadata.parquet --patch 14 --preset design-24L-1024 --gpu H100-SXM "
    "--on-oversize reject --out manifest.parquet"
)

_NAMED = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)=(.+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("metadata", nargs="*", help="metadata files or directories (or give --lerobot)")
    parser.add_argument(
        "--lerobot",
        action="append",
        metavar="[NAME=]DATASET[:WEIGHT]",
        help="plan a LeRobot v2.x/v3.0 dataset from its meta/ folder (one sample per frame); repeat it to plan "
        "a mixture, whose keys are NAME/ep.../... (NAME: default the folder's name). WEIGHT repeats (2) or "
        "subsamples (0.5) the source's frames. A value that is an existing folder is always a plain DATASET",
    )
    parser.add_argument(
        "--delta-timestamps",
        metavar="JSON",
        help="with --lerobot: LeRobot's offsets in seconds per key (multiples of 1/fps), as a JSON object or "
        "@file.json; in a mixture each source takes the keys it has, or give {NAME: {key: [...]}} per source",
    )
    parser.add_argument(
        "--cameras",
        metavar="A,B",
        help="with --lerobot: the camera keys the policy uses (in a mixture, each source keeps those it has)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="with --lerobot weights: the seed that picks the frames a fractional weight keeps (default 0)",
    )
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="the manifest .parquet to write (or a directory of parts); an existing one is replaced "
        "only when it is a tokenbucket manifest",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="also replace an existing --out file that is not a manifest (never a directory, never an input)",
    )
    parser.add_argument("--gpu", help="GPU target, e.g. h100-sxm (see `tokenbucket gpus`; a unique prefix will do)")
    parser.add_argument("--budget-gib", type=positive_float, help="memory budget in GiB instead of a GPU's")
    parser.add_argument(
        "--max-buckets", type=positive_int, default=32, help="at most this many shapes (static mode; default 32)"
    )
    parser.add_argument(
        "--mode",
        dest="plan_mode",
        choices=["static", "dynamic", "packed"],
        default="static",
        help="static: at most K shapes; dynamic: batches padded to their own longest sample",
    )
    parser.add_argument(
        "--buckets",
        choices=["1d", "2d"],
        default="1d",
        help="1d (default): bound each bucket's LLM tokens; 2d: with --hf-config or a staged --preset, bound its "
        "image tokens too, so text-heavy samples are not batched as if all image (static, or --mode dynamic: each "
        "batch padded to its own longest and most image tokens, the manifest holding what re-cuts every epoch)",
    )
    parser.add_argument(
        "--on-oversize",
        choices=["error", "reject"],
        default="error",
        help="a sample too long to fit even alone: stop (error, the default) or reject it with its reason",
    )
    parser.add_argument(
        "--on-invalid",
        choices=["raise", "reject"],
        default="raise",
        help="a bad metadata row: stop at it (raise, the default) or reject it with its reason",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PROFILE.json",
        help="plan from a measured profile (`tokenbucket profile ... --save`): memory and batch sizes come from "
        "its fit, step times (to rank plans) from the analytic model the model flags describe, whose "
        "--precision must be the profile's. Refused: a profile for another --gpu, one of under 3 points, a "
        "bucket bound past its longest measured length (measure up to the longest sample rounded up to 64), "
        "--mode packed. A dynamic plan's sampler takes MeasuredCostModel(Profile.load(FILE)) as cost_model. "
        "With --hf-config: a profile of `profile --hf-config ... --save` (each length's worst sample; a bound "
        "priced at the next measured length), refused for another config or training setup or a lighter "
        "--vision-share",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="plan with a run's calibration (`tokenbucket calibrate RUN.jsonl --out FILE`): its fitted step time "
        "ranks the plans and its positive memory offsets (measured - predicted peak) lower the batch sizes",
    )
    parser.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local (default: this process) or ray (Ray Data: breakdowns and manifest parts per block in parallel, "
        "the driver holds only histograms and the plan; the manifest is byte-identical; needs tokenbucket[ray])",
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="with --engine ray: the cluster to join (e.g. ray://head:10001 or auto); default: a local Ray on "
        "this machine's cores, started and stopped by the command",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    add_video_flags(parser)
    _add_spec_flags(parser)
    _add_model_flags(parser, mode_flag="--model-mode")
    add_staged_flags(parser)
    parser.add_argument(
        "--vision-share",
        type=share,
        metavar="F",
        help="with --hf-config or a staged --preset: the largest share of a sample's LLM tokens that are image "
        "tokens, in [0, 1]; each bucket is priced as a sample of that many image tokens (whole images), the "
        "rest text. Default: measured, the largest vision/total over the metadata's samples",
    )
    parser.add_argument(
        "--feed",
        choices=["video", "images"],
        help="with --hf-config: how a camera of two frames or more reaches the model: video (default for a family "
        "with a video path: one clip through its video processor, frame pairs merged) or images (every frame one "
        "image, the way a VLA hands frames to the image processor)",
    )
    parser.add_argument(
        "--stills",
        metavar="CAM[,CAM]",
        help="with --hf-config: the cameras fed as images while the others are clips (e.g. a wrist camera)",
    )
    parser.add_argument(
        "--lerobot-policy",
        metavar="DIR_OR_PRESET",
        help="with --lerobot: plan for a LeRobot policy as LeRobot 0.4.4 trains it: its config.json (or the "
        "folder holding it) or a published default (pi0, pi05, smolvla); it counts each sample's tokens (its "
        "camera slots, padded language, state and action chunk) and prices each bucket's batch",
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# spec flags that say how an image becomes tokens: a staged model's config says that itself
_IMAGE_SPEC_FLAGS = (
    "config", "patch", "resize", "fixed_size", "min_pixels", "max_pixels", "merge", "tubelet", "causal_first_frame",
    "tokens_per_frame", "special_per_frame", "special_per_camera", "camera_slots", "override",
)  # fmt: skip


def _staged_spec(args: argparse.Namespace, cost: StagedCostModel) -> TokenSpec:
    """The staged model's token spec; the flags that say where counts are read (--column,
    --camera-names) and the non-image modalities (--text, --proprio, --action, --memory, --extra) apply."""
    given = [_flag(name) for name in _IMAGE_SPEC_FLAGS if getattr(args, name) not in (None, [])]
    if given:
        source = "--hf-config" if args.hf_config is not None else f"--preset {args.preset}"
        raise UsageError(f"{', '.join(given)} describe the token spec, which follows from {source}: drop them")
    stills = [n.strip() for n in (args.stills or "").split(",") if n.strip()]
    if args.stills is not None and not stills:
        raise UsageError(f"--stills should name cameras (CAM[,CAM]), but got {args.stills!r}")
    if stills and args.feed == "images":
        raise UsageError("--stills names the cameras fed as images among clips; with --feed images all are: drop one")
    data = staged_token_spec(cost, feed=args.feed, stills=stills).to_dict()
    data.update({m: getattr(args, m) for m in ("text", "proprio", "action", "memory") if getattr(args, m) is not None})
    if args.camera_names:
        data["camera_names"] = [n.strip() for n in args.camera_names.split(",") if n.strip()]
    if args.extra:
        data["extras"] = dict(_pairs(args.extra, "--extra"))
    if args.column:
        data["columns"] = {**data["columns"], **dict(_pairs(args.column, "--column"))}
    try:
        return TokenSpec.from_dict(data)
    except ConfigError as exc:
        raise UsageError(f"the token spec of {cost.model.name!r} with the flags given: {exc}") from None


def _staged_length(
    args: argparse.Namespace, cost: StagedCostModel, spec: TokenSpec, sources: list[str | Path], record: dict[str, Any]
) -> StagedLengthModel:
    """The planner's view of the staged model, with the vision share of ``--vision-share`` or
    measured over ``sources`` (one breakdown pass); adds the share and image size to ``record``."""
    share = args.vision_share
    source = "--vision-share"
    if share is None:
        share, source = measure_vision_share(sources, spec), "measured"
    try:
        length = StagedLengthModel(cost, vision_share=share)
    except ConfigError as exc:
        raise UsageError(f"--vision-share {share}: {exc}") from None
    record.update(
        vision_share=length.vision_share, vision_share_source=source,
        image=None if length.image is None else list(length.image), image_tokens=length.image_tokens,
    )  # fmt: skip
    return length


def _staged_profiled(
    path: Path, length: StagedLengthModel, gpu: GPU | None
) -> tuple[ProfiledCostModel, dict[str, Any]]:
    """A staged model's ``--profile`` (``profile --hf-config ... --length ... --save``): memory from
    the measured worst samples, step times from the staged model; every refusal names the file."""
    source = f"--profile {str(path)!r}"
    profile, sha256 = read_profile(path, source=source)
    made = profile.staged
    if made is None:
        raise ConfigError(f"{source} measured a block model (MODULE:FACTORY), not this --hf-config model")
    key = staged_profile_key(length.cost)
    if profile.model != key:
        raise ConfigError(
            f"{source} was made for model {profile.model}, not {key} (the config.json, its preprocessor and the "
            "training setup are hashed): profile again with this plan's --hf-config and training flags"
        )
    if length.vision_share > float(made["vision_share"]) + 1e-9:
        raise ConfigError(
            f"{source} measured samples of vision share {made['vision_share']:g}, lighter than this plan's "
            f"worst ({length.vision_share:g}): profile again with --vision-share {length.vision_share:g}"
        )
    image = None if length.image is None else list(length.image)
    if made.get("vision_share") and made.get("image") != image:
        raise ConfigError(f"{source} measured images of {made.get('image')}, not this plan's {image}: profile again")
    # NOTE [ A staged profile is a step function ]
    measured = SteppedCostModel(profile, target=None if gpu is None else gpu.name, source=source)
    cost = ProfiledCostModel(measured, length, source=source)
    # where the measurement and the staged model part by more than its band (-5 % ... +7 %)
    first = made.get("steps") == 1
    errors = [
        (100.0 * (length.cost.memory(b, length.sample(n), first_step=first).peak_bytes - peak) / peak, b, n)
        for b, n, peak in profile.points
    ]
    off = [e for e in errors if not ERROR_BAND[0] <= e[0] <= ERROR_BAND[1]]
    record = {"path": str(path), **cost.record(sha256)}
    record["staged_model_disagrees"] = [{"error_percent": round(e, 2), "batch": b, "length": n} for e, b, n in off]
    return cost, record


def _lerobot_source(text: str) -> tuple[Path, str, float, bool]:
    """One ``--lerobot [NAME=]DATASET[:WEIGHT]`` value: path, name, weight, and whether NAME or WEIGHT was given."""
    if Path(text).is_dir():
        return Path(text), "", 1.0, False
    match = _NAMED.fullmatch(text)
    name, rest = (match[1], match[2]) if match else ("", text)
    weight = 1.0
    if not Path(rest).is_dir() and ":" in rest:
        rest, weight_text = rest.rsplit(":", 1)
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight <= 0:
            raise UsageError(
                f"--lerobot {text!r}: WEIGHT should be a positive number, but got {weight_text!r} "
                f"(the form is [NAME=]DATASET[:WEIGHT])"
            )
        return Path(rest), name, weight, True
    return Path(rest), name, weight, match is not None


def _lerobot_metadata(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """Write ``--lerobot``'s rows to ``path`` (Parquet); returns what to record in the manifest.

    One plain ``--lerobot DATASET`` keeps the dataset's own keys (``ep.../...``); several, or a
    NAME or WEIGHT, make a mixture (:func:`~tokenbucket.tokens.lerobot_mix.lerobot_mixture`).
    """
    deltas = None if args.delta_timestamps is None else _json_object_arg(args.delta_timestamps, "--delta-timestamps")
    cameras = None
    if args.cameras is not None:
        cameras = [c.strip() for c in args.cameras.split(",") if c.strip()]
        if not cameras:
            raise UsageError(f"--cameras should name at least one camera key, but got --cameras {args.cameras!r}")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed should be a non-negative integer, but got --seed {args.seed}")
    parsed = [_lerobot_source(text) for text in args.lerobot]
    if len(parsed) == 1 and not parsed[0][3]:
        root = parsed[0][0]
        pq.write_table(lerobot_rows(root, deltas, cameras=cameras), path)
        return {"path": str(root), "delta_timestamps": deltas, "cameras": cameras}
    sources = []
    for text, (root, name, weight, _) in zip(args.lerobot, parsed, strict=True):
        try:
            sources.append(LeRobotSource(root=root, name=name, weight=weight))
        except ConfigError as exc:
            raise UsageError(f"--lerobot {text!r}: {exc}") from None
    seed = 0 if args.seed is None else args.seed
    rows = lerobot_mixture(sources, deltas, cameras=cameras, seed=seed)
    pq.write_table(rows, path)
    counts = {str(v["values"]): int(v["counts"]) for v in rows.column("source").value_counts().to_pylist()}
    return {
        "sources": [{**src.to_dict(), "rows": counts.get(src.name, 0)} for src in sources],
        "delta_timestamps": deltas,
        "cameras": cameras,
        "seed": seed,
    }


def _profiled(
    path: Path, analytic: CostModel, gpu: GPU | None, model: ModelSpec
) -> tuple[ProfiledCostModel, dict[str, Any]]:
    """``--profile``'s cost model (NOTE [ A profile is not extrapolated ]) and what the manifest
    records of it (with the SHA-256 of the very bytes parsed); every refusal names the file."""
    source = f"--profile {str(path)!r}"
    profile, sha256 = read_profile(path, source=source)
    if profile.dtype != model.precision:
        raise ConfigError(
            f"{source} was measured in {profile.dtype}, but the plan's model is {model.precision}; "
            f"pass --precision {profile.dtype} (or profile again in {model.precision})"
        )
    measured = MeasuredCostModel(profile, target=None if gpu is None else gpu.name, source=source)
    cost = ProfiledCostModel(measured, analytic, source=source)
    return cost, {"path": str(path), **cost.record(sha256)}


def _print_staged(record: dict[str, Any], two_d: bool = False) -> None:
    setup = record["setup"]
    images = (
        "no images"
        if record["image"] is None
        else "{}x{} images of {:,} tokens".format(*record["image"], record["image_tokens"])
    )
    share = (
        "its own image-token bound"
        if two_d
        else f"up to {record['vision_share']:.1%} image tokens ({record['vision_share_source']})"
    )
    print(
        f"staged model {record['name']} ({record['model_type']}), train {setup['train']}, sharding "
        f"{setup['sharding']} x {setup['world_size']}; each bucket priced as {share} as {images}, the rest text"
    )


def _builder(args: argparse.Namespace) -> Callable[..., Manifest]:
    """The manifest builder ``--engine`` names (Ray's takes ``--ray-address``)."""
    if args.engine == "local":
        if args.ray_address is not None:
            raise UsageError("--ray-address goes with --engine ray")
        return build_manifest
    try:
        from tokenbucket.plan.ray_engine import build_manifest_ray  # optional: ray only for --engine ray
    except ImportError as exc:
        raise ConfigError(f"--engine ray needs Ray Data: pip install 'tokenbucket[ray]' ({exc})") from None
    return functools.partial(build_manifest_ray, address=args.ray_address)


def run(args: argparse.Namespace) -> int:
    if is_dit(args):
        return run_dit_plan(args)
    refuse_video_flags(args)
    if args.lerobot is None:
        if not args.metadata:
            raise UsageError("plan needs METADATA (files or directories) or --lerobot DATASET")
        lerobot_flags = (
            ("--delta-timestamps", args.delta_timestamps),
            ("--cameras", args.cameras),
            ("--seed", args.seed),
        )
        for flag, value in lerobot_flags:
            if value is not None:
                raise UsageError(f"{flag} goes with --lerobot DATASET, but no --lerobot was given")
    elif args.metadata:
        raise UsageError(f"give either METADATA or --lerobot DATASET, not both (got METADATA {args.metadata})")
    if args.lerobot_policy is not None:
        return _run_policy(args)
    staged = is_staged(args)
    if not staged:
        refuse_staged_flags(args, extra=("vision_share", "feed", "stills"))
    elif args.profile is not None and args.hf_config is None:
        raise UsageError(
            f"--profile with a staged model needs its config.json (--hf-config DIR): a --preset {args.preset} "
            "cannot be measured"
        )
    elif args.plan_mode == "packed":
        refuse_packed_flags(args)
    _check_2d(args, staged)
    budget = _budget(args)
    if budget is None:
        raise UsageError("plan needs a budget: --gpu NAME or --budget-gib X")
    if args.profile is not None and args.plan_mode == "packed":
        raise UsageError(
            "--profile cannot plan --mode packed (packing prices each sample's attention with the analytic "
            "model); use --mode static or dynamic with --profile, or drop --profile"
        )
    gpu = gpu_from_args(args)
    cost: CostModel | ProfiledCostModel | StagedLengthModel
    staged_cost: StagedCostModel | None = None
    if staged:
        staged_cost = staged_cost_from_args(args)
        spec = _staged_spec(args, staged_cost)
        meta: dict[str, Any] = {"model": staged_record(staged_cost, args.hf_config)}
    else:
        spec = spec_from_args(args)
        model = model_from_args(args)
        analytic = CostModel(model, gpu)
        meta = {"model": model.to_dict()}
        cost = analytic
        if args.profile is not None:
            cost, meta["profile"] = _profiled(args.profile, analytic, gpu, model)
    meta["gpu"] = None if gpu is None else gpu.name
    with tempfile.TemporaryDirectory(prefix="tokenbucket-plan-") as tmp:
        sources: list[str | Path] = args.metadata
        if args.lerobot is not None:
            # the rows go through the same path as a metadata file (one Parquet file, removed after)
            rows = Path(tmp) / "lerobot-rows.parquet"
            meta["lerobot"] = _lerobot_metadata(args, rows)
            sources = [rows]
        if staged_cost is not None and args.plan_mode == "packed":
            manifest = run_packed_2d(args, staged_cost, spec, sources, budget, meta)
            return _report_packed(args, manifest, meta)
        if staged_cost is not None:
            cost = _staged_length(args, staged_cost, spec, sources, meta["model"])
            if args.profile is not None:
                cost, meta["profile"] = _staged_profiled(args.profile, cost, gpu)
        if args.calibration is not None:
            calibration = load_calibration(args.calibration)
            _check_calibration_gpu(args.calibration, calibration, gpu)
            cost = CalibratedCostModel(cost, calibration)  # type: ignore[assignment]
            meta["calibration"] = {"file": str(args.calibration), "source": calibration.source,
                                   "step_time": calibration.step_time.to_dict()}  # fmt: skip
        try:
            manifest = _builder(args)(
                sources,
                spec,
                cost,
                args.out,
                budget_bytes=budget,
                max_buckets=args.max_buckets,
                mode=args.plan_mode,
                on_oversize=args.on_oversize,
                on_invalid=args.on_invalid,
                meta=meta,
                force=args.force,
                progress=progress_from_args(args),  # NOTE [ Progress on stderr ]: a bar per phase
                **({"two_d": True} if args.buckets == "2d" else {}),
            )
        except OversizeError as exc:  # the way out in this command's words, not the library's
            raise OversizeError(exc.worded("--on-oversize reject")) from None
    summary = manifest.summary()  # the manifest's own counts: invalid rows are rejected too
    if args.json:
        extra = {"staged": meta["model"]} if staged else {}
        print(json.dumps({**_plan_json(manifest.plan), "summary": summary, **extra}))
    else:
        _print_plan(manifest.plan, summary)
        if staged:
            _print_staged(meta["model"], two_d=manifest.plan.two_d)
        if line := dynamic_2d_line(manifest.plan):
            print(line)
        if args.profile is not None:
            low, high = meta["profile"]["lengths"]
            print(
                f"memory from profile {args.profile} ({meta['profile']['points']} points, {low:,}..{high:,} tokens, "
                f"fit error {meta['profile']['fit_error']:.1%}); step times from the analytic model"
            )
            off = meta["profile"].get("staged_model_disagrees") or []
            if off:
                worst = max(off, key=lambda e: abs(e["error_percent"]))
                print(
                    f"the staged model disagrees with the profile at {len(off)} of {meta['profile']['points']} points, "
                    f"by up to {worst['error_percent']:+.1f} % (batch {worst['batch']}, {worst['length']:,} tokens): "
                    "the plan follows the measurement"
                )
        if args.calibration is not None:
            print(
                f"step times and memory offsets from calibration {args.calibration} "
                f"(fitted on {meta['calibration']['source'] or 'a run'})"
            )
        print(f"manifest: {args.out} ({len(manifest):,} rows)")
    return 0


def _report_packed(args: argparse.Namespace, manifest: Manifest, meta: dict[str, Any]) -> int:
    """What ``plan --mode packed`` prints of a staged model's two-cap packed manifest."""
    summary, report = manifest.summary(), packed_report(manifest)
    if args.json:
        print(
            json.dumps({**_plan_json(manifest.plan), "summary": summary, "packed_2d": report, "staged": meta["model"]})
        )
    else:
        print_packed(report, summary)
        print(f"manifest: {args.out} ({len(manifest):,} rows)")
    return 0


# every flag that describes the model, its tokens or a plan the policy does not make
_POLICY_REFUSED = (
    *_IMAGE_SPEC_FLAGS, "text", "proprio", "action", "memory", "extra", "column", "preset", "hidden", "layers",
    "heads", "kv_heads", "mlp_ratio", "gated_mlp", "precision", "attention", "qkv_layout", "window",
    "checkpointing", "mode", "optimizer", "extra_params", "extra_bytes", "hf_config", "video_processor", "train",
    "lora_rank", "sharding", "world_size", "vision_checkpointing", "backbone_checkpointing", "ddp_bucket_view",
    "loop", "use_cache", "vision_share", "feed", "stills", "profile", "calibration",
)  # fmt: skip


def _policy_cost(rows: Path, policy: LeRobotPolicy, gpu: GPU | None) -> PolicyLengthModel:
    """The policy's cost model for ``--lerobot``'s rows; a dataset without cameras, or a camera of
    more than one frame, is refused (the policies read one frame per camera)."""
    table = pq.read_table(rows, columns=["key", "cameras"])
    flat = table.column("cameras").combine_chunks().flatten()
    if not len(flat):
        raise UsageError("--lerobot-policy needs cameras, but the --lerobot datasets give none (see --cameras)")
    frames = flat.field("frames").to_numpy(zero_copy_only=False)
    if frames.max() > 1:
        i = int(np.argmax(frames))
        raise UsageError(
            f"--lerobot-policy reads one frame per camera (LeRobot's n_obs_steps=1), but --delta-timestamps gives "
            f"{flat.field('name')[i].as_py()} {int(frames[i])} frames: give the camera keys one offset (or none)"
        )
    return PolicyLengthModel.for_rows(policy, table, gpu=gpu)


def _run_policy(args: argparse.Namespace) -> int:
    """``plan --lerobot ... --lerobot-policy P``: buckets and batch sizes as the policy runs them."""
    if args.lerobot is None:
        raise UsageError("--lerobot-policy plans LeRobot datasets: give --lerobot DATASET (repeatable)")
    names = {"mode": "--model-mode", "use_cache": "--no-cache"}
    given = [names.get(n, _flag(n)) for n in _POLICY_REFUSED if getattr(args, n, None) not in (None, [])]
    given += ["--mode " + args.plan_mode] if args.plan_mode == "packed" else []
    given += ["--buckets 2d"] if args.buckets == "2d" else []
    given += ["--engine ray"] if args.engine == "ray" else []
    if given:
        raise UsageError(
            f"{', '.join(given)}: not with --lerobot-policy (the policy's config says its tokens and sizes; it "
            "plans static or dynamic 1D buckets here)"
        )
    budget = _budget(args)
    if budget is None:
        raise UsageError("plan needs a budget: --gpu NAME or --budget-gib X")
    gpu = gpu_from_args(args)
    policy = lerobot_policy_arg(args.lerobot_policy)
    meta: dict[str, Any] = {"gpu": None if gpu is None else gpu.name}
    with tempfile.TemporaryDirectory(prefix="tokenbucket-plan-") as tmp:
        rows = Path(tmp) / "lerobot-rows.parquet"
        meta["lerobot"] = _lerobot_metadata(args, rows)
        cost = _policy_cost(rows, policy, gpu)
        meta["model"] = cost.record()
        try:
            manifest = build_manifest(
                [rows], cost.token_spec(), cost, args.out, budget_bytes=budget, max_buckets=args.max_buckets,
                mode=args.plan_mode, on_oversize=args.on_oversize, on_invalid=args.on_invalid, meta=meta,
                force=args.force, progress=progress_from_args(args), multiple=1,  # NOTE [ A policy's lengths ]
            )  # fmt: skip
        except OversizeError as exc:
            raise OversizeError(exc.worded("--on-oversize reject")) from None
    summary = manifest.summary()
    per_bucket = [
        {"bound": b.bound, "camera_slots": cost.slots_at(b.bound), "batch_size": b.batch_size, "samples": b.samples}
        for b in manifest.plan.buckets
    ]
    if args.json:
        print(json.dumps({**_plan_json(manifest.plan), "summary": summary, "policy": meta["model"],
                          "per_bucket": per_bucket}))  # fmt: skip
        return 0
    _print_plan(manifest.plan, summary)
    m = meta["model"]
    print(
        f"LeRobot {policy.type} ({'expert only' if policy.train_expert_only else 'frozen tower' if policy.freeze_vision_encoder else 'full'}): "
        f"{m['image_tokens']} tokens per camera slot + {m['fixed_tokens']} (language padded to "
        f"{policy.tokenizer_max_length}, state, {policy.chunk_size}-step chunk); frames up to {cost.frame[0]}x{cost.frame[1]}"
    )
    for row in per_bucket:
        print(
            f"  bucket <= {row['bound']:,} tokens: {row['camera_slots']} camera slot(s), batch {row['batch_size']}, "
            f"{row['samples']:,} samples"
        )
    print(f"manifest: {args.out} ({len(manifest):,} rows)")
    return 0


def _check_2d(args: argparse.Namespace, staged: bool) -> None:
    """``--buckets 2d`` bounds image tokens, which only a staged model prices apart (NOTE [ Two-dimensional
    buckets ]); its plans (static shapes, or dynamic batches: NOTE [ A two-dimensional dynamic manifest ])
    are planned from the samples themselves, priced by the staged model alone, here, in one process."""
    if args.buckets != "2d":
        return
    if not staged:
        raise UsageError("--buckets 2d needs a model with a vision tower: --hf-config DIR or a staged --preset")
    refused = [
        ("--mode " + args.plan_mode, args.plan_mode not in ("static", "dynamic")),  # (packed: refuse_packed_flags)
        ("--profile", args.profile is not None),
        ("--calibration", args.calibration is not None),
        ("--engine ray", args.engine == "ray"),
        ("--vision-share", args.vision_share is not None),  # each bucket is priced at its own image-token bound
    ]
    given = [flag for flag, bad in refused if bad]
    if given:
        raise UsageError(
            f"--buckets 2d plans static or dynamic 2D buckets from the staged model here; drop {', '.join(given)}"
        )


def _check_calibration_gpu(path: Path, calibration: Calibration, gpu: GPU | None) -> None:
    """A calibration's step times hold on the hardware its run was timed on, not on another."""
    if "gpu" not in calibration.stats:  # fitted from a log that did not record it
        return
    ran, target = calibration.stats["gpu"], None if gpu is None else gpu.name
    if ran != target:
        raise ConfigError(
            f"calibration {str(path)!r} was fitted on a run timed on {ran or 'no GPU (a CPU run)'}, but this plan "
            f"is for {target or 'no GPU (--budget-gib alone)'}: calibrate from a run on the plan's GPU"
        )
