"""What a batch carries besides its tensors: :class:`BatchInfo` (read by the monitor), the
token layout of a sample (:class:`Segment`), the empty-row marker, and the one padding routine
every collate uses, and :class:`Batch`, the dict a collate returns (it moves itself: ``.to``).

NOTE [ Token layout ]
A sample's flattened sequence is laid out in breakdown order: each camera in turn (for each
temporal token: its spatial tokens, then its special tokens; then the camera's special
tokens), then text, proprio, action, memory and the extras in spec order.
:func:`token_layout` gives the slices, so a model can build position ids and masks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.tokens.breakdown import TokenBreakdown
from tokenbucket.tokens.spec import MODALITIES, TokenSpec

if TYPE_CHECKING:
    from tokenbucket.plan.manifest import Manifest

__all__ = ["Batch", "BatchInfo", "BucketedData", "EmptyRow", "FrozenFieldError", "Segment", "pad_rows", "token_layout"]


@dataclass(frozen=True)
class Segment:
    """``tokens[start:stop]`` of a sample hold ``modality`` (and for vision, ``camera``/``frame``)."""

    modality: str
    start: int
    stop: int
    camera: str | None = None
    frame: int | None = None


def token_layout(bd: TokenBreakdown, spec: TokenSpec) -> list[Segment]:
    """The slices of a sample's sequence, in the order of NOTE [ Token layout ].

    Example:
        >>> from tokenbucket.tokens.breakdown import breakdown_sample
        >>> bd = breakdown_sample({"cameras": 2, "frames": 2, "height": 28, "width": 28, "text_tokens": 5},
        ...                       TokenSpec(patch=14))
        >>> [(s.modality, s.camera, s.frame, s.start, s.stop) for s in token_layout(bd, TokenSpec(patch=14))][:3]
        [('vision', 'camera0', 0, 0, 4), ('vision', 'camera0', 1, 4, 8), ('vision', 'camera1', 0, 8, 12)]
    """
    out: list[Segment] = []
    pos = 0
    for cam in bd.cameras:
        cs = spec.camera_spec(cam.name)
        per_frame = cam.spatial + cs.special_per_frame
        for f in range(cam.temporal):
            out.append(Segment("vision", pos, pos + per_frame, cam.name, f))
            pos += per_frame
        if cs.special_per_camera:
            out.append(Segment("vision_special", pos, pos + cs.special_per_camera, cam.name, None))
            pos += cs.special_per_camera
    for name in (*MODALITIES, *bd.extras):
        count = getattr(bd, name) if name in MODALITIES else bd.extras[name]
        if count:
            out.append(Segment(name, pos, pos + count))
            pos += count
    if pos != bd.total:
        raise AssertionError(f"layout covers {pos} tokens, breakdown says {bd.total}")
    return out


@dataclass(frozen=True)
class EmptyRow:
    """What the dataset returns for an empty row of bucket ``bucket`` (see the sampler)."""

    bucket: int


class FrozenFieldError(ConfigError, FrozenInstanceError):
    """A change to an immutable :class:`BatchInfo`: the ``FrozenInstanceError`` a frozen dataclass
    raises (what ``apply_to_collection`` and ``except`` clauses expect), in the family."""


# NOTE [ BatchInfo through the trainers ]
# Lightning's ``apply_to_collection`` (and so ``move_data_to_device`` and Fabric's precision
# casts) rebuilds a dataclass by deep-copying it and then setting every field to the result of
# mapping that field: on a ``frozen=True`` dataclass that set raises and the batch transfer
# fails. BatchInfo holds no tensors, so every mapped field comes back equal to the old one.
# BatchInfo is therefore a plain dataclass whose ``__setattr__`` lets a field be set only to a
# value equal to the one it holds (a no-op) and refuses any change with the same
# ``FrozenInstanceError`` a frozen dataclass raises (as :class:`FrozenFieldError`): still immutable, still a dataclass
# (``dataclasses.replace``, ``fields``, equality), and it survives the transfer utilities
# (tests/test_batch_transfer.py runs them).


@dataclass
class BatchInfo:
    """What the monitor reads about a batch (immutable: see NOTE [ BatchInfo through the trainers ]).

    ``tokens`` sums the batch's real tokens by modality; ``indices``, ``lengths`` and
    ``row_tokens`` (counts in the order of ``tokens``) are per real row, in row order, so a part
    of the batch (:meth:`subset`) is described exactly. ``cameras`` (tokens per camera name) is
    filled only for a batch flagged as risky, where the report needs it. ``position`` is where
    the sampler stands once this batch is trained (NOTE [ Position through the workers ]).
    """

    bucket: int
    shape: tuple[int, int]
    keys: tuple[str, ...]
    tokens: dict[str, int]
    real_tokens: int
    padded_tokens: int
    predicted_peak_bytes: int
    risk: float
    indices: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()
    row_tokens: tuple[tuple[int, ...], ...] = ()
    cameras: dict[str, int] | None = None
    position: tuple[int, int] | None = None  # (epoch, step) of the sampler after this batch
    # a 2D static bucket's image-token bound (NOTE [ Two-dimensional buckets ]); a 2D dynamic
    # batch's own most image tokens a row (NOTE [ Two-dimensional dynamic batches ])
    vision_bound: int | None = None

    def __setattr__(self, name: str, value: object) -> None:
        # NOTE [ BatchInfo through the trainers ]: setting a field to an equal value is a no-op
        if name in self.__dict__ and self.__dict__[name] != value:
            raise FrozenFieldError(
                f"BatchInfo is immutable: cannot assign to field {name!r} (make a changed copy with dataclasses.replace)"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise FrozenFieldError(f"BatchInfo is immutable: cannot delete field {name!r}")

    def subset(
        self,
        rows: Sequence[int],
        *,
        length: int | None = None,
        predicted_peak_bytes: int | None = None,
        budget_bytes: int | None = None,
    ) -> BatchInfo:
        """The info of real rows ``rows`` as a batch of their own (``length``: its padded length).

        Without a new prediction the parent's peak is kept (an overestimate: a part is smaller).
        """
        rows = list(rows)
        length = self.shape[1] if length is None else length
        names = list(self.tokens)
        tokens = {name: sum(self.row_tokens[r][j] for r in rows) for j, name in enumerate(names)}
        peak = self.predicted_peak_bytes if predicted_peak_bytes is None else predicted_peak_bytes
        budget = self.predicted_peak_bytes / self.risk if budget_bytes is None and self.risk else budget_bytes
        return BatchInfo(
            bucket=self.bucket,
            shape=(len(rows), length),
            keys=tuple(self.keys[r] for r in rows),
            tokens=tokens,
            real_tokens=sum(self.lengths[r] for r in rows),
            padded_tokens=len(rows) * length,
            predicted_peak_bytes=peak,
            risk=peak / budget if budget else self.risk,
            indices=tuple(self.indices[r] for r in rows) if self.indices else (),  # a stream's have none
            lengths=tuple(self.lengths[r] for r in rows),
            row_tokens=tuple(self.row_tokens[r] for r in rows),
            cameras=None,
            position=self.position,
            vision_bound=self.vision_bound,
        )


def pad_rows(
    seqs: Sequence[torch.Tensor | Sequence[torch.Tensor]],
    indices: Sequence[int],
    rows: int,
    length: int,
    template: torch.Tensor,
    pad_value: float = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``seqs`` (each ``[L_i, ...]``, or a packed row's list of them laid end to end) in the first
    rows of a ``[rows, length, ...]`` batch.

    Returns ``tokens`` (``pad_value`` past each sequence and on empty rows, ``template``'s dtype
    and trailing shape), ``attention_mask`` ``[rows, length]`` (True on real tokens),
    ``row_mask`` ``[rows]`` (True on real rows) and ``index`` ``[rows]`` (``indices``, -1 on
    empty rows).

    Example:
        >>> t, a, r, i = pad_rows([torch.ones(2), torch.ones(1)], [7, 9], 3, 2, torch.zeros(1))
        >>> a.int().tolist(), r.tolist(), i.tolist()
        ([[1, 1], [1, 0], [0, 0]], [True, True, False], [7, 9, -1])
    """
    tokens = torch.full((rows, length, *template.shape[1:]), pad_value, dtype=template.dtype)
    attention = torch.zeros(rows, length, dtype=torch.bool)
    row_mask = torch.zeros(rows, dtype=torch.bool)
    index = torch.full((rows,), -1, dtype=torch.long)
    for r, (i, s) in enumerate(zip(indices, seqs, strict=True)):
        if isinstance(s, torch.Tensor):
            end = s.shape[0]
            tokens[r, :end] = s
        else:
            end = 0
            for piece in s:
                tokens[r, end : end + piece.shape[0]] = piece
                end += piece.shape[0]
        attention[r, :end] = True
        row_mask[r] = True
        index[r] = i
    return tokens, attention, row_mask, index


