"""The CLI's staged-model flags: a Hugging Face ``config.json`` (or a staged preset), one sample's
shape, and the training setup, shared by ``cost``, ``ledger`` and ``plan``.

    tokenbucket cost --hf-config DIR --sample '{"images": 2, "height": 448, "width": 448, "text_tokens": 256}'
                     --batch 2 --train lora --sharding fsdp --world-size 8 --gpu H100-SXM
    tokenbucket plan METADATA --hf-config DIR --train lora --gpu H100-SXM --out manifest.parquet
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenbucket import models
from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket.cli._common import _gib, _json_object_arg, gpu_from_args, positive_int
from tokenbucket.cost.hf_model import STAGED_PRESETS, StagedModel, staged_from_config
from tokenbucket.cost.staged import (
    STAGE_ITEMS,
    STAGES,
    Sample,
    StagedCostModel,
    StagedEstimate,
    TrainSetup,
)  # fmt: skip
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.tokens.hf import read_hf_config, token_spec_from_hf
from tokenbucket.tokens.spec import CountRule, TokenSpec

__all__ = [
    "add_staged_flags",
    "is_staged",
    "print_estimate",
    "sample_from_args",
    "staged_cost_from_args",
    "staged_json",
    "staged_record",
    "staged_token_spec",
]

SAMPLE_KEYS = ("images", "videos", "cameras", "frames", "fps", "height", "width", "text_tokens")


def add_staged_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "staged model (a VLM/VLA read from a Hugging Face config.json, or --preset "
        + "|".join(sorted(STAGED_PRESETS))
        + ")"
    )
    g.add_argument("--hf-config", type=Path, metavar="DIR_OR_FILE", help="a config.json, or the folder holding it")
    g.add_argument(
        "--video-processor",
        action="append",
        metavar="KEY=VALUE",
        help="change one of the video processor's keys, as processor(videos=..., KEY=VALUE) would (repeatable; "
        "e.g. fps=4, num_frames=16, do_sample_frames=false, max_pixels=200704; VALUE is JSON, else a string)",
    )
    g.add_argument(
        "--train",
        choices=["full", "frozen-vision", "lora"],
        help="what trains: everything (default), all but the vision tower, or LoRA adapters on the LLM",
    )
    g.add_argument("--lora-rank", type=positive_int, help="the LoRA adapters' rank with --train lora (default 16)")
    g.add_argument(
        "--sharding",
        choices=["none", "ddp", "fsdp", "zero2", "zero3"],
        help="how weights, gradients and optimizer states are split over --world-size ranks (default none)",
    )
    g.add_argument("--world-size", type=positive_int, help="data-parallel ranks (default 1; more need --sharding)")
    g.add_argument("--vision-checkpointing", choices=["none", "full"], help="recompute each vision block in backward")
    g.add_argument(
        "--backbone-checkpointing", choices=["none", "full"], help="recompute each decoder layer in backward"
    )
    g.add_argument(
        "--ddp-bucket-view",
        action="store_true",
        default=None,
        help="with --sharding ddp: DDP(gradient_as_bucket_view=True), no second copy of the gradients",
    )
    g.add_argument(
        "--loop",
        choices=["held", "dropped"],
        help="how the step is written: held (default: outputs = model(**batch); outputs.loss.backward(), "
        "raw loops and Accelerate's examples keep the logits to the next step) or dropped "
        "(loss = model(**batch).loss: the HF Trainer, Lightning)",
    )
    g.add_argument(
        "--no-cache",
        dest="use_cache",
        action="store_const",
        const=False,
        help="the step passes use_cache=False (default: as the config leaves it; only a held loop pays for it)",
    )


# the training-setup flags: they price a staged model and are refused with the block model
STAGED_ONLY = (
    "train", "lora_rank", "sharding", "world_size", "vision_checkpointing", "backbone_checkpointing",
    "ddp_bucket_view", "loop", "use_cache", "video_processor",
)  # fmt: skip


def _flag(name: str) -> str:
    return "--no-cache" if name == "use_cache" else f"--{name.replace('_', '-')}"


def refuse_staged_flags(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> None:
    """One line naming every staged-only flag given to a block-model command."""
    given = [_flag(name) for name in (*extra, *STAGED_ONLY) if getattr(args, name, None) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} price a staged model: give --hf-config DIR (or a staged --preset)")


def is_staged(args: argparse.Namespace) -> bool:
    """Whether the command prices a staged model (``--hf-config`` or a staged ``--preset``)."""
    return args.hf_config is not None or (args.preset is not None and args.preset in STAGED_PRESETS)


_SETUP_NAME = re.compile(r"(?<![\w-])(world_size|lora_rank|sharding|train)(=?)")
_BLOCK_FLAGS = (
    "hidden", "layers", "heads", "kv_heads", "mlp_ratio", "gated_mlp", "window", "extra_params", "qkv_layout",
)  # fmt: skip


def staged_cost_from_args(args: argparse.Namespace) -> StagedCostModel:
    """The :class:`StagedCostModel` the staged flags describe (block-model flags do not apply)."""
    given = [f"--{name.replace('_', '-')}" for name in _BLOCK_FLAGS if getattr(args, name, None) is not None]
    if given:
        raise UsageError(
            f"{', '.join(given)} describe the block model; a staged model takes its sizes from --hf-config"
        )
    if args.hf_config is not None and args.preset is not None:
        raise UsageError("--hf-config and --preset both name the model: give one")
    config = None
    if args.hf_config is not None:
        config = read_hf_config(args.hf_config)
        model: StagedModel = staged_from_config(config)
    else:
        model = StagedModel.preset(args.preset)
    options: dict[str, Any] = {
        "train": args.train,
        "lora_rank": args.lora_rank,
        "sharding": args.sharding,
        "world_size": args.world_size,
        "optimizer": args.optimizer,
        "vision_checkpointing": args.vision_checkpointing,
        "backbone_checkpointing": args.backbone_checkpointing,
        "ddp_bucket_view": args.ddp_bucket_view,
        "loop": args.loop,
        "use_cache": args.use_cache,
    }
    chosen = {k: v for k, v in options.items() if v is not None}
    if chosen.get("ddp_bucket_view") and chosen.get("sharding") != "ddp":
        raise UsageError("--ddp-bucket-view needs --sharding ddp")
    if chosen.get("world_size", 1) > 1 and "sharding" not in chosen:
        raise UsageError("--world-size needs --sharding (ddp, fsdp, zero2 or zero3)")
    try:
        setup = TrainSetup(**chosen)
    except ConfigError as exc:
        raise UsageError(_as_flags(str(exc))) from None
    gpu = gpu_from_args(args) if getattr(args, "gpu", None) is not None else None
    cost = StagedCostModel(model, setup, gpu, config=config)
    if getattr(args, "video_processor", None):  # the video processor's keys, changed (not the model)
        cost.config = _video_changed(args.video_processor, cost.config, model)
    return cost


def _video_changed(pairs: list[str], config: HFConfig | None, model: StagedModel) -> HFConfig:
    """``config`` (the model's, or a preset's own) with ``--video-processor KEY=VALUE`` changes,
    checked by the family's video rule (one line naming the flag)."""
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--video-processor should be KEY=VALUE, but got {pair!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        changes[key.strip()] = value
    if config is None:
        raise UsageError(f"--video-processor changes a model's video processor: {model.name!r} has no config")
    changed = config.with_video(changes)
    family = models.of(changed)
    if not family.has_video:
        raise UsageError(f"--video-processor: model_type {changed.model_type!r} has no video path")
    try:
        family.video_rule(changed)
    except ConfigError as exc:
        raise UsageError(f"--video-processor {' '.join(pairs)}: {exc}") from None
    return changed


def staged_token_spec(cost: StagedCostModel, feed: str | None = None, stills: Sequence[str] = ()) -> TokenSpec:
    """The token spec of a staged model: :func:`token_spec_from_hf` of its config (``feed``,
    ``stills``: NOTE [ Frames are images ]), or for a preset without one (fixed-size towers)
    every frame at the tower's square, text only."""
    if cost.config is not None:
        try:
            return token_spec_from_hf(cost.config, feed=feed, stills=stills)
        except ConfigError as exc:
            raise UsageError(f"--feed {feed}: {exc}" if feed is not None else str(exc)) from None
    if feed is not None or stills:
        raise UsageError(f"--feed / --stills read the model's video processor: {cost.model.name!r} has no config")
    zero = CountRule(count=0)
    if not cost.model.vision:
        return TokenSpec(patch=1, tokens_per_frame=1, proprio=zero, action=zero, memory=zero)
    tower = cost.model.vision[0]
    side = tower.image_size or tower.patch
    tokens = cost.vision_inputs(Sample(images=1, height=side, width=side)).llm_tokens
    return TokenSpec(
        patch=tower.patch, resize="fixed", fixed_size=(side, side), tokens_per_frame=tokens, proprio=zero,
        action=zero, memory=zero,
    )  # fmt: skip


def staged_record(cost: StagedCostModel, hf_config: Path | None) -> dict[str, Any]:
    """What a manifest records of a staged model: name, model_type, parameters, the SHA-256 of
    the very config.json (and preprocessor_config.json) bytes, or the preset's name, and the setup."""
    out: dict[str, Any] = {
        "kind": "staged",
        "name": cost.model.name,
        "model_type": cost.model.model_type,
        "params": cost.model.params,
        "setup": dataclasses.asdict(cost.setup),
    }
    if hf_config is not None and cost.config is not None:
        config = Path(cost.config.path)
        out["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
        pre = config.parent / "preprocessor_config.json"
        out["preprocessor_sha256"] = hashlib.sha256(pre.read_bytes()).hexdigest() if pre.is_file() else None
    else:
        out["preset"] = cost.model.name
    return out


def _as_flags(message: str) -> str:
    """A TrainSetup message in the flags' words (``world_size=2`` -> ``--world-size 2``)."""

    def flag(match: re.Match[str]) -> str:
        return "--" + match[1].replace("_", "-") + (" " if match[2] else "")

    return _SETUP_NAME.sub(flag, message)


def sample_from_args(text: str) -> Sample:
    """``--sample``'s JSON object as a :class:`Sample`: ``images``, or ``videos`` (or ``cameras``,
    the same: one clip per camera) x ``frames`` with an optional source ``fps``; H, W, text tokens.
    A clip goes through the family's video path (NOTE [ Frames are images ])."""
    data = _json_object_arg(text, "--sample")
    unknown = sorted(set(data) - set(SAMPLE_KEYS))
    if unknown:
        raise UsageError(f"--sample has unknown keys {unknown}; a staged model reads {list(SAMPLE_KEYS)}")
    for key, value in data.items():
        if key == "fps":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise UsageError(f"--sample fps should be a positive number, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"--sample {key} should be a non-negative integer, got {value!r}")
    try:
        if "videos" in data or "cameras" in data or "frames" in data:
            if "images" in data:
                raise UsageError("--sample gives images and videos x frames: give one")
            if "videos" in data and "cameras" in data:
                raise UsageError("--sample gives videos and cameras (the same count): give one")
            return Sample.video(
                cameras=data.get("videos", data.get("cameras", 1)),
                frames=data.get("frames", 1),
                height=data.get("height", 0),
                width=data.get("width", 0),
                text_tokens=data.get("text_tokens", 0),
                fps=data.get("fps"),
            )
        if "fps" in data:
            raise UsageError("--sample fps is the videos' frame rate: give videos and frames with it")
        return Sample(**data)
    except ConfigError as exc:
        raise UsageError(f"--sample: {exc}") from None


def staged_json(cost: StagedCostModel, est: StagedEstimate, budget: int | None, sample: Sample) -> dict[str, Any]:
    """What ``cost --json`` prints for a staged model (bytes per rank)."""
    s = cost.setup
    out: dict[str, Any] = {
        "model": cost.model.name,
        "model_type": cost.model.model_type,
        "params": cost.model.params,
        "train": s.train,
        "sharding": s.sharding,
        "world_size": s.world_size,
        "loop": s.loop,
        "batch": est.batch,
        "seq_len": est.seq_len,
        "peak_bytes": est.peak_bytes,
        "phase": est.phase,
        "stages": est.stages,
    }
    if budget is not None:
        out.update(budget_bytes=budget, fits=est.peak_bytes <= budget, max_batch=cost.max_batch(sample, budget))
    return out


def print_estimate(cost: StagedCostModel, est: StagedEstimate, out: dict[str, Any]) -> None:
    """The per-stage, per-item table of one staged estimate."""
    s = cost.setup
    print(
        f"{cost.model.name} ({cost.model.model_type}, {cost.model.params / 1e9:,.2f} B params), train {s.train}, "
        f"sharding {s.sharding} x {s.world_size}; batch {est.batch} x {est.seq_len:,} LLM tokens; per rank"
    )
    print(f"  {'stage':<14}" + "".join(f"{item:>13}" for item in STAGE_ITEMS) + f"{'total':>13}")
    for stage in STAGES:
        row = est.stages[stage]
        if not any(row.values()):
            continue
        print(f"  {stage:<14}" + "".join(f"{_gib(row[i]):>13}" for i in STAGE_ITEMS) + f"{_gib(sum(row.values())):>13}")
    print(f"  {'peak':<14}{_gib(est.peak_bytes):>13}   at the {est.phase} phase")
    held = est.item("loop")
    if s.loop == "held":
        print(
            f"  loop held: {_gib(held)} of it is the model output a for loop keeps bound to the next step "
            "(logits, cache); --loop dropped if the step takes .loss at once (HF Trainer, Lightning)"
        )
    if "budget_bytes" in out:
        verdict = "fits" if out["fits"] else "does NOT fit"
        print(f"  budget {_gib(out['budget_bytes'])}: {verdict}; largest batch of this sample: {out['max_batch']}")
