"""``tokenbucket gpus``: the GPU registry and each GPU's memory budget.

tokenbucket gpus [--json]
"""

from __future__ import annotations

import argparse
import json

from tokenbucket.cost.gpus import GPUS, gpu_budget_bytes

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = "tokenbucket gpus --json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of the table")


def run(args: argparse.Namespace) -> int:
    rows = [
        {
            "name": g.name,
            "visible_gib": g.visible_gib,
            "budget_gib": round(gpu_budget_bytes(g) / 2**30, 2),
            "bf16_tflops": g.bf16_tflops,
            "bandwidth_tbs": g.bandwidth_tbs,
            "link_gbs": g.link_gbs,
            "mfu": g.mfu,
            "mfu_source": g.mfu_source,
        }
        for g in GPUS.values()
    ]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'gpu':<11} {'visible':>9} {'budget':>9} {'bf16 TFLOP/s':>13} {'TB/s':>6} {'link GB/s':>9} {'mfu':>5}")
    for r in rows:
        tf = "no bf16" if r["bf16_tflops"] is None else f"{r['bf16_tflops']:,.0f}"
        print(
            f"{r['name']:<11} {r['visible_gib']:>7.2f}Gi {r['budget_gib']:>7.2f}Gi {tf:>13} {r['bandwidth_tbs']:>6.2f}"
            f" {r['link_gbs']:>9,.0f} {r['mfu']:>5.0%}"
        )
    print("budget = (visible - 0.5 GiB CUDA context - 0.25 GiB workspace) / 1.1")
    print("mfu: the saturated share of the bf16 peak a step is timed at; its source per GPU is in --json")
    return 0