class BucketedData(Protocol):
    """What the samplers and collates read from a bucketed dataset
    (:class:`~tokenbucket.train.collate.TokenBucketDataset` is the one that answers it);
    ``manifest``: the one its plan came from, else ``None``."""

    spec: TokenSpec
    plan: BucketPlan
    plan_id: str
    manifest: Manifest | None
    lengths: np.ndarray
    buckets: np.ndarray

    def __len__(self) -> int: ...

    def key(self, index: int) -> str: ...

    def breakdown(self, index: int) -> TokenBreakdown: ...

    def tokens_of(self, index: int, item: Mapping[str, Any], tokens_key: str) -> torch.Tensor: ...

    def token_template(self, tokens_key: str) -> torch.Tensor: ...

    def batch_info(
        self, indices: Sequence[int], *, bucket: int, shape: tuple[int, int], predicted_peak_bytes: int
    ) -> BatchInfo: ...


class Batch(dict[str, Any]):
    """The dict a collate returns, able to move itself: ``batch.to(device)``.

    ``to`` (and ``pin_memory``, which a ``DataLoader(pin_memory=True)`` calls) walks the values,
    lists, tuples and dicts in them, and moves every tensor; anything else (``info``, strings)
    is kept as is. Lightning's ``move_data_to_device`` and Accelerate's ``send_to_device`` see
    the ``to`` method and call it; ``apply_to_collection`` rebuilds it as a ``Batch``.

    Example:
        >>> b = Batch(x=torch.ones(2), mask=torch.ones(2, dtype=torch.bool), names=["a", "b"])
        >>> moved = b.to("cpu", dtype=torch.float64)
        >>> type(moved).__name__, moved["x"].dtype, moved["mask"].dtype, moved["names"]
        ('Batch', torch.float64, torch.bool, ['a', 'b'])
    """

    def to(
        self,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        non_blocking: bool = False,
    ) -> Batch:
        """A new batch with every tensor on ``device``; ``dtype`` casts floating-point tensors
        only (ids and masks keep theirs), as ``torch.nn.Module.to`` does."""

        def move(t: torch.Tensor) -> torch.Tensor:
            cast = dtype if dtype is not None and t.is_floating_point() else None
            return t.to(device=device, dtype=cast, non_blocking=non_blocking)

        return Batch({k: _map_tensors(v, move) for k, v in self.items()})

    def pin_memory(self) -> Batch:
        """A new batch with every tensor in pinned memory (what ``DataLoader(pin_memory=True)`` calls)."""
        return Batch({k: _map_tensors(v, torch.Tensor.pin_memory) for k, v in self.items()})


def _map_tensors(value: object, fn: Callable[[torch.Tensor], torch.Tensor]) -> object:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return type(value)({k: _map_tensors(v, fn) for k, v in value.items()})
    return value
