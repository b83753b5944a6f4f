"""Packing for staged (vision-tower) models: rows under two caps, batches balanced across ranks.

A 1D packed plan (:mod:`tokenbucket.plan.packing`) bounds a row's LLM tokens only, which a VLM
cannot use: two rows of the same tokens differ several-fold in memory when one is all image
tokens, whose tower patches cost on top of the backbone. :func:`plan_packing_2d` bounds both
(NOTE [ Two-cap packed rows ]) and chooses the caps from the staged cost model (NOTE [ A packed
row's price ]); :func:`balance_steps` hands each step's batches to the data-parallel ranks so
their predicted step times match (NOTE [ Balanced ranks ]).

NOTE [ Two-cap packed rows ]
A row holds whole samples with at most ``row_tokens`` LLM tokens and at most ``row_patches``
tower patches (and so at most ``row_image_tokens = min(row_tokens, ceil(row_patches x r))`` LLM
image tokens, ``r`` the data's largest image tokens per patch: 1/4 for a 2 x 2 merger); a batch
is ``rows_per_batch`` rows, priced at the caps, so every batch the plan makes fits the budget
whatever its rows hold. :func:`pack_rows_2d` packs first-fit decreasing under both caps: samples
are taken a pool at a time in a seeded order, sorted by their larger share of a cap
(``max(L / row_tokens, P / row_patches)``, ties by the sum of both shares, then by position),
and each goes to the first row, in opening order, with room for both its counts, else opens a
row. A sample is never split. :func:`plan_packing_2d` searches (rows per batch, patch cap) pairs
- for each, the longest row that fits - packs each and keeps the triple with the least
predicted epoch: every batch's seconds from its samples' own FLOPs plus its padding (NOTE [ A
packed row's price ]), ranks balanced. The caps never fall below the longest and the most
patches of a sample that fits alone, so no sample is turned away by the choice of caps: only one
that fits not even as a row of its own is rejected, with its reason.

NOTE [ Balanced ranks ]
``W`` ranks run a step's ``W`` batches in lockstep, so a step lasts as long as its slowest batch.
:func:`balance_steps` sorts the batches by predicted seconds and cuts the sorted list ``W`` at a
time: each step's batches are neighbours in time, the steps are then shuffled by ``(seed,
epoch)`` and so is each step's order of ranks. Over the epoch, the sum of each step's slowest
less its mean is at most the sum of each step's slowest less its fastest, which telescopes over
the disjoint sorted groups to at most ``t_max - t_min`` (plus the padded last step's slowest,
when the batch count is not a multiple of ``W``: an empty batch fills each missing slot, as
the packed sampler gives every rank the same count). So the imbalance, ``sum(step max) /
sum(step mean) - 1``, is at most ``W (t_max - t_min) / sum(t)`` with full steps: it shrinks as
the epoch grows. Sorting groups similar batches into one step; the shuffled step order keeps an
epoch's order random.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from tokenbucket._exceptions import ConfigError, OversizeError
from tokenbucket._search import grow_then_bisect, largest_fitting
from tokenbucket.cost.staged_packed import SampleLoads
from tokenbucket.plan._search import MemoryTotal
from tokenbucket.plan.bucket_plan import Bucket, BucketPlan

__all__ = [
    "PackedPlan2D",
    "SupportsPackedCost",
    "SupportsStepSeconds",
    "balance_steps",
    "pack_rows_2d",
    "plan_packing_2d",
    "rank_imbalance",
]

EMPTY = -1  # an empty batch in a step (NOTE [ Balanced ranks ])


class SupportsStepSeconds(Protocol):
    """What pricing a batch of packed rows asks: a step's seconds from its FLOPs and carried
    tokens, and a padding token's FLOPs (``StagedPackedModel`` and ``PackedStepCost`` answer it)."""

    @property
    def pad_flops_per_token(self) -> float: ...

    def step_seconds(self, flops: float, tokens: int) -> float: ...


