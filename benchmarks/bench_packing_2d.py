"""Two-cap packing against 2D buckets and the VLM packing peers, on 8 data-parallel ranks.

Command (no GPU; the lhotse row needs ``pip install -e '.[bench]'``):

    .venv/bin/python benchmarks/bench_packing_2d.py [--samples 50000] [--video-samples 3000] [--shapes 8 16 32 64]

Workloads: mixture TV (NOTE [ Mixture TV ], as ``bench_2d.py``) and the video mixture of
``bench_video_plan.py`` (each camera one clip). Model: the ``qwen2-vl-2b`` staged preset, bf16
AdamW, vision and backbone checkpointing, one H100-SXM per rank at its default budget. Every
sample's loads (LLM tokens, tower patches, image tokens, training FLOPs alone) come from
``StagedPackedModel.loads``, each camera fed as a clip, as the breakdown counts it.

Plans, each on 8 ranks:

- ``2D static, K``: :func:`~tokenbucket.plan.buckets_2d.plan_buckets_2d`; ``2D dynamic``:
  :func:`~tokenbucket.plan.buckets_2d.dynamic_batches_2d` (NOTE [ Two-dimensional dynamic
  batches ]). A batch is scored with its real members at its padded shape (NOTE [ Scoring a
  padded batch ]; the planners chose their bounds by ``step_cost_2d``, the bounds' worst sample,
  as ``bench_2d.py`` prices them). Ranks balanced (NOTE [ Balanced ranks ]);
  the "shuffled" column is the imbalance of the sampler's plain split (batches shuffled, rank r
  taking every 8th).
- ``packed``: :func:`~tokenbucket.plan.packing_2d.plan_packing_2d` (NOTE [ Two-cap packed rows ]),
  each batch priced from its members (NOTE [ A packed row's price ]).
- ``OmniBal-style``: written from the paper's rule (Yao et al., ICML 2025): packs under two
  hand-set caps, images (tower passes) per pack and LLM tokens per pack, built by iterative
  sampling and filtering (fill packs from a shuffled pool; keep those within 10 % of either cap,
  return the rest to the pool; five rounds, then keep all); one pack per rank and step, packs
  dealt to ranks in order (their balance comes from the packs being alike).
- ``NeMo-style``: written from NeMo Automodel's VLM neat packing: first-fit decreasing on each
  sample's total tokens (text + visual, from metadata) into packs of a hand-set size, packs
  ordered by visual tokens and dealt to ranks in that order, so neighbouring ranks get similar
  encoder load; one pack per rank and step.
- ``lhotse 2D``: lhotse's ``DynamicBucketingSampler`` over NeMo-style 8 x 8 bins with a fixed
  batch per bin (``bench_2d.lhotse_2d``'s set-up), each rank its own sampler (``world_size=8``,
  its default ``sync_buckets``), each batch padded to its own rows and maxima.

The peers' caps are "set by hand": tried over round numbers (LLM tokens 4,096 ... 32,768;
images 8 ... 128), keeping only caps whose worst pack their rule allows fits the budget (the
most image tokens the data has, at the largest tower pass), and the fastest of those shown:
generous to them. Packed batches are priced the same way as ours (members' FLOPs plus padding).

Columns: steps (of 8 batches), predicted epoch (the sum over steps of the slowest rank's
seconds), vs the 2D static plan at 64 shapes, token efficiency (real over carried: LLM tokens,
and tower patches; a packed mode carries rows padded to their cap and the patch stream as it
is), rank imbalance (sum of step maxima over sum of step means, less 1) and batches over budget
(each priced exactly with its real members: a padded batch as its size in copies of its
heaviest member, a packed batch at its rows and its members' patches and image tokens). The last
row, "floor", is no plan: the lowest epoch any plan could reach on these models (NOTE [ The
packing floor ]).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_2d import lhotse_2d_ranks, samples_of
from bench_video_plan import mixture as video_mixture

from tokenbucket import gpu_budget_bytes
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.plan.buckets_2d import dynamic_batches_2d, plan_buckets_2d
from tokenbucket.plan.packing_2d import EMPTY, balance_steps, batch_seconds, plan_packing_2d, rank_imbalance
from tokenbucket.testing import mixture_tv

W = 8
TOKEN_CAPS = (4096, 8192, 16384, 32768)
IMAGE_CAPS = (8, 16, 32, 64, 128)


class Workload:
    """One workload's samples, loads and the cost models that price them."""

    def __init__(self, name: str, samples: list[Sample], packed: StagedPackedModel, budget: int) -> None:
        self.name, self.samples, self.packed, self.budget = name, samples, packed, budget
        self.two_d = packed.length_model
        self.staged = packed.staged
        self.loads = packed.loads(samples)
        self.lengths, self.vision = self.loads.llm_tokens, self.loads.image_tokens
        with_images = self.loads.patches > 0
        self.patches_per_token = float((self.loads.patches[with_images] / self.vision[with_images]).max())
        self._memo: dict[tuple[int, Sample], int] = {}
        self._llm: dict[tuple[int, int], float] = {}
        # a padding patch costs what a patch of the default image costs in the tower and projector
        h, w = self.two_d.image or (448, 448)
        img = Sample(images=1, height=h, width=w)
        vi = self.staged.vision_inputs(img)
        text = self.two_d.sample_flops(1, Sample(text_tokens=vi.llm_tokens)).training
        self.pad_patch_flops = (self.two_d.sample_flops(1, img).training - text) / (
            vi.patches_per_image * vi.tower_images
        )

    def padded_seconds(self, members: np.ndarray, rows: int, length: int, vision: int) -> float:
        """A padded batch's seconds (NOTE [ Scoring a padded batch ])."""
        if (rows, length) not in self._llm:
            self._llm[rows, length] = float(self.two_d.sample_flops(rows, Sample(text_tokens=length)).training)
        pad = max(0.0, rows * vision * self.patches_per_token - float(self.loads.patches[members].sum()))
        flops = self._llm[rows, length] + float(self.loads.vision_flops[members].sum()) + pad * self.pad_patch_flops
        return self.packed.step_seconds(flops, rows * length)

    def peak(self, batch: int, i: int) -> int:
        """``batch`` copies of sample ``i``, priced exactly."""
        key = (batch, self.samples[i])
        if key not in self._memo:
            self._memo[key] = self.staged.memory(batch, self.samples[i]).peak_bytes
        return self._memo[key]

    def padded_over(self, members: np.ndarray, rows: int) -> bool:
        heavy = members[np.argsort(-(self.loads.patches[members] + self.lengths[members]))[:8]]
        return max(self.peak(rows, int(i)) for i in heavy.tolist()) > self.budget


