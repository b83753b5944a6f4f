"""``tokenbucket profile``: measure a model's peak memory on fake tensors (or CUDA), beside the estimate.

tokenbucket profile MODULE:FACTORY [model flags] --batch B --length L [--save PROFILE.json]
tokenbucket profile --hf-config DIR --sample JSON --batch B [--train ...] [--sharding fsdp --world-size 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tokenbucket import _values as V
from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket._progress import progress
from tokenbucket.cli._common import (
    _add_model_flags,
    _gib,
    _json_object_arg,
    gpu_from_args,
    model_from_args,
    positive_int,
    progress_from_args,
    share,
)
from tokenbucket.cli._dit import is_dit, run_dit_profile
from tokenbucket.cli._staged import (
    add_staged_flags,
    is_staged,
    refuse_staged_flags,
    sample_from_args,
    staged_cost_from_args,
)
from tokenbucket.cost.measured import Profile
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import default_dtype, profile_memory, profile_points
from tokenbucket.cost.staged import ERROR_BAND, StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel, staged_profile_key
from tokenbucket.plan.manifest import load_manifest

if TYPE_CHECKING:
    from tokenbucket.cost.hf_profile import HFProfile  # optional: transformers

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = (
    "tokenbucket profile tokenbucket.cost.reference:ReferenceTransformer --hidden 256 --layers 2 --heads 4 "
    "--batch 2 --length 512 --length 1024\n"
    '  tokenbucket profile --hf-config qwen2-vl-2b/ --sample \'{"images": 2, "height": 448, "width": 448, '
    '"text_tokens": 256}\' --batch 1 --train lora'
)
BAND = ERROR_BAND  # the analytic models' stated band, percent of the measured peak


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "factory", nargs="?", help="MODULE:FACTORY returning the nn.Module (given spec= if it takes one); "
        "or give --hf-config"
    )  # fmt: skip
    parser.add_argument(
        "--input",
        help="MODULE:FN building the model's input: (batch, length), or (sample, batch) with --sample; a tensor, "
        "a tuple of positional inputs or a dict of keyword inputs (default: a [B, L, hidden] tensor)",
    )
    parser.add_argument(
        "--sample",
        help='one sample as JSON: with --hf-config {"images", "height", "width", "text_tokens"} or cameras x '
        "frames (the profiler makes the model's inputs); with MODULE:FACTORY, handed to --input",
    )
    parser.add_argument(
        "--bounds-of",
        type=Path,
        metavar="MANIFEST",
        help="--hf-config: measure at the bucket bounds of this manifest (a plan from the staged model), with "
        "any --length: the bounds a profiled plan of the same data will want",
    )
    parser.add_argument(
        "--vision-share",
        type=share,
        metavar="F",
        help="--hf-config with --length: the largest share of a sample's LLM tokens that are image tokens "
        "(default 1; give plan's share: a plan refuses a profile made at a smaller one)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        choices=[1, 2],
        help="--hf-config: training steps (2, the default: the steady state, optimizer states live; DDP: 1)",
    )
    parser.add_argument("--batch", type=positive_int, default=1, help="samples in the batch (default 1)")
    parser.add_argument("--length", type=positive_int, action="append", help="sequence length in tokens (repeatable)")
    parser.add_argument(
        "--device",
        choices=["fake", "cuda"],
        default="fake",
        help="fake: fake tensors on the CPU (no GPU needed, the default); cuda: measure on the GPU",
    )
    parser.add_argument(
        "--gpu",
        help="the GPU target a saved profile is for (see `tokenbucket gpus`; default fake-cpu: any GPU); "
        "`plan --profile` refuses the profile for another --gpu",
    )
    parser.add_argument(
        "--save",
        type=Path,
        help="also measure a small grid (batch 1, 2 and --batch at each --length; two or more lengths) and save "
        "a profile JSON for `tokenbucket plan --profile`",
    )
    parser.add_argument(
        "--kernels",
        choices=["cuda", "cpu"],
        help="with --hf-config: the attention kernels recorded on fake tensors: cuda (default: the CUDA kernels' "
        "meta functions, what a GPU saves for backward) or cpu (the CPU kernels)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of the table")
    _add_model_flags(parser, with_config=True)
    add_staged_flags(parser)


def _load_factory(target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FACTORY (e.g. mypkg.models:build), but got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from None
    try:
        factory: Callable[..., Any] = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no {attr!r}") from None
    return factory


# the most elements one fake tensor may have (its sizes are int64; NOTE [ What the profiler builds ])
MAX_ELEMENTS = 2**62


def _check_buildable(model: ModelSpec, batch: int, lengths: list[int]) -> None:
    """The shapes the profiler would build, refused up front when no tensor can have them.

    NOTE [ What the profiler builds ]
    The profiler builds the model and runs it on fake tensors: they take no memory, but each
    layer is a module and each tensor's element count is an int64, so a --layers or a --batch x
    --length that the cost verb prices by formula (any size) cannot be built here. The layer
    count is bounded as a config's is (NOTE [ Layer counts are bounded ] in tokenbucket._values),
    and the largest tensors of a block (its weights, its activations, eager attention's scores)
    must hold at most MAX_ELEMENTS elements.
    """
    if model.layers > V.MAX_LAYERS:
        raise UsageError(f"--layers should be at most {V.MAX_LAYERS} to build and measure, but got {model.layers}")
    longest = max(lengths, default=1)
    width = max(model.hidden, model.ffn)
    tensors = (
        ("the weights (hidden x MLP width)", model.hidden * width),
        ("the activations (batch x length x width)", batch * longest * width),
        ("the attention scores (batch x heads x length²)", batch * model.heads * longest * longest),
    )
    for what, elements in tensors:
        if elements > MAX_ELEMENTS:
            raise UsageError(
                f"--batch {batch}, --length {longest} and the model's sizes make {what} {elements:.3g} elements, "
                f"more than a tensor can hold (2**62): measure smaller shapes"
            )


def run(args: argparse.Namespace) -> int:
    if args.hf_config is not None:
        return _run_hf(args)
    if args.kernels is not None:
        raise UsageError("--kernels goes with --hf-config; MODULE:FACTORY's model calls its own attention ops")
    if is_staged(args):
        raise UsageError(f"--preset {args.preset} is priced, not built: measure its config.json with --hf-config DIR")
    if args.factory is None:
        raise UsageError("give the model: MODULE:FACTORY, or --hf-config DIR (a Hugging Face config.json)")
    refuse_staged_flags(args, extra=("steps", "vision_share", "bounds_of"))
    model = model_from_args(args)
    gpu = gpu_from_args(args)  # before measuring: an unknown --gpu fails now, not after the grid
    _check_buildable(model, args.batch, args.length or [])
    if args.save is not None and len(set(args.length or [])) < 2:
        raise UsageError(
            f"--save needs two or more --length values (a fit separates the per-token and the per-token² "
            f"memory), but got {len(set(args.length or []))}"
        )
    factory = _load_factory(args.factory)
    takes_spec = False
    try:
        takes_spec = "spec" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        pass

    def build() -> torch.nn.Module:
        # built in the spec's dtype, so a factory's own .to(torch.bfloat16) has nothing to swap
        with default_dtype(torch.bfloat16 if model.precision == "bf16" else torch.float32):
            module = factory(spec=model) if takes_spec else factory()
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"{args.factory} returned {type(module).__name__}, not a torch.nn.Module")
        return module

    dtype = torch.bfloat16 if model.precision == "bf16" else torch.float32
    if args.input is not None:
        hook = _load_factory(args.input)
        if args.sample is not None:  # the hook builds the inputs of one sample's shape, batched
            sample = _json_object_arg(args.sample, "--sample")

            def make_batch(b: int, length: int) -> Any:
                return hook(sample, b)
        else:
            make_batch = hook
    elif args.sample is not None:
        raise UsageError("--sample with MODULE:FACTORY goes to an --input hook: give --input MODULE:FN")
    else:

        def make_batch(b: int, length: int) -> Any:
            return torch.empty(b, length, model.hidden, dtype=dtype)

    train = model.mode == "train"
    points = [(args.batch, length) for length in (args.length or [])]
    rows = []
    shown = progress_from_args(args)  # NOTE [ Progress on stderr ]: a step per point
    for b, length in progress(points, desc="profiling", unit="points", enabled=shown):
        prof = profile_memory(build, make_batch, b, length, train=train, optimizer=model.optimizer, device=args.device)
        est = CostModel(model).memory(b, length)
        rows.append(
            {
                "batch": b,
                "length": length,
                "measured": prof.peak,
                "measured_phases": prof.peaks,
                "analytic": est.total,
                "analytic_phase": est.phase,
                "ratio": est.total / prof.peak,
            }
        )
    if args.save is not None:
        grid = sorted({(b, length) for _, length in points for b in (1, 2, args.batch)})
        profile_points(
            build,
            make_batch,
            grid,
            target="fake-cpu" if gpu is None else gpu.name,
            dtype=model.precision,
            device=args.device,
            train=train,
            optimizer=model.optimizer,
            progress=shown,
        ).save(args.save)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{args.factory} on {'fake tensors (CPU)' if args.device == 'fake' else args.device}, "
        f"{model.precision}, {model.attention}, {model.mode}"
    )
    print(f"{'batch':>5} {'length':>8} {'measured':>12} {'analytic':>12} {'analytic/measured':>18}  measured by phase")
    for r in rows:
        phases = ", ".join(f"{k} {_gib(v)}" for k, v in r["measured_phases"].items())
        print(
            f"{r['batch']:>5} {r['length']:>8,} {_gib(r['measured']):>12} {_gib(r['analytic']):>12} "
            f"{r['ratio']:>18.3f}  {phases}"
        )
    off = [r for r in rows if not BAND[0] <= 100 * (r["ratio"] - 1) <= BAND[1]]
    for r in off:
        print(
            f"the block model is {r['ratio']:.2f}x the measured peak at batch {r['batch']}, length {r['length']:,} "
            f"(its band: {BAND[0]:+.0f} % ... {BAND[1]:+.0f} %): it does not describe this module; plan from the "
            "measurement (--save, then plan --profile) or describe a Hugging Face model with --hf-config"
        )
    if args.save is not None:
        print(f"profile written to {args.save}")
    return 0


# the measured categories of PyTorch's trackers, as the staged model's items
_KINDS = {
    "weights": ("Parameter", "Buffer", "Sharded Param", "Unsharded Param", "All Gather"),
    "gradients": ("Gradient", "Sharded Grad", "Unsharded Grad", "Reduce Scatter"),
    "optimizer": ("Optstate", "OptState"),
    "activations": ("Activation", "Temp", "Other", "Inputs"),
}


def _run_hf(args: argparse.Namespace) -> int:
    """Measure the model a config.json describes at one sample's shape, beside the staged estimate."""
    if is_dit(args):
        return run_dit_profile(args)
    if args.factory is not None:
        raise UsageError(f"give MODULE:FACTORY or --hf-config, not both (got {args.factory!r} and --hf-config)")
    if args.input is not None:
        raise UsageError("--input goes with MODULE:FACTORY; --hf-config makes the model's inputs itself")
    if args.bounds_of is not None and args.sample is not None:
        raise UsageError("--bounds-of gives a grid of lengths, not one --sample: give one of them")
    if args.device != "fake":
        raise UsageError("--hf-config measures on fake tensors only (--device fake)")
    args.kernels = args.kernels or "cuda"  # the default: what a GPU saves (NOTE [ The CUDA kernel choice ])
    if args.precision == "amp":
        raise UsageError(
            "--precision amp is not measured with --hf-config (its bf16 autocast over fp32 weights): give bf16 or fp32"
        )
    if args.bounds_of is not None:
        bounds = [b.bound for b in load_manifest(args.bounds_of).plan.buckets]
        args.length = sorted(set(args.length or []) | set(bounds))
    if (args.sample is None) == (not args.length):
        raise UsageError(
            "--hf-config measures either one --sample (beside the staged estimate) or a grid of --length values "
            "(each length's worst sample, as plan prices it; --save writes the profile): give one"
        )
    if args.sample is not None and args.save is not None:
        raise UsageError("--save writes a grid of --length values, not one --sample: give --length (two or more)")
    cost = staged_cost_from_args(args)
    if cost.config is None:
        raise AssertionError("--hf-config gives the model's config")
    steps = args.steps or (1 if cost.setup.sharding == "ddp" else 2)
    try:
        from tokenbucket.cost import hf_profile  # optional: transformers (pip install 'tokenbucket[transformers]')
    except ImportError as exc:
        raise ConfigError(f"--hf-config needs transformers: pip install 'tokenbucket[transformers]' ({exc})") from None
    if args.length:
        return _hf_grid(args, cost, steps, hf_profile.profile_hf, hf_profile.with_markers)
    sample = sample_from_args(args.sample)
    run_ = hf_profile.profile_hf(
        cost.config, sample, args.batch, cost.setup, steps=steps, precision=args.precision, kernels=args.kernels
    )  # fmt: skip
    est = cost.memory(args.batch, sample, first_step=steps == 1)
    measured = {k: sum(run_.breakdown.get(c, 0) for c in cats) for k, cats in _KINDS.items()}
    predicted = {k: est.item(k) for k in ("weights", "gradients", "optimizer")}
    # at the optimizer phase the transients are the optimizer's own temporaries (AdamW's foreach),
    # which MemTracker files under Optstate
    step_work = "optimizer" if est.phase == "optimizer" else "activations"
    predicted["activations"] = est.item("activations") + est.item("loop")
    predicted[step_work] += est.item("transients")
    err = 100.0 * (est.peak_bytes - run_.peak_bytes) / run_.peak_bytes
    within = BAND[0] <= err <= BAND[1]
    suspect = None if within else _suspect(cost, run_, err)  # NOTE [ Which side is suspect ]
    if args.json:
        print(json.dumps({
            "model": cost.model.name, "setup": dataclasses.asdict(cost.setup), "batch": args.batch,
            "seq_len": run_.seq_len, "steps": steps, "measured_peak_bytes": run_.peak_bytes,
            "predicted_peak_bytes": est.peak_bytes, "error_percent": round(err, 2), "within_band": within,
            "measured": measured, "predicted": predicted, "measured_breakdown": run_.breakdown,
            "predicted_stages": est.stages, "params_total": run_.params_total,
            "params_trainable": run_.params_trainable, "seconds": run_.seconds, "notes": list(run_.notes),
            "dtype": run_.dtype, "suspect": None if suspect is None else {"which": suspect[0], "why": suspect[1]},
        }))  # fmt: skip
        return 0
    s = cost.setup
    print(
        f"{cost.model.name} ({cost.model.model_type}) on fake tensors (CPU), {run_.dtype}, train {s.train}, sharding "
        f"{s.sharding} x {s.world_size}; batch {args.batch} x {run_.seq_len:,} LLM tokens; {steps} step(s), "
        f"loop {s.loop}, {args.kernels} attention kernels, {run_.seconds:.0f} s; per rank"
    )
    print(f"  {'':<14}{'measured':>13}{'predicted':>13}")
    for kind in _KINDS:
        print(f"  {kind:<14}{_gib(measured[kind]):>13}{_gib(predicted[kind]):>13}")
    print(f"  {'peak':<14}{_gib(run_.peak_bytes):>13}{_gib(est.peak_bytes):>13}   predicted {err:+.1f} %")
    for note in run_.notes:
        print(f"  note: {note}")
    if suspect is not None:
        print(
            f"the staged model is {err:+.1f} % off the measured peak, outside its band "
            f"({BAND[0]:+.0f} % ... {BAND[1]:+.0f} %): measured {_gib(run_.peak_bytes)}, predicted "
            f"{_gib(est.peak_bytes)}; suspect: {suspect[0]}, {suspect[1]}"
        )
    return 0


def _suspect(cost: StagedCostModel, run_: HFProfile, err: float) -> tuple[str, str]:
    """Which of the measurement and the staged model a gap beyond the band indicts, and why.

    NOTE [ Which side is suspect ]
    A gap says one of the two is wrong for this model, not which. The measurement is of the
    build profile_hf checked (every floating parameter in ``run_.dtype``, NOTE [ The build dtype ]
    in tokenbucket.cost.hf_profile): when that dtype is not the pure bf16 the staged model prices,
    the two measure different runs and the gap is the precision. When the dtypes agree but
    transformers built another parameter count than the staged model reads from config.json
    (LoRA's adapters aside: under LoRA only they train), the staged model describes another
    model. Only when both agree is the staged model itself suspect, by the gap.
    """
    if run_.dtype != "bf16":
        return "the measurement", (
            f"it measured the {run_.dtype} build and the staged model prices bf16 (weights, gradients, optimizer "
            f"states, activations): the gap is the precision; profile with --precision bf16 to check the staged model"
        )
    built = run_.params_total - (run_.params_trainable if cost.setup.train == "lora" else 0)
    if built != cost.model.params:
        return "the staged model's reading of config.json", (
            f"transformers built {built:,} parameters and the staged model counts {cost.model.params:,} "
            f"({100.0 * (cost.model.params - built) / built:+.1f} %): it prices another model"
        )
    return "the staged model", (
        f"the build is checked (bf16 parameters, {built:,} of them as the staged model counts) and the staged "
        f"model is {err:+.1f} % off it for this model: plan from the measurement (--length ... --save, then "
        "plan --profile)"
    )


def _hf_grid(
    args: argparse.Namespace, cost: StagedCostModel, steps: int, measure: Callable[..., Any],
    markers: Callable[..., Any],
) -> int:  # fmt: skip
    """Each --length's worst sample (NOTE [ The worst sample of a length ]) at batch 1, 2 and
    --batch, measured beside the staged estimate; --save writes the profile ``plan --profile`` reads."""
    try:
        length_model = StagedLengthModel(cost, vision_share=1.0 if args.vision_share is None else args.vision_share)
    except ConfigError as exc:
        raise UsageError(f"--vision-share: {exc}") from None
    lengths = sorted(set(args.length))
    if args.save is not None and len(lengths) < 2:
        raise UsageError(f"--save needs two or more --length values, but got {len(lengths)}")
    gpu = gpu_from_args(args)
    grid = sorted({(b, n) for n in lengths for b in ((1, 2, args.batch) if args.save is not None else (args.batch,))})
    rows: list[dict[str, Any]] = []
    versions: dict[str, str] = {}
    built, why = "bf16", ""
    shown = progress_from_args(args)  # NOTE [ Progress on stderr ]: a step per point
    for b, n in progress(grid, desc="profiling", unit="points", enabled=shown):
        # the worst sample of n tokens; for Qwen2-VL with its vision markers, which a worst sample
        # made all image tokens has no room for (measured a few tokens long: the safe side)
        sample = markers(cost.config, length_model.sample(n))
        run_ = measure(cost.config, sample, b, cost.setup, steps=steps, precision=args.precision, kernels=args.kernels)
        versions, built, why = run_.versions, run_.dtype, run_.notes[0]
        est = cost.memory(b, sample, first_step=steps == 1)
        err = 100.0 * (est.peak_bytes - run_.peak_bytes) / run_.peak_bytes
        within = BAND[0] <= err <= BAND[1]
        rows.append({"batch": b, "length": n, "seq_len": run_.seq_len, "sample": dataclasses.asdict(sample),
                     "measured": run_.peak_bytes, "predicted": est.peak_bytes, "error_percent": round(err, 2),
                     "within_band": within, "dtype": run_.dtype,
                     "suspect": None if within else ", ".join(_suspect(cost, run_, err))})  # fmt: skip
    if args.save is not None:
        Profile(
            points=tuple((r["batch"], r["length"], r["measured"]) for r in rows),
            target="fake-cpu" if gpu is None else gpu.name, dtype=built, torch_version=torch.__version__,
            model=staged_profile_key(cost), device="fake",
            staged={"vision_share": length_model.vision_share,
                    "image": None if length_model.image is None else list(length_model.image), "steps": steps,
                    "transformers": versions.get("transformers", "")},
        ).save(args.save)  # fmt: skip
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{cost.model.name} ({cost.model.model_type}) on fake tensors (CPU), {built}, train {cost.setup.train}, "
        f"sharding {cost.setup.sharding} x {cost.setup.world_size}; each length's worst sample at vision share "
        f"{length_model.vision_share:g}; {steps} step(s), loop {cost.setup.loop}, {args.kernels} attention "
        "kernels; per rank"
    )
    print(f"  note: {why}")
    print(f"{'batch':>5} {'length':>8} {'sample':>28} {'measured':>12} {'predicted':>12} {'error':>8}")
    for r in rows:
        smp = r["sample"]
        shape = f"{smp['images']}x{smp['height']}x{smp['width']} + {smp['text_tokens']}"
        print(
            f"{r['batch']:>5} {r['length']:>8,} {shape:>28} {_gib(r['measured']):>12} {_gib(r['predicted']):>12} "
            f"{r['error_percent']:>+7.1f}%"
        )
    off = [r for r in rows if not r["within_band"]]
    if off:
        print(
            f"the staged model is outside its band ({BAND[0]:+.0f} % ... {BAND[1]:+.0f} %) at {len(off)} of "
            f"{len(rows)} points; suspect: {off[0]['suspect']}"
        )
    if args.save is not None:
        print(f"profile written to {args.save} (model {staged_profile_key(cost)})")
    return 0
