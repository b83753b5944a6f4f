"""The camera side of :class:`~tokenbucket.train.modal.ModalityCollate`: each item's images and
clips matched to its breakdown's cameras, then stacked or put in patch streams (the streams'
own plumbing is :mod:`tokenbucket.train._patches`).

NOTE [ Clips in the batch ]
A camera the token spec feeds as one clip (``feed="video"`` and two frames or more:
NOTE [ Frames are images ]) is a video to the model. In processor form its patches are the item's
``pixel_values_videos`` ``[patches, C·t·p·p]`` with one ``video_grid_thw`` row per clip, matched to
the sample's clip cameras in order (its other cameras to ``pixel_values`` / ``image_grid_thw``);
the patches layout cuts a clip camera's frames into the video stream with its video rule's
temporal patch, patch and merge (already sampled and resized: a rule that samples frames, as
Qwen3-VL's does, needs processor-form items). The batch concatenates the real rows' clips in
row order, then camera order, as it does images: ``pixel_values_videos``, ``video_grid_thw``,
``video_cu_seqlens``, ``video_rows``, and ``second_per_grid_ts`` (Qwen2.5-VL's seconds per
temporal patch, one a clip) where the items carry it, all of a batch's or none. A clip's
``t·h·w`` must be its breakdown's ``temporal x spatial x merge²`` (the video rule's merge).

A ``pixel_values_videos`` of frames (``[frames, C, H, W]``, or ``[videos, frames, C, H, W]``:
LLaVA-OneVision's video processor, whose tower pools each frame) is matched in order to the
sample's cameras of two frames or more (a family without a video rule: the spec counts their
frames), and each video must hold its camera's frames. The batch concatenates the real rows'
videos ``[videos, frames, C, H, W]`` (one video a sample: stacked per sample), frames padded to
the batch's largest and marked by ``video_frame_mask`` ``[videos, frames]``, with ``video_rows``.

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
gets the padded stream too (its width from an image of the bucket). The video stream of a batch
that holds clips is padded the same way (``video_patch_mask``; a row's images and clips share
its bound); a batch holds the streams of its own samples, or of that image when it has none.
1D and dynamic plans, and the stacked layout (padded to the batch's largest), are not padded
this way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.tokens.breakdown import CameraTokens, TokenBreakdown
from tokenbucket.train._keys import to_tensor
from tokenbucket.train._patches import (
    IMAGES,
    VIDEOS,
    Cut,
    PatchImage,
    ceil_div,
    check_count,
    check_patches,
    cut_of,
    describe,
    is_clip,
    write_stream,
)
from tokenbucket.train.batch import Batch
from tokenbucket.train.shaping import ShapedData

__all__ = ["CameraCollate", "CameraKeys", "Row", "as_mapping"]

SECONDS = "second_per_grid_ts"  # the batch key of Qwen2.5-VL's seconds per temporal patch


class CameraKeys(Protocol):
    """The item keys the camera side reads (:class:`~tokenbucket.train.modal.ModalityKeys`)."""

    @property
    def pixel_values(self) -> str: ...
    @property
    def grid_thw(self) -> str: ...
    @property
    def pixel_values_videos(self) -> str: ...
    @property
    def video_grid_thw(self) -> str: ...
    @property
    def second_per_grid_ts(self) -> str: ...
    def is_image(self, key: str) -> bool: ...


@dataclass
class Row:
    """One real row: its index, item, breakdown and matched cameras ``(breakdown position, key)``
    (their pixels stacked or in a patch stream), the positions of those that are clips, and the
    clip cameras of pooled frames (NOTE [ Clips in the batch ])."""

    index: int
    item: Mapping[str, object]
    bd: TokenBreakdown
    cameras: list[tuple[int, str]]
    clips: frozenset[int] = frozenset()
    pooled: list[int] = field(default_factory=list)
    processor: bool = False  # its images or clips are a processor's patches

    def placeholders(self, clip: bool) -> int | None:
        """The LLM tokens of its images (or clips) per the breakdown; None for pooled frames."""
        if clip and self.pooled:
            return None
        cams = self.bd.cameras
        return sum(cams[j].temporal * cams[j].spatial for j, _ in self.cameras if (j in self.clips) == clip)


class CameraCollate:
    """Matches each item's images and clips to its breakdown's cameras (:meth:`row`) and writes a
    batch's pixels (:meth:`__call__`): stacked, or patch streams (``layout="patches"``, and
    items in processor form), and pooled video frames (NOTE [ Clips in the batch ])."""

    def __init__(self, data: ShapedData, keys: CameraKeys, layout: str) -> None:
        self.data, self.keys, self.layout = data, keys, layout
        self._image_templates: dict[int, tuple[int, Mapping[str, object]] | None] = {}

    def _image_template(self, bucket: int) -> tuple[int, Mapping[str, object]] | None:
        """A real sample of ``bucket`` with an image (None if it has none), read once per bucket."""
        if bucket not in self._image_templates:
            found = None
            for i in np.flatnonzero(self.data.buckets == bucket).tolist():
                if any(not cam.empty_slot for cam in self.data.breakdown(i).cameras):
                    _, item = self.data[i]
                    found = (i, as_mapping(i, item, self.data.key(i)))
                    break
            self._image_templates[bucket] = found
        return self._image_templates[bucket]

    def merge(self) -> int:
        """The one merge of every camera (and of its clips), which a 2D bucket's patch bound needs."""
        spec = self.data.spec
        merges = {name: spec.camera_spec(name).merge for name in spec.overrides}
        other = {name: m for name, m in merges.items() if m != spec.merge}
        if other:
            name, m = next(iter(other.items()))
            raise ConfigError(
                f"2D patch padding needs one merge for every camera (NOTE [ Patch stream of a 2D bucket ]), "
                f"but the spec merges {spec.merge} and overrides[{name!r}] merges {m}; use one merge, or layout='stacked'"
            )
        for camera in (None, *spec.overrides):
            m = cut_of(spec.camera_spec(camera), clip=True).merge
            if m != spec.merge:
                where = "the spec's video rule" if camera is None else f"overrides[{camera!r}]'s video rule"
                raise ConfigError(
                    f"2D patch padding needs one merge for every camera (NOTE [ Patch stream of a 2D bucket ]), "
                    f"but the spec merges {spec.merge} and {where} merges {m}; use one merge, or layout='stacked'"
                )
        return spec.merge

    def _patch_bound(self, bucket: int, rows: int) -> tuple[int, int] | None:
        """``(vision_bound, patches)`` a 2D static bucket's patch stream is padded to, else None."""
        plan = self.data.plan
        vision = plan.buckets[bucket].vision_bound
        if plan.mode != "static" or vision is None:
            return None
        return vision, rows * vision * self.merge() ** 2

    def _is_clip(self, cam: CameraTokens) -> bool:
        return is_clip(self.data.spec.camera_spec(cam.name), cam)

    def row(self, index: int, item: object) -> Row:
        key = self.data.key(index)
        item = as_mapping(index, item, key)
        bd = self.data.breakdown(index)
        real = [j for j, cam in enumerate(bd.cameras) if not cam.empty_slot]
        if self.keys.pixel_values in item or self.keys.pixel_values_videos in item:
            return self._processor_row(index, key, item, bd, real)
        image_keys = [k for k in item if self.keys.is_image(k) and _is_image(item[k])]
        check_count(index, key, bd, real, image_keys)
        names = {bd.cameras[j].name: j for j in real}
        if all(k in names for k in image_keys):  # the metadata names the cameras by their item keys
            cameras = sorted(((names[k], k) for k in image_keys), key=lambda c: c[0])
        else:  # by position: the item's image keys in order, the metadata's cameras in order
            cameras = list(zip(real, image_keys, strict=True))
        clips = frozenset(j for j, _ in cameras if self._is_clip(bd.cameras[j]))
        return Row(index, item, bd, cameras, clips)

    def _grid_rows(self, where: str, item: Mapping[str, object], pixels: str, grid_key: str) -> int:
        """How many ``(t, h, w)`` rows the grid beside a processor's ``pixels`` holds (0 without them)."""
        if pixels not in item:
            return 0
        grid = to_tensor(item.get(grid_key))
        if grid is None or grid.ndim != 2:
            raise ConfigError(
                f"{where}: its {pixels!r} needs {grid_key!r} [{'videos' if grid_key == self.keys.video_grid_thw else 'images'}, 3] "
                f"beside it, but got {describe(item.get(grid_key))}"
            )
        return int(grid.shape[0])

    def _processor_row(
        self, index: int, key: str, item: Mapping[str, object], bd: TokenBreakdown, real: list[int]
    ) -> Row:
        """An item in processor form: its images matched to the sample's still cameras and its
        clips to its clip cameras, in order (NOTE [ Clips in the batch ])."""
        k = self.keys
        where = f"sample {index} (key {key!r})"
        n_images = self._grid_rows(where, item, k.pixel_values, k.grid_thw)
        videos = to_tensor(item.get(k.pixel_values_videos))
        if k.pixel_values_videos in item and (videos is None or videos.ndim not in (2, 4, 5)):
            raise ConfigError(
                f"{where}: its {k.pixel_values_videos!r} should be [patches, C·t·p·p] (Qwen2-VL) or pooled frames "
                f"[frames, C, H, W] / [videos, frames, C, H, W] (LLaVA-OneVision), but got {describe(videos)}"
            )
        pooled = videos is not None and videos.ndim >= 4
        if videos is not None and pooled:
            n_videos = 1 if videos.ndim == 4 else int(videos.shape[0])
            clips = [j for j in real if bd.cameras[j].frames > 1]
        else:
            n_videos = self._grid_rows(where, item, k.pixel_values_videos, k.video_grid_thw)
            clips = [j for j in real if self._is_clip(bd.cameras[j])]
        stills = [j for j in real if j not in clips]
        if not clips and not n_videos:
            check_count(index, key, bd, real, [f"{k.grid_thw}[{n}]" for n in range(n_images)])
        elif (n_images, n_videos) != (len(stills), len(clips)):
            self._refuse_counts(where, bd, stills, clips, n_images, n_videos, pooled)
        images = [(j, k.pixel_values) for j in stills]
        if pooled:
            return Row(index, item, bd, images, pooled=clips, processor=bool(images))
        cameras = sorted([*images, *((j, k.pixel_values_videos) for j in clips)])
        return Row(index, item, bd, cameras, frozenset(clips), processor=True)

    def _refuse_counts(
        self,
        where: str,
        bd: TokenBreakdown,
        stills: list[int],
        clips: list[int],
        n_images: int,
        n_videos: int,
        pooled: bool,
    ) -> None:
        k, cams = self.keys, bd.cameras
        rule = "cameras of two frames or more" if pooled else "cameras the spec feeds as clips"
        held = f"{k.pixel_values_videos!r}" if pooled else f"{k.video_grid_thw!r} rows"
        hint = ""
        as_images = [cams[j].name for j in stills if cams[j].frames > 1]
        if not pooled and n_videos > len(clips) and as_images:
            hint = f": the token spec feeds {as_images[0]!r} as images (feed='images'), so its breakdown counts frames"
        raise ConfigError(
            f"{where}: its metadata says {len(stills)} image cameras {[cams[j].name for j in stills]} and "
            f"{len(clips)} clips {[cams[j].name for j in clips]} ({rule}, NOTE [ Frames are images ]) but the item "
            f"holds {n_images} images ({k.grid_thw!r} rows) and {n_videos} videos ({held}){hint}"
        )

    # -- pixels --------------------------------------------------------------------------------

    def __call__(self, out: Batch, parsed: list[Row], n_real: int, rows: int, bucket: int) -> set[str]:
        k = self.keys
        used = {key for r in parsed for _, key in r.cameras} | (
            {k.pixel_values_videos} if any(r.pooled for r in parsed) else set()
        )
        plan = self.data.plan
        if not used and plan.mode == "static" and plan.buckets[bucket].vision_bound:
            # NOTE [ Patch stream of a 2D bucket ]: no image here, but the bucket's shape has patches
            found = self._image_template(bucket)
            template = self.row(*found) if found is not None else None
            if template is not None and template.cameras and (self.layout == "patches" or template.processor):
                self._patches(out, [*parsed, template], n_real, rows, bucket)
                return set()
        if not used:  # no camera in the batch: nothing to read
            return set()
        if any(r.pooled for r in parsed):
            self._pooled(out, parsed, n_real)
        processor = any(r.processor for r in parsed)
        if processor:
            used |= {k.grid_thw, k.video_grid_thw, k.second_per_grid_ts}
        if not any(r.cameras for r in parsed):
            return used
        if self.layout == "patches" or processor:
            self._patches(out, parsed, n_real, rows, bucket)
            if SECONDS in out:
                used.add(k.second_per_grid_ts)
        else:
            self._stacked(out, parsed, n_real, rows)
        return used

    def _frames(self, row: Row, j: int, key: str) -> tuple[torch.Tensor, CameraTokens, Cut]:
        """Camera ``j``'s frames ``[T, C, H, W]``, checked against its breakdown, and its cut."""
        cam = row.bd.cameras[j]
        cs = self.data.spec.camera_spec(cam.name)
        cut = cut_of(cs, j in row.clips)
        x = to_tensor(row.item[key])
        where = f"sample {row.index} (key {self.data.key(row.index)!r}): its {key!r}"
        if x is None or x.ndim not in (3, 4):
            raise ConfigError(
                f"{where} should be a [T, C, H, W] or [C, H, W] tensor, but got {describe(row.item[key])}"
            )
        if x.ndim == 3:
            x = x.unsqueeze(0)
        t, _, h, w = x.shape
        if t != cam.frames:
            raise ConfigError(f"{where} holds {t} frames {tuple(x.shape)}, but its metadata says frames={cam.frames}")
        if cs.tokens_per_frame is None and (h, w) != (cam.height, cam.width):
            got = ceil_div(ceil_div(h, cut.patch), cut.merge) * ceil_div(ceil_div(w, cut.patch), cut.merge)
            if got != cam.spatial:
                raise ConfigError(
                    f"{where} is {h}x{w} pixels {tuple(x.shape)}, but its metadata says {cam.height}x{cam.width} "
                    f"({cam.spatial} tokens a frame after resize={cs.resize!r}); as already-resized pixels "
                    f"it makes {got} tokens a frame (patch {cut.patch}, merge {cut.merge})"
                )
        return x, cam, cut

    def _stacked(self, out: Batch, parsed: list[Row], n_real: int, rows: int) -> None:
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

    def _patches(self, out: Batch, parsed: list[Row], n_real: int, rows: int, bucket: int) -> None:
        images: list[PatchImage] = []
        for r, row in enumerate(parsed):
            if row.processor:
                images += self._processor_images(r, row)
                continue
            for j, k in row.cameras:
                x, cam, cut = self._frames(row, j, k)
                grid = self._grid(row, k, x, cam, cut)
                images.append(PatchImage(r, j, k, x, None, grid, cut, j in row.clips))
        real = [im for im in images if im.row < n_real]
        bound = self._patch_bound(bucket, rows)  # NOTE [ Patch stream of a 2D bucket ]
        if bound is not None:
            self._check_row_patches(parsed, real, bucket, bound[0])
        for names, clip in ((IMAGES, False), (VIDEOS, True)):
            stream = [im for im in images if im.clip == clip]
            if stream:
                write_stream(out, names, stream, n_real, None if bound is None else bound[1])
        camera_keys: list[list[str]] = [[] for _ in range(rows)]
        for im in sorted(real, key=lambda im: (im.row, im.camera)):
            camera_keys[im.row].append(im.key)
        out["camera_keys"] = camera_keys
        self._seconds(out, parsed, n_real)

    def _pooled(self, out: Batch, parsed: list[Row], n_real: int) -> None:
        """Pooled video frames, concatenated over the real rows (NOTE [ Clips in the batch ])."""
        k = self.keys
        videos: list[tuple[int, torch.Tensor]] = []
        for r, row in enumerate(parsed):
            if not row.pooled:
                continue
            x = to_tensor(row.item[k.pixel_values_videos])
            if x is None:
                raise AssertionError("a pooled row's videos passed as a tensor")
            for n, (v, j) in enumerate(zip(x[None] if x.ndim == 4 else x, row.pooled, strict=True)):
                cam = row.bd.cameras[j]
                if v.shape[0] != cam.frames:
                    raise ConfigError(
                        f"sample {row.index} (key {self.data.key(row.index)!r}): its {k.pixel_values_videos!r} video {n} "
                        f"holds {v.shape[0]} frames {tuple(v.shape)}, but its metadata's camera {cam.name!r} says "
                        f"frames={cam.frames}"
                    )
                videos.append((r, v))
        shapes = {tuple(v.shape[1:]) for _, v in videos}
        if len(shapes) > 1:
            raise ConfigError(
                f"the batch's pooled videos differ in frame shape {sorted(shapes)} (C, H, W): one tower takes one"
            )
        real = [(r, v) for r, v in videos if r < n_real]
        ref = videos[0][1]
        frames = max((v.shape[0] for _, v in real), default=ref.shape[0])
        pixels = torch.zeros((len(real), frames, *ref.shape[1:]), dtype=ref.dtype)
        mask = torch.zeros(len(real), frames, dtype=torch.bool)
        for n, (_, v) in enumerate(real):
            pixels[n, : v.shape[0]] = v
            mask[n, : v.shape[0]] = True
        out[VIDEOS.pixels], out["video_frame_mask"] = pixels, mask
        out[VIDEOS.rows] = torch.tensor([r for r, _ in real], dtype=torch.long)

    def _seconds(self, out: Batch, parsed: list[Row], n_real: int) -> None:
        """``second_per_grid_ts``: one value a clip, concatenated, where the items carry it."""
        key = self.keys.second_per_grid_ts
        if not any(key in r.item for r in parsed):
            return
        values = []
        for row in parsed[:n_real]:
            clips = [j for j, _ in row.cameras if j in row.clips]
            if not clips:
                continue
            where = f"sample {row.index} (key {self.data.key(row.index)!r})"
            if key not in row.item:
                raise ConfigError(
                    f"{where}: its {len(clips)} clips come without {key!r}, which other samples of the batch carry "
                    f"(seconds per temporal patch, one a clip): give it for every clip or none"
                )
            x = to_tensor(row.item[key])
            x = x.reshape(-1) if x is not None and x.ndim == 2 and x.shape[0] == 1 else x
            if x is None or x.ndim != 1 or x.shape[0] != len(clips):
                got = describe(row.item[key]) if x is None or x.ndim != 1 else f"{x.shape[0]} values"
                raise ConfigError(f"{where}: its {key!r} should hold one value a clip ({len(clips)}), but got {got}")
            values.append(x.to(torch.float32))
        out[SECONDS] = torch.cat(values) if values else torch.zeros(0)

    def _check_row_patches(self, parsed: list[Row], real: list[PatchImage], bucket: int, vision: int) -> None:
        """Every row within its bucket's ``vision_bound x merge²`` patches (NOTE [ Patch stream of a 2D bucket ])."""
        per_row: dict[int, int] = {}
        for im in real:
            per_row[im.row] = per_row.get(im.row, 0) + im.size
        merge = self.merge()
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

    def _grid(self, row: Row, key: str, x: torch.Tensor, cam: CameraTokens, cut: Cut) -> tuple[int, int, int]:
        """The ``(t, h, w)`` patch grid of frames ``x``; its patch count must be the breakdown's."""
        where = f"sample {row.index} (key {self.data.key(row.index)!r}): its {key!r}"
        cs = self.data.spec.camera_spec(cam.name)
        if cs.tokens_per_frame is not None or cs.causal_first_frame:
            raise ConfigError(
                f"{where}: camera {cam.name!r} is tokenised by a resampler or a causal video tokenizer, "
                f"which the patches layout cannot cut; use layout='stacked'"
            )
        t, _, h, w = x.shape
        p, m = cut.patch, cut.merge
        if h % (p * m) or w % (p * m):
            raise ConfigError(
                f"{where} is {h}x{w} pixels, not a multiple of patch x merge = {p}x{m}: the patches layout cuts "
                f"pixels as they are (resize them first, or use layout='stacked')"
            )
        grid = (ceil_div(t, cut.tubelet), h // p, w // p)
        check_patches(where, grid, cam, m)
        return grid

    def _processor_images(self, r: int, row: Row) -> list[PatchImage]:
        """A processor-form item's images and clips, each stream checked against its grid and
        each image against its camera's breakdown."""
        k = self.keys
        where = f"sample {row.index} (key {self.data.key(row.index)!r})"
        out = []
        for pixels, grid_key, clip in (
            (k.pixel_values, k.grid_thw, False),
            (k.pixel_values_videos, k.video_grid_thw, True),
        ):
            cameras = [j for j, key in row.cameras if key == pixels]
            if not cameras:
                continue
            pv = to_tensor(row.item[pixels])
            grid = to_tensor(row.item[grid_key])
            if pv is None or pv.ndim != 2 or grid is None:
                raise ConfigError(f"{where}: its {pixels!r} should be [patches, C·t·p·p], but got {describe(pv)}")
            grids = [(int(a), int(b), int(c)) for a, b, c in grid.reshape(-1, 3).tolist()]
            total = sum(a * b * c for a, b, c in grids)
            if total != pv.shape[0]:
                raise ConfigError(
                    f"{where}: its {pixels!r} holds {pv.shape[0]} patches but its {grid_key!r} {grids} adds up to {total}"
                )
            start = 0
            for n, (j, g) in enumerate(zip(cameras, grids, strict=True)):
                cam = row.bd.cameras[j]
                cut = cut_of(self.data.spec.camera_spec(cam.name), clip)
                label = f"{where}: its {pixels!r} {'clip' if clip else 'image'} {n} ({grid_key}[{n}]={list(g)})"
                if pv.shape[1] % (cut.tubelet * cut.patch**2):
                    raise ConfigError(
                        f"{label}: patches of width {pv.shape[1]} are not C·{cut.tubelet}·{cut.patch}·{cut.patch} "
                        f"(the spec's {'video rule' if clip else 'tubelet and patch'})"
                    )
                check_patches(label, g, cam, cut.merge)
                size = g[0] * g[1] * g[2]
                out.append(PatchImage(r, j, pixels, None, pv[start : start + size], g, cut, clip))
                start += size
        return out


def _is_image(value: object) -> bool:
    """A frame tensor ``[T, C, H, W]`` or ``[C, H, W]`` (not LeRobot's ``<camera>_is_pad`` ``[T]``)."""
    t = to_tensor(value, lists=False)
    return t is not None and t.ndim >= 3


def as_mapping(index: int, item: object, key: str) -> Mapping[str, object]:
    if not isinstance(item, Mapping):
        raise ConfigError(
            f"sample {index} (key {key!r}): the collate takes items that are mappings of key -> value, "
            f"but got {type(item).__name__}"
        )
    return item
