"""``cost`` and ``profile`` over a video diffusion transformer (plumbing of the CLI).

``--hf-config`` given a diffusers pipeline folder (``model_index.json``) or a transformer
``config.json`` whose ``_class_name`` is a video DiT prices (``cost``) or measures (``profile``) the
fine-tuning step of its transformer on cached latents and text states
(:mod:`tokenbucket.cost.dit`, :mod:`tokenbucket.cost.dit_profile`).

    tokenbucket cost --hf-config PIPELINE --sample '{"videos": 1, "frames": 81, "height": 480,
        "width": 832, "text_tokens": 512}' --batch 1 [--train lora] [--backbone-checkpointing full]
        [--sharding fsdp --world-size 8] [--gpu H100-SXM] [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket.cli._common import _budget, _gib, _json_object_arg
from tokenbucket.cli._staged import _as_flags
from tokenbucket.cost.dit import DiTCostModel, DiTEstimate, DiTSetup
from tokenbucket.models._dit import DiTConfig, is_pipeline, read_pipeline

__all__ = ["BAND", "dit_cost_from_args", "dit_sample", "is_dit", "run_dit_cost", "run_dit_profile"]

BAND = (-3.0, 7.0)  # the cost model's band around the measured peak, in percent
SAMPLE_KEYS = ("videos", "cameras", "views", "view_layout", "frames", "height", "width", "text_tokens")
# flags of a VLM's step that a video DiT's does not have
NOT_DIT = ("vision_checkpointing", "ddp_bucket_view", "loop", "use_cache", "video_processor")


def is_dit(args: argparse.Namespace) -> bool:
    """Whether ``--hf-config`` names a video DiT (a pipeline folder, or its transformer's config)."""
    path = getattr(args, "hf_config", None)
    return path is not None and is_pipeline(path)


def dit_cost_from_args(args: argparse.Namespace) -> tuple[DiTConfig, DiTCostModel]:
    """The pipeline and the :class:`DiTCostModel` the flags describe."""
    given = [f"--{n.replace('_', '-')}" if n != "use_cache" else "--no-cache" for n in NOT_DIT
             if getattr(args, n, None) is not None]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)} describe a VLM's step; a video DiT's transformer takes none of them")
    if getattr(args, "preset", None) is not None:
        raise UsageError("--hf-config and --preset both name the model: give one")
    if getattr(args, "optimizer", None) not in (None, "adamw"):
        raise UsageError(
            f"a video DiT is priced with AdamW, the fine-tuning scripts' own, not --optimizer {args.optimizer}"
        )
    cfg = read_pipeline(args.hf_config)
    if args.train == "frozen-vision":
        raise UsageError("--train frozen-vision freezes a VLM's tower; a video DiT trains full or lora")
    if args.sharding in ("zero2", "zero3"):
        raise UsageError(f"--sharding {args.sharding} is not priced for a video DiT: give none, ddp or fsdp")
    options: dict[str, Any] = {
        "train": args.train,
        "lora_rank": args.lora_rank,
        "sharding": args.sharding,
        "world_size": args.world_size,
    }
    chosen = {k: v for k, v in options.items() if v is not None}
    if chosen.get("world_size", 1) > 1 and "sharding" not in chosen:
        raise UsageError("--world-size needs --sharding (ddp or fsdp)")
    chosen["checkpointing"] = getattr(args, "backbone_checkpointing", None) == "full"
    try:
        return cfg, DiTCostModel(cfg, DiTSetup(**chosen))
    except ConfigError as exc:
        raise UsageError(_as_flags(str(exc))) from None


def dit_sample(text: str | None) -> dict[str, Any]:
    """``--sample`` for a video DiT: ``frames``, ``height``, ``width``, ``text_tokens``, and
    ``videos`` (or ``cameras``, ``views``: one clip a camera, laid as ``view_layout`` says,
    NOTE [ Views of a sample ])."""
    if text is None:
        raise UsageError(
            'a video DiT needs --sample \'{"videos": 1, "frames": F, "height": H, "width": W, "text_tokens": T}\''
        )
    data = _json_object_arg(text, "--sample")
    unknown = sorted(set(data) - set(SAMPLE_KEYS))
    if unknown:
        raise UsageError(f"--sample has unknown keys {unknown}; a video DiT reads {list(SAMPLE_KEYS)}")
    for key in ("frames", "height", "width"):
        if key not in data:
            raise UsageError(f"--sample needs {key!r} for a video DiT (one clip's frames, height and width)")
    views = [k for k in ("videos", "cameras", "views") if k in data]
    if len(views) > 1:
        raise UsageError(f"--sample gives {' and '.join(views)}: the same count (one clip a camera), give one")
    layout = data.pop("view_layout", "time")
    if layout not in ("time", "batch"):
        raise UsageError(f"--sample view_layout should be 'time' or 'batch', got {layout!r}")
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "text_tokens" else 1):
            raise UsageError(f"--sample {key} should be a positive integer, got {value!r}")
    out: dict[str, Any] = {k: int(data.get(k, 0)) for k in ("frames", "height", "width", "text_tokens")}
    out.update(views=int(data[views[0]]) if views else 1, view_layout=layout)
    return out


def _estimate(cost: DiTCostModel, batch: int, sample: dict[str, Any]) -> DiTEstimate:
    try:
        return cost.sample_memory(batch, **sample)
    except ConfigError as exc:
        raise UsageError(f"--sample: {exc}") from None


