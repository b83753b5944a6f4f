"""A batch's shape, predicted peak and risk, as a collate decides them from its bucket: one home
for what every collate over a :class:`~tokenbucket.train.batch.BucketedData` does before it pads.

Static plans pad to ``(batch_size, bound)`` of the bucket (the rows of a risk-split part with
``on_risk="split"``); dynamic ones to ``(len(batch), longest)``. The peak is the cost model's
for that shape (a 2D static bucket's at its image-token bound too, a 2D dynamic batch's at its own
most image tokens), else the plan's for the bucket; a
batch above ``risk_threshold`` of the budget goes through NOTE [ Risk before the GPU ]
(:mod:`tokenbucket.train.risk`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, TypeAlias

import numpy as np
import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.train.batch import BatchInfo, BucketedData, EmptyRow
from tokenbucket.train.risk import (
    PredictsMemory2D,
    apply_risk_policy,
    bucket_peak,
    check_planned_model,
    check_risk_options,
    check_vision_cost,
    static_split,
)

__all__ = ["BatchShape", "MetaValues", "ShapedData"]

MetaValues: TypeAlias = torch.Tensor | list[object]
"""A metadata column for a batch's rows: a tensor when numeric, a list otherwise."""


class ShapedData(BucketedData, Protocol):
    """A bucketed dataset that also sums tokens per camera (for the report of a risky batch) and
    gives its ``(index, item)`` pairs."""

    def camera_tokens(self, indices: Sequence[int]) -> dict[str, int] | None: ...

    def metadata_columns(self, indices: Sequence[int], rows: int | None = None) -> dict[str, MetaValues]: ...

    def __getitem__(self, index: int, /) -> tuple[int, object]: ...


class BatchShape:
    """The bucket, rows and length of a batch of ``(index, item)`` and its :class:`BatchInfo`.

    Args:
        data: the bucketed dataset.
        cost_model: predicts the peak of a ``(rows, length)`` batch, else the plan's peak is
            used; a 2D plan's prices a bucket at its image-token bound too
            (``memory(rows, length, vision_bound)``, a ``StagedLengthModel``).
        risk_threshold: predicted peak / budget above which ``on_risk`` applies.
        on_risk: ``"warn"``, ``"raise"`` or ``"split"``.

    Raises:
        ConfigError: ``cost_model`` prices another model than ``data``'s manifest was planned
            for (NOTE [ A cost model beside its manifest ]), or a 2D plan's does not price image tokens.
    """

    def __init__(
        self,
        data: ShapedData,
        *,
        cost_model: PredictsMemory | PredictsMemory2D | None = None,
        risk_threshold: float = 1.0,
        on_risk: str = "warn",
    ) -> None:
        check_risk_options(risk_threshold, on_risk)
        check_vision_cost(data.plan, cost_model)
        check_planned_model(data, cost_model)  # NOTE [ A cost model beside its manifest ]
        self.data, self.cost_model = data, cost_model
        self.risk_threshold, self.on_risk = float(risk_threshold), on_risk
        self._split_rows: list[int] | None = None
        if on_risk == "split":
            if cost_model is None:
                raise ConfigError("on_risk='split' needs cost_model= to predict the parts of a batch")
            if data.plan.mode == "static":  # the rows a static part is padded to (NOTE [ Risk before the GPU ])
                self._split_rows = [
                    static_split(data.plan, cost_model, k, self.risk_threshold)[1]
                    for k in range(len(data.plan.buckets))
                ]

    def bucket_of(self, batch: Sequence[tuple[int, object]]) -> int:
        """The batch's bucket: its real rows' (all one in a static plan, whose bucket decides the
        padded shape; a dynamic batch is padded to its own longest, so it takes its first row's),
        else the empty rows' own."""
        real = [i for i, item in batch if not isinstance(item, EmptyRow)]
        if real:
            buckets = self.data.buckets[real]
            if self.data.plan.mode == "static" and (buckets != buckets[0]).any():
                k = int(np.flatnonzero(buckets != buckets[0])[0])
                raise ConfigError(
                    f"a batch mixes buckets: sample {real[0]} is in bucket {int(buckets[0])} but sample {real[k]} "
                    f"in bucket {int(buckets[k])} (batch with the plan's sampler, dataset.sampler())"
                )
            return int(buckets[0])
        first = batch[0][1]
        if not isinstance(first, EmptyRow):
            raise AssertionError("a batch without real rows holds only EmptyRow items")
        return first.bucket

    def rows_and_length(self, bucket: int, n_items: int, longest: int) -> tuple[int, int]:
        """``(rows, length)`` the batch is padded to (``longest``: its longest real sample)."""
        plan = self.data.plan
        if plan.mode == "static":
            rows, length = plan.buckets[bucket].batch_size, plan.buckets[bucket].bound
            if self._split_rows is not None:
                rows = self._split_rows[bucket]
        else:
            rows, length = n_items, max(longest, 1)
        if n_items > rows:
            raise ConfigError(
                f"a batch of {n_items} samples for bucket {bucket}, whose batches hold {rows}: "
                f"the sampler and the collate disagree (a RiskSplitSampler without on_risk='split'?)"
            )
        return rows, length

    def info(
        self, indices: Sequence[int], bucket: int, rows: int, length: int, position: tuple[int, int] | None = None
    ) -> BatchInfo:
        """The batch's :class:`BatchInfo`, after the risk policy (which may warn or raise);
        ``position``: the sampler's after this batch (NOTE [ Position through the workers ])."""
        data = self.data
        plan = data.plan
        info = data.batch_info(indices, bucket=bucket, shape=(rows, length), predicted_peak_bytes=0)
        vision = plan.buckets[bucket].vision_bound
        if vision is not None and plan.mode == "dynamic" and "vision" in info.tokens:
            # NOTE [ Two-dimensional dynamic batches ]: the batch is padded to its own most image tokens
            j = list(info.tokens).index("vision")
            vision = max((r[j] for r in info.row_tokens), default=0)
        peak = (  # NOTE [ Risk before the GPU ]: a 2D batch at its image-token bound
            bucket_peak(plan, self.cost_model, bucket, rows, length, vision)
            if self.cost_model is not None
            else plan.buckets[bucket].predicted_peak_bytes
        )
        info = dataclasses.replace(info, predicted_peak_bytes=peak, risk=peak / plan.budget_bytes)
        if position is not None:
            info = dataclasses.replace(info, position=position)
        if vision is not None:
            info = dataclasses.replace(info, vision_bound=vision)
        if info.risk > self.risk_threshold:  # NOTE [ Risk before the GPU ]
            # per-camera counts need each sample's metadata: only for the rare flagged batch
            info = dataclasses.replace(info, cameras=data.camera_tokens(indices))
            apply_risk_policy(info, self.risk_threshold, self.on_risk, can_split=len(indices) > 1)
        return info
