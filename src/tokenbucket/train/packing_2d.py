"""Two-cap packed batches for training a staged (vision-tower) model: the plan of
:func:`~tokenbucket.plan.packing_2d.plan_packing_2d` run epoch after epoch.

NOTE [ Two-cap packing each epoch ]
The plan fixes the row shape: ``row_tokens`` LLM tokens and ``row_patches`` tower patches a row,
``rows_per_batch`` rows a batch, every batch within the budget whatever its rows hold (NOTE [ Two-cap
packed rows ]). Which samples share a row is the epoch's: :class:`PackedBatchSampler2D` packs the
plan's samples with :func:`~tokenbucket.plan.packing_2d.pack_rows_2d` seeded by ``(seed, epoch)``,
prices each batch from its members (:func:`~tokenbucket.plan.packing_2d.batch_seconds`, NOTE [ A
packed row's price ]) and hands each step's batches to the ranks with
:func:`~tokenbucket.plan.packing_2d.balance_steps` (NOTE [ Balanced ranks ]) on the sampler's own
world size. With the plan's seed and world size, epoch 0 is the plan's own batches and steps; a
step with fewer batches than ranks gives the missing ranks an empty batch (one empty row), so every
rank takes the same number of steps and every sample is in one batch an epoch. Each batch carries
its rows (NOTE [ Rows through the workers ]), and :class:`~tokenbucket.train.packed_modal.PackedModalityCollate`
lays them out as they are, checking both caps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import numpy as np
from torch.utils.data import Sampler

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.staged_packed import SampleLoads
from tokenbucket.plan.manifest import Manifest
from tokenbucket.plan.packed_manifest import packed_plan_of
from tokenbucket.plan.packing_2d import (
    EMPTY,
    PackedPlan2D,
    SupportsStepSeconds,
    balance_steps,
    batch_seconds,
    pack_rows_2d,
)
from tokenbucket.train.batch import BatchInfo, BucketedData
from tokenbucket.train.sampler import (
    POSITION_KEYS,
    EpochPosition,
    RankAware,
    StepIndices,
    empty_row,
    pass_caller,
    resume_position,
    sampler_state,
)

if TYPE_CHECKING:  # typing_extensions comes with torch; Unpack is in typing from 3.11
    from typing_extensions import Unpack

__all__ = ["PackedBatchSampler2D", "PackedEpoch2D", "PackedOptions2D"]


class PackedOptions2D(TypedDict, total=False):
    """The :class:`PackedBatchSampler2D` arguments :meth:`~PackedBatchSampler2D.from_dataset` passes on."""

    seed: int
    shuffle: bool
    rank: int | None
    world_size: int | None
    pool: int


class PackedEpoch2D(NamedTuple):
    """One epoch for all ranks: ``batches[b]`` lists its rows (arrays of sample indices),
    ``seconds[b]`` its predicted step time, ``steps[s][r]`` rank ``r``'s batch at step ``s``
    (:data:`~tokenbucket.plan.packing_2d.EMPTY`: an empty batch)."""

    batches: list[list[np.ndarray]]
    seconds: np.ndarray
    steps: list[list[int]]


def _plan_id(plan: PackedPlan2D, loads: SampleLoads, members: np.ndarray) -> str:
    """A digest of what fixes the epochs' batches: the caps, the rows a batch, the samples planned and their loads."""
    h = hashlib.sha256(f"{plan.row_tokens},{plan.row_patches},{plan.rows_per_batch}".encode())
    for values in (members, loads.llm_tokens, loads.patches, loads.flops):
        h.update(np.ascontiguousarray(values).tobytes())
    return h.hexdigest()


