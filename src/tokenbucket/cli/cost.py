"""``tokenbucket cost``: itemised memory, FLOPs and fit of one batch shape.

tokenbucket cost [model flags] --batch B --length L [--gpu NAME | --budget-gib X] [--json]
tokenbucket cost --hf-config DIR --sample JSON --batch B [--train T] [--sharding S --world-size N] [--json]
tokenbucket cost --hf-config PIPELINE --sample JSON --batch B [--train T] [--backbone-checkpointing full] [--json]
tokenbucket cost --lerobot-policy DIR|pi0|pi05|smolvla --batch B [--cameras C] [--text-tokens T] [--gpu NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tokenbucket._exceptions import UsageError
from tokenbucket.cli._common import (
    _add_model_flags,
    _budget,
    _gib,
    gpu_from_args,
    model_from_args,
    positive_float,
    positive_int,
    unit_fraction,
)
from tokenbucket.cli._dit import is_dit, run_dit_cost
from tokenbucket.cli._lerobot import add_lerobot_flags, is_lerobot, refuse_lerobot_flags, run_lerobot
from tokenbucket.cli._staged import (
    add_staged_flags,
    is_staged,
    print_estimate,
    refuse_staged_flags,
    sample_from_args,
    staged_cost_from_args,
    staged_json,
)
from tokenbucket.cost.memory import MEMORY_ITEMS, CostModel

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = (
    "tokenbucket cost --preset design-24L-1024 --batch 1 --length 16384 --gpu H100-SXM\n"
    '  tokenbucket cost --preset qwen2-vl-2b --sample \'{"images": 4, "height": 448, "width": 448, '
    '"text_tokens": 512}\' --batch 2 --sharding fsdp --world-size 8 --gpu H100-SXM\n'
    "  tokenbucket cost --lerobot-policy smolvla --batch 32 --cameras 2 --gpu H100-SXM"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=positive_int, required=True, help="samples in the batch")
    parser.add_argument("--length", type=positive_int, help="padded sequence length in tokens (block model)")
    parser.add_argument(
        "--sample",
        help='one sample of a staged model as JSON: {"images", "height", "width", "text_tokens"} or cameras x frames',
    )
    parser.add_argument("--gpu", help="GPU target, e.g. h100-sxm (see `tokenbucket gpus`; a unique prefix will do)")
    parser.add_argument("--budget-gib", type=positive_float, help="memory budget in GiB instead of a GPU's")
    parser.add_argument(
        "--mfu",
        type=unit_fraction,
        help="the saturated FLOPs utilisation in (0, 1] for step time (default: the --gpu's, from the registry "
        "with its source; `tokenbucket gpus --json` lists them)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    _add_model_flags(parser, with_config=True)
    add_staged_flags(parser)
    add_lerobot_flags(parser)


def run(args: argparse.Namespace) -> int:
    if is_lerobot(args):
        return run_lerobot(args)
    refuse_lerobot_flags(args)
    if is_dit(args):
        return run_dit_cost(args)
    if is_staged(args):
        return _run_staged(args)
    refuse_staged_flags(args, extra=("sample",))
    if args.length is None:
        raise UsageError("the block model needs --length (or give --hf-config and --sample)")
    model = model_from_args(args)
    cost = CostModel(model, gpu_from_args(args), mfu=args.mfu)
    mem = cost.memory(args.batch, args.length)
    flops = cost.flops(args.batch, args.length)
    budget = _budget(args)
    out: dict[str, Any] = {k: getattr(mem, k) for k in MEMORY_ITEMS}
    out.update(total=mem.total, phase=mem.phase, flops=flops.to_dict())
    if budget is not None:
        out.update(budget_bytes=budget, fits=mem.total <= budget, max_batch=cost.max_batch(args.length, budget))
    if cost.gpu is not None:
        parts = cost.step_time_parts(args.batch, args.length)
        out["step_seconds"] = parts.total
        out["step_time"] = parts.to_dict()
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{model.name or 'model'}: {model.layers} x D={model.hidden}, {model.heads} heads "
        f"({model.kv_heads} kv), {model.precision}, {model.attention}, {model.mode}, "
        f"{model.params / 1e6:,.1f} M params; batch {args.batch} x length {args.length:,}"
    )
    for k in MEMORY_ITEMS:
        print(f"  {k:<17} {_gib(getattr(mem, k)):>14}")
    print(f"  {'total (peak)':<17} {_gib(mem.total):>14}   at the {mem.phase} phase")
    print(f"  flops: forward {flops.forward:.3e}, attention {flops.attention:.3e}, training {flops.training:.3e}")
    if budget is not None:
        verdict = "fits" if out["fits"] else "does NOT fit"
        print(f"  budget {_gib(budget)}: {verdict}; largest batch at this length: {out['max_batch']}")
    if cost.step_time is not None and cost.gpu is not None:
        p, st = out["step_time"], cost.step_time
        print(
            f"  step time {p['total'] * 1e3:,.1f} ms = fixed {p['fixed'] * 1e3:,.1f} ms (launch "
            f"{p['launch'] * 1e3:,.1f}, optimizer {p['optimizer'] * 1e3:,.1f}, collectives "
            f"{p['communication'] * 1e3:,.1f}) + compute {p['compute'] * 1e3:,.1f} ms at {p['utilisation']:.0%} of "
            f"{cost.gpu.name}'s peak ({st.mfu:.0%} saturated; source: {st.source})"
        )
    return 0


def _run_staged(args: argparse.Namespace) -> int:
    if args.sample is None:
        raise UsageError("a staged model needs --sample (one sample's images, height, width, text_tokens)")
    if args.length is not None:
        raise UsageError("--length is the block model's; a staged model's length follows from --sample")
    cost = staged_cost_from_args(args)
    sample = sample_from_args(args.sample)
    est = cost.memory(args.batch, sample)
    out = staged_json(cost, est, _budget(args), sample)
    if args.json:
        print(json.dumps(out))
    else:
        print_estimate(cost, est, out)
    return 0
