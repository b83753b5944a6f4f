"""OOM risk caught during batching, before a batch reaches the GPU.

NOTE [ Risk before the GPU ]
A batch's *risk* is its predicted peak over the plan's budget. A plan's static batches are
proven to fit (risk <= fill <= 1), so a risky batch means something moved under the plan: a
smaller GPU, a recalibrated cost model (``MeasuredCostModel``, the monitor's drift factor), or a
threshold the user set below the plan's fill. :class:`~tokenbucket.train.collate.BucketCollate` checks
every batch it builds against ``risk_threshold`` and applies ``on_risk``:

* ``"warn"`` (default): an :class:`OOMRiskWarning` naming the bucket, the shape, the keys and
  the tokens by modality and camera; the batch goes on (the monitor logs it as a ``risk`` event).
* ``"raise"``: an :class:`OOMRiskError` with the same report, in the DataLoader's process.
* ``"split"``: the batch is cut in two on the sampler side (:class:`RiskSplitSampler`), again
  until each part is under the threshold or holds one sample. In static mode the split depends
  only on the bucket, so every batch of a bucket is cut into the same number of parts (short
  ones filled with empty rows) and ranks that step through the same bucket stay in step.

A 2D plan's bucket (NOTE [ Two-dimensional buckets ]) is priced at its image-token bound too,
``memory(rows, bound, vision_bound)``: priced by length alone, a staged model takes every token
for an image token, and a text-only bucket would be flagged for memory it never uses. So a 2D
plan needs a cost model whose ``memory`` takes ``vision=`` (:func:`prices_vision`).

NOTE [ A cost model beside its manifest ]
Every figure above is the cost model's for the manifest's shapes, and those shapes were sized
for the model the manifest was planned for. A collate given a cost model of another model (48
layers where the plan had 24) would report every batch's peak and risk by that other model,
silently: a batch that can OOM not flagged, or a safe one split. So wherever a collate takes a
``cost_model`` beside a dataset built from a manifest (``BucketCollate``, ``ModalityCollate``,
``PackedCollate``), :func:`check_planned_model` compares the model it prices (``cost_model.model``,
what a manifest records: :func:`~tokenbucket.plan._manifest_io.model_of`) with the manifest's
record, field by field as :meth:`~tokenbucket.plan.manifest.Manifest.check_made_for` does (the
``name`` aside), and refuses a difference in one line naming each differing field and the fix.
A cost model that names no model (a ``StagedLengthModel``), a manifest that recorded none, or a
dataset given a plan rather than a manifest has nothing to compare and is taken as it is.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeGuard

import numpy as np
from torch.utils.data import Sampler

from tokenbucket._exceptions import ConfigError, OOMRiskError, OOMRiskWarning, StateError
from tokenbucket.plan._manifest_io import model_of
from tokenbucket.plan._search import MemoryTotal, PredictsMemory
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.train.batch import BatchInfo, BucketedData
from tokenbucket.train.sampler import BucketBatchSampler, state_count

__all__ = [
    "RISK_POLICIES",
    "OOMRiskError",
    "OOMRiskWarning",
    "PredictsMemory2D",
    "RiskSplitSampler",
    "bucket_peak",
    "check_planned_model",
    "check_risk_options",
    "check_vision_cost",
    "prices_vision",
    "static_split",
]

RISK_POLICIES = ("warn", "raise", "split")


class PredictsMemory2D(Protocol):
    """What the risk checks ask a 2D plan's cost model: the peak of a padded length whose samples
    hold at most ``vision`` image tokens (``StagedLengthModel`` answers it)."""

    def memory(self, batch: int, length: int, vision: int | None = None) -> MemoryTotal: ...


def prices_vision(cost: object, methods: tuple[str, ...] = ("memory",)) -> TypeGuard[PredictsMemory2D]:
    """Whether each of ``cost``'s ``methods`` takes ``vision=`` (the image tokens of a 2D bucket)."""
    for name in methods:
        method = getattr(cost, name, None)
        if not callable(method):
            return False
        try:
            if "vision" not in inspect.signature(method).parameters:
                return False
        except (TypeError, ValueError):  # a builtin without a signature
            return False
    return True


