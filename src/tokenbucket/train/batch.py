"""What a batch carries besides its tensors: :class:`BatchInfo` (read by the monitor), the
token layout of a sample (:class:`Segment`), the empty-row marker, and the one padding routine
every collate uses.

NOTE [ Token layout ]
A sample's flattened sequence is laid out in breakdown order: each camera in turn (for each
temporal token: its spatial tokens, then its special tokens; then the camera's special
tokens), then text, proprio, action, memory and the extras in spec order.
:func:`token_layout` gives the slices, so a model can build position ids and masks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.tokens.breakdown import TokenBreakdown
from tokenbucket.tokens.spec import MODALITIES, TokenSpec

__all__ = ["BatchInfo", "BucketedData", "EmptyRow", "Segment", "pad_rows", "token_layout"]


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


@dataclass(frozen=True)
class BatchInfo:
    """What the monitor reads about a batch.

    ``tokens`` sums the batch's real tokens by modality; ``indices``, ``lengths`` and
    ``row_tokens`` (counts in the order of ``tokens``) are per real row, in row order, so a part
    of the batch (:meth:`subset`) is described exactly. ``cameras`` (tokens per camera name) is
    filled only for a batch flagged as risky, where the report needs it.
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
    (:class:`~tokenbucket.train.collate.TokenBucketDataset` is the one that answers it)."""

    spec: TokenSpec
    plan: BucketPlan
    plan_id: str
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
