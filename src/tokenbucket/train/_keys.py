"""The keys a collate knows nothing about: kept, never dropped (stacked, padded with a mask, or
returned as a list), and the one conversion of array-likes to tensors the collates share.

NOTE [ Every item key reaches the batch ]
One contract for every collate of ``(index, item)`` batches (``BucketCollate``,
``ModalityCollate``): each key of the items that the collate does not read itself reaches the
batch under its own name, through :func:`collate_keys`:

- tensors (and numeric NumPy arrays) of one shape are stacked ``[rows, ...]``;
- tensors of one rank but different shapes are padded to the largest with ``<key>_mask``
  (``[rows, L]`` True on real entries when only the first dim differs, else the padded shape),
  or with ``ragged="list"`` kept as a list of tensors;
- anything else (a ``label`` int, a ``uid`` or ``task`` string, a dict) is a list, one entry a row.

Empty rows (the sampler's padding rows, NOTE [ Nothing lost, equal steps ]) come after the real
ones and hold zeros in a tensor, False in a mask and ``None`` in a list, and so does a row
whose item lacks a key the others have (the key is then a list). A batch of empty rows only
takes its keys and shapes from a real sample of its bucket (:class:`ItemTemplates`), so every
batch of a bucket holds the same keys. An item key that names something the collate fills
itself (``index``, ``meta``, ``info``, ``row_mask``, ...) is kept as ``item.<key>``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.train.batch import pad_rows

if TYPE_CHECKING:
    from tokenbucket.train.shaping import ShapedData

__all__ = ["ABSENT", "ItemTemplates", "Ragged", "check_ragged", "collate_keys", "collate_other", "to_tensor"]

Ragged = Literal["pad", "list"]
"""What ``ragged=`` takes: tensors of one key that differ in shape padded with a mask, or listed."""

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


def check_ragged(ragged: object) -> None:
    if ragged not in ("pad", "list"):
        raise ConfigError(f"ragged should be 'pad' or 'list', but got ragged={ragged!r}")


def collate_keys(
    out: dict[str, object],
    items: Sequence[Mapping[str, object]],
    n_real: int,
    rows: int,
    *,
    ragged: str,
    used: Collection[str] = (),
    reserved: Collection[str] = (),
) -> None:
    """Every key of ``items`` but ``used`` into ``out`` (NOTE [ Every item key reaches the batch ]).

    Args:
        out: the batch so far; a name it holds, or one of ``reserved``, is kept as ``item.<name>``.
        items: the real rows' items in row order, or (``n_real`` 0) a real item of the bucket
            to take the keys and shapes of a batch of empty rows from.
        n_real: how many of ``items`` are real rows; ``rows - n_real`` empty rows follow.
        ragged: ``"pad"`` or ``"list"`` (:func:`collate_other`).
        used: the keys the collate read itself.

    Example:
        >>> out = {"index": torch.tensor([7, -1])}
        >>> collate_keys(out, [{"label": 3, "index": 9, "action": torch.ones(2)}], 1, 2, ragged="pad")
        >>> out["label"], out["item.index"], out["action"].tolist()
        ([3, None], [9, None], [[1.0, 1.0], [0.0, 0.0]])
    """
    taken = set(out) | set(reserved)
    seen: dict[str, None] = {}
    for item in items:
        seen.update((str(k), None) for k in item if k not in used)
    for key in seen:
        values = [item.get(key, ABSENT) for item in items[:n_real]]
        for name, value in collate_other(key, values, items[0].get(key), rows, ragged).items():
            # a name the collate fills itself (LeRobot's frame "index") is kept as "item.<name>"
            out[f"item.{name}" if name in taken else name] = value
            taken.add(name)


class ItemTemplates:
    """A real sample of each bucket (else of any bucket), read once per bucket: what a batch of
    empty rows only takes its keys and shapes from (NOTE [ Every item key reaches the batch ])."""

    def __init__(self, data: ShapedData) -> None:
        self.data = data
        self._items: dict[int, tuple[int, object]] = {}

    def __call__(self, bucket: int) -> tuple[int, object]:
        """``(index, item)`` of a real sample of ``bucket``."""
        if bucket not in self._items:
            buckets = self.data.buckets
            same = np.flatnonzero(buckets == bucket)
            i = int(same[0]) if len(same) else int(np.flatnonzero(buckets >= 0)[0])
            _, item = self.data[i]
            self._items[bucket] = (i, item)
        return self._items[bucket]