# NOTE [ Scoring a padded batch ]
# The planners price a 2D bucket at its bounds' worst sample (whole default images up to the
# image-token bound, NOTE [ The worst sample of a length ]): right for memory, but a batch of
# video clips or large images runs longer tower passes than the default image, and its tower
# attention, quadratic per pass, costs more than that price; a batch of small images less. The
# table scores every padded batch with its real members instead: the LLM at its padded shape
# (rows x bound through the backbone, attention over the bound), plus the tower and projector
# FLOPs of each member alone, plus the padding patches (rows x image-token bound, in patches,
# less the real ones) at what a default image's patch costs. On mixture TV this puts 2D static at
# 64 shapes 1.8 % above the bounds' price; under it every batch costs at least its members' own
# FLOPs, which NOTE [ The packing floor ] needs.


def score(
    wl: Workload,
    batches: list[np.ndarray] | list[list[np.ndarray]],
    seconds: np.ndarray,
    steps: list[list[int]],
    carried_llm: float,
    carried_patches: float,
    over: int,
    empty: float = 0.0,
    shuffled: float | None = None,
) -> dict[str, float]:
    epoch, imbalance = rank_imbalance(steps, seconds, empty)
    real = wl.loads.llm_tokens.sum(), wl.loads.patches.sum()
    return {"steps": len(steps), "batches": len(batches), "epoch": epoch, "imbalance": imbalance,
            "llm_eff": float(real[0]) / carried_llm, "vision_eff": float(real[1]) / carried_patches, "over": over,
            "shuffled": shuffled if shuffled is not None else float("nan")}  # fmt: skip


