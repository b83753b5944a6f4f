"""A collate that hands a VLA or VLM model what it eats: per-camera frames (stacked, or cut into
patches the Qwen2-VL / NaViT way), video clips (a processor's or cut from frames), padded text
with labels, state and action chunks with masks, and every other key of the items, checked
against each sample's token breakdown.

NOTE [ Items against their metadata ]
The plan sized every batch from the metadata; a sample whose pixels or text disagree with it is
how "impossible" OOMs happen. So the collate refuses, with a one-line
:class:`~tokenbucket._exceptions.ConfigError` naming the sample (index and key) and the item key:
a camera count other than the metadata's (empty camera slots of ``camera_slots`` are not
expected in the item), a frame count other than the camera's ``frames``, pixels that give
another spatial token count than the breakdown's, a patch count other than the breakdown's
vision tokens before merge (``temporal x spatial x merge²`` per camera), and text whose length
is neither the breakdown's ``text`` nor its ``total`` (a processor that expands the image
placeholders into ``input_ids`` gives the total). Given ``image_token_id`` / ``video_token_id``,
ids that hold the total must hold one placeholder per image / video token of the breakdown
(``Σ t·h·w / merge²`` of the sample's image / video grids, which the patch check ties to it);
pooled video frames are not counted (their tokens follow the family's pooling).

Pixels are compared as the model sees them: an image at the metadata's ``height x width`` is
raw (the model's ``resize`` turns it into the breakdown's tokens); an image of any other size is
taken as already resized and must give the breakdown's spatial tokens as it is (``ceil(H/p)`` x
``ceil(W/p)`` patches, merged ``merge x merge``). The patches layout cuts pixels as they are, so
there ``H`` and ``W`` must be multiples of the patch (and the patch grid of the merge). The
camera side (stacked frames, patch streams, clips: NOTE [ Clips in the batch ]) is
:mod:`tokenbucket.train._cameras`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.train._cameras import CameraCollate, Row, as_mapping
from tokenbucket.train._keys import ItemTemplates, Ragged, check_ragged, collate_keys, to_tensor
from tokenbucket.train._patches import describe
from tokenbucket.train.batch import Batch, EmptyRow, pad_rows
from tokenbucket.train.risk import PredictsMemory2D
from tokenbucket.train.sampler import position_of
from tokenbucket.train.shaping import BatchShape, ShapedData

__all__ = ["ModalityCollate", "ModalityKeys"]

Layout = Literal["stacked", "patches"]
LAYOUTS: tuple[str, ...] = ("stacked", "patches")
_RESERVED = ("index", "row_mask", "info", "meta")  # filled below the modalities, after the other keys


@dataclass(frozen=True, kw_only=True)
class ModalityKeys:
    """The item keys :class:`ModalityCollate` reads (LeRobot and Qwen2-VL names by default).

    Args:
        images: ``fnmatch`` patterns of the per-camera frame keys (``[T, C, H, W]``, or
            ``[C, H, W]`` for one frame), in LeRobot's names.
        pixel_values, grid_thw: a processor's flattened patches ``[patches, C·t·p·p]`` and their
            per-image ``(t, h, w)`` grid ``[images, 3]`` (Qwen2-VL's names).
        pixel_values_videos, video_grid_thw, second_per_grid_ts: a processor's video clips: the
            same for clips (``[patches, C·t·p·p]`` and ``[videos, 3]``) and the seconds per
            temporal patch ``[videos]`` (Qwen2.5-VL); or pooled frames ``[videos, frames, C, H, W]``
            (LLaVA-OneVision), NOTE [ Clips in the batch ].
        input_ids, labels, attention_mask: the text and its targets; a processor's attention
            mask is read and combined with the padding.
        token_types: per-token ids beside ``input_ids`` (``mm_token_type_ids``: Qwen2-VL's M-RoPE
            reads them; Gemma 3's ``token_type_ids``), padded with 0 like the ids.
        state, action: the proprio vector ``[S]`` (or ``[T, S]``) and the action chunk
            ``[chunk, A]`` (or ``[A]``).
    """

    images: tuple[str, ...] = ("observation.image", "observation.images.*")
    pixel_values: str = "pixel_values"
    grid_thw: str = "image_grid_thw"
    pixel_values_videos: str = "pixel_values_videos"
    video_grid_thw: str = "video_grid_thw"
    second_per_grid_ts: str = "second_per_grid_ts"
    input_ids: str = "input_ids"
    labels: str = "labels"
    attention_mask: str = "attention_mask"
    token_types: tuple[str, ...] = ("mm_token_type_ids", "token_type_ids")
    state: str = "observation.state"
    action: str = "action"

    def __post_init__(self) -> None:
        for name in ("images", "token_types"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, (getattr(self, name),))

    def is_image(self, key: str) -> bool:
        return any(fnmatchcase(key, pattern) for pattern in self.images)


class ModalityCollate:
    """Collates ``(index, item)`` batches of raw multimodal items to the bucket's shape.

    The bucket decides the rows (a static plan: the bucket's ``batch_size``, empty rows padded
    after the real ones; a dynamic one: the batch's rows), ``info.shape`` and the predicted peak,
    and the text length where ``input_ids`` carry the whole sequence (static: the bucket's bound).
    Cameras, frames, pixels, chunks and shorter texts pad to the batch's largest.

    Returns a :class:`~tokenbucket.train.batch.Batch` (a dict with ``.to``) holding:

    - ``layout="stacked"``: ``pixel_values`` ``[B, cameras, T, C, H, W]`` (zero padded; cameras in
      breakdown order, empty camera slots included and masked), ``camera_mask`` ``[B, cameras]``,
      ``frame_mask`` ``[B, cameras, T]``, ``image_sizes`` ``[B, cameras, 2]`` (each image's real
      ``H, W``), ``camera_keys`` (per row, the item key of each camera).
    - ``layout="patches"`` (and any item already in processor form): ``pixel_values``
      ``[N, C·t·p·p]`` (p, t: the camera spec's ``patch`` and ``tubelet``; Qwen2-VL's patch order,
      merge windows together), ``image_grid_thw`` ``[images, 3]`` (in patches),
      ``cu_seqlens`` int32 ``[images + 1]`` (per image; Qwen2-VL derives its per-frame windows
      from the grid), ``image_rows`` ``[images]`` (each image's row), ``camera_keys``. A 2D
      static bucket pads ``pixel_values`` with zero rows to ``rows x vision_bound x merge²``
      and adds ``patch_mask`` bool ``[N]`` (True on the real patches, which come first);
      ``image_grid_thw``, ``cu_seqlens`` and ``image_rows`` keep describing the real images
      only (NOTE [ Patch stream of a 2D bucket ]). The stacked layout pads to the batch's
      largest, in a 2D plan too.
    - video clips (cameras the spec feeds as clips, in processor form or cut by the patches
      layout): ``pixel_values_videos`` ``[N, C·t·p·p]``, ``video_grid_thw`` ``[videos, 3]``,
      ``video_cu_seqlens``, ``video_rows`` (``video_patch_mask`` in a 2D static bucket) and
      ``second_per_grid_ts`` ``[videos]`` where the items carry it; pooled frames
      ``pixel_values_videos`` ``[videos, frames, C, H, W]`` with ``video_frame_mask`` and
      ``video_rows`` (NOTE [ Clips in the batch ]).
    - ``input_ids`` ``[B, L]`` (``pad_id``), ``attention_mask`` ``[B, L]``, ``labels`` ``[B, L]``
      (``label_pad_id``; the ids where the item has no labels and ``make_labels``), and each
      of ``keys.token_types`` the items carry ``[B, L]`` (0 on padding).
    - the state key stacked (``<key>_mask`` where its first dim is ragged) and the action key
      ``[B, chunk, A]`` with ``action_mask`` ``[B, chunk]`` (``[B, A]`` and ``[B]`` for ``[A]``).
    - every other key, as :class:`~tokenbucket.train.collate.BucketCollate` keeps them (NOTE
      [ Every item key reaches the batch ]): equal-shape tensors stacked ``[B, ...]``, ragged ones
      padded with a ``<key>_mask`` (``ragged="pad"``) or a list (``ragged="list"``); strings,
      numbers and other objects as lists (``None`` on empty rows). No key is dropped: one that
      the collate fills itself (LeRobot's frame ``index``) is kept as ``item.<key>``.
    - ``index`` ``[B]`` (-1 on empty rows), ``row_mask`` ``[B]`` and ``info``
      (:class:`~tokenbucket.train.batch.BatchInfo`).

    Every item is checked against its breakdown: NOTE [ Items against their metadata ].

    Args:
        data: the bucketed dataset (a :class:`~tokenbucket.train.collate.TokenBucketDataset`).
        layout: ``"stacked"`` or ``"patches"``.
        keys: the item keys to read (:class:`ModalityKeys`).
        ragged: ``"pad"`` or ``"list"`` for other keys whose tensors differ in shape.
        pad_id, label_pad_id: the padding of ``input_ids`` and ``labels``.
        make_labels: labels from the ids where an item has none.
        image_token_id, video_token_id: the model's image / video placeholder ids (Qwen2-VL's
            ``config.image_token_id`` / ``video_token_id``); given, the placeholders of ids
            that hold the whole sequence are counted against the breakdown.
        cost_model, risk_threshold, on_risk: as :class:`~tokenbucket.train.collate.BucketCollate`.
    """

    def __init__(
        self,
        data: ShapedData,
        *,
        layout: Layout = "stacked",
        keys: ModalityKeys | None = None,
        ragged: Ragged = "pad",
        pad_id: int = 0,
        label_pad_id: int = -100,
        make_labels: bool = True,
        image_token_id: int | None = None,
        video_token_id: int | None = None,
        cost_model: PredictsMemory | PredictsMemory2D | None = None,
        risk_threshold: float = 1.0,
        on_risk: str = "warn",
    ) -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"layout should be one of {list(LAYOUTS)}, but got layout={layout!r}")
        check_ragged(ragged)
        for name, value in (("image_token_id", image_token_id), ("video_token_id", video_token_id)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name} should be None or a non-negative integer, but got {name}={value!r}")
        self.data, self.layout, self.ragged = data, layout, ragged
        self.keys = keys if keys is not None else ModalityKeys()
        self.pad_id, self.label_pad_id, self.make_labels = int(pad_id), int(label_pad_id), make_labels
        self.image_token_id, self.video_token_id = image_token_id, video_token_id
        self.shape = BatchShape(data, cost_model=cost_model, risk_threshold=risk_threshold, on_risk=on_risk)
        self._templates = ItemTemplates(data)
        self._cameras = CameraCollate(data, self.keys, layout)
        if layout == "patches" and data.plan.mode == "static" and data.plan.two_d:
            self._cameras.merge()  # NOTE [ Patch stream of a 2D bucket ]: one merge, checked now

    def __call__(self, batch: Sequence[tuple[int, object]]) -> Batch:
        data = self.data
        bucket = self.shape.bucket_of(batch)
        real = [(i, item) for i, item in batch if not isinstance(item, EmptyRow)]
        idx = [i for i, _ in real]
        longest = int(data.lengths[idx].max()) if idx else 0
        rows, length = self.shape.rows_and_length(bucket, len(batch), longest)
        # a batch of empty rows only: shapes and dtypes come from a real sample of the bucket
        parsed = [self._cameras.row(i, item) for i, item in real] or [self._cameras.row(*self._template(bucket))]
        n_real = len(real)
        out = Batch()
        used = self._cameras(out, parsed, n_real, rows, bucket)
        used |= self._text(out, parsed, n_real, rows, length)
        used |= self._state_action(out, parsed, n_real, rows)
        # NOTE [ Every item key reaches the batch ]
        items = [r.item for r in parsed]
        collate_keys(out, items, n_real, rows, ragged=self.ragged, used=used, reserved=_RESERVED)
        index = torch.full((rows,), -1, dtype=torch.long)
        index[:n_real] = torch.tensor(idx, dtype=torch.long)
        out["index"] = index
        out["row_mask"] = index >= 0
        # the metadata's own extra columns (a label, a uid: NOTE [ Extra metadata columns ])
        out["meta"] = data.metadata_columns(idx, rows)
        out["info"] = self.shape.info(idx, bucket, rows, length, position_of(batch))
        return out

    # -- rows ----------------------------------------------------------------------------------

    def _template(self, bucket: int) -> tuple[int, Mapping[str, object]]:
        """A real sample of ``bucket`` (else of any bucket), read once per bucket."""
        i, item = self._templates(bucket)
        return i, as_mapping(i, item, self.data.key(i))

    def _text(self, out: Batch, parsed: list[Row], n_real: int, rows: int, length: int) -> set[str]:
        k = self.keys
        if not any(k.input_ids in r.item for r in parsed):
            return set()
        types = [key for key in k.token_types if any(key in r.item for r in parsed)]
        ids, labels, masks, full = [], [], [], True
        aligned: dict[str, list[torch.Tensor]] = {key: [] for key in types}
        for row in parsed:
            where = f"sample {row.index} (key {self.data.key(row.index)!r}): its"
            x = _vector(row.item.get(k.input_ids), f"{where} {k.input_ids!r}")
            if x.shape[0] not in (row.bd.text, row.bd.total):
                raise ConfigError(
                    f"{where} {k.input_ids!r} holds {x.shape[0]} tokens, but its metadata says "
                    f"text={row.bd.text} (total {row.bd.total})"
                )
            full &= x.shape[0] == row.bd.total
            if x.shape[0] == row.bd.total:
                self._check_placeholders(row, x, where)
            ids.append(x)
            y = row.item.get(k.labels)
            labels.append(_vector(y, f"{where} {k.labels!r}", x.shape[0]) if y is not None else None)
            a = row.item.get(k.attention_mask)
            masks.append(_vector(a, f"{where} {k.attention_mask!r}", x.shape[0]) if a is not None else None)
            for key in types:
                v = row.item.get(key)
                aligned[key].append(
                    _vector(v, f"{where} {key!r}", x.shape[0]) if v is not None else torch.zeros_like(x)
                )
        static = self.data.plan.mode == "static"
        text_len = length if static and full else max(x.shape[0] for x in ids)
        if text_len < max(x.shape[0] for x in ids):
            raise AssertionError("a text longer than its bucket's bound passed the breakdown check")
        real_ids = ids[:n_real]
        pos = list(range(n_real))
        out[k.input_ids], attention, _, _ = pad_rows(real_ids, pos, rows, text_len, ids[0], self.pad_id)
        for r, m in enumerate(masks[:n_real]):
            if m is not None:
                attention[r, : m.shape[0]] &= m.bool()
        out[k.attention_mask] = attention
        if self.make_labels or any(y is not None for y in labels):
            targets = [y if y is not None else x for x, y in zip(real_ids, labels, strict=False)]
            out[k.labels], _, _, _ = pad_rows(targets, pos, rows, text_len, ids[0], self.label_pad_id)
        for key, values in aligned.items():
            out[key], _, _, _ = pad_rows(values[:n_real], pos, rows, text_len, values[0])
        return {k.input_ids, k.labels, k.attention_mask, *types}

    def _check_placeholders(self, row: Row, ids: torch.Tensor, where: str) -> None:
        """Ids holding the whole sequence hold one placeholder per image / clip token of the
        breakdown (NOTE [ Items against their metadata ])."""
        for token, clip in ((self.image_token_id, False), (self.video_token_id, True)):
            want = row.placeholders(clip) if token is not None else None
            if token is None or want is None:
                continue
            got = int(ids.eq(token).sum())
            if got != want:
                what = "clips" if clip else "image cameras"
                cams = [row.bd.cameras[j].name for j, _ in row.cameras if (j in row.clips) == clip]
                grid = self.keys.video_grid_thw if clip else self.keys.grid_thw
                raise ConfigError(
                    f"{where} {self.keys.input_ids!r} hold {got} {'video' if clip else 'image'} placeholders "
                    f"({'video' if clip else 'image'}_token_id={token}), but its metadata's {what} {cams} make {want} "
                    f"tokens (Σ t·h·w / merge² of the {grid!r} rows)"
                )

    def _state_action(self, out: Batch, parsed: list[Row], n_real: int, rows: int) -> set[str]:
        used = set()
        for key in (self.keys.state, self.keys.action):
            if not any(key in r.item for r in parsed):
                continue
            values = []
            for row in parsed[:n_real]:
                x = to_tensor(row.item.get(key))
                if x is None or x.ndim not in (1, 2):
                    raise ConfigError(
                        f"sample {row.index} (key {self.data.key(row.index)!r}): its {key!r} should be "
                        f"[{'chunk, ' if key == self.keys.action else 'T, '}D] or [D], but got {describe(row.item.get(key))}"
                    )
                values.append(x)
            ref = values[0] if values else to_tensor(parsed[0].item[key])
            if ref is None:
                raise AssertionError(f"the template's {key!r} passed as a tensor")
            if len({v.shape[1:] for v in values}) > 1:
                raise ConfigError(f"the batch's {key!r} differ in width {sorted({tuple(v.shape) for v in values})}")
            chunk = max((v.shape[0] for v in values), default=ref.shape[0])
            ragged = any(v.shape[0] != chunk for v in values)
            out[key], mask, row_mask, _ = pad_rows(values, range(n_real), rows, chunk, ref)
            if ref.ndim == 2 and (key == self.keys.action or ragged):
                out[f"{key}_mask"] = mask
            elif key == self.keys.action:
                out[f"{key}_mask"] = row_mask
            used.add(key)
        return used


def _vector(value: object, where: str, length: int | None = None) -> torch.Tensor:
    x = to_tensor(value)
    if x is not None and x.ndim == 2 and x.shape[0] == 1:  # a processor's [1, L]
        x = x[0]
    if x is None or x.ndim != 1:
        raise ConfigError(f"{where} should be [L] (or [1, L]), but got {describe(value)}")
    if length is not None and x.shape[0] != length:
        raise ConfigError(f"{where} holds {x.shape[0]} tokens, but the input ids hold {length}")
    return x
