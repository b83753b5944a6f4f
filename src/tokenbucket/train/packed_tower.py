"""Packed rows for a VLM with a fixed-size tower (LLaVA-1.5, InternVL, Gemma 3, PaliGemma;
Idefics3 / SmolVLM's tiles, NOTE [ Packed tiles by row ]) or whose processor writes
``image_sizes`` (LLaVA-NeXT, LLaVA-OneVision, Mistral 3; NOTE [ Packed sized-image rows ]):
whole samples laid end to end in rows of ``pack_length`` LLM tokens, their images in the
family's own pixel layout.

NOTE [ Packed fixed-tower rows ]
A fixed-tower family's processor resizes every image (LLaVA-1.5) or tile (InternVL: an image's
tiles, then its thumbnail) to the tower's square and writes ``pixel_values`` ``[images, C, side,
side]`` beside ids that hold ``llm_tokens`` placeholders (``config.image_token_id``) an entry, in
order (:meth:`~tokenbucket.models._base.Family.tower_image`). The model runs the tower on each
entry alone and scatters the features into the placeholders in order, batch-wide. So the
batch's images concatenated in row order, beside rows holding the samples' ids in the same
order, give every sample's placeholders its own images. :class:`PackedTowerCollate` lays the
rows as :class:`~tokenbucket.train.packed_modal.PackedModalityCollate` does (NOTE [ Packed VLM
rows ]): ``input_ids``, ``labels`` (NOTE [ Labels in a packed row ]), ``segment_ids``,
``position_ids`` (0, 1, ... restarting per sample: these families' rope is 1-D),
``cu_seqlens`` / ``max_seqlen`` and the causal block-diagonal ``attention_mask``, and beside them
``pixel_values`` ``[images, C, side, side]`` of the rows' samples in row order, with
``image_rows`` / ``image_segment_ids``. transformers (5.24) hands the 4-D mask to every layer's
attention as it is, so ``model(input_ids=..., pixel_values=..., position_ids=..., attention_mask=...)``
computes per sample what the sample alone computes (tests/test_packed_tower.py, against
``LlavaForConditionalGeneration`` and ``InternVLForConditionalGeneration``). Padding-free rows
for flash-attn are taken as NOTE [ Packed rows into flash-attn ] says, with the 1-D positions.

That 4-D mask replaces any sliding window the text model has (Mistral's ``sliding_window``,
``"sliding_attention"`` in ``layer_types``): a window shorter than ``pack_length`` is refused
(one at least ``pack_length`` long never binds in a row, packed or alone); Gemma 3's masks apply
its window within each sample (NOTE [ Gemma 3 packed masks ]).

Each item is checked (NOTE [ Items against their metadata ]): its ids hold its whole sequence
(the breakdown's ``total``) with as many placeholders as its images make and as its metadata's
cameras make (``temporal x spatial`` each), its pixels are the tower's ``[C, side, side]``, and
its own attention mask masks none of it.

NOTE [ Families a packed row refuses ]
A family packs here when its pixels are one fixed square an entry (NOTE [ Packed tiles by
row ] too) or laid by ``image_sizes`` (NOTE [ Packed sized-image rows ]), and its packed rows
can be given, per sample, the attention and positions the sample alone gets. For LLaVA-1.5,
InternVL, LLaVA-NeXT, LLaVA-OneVision, Mistral 3 and Idefics3 / SmolVLM that is one causal
block-diagonal mask and 1-D positions restarting at 0. Gemma 3 and PaliGemma attend otherwise in
training (``token_type_ids``: Gemma 3's image tokens both ways within each image, under a full
and a sliding-window mask; PaliGemma's image and prompt both ways, positions from 1), and their
family builds the rows' masks from the causal block-diagonal one
(:meth:`~tokenbucket.models._base.Family.packed_attention`; NOTE [ Gemma 3 packed masks ], NOTE
[ PaliGemma packed mask ]): the batch's ``attention_mask`` is then Gemma 3's dict keyed by layer
type, which its model takes as it is, or PaliGemma's 4-D mask. Those masks are dense only:
``mask_dtype=None`` (flash-attn varlen, causal within each sample) is refused for them in one
line. The collate refuses the other families in one line, with the reason their family module
gives (:attr:`~tokenbucket.models._base.Family.unpacked_reason`):

* Qwen2-VL, Qwen2.5-VL, Qwen3-VL: their patch stream and 3-D rope are
  :class:`~tokenbucket.train.packed_modal.PackedModalityCollate`'s.
* plain decoders: no tower; :class:`~tokenbucket.train.packing.PackedCollate` packs text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.models import family
from tokenbucket.models._base import Family, PackedAttention, SizedLayout, TowerImage
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.train._cameras import as_mapping
from tokenbucket.train._keys import ItemTemplates, Ragged, check_ragged, collate_keys, to_tensor
from tokenbucket.train._packed_rows import (
    as_mask_dtype,
    check_packed_options,
    dense_mask,
    packed_peak,
    packed_rows,
    warn_mask_size,
)
from tokenbucket.train._patches import describe
from tokenbucket.train._pixel_layouts import (
    IMAGE_SIZES,
    PIXEL_MASK,
    SAMPLE_IMAGES,
    SizedPixels,
    by_row,
    lay_sized,
    read_sized,
)
from tokenbucket.train.batch import Batch, EmptyRow
from tokenbucket.train.modal import ModalityKeys, _vector
from tokenbucket.train.packing import block_diagonal_mask, cu_seqlens_of
from tokenbucket.train.risk import check_planned_model
from tokenbucket.train.sampler import position_of
from tokenbucket.train.shaping import ShapedData

__all__ = ["PackedTowerCollate"]

_RESERVED = ("index", "info", "meta")  # the packed batch's own


@dataclass
class _Sample:
    """One real item, read and checked: its ids (the whole sequence), labels, per-token types
    and images ``[images, C, side, side]`` (or a sized family's, NOTE [ Packed sized-image
    rows ]), their tower patches and image LLM tokens."""

    index: int
    item: Mapping[str, object]
    ids: torch.Tensor
    labels: torch.Tensor | None
    types: dict[str, torch.Tensor]
    pixels: torch.Tensor | None
    sized: SizedPixels | None = None
    patches: int = 0
    image_tokens: int = 0


class PackedTowerCollate:
    """Packs a batch of ``(index, item)`` samples of a fixed-tower VLM into ``rows_per_batch``
    rows of ``pack_length`` LLM tokens (NOTE [ Packed fixed-tower rows ]).

    Items are the family's processor output (``return_tensors="pt"``): ``input_ids`` holding
    the whole sequence (placeholders expanded), ``pixel_values`` ``[images, C, side, side]``
    (absent for a sample without images; a family that writes ``image_sizes``: its processor's
    ``pixel_values`` and ``image_sizes``, NOTE [ Packed sized-image rows ]; Idefics3's ``[1,
    images, C, side, side]`` and ``pixel_attention_mask``), optionally
    ``labels``, ``attention_mask`` and per-token types (``keys.token_types``).

    Returns a :class:`~tokenbucket.train.batch.Batch` holding, for ``R`` rows of ``P`` tokens:

    - ``input_ids``, ``labels`` (NOTE [ Labels in a packed row ]), each of ``keys.token_types``
      the items carry, ``segment_ids`` (int32, 1, 2, ... per sample of a row, 0 on padding),
      ``position_ids`` (0, 1, ... restarting per sample): ``[R, P]``; ``cu_seqlens`` (int32) and
      ``max_seqlen`` over the real tokens in row order; ``attention_mask`` ``[R, 1, P, P]``
      unless ``mask_dtype`` is None (Gemma 3: a dict of two, ``"full_attention"`` and
      ``"sliding_attention"``; PaliGemma's positions start at 1: NOTE [ Families a packed row
      refuses ]).
    - ``pixel_values`` ``[images, C, side, side]`` (every image of every row, in row order;
      absent from a batch without images, such as a rank's padding batch: transformers' towers
      refuse an empty one, so ``model(pixel_values=batch.get("pixel_values"), ...)``),
      ``image_rows`` and ``image_segment_ids`` ``[images]``. A family that writes
      ``image_sizes``: its processor's batch layout instead, ``pixel_values`` with
      ``image_sizes`` ``[images, 2]`` (and OneVision's ``batch_num_images``, a count a sample),
      NOTE [ Packed sized-image rows ]; Idefics3 / SmolVLM: ``pixel_values`` ``[R, most tiles a
      row, C, side, side]`` and ``pixel_attention_mask``, NOTE [ Packed tiles by row ].
    - ``index``: per row, the dataset indices of its samples (``[]`` for an empty row); every
      other key of the items one entry a sample, in the order of ``index`` row after row
      (NOTE [ Every item key reaches the batch ]), and ``meta`` (the metadata's extra columns).
    - ``info``: a :class:`~tokenbucket.train.batch.BatchInfo` of shape ``(R, P)``, its peak
      predicted with ``cost_model`` when given.

    The rows are the sampler's when it chose them (:class:`~tokenbucket.train.packing_2d.PackedBatchSampler2D`,
    NOTE [ Rows through the workers ]), else the batch's samples refilled next-fit under both
    caps; each row is checked against ``pack_length`` and ``row_patches``.

    Args:
        data: the bucketed dataset (a :class:`~tokenbucket.train.collate.TokenBucketDataset`).
        pack_length: LLM tokens per row (a two-cap plan's ``row_tokens``).
        rows_per_batch: rows per batch; ``None``: as many as the batch needs.
        config: the model's transformers config (``LlavaConfig``, ``InternVLConfig``,
            ``LlavaNextConfig``, ``LlavaOnevisionConfig``, ``Mistral3Config``, ``Idefics3Config``,
            ``SmolVLMConfig``, ``Gemma3Config``, ``PaliGemmaConfig``): its family lays the pixels
            and the masks, its ``image_token_id`` marks the placeholders; a family that cannot be
            packed is refused (NOTE [ Families a packed row refuses ]).
        row_patches: tower patches per row (a two-cap plan's ``row_patches``; an image is the
            family's ``patches``); ``None``: not capped.
        mask_dtype: ``torch.bool`` (SDPA), a float dtype (an additive mask, for eager attention)
            or ``None`` (no dense mask: flash-attn varlen, NOTE [ Packed rows into flash-attn ]).
        keys: the item keys to read (:class:`~tokenbucket.train.modal.ModalityKeys`).
        ragged: ``"pad"`` or ``"list"`` for other keys whose tensors differ in shape.
        pad_id, label_pad_id: the padding of ``input_ids`` and ``labels``.
        make_labels: labels from the ids where an item has none.
        cost_model: predicts each batch's peak at ``(R, P)``; a ``StagedPackedModel`` at ``(R, P)``
            and the batch's own patches and image tokens (NOTE [ A packed row's price ]).

    Raises:
        ConfigError: (on construction) a family that cannot be packed, a config without an image
            token or whose sliding window is shorter than ``pack_length`` (Gemma 3's masks apply
            it), ``mask_dtype=None`` for a family that packs under its own masks; (on a call) an item
            that disagrees with its metadata or the tower, a sample longer than ``pack_length``
            or with more patches than ``row_patches``, a row over either cap or more rows than
            ``rows_per_batch``: each in one line naming the sample or row.

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
        config: object,
        row_patches: int | None = None,
        mask_dtype: torch.dtype | None = torch.bool,
        keys: ModalityKeys | None = None,
        ragged: Ragged = "pad",
        pad_id: int = 0,
        label_pad_id: int = -100,
        make_labels: bool = True,
        cost_model: PredictsMemory | StagedPackedModel | None = None,
    ) -> None:
        check_packed_options(pack_length, rows_per_batch, row_patches, mask_dtype)
        self.tower, self.image_token_id, self._family, self.attention = _tower_of(config, pack_length, mask_dtype)
        check_ragged(ragged)
        check_planned_model(data, cost_model)  # NOTE [ A cost model beside its manifest ]
        self.data, self.pack_length, self.rows_per_batch = data, pack_length, rows_per_batch
        self.row_patches, self.mask_dtype, self.cost_model = row_patches, mask_dtype, cost_model
        self.keys = keys if keys is not None else ModalityKeys()
        self.ragged, self.pad_id, self.label_pad_id = ragged, int(pad_id), int(label_pad_id)
        self.make_labels = make_labels
        self._templates = ItemTemplates(data)
        self._warned_mask = False

    def __call__(self, batch: Sequence[tuple[int, object]]) -> Batch:
        samples = [self._read(i, item) for i, item in batch if not isinstance(item, EmptyRow)]
        real = [s.index for s in samples]
        lengths = [int(s.ids.shape[0]) for s in samples]
        patches = [s.patches for s in samples]
        fit = packed_rows(  # NOTE [ Rows through the workers ]
            batch,
            real,
            lengths,
            patches,
            pack_length=self.pack_length,
            rows_per_batch=self.rows_per_batch,
            row_patches=self.row_patches,
            key_of=self.data.key,
        )
        R = self.rows_per_batch if self.rows_per_batch is not None else max(1, len(fit))
        order = [samples[s] for row in fit for s in row]  # row order (the batch's: rows are contiguous)
        out = Batch()
        self._text(out, samples, fit, R)
        if isinstance(self.tower, SizedLayout):  # NOTE [ Packed sized-image rows ]
            out.update(lay_sized(self.tower, [s.sized for s in order], self.keys.pixel_values))
            self._image_places(out, [len(s.sized.images) if s.sized else 0 for s in samples], fit)
        else:
            self._pixels(out, samples, fit)
        if self.mask_dtype is not None:  # NOTE [ Packed rows into flash-attn ]: None, no dense mask
            self._warned_mask = warn_mask_size(R, self.pack_length, self._warned_mask)
            out["attention_mask"] = self._mask(out)
        k = self.keys
        used = {k.input_ids, k.labels, k.attention_mask, k.pixel_values, *k.token_types}
        if isinstance(self.tower, SizedLayout):
            used |= {IMAGE_SIZES, SAMPLE_IMAGES}
        elif self.tower.batched:
            used.add(PIXEL_MASK)
        items = [s.item for s in order]
        if not items:  # a batch of empty rows: the keys and shapes of a real sample
            i, item = self._templates(0)
            items = [as_mapping(i, item, self.data.key(i))]
        # NOTE [ Every item key reaches the batch ]: one entry a sample
        collate_keys(out, items, len(order), len(order), ragged=self.ragged, used=used, reserved=_RESERVED)
        indices = [s.index for s in order]
        out["index"] = [[real[s] for s in row] for row in fit] + [[] for _ in range(R - len(fit))]
        out["meta"] = self.data.metadata_columns(indices)
        image_tokens = sum(s.image_tokens for s in samples)
        peak = packed_peak(self.cost_model, R, self.pack_length, sum(patches), image_tokens)
        info = self.data.batch_info(indices, bucket=0, shape=(R, self.pack_length), predicted_peak_bytes=peak)
        if position_of(batch) is not None:  # NOTE [ Position through the workers ]
            info = dataclasses.replace(info, position=position_of(batch))
        out["info"] = info
        return out

    def _mask(self, out: Batch) -> torch.Tensor | dict[str, torch.Tensor]:
        """The rows' dense mask: causal block-diagonal, or the family's (NOTE [ Families a packed row refuses ])."""
        if self.mask_dtype is None:
            raise AssertionError("a dense mask needs a mask_dtype")
        if self.attention is None:
            return dense_mask(out["segment_ids"], self.mask_dtype)
        causal = block_diagonal_mask(out["segment_ids"], causal=True)
        masks = self.attention.masks(causal, out["segment_ids"], out.get("token_type_ids"))
        if isinstance(masks, dict):
            return {layer: as_mask_dtype(m, self.mask_dtype) for layer, m in masks.items()}
        return as_mask_dtype(masks, self.mask_dtype)

    def _read(self, index: int, item: object) -> _Sample:
        """One item, checked against its metadata and the tower (NOTE [ Packed fixed-tower rows ])."""
        k, tower = self.keys, self.tower
        key = self.data.key(index)
        item = as_mapping(index, item, key)
        where = f"sample {index} (key {key!r}): its"
        if item.get(k.input_ids) is None:
            raise ConfigError(f"{where} item has no {k.input_ids!r}; a packed row is made of the samples' token ids")
        ids = _vector(item[k.input_ids], f"{where} {k.input_ids!r}")
        n, bd = int(ids.shape[0]), self.data.breakdown(index)
        if n != bd.total:
            raise ConfigError(
                f"{where} {k.input_ids!r} hold {n} tokens, but its metadata says total={bd.total}; a packed row needs "
                f"ids that hold the whole sequence (image placeholders expanded), as a processor writes them"
            )
        mask = item.get(k.attention_mask)
        if mask is not None and not bool(_vector(mask, f"{where} {k.attention_mask!r}", n).bool().all()):
            raise ConfigError(
                f"{where} {k.attention_mask!r} masks tokens of its own sequence; a packed row holds whole samples "
                f"(padding has no place in it)"
            )
        labels = item.get(k.labels)
        target = _vector(labels, f"{where} {k.labels!r}", n) if labels is not None else None
        if target is None and self.make_labels:
            target = ids.clone()
        types = {t: _vector(item[t], f"{where} {t!r}", n) for t in k.token_types if item.get(t) is not None}
        held = int(ids.eq(self.image_token_id).sum())
        cameras = sum(cam.temporal * cam.spatial for cam in bd.cameras if not cam.empty_slot)
        if isinstance(tower, SizedLayout):  # NOTE [ Packed sized-image rows ]
            return self._read_sized(tower, index, item, where, ids, target, types, held, cameras)
        pixels = to_tensor(item.get(k.pixel_values), lists=False)
        square = (tower.channels, tower.side, tower.side)
        if pixels is not None and pixels.ndim == 3:
            pixels = pixels[None]
        if tower.batched and pixels is not None and pixels.ndim == 5 and pixels.shape[0] == 1:
            pixels = pixels[0]  # NOTE [ Packed tiles by row ]: the processor's batch of one
            mask = to_tensor(item.get(PIXEL_MASK), lists=False)
            if mask is not None and not bool(mask.bool().all()):
                raise ConfigError(
                    f"{where} {PIXEL_MASK!r} masks pixels of its tiles; a packed row lays whole tiles of the "
                    f"tower's square (NOTE [ Packed tiles by row ])"
                )
        if item.get(k.pixel_values) is not None and (
            pixels is None or pixels.ndim != 4 or tuple(pixels.shape[1:]) != square
        ):
            raise ConfigError(
                f"{where} {k.pixel_values!r} should be [images, {', '.join(map(str, square))}] (the tower's square), "
                f"but got {describe(item.get(k.pixel_values))}"
            )
        images = 0 if pixels is None else int(pixels.shape[0])
        if held != cameras or held != images * tower.llm_tokens:
            raise ConfigError(
                f"{where} {k.input_ids!r} hold {held} image placeholders (image_token_id={self.image_token_id}), but "
                f"its {k.pixel_values!r} hold {images} images of {tower.llm_tokens} tokens ({images * tower.llm_tokens}) "
                f"and its metadata's cameras make {cameras}"
            )
        return _Sample(index, item, ids, target, types, pixels, None, images * tower.patches, held)

    def _read_sized(
        self,
        layout: SizedLayout,
        index: int,
        item: Mapping[str, object],
        where: str,
        ids: torch.Tensor,
        target: torch.Tensor | None,
        types: dict[str, torch.Tensor],
        held: int,
        cameras: int,
    ) -> _Sample:
        """The images of a family that writes ``image_sizes`` (NOTE [ Packed sized-image rows ])."""
        k = self.keys
        if item.get(k.pixel_values_videos) is not None:
            raise ConfigError(
                f"{where} {k.pixel_values_videos!r} hold clips; a packed row lays images only (pass clips unpacked, "
                f"or their frames as images)"
            )
        sized = read_sized(
            layout, self._family.sized_image, item.get(k.pixel_values), item.get(IMAGE_SIZES), where, k.pixel_values
        )
        made = [] if sized is None else sized.made
        places, tokens = sum(m.placeholders for m in made), sum(m.llm_tokens for m in made)
        if held != places or cameras != tokens:
            raise ConfigError(
                f"{where} {k.input_ids!r} hold {held} image placeholders (image_token_id={self.image_token_id}), but "
                f"its {k.pixel_values!r} and {IMAGE_SIZES!r} make {len(made)} images of {places} placeholders in "
                f"{tokens} tokens, and its metadata's cameras make {cameras} tokens"
            )
        patches = sum(m.patches for m in made)
        return _Sample(index, item, ids, target, types, None, sized, patches, tokens)

    def _text(self, out: Batch, samples: list[_Sample], fit: list[list[int]], R: int) -> None:
        """The LLM side of the rows (NOTE [ Packed VLM rows ])."""
        k, P = self.keys, self.pack_length
        dtype = samples[0].ids.dtype if samples else torch.long
        ids = torch.full((R, P), self.pad_id, dtype=dtype)
        with_labels = self.make_labels or any(s.labels is not None for s in samples)
        labels = torch.full((R, P), self.label_pad_id, dtype=dtype) if with_labels else None
        types = {t: torch.zeros((R, P), dtype=s.types[t].dtype) for s in samples for t in s.types}
        segment = torch.zeros(R, P, dtype=torch.int32)
        position = torch.zeros(R, P, dtype=torch.long)
        seqlens: list[int] = []
        first = 0 if self.attention is None else self.attention.first_position
        for r, row in enumerate(fit):
            start = 0
            for seg, s in enumerate(row, start=1):
                sample = samples[s]
                n = int(sample.ids.shape[0])
                span = slice(start, start + n)
                ids[r, span] = sample.ids
                if labels is not None and sample.labels is not None:
                    labels[r, span] = sample.labels
                    labels[r, start] = self.label_pad_id  # NOTE [ Labels in a packed row ]
                for t, value in sample.types.items():
                    types[t][r, span] = value
                segment[r, span] = seg
                position[r, span] = torch.arange(first, first + n)
                seqlens.append(n)
                start += n
        out[k.input_ids] = ids
        if labels is not None:
            out[k.labels] = labels
        out.update(types)
        out["segment_ids"], out["position_ids"] = segment, position
        out["cu_seqlens"], out["max_seqlen"] = cu_seqlens_of(seqlens), max(seqlens, default=0)

    @staticmethod
    def _image_places(out: Batch, images: list[int], fit: list[list[int]]) -> None:
        """Each image's row and segment (``images``: each sample's count), in row order."""
        rows = [r for r, row in enumerate(fit) for s in row for _ in range(images[s])]
        segments = [seg for row in fit for seg, s in enumerate(row, start=1) for _ in range(images[s])]
        out["image_rows"] = torch.tensor(rows, dtype=torch.long)
        out["image_segment_ids"] = torch.tensor(segments, dtype=torch.int32)

    def _pixels(self, out: Batch, samples: list[_Sample], fit: list[list[int]]) -> None:
        """Every image of every row, in row order, with its row and segment."""
        counts = [0 if s.pixels is None else int(s.pixels.shape[0]) for s in samples]
        pixels = [p for row in fit for s in row if counts[s] and (p := samples[s].pixels) is not None]
        self._image_places(out, counts, fit)
        rows = out["image_rows"].tolist()
        dtypes = {p.dtype for p in pixels}
        if len(dtypes) > 1:
            raise ConfigError(f"the batch's {self.keys.pixel_values!r} differ in dtype {sorted(map(str, dtypes))}")
        if pixels and isinstance(self.tower, TowerImage) and self.tower.batched:  # NOTE [ Packed tiles by row ]
            tiles = torch.cat(pixels)
            out[self.keys.pixel_values], out[PIXEL_MASK] = by_row(list(tiles), rows, out[self.keys.input_ids].shape[0])
        elif pixels:  # none: no key (a transformers tower refuses an empty batch of images)
            out[self.keys.pixel_values] = torch.cat(pixels)