def shuffled_imbalance(seconds: np.ndarray, seed: int = 0) -> float:
    """The plain split: batches shuffled, rank r taking every W-th (empty slots idle)."""
    order = np.random.default_rng(seed).permutation(len(seconds)).tolist()
    order += [EMPTY] * (-len(order) % W)
    return rank_imbalance([order[i : i + W] for i in range(0, len(order), W)], seconds)[1]


def padded_mode(wl: Workload, batches: list[np.ndarray], shapes: list[tuple[int, int, int]]) -> dict[str, float]:
    """Padded batches, each at its ``(rows, length, image tokens)``."""
    secs = np.array([wl.padded_seconds(b, r, n, v) for b, (r, n, v) in zip(batches, shapes, strict=True)])
    over = sum(wl.padded_over(b, r) for b, (r, _, _) in zip(batches, shapes, strict=True))
    carried = sum(r * n for r, n, _ in shapes)
    patches = sum(r * v * wl.patches_per_token for r, _, v in shapes)
    return score(wl, batches, secs, balance_steps(secs, W), carried, patches, over, shuffled=shuffled_imbalance(secs))


def static(wl: Workload, k: int) -> dict[str, float]:
    plan = plan_buckets_2d(wl.lengths, wl.vision, wl.two_d, wl.budget, max_buckets=k, on_oversize="reject")
    where = plan.assign(wl.lengths, wl.vision)
    batches: list[np.ndarray] = []
    shapes: list[tuple[int, int, int]] = []
    for j, b in enumerate(plan.buckets):
        members = np.random.default_rng(j).permutation(np.flatnonzero(where == j))
        for s in range(0, len(members), b.batch_size):
            shapes.append((b.batch_size, b.bound, b.vision_bound or 0))
            batches.append(members[s : s + b.batch_size])
    return padded_mode(wl, batches, shapes)


def dynamic(wl: Workload) -> dict[str, float]:
    batches = dynamic_batches_2d(wl.lengths, wl.vision, wl.two_d, wl.budget)
    return padded_mode(wl, batches, [(len(m), int(wl.lengths[m].max()), int(wl.vision[m].max())) for m in batches])


def packs_mode(
    wl: Workload, packs: list[np.ndarray], tokens: int, steps: list[list[int]] | None = None
) -> dict[str, float]:
    """One pack a batch, rows padded to ``tokens``, priced as ours (NOTE [ A packed row's price ])."""
    batches = [[p] for p in packs]
    secs = batch_seconds(batches, wl.loads, wl.packed, 1, tokens)
    over = sum(
        wl.packed.memory(1, tokens, int(wl.loads.patches[p].sum()), int(wl.vision[p].sum())).total > wl.budget
        for p in packs
    )
    steps = balance_steps(secs, W) if steps is None else steps
    empty = wl.packed.step_seconds(tokens * wl.packed.pad_flops_per_token, tokens)
    carried = len(steps) * W * tokens
    return score(wl, packs, secs, steps, carried, float(wl.loads.patches.sum()), over, empty, shuffled_imbalance(secs))


def packed(wl: Workload) -> tuple[dict[str, float], str]:
    plan = plan_packing_2d(wl.loads, wl.packed, wl.budget, world_size=W, on_oversize="reject")
    s = plan.summary(wl.loads)
    over = sum(
        wl.packed.memory(plan.rows_per_batch, plan.row_tokens, int(wl.loads.patches[np.concatenate(b)].sum()),
                         int(wl.vision[np.concatenate(b)].sum())).total > wl.budget
        for b in plan.batches
    )  # fmt: skip
    row = {"steps": s["steps"], "batches": s["batches"], "epoch": s["predicted_epoch_seconds"],
           "imbalance": s["rank_imbalance"], "llm_eff": s["llm_efficiency"], "vision_eff": 1.0, "over": over,
           "shuffled": shuffled_imbalance(plan.seconds)}  # fmt: skip
    caps = f"{plan.rows_per_batch} x {plan.row_tokens:,} tokens, {plan.row_patches:,} patches a row"
    return row, caps


