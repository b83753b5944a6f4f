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
  cut greedily, each batch padded to its own maxima, no shape limit; the better of two orders);
- the peer, ``lhotse 2D bins``: lhotse's ``DynamicBucketingSampler`` with two-dimensional bins the
  way NeMo sets it up (equal-count length bins, each cut into equal-count image-token sub-bins,
  one fixed batch size per bin: the largest that fits at the bin's corner, which NeMo's
  OOMptimizer finds on a GPU and the cost model gives here). For each K the best split
  n_L x n_V = K over n_V in 1, 2, 4, 8 is shown (n_V = 1 is lhotse's 1D per-bucket sizes), twice:
  each batch padded to its bin's batch size and corner (K shapes, like a tokenbucket static plan)
  and padded to its own rows and maxima, as lhotse's collation does (its shapes are then the
  distinct (rows, length, image tokens) it emits, each a recompile under ``torch.compile`` with
  ``dynamic=False``). Needs ``pip install -e '.[bench]'``.

"over budget" counts, for a tokenbucket plan, batches whose bucket, priced with its heaviest real member exactly (its own
cameras at their own size, each a clip as the breakdown counts it (NOTE [ Frames are images ]:
Qwen's two-frame temporal patch), and its own text, ``batch_size`` copies), is over the budget:
the check that the worst-sample rounding of NOTE [ Two-dimensional buckets ] holds for real
samples; for the peer, batches over the budget at their own rows and maxima (the oracle's check).

    python benchmarks/bench_2d.py [--samples 50000] [--shapes 8 16 32 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import pyarrow as pa

from tokenbucket import breakdown_table, gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.buckets_2d import plan_buckets_2d, sorted_oracle, step_cost_2d
from tokenbucket.testing import mixture_tv
from tokenbucket.tokens.hf import token_spec_from_hf


def samples_of(table: pa.Table) -> list[Sample]:
    """Every metadata row as the breakdown counts it with the model's own spec
    (``token_spec_from_hf``, NOTE [ Frames are images ]): each camera one clip, which the cost model
    feeds through the family's video path when it has one and the camera has two frames or more
    (Qwen: frame pairs merged along time), and as images otherwise; a row without cameras is text."""
    return [
        Sample.video(cameras=r["cameras"], frames=r["frames"], height=r["height"], width=r["width"],
                     text_tokens=r["text_tokens"]) if r["cameras"] else Sample(text_tokens=r["text_tokens"])
        for r in table.to_pylist()
    ]  # fmt: skip


def exact_over(
    plan: BucketPlan,
    samples: list[Sample],
    lengths: np.ndarray,
    vision: np.ndarray,
    cost: StagedCostModel,
    budget: int,
) -> int:
    """Batches of buckets whose heaviest real member, ``batch_size`` copies of it, is over budget.

    Members sharing their vision (images or clips, frames, size) differ only in text, and memory
    grows with text, so the member with the most text of each such group is priced: every member
    is checked. ``samples`` price each row as the breakdown counted ``lengths`` and ``vision``
    (:func:`samples_of`)."""
    where = plan.assign(lengths, vision) if plan.two_d else plan.assign(lengths)
    over = 0
    for k, b in enumerate(plan.buckets):
        heaviest: dict[Sample, Sample] = {}
        for i in np.flatnonzero(where == k).tolist():
            s = samples[i]
            key = replace(s, text_tokens=0) if s.images or s.videos else Sample(text_tokens=1)
            if key not in heaviest or heaviest[key].text_tokens < s.text_tokens:
                heaviest[key] = s
        worst = max((cost.memory(b.batch_size, s).peak_bytes for s in heaviest.values()), default=0)
        over += b.batches if worst > budget else 0
    return over


def split_bins(lengths: np.ndarray, vision: np.ndarray, n_len: int, n_vis: int) -> list[tuple[int, int]]:
    """Two-dimensional bins as NeMo estimates them: ``n_len`` equal-count length bins, each cut
    into ``n_vis`` equal-count image-token sub-bins; a bin is (its longest, its most image tokens),
    sorted, and every sample is held by the first bin with both its counts at or under the bin's."""
    bins: list[tuple[int, int]] = []
    below = -1
    for top in np.unique(np.quantile(lengths, np.linspace(0, 1, n_len + 1)[1:], method="higher")).tolist():
        inside = vision[(lengths > below) & (lengths <= top)]
        if inside.size:
            tops = np.unique(np.quantile(inside, np.linspace(0, 1, n_vis + 1)[1:], method="higher"))
            bins += [(int(top), int(v)) for v in tops.tolist()]
        below = top
    return bins


def first_bin(bins: list[tuple[int, int]], length: int, vis: int) -> int:
    """The first bin holding both counts (``len(bins)`` when none does)."""
    return next((i for i, (top, v) in enumerate(bins) if length <= top and vis <= v), len(bins))


def score_batches(
    batches: Iterable[np.ndarray],
    lengths: np.ndarray,
    vision: np.ndarray,
    cost: StagedLengthModel,
    budget: int,
    bins: list[tuple[int, int]] | None = None,
    sizes: list[int] | None = None,
) -> dict[str, float]:
    """A sampler's batches: steps, predicted seconds, padding efficiency, distinct shapes and
    batches over the budget. Each batch is padded to its own rows and maxima, or with ``bins``
    and ``sizes`` to its bin's batch size and corner (one shape per bin, as a compiled step
    wants). Every sample must come exactly once."""
    seen = np.zeros(len(lengths), np.int64)
    n = seconds = padded = over = 0.0
    shapes: set[tuple[int, int, int]] = set()
    for ids in batches:
        seen[ids] += 1
        rows, top, vis = len(ids), int(lengths[ids].max()), int(vision[ids].max())
        if bins is not None and sizes is not None:
            b = first_bin(bins, top, vis)
            rows, (top, vis) = sizes[b], bins[b]
        n, seconds, padded = n + 1, seconds + step_cost_2d(cost, rows, top, vis), padded + rows * top
        over += cost.memory(rows, top, vis).total > budget
        shapes.add((rows, top, vis))
    assert (seen == 1).all(), "a sampler should yield every sample exactly once"
    return {"batches": n, "predicted_epoch_seconds": seconds, "padding_efficiency": float(lengths.sum()) / padded,
            "shapes": len(shapes), "over_budget": over}  # fmt: skip


def lhotse_batches(
    lengths: np.ndarray,
    vision: np.ndarray,
    cost: StagedLengthModel,
    budget: int,
    n_len: int,
    n_vis: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[list[np.ndarray], list[tuple[int, int]], list[int]]:
    """One rank's batches of lhotse's DynamicBucketingSampler over NeMo-style 2D bins with a
    fixed batch per bin (its default ``sync_buckets``: every rank draws from the same bin each
    step), and the bins and their batch sizes."""
    import warnings

    from lhotse import CutSet
    from lhotse.dataset.sampling import DynamicBucketingSampler
    from lhotse.dataset.sampling.dynamic_bucketing import FixedBucketBatchSizeConstraint
    from lhotse.testing.dummies import dummy_cut

    class Fixed2D(FixedBucketBatchSizeConstraint):  # type: ignore[misc]
        def measure_length(self, example: object) -> tuple[int, int]:
            custom = example.custom  # type: ignore[attr-defined]
            return int(custom["L"]), int(custom["V"])

        def select_bucket(
            self, buckets: list[tuple[int, int]], example: object = None, example_len: object = None
        ) -> int:
            length, vis = self.measure_length(example) if example_len is None else example_len  # type: ignore[misc]
            return first_bin(buckets, length, vis)

    bins = split_bins(lengths, vision, n_len, n_vis)
    sizes = [max(1, cost.max_batch(top, budget, vision=v)) for top, v in bins]
    cuts = []
    for i, (top, v) in enumerate(zip(lengths.tolist(), vision.tolist(), strict=True)):
        cut = dummy_cut(i, duration=1.0)
        cut.custom = {"L": top, "V": v}
        cuts.append(cut)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = DynamicBucketingSampler(
            CutSet.from_cuts(cuts), constraint=Fixed2D(bins, sizes), duration_bins=bins, shuffle=True, seed=0,
            rank=rank, world_size=world_size,
        )  # fmt: skip
        batches = [np.array([int(c.id.rsplit("-", 1)[-1].split("_dup")[0]) for c in batch]) for batch in sampler]
    return batches, bins, sizes


def lhotse_2d(
    lengths: np.ndarray, vision: np.ndarray, cost: StagedLengthModel, budget: int, n_len: int, n_vis: int
) -> tuple[dict[str, float], dict[str, float]]:
    """lhotse's DynamicBucketingSampler over NeMo-style 2D bins with a fixed batch per bin: its
    epoch padded per bin (one shape each) and padded per batch (its own shapes)."""
    batches, bins, sizes = lhotse_batches(lengths, vision, cost, budget, n_len, n_vis)
    per_bin = score_batches(batches, lengths, vision, cost, budget, bins, sizes)
    return per_bin, score_batches(batches, lengths, vision, cost, budget)


def lhotse_2d_ranks(
    lengths: np.ndarray,
    vision: np.ndarray,
    cost: StagedLengthModel,
    budget: int,
    n_len: int,
    n_vis: int,
    world_size: int,
) -> list[list[np.ndarray | None]]:
    """Per step, each rank's batch (``None`` once a rank has run out) from ``world_size`` samplers."""
    ranks = [
        lhotse_batches(lengths, vision, cost, budget, n_len, n_vis, rank=r, world_size=world_size)[0]
        for r in range(world_size)
    ]
    steps = max(len(r) for r in ranks)
    return [[r[k] if k < len(r) else None for r in ranks] for k in range(steps)]


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
    samples = samples_of(table)
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
    peers = importlib.util.find_spec("lhotse") is not None
    if not peers:
        print("lhotse is not installed (pip install -e '.[bench]'): its rows are skipped\n")
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
                f"{exact_over(plan, samples, lengths, vision, staged, budget)} |"
            )
        if peers:
            t0 = time.perf_counter()
            splits = [(k // v, v) for v in (1, 2, 4, 8) if k % v == 0]
            tried = [(lhotse_2d(lengths[kept], vision[kept], two_d, budget, *nv), nv) for nv in splits]
            secs = (time.perf_counter() - t0) / len(splits)
            for way, name in enumerate(("padded to its bin", "padded per batch")):
                (peer, (n_len, n_vis)) = min(
                    ((t[way], nv) for t, nv in tried), key=lambda t: t[0]["predicted_epoch_seconds"]
                )
                print(
                    f"| {k} | lhotse 2D bins {n_len} x {n_vis}, {name} | {int(peer['shapes']):,} | "
                    f"{int(peer['batches']):,} | {peer['predicted_epoch_seconds'] / 3600:.2f} | "
                    f"{peer['predicted_epoch_seconds'] / ref - 1:+.1%} | {peer['padding_efficiency']:.3f} | "
                    f"{secs:.1f} | {int(peer['over_budget'])} |"
                )
    if oracle is not None:
        print(
            f"| — | per-sample sorted oracle | — | {int(oracle['batches']):,} | "
            f"{oracle['predicted_epoch_seconds'] / 3600:.2f} | 0 | {oracle['padding_efficiency']:.3f} | {oracle_s:.1f} | — |"
        )
    print(f"\nrejected (fit not even alone), the same for every plan: {int((~kept).sum()):,} samples")


if __name__ == "__main__":
    main()
