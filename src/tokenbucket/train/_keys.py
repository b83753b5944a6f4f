"""The keys a collate knows nothing about: kept, never dropped (stacked, padded with a mask, or
returned as a list), and the one conversion of array-likes to tensors the collates share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tokenbucket.train.batch import pad_rows

__all__ = ["ABSENT", "collate_other", "to_tensor"]

ABSENT = object()
"""A value in :func:`collate_other`'s ``values`` for a row whose item lacks the key."""


def to_tensor(value: object, *, lists: bool = True) -> torch.Tensor | None:
    """``value`` as a tensor (a tensor, a numeric NumPy array, or with ``lists`` a list of
    numbers), else ``None``."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    if lists and isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return torch.tensor(value)
    return None


def collate_other(key: str, values: Sequence[object], ref: object, rows: int, ragged: str) -> dict[str, object]:
    """The batch entries for ``key`` from the real rows' ``values`` (``rows - len(values)``
    empty rows follow; ``ref``: a real sample's value, for the shape of an all-empty batch).

    Equal-shape tensors are stacked ``[rows, ...]`` (zeros on empty rows); tensors of one rank
    but different shapes are padded to the largest with ``<key>_mask`` (``[rows, L]`` when only
    the first dim differs, else the padded shape), or with ``ragged="list"`` kept as a list;
    anything else is a list with ``None`` on empty rows (and where an item lacks the key).

    Example:
        >>> out = collate_other("x", [torch.ones(2), torch.ones(1)], None, 3, "pad")
        >>> out["x"].tolist(), out["x_mask"].int().tolist()
        ([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], [[1, 1], [1, 0], [0, 0]])
    """
    n = len(values)
    tail: list[object] = [None] * (rows - n)
    if any(v is ABSENT for v in values):
        return {key: [None if v is ABSENT else v for v in values] + tail}
    tensors = [to_tensor(v, lists=False) for v in values]
    if not values:
        t = to_tensor(ref, lists=False)
        return {key: torch.zeros((rows, *t.shape), dtype=t.dtype) if t is not None else tail}
    if any(t is None for t in tensors):
        return {key: list(values) + tail}
    ts = [t for t in tensors if t is not None]
    shapes = {t.shape for t in ts}
    if len(shapes) == 1:
        stacked = torch.stack(ts)
        if rows == n:
            return {key: stacked}
        out = torch.zeros((rows, *stacked.shape[1:]), dtype=stacked.dtype)
        out[:n] = stacked
        return {key: out}
    if ragged == "list" or len({t.ndim for t in ts}) > 1:
        return {key: list(ts) + tail}
    mask_key = f"{key}_mask"
    if len({t.shape[1:] for t in ts}) == 1:  # ragged along the first dim only: one padding routine
        length = max(t.shape[0] for t in ts)
        padded, mask, _, _ = pad_rows(ts, range(n), rows, length, ts[0])
        return {key: padded, mask_key: mask}
    big = [max(t.shape[d] for t in ts) for d in range(ts[0].ndim)]
    padded = torch.zeros((rows, *big), dtype=ts[0].dtype)
    full = torch.zeros((rows, *big), dtype=torch.bool)
    for r, t in enumerate(ts):
        region: tuple[int | slice, ...] = (r, *(slice(0, s) for s in t.shape))
        padded[region] = t
        full[region] = True
    return {key: padded, mask_key: full}