def omnibal_packs(wl: Workload, q_tokens: int, q_images: int, seed: int = 0) -> list[np.ndarray]:
    """Iterative sampling and filtering under an images cap and a tokens cap (the rule above)."""
    rng = np.random.default_rng(seed)
    images = wl.loads.passes
    pool, kept = np.arange(len(wl.samples)), []
    for round_ in range(6):
        pool = rng.permutation(pool)
        packs, cur, t, m = [], [], 0, 0
        for i, n, k in zip(pool.tolist(), wl.lengths[pool].tolist(), images[pool].tolist(), strict=True):
            if cur and (t + n > q_tokens or m + k > q_images):
                packs.append(cur)
                cur, t, m = [], 0, 0
            cur, t, m = [*cur, i], t + n, m + k
        if cur:
            packs.append(cur)
        good = [
            p
            for p in packs
            if round_ == 5 or wl.lengths[p].sum() >= 0.9 * q_tokens or images[p].sum() >= 0.9 * q_images
        ]
        kept += good
        rest = [i for p in packs if not (round_ == 5 or p in good) for i in p]
        pool = np.asarray(rest, dtype=np.int64)
        if not len(pool):
            break
    return [np.asarray(p, dtype=np.int64) for p in kept]


def nemo_packs(wl: Workload, size: int) -> list[np.ndarray]:
    """First-fit decreasing on total tokens into packs of ``size`` (the rule above)."""
    order = np.argsort(-wl.lengths, kind="stable")
    room = np.empty(len(order), dtype=np.int64)
    packs: list[list[int]] = []
    for i, n in zip(order.tolist(), wl.lengths[order].tolist(), strict=True):
        fit = room[: len(packs)] >= n
        r = int(np.argmax(fit)) if len(packs) else 0
        if len(packs) and fit[r]:
            packs[r].append(i)
            room[r] -= n
        else:
            room[len(packs)] = size - n
            packs.append([i])
    return [np.asarray(p, dtype=np.int64) for p in packs]


def hand_caps(wl: Workload) -> tuple[list[tuple[int, int]], list[int]]:
    """The peers' round-number caps whose worst allowed pack fits (OmniBal: tokens, images; NeMo: tokens)."""
    longest = int(wl.lengths.max())
    per_pass = wl.loads.patches[wl.loads.passes > 0] // wl.loads.passes[wl.loads.passes > 0]
    big = int(per_pass.max())
    share = float((wl.vision / wl.lengths).max())
    omni, nemo = [], []
    for t in (t for t in TOKEN_CAPS if t >= longest):
        v = int(share * t)
        if wl.packed.memory(1, t, int(v * wl.patches_per_token), v).total <= wl.budget:
            nemo.append(t)
        for q in IMAGE_CAPS:
            image = min(t, int(q * big / wl.patches_per_token))
            if wl.packed.memory(1, t, q * big, image).total <= wl.budget:
                omni.append((t, q))
    return omni, nemo


def peers(wl: Workload) -> list[tuple[str, dict[str, float]]]:
    rows = []
    omni, nemo = hand_caps(wl)
    if omni:
        best = min(((packs_mode(wl, omnibal_packs(wl, t, q), t), (t, q)) for t, q in omni), key=lambda r: r[0]["epoch"])
        rows.append((f"OmniBal-style, {best[1][0]:,} tokens, {best[1][1]} images a pack", best[0]))
    if nemo:
        tried = []
        for t in nemo:
            packs = nemo_packs(wl, t)
            order = np.argsort([int(wl.vision[p].sum()) for p in packs], kind="stable").tolist()
            order += [EMPTY] * (-len(order) % W)
            steps = [order[i : i + W] for i in range(0, len(order), W)]
            tried.append((packs_mode(wl, packs, t, steps), t))
        best_n = min(tried, key=lambda r: r[0]["epoch"])
        rows.append((f"NeMo-style, {best_n[1]:,} tokens a pack", best_n[0]))
    if importlib.util.find_spec("lhotse") is not None:
        batches = lhotse_2d_ranks(wl.lengths, wl.vision, wl.two_d, wl.budget, 8, 8, W)
        flat = [b for step in batches for b in step if b is not None]
        secs = np.array([wl.padded_seconds(b, len(b), int(wl.lengths[b].max()), int(wl.vision[b].max())) for b in flat])
        steps, k = [], 0
        for step in batches:
            ids = []
            for b in step:
                ids.append(EMPTY if b is None else k)
                k += b is not None
            steps.append(ids)
        over = sum(wl.padded_over(b, len(b)) for b in flat)
        carried = sum(len(b) * int(wl.lengths[b].max()) for b in flat)
        patches = sum(len(b) * int(wl.vision[b].max()) * wl.patches_per_token for b in flat)
        rows.append(("lhotse 2D bins 8 x 8, padded per batch", score(wl, flat, secs, steps, carried, patches, over)))
    return rows