class PackedBatchSampler2D(EpochPosition, RankAware, Sampler[list[int]]):
    """One rank's two-cap packed batches for ``DataLoader(batch_sampler=...)``, with
    :class:`~tokenbucket.train.packed_modal.PackedModalityCollate` (NOTE [ Two-cap packing each epoch ]).

    Each batch is its rows' sample indices, rows concatenated, and carries how many each row
    holds (NOTE [ Rows through the workers ]); a padding batch is one empty row (index
    ``len(loads)``, see :func:`~tokenbucket.train.sampler.empty_row`).

    Args:
        plan: the :class:`~tokenbucket.plan.packing_2d.PackedPlan2D` (its caps, rows a batch,
            samples kept; its own batches are epoch 0's at its seed and world size).
        loads: the samples' loads the plan was made from (``StagedPackedModel.loads``), one a
            dataset index.
        cost_model: what the plan was priced with (a ``StagedPackedModel``, or the
            ``PackedStepCost`` a manifest stores; :class:`~tokenbucket.plan.packing_2d.SupportsStepSeconds`):
            it prices each epoch's batches for the rank balance.
        seed, pool: the packing's (default: the plan's ``pack_seed`` / ``pack_pool``).
        shuffle: a new packing and step order each epoch (``False``: first-fit decreasing in
            index order, steps by predicted seconds).
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1
            (NOTE [ Rank at iteration ]); the steps are balanced over this world size.

    Raises:
        ConfigError: ``plan`` is not a two-cap packed plan, or ``loads`` are not the ones it
            was made from (one line each).

    State keys: ``epoch``, ``step``, ``plan_id``, ``world_size``, ``seed``, ``mode``.
    """

    STATE_KEYS = (*POSITION_KEYS, "plan_id", "world_size", "seed", "mode")

    def __init__(
        self,
        plan: PackedPlan2D,
        loads: SampleLoads,
        cost_model: SupportsStepSeconds,
        *,
        seed: int | None = None,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        pool: int | None = None,
    ) -> None:
        if not isinstance(plan, PackedPlan2D):
            mode = getattr(plan, "mode", None)
            raise ConfigError(
                f"plan should be a two-cap packed plan (PackedPlan2D, from plan_packing_2d), but got "
                f"{type(plan).__name__}{f' (mode {mode!r})' if mode is not None else ''}: a 1D packed plan goes to "
                f"PackedBatchSampler, a bucket plan to BucketBatchSampler"
            )
        if not isinstance(loads, SampleLoads):
            raise ConfigError(f"loads should be the SampleLoads the plan was made from, but got {type(loads).__name__}")
        self._set_rank_world(rank, world_size)  # NOTE [ Rank at iteration ]
        rows = [row for batch in plan.batches for row in batch]
        members = np.sort(np.concatenate(rows)) if rows else np.zeros(0, np.int64)
        n = len(members) + len(plan.rejected)
        if len(loads) != n or (len(members) and (members[-1] >= n or (np.diff(members) == 0).any())):
            raise ConfigError(
                f"the plan packs {len(members):,} samples and rejected {len(plan.rejected):,}, but loads holds "
                f"{len(loads):,}: pass the loads the plan was made from"
            )
        over = np.flatnonzero(
            (loads.llm_tokens[members] > plan.row_tokens) | (loads.patches[members] > plan.row_patches)
        )
        if len(over):
            i = int(members[over[0]])
            raise ConfigError(
                f"sample {i} ({int(loads.llm_tokens[i]):,} tokens, {int(loads.patches[i]):,} patches) is over the "
                f"plan's caps row_tokens={plan.row_tokens:,}, row_patches={plan.row_patches:,}: these loads are "
                f"not the ones the plan was made from"
            )
        self.loads, self.cost_model, self.members = loads, cost_model, members.astype(np.int64)
        self.row_tokens, self.row_patches = plan.row_tokens, plan.row_patches
        self.rows_per_batch = plan.rows_per_batch
        self.seed = int(plan.meta.get("pack_seed", 0) if seed is None else seed)
        self.pool = int(plan.meta.get("pack_pool", 8192) if pool is None else pool)
        self.shuffle = shuffle
        self.plan_id = _plan_id(plan, loads, self.members)
        self.mode = "packed_2d"
        self._init_position()  # NOTE [ An epoch moves on by itself ]
        self._cache: tuple[tuple[int, int], PackedEpoch2D] | None = None  # (epoch, world size) → the epoch

    @classmethod
    def from_dataset(
        cls,
        data: BucketedData,
        plan: PackedPlan2D,
        loads: SampleLoads,
        cost_model: SupportsStepSeconds,
        **kwargs: Unpack[PackedOptions2D],
    ) -> PackedBatchSampler2D:
        """A sampler over ``data`` (a :class:`~tokenbucket.train.collate.TokenBucketDataset`),
        refused in one line when the dataset is not the one ``loads`` describe: another sample
        count, or a sample whose tokens the dataset's spec counts otherwise than the loads (its
        rows would pass the caps)."""
        sampler = cls(plan, loads, cost_model, **kwargs)
        if len(data) != len(loads):
            raise ConfigError(
                f"the dataset has {len(data):,} samples but the plan was made for {len(loads):,}: plan this dataset"
            )
        mine = np.asarray(data.lengths, dtype=np.int64)[sampler.members]
        bad = np.flatnonzero(mine != loads.llm_tokens[sampler.members])
        if len(bad):
            i = int(sampler.members[bad[0]])
            raise ConfigError(
                f"sample {i} (key {data.key(i)!r}): the dataset counts {int(mine[bad[0]]):,} tokens but the plan's "
                f"loads {int(loads.llm_tokens[i]):,} ({len(bad):,} such samples): its token spec and the cost model "
                f"count the sequence differently (an image's start / end tokens?); count both the same and plan again"
            )
        return sampler

    @classmethod
    def from_manifest(
        cls, manifest: Manifest, *, cost_model: SupportsStepSeconds | None = None, **kwargs: Unpack[PackedOptions2D]
    ) -> PackedBatchSampler2D:
        """A sampler over a two-cap packed :class:`~tokenbucket.plan.manifest.Manifest` (``tokenbucket plan
        --hf-config DIR --mode packed``; rows in dataset order), re-packing each epoch from the loads and
        step cost it stores (NOTE [ A two-cap packed manifest ]); ``cost_model`` replaces the stored step
        cost (a recalibrated model, say). Epoch 0 at the plan's seed and world size is the planner's.

        Raises:
            ConfigError: the manifest holds another plan (one line naming the sampler that reads it).
        """
        packed = packed_plan_of(manifest)
        return cls(packed.plan, packed.loads, packed.step_cost if cost_model is None else cost_model, **kwargs)

    def epoch_batches(self, epoch: int | None = None) -> PackedEpoch2D:
        """All ranks' batches of ``epoch`` (default: the current one), on this sampler's world
        size (NOTE [ Two-cap packing each epoch ]); kept until another is asked for."""
        key = (self.epoch if epoch is None else int(epoch), self.world_size)  # NOTE [ Rank at iteration ]
        if self._cache is None or self._cache[0] != key:
            m, r = self.members, self.rows_per_batch
            rows = pack_rows_2d(
                self.loads.llm_tokens[m],
                self.loads.patches[m],
                self.row_tokens,
                self.row_patches,
                seed=self.seed,
                epoch=key[0],
                pool=self.pool,
                shuffle=self.shuffle,
            )
            batches = [[m[row] for row in rows[k : k + r]] for k in range(0, len(rows), r)]
            seconds = batch_seconds(batches, self.loads, self.cost_model, r, self.row_tokens)
            steps = balance_steps(seconds, key[1], seed=self.seed, epoch=key[0], shuffle=self.shuffle)
            self._cache = (key, PackedEpoch2D(batches, seconds, steps))
        return self._cache[1]

    def _batch(self, epoch: PackedEpoch2D, step: int, rank: int) -> StepIndices:
        """Rank ``rank``'s batch at ``step``, with its rows (NOTE [ Rows through the workers ])."""
        b = epoch.steps[step][rank]
        if b == EMPTY:
            return StepIndices.of([empty_row(len(self.loads), 0)], 0, 0, rows=(1,))
        rows = epoch.batches[b]
        return StepIndices.of(np.concatenate(rows).tolist(), 0, 0, rows=tuple(len(row) for row in rows))

    def _epoch_length(self, epoch: int) -> int:
        return len(self.epoch_batches(epoch).steps)

    def __iter__(self) -> Iterator[list[int]]:
        start = self._begin_pass(pass_caller())  # NOTE [ An epoch moves on by itself ]
        epoch = self.epoch_batches()
        rank = self.rank  # read once, as the epoch starts
        yield from self._pass(lambda s: self._batch(epoch, s, rank), len(epoch.steps), start)

    def state_dict(self, *, after: BatchInfo | None = None) -> dict[str, Any]:
        """Where the sampler stands (``after``: as for :meth:`BucketBatchSampler.state_dict`)."""
        return self._state(self.STATE_KEYS, after)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = sampler_state(self, self.STATE_KEYS, identity_only=True)  # NOTE [ Sampler state keys ]
        self._load_position(*resume_position(state, mine, "two-cap packed sampler"))
