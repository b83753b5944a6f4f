"""Accuracy of the analytic cost model against the fake-tensor profiler, over a sweep.

Command (what docs/cost-model.md's table comes from):

    .venv/bin/python benchmarks/bench_cost_model.py            # 4 layers, 720 points, ~5 min
    .venv/bin/python benchmarks/bench_cost_model.py --quick    # a corner sample

For the reference block (``tokenbucket.cost.reference``) at D ∈ {256, 512, 1024} (head dim 64),
L ∈ {512, 1024, 2048, 4096, 8192}, B ∈ {1, 2, 4}, flash and eager attention, bf16 and amp,
with and without full checkpointing, GELU and SwiGLU MLPs: the predicted training peak
(``CostModel.memory``) over the measured one (``tokenbucket.cost.profile.profile_memory``, live
storage on fake tensors, two AdamW steps). Reports, per configuration, the worst and the mean
absolute error and how often the model is below the measurement (an under-estimate is the
dangerous side: it can OOM).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import defaultdict

import torch

from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import profile_memory
from tokenbucket.cost.reference import ReferenceTransformer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="a corner sample of the sweep")
    args = parser.parse_args(argv)

    dims = [256, 512, 1024]
    lengths = [512, 8192] if args.quick else [512, 1024, 2048, 4096, 8192]
    batches = [1, 4] if args.quick else [1, 2, 4]
    results: dict[tuple[str, ...], list[float]] = defaultdict(list)
    start = time.perf_counter()
    for attention, precision, ckpt, gated in itertools.product(
        ["flash", "eager"], ["bf16", "amp"], ["none", "full"], [False, True]
    ):
        for d, length, b in itertools.product(dims, lengths, batches):
            spec = ModelSpec(
                hidden=d,
                layers=args.layers,
                heads=d // 64,
                precision=precision,
                attention=attention,
                checkpointing=ckpt,
                gated_mlp=gated,
            )
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            measured = profile_memory(
                lambda spec=spec: ReferenceTransformer(spec),
                lambda bb, n, d=d, dtype=dtype: torch.empty(bb, n, d, dtype=dtype),
                b,
                length,
            ).peak
            predicted = CostModel(spec).memory(b, length).total
            results[(attention, precision, ckpt, "swiglu" if gated else "gelu")].append(predicted / measured - 1)
    seconds = time.perf_counter() - start
    points = sum(len(v) for v in results.values())
    print(f"\n{points} points, {args.layers} layers, torch {torch.__version__}, {seconds:.0f} s\n")
    print("| attention | precision | checkpointing | MLP | points | worst error | mean abs error | under-estimates |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for key, errs in results.items():
        worst = max(errs, key=abs)
        mean = sum(abs(e) for e in errs) / len(errs)
        under = sum(e < 0 for e in errs)
        print(f"| {' | '.join(key)} | {len(errs)} | {worst:+.1%} | {mean:.1%} | {under}/{len(errs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