def _json(cfg: DiTConfig, cost: DiTCostModel, est: DiTEstimate, batch: int, budget: int | None) -> dict[str, Any]:
    s = cost.setup
    out: dict[str, Any] = {
        "model": cfg.class_name, "pipeline": cfg.pipeline, "family": cost.family.name,
        "vae": {"temporal": cfg.vae.temporal, "spatial": cfg.vae.spatial, "channels": cfg.vae.channels,
                "source": cfg.vae.source},
        "params": cost.params.total, "train": s.train, "checkpointing": s.checkpointing, "sharding": s.sharding,
        "world_size": s.world_size, "batch": batch, "sequences_per_sample": est.sequences_per_sample,
        "video_tokens": est.video_tokens, "text_tokens": est.text_tokens,
        "peak_bytes": est.peak_bytes, "phase": est.phase, "items": est.items,
    }  # fmt: skip
    if budget is not None:
        out.update(budget_bytes=budget, fits=est.peak_bytes <= budget, max_batch=_max_batch(cost, est, budget))
    return out


def _max_batch(cost: DiTCostModel, est: DiTEstimate, budget: int) -> int:
    return cost.max_batch(est.video_tokens, est.text_tokens, budget) // est.sequences_per_sample


def run_dit_cost(args: argparse.Namespace) -> int:
    """``tokenbucket cost --hf-config PIPELINE --sample ...``."""
    if args.length is not None:
        raise UsageError("--length is the block model's; a video DiT's tokens follow from --sample")
    cfg, cost = dit_cost_from_args(args)
    sample = dit_sample(args.sample)
    est = _estimate(cost, args.batch, sample)
    out = _json(cfg, cost, est, args.batch, _budget(args))
    if args.json:
        print(json.dumps(out))
        return 0
    s = cost.setup
    print(
        f"{cfg.class_name} ({cost.family.name}), {cost.params.total / 1e9:,.2f} B params; VAE /{cfg.vae.temporal} "
        f"frames, /{cfg.vae.spatial} pixels ({cfg.vae.source}); train {s.train}"
        f"{', checkpointing' if s.checkpointing else ''}, sharding {s.sharding} x {s.world_size}; batch {args.batch} x "
        f"{est.video_tokens:,} video tokens + {est.text_tokens:,} text tokens; per rank"
    )
    for name, value in est.items.items():
        print(f"  {name:<22} {_gib(value):>14}")
    print(f"  {'total (peak)':<22} {_gib(est.peak_bytes):>14}   at the {est.phase}")
    if "budget_bytes" in out:
        verdict = "fits" if out["fits"] else "does NOT fit"
        print(f"  budget {_gib(out['budget_bytes'])}: {verdict}; largest batch of this sample: {out['max_batch']}")
    return 0


def run_dit_profile(args: argparse.Namespace) -> int:
    """``tokenbucket profile --hf-config PIPELINE --sample ...``: the measured step beside the estimate."""
    if args.length or args.bounds_of is not None or args.save is not None:
        raise UsageError("a video DiT is measured at one --sample (no --length grid, --bounds-of or --save yet)")
    if args.device != "fake":
        raise UsageError("--hf-config measures on fake tensors only (--device fake)")
    if args.precision not in (None, "bf16"):
        raise UsageError(
            f"a video DiT is measured in bf16 (the fine-tuning scripts'), not --precision {args.precision}"
        )
    if args.kernels not in (None, "cuda"):
        raise UsageError("a video DiT is measured with the CUDA attention kernels (what a GPU saves)")
    cfg, cost = dit_cost_from_args(args)
    sample = dit_sample(args.sample)
    est = _estimate(cost, args.batch, sample)
    try:
        from tokenbucket.cost.dit_profile import profile_dit  # optional: diffusers (tokenbucket[diffusers])
    except ImportError as exc:
        raise ConfigError(f"a video DiT needs diffusers: pip install 'tokenbucket[diffusers]' ({exc})") from None
    s = cost.setup
    if sample["views"] != 1:
        raise UsageError(f"--sample views={sample['views']}: profile measures one view a sample (cost prices several)")
    clip = {k: sample[k] for k in ("frames", "height", "width", "text_tokens")}
    run = profile_dit(cfg, batch=args.batch, train=s.train, lora_rank=s.lora_rank, checkpointing=s.checkpointing,
                      sharding=s.sharding if s.sharding == "fsdp" else "none",
                      world_size=s.world_size if s.sharding == "fsdp" else 1, steps=args.steps or 2,
                      **clip)  # fmt: skip
    err = 100.0 * (est.peak_bytes - run.peak_bytes) / run.peak_bytes
    within = BAND[0] <= err <= BAND[1]
    if args.json:
        print(json.dumps({**_json(cfg, cost, est, args.batch, None), "measured_peak_bytes": run.peak_bytes,
                          "predicted_peak_bytes": est.peak_bytes, "error_percent": round(err, 2),
                          "within_band": within, "measured_breakdown": run.breakdown,
                          "params_total": run.params_total, "params_trainable": run.params_trainable,
                          "seconds": run.seconds, "versions": run.versions}))  # fmt: skip
        return 0
    print(
        f"{cfg.class_name} on fake tensors (CPU), bf16, train {s.train}"
        f"{', checkpointing' if s.checkpointing else ''}, sharding {s.sharding} x {s.world_size}; batch "
        f"{args.batch} x {run.tokens:,} video tokens; {args.steps or 2} step(s), {run.seconds:.0f} s; per rank"
    )
    print(f"  measured {_gib(run.peak_bytes)}, predicted {_gib(est.peak_bytes)} ({err:+.1f} %)")
    if not within:
        print(
            f"  the cost model is {err:+.1f} % off the measured peak, outside its band ({BAND[0]:+.0f} % ... {BAND[1]:+.0f} %)"
        )
    return 0