def check_vision_cost(plan: BucketPlan, cost_model: object, methods: tuple[str, ...] = ("memory",)) -> None:
    """A 2D plan's cost model must price image tokens in each of ``methods`` (NOTE [ Risk before
    the GPU ]); else a ConfigError. The monitor asks ``memory`` and ``max_batch``."""
    if plan.two_d and cost_model is not None and not prices_vision(cost_model, methods):
        asks = " and ".join(methods)
        raise ConfigError(
            f"a 2D plan's buckets bound each sample's image tokens too (NOTE [ Two-dimensional buckets ]): "
            f"cost_model should price them ({asks} taking vision=, a StagedLengthModel), but got "
            f"{type(cost_model).__name__}; pass that model, or cost_model=None to use the plan's peaks"
        )


def check_planned_model(data: BucketedData, cost_model: object) -> None:
    """``cost_model`` should price the model ``data``'s manifest was planned for (NOTE [ A cost
    model beside its manifest ]); else a ConfigError naming each differing field and the fix."""
    manifest = data.manifest
    model = model_of(cost_model) if cost_model is not None else None
    if manifest is None or model is None:
        return
    found = manifest.differences(model=model)
    if not found:
        return
    shown = "; ".join(found[:4]) + (f"; and {len(found) - 4} more" if len(found) > 4 else "")
    raise ConfigError(
        f"cost_model prices another model than manifest {str(manifest.path)!r} was planned for ({shown}), so its "
        f"peaks and risks would be wrong: plan again with this model, or pass the cost model it was planned with "
        f"(or cost_model=None to use the plan's own peaks)"
    )


def bucket_peak(
    plan: BucketPlan,
    cost_model: PredictsMemory | PredictsMemory2D,
    bucket: int,
    rows: int,
    length: int,
    vision: int | None = None,
) -> int:
    """The predicted peak of ``rows`` x ``length`` in ``bucket``: at ``vision`` image tokens (default:
    its image-token bound) in a 2D plan (NOTE [ Risk before the GPU ]), by length alone in a 1D one."""
    vision = plan.buckets[bucket].vision_bound if vision is None else vision
    if vision is None:
        return int(cost_model.memory(rows, length).total)
    if prices_vision(cost_model):
        return int(cost_model.memory(rows, length, min(vision, length)).total)
    check_vision_cost(plan, cost_model)
    raise AssertionError("a 2D bucket's cost model passed the vision check")


def check_risk_options(risk_threshold: float, on_risk: str) -> None:
    if isinstance(risk_threshold, bool) or not isinstance(risk_threshold, (int, float)) or not risk_threshold > 0:
        raise ConfigError(
            f"risk_threshold should be a positive number (predicted peak / budget), "
            f"but got risk_threshold={risk_threshold!r}"
        )
    if on_risk not in RISK_POLICIES:
        raise ConfigError(f"on_risk should be one of {RISK_POLICIES}, but got on_risk={on_risk!r}")


