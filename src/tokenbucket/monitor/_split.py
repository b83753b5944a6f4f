"""Cutting a batch into parts (the OOM guard's ``split`` policy), a 2D bucket's parts priced at its
image-token bound; :mod:`tokenbucket.monitor.hooks` re-exports :func:`split_batch`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.plan.buckets_2d import SupportsCost2D
from tokenbucket.train.risk import prices_vision

__all__ = ["split_batch"]


def split_batch(
    batch: Mapping[str, Any], parts: int, *, cost_model: PredictsMemory | SupportsCost2D | None = None
) -> list[dict[str, Any]]:
    """Cut a :class:`~tokenbucket.train.collate.BucketCollate` (or ``StreamCollate``) batch into ``parts`` batches of its real rows.

    Empty rows are left out. Tensors whose first dimension is the batch's rows are sliced, and
    those shaped ``[rows, length, ...]`` trimmed to the part's longest sample; ``layout`` and
    ``keys`` are sliced; ``info`` becomes the part's :meth:`~tokenbucket.train.collate.BatchInfo.subset`
    (re-predicted with ``cost_model`` when given; a 2D bucket's part at its ``vision_bound``).
    """
    info = batch["info"]
    vision = info.vision_bound
    if vision is not None and cost_model is not None and not prices_vision(cost_model):
        raise ConfigError(
            f"this batch is of a 2D bucket (at most {vision:,} image tokens a row): split_batch's cost_model should "
            f"take vision= (a StagedLengthModel), but got {type(cost_model).__name__}"
        )
    n = len(info.keys)
    if n and len(info.lengths) != n:
        raise ConfigError("this batch's info has no per-row lengths; give guard() a split_fn for your batch type")
    rows, length = info.shape
    size = max(1, -(-n // parts))
    out = []
    for start in range(0, n, size):
        part_rows = list(range(start, min(n, start + size)))
        longest = max(info.lengths[r] for r in part_rows)
        if cost_model is None:
            peak = None
        elif vision is None:
            peak = int(cost_model.memory(len(part_rows), longest).total)
        else:  # NOTE [ Two-dimensional buckets ]: the part still holds at most the bucket's image tokens
            peak = int(cast(SupportsCost2D, cost_model).memory(len(part_rows), longest, min(vision, longest)).total)
        part: dict[str, Any] = {}
        for key, value in batch.items():
            if key == "info":
                part[key] = info.subset(part_rows, length=longest, predicted_peak_bytes=peak)
            elif key in ("layout", "keys"):  # one entry per real row (BucketCollate, StreamCollate)
                part[key] = [value[r] for r in part_rows]
            elif isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == rows:
                t = value[start : start + len(part_rows)]
                part[key] = t[:, :longest] if t.ndim >= 2 and value.shape[1] == length else t
            else:
                part[key] = value
        out.append(part)
    return out
