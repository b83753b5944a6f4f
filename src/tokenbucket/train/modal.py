"""A collate that hands a VLA or VLM model what it eats: per-camera frames (stacked, or cut into
patches the Qwen2-VL / NaViT way), padded text with labels, state and action chunks with masks,
and every other key of the items, checked against each sample's token breakdown.

NOTE [ Items against their metadata ]
The plan sized every batch from the metadata; a sample whose pixels or text disagree with it is
how "impossible" OOMs happen. So the collate refuses, with a one-line
:class:`~tokenbucket._exceptions.ConfigError` naming the sample (index and key) and the item key:
a camera count other than the metadata's (empty camera slots of ``camera_slots`` are not
expected in the item), a frame count other than the camera's ``frames``, pixels that give
another spatial token count than the breakdown's, a patch count other than the breakdown's
vision tokens before merge (``temporal x spatial x merge²`` per camera), and text whose length
is neither the breakdown's ``text`` nor its ``total`` (a processor that expands the image
placeholders into ``input_ids`` gives the total).

Pixels are compared as the model sees them: an image at the metadata's ``height x width`` is
raw (the model's ``resize`` turns it into the breakdown's tokens); an image of any other size is
taken as already resized and must give the breakdown's spatial tokens as it is (``ceil(H/p)`` x
``ceil(W/p)`` patches, merged ``merge x merge``). The patches layout cuts pixels as they are, so
there ``H`` and ``W`` must be multiples of the patch (and the patch grid of the merge).

NOTE [ Patch stream of a 2D bucket ]
A 2D bucket bounds each sample's image tokens by ``vision_bound``
(NOTE [ Two-dimensional buckets ]), and each image token is ``merge²`` patches, so a static
batch of ``rows`` rows holds at most ``rows x vision_bound x merge²`` patches (special tokens
count as image tokens but have no patches; empty rows have none). The patches layout pads ``pixel_values`` with zero rows to
that bound, so every batch of a bucket hands the tower one shape, as ``(rows, bound)`` does the
LLM; ``patch_mask`` marks the real patches, which come first. ``image_grid_thw``,
``cu_seqlens`` and ``image_rows`` describe the real images only (a model that derives positions
from the grid takes ``pixel_values[patch_mask]``). The bound needs one merge for every camera,
and a row holding more patches than ``vision_bound x merge²`` means its metadata disagrees with
its pixels: both are refused. A batch of a bucket with ``vision_bound > 0`` that holds no image
gets the padded stream too (its width from an image of the bucket). 1D and dynamic plans, and
the stacked layout (padded to the batch's largest), are not padded this way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

import numpy as np
import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.tokens.breakdown import CameraTokens, TokenBreakdown
from tokenbucket.tokens.spec import CameraSpec
from tokenbucket.train._keys import ItemTemplates, Ragged, check_ragged, collate_keys, to_tensor
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
        input_ids, labels, attention_mask: the text and its targets; a processor's attention
            mask is read and combined with the padding.
        state, action: the proprio vector ``[S]`` (or ``[T, S]``) and the action chunk
            ``[chunk, A]`` (or ``[A]``).
    """

    images: tuple[str, ...] = ("observation.image", "observation.images.*")
    pixel_values: str = "pixel_values"
    grid_thw: str = "image_grid_thw"
    input_ids: str = "input_ids"
    labels: str = "labels"
    attention_mask: str = "attention_mask"
    state: str = "observation.state"
    action: str = "action"

    def __post_init__(self) -> None:
        if isinstance(self.images, str):
            object.__setattr__(self, "images", (self.images,))

    def is_image(self, key: str) -> bool:
        return any(fnmatchcase(key, pattern) for pattern in self.images)