def _tower_of(
    config: object, pack_length: int, mask_dtype: torch.dtype | None
) -> tuple[TowerImage | SizedLayout, int, Family, PackedAttention | None]:
    """The family's pixel layout, image token, family and packed attention under ``config`` (a
    transformers config), or a one-line refusal (NOTE [ Families a packed row refuses ], NOTE
    [ Packed fixed-tower rows ], NOTE [ Packed sized-image rows ])."""
    model_type = getattr(config, "model_type", None)
    to_dict = getattr(config, "to_dict", None)
    if not isinstance(model_type, str) or not callable(to_dict):
        raise ConfigError(
            f"config should be the model's transformers config (LlavaConfig, InternVLConfig, ...), but got "
            f"{type(config).__name__}"
        )
    fam = family(model_type)
    if fam.unpacked_reason is not None:
        raise ConfigError(
            f"model_type {model_type!r} cannot be packed by PackedTowerCollate: {fam.unpacked_reason} "
            f"(NOTE [ Families a packed row refuses ])"
        )
    hf = HFConfig(f"<{type(config).__name__}>", to_dict())
    tower = fam.sized_layout(hf) if fam.sized_pixels else fam.tower_image(hf)
    token = getattr(config, "image_token_id", None)
    token = getattr(config, "image_token_index", None) if token is None else token
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ConfigError(f"config (model_type={model_type!r}) has no image_token_id, but got {token!r}")
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    attention = fam.packed_attention(text)
    if attention is not None and mask_dtype is None:
        raise ConfigError(
            f"config (model_type={model_type!r}): its packed rows attend under the family's own masks, which "
            f"cu_seqlens cannot say (a varlen kernel is causal within each sample); pass mask_dtype=torch.bool (SDPA) "
            f"or a float dtype (eager) (NOTE [ Families a packed row refuses ])"
        )
    window = None if attention is not None and attention.windows else _window(text)
    if window is not None and window < pack_length:
        raise ConfigError(
            f"config (model_type={model_type!r}): its text model attends within a sliding window of {window} tokens, "
            f"shorter than pack_length={pack_length}; a packed row's 4-D mask replaces the window "
            f"(NOTE [ Packed fixed-tower rows ])"
        )
    return tower, token, fam, attention


def _window(text: object) -> int | None:
    """The sliding window a text config's layers attend within (``None``: none)."""
    window = getattr(text, "sliding_window", None)
    if window is None:
        return None
    types = getattr(text, "layer_types", None)
    if types is not None:
        return int(window) if "sliding_attention" in types else None
    return None if getattr(text, "use_sliding_window", True) is False else int(window)