def bound(wl: Workload) -> float:
    """A floor under every plan's predicted epoch on these models (NOTE [ The packing floor ])."""
    cost = wl.packed.step_cost()
    if cost.step_time is None:
        return float(wl.loads.flops.sum()) / 1e15 / W
    return float(wl.loads.flops.sum()) / (cost.step_time.peak_flops * cost.step_time.mfu) / W


# NOTE [ The packing floor ]
# Under the models every row of the table is scored by, a batch's seconds are a fixed cost plus
# its training FLOPs over peak x u(T) with u <= mfu, and a batch's FLOPs are at least the sum of
# its members' own FLOPs alone (padding only adds: padded attention covers each member's own
# square, packed rows add the padding's dense FLOPs). A step lasts at least its ranks' mean. So
# no plan's 8-rank epoch can fall below sum(each sample's FLOPs alone) / (W x peak x mfu): no
# padding, no fixed cost, full utilisation, perfect balance. The "floor" row is that figure; the
# "vs 2D static 64" column then says how far below the static plan any packing could go.


def table(wl: Workload, shapes: list[int]) -> None:
    n = len(wl.samples)
    print(f"\n{wl.name}: {n:,} samples, {int(wl.lengths.sum()):,} LLM tokens, {int(wl.loads.patches.sum()):,} tower "
          f"patches; 8 ranks, H100-SXM budget {wl.budget / 2**30:.1f} GiB\n")  # fmt: skip
    print(
        "| plan | steps | predicted epoch h | vs 2D static 64 | LLM eff. | vision eff. | rank imbalance | shuffled | over budget | plan s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows: list[tuple[str, dict[str, float], float]] = []
    for k in shapes:
        t0 = time.perf_counter()
        rows.append((f"2D static, {k} shapes", static(wl, k), time.perf_counter() - t0))
    t0 = time.perf_counter()
    rows.append(("2D dynamic", dynamic(wl), time.perf_counter() - t0))
    t0 = time.perf_counter()
    row, caps = packed(wl)
    rows.append((f"packed ({caps})", row, time.perf_counter() - t0))
    for name, r in peers(wl):
        rows.append((name, r, float("nan")))
    ref = next((r["epoch"] for name, r, _ in rows if name == "2D static, 64 shapes"), None)
    for name, r, secs in rows:
        vs = f"{r['epoch'] / ref:.3f}x" if ref else "—"
        shuffled = "—" if r["shuffled"] != r["shuffled"] else f"{r['shuffled']:.2%}"
        print(f"| {name} | {int(r['steps']):,} | {r['epoch'] / 3600:.3f} | {vs} | {r['llm_eff']:.3f} | "
              f"{r['vision_eff']:.3f} | {r['imbalance']:.2%} | {shuffled} | {int(r['over'])} | "
              f"{'—' if secs != secs else f'{secs:.1f}'} |")  # fmt: skip
    floor = bound(wl)
    vs = f"{floor / ref:.3f}x" if ref else "—"
    print(f"| floor: every sample's own FLOPs at full utilisation, no padding, no fixed cost, even ranks | — | "
          f"{floor / 3600:.3f} | {vs} | 1.000 | 1.000 | 0.00% | — | — | — |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--video-samples", type=int, default=3000)
    parser.add_argument("--shapes", type=int, nargs="+", default=[8, 16, 32, 64])
    args = parser.parse_args()
    setup = TrainSetup(vision_checkpointing="full", backbone_checkpointing="full")
    staged = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup, gpu="H100-SXM")
    packed_model = StagedPackedModel(StagedLengthModel(staged))
    budget = gpu_budget_bytes("H100-SXM")

    tv = Workload("mixture TV", samples_of(mixture_tv(args.samples, seed=0)), packed_model, budget)
    table(tv, args.shapes)
    video = Workload("video mixture", samples_of(video_mixture(args.video_samples, 0)), packed_model, budget)
    table(video, args.shapes)


if __name__ == "__main__":
    main()