@dataclass
class _Row:
    """One real row: its index, item, breakdown and matched cameras ``(breakdown position, key)``."""

    index: int
    item: Mapping[str, object]
    bd: TokenBreakdown
    cameras: list[tuple[int, str]]


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
    - ``input_ids`` ``[B, L]`` (``pad_id``), ``attention_mask`` ``[B, L]``, ``labels`` ``[B, L]``
      (``label_pad_id``; the ids where the item has no labels and ``make_labels``).
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
        cost_model: PredictsMemory | PredictsMemory2D | None = None,
        risk_threshold: float = 1.0,
        on_risk: str = "warn",
    ) -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"layout should be one of {list(LAYOUTS)}, but got layout={layout!r}")
        check_ragged(ragged)
        self.data, self.layout, self.ragged = data, layout, ragged
        self.keys = keys if keys is not None else ModalityKeys()
        self.pad_id, self.label_pad_id, self.make_labels = int(pad_id), int(label_pad_id), make_labels
        self.shape = BatchShape(data, cost_model=cost_model, risk_threshold=risk_threshold, on_risk=on_risk)
        self._templates = ItemTemplates(data)
        self._image_templates: dict[int, tuple[int, Mapping[str, object]] | None] = {}
        if layout == "patches" and data.plan.mode == "static" and data.plan.two_d:
            self._merge()  # NOTE [ Patch stream of a 2D bucket ]: one merge, checked now

    def __call__(self, batch: Sequence[tuple[int, object]]) -> Batch:
        data = self.data
        bucket = self.shape.bucket_of(batch)
        real = [(i, item) for i, item in batch if not isinstance(item, EmptyRow)]
        idx = [i for i, _ in real]
        longest = int(data.lengths[idx].max()) if idx else 0
        rows, length = self.shape.rows_and_length(bucket, len(batch), longest)
        # a batch of empty rows only: shapes and dtypes come from a real sample of the bucket
        parsed = [self._row(i, item) for i, item in real] or [self._row(*self._template(bucket))]
        n_real = len(real)
        out = Batch()
        used = self._vision(out, parsed, n_real, rows, bucket)
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
        return i, _mapping(i, item, self.data.key(i))

    def _image_template(self, bucket: int) -> tuple[int, Mapping[str, object]] | None:
        """A real sample of ``bucket`` with an image (None if it has none), read once per bucket."""
        if bucket not in self._image_templates:
            found = None
            for i in np.flatnonzero(self.data.buckets == bucket).tolist():
                if any(not cam.empty_slot for cam in self.data.breakdown(i).cameras):
                    _, item = self.data[i]
                    found = (i, _mapping(i, item, self.data.key(i)))
                    break
            self._image_templates[bucket] = found
        return self._image_templates[bucket]

    def _merge(self) -> int:
        """The one merge of every camera, which a 2D bucket's patch bound needs."""
        spec = self.data.spec
        merges = {name: spec.camera_spec(name).merge for name in spec.overrides}
        other = {name: m for name, m in merges.items() if m != spec.merge}
        if other:
            name, m = next(iter(other.items()))
            raise ConfigError(
                f"2D patch padding needs one merge for every camera (NOTE [ Patch stream of a 2D bucket ]), "
                f"but the spec merges {spec.merge} and overrides[{name!r}] merges {m}; use one merge, or layout='stacked'"
            )
        return spec.merge

    def _patch_bound(self, bucket: int, rows: int) -> tuple[int, int] | None:
        """``(vision_bound, patches)`` a 2D static bucket's patch stream is padded to, else None."""
        plan = self.data.plan
        vision = plan.buckets[bucket].vision_bound
        if plan.mode != "static" or vision is None:
            return None
        return vision, rows * vision * self._merge() ** 2

    def _row(self, index: int, item: object) -> _Row:
        key = self.data.key(index)
        item = _mapping(index, item, key)
        bd = self.data.breakdown(index)
        real = [j for j, cam in enumerate(bd.cameras) if not cam.empty_slot]
        if self.keys.pixel_values in item:
            grid = to_tensor(item.get(self.keys.grid_thw))
            n_images = 0 if grid is None else (grid.shape[0] if grid.ndim == 2 else -1)
            if grid is None or n_images < 0:
                raise ConfigError(
                    f"sample {index} (key {key!r}): its {self.keys.pixel_values!r} needs "
                    f"{self.keys.grid_thw!r} [images, 3] beside it, but got {_describe(item.get(self.keys.grid_thw))}"
                )
            _check_count(index, key, bd, real, [f"{self.keys.grid_thw}[{k}]" for k in range(n_images)])
            return _Row(index, item, bd, [(j, self.keys.pixel_values) for j in real])
        image_keys = [k for k in item if self.keys.is_image(k) and _is_image(item[k])]
        _check_count(index, key, bd, real, image_keys)
        names = {bd.cameras[j].name: j for j in real}
        if all(k in names for k in image_keys):  # the metadata names the cameras by their item keys
            cameras = sorted(((names[k], k) for k in image_keys), key=lambda c: c[0])
        else:  # by position: the item's image keys in order, the metadata's cameras in order
            cameras = list(zip(real, image_keys, strict=True))
        return _Row(index, item, bd, cameras)

    # -- vision --------------------------------------------------------------------------------

    def _vision(self, out: Batch, parsed: list[_Row], n_real: int, rows: int, bucket: int) -> set[str]:
        used = {k for r in parsed for _, k in r.cameras}
        plan = self.data.plan
        if not used and plan.mode == "static" and plan.buckets[bucket].vision_bound:
            # NOTE [ Patch stream of a 2D bucket ]: no image here, but the bucket's shape has patches
            found = self._image_template(bucket)
            template = self._row(*found) if found is not None else None
            if template is not None and (self.layout == "patches" or self.keys.pixel_values in template.item):
                self._patches(out, [*parsed, template], n_real, rows, bucket)
                return set()
        if not used:  # no camera in the batch: nothing to read
            return set()
        qwen = any(self.keys.pixel_values in r.item for r in parsed)
        if qwen:
            used.add(self.keys.grid_thw)
        if self.layout == "patches" or qwen:
            self._patches(out, parsed, n_real, rows, bucket)
        else:
            self._stacked(out, parsed, n_real, rows)
        return used

    def _frames(self, row: _Row, j: int, key: str) -> tuple[torch.Tensor, CameraTokens, CameraSpec]:
        """Camera ``j``'s frames ``[T, C, H, W]``, checked against its breakdown."""
        cam = row.bd.cameras[j]
        cs = self.data.spec.camera_spec(cam.name)
        x = to_tensor(row.item[key])
        where = f"sample {row.index} (key {self.data.key(row.index)!r}): its {key!r}"
        if x is None or x.ndim not in (3, 4):
            raise ConfigError(
                f"{where} should be a [T, C, H, W] or [C, H, W] tensor, but got {_describe(row.item[key])}"
            )
        if x.ndim == 3:
            x = x.unsqueeze(0)
        t, _, h, w = x.shape
        if t != cam.frames:
            raise ConfigError(f"{where} holds {t} frames {tuple(x.shape)}, but its metadata says frames={cam.frames}")
        if cs.tokens_per_frame is None and (h, w) != (cam.height, cam.width):
            got = _ceil(_ceil(h, cs.patch), cs.merge) * _ceil(_ceil(w, cs.patch), cs.merge)
            if got != cam.spatial:
                raise ConfigError(
                    f"{where} is {h}x{w} pixels {tuple(x.shape)}, but its metadata says {cam.height}x{cam.width} "
                    f"({cam.spatial} tokens a frame after resize={cs.resize!r}); as already-resized pixels "
                    f"it makes {got} tokens a frame (patch {cs.patch}, merge {cs.merge})"
                )
        return x, cam, cs

    def _stacked(self, out: Batch, parsed: list[_Row], n_real: int, rows: int) -> None:
        frames = [[(j, k, self._frames(r, j, k)[0]) for j, k in r.cameras] for r in parsed]
        all_x = [x for row in frames for _, _, x in row]
        ref = all_x[0]
        cams = max(len(r.bd.cameras) for r in parsed)
        t_max = max(x.shape[0] for x in all_x)
        channels = {x.shape[1] for x in all_x}
        if len(channels) > 1:
            raise ConfigError(f"the batch's images differ in channels {sorted(channels)}: stacking needs one")
        h_max, w_max = max(x.shape[2] for x in all_x), max(x.shape[3] for x in all_x)
        shape = (rows, cams, t_max, ref.shape[1], h_max, w_max)
        full = n_real == rows and all(
            len(r.cameras) == cams and all(x.shape == ref.shape for _, _, x in fr)
            for r, fr in zip(parsed, frames, strict=True)
        )
        pixels = torch.empty(shape, dtype=ref.dtype) if full else torch.zeros(shape, dtype=ref.dtype)
        camera_mask = torch.zeros(rows, cams, dtype=torch.bool)
        frame_mask = torch.zeros(rows, cams, t_max, dtype=torch.bool)
        sizes = torch.zeros(rows, cams, 2, dtype=torch.long)
        camera_keys: list[list[str | None]] = [[] for _ in range(rows)]
        for r, row in enumerate(frames[:n_real]):
            names: list[str | None] = [None] * len(parsed[r].bd.cameras)
            for j, k, x in row:
                t, _, h, w = x.shape
                pixels[r, j, :t, :, :h, :w] = x
                camera_mask[r, j] = True
                frame_mask[r, j, :t] = True
                sizes[r, j, 0], sizes[r, j, 1] = h, w
                names[j] = k
            camera_keys[r] = names
        out["pixel_values"], out["camera_mask"], out["frame_mask"] = pixels, camera_mask, frame_mask
        out["image_sizes"], out["camera_keys"] = sizes, camera_keys

    def _patches(self, out: Batch, parsed: list[_Row], n_real: int, rows: int, bucket: int) -> None:
        images: list[_Image] = []
        for r, row in enumerate(parsed):
            if self.keys.pixel_values in row.item:
                images += [_Image(r, *p) for p in self._processor_images(row)]
            else:
                for j, k in row.cameras:
                    x, cam, cs = self._frames(row, j, k)
                    images.append(_Image(r, k, x, None, self._grid(row, k, x, cam, cs), cs))
        widths = {im.width for im in images}
        if len(widths) > 1:
            raise ConfigError(f"the batch's patches differ in width {sorted(widths)} (C·t·p·p): one encoder takes one")
        real = [im for im in images if im.row < n_real]
        counts = [im.grid[0] * im.grid[1] * im.grid[2] for im in real]
        total = sum(counts)
        bound = self._patch_bound(bucket, rows)  # NOTE [ Patch stream of a 2D bucket ]
        if bound is not None:
            self._check_row_patches(parsed, real, counts, bucket, bound[0])
        size = total if bound is None else bound[1]
        pixels = torch.empty(size, widths.pop() if widths else 0, dtype=images[0].dtype if images else None)
        pixels[total:] = 0
        start = 0
        for im, n in zip(real, counts, strict=True):
            if im.patches is not None:
                pixels[start : start + n] = im.patches
            elif im.frames is not None:
                _cut(im.frames, pixels[start : start + n], *im.grid, im.cs)
            start += n
        cu = torch.zeros(len(real) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(counts, dtype=torch.int64).cumsum(0)
        camera_keys: list[list[str]] = [[] for _ in range(rows)]
        for im in real:
            camera_keys[im.row].append(im.key)
        out["pixel_values"] = pixels
        if bound is not None:
            out["patch_mask"] = torch.arange(size) < total
        out["image_grid_thw"] = torch.tensor([im.grid for im in real], dtype=torch.long).reshape(-1, 3)
        out["cu_seqlens"] = cu
        out["image_rows"] = torch.tensor([im.row for im in real], dtype=torch.long)
        out["camera_keys"] = camera_keys

    def _check_row_patches(
        self, parsed: list[_Row], real: list[_Image], counts: list[int], bucket: int, vision: int
    ) -> None:
        """Every row within its bucket's ``vision_bound x merge²`` patches (NOTE [ Patch stream of a 2D bucket ])."""
        per_row: dict[int, int] = {}
        for im, n in zip(real, counts, strict=True):
            per_row[im.row] = per_row.get(im.row, 0) + n
        merge = self._merge()
        limit = vision * merge**2
        over = [r for r, n in per_row.items() if n > limit]
        if over:
            named = ", ".join(
                f"sample {parsed[r].index} (key {self.data.key(parsed[r].index)!r}, {per_row[r]} patches)" for r in over
            )
            raise ConfigError(
                f"bucket {bucket} pads its patch stream to {limit} patches a row ({vision} image tokens x merge "
                f"{merge}²), but {named} holds more: the plan's bound and the metadata disagree (a plan made from "
                f"other metadata?)"
            )

    def _grid(self, row: _Row, key: str, x: torch.Tensor, cam: CameraTokens, cs: CameraSpec) -> tuple[int, int, int]:
        """The ``(t, h, w)`` patch grid of frames ``x``; its patch count must be the breakdown's."""
        where = f"sample {row.index} (key {self.data.key(row.index)!r}): its {key!r}"
        if cs.tokens_per_frame is not None or cs.causal_first_frame:
            raise ConfigError(
                f"{where}: camera {cam.name!r} is tokenised by a resampler or a causal video tokenizer, "
                f"which the patches layout cannot cut; use layout='stacked'"
            )
        t, _, h, w = x.shape
        p, m = cs.patch, cs.merge
        if h % (p * m) or w % (p * m):
            raise ConfigError(
                f"{where} is {h}x{w} pixels, not a multiple of patch x merge = {p}x{m}: the patches layout cuts "
                f"pixels as they are (resize them first, or use layout='stacked')"
            )
        grid = (_ceil(t, cs.tubelet), h // p, w // p)
        _check_patches(where, grid, cam, cs)
        return grid

    def _processor_images(self, row: _Row) -> list[tuple[str, None, torch.Tensor, tuple[int, int, int], CameraSpec]]:
        """A processor-form item's images ``(key, None, patches, grid, spec)``, checked."""
        k = self.keys
        where = f"sample {row.index} (key {self.data.key(row.index)!r})"
        pv = to_tensor(row.item[k.pixel_values])
        grid = to_tensor(row.item[k.grid_thw])
        if pv is None or pv.ndim != 2 or grid is None:
            raise ConfigError(f"{where}: its {k.pixel_values!r} should be [patches, C·t·p·p], but got {_describe(pv)}")
        grids = [(int(a), int(b), int(c)) for a, b, c in grid.reshape(-1, 3).tolist()]
        total = sum(a * b * c for a, b, c in grids)
        if total != pv.shape[0]:
            raise ConfigError(
                f"{where}: its {k.pixel_values!r} holds {pv.shape[0]} patches but its {k.grid_thw!r} {grids} "
                f"adds up to {total}"
            )
        out = []
        start = 0
        for n, ((j, _), g) in enumerate(zip(row.cameras, grids, strict=True)):
            cam = row.bd.cameras[j]
            cs = self.data.spec.camera_spec(cam.name)
            label = f"{where}: its {k.pixel_values!r} image {n} ({k.grid_thw}[{n}]={list(g)})"
            if pv.shape[1] % (cs.tubelet * cs.patch**2):
                raise ConfigError(
                    f"{label}: patches of width {pv.shape[1]} are not C·{cs.tubelet}·{cs.patch}·{cs.patch} "
                    f"(the spec's tubelet and patch)"
                )
            _check_patches(label, g, cam, cs)
            size = g[0] * g[1] * g[2]
            out.append((k.pixel_values, None, pv[start : start + size], g, cs))
            start += size
        return out

    # -- text, state, action ---------------------------------------------------------------------

    def _text(self, out: Batch, parsed: list[_Row], n_real: int, rows: int, length: int) -> set[str]:
        k = self.keys
        if not any(k.input_ids in r.item for r in parsed):
            return set()
        ids, labels, masks, full = [], [], [], True
        for row in parsed:
            where = f"sample {row.index} (key {self.data.key(row.index)!r}): its"
            x = _vector(row.item.get(k.input_ids), f"{where} {k.input_ids!r}")
            if x.shape[0] not in (row.bd.text, row.bd.total):
                raise ConfigError(
                    f"{where} {k.input_ids!r} holds {x.shape[0]} tokens, but its metadata says "
                    f"text={row.bd.text} (total {row.bd.total})"
                )
            full &= x.shape[0] == row.bd.total
            ids.append(x)
            y = row.item.get(k.labels)
            labels.append(_vector(y, f"{where} {k.labels!r}", x.shape[0]) if y is not None else None)
            a = row.item.get(k.attention_mask)
            masks.append(_vector(a, f"{where} {k.attention_mask!r}", x.shape[0]) if a is not None else None)
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
        return {k.input_ids, k.labels, k.attention_mask}

    def _state_action(self, out: Batch, parsed: list[_Row], n_real: int, rows: int) -> set[str]:
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
                        f"[{'chunk, ' if key == self.keys.action else 'T, '}D] or [D], but got {_describe(row.item.get(key))}"
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


@dataclass
class _Image:
    """One image of the patches layout: frames to cut, or a processor's patches."""

    row: int
    key: str
    frames: torch.Tensor | None
    patches: torch.Tensor | None
    grid: tuple[int, int, int]
    cs: CameraSpec

    @property
    def width(self) -> int:
        if self.patches is not None:
            return int(self.patches.shape[1])
        channels = int(self.frames.shape[1]) if self.frames is not None else 0
        return channels * self.cs.tubelet * self.cs.patch**2

    @property
    def dtype(self) -> torch.dtype:
        source = self.patches if self.patches is not None else self.frames
        return source.dtype if source is not None else torch.float32


def _is_image(value: object) -> bool:
    """A frame tensor ``[T, C, H, W]`` or ``[C, H, W]`` (not LeRobot's ``<camera>_is_pad`` ``[T]``)."""
    t = to_tensor(value, lists=False)
    return t is not None and t.ndim >= 3


def _mapping(index: int, item: object, key: str) -> Mapping[str, object]:
    if not isinstance(item, Mapping):
        raise ConfigError(
            f"sample {index} (key {key!r}): the collate takes items that are mappings of key -> value, "
            f"but got {type(item).__name__}"
        )
    return item


def _check_count(index: int, key: str, bd: TokenBreakdown, real: list[int], image_keys: list[str]) -> None:
    if len(image_keys) == len(real):
        return
    names = [bd.cameras[j].name for j in real]
    extra = [k for k in image_keys if k not in names] or image_keys[len(real) :]
    missing = (
        [n for n in names if n not in image_keys] if extra != image_keys[len(real) :] else names[len(image_keys) :]
    )
    detail = f"{extra[0]!r} has no camera in the metadata" if len(image_keys) > len(real) else f"no image for {missing}"
    raise ConfigError(
        f"sample {index} (key {key!r}): its metadata says {len(real)} cameras {names} but the item holds "
        f"{len(image_keys)} images {image_keys}: {detail}"
    )


def _check_patches(where: str, grid: tuple[int, int, int], cam: CameraTokens, cs: CameraSpec) -> None:
    """The patch count of ``grid`` against the breakdown's vision tokens before merge."""
    t, h, w = grid
    expected = cam.temporal * cam.spatial * cs.merge**2
    if t * h * w != expected or h % cs.merge or w % cs.merge:
        raise ConfigError(
            f"{where} makes {t * h * w} patches (grid t,h,w = {t},{h},{w}), but its metadata's camera {cam.name!r} "
            f"says {expected} before merge ({cam.temporal} temporal x {cam.spatial} tokens x merge {cs.merge}²)"
        )


def _cut(x: torch.Tensor, dest: torch.Tensor, gt: int, gh: int, gw: int, cs: CameraSpec) -> None:
    """Frames ``[T, C, H, W]`` into ``dest`` ``[gt·gh·gw, C·t·p·p]`` in Qwen2-VL's patch order
    (the last frame repeated up to a whole tubelet; each merge window's patches together)."""
    t, p, m = cs.tubelet, cs.patch, cs.merge
    if x.shape[0] != gt * t:
        x = torch.cat([x, x[-1:].expand(gt * t - x.shape[0], *x.shape[1:])])
    c = x.shape[1]
    view = x.reshape(gt, t, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    dest.view(gt, gh // m, gw // m, m, m, c, t, p, p).copy_(view)


def _vector(value: object, where: str, length: int | None = None) -> torch.Tensor:
    x = to_tensor(value)
    if x is not None and x.ndim == 2 and x.shape[0] == 1:  # a processor's [1, L]
        x = x[0]
    if x is None or x.ndim != 1:
        raise ConfigError(f"{where} should be [L] (or [1, L]), but got {_describe(value)}")
    if length is not None and x.shape[0] != length:
        raise ConfigError(f"{where} holds {x.shape[0]} tokens, but the input ids hold {length}")
    return x


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return "nothing" if value is None else type(value).__name__


def _ceil(a: int, b: int) -> int:
    return -(-a // b)
