"""2D buckets (LLM tokens x image tokens) against 1D ones, on text-heavy and vision-heavy samples.

Workload: mixture TV (NOTE [ Mixture TV ]), counted with Qwen2-VL-2B's own processor rules.
Model: the ``qwen2-vl-2b`` staged preset, bf16 AdamW, vision and backbone checkpointing, one
H100-SXM (80 GB) at its default budget. For each shape count K:

- ``2D``: :func:`tokenbucket.plan.buckets_2d.plan_buckets_2d`;
- ``1D, best``: the same planner with one image-token level per length band (every bucket sized
  for the most image tokens among its own samples; the best 1D plan on the same grid);
- ``1D, share``: :func:`tokenbucket.plan.buckets.plan_buckets` with the staged length model at
  the data's largest image share (what ``tokenbucket plan --hf-config`` does in 1D);
- the per-sample sorted oracle (:func:`~tokenbucket.plan.buckets_2d.sorted_oracle`: sorted,
  cut greedily, each batch padded to its own maxima, no shape limit; the better of two orders).

"over budget" counts batches whose bucket, priced with its heaviest real member exactly (its own
images at their own size and its own text, ``batch_size`` copies), is over the budget: the check
that the worst-sample rounding of NOTE [ Two-dimensional buckets ] holds for real samples.

    python benchmarks/bench_2d.py [--samples 50000] [--shapes 8 16 32]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tokenbucket import breakdown_table, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.buckets_2d import plan_buckets_2d, sorted_oracle
from tokenbucket.testing import mixture_tv
from tokenbucket.tokens.hf import token_spec_from_hf


def exact_over(
    plan: BucketPlan, table: object, lengths: np.ndarray, vision: np.ndarray, cost: StagedCostModel, budget: int
) -> int:
    """Batches of buckets whose heaviest real member, ``batch_size`` copies of it, is over budget."""
    where = plan.assign(lengths, vision) if plan.two_d else plan.assign(lengths)
    cams = table.column("cameras").to_numpy() * table.column("frames").to_numpy()  # type: ignore[attr-defined]
    side = table.column("height").to_numpy()  # type: ignore[attr-defined]
    over = 0
    for k, b in enumerate(plan.buckets):
        members = np.flatnonzero(where == k)
        worst = 0
        for i in members[np.argsort(-(vision[members] * 4 + lengths[members]))[:8]].tolist():
            s = Sample(images=int(cams[i]) if vision[i] else 0, height=int(side[i]), width=int(side[i]),
                       text_tokens=int(lengths[i] - vision[i]))  # fmt: skip
            worst = max(worst, cost.memory(b.batch_size, s).peak_bytes)
        over += b.batches if worst > budget else 0
    return over


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--shapes", type=int, nargs="+", default=[8, 16, 32])
    args = parser.parse_args()

    setup = TrainSetup(vision_checkpointing="full", backbone_checkpointing="full")
    staged = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup, gpu="H100-SXM")
    if staged.config is None:
        raise SystemExit("the qwen2-vl-2b preset should carry its config")
    table = mixture_tv(args.samples, seed=0)
    result = breakdown_table(table, token_spec_from_hf(staged.config))
    lengths = result.totals.astype(np.int64)
    vision = result.table.column("vision").to_numpy().astype(np.int64)
    budget = gpu_budget_bytes("H100-SXM")
    share = float((vision / lengths).max())
    two_d = StagedLengthModel(staged)
    one_d = StagedLengthModel(staged, vision_share=share)
    print(
        f"mixture TV, {args.samples:,} samples (text-only {np.mean(vision == 0):.0%}, over 90 % image tokens "
        f"{np.mean(vision > 0.9 * lengths):.0%}); qwen2-vl-2b, bf16 AdamW, vision + backbone checkpointing; "
        f"H100-SXM budget {budget / 2**30:.1f} GiB; largest image share {share:.3f}\n"
    )
    print("| K | plan | shapes | batches | predicted epoch h | vs oracle | padding efficiency | plan s | over budget |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    oracle: dict[str, float] | None = None
    for k in args.shapes:
        rows = []
        t0 = time.perf_counter()
        p2 = plan_buckets_2d(lengths, vision, two_d, budget, max_buckets=k, on_oversize="reject")
        rows.append(("2D", p2, time.perf_counter() - t0))
        t0 = time.perf_counter()
        best = plan_buckets_2d(lengths, vision, two_d, budget, max_buckets=k, max_levels=1, on_oversize="reject")
        rows.append(("1D, best (one level per band)", best, time.perf_counter() - t0))
        t0 = time.perf_counter()
        p1 = plan_buckets(lengths, one_d, budget, max_buckets=k, on_oversize="reject")
        rows.append((f"1D, share {share:.2f}", p1, time.perf_counter() - t0))
        kept = p2.assign(lengths, vision) >= 0
        if oracle is None:
            t0 = time.perf_counter()
            orders = [sorted_oracle(lengths[kept], vision[kept], two_d, budget, key=o) for o in ("vision", "length")]
            oracle = min(orders, key=lambda o: o["predicted_epoch_seconds"])
            oracle_s = time.perf_counter() - t0
        ref = oracle["predicted_epoch_seconds"]
        for name, plan, secs in rows:
            s = plan.summary()
            note = "" if s["samples"] == int(kept.sum()) else f" ({s['rejected']:,} rejected)"
            print(
                f"| {k} | {name}{note} | {s['shapes']} | {s['batches']:,} | {s['predicted_epoch_seconds'] / 3600:.2f} | "
                f"{s['predicted_epoch_seconds'] / ref - 1:+.1%} | {s['padding_efficiency']:.3f} | {secs:.1f} | "
                f"{exact_over(plan, table, lengths, vision, staged, budget)} |"
            )
    if oracle is not None:
        print(
            f"| — | per-sample sorted oracle | — | {int(oracle['batches']):,} | "
            f"{oracle['predicted_epoch_seconds'] / 3600:.2f} | 0 | {oracle['padding_efficiency']:.3f} | {oracle_s:.1f} | — |"
        )
    print(f"\nrejected (fit not even alone), the same for every plan: {int((~kept).sum()):,} samples")


if __name__ == "__main__":
    main()