def static_split(
    plan: BucketPlan, cost_model: PredictsMemory | PredictsMemory2D, bucket: int, risk_threshold: float
) -> tuple[int, int]:
    """``(parts, rows)``: a static batch of ``bucket`` halved until ``rows`` rows are under the
    threshold (or one); ``parts`` is how many such parts the full batch takes. A 2D bucket's
    parts are priced at its image-token bound (NOTE [ Risk before the GPU ]).

    Example:
        >>> from tokenbucket import CostModel, ModelSpec
        >>> from tokenbucket.plan.buckets import plan_buckets
        >>> cost = CostModel(ModelSpec(hidden=64, layers=2, heads=4))
        >>> plan = plan_buckets([500] * 64, cost, 2**26, max_buckets=1)
        >>> plan.buckets[0].batch_size, static_split(plan, cost, 0, 1.0), static_split(plan, cost, 0, 0.3)
        (27, (1, 27), (4, 7))
    """
    b = plan.buckets[bucket]
    limit = risk_threshold * plan.budget_bytes
    parts = 1
    while True:
        rows = -(-b.batch_size // parts)
        if rows == 1 or bucket_peak(plan, cost_model, bucket, rows, b.bound) <= limit:
            return -(-b.batch_size // rows), rows
        parts *= 2


def _halves(
    batch: list[int], lengths: np.ndarray, cost_model: PredictsMemory | PredictsMemory2D, limit: float
) -> list[list[int]]:
    # dynamic batches come from length-sorted pools: contiguous halves keep their lengths alike
    longest = int(lengths[batch].max())
    if len(batch) == 1 or cost_model.memory(len(batch), longest).total <= limit:
        return [batch]
    mid = (len(batch) + 1) // 2
    return _halves(batch[:mid], lengths, cost_model, limit) + _halves(batch[mid:], lengths, cost_model, limit)


class RiskSplitSampler(Sampler[list[int]]):
    """Wraps a :class:`~tokenbucket.train.sampler.BucketBatchSampler` and cuts risky batches in two
    (NOTE [ Risk before the GPU ]); pair it with ``BucketCollate(..., on_risk="split")``.

    Args:
        sampler: the batch sampler to wrap.
        data: the :class:`~tokenbucket.train.collate.TokenBucketDataset` (buckets, lengths, plan).
        cost_model: predicts the parts' peaks.
        risk_threshold: the largest predicted peak / budget a part may have.

    State keys: ``sampler`` (the wrapped sampler's state), ``part`` (parts of the current
    batch already yielded), so a resume neither repeats nor skips a part.
    """

    STATE_KEYS = ("sampler", "part")

    def __init__(
        self,
        sampler: BucketBatchSampler,
        data: BucketedData,
        cost_model: PredictsMemory | PredictsMemory2D,
        *,
        risk_threshold: float = 1.0,
    ) -> None:
        check_risk_options(risk_threshold, "split")
        check_vision_cost(data.plan, cost_model)
        self.sampler, self.data, self.cost_model = sampler, data, cost_model
        self.risk_threshold = float(risk_threshold)
        self.plan = data.plan
        if self.plan.mode != "static" and getattr(sampler, "world_size", 1) > 1:
            raise ConfigError(
                "on_risk='split' with a dynamic plan would give ranks different step counts (each batch splits "
                "by its own lengths); use a static plan, or on_risk='warn' under torch.distributed"
            )
        if self.plan.mode == "static" and getattr(sampler, "world_size", 1) > 1 and not sampler.sync_buckets:
            raise ConfigError(
                "on_risk='split' under torch.distributed needs sync_buckets=True, so that every rank "
                "splits the same bucket at the same step"
            )
        self._splits = (
            [static_split(self.plan, cost_model, k, self.risk_threshold) for k in range(len(self.plan.buckets))]
            if self.plan.mode == "static"
            else []
        )
        self._part = 0  # the next part of the current batch (0: between batches)
        self._skip = 0  # parts of the first batch a resumed pass leaves out
        self._loaded: dict[str, Any] | None = None  # a loaded state, until the resumed pass starts

    def _bucket(self, batch: Sequence[int]) -> int:
        n = len(self.data)
        i = int(batch[0])
        return i - n if i >= n else int(self.data.buckets[i])

    def parts(self, batch: list[int]) -> list[list[int]]:
        """The parts of one batch of the wrapped sampler."""
        if self.plan.mode != "static":
            return _halves(batch, self.data.lengths, self.cost_model, self.risk_threshold * self.plan.budget_bytes)
        k = self._bucket(batch)
        count, rows = self._splits[k]
        real = [i for i in batch if i < len(self.data)]
        out = [real[p * rows : (p + 1) * rows] for p in range(count)]
        # a short batch still gives `count` parts (empty rows), so ranks in step stay in step
        return [part or [len(self.data) + k] for part in out]

    def set_epoch(self, epoch: int) -> None:
        if epoch != getattr(self.sampler, "epoch", epoch):  # a new epoch starts at its first part
            self._part = self._skip = 0
            self._loaded = None
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        if self.plan.mode != "static":
            return sum(len(self.parts(b)) for b in self._inner_batches())
        epoch = self.sampler._epoch()
        ids = epoch.steps[:, self.sampler.rank]
        buckets = np.where(ids >= 0, epoch.batch_bucket[np.maximum(ids, 0)], -1 - ids)
        counts = np.array([c for c, _ in self._splits], dtype=np.int64)
        return int(counts[buckets].sum())

    def _inner_batches(self) -> Iterator[list[int]]:
        epoch = self.sampler._epoch()
        for s in range(len(epoch)):
            yield epoch.batch(s, self.sampler.rank)

    def __iter__(self) -> Iterator[list[int]]:
        skip, self._skip = self._skip, 0
        self._loaded = None
        for batch in self.sampler:
            parts = self.parts(batch)
            for p in range(skip, len(parts)):
                self._part = p + 1 if p + 1 < len(parts) else 0
                yield parts[p]
            skip = 0

    def state_dict(self) -> dict[str, Any]:
        if self._loaded is not None:  # loaded, not yet iterated: the position is the loaded one
            return {"sampler": dict(self._loaded["sampler"]), "part": self._loaded["part"]}
        inner = dict(self.sampler.state_dict())
        if self._part:  # inside a batch: the wrapped sampler must give that batch again
            inner["step"] -= 1
        return {"sampler": inner, "part": self._part}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, Mapping) or not isinstance(state.get("sampler"), Mapping):
            raise StateError(
                f"cannot resume: the saved risk-split state should be {{'sampler': {{...}}, 'part': n}}, but got {state!r}"
            )
        state = dict(state)
        part = state_count(state, "part", "risk-split")
        inner = state.pop("sampler")
        del state["part"]
        if state:
            raise StateError(f"unexpected keys in the risk-split sampler state: {sorted(state)}")
        self.sampler.load_state_dict(inner)
        self._skip, self._part = part, 0
        self._loaded = {"sampler": dict(inner), "part": part}


def risk_message(info: BatchInfo, risk_threshold: float) -> str:
    """The report of a risky batch: bucket, shape, predicted peak, keys, tokens by modality and camera."""
    keys = list(info.keys[:8]) + (["..."] if len(info.keys) > 8 else [])
    cams = f", by camera {info.cameras}" if info.cameras else ""
    images = f" (at most {info.vision_bound:,} image tokens a row)" if info.vision_bound is not None else ""
    return (
        f"bucket {info.bucket} batch {info.shape[0]}x{info.shape[1]}{images} is predicted at "
        f"{_mib(info.predicted_peak_bytes)} = {info.risk:.2f} of the budget (threshold "
        f"{risk_threshold:g}); keys {keys}; tokens by modality {info.tokens}{cams}"
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def apply_risk_policy(info: BatchInfo, risk_threshold: float, on_risk: str, *, can_split: bool) -> None:
    """Warn or raise for a batch above the threshold (the collate calls this)."""
    if info.risk <= risk_threshold:
        return
    message = risk_message(info, risk_threshold)
    if on_risk == "raise":
        raise OOMRiskError(message)
    if on_risk == "split" and can_split:
        raise OOMRiskError(f"{message}. on_risk='split' needs the sampler wrapped in RiskSplitSampler")
    warnings.warn(message, OOMRiskWarning, stacklevel=3)
