"""Packed rows for a VLM: whole Qwen2-VL-shaped samples laid end to end in rows of
``pack_length`` LLM tokens, with what varlen models take for both towers.

NOTE [ Packed VLM rows ]
:class:`PackedModalityCollate` reads each item as :class:`~tokenbucket.train.modal.ModalityCollate`
does (its checks against the metadata, processor patches or frames cut to patches, labels from
the ids), then refills the batch's samples next-fit into rows (NOTE [ Packed rows ]): a sample is
never split and each row's samples are contiguous in batch order, so the patch stream, which
concatenates images in batch order, is also in row order.

* Vision tower: ``pixel_values`` holds the patches of every image of every row in row order,
  ``image_grid_thw`` one ``(t, h, w)`` an image, ``image_cu_seqlens`` the image boundaries (each
  image attends only to itself, as Qwen2-VL's tower does from the grid alone: it needs no mask),
  ``image_rows`` / ``image_segment_ids`` where each image sits. Clips are the same under
  ``pixel_values_videos``, ``video_grid_thw``, ``video_cu_seqlens`` (one segment a clip;
  Qwen2-VL's tower cuts a clip further, one segment a temporal patch, from its grid).
* LLM: ``input_ids``, ``labels``, ``segment_ids`` (1, 2, ... per sample of a row, 0 on padding),
  ``text_position_ids`` (0, 1, ... restarting per sample), ``cu_seqlens`` / ``max_seqlen`` over the
  real tokens in row order, and ``position_ids``: with ``rope_config``, the model's 3-D rope
  ``[3, R, P]`` computed for each sample alone by transformers' own ``get_rope_index``
  (:func:`tokenbucket.models.qwen2_vl.rope_positions`) and placed where the sample sits, so every
  sample sees exactly the positions it would see unpacked; without it, ``text_position_ids``.
* NOTE [ Labels in a packed row ]: labels are unshifted, as a Hugging Face model takes them (it
  shifts: the logits at t are scored on ``labels[t + 1]``). The first token of every sample gets
  ``label_pad_id``, so the last token of one sample is never scored on the first of the next;
  padding gets it too. The loss of a row is then the sum of its samples' own losses.
* ``attention_mask``: ``[R, 1, P, P]``, causal inside each sample and zero across samples
  (:func:`~tokenbucket.train.packing.block_diagonal_mask` with ``causal=True``): bool (True =
  attend) for SDPA, or additive in a float ``mask_dtype`` (0, and the dtype's minimum where
  masked) for eager attention, which adds the mask to its scores (a bool mask would be added as
  0 / 1: wrong, silently). transformers (5.24) hands a 4-D mask to the attention as it is
  (``masking_utils._preprocess_mask_arguments``), so ``model(input_ids=..., pixel_values=...,
  image_grid_thw=..., position_ids=batch["position_ids"], attention_mask=batch["attention_mask"])``
  computes per sample what the sample alone computes (tests/test_packed_vlm.py). The mask is
  dense: ``R x P²`` elements, outside the plan's flash / varlen prediction (NOTE [ Dense mask size ]).

NOTE [ Packed rows into flash-attn ]
With flash-attn, take ``mask_dtype=None`` (no dense mask) and hand transformers the real tokens
as one padding-free sequence: its flash path finds varlen segments only in a batch of one row.
Qwen2-VL reads 4-row ``position_ids`` as (text, t, h, w) and cuts the sequence where the text
positions restart::

    real = batch["segment_ids"] > 0
    pos = torch.cat([batch["text_position_ids"][None], batch["position_ids"]])[:, real][:, None]
    model(input_ids=batch["input_ids"][real][None], position_ids=pos, use_cache=False,
          pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])

(the labels likewise: ``batch["labels"][real][None]``), or give its flash kernels the
boundaries: ``cu_seq_lens_q=cu_seq_lens_k=batch["cu_seqlens"]``,
``max_length_q=max_length_k=batch["max_seqlen"]`` (the real tokens, in row order). Two traps
in transformers 5.24: with a cache (``use_cache`` defaults to the config's True, in training
too unless gradient checkpointing turns it off) its mask builder does not look for packed
positions, so under SDPA / eager the samples see each other; and the batch's ``cu_seqlens``
must not be passed as ``cu_seqlens=``: Qwen2-VL's vision tower takes a keyword of that name as
its own image boundaries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.models import family
from tokenbucket.models.qwen2_vl import rope_positions
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.train._keys import Ragged, to_tensor
from tokenbucket.train._packed_rows import check_packed_options, dense_mask, packed_peak, packed_rows, warn_mask_size
from tokenbucket.train._patches import IMAGES, VIDEOS, StreamNames
from tokenbucket.train.batch import Batch, EmptyRow
from tokenbucket.train.modal import ModalityCollate, ModalityKeys
from tokenbucket.train.packing import cu_seqlens_of
from tokenbucket.train.risk import check_planned_model
from tokenbucket.train.sampler import position_of
from tokenbucket.train.shaping import ShapedData

__all__ = ["ROPE_MODEL_TYPES", "PackedModalityCollate"]

ROPE_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
"""The ``model_type`` s whose 3-D rope positions ``rope_config`` computes (their ``get_rope_index``)."""

IMAGE_CU_SEQLENS = "image_cu_seqlens"  # the image stream's boundaries; ``cu_seqlens`` is the LLM's here
_STREAM_KEYS = {getattr(n, f.name) for n in (IMAGES, VIDEOS) for f in dataclasses.fields(StreamNames)} - {
    "patches",
    "video patches",
}
_SAMPLE_KEYS = ("index", "row_mask", "info")  # the inner batch's own, replaced by the packed batch's


class PackedModalityCollate:
    """Packs a batch of ``(index, item)`` VLM samples into ``rows_per_batch`` rows of ``pack_length``
    LLM tokens (NOTE [ Packed VLM rows ]).

    Items are as for :class:`~tokenbucket.train.modal.ModalityCollate` (Qwen2-VL processor
    output, or frames the patches layout cuts), and their ``input_ids`` must hold the whole
    sequence (image placeholders expanded: the breakdown's ``total``), which is what a row packs.

    Returns a :class:`~tokenbucket.train.batch.Batch` holding, for ``R`` rows of ``P`` tokens:

    - ``input_ids``, ``labels`` (NOTE [ Labels in a packed row ]), each of ``keys.token_types``
      the items carry, ``segment_ids`` (int32), ``text_position_ids``: ``[R, P]``;
      ``position_ids``: ``[3, R, P]`` with ``rope_config``, else ``text_position_ids``;
      ``cu_seqlens`` (int32) and ``max_seqlen`` over the real tokens in row order;
      ``attention_mask`` ``[R, 1, P, P]`` unless ``mask_dtype`` is None.
    - ``pixel_values`` ``[patches, C·t·p·p]``, ``image_grid_thw`` ``[images, 3]``,
      ``image_cu_seqlens`` (int32), ``image_rows`` and ``image_segment_ids`` ``[images]``
      (when the batch holds images); the same for clips (``pixel_values_videos``,
      ``video_grid_thw``, ``video_cu_seqlens``, ``video_rows``, ``video_segment_ids``,
      ``second_per_grid_ts``).
    - ``index``: per row, the dataset indices of its samples (``[]`` for an empty row); every
      other key of the items (``camera_keys``, ``meta``, a ``uid``...) one entry a sample, in
      the order of ``index`` row after row, as ModalityCollate keeps them.
    - ``info``: a :class:`~tokenbucket.train.batch.BatchInfo` of shape ``(R, P)``, its peak
      predicted with ``cost_model`` when given.

    The rows are the sampler's when it chose them (:class:`~tokenbucket.train.packing_2d.PackedBatchSampler2D`,
    NOTE [ Rows through the workers ]), else the batch's samples refilled next-fit under both
    caps. Either way each row is checked against ``pack_length`` and ``row_patches``.

    Args:
        data: the bucketed dataset (a :class:`~tokenbucket.train.collate.TokenBucketDataset`).
        pack_length: LLM tokens per row (a two-cap plan's ``row_tokens``).
        rows_per_batch: rows per batch; ``None``: as many as the batch needs.
        row_patches: tower patches per row, images and clips together (a two-cap plan's
            ``row_patches``, NOTE [ Two-cap packed rows ]); ``None``: not capped.
        rope_config: the model's transformers config (``model_type`` in :data:`ROPE_MODEL_TYPES`):
            ``position_ids`` are its 3-D rope, and the placeholder ids default to its own.
        mask_dtype: ``torch.bool`` (SDPA), a float dtype (an additive mask, for eager
            attention) or ``None`` (no dense mask: flash-attn varlen, NOTE [ Packed rows into flash-attn ]).
        keys, ragged, pad_id, label_pad_id, make_labels, image_token_id, video_token_id: as
            :class:`~tokenbucket.train.modal.ModalityCollate`.
        cost_model: predicts each batch's peak at ``(R, P)``; a ``StagedPackedModel`` at
            ``(R, P)`` and the batch's own patches and image tokens (NOTE [ A packed row's price ]).

    Raises:
        ConfigError: (on a call) a sample longer than ``pack_length`` or with more patches
            than ``row_patches``, ids without the image placeholders, or an item that disagrees
            with its metadata, each in one line naming the sample; a row over either cap or
            more rows than ``rows_per_batch``.

    Warns:
        UserWarning: once per collate object, when the dense mask would pass 256 MiB
            (NOTE [ Dense mask size ]).
    """

    def __init__(
        self,
        data: ShapedData,
        pack_length: int,
        rows_per_batch: int | None = None,
        *,
        row_patches: int | None = None,
        rope_config: object | None = None,
        mask_dtype: torch.dtype | None = torch.bool,
        keys: ModalityKeys | None = None,
        ragged: Ragged = "pad",
        pad_id: int = 0,
        label_pad_id: int = -100,
        make_labels: bool = True,
        image_token_id: int | None = None,
        video_token_id: int | None = None,
        cost_model: PredictsMemory | StagedPackedModel | None = None,
    ) -> None:
        check_packed_options(pack_length, rows_per_batch, row_patches, mask_dtype)
        check_planned_model(data, cost_model)  # NOTE [ A cost model beside its manifest ]
        self._rope_class: str | None = None
        if rope_config is not None:
            model_type = getattr(rope_config, "model_type", None)
            if model_type not in ROPE_MODEL_TYPES:
                raise ConfigError(
                    f"rope_config should be the transformers config of one of {list(ROPE_MODEL_TYPES)}, "
                    f"but got model_type={model_type!r}"
                )
            self._rope_class = family(model_type).hf_classes[model_type]
            own = {name: getattr(rope_config, f"{name}_token_id", None) for name in ("image", "video")}
            if own["image"] is None:
                raise ConfigError(f"rope_config (model_type={model_type!r}) has no image_token_id")
            image_token_id = int(own["image"]) if image_token_id is None else image_token_id
            if video_token_id is None and own["video"] is not None:
                video_token_id = int(own["video"])
        self.data, self.pack_length, self.rows_per_batch = data, pack_length, rows_per_batch
        self.row_patches = row_patches
        self.rope_config, self.mask_dtype, self.cost_model = rope_config, mask_dtype, cost_model
        self.label_pad_id = int(label_pad_id)
        self.modal = ModalityCollate(
            data,
            layout="patches",
            keys=keys,
            ragged=ragged,
            pad_id=pad_id,
            label_pad_id=label_pad_id,
            make_labels=make_labels,
            image_token_id=image_token_id,
            video_token_id=video_token_id,
        )
        self.keys = self.modal.keys
        self._warned_mask = False

    def __call__(self, batch: Sequence[tuple[int, object]]) -> Batch:
        k, P = self.keys, self.pack_length
        inner = self.modal(batch)  # every item read and checked once, one row a sample
        real = [i for i, item in batch if not isinstance(item, EmptyRow)]
        if real and k.input_ids not in inner:
            raise ConfigError(
                f"sample {real[0]} (key {self.data.key(real[0])!r}): its item has no {k.input_ids!r}; "
                f"a packed row is made of the samples' token ids"
            )
        lengths = [self._length(i, item) for i, item in batch if not isinstance(item, EmptyRow)]
        patches = _patches_of(inner, len(real))
        fit = packed_rows(  # NOTE [ Rows through the workers ]
            batch,
            real,
            lengths,
            patches,
            pack_length=P,
            rows_per_batch=self.rows_per_batch,
            row_patches=self.row_patches,
            key_of=self.data.key,
        )
        R = self.rows_per_batch if self.rows_per_batch is not None else max(1, len(fit))
        out = Batch()
        row_of, segment_of = self._text(out, inner, fit, lengths, R)
        self._streams(out, inner, row_of, segment_of)
        self._mask(out, R)
        n_real, inner_rows = len(real), len(batch)
        packed = {k.input_ids, k.labels, k.attention_mask, *k.token_types, *_SAMPLE_KEYS, *_STREAM_KEYS}
        for key, value in inner.items():  # NOTE [ Every item key reaches the batch ]: one entry a sample
            if key not in out and key not in packed:
                out[key] = _per_sample(value, inner_rows, n_real)
        out["index"] = [[real[s] for s in row] for row in fit] + [[] for _ in range(R - len(fit))]
        peak = self._peak(out, R, sum(patches))
        info = self.data.batch_info(real, bucket=0, shape=(R, P), predicted_peak_bytes=peak)
        if position_of(batch) is not None:  # NOTE [ Position through the workers ]
            info = dataclasses.replace(info, position=position_of(batch))
        out["info"] = info
        return out

    def _peak(self, out: Batch, rows: int, patches: int) -> int:
        """The batch's predicted peak (NOTE [ A packed row's price ])."""
        ids = out[self.keys.input_ids]
        tokens = (self.modal.image_token_id, self.modal.video_token_id)
        image = sum(int(ids.eq(t).sum()) for t in tokens if t is not None)
        return packed_peak(self.cost_model, rows, self.pack_length, patches, image)

    def _length(self, index: int, item: object) -> int:
        """The sample's token count: its ids, which must hold its whole sequence."""
        value = item.get(self.keys.input_ids) if isinstance(item, Mapping) else None
        ids = to_tensor(value)
        n = int(ids.shape[-1]) if ids is not None else 0
        bd = self.data.breakdown(index)
        if n != bd.total:
            raise ConfigError(
                f"sample {index} (key {self.data.key(index)!r}): its {self.keys.input_ids!r} hold {n} tokens, the text "
                f"only; a packed row needs ids that hold the whole sequence (image placeholders expanded: "
                f"total={bd.total}), as a processor writes them"
            )
        return n

    def _text(
        self, out: Batch, inner: Batch, fit: list[list[int]], lengths: list[int], R: int
    ) -> tuple[list[int], list[int]]:
        """The LLM side of the rows (NOTE [ Packed VLM rows ]); per sample, its row and segment id."""
        k, P = self.keys, self.pack_length
        ids = inner[k.input_ids]
        mask = inner[k.attention_mask]
        labels = inner.get(k.labels)
        types = [key for key in k.token_types if key in inner]
        out[k.input_ids] = torch.full((R, P), self.modal.pad_id, dtype=ids.dtype)
        if labels is not None:
            out[k.labels] = torch.full((R, P), self.label_pad_id, dtype=labels.dtype)
        for key in types:
            out[key] = torch.zeros((R, P), dtype=inner[key].dtype)
        segment = torch.zeros(R, P, dtype=torch.int32)
        text_position = torch.zeros(R, P, dtype=torch.long)
        rope = torch.zeros(3, R, P, dtype=torch.long) if self._rope_class is not None else None
        row_of, segment_of = [0] * len(lengths), [0] * len(lengths)
        seqlens: list[int] = []
        for r, row in enumerate(fit):
            start = 0
            for seg, s in enumerate(row, start=1):
                n = lengths[s]
                if not bool(mask[s, :n].all()):
                    index = int(inner["index"][s])
                    raise ConfigError(
                        f"sample {index} (key {self.data.key(index)!r}): its {k.attention_mask!r} masks tokens "
                        f"of its own sequence; a packed row holds whole samples (padding has no place in it)"
                    )
                span = slice(start, start + n)
                out[k.input_ids][r, span] = ids[s, :n]
                if labels is not None:
                    out[k.labels][r, span] = labels[s, :n]
                    out[k.labels][r, start] = self.label_pad_id  # NOTE [ Labels in a packed row ]
                for key in types:
                    out[key][r, span] = inner[key][s, :n]
                segment[r, span] = seg
                text_position[r, span] = torch.arange(n)
                if rope is not None:
                    rope[:, r, span] = self._rope(inner, s, ids[s, :n])
                row_of[s], segment_of[s] = r, seg
                seqlens.append(n)
                start += n
        out["segment_ids"], out["text_position_ids"] = segment, text_position
        out["position_ids"] = rope if rope is not None else text_position
        out["cu_seqlens"], out["max_seqlen"] = cu_seqlens_of(seqlens), max(seqlens, default=0)
        return row_of, segment_of

    def _rope(self, inner: Batch, s: int, ids: torch.Tensor) -> torch.Tensor:
        """Sample ``s``'s 3-D rope positions ``[3, n]``, computed for it alone (its own grids)."""
        if self._rope_class is None:
            raise AssertionError("_rope called without a rope_config")
        grids: dict[str, torch.Tensor | None] = {}
        for names in (IMAGES, VIDEOS):
            grid = inner.get(names.grid)
            mine = grid[inner[names.rows] == s] if grid is not None else None
            grids[names.grid] = mine if mine is not None and len(mine) else None
        seconds = inner.get(self.keys.second_per_grid_ts)
        if seconds is not None and grids[VIDEOS.grid] is not None:
            seconds = seconds[inner[VIDEOS.rows] == s]
        else:
            seconds = None
        positions = rope_positions(
            self._rope_class,
            self.rope_config,
            ids[None],
            int(self.modal.image_token_id or 0),  # set from rope_config when not given
            grids[IMAGES.grid],
            video_token=self.modal.video_token_id,
            video_grid=grids[VIDEOS.grid],
            second_per_grid_ts=seconds,
        )
        return positions[:, 0]

    def _streams(self, out: Batch, inner: Batch, row_of: list[int], segment_of: list[int]) -> None:
        """The patch streams as the inner batch wrote them (batch order is row order), each
        image's sample mapped to its packed row and segment."""
        for names in (IMAGES, VIDEOS):
            if names.pixels not in inner:
                continue
            extra = (self.keys.second_per_grid_ts, "video_frame_mask") if names is VIDEOS else ()
            for key in (names.pixels, names.grid, names.mask, *extra):
                if key in inner:
                    out[key] = inner[key]
            if names.cu_seqlens in inner:
                out[IMAGE_CU_SEQLENS if names is IMAGES else names.cu_seqlens] = inner[names.cu_seqlens]
            sample = inner[names.rows].tolist()
            out[names.rows] = torch.tensor([row_of[s] for s in sample], dtype=torch.long)
            prefix = "image" if names is IMAGES else "video"
            out[f"{prefix}_segment_ids"] = torch.tensor([segment_of[s] for s in sample], dtype=torch.int32)

    def _mask(self, out: Batch, rows: int) -> None:
        """The dense causal block-diagonal mask (NOTE [ Packed VLM rows ], NOTE [ Dense mask size ])."""
        if self.mask_dtype is None:  # NOTE [ Packed rows into flash-attn ]
            return
        self._warned_mask = warn_mask_size(rows, self.pack_length, self._warned_mask)
        out["attention_mask"] = dense_mask(out["segment_ids"], self.mask_dtype)


def _patches_of(inner: Batch, samples: int) -> list[int]:
    """Each sample's tower patches, images and clips together (``t x h x w`` of each grid)."""
    out = [0] * samples
    for names in (IMAGES, VIDEOS):
        grid = inner.get(names.grid)
        if grid is None or names.rows not in inner:
            continue
        for s, n in zip(inner[names.rows].tolist(), grid.prod(-1).tolist(), strict=True):
            out[s] += int(n)
    return out


def _per_sample(value: object, rows: int, n_real: int) -> object:
    """A value the inner batch keeps one entry a row: its first ``n_real`` (the real samples')."""
    if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == rows:
        return value[:n_real]
    if isinstance(value, list) and len(value) == rows:
        return value[:n_real]
    if isinstance(value, dict):
        return {key: _per_sample(v, rows, n_real) for key, v in value.items()}
    return value