class SupportsPackedCost(SupportsStepSeconds, Protocol):
    """What the packing planner asks: a batch of packed rows' peak as well (``StagedPackedModel``
    answers it)."""

    def memory(self, rows: int, row_tokens: int, patches: int, image_tokens: int) -> MemoryTotal: ...


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name} should be an integer of at least {minimum}, but got {name}={value!r}")
    return int(value)


def _ffd_order(lengths: np.ndarray, patches: np.ndarray, row_tokens: int, row_patches: int) -> np.ndarray:
    """Positions into ``lengths`` in first-fit-decreasing order (NOTE [ Two-cap packed rows ])."""
    a, b = lengths / row_tokens, patches / max(row_patches, 1)
    return np.lexsort((np.arange(len(lengths)), -(a + b), -np.maximum(a, b)))


def pack_rows_2d(
    lengths: np.ndarray,
    patches: np.ndarray,
    row_tokens: int,
    row_patches: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    pool: int = 8192,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Sample indices packed into rows of at most ``row_tokens`` LLM tokens and ``row_patches``
    tower patches, first-fit decreasing a pool at a time (NOTE [ Two-cap packed rows ]).

    Example:
        >>> rows = pack_rows_2d(np.array([6, 5, 4, 3, 2]), np.array([0, 8, 0, 8, 0]), 8, 8, shuffle=False)
        >>> [r.tolist() for r in rows]
        [[1, 4], [3, 2], [0]]
    """
    ln, pa = np.asarray(lengths, dtype=np.int64), np.asarray(patches, dtype=np.int64)
    _positive_int("row_tokens", row_tokens)
    _positive_int("row_patches", row_patches, 0)
    _positive_int("pool", pool)
    over = np.flatnonzero((ln > row_tokens) | (pa > row_patches))
    if len(over):
        i = int(over[0])
        raise ConfigError(
            f"sample {i} ({int(ln[i]):,} tokens, {int(pa[i]):,} patches) is over the row caps "
            f"row_tokens={row_tokens:,}, row_patches={row_patches:,} ({len(over):,} such samples): samples are "
            f"never split; reject them when planning"
        )
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(ln)) if shuffle else np.arange(len(ln))
    rows: list[np.ndarray] = []
    for start in range(0, len(order), pool):
        chunk = order[start : start + pool]
        chunk = chunk[_ffd_order(ln[chunk], pa[chunk], row_tokens, row_patches)]
        room_t = np.empty(len(chunk), dtype=np.int64)
        room_p = np.empty(len(chunk), dtype=np.int64)
        members: list[list[int]] = []
        for i, n, p in zip(chunk.tolist(), ln[chunk].tolist(), pa[chunk].tolist(), strict=True):
            k = len(members)
            fit = (room_t[:k] >= n) & (room_p[:k] >= p)
            r = int(np.argmax(fit)) if k else 0
            if k and fit[r]:
                members[r].append(i)
                room_t[r] -= n
                room_p[r] -= p
            else:
                members.append([i])
                room_t[k], room_p[k] = row_tokens - n, row_patches - p
        rows += [np.asarray(m, dtype=np.int64) for m in members]
    if shuffle:
        rows = [rows[r] for r in rng.permutation(len(rows))]
    return rows


def balance_steps(
    seconds: np.ndarray, world_size: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = True
) -> list[list[int]]:
    """Batches (positions into ``seconds``) grouped ``world_size`` a step, rank ``r`` taking
    ``step[r]``, so each step's predicted seconds match (NOTE [ Balanced ranks ]); a missing
    slot of the last step is :data:`EMPTY`.

    Example:
        >>> balance_steps(np.array([1.0, 5.0, 1.1, 4.8]), 2, shuffle=False)
        [[1, 3], [2, 0]]
    """
    w = _positive_int("world_size", world_size)
    t = np.asarray(seconds, dtype=np.float64)
    order = np.argsort(-t, kind="stable").tolist()
    order += [EMPTY] * (-len(order) % w)
    steps = [order[i : i + w] for i in range(0, len(order), w)]
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        steps = [[s[r] for r in rng.permutation(w).tolist()] for s in (steps[k] for k in rng.permutation(len(steps)))]
    return steps


def rank_imbalance(steps: list[list[int]], seconds: np.ndarray, empty_seconds: float = 0.0) -> tuple[float, float]:
    """``(epoch seconds, imbalance)`` of ranks running ``steps`` in lockstep: the sum over steps
    of the slowest rank's seconds, and that over the sum of the ranks' mean, less 1 (an
    :data:`EMPTY` slot takes ``empty_seconds``)."""
    t = np.append(np.asarray(seconds, dtype=np.float64), empty_seconds)  # index -1: an empty batch
    if not steps:
        return 0.0, 0.0
    grid = t[np.asarray(steps, dtype=np.int64)]
    slowest, mean = float(grid.max(axis=1).sum()), float(grid.mean(axis=1).sum())
    return slowest, (slowest / mean - 1 if mean > 0 else 0.0)


@dataclass(frozen=True)
class PackedPlan2D:
    """A two-cap packed plan (NOTE [ Two-cap packed rows ]) for one epoch.

    ``batches[b]`` lists its rows, each an array of sample indices; ``seconds[b]`` is its
    predicted step time; ``steps`` give each rank's batch per step (NOTE [ Balanced ranks ]);
    ``rejected`` maps a sample that fits not even alone to why.
    """

    row_tokens: int
    row_patches: int
    row_image_tokens: int
    rows_per_batch: int
    world_size: int
    budget_bytes: int
    predicted_peak_bytes: int
    batches: list[list[np.ndarray]]
    seconds: np.ndarray
    empty_seconds: float
    steps: list[list[int]]
    rejected: dict[int, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def bucket_plan(self, loads: SampleLoads) -> BucketPlan:
        """The plan as the one-bucket ``packed`` :class:`~tokenbucket.plan.bucket_plan.BucketPlan` a
        ``TokenBucketDataset`` holds (bound ``row_tokens``, batch size ``rows_per_batch``; the
        patch cap in ``meta["row_patches"]``, which sends it to the two-cap sampler,
        ``PackedBatchSampler2D``; ``loads``: the plan's)."""
        members = np.concatenate([r for b in self.batches for r in b]) if self.batches else np.zeros(0, np.int64)
        tokens = int(loads.llm_tokens[members].sum())
        padded = len(self.batches) * self.rows_per_batch * self.row_tokens
        bucket = Bucket(
            bound=self.row_tokens, batch_size=self.rows_per_batch, samples=len(members), batches=len(self.batches),
            tokens=tokens, padded_tokens=padded, predicted_peak_bytes=self.predicted_peak_bytes,
            fill=self.predicted_peak_bytes / self.budget_bytes, padding_efficiency=tokens / padded if padded else 1.0,
            step_seconds=float(self.seconds.mean()) if len(self.seconds) else 0.0,
        )  # fmt: skip
        meta = {**self.meta, "row_patches": self.row_patches, "row_image_tokens": self.row_image_tokens}
        return BucketPlan("packed", self.budget_bytes, (bucket,), {"count": len(self.rejected)}, meta)

    def summary(self, loads: SampleLoads) -> dict[str, float]:
        """Batches, steps, the predicted epoch on ``world_size`` ranks (slowest rank per step),
        rank imbalance, and token efficiency (real over carried: LLM rows are carried padded to
        ``row_tokens``, the tower's patch stream as it is)."""
        epoch, imbalance = rank_imbalance(self.steps, self.seconds, self.empty_seconds)
        carried = len(self.steps) * self.world_size * self.rows_per_batch * self.row_tokens
        members = np.concatenate([r for b in self.batches for r in b]) if self.batches else np.zeros(0, np.int64)
        patches = int(loads.patches[members].sum())
        return {
            "batches": len(self.batches), "steps": len(self.steps), "samples": len(members),
            "rejected": len(self.rejected), "predicted_epoch_seconds": epoch, "rank_imbalance": imbalance,
            "serial_seconds": float(self.seconds.sum()), "llm_efficiency": float(loads.llm_tokens[members].sum()) / carried,
            "vision_efficiency": 1.0, "vision_cap_fill": patches / max(1, len(self.batches) * self.rows_per_batch * self.row_patches),
        }  # fmt: skip


def batch_seconds(
    batches: list[list[np.ndarray]], loads: SampleLoads, cost: SupportsStepSeconds, rows: int, row_tokens: int
) -> np.ndarray:
    """Each batch's predicted seconds: its samples' own FLOPs plus its padding's, over ``rows x
    row_tokens`` carried tokens (NOTE [ A packed row's price ])."""
    carried = rows * row_tokens
    out = np.zeros(len(batches))
    for k, batch in enumerate(batches):
        members = np.concatenate(batch)
        flops = (
            float(loads.flops[members].sum())
            + (carried - int(loads.llm_tokens[members].sum())) * cost.pad_flops_per_token
        )
        out[k] = cost.step_seconds(flops, carried)
    return out


def _fits_alone(loads: SampleLoads, cost: SupportsPackedCost, budget: int) -> np.ndarray:
    """Whether each sample fits as a row of its own: per distinct (patches, image tokens), the
    longest row that fits."""
    ok = np.ones(len(loads), dtype=bool)
    keys = np.stack([loads.patches, loads.image_tokens], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    for g, (p, v) in enumerate(uniq.tolist()):
        mine = inverse.reshape(-1) == g
        top = int(loads.llm_tokens[mine].max())

        def fits(n: int, p: int = p, v: int = v) -> bool:
            return bool(cost.memory(1, max(n, v, 1), p, v).total <= budget)

        longest = top if fits(top) else largest_fitting(fits, 0, top)
        ok[mine] = loads.llm_tokens[mine] <= longest
    return ok


def _row_fits(cost: SupportsPackedCost, rows: int, tokens: int, patches: int, ratio: float, budget: int) -> bool:
    """Whether ``rows`` rows at the caps ``tokens`` and ``patches`` fit (NOTE [ Two-cap packed rows ])."""
    image = min(tokens, int(np.ceil(patches * ratio)))
    return bool(cost.memory(rows, tokens, rows * patches, rows * image).total <= budget)


def plan_packing_2d(
    loads: SampleLoads,
    cost_model: SupportsPackedCost,
    budget_bytes: int,
    *,
    world_size: int = 1,
    rows_per_batch: tuple[int, ...] = (1, 2, 4),
    candidates: int = 6,
    multiple: int = 64,
    on_oversize: Literal["error", "reject"] = "error",
    seed: int = 0,
    epoch: int = 0,
    pool: int = 8192,
    meta: dict[str, Any] | None = None,
) -> PackedPlan2D:
    """Choose (rows per batch, LLM tokens per row, patches per row) with the least predicted
    epoch on ``world_size`` ranks, and pack (NOTE [ Two-cap packed rows ], NOTE [ Balanced ranks ]).

    Args:
        loads: each sample's loads (``StagedPackedModel.loads``).
        cost_model: a :class:`SupportsPackedCost` (a ``StagedPackedModel``).
        budget_bytes: the memory every batch must fit.
        world_size: data-parallel ranks the steps are balanced over.
        rows_per_batch: the rows-per-batch options searched.
        candidates: patch caps tried per option, from the most patches of a sample up to the
            most that leaves a row for the longest sample.
        multiple: row token caps are rounded down to a multiple of this (never below the
            longest sample).
        on_oversize: ``error`` or ``reject`` (with a reason) for samples that fit not even alone.
        seed, epoch: the packing's and the step order's seeds.
        pool: samples packed together (NOTE [ Two-cap packed rows ]).
        meta: recorded in the plan.

    Raises:
        OversizeError: with ``on_oversize="error"``, when a sample fits not even alone.
        ConfigError: bad arguments, or no row shape holds both the longest sample and the one
            with the most patches.
    """
    budget = _positive_int("budget_bytes", budget_bytes)
    w = _positive_int("world_size", world_size)
    _positive_int("candidates", candidates)
    _positive_int("multiple", multiple)
    if not rows_per_batch or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in rows_per_batch):
        raise ConfigError(f"rows_per_batch should be positive integers, but got rows_per_batch={rows_per_batch!r}")
    if on_oversize not in ("error", "reject"):
        raise ConfigError(f"on_oversize should be 'error' or 'reject', but got on_oversize={on_oversize!r}")
    if not len(loads):
        raise ConfigError("there are no samples to plan")
    ok = _fits_alone(loads, cost_model, budget)
    rejected: dict[int, str] = {}
    for i in np.flatnonzero(~ok).tolist():
        n, p, v = int(loads.llm_tokens[i]), int(loads.patches[i]), int(loads.image_tokens[i])
        need = int(cost_model.memory(1, n, p, v).total)
        rejected[i] = (
            f"fits not even alone: {n:,} LLM tokens and {p:,} patches need {need / 2**30:.2f} GiB as a row of its "
            f"own against a budget of {budget / 2**30:.2f} GiB"
        )
    if rejected and on_oversize == "error":
        first = next(iter(rejected))
        raise OversizeError(
            f"{len(rejected):,} sample(s) do not fit the budget even alone; sample {first} {rejected[first]}. "
            f"Fewer frames or cameras, a lower resolution, checkpointing or a bigger GPU would make them fit; or "
            f"pass {OversizeError.REJECT} to plan without them"
        )
    kept = np.flatnonzero(ok)
    sub = loads.take(kept)
    longest, most = int(sub.llm_tokens.max()), int(sub.patches.max())
    with_images = sub.patches > 0
    ratio = float((sub.image_tokens[with_images] / sub.patches[with_images]).max()) if with_images.any() else 0.0
    best: tuple[float, int, int, int, list[np.ndarray]] | None = None
    tried = 0
    for r in sorted(set(rows_per_batch)):

        def holds_longest(p: int, r: int = r) -> bool:
            return _row_fits(cost_model, r, longest, p, ratio, budget)

        if not holds_longest(most):
            continue  # no row of r at these patches holds the longest sample
        top = grow_then_bisect(holds_longest, max(most, 1), what="the patch cap search") if most else 0
        grid = np.unique(np.geomspace(max(most, 1), max(top, 1), candidates).astype(np.int64)) if most else [0]
        for p in np.asarray(grid).tolist():

            def holds(n: int, r: int = r, p: int = p) -> bool:
                return _row_fits(cost_model, r, n, p, ratio, budget)

            t = max(longest, grow_then_bisect(holds, longest, what="the row token search") // multiple * multiple)
            rows = pack_rows_2d(sub.llm_tokens, sub.patches, t, p, seed=seed, epoch=epoch, pool=pool)
            batches = [rows[k : k + r] for k in range(0, len(rows), r)]
            secs = batch_seconds(batches, sub, cost_model, r, t)
            empty = cost_model.step_seconds(r * t * cost_model.pad_flops_per_token, r * t)
            epoch_s, _ = rank_imbalance(balance_steps(secs, w, shuffle=False), secs, empty)
            tried += 1
            if best is None or epoch_s < best[0]:
                best = (epoch_s, r, t, p, rows)
    if best is None:
        raise ConfigError(
            f"no row shape holds both the longest sample ({longest:,} tokens) and the most patches of one "
            f"({most:,}) within the budget: plan 2D buckets (plan_buckets_2d) or reject the extremes first"
        )
    _, r, t, p, rows = best
    image = min(t, int(np.ceil(p * ratio)))
    batches = [[kept[row] for row in rows[k : k + r]] for k in range(0, len(rows), r)]
    secs = batch_seconds(batches, loads, cost_model, r, t)
    return PackedPlan2D(
        row_tokens=t, row_patches=p, row_image_tokens=image, rows_per_batch=r, world_size=w, budget_bytes=budget,
        predicted_peak_bytes=int(cost_model.memory(r, t, r * p, r * image).total), batches=batches, seconds=secs,
        empty_seconds=cost_model.step_seconds(r * t * cost_model.pad_flops_per_token, r * t),
        steps=balance_steps(secs, w, seed=seed, epoch=epoch), rejected=rejected,
        meta={**dict(meta or {}), "candidates_tried": tried, "pack_pool": pool, "pack_seed": seed},
    )  # fmt: skip
