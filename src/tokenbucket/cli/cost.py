"""``tokenbucket cost``: itemised memory, FLOPs and fit of one batch shape.

tokenbucket cost [model flags] --batch B --length L [--gpu NAME | --budget-gib X] [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tokenbucket.cli._common import _add_model_flags, _budget, _gib, finite_float, model_from_args
from tokenbucket.cost.memory import MEMORY_ITEMS, CostModel

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--length", type=int, required=True, help="padded sequence length in tokens")
    parser.add_argument("--gpu", help="GPU target (see `tokenbucket gpus`)")
    parser.add_argument("--budget-gib", type=finite_float, help="memory budget instead of a GPU's")
    parser.add_argument("--mfu", type=finite_float, default=0.4, help="assumed FLOPs utilisation for step time")
    parser.add_argument("--json", action="store_true")
    _add_model_flags(parser, with_config=True)


def run(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    cost = CostModel(model, args.gpu, mfu=args.mfu)
    mem = cost.memory(args.batch, args.length)
    flops = cost.flops(args.batch, args.length)
    budget = _budget(args)
    out: dict[str, Any] = {k: getattr(mem, k) for k in MEMORY_ITEMS}
    out.update(total=mem.total, phase=mem.phase, flops=flops.to_dict())
    if budget is not None:
        out.update(budget_bytes=budget, fits=mem.total <= budget, max_batch=cost.max_batch(args.length, budget))
    if cost.gpu is not None:
        out["step_seconds"] = cost.step_seconds(args.batch, args.length)
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
    if "step_seconds" in out:
        print(f"  step time at {args.mfu:.0%} of {cost.gpu.name} peak: {out['step_seconds'] * 1e3:,.1f} ms")  # type: ignore[union-attr]
    return 0
