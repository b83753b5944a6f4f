"""The pixels of a packed row in the layouts other than one square an entry (plumbing of
:mod:`tokenbucket.train.packed_tower`): a family whose processor writes ``image_sizes`` beside
``pixel_values`` (each sample's images read out of its processor padding and checked, then laid
for the batch as the processor lays a batch), and Idefics3's tiles by row.

NOTE [ Packed sized-image rows ]
LLaVA-NeXT, LLaVA-OneVision and Mistral 3 write ``image_sizes`` beside ``pixel_values``; their
models read it image by image, in order across the batch, to find each image's pixels and count
its features, and scatter the features into the placeholders in the same order. Nothing ties an
image to its sample's row, so :class:`~tokenbucket.train.packed_tower.PackedTowerCollate` lays
the images as the processor lays one batch of the row's samples, in row order
(:meth:`~tokenbucket.models._base.Family.sized_layout`):

* any-resolution tiles (LLaVA-NeXT, OneVision): ``pixel_values`` ``[images, tiles, C, side,
  side]``, each image's own tiles first (as many as its ``image_sizes`` entry, the original
  sides, makes on the config's ``image_grid_pinpoints``: the grid's tiles and the base image),
  zeros to the batch's most; the model takes each image's first tiles by its size, so the
  padding never reaches the tower.
* OneVision tiles a sample's lone image only (each image of a sample of several is one square
  crop and its newline), and learns which from ``batch_num_images``: one count a *sample*, not a
  row. The collate writes every sample's, in row order (0 for one without images); a row's count
  makes two lone images a pair, leaves them untiled, and the features no longer fill the
  placeholders.
* images at their own sizes (Mistral 3's Pixtral): ``pixel_values`` ``[images, C, H, W]``, each
  image at the top left of the batch's largest, zeros below and to the right; ``image_sizes`` the
  processor's output sides (multiples of patch x merge), by which the tower cuts each image back
  (its images attend within themselves, one block each) and the merger counts its rows: ``rows x
  (cols + 1)`` LLM tokens, of which ``rows x cols`` are image placeholders and the rest the
  [IMG_BREAK] / [IMG_END] ids, which the collate carries as text.

Each item is checked in one line: its pixels in the layout, one ``image_sizes`` entry an image,
enough tiles for each image's grid (or a size inside its pixels, on the grid), its ids holding as
many image placeholders as its images make and its metadata's cameras as many LLM tokens. A row
holds images only: an item with ``pixel_values_videos`` (OneVision's clips) is refused.
tests/test_packed_sized.py holds the packed rows to each sample alone on tiny models of the
three, fed by their own image processors.

NOTE [ Packed tiles by row ]
Idefics3 / SmolVLM's processor writes ``pixel_values`` ``[batch, images, C, H, W]`` (each
sample's tiles and global image, padded with all-zero images to the batch's most) beside a
``pixel_attention_mask`` ``[batch, images, H, W]``. Every tile is the tower's square (the
model's ``image_seq_len`` is fixed), so an entry is a fixed square
(:meth:`~tokenbucket.models._base.Family.tower_image`, ``batched``). The model flattens
``batch x images``, drops the all-zero images and scatters the rest's features into the
placeholders in order: only the order ties a tile to its sample. A packed batch lays one entry a
row, ``[rows, most tiles a row, C, side, side]``, each row's tiles in row order, then all-zero
tiles (which the model drops, as it drops the processor's) to the batch's most, and a
``pixel_attention_mask`` true on the real tiles; an item's mask that masks any of its pixels is
refused (a packed tile is whole). A real tile of all zeros would be dropped too, alone as packed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._base import SizedImage, SizedLayout
from tokenbucket.train._keys import to_tensor
from tokenbucket.train._patches import describe

__all__ = ["IMAGE_SIZES", "PIXEL_MASK", "SAMPLE_IMAGES", "SizedPixels", "by_row", "lay_sized", "read_sized"]

IMAGE_SIZES, SAMPLE_IMAGES, PIXEL_MASK = "image_sizes", "batch_num_images", "pixel_attention_mask"  # the processors'

Count = Callable[[Mapping[str, Any], int, int, int], SizedImage]


@dataclass
class SizedPixels:
    """One sample's images: each one's own pixels (its real tiles ``[tiles, C, side, side]``, or
    ``[C, h, w]`` cut out of the padding), their ``image_sizes`` ``[images, 2]`` and what the
    model makes of each."""

    images: list[torch.Tensor]
    sizes: torch.Tensor
    made: list[SizedImage]


def read_sized(
    layout: SizedLayout, count: Count, pixels: object, sizes: object, where: str, key: str
) -> SizedPixels | None:
    """A sample's ``pixels`` and ``sizes`` under ``layout`` (``None``: no images), each
    disagreement a one-line error starting with ``where`` (``key``: the pixels' name)."""
    if pixels is None:
        return None
    c, side = layout.channels, layout.side
    shape = f"[images, tiles, {c}, {side}, {side}]" if layout.tiles else f"[images, {c}, H, W]"
    x = to_tensor(pixels, lists=False)
    if (
        x is None
        or x.ndim != (5 if layout.tiles else 4)
        or x.shape[-3] != c
        or (layout.tiles and tuple(x.shape[-2:]) != (side, side))
    ):
        raise ConfigError(f"{where} {key!r} should be {shape}, but got {describe(pixels)}")
    s = to_tensor(sizes, lists=False)
    if s is None or s.ndim != 2 or s.shape != (x.shape[0], 2) or s.dtype.is_floating_point:
        raise ConfigError(
            f"{where} {IMAGE_SIZES!r} should be [images, 2] integers, one (height, width) for each of the "
            f"{x.shape[0]} images of its {key!r}, but got {describe(sizes)}"
        )
    images, made = [], []
    for n, (h, w) in enumerate(s.tolist()):
        if h < 1 or w < 1:
            raise ConfigError(f"{where} {IMAGE_SIZES!r}[{n}] should be positive sides, but got {[h, w]}")
        one = count(layout.rule, h, w, x.shape[0])
        if layout.tiles:
            if one.tiles > x.shape[1]:
                raise ConfigError(
                    f"{where} image {n} of {h}x{w} makes {one.tiles} tiles, but its {key!r} hold {x.shape[1]} an "
                    f"image (another grid than the config's image_grid_pinpoints?)"
                )
            images.append(x[n, : one.tiles])
        else:
            if h > x.shape[-2] or w > x.shape[-1] or h % side or w % side:
                raise ConfigError(
                    f"{where} {IMAGE_SIZES!r}[{n}] = {[h, w]} should fit its {key!r} of {x.shape[-2]}x{x.shape[-1]} "
                    f"with sides multiples of {side} (the processor's output sides)"
                )
            images.append(x[n, :, :h, :w])
        made.append(one)
    return SizedPixels(images, s, made)


def lay_sized(layout: SizedLayout, samples: list[SizedPixels | None], key: str) -> dict[str, torch.Tensor]:
    """The batch's ``samples`` (row order) laid as the processor lays a batch (NOTE [ Packed
    sized-image rows ]): ``key`` and ``image_sizes``, and ``batch_num_images`` (every sample's
    count, row order) where the model reads it; nothing for a batch without images."""
    images = [x for s in samples if s is not None for x in s.images]
    if not images:
        return {}
    dtypes = {x.dtype for x in images}
    if len(dtypes) > 1:
        raise ConfigError(f"the batch's {key!r} differ in dtype {sorted(map(str, dtypes))}")
    if layout.tiles:  # each image's tiles padded with zeros to the batch's most
        most = max(x.shape[0] for x in images)
        pixels = images[0].new_zeros((len(images), most, *images[0].shape[1:]))
        for n, x in enumerate(images):
            pixels[n, : x.shape[0]] = x
    else:  # each image at the top left of the batch's largest, zeros below and to the right
        h, w = max(x.shape[-2] for x in images), max(x.shape[-1] for x in images)
        pixels = images[0].new_zeros((len(images), images[0].shape[0], h, w))
        for n, x in enumerate(images):
            pixels[n, :, : x.shape[-2], : x.shape[-1]] = x
    out = {key: pixels, IMAGE_SIZES: torch.cat([s.sizes for s in samples if s is not None])}
    if layout.sample_counts:
        out[SAMPLE_IMAGES] = torch.tensor([0 if s is None else len(s.images) for s in samples], dtype=torch.long)
    return out


def by_row(pixels: list[torch.Tensor], rows: list[int], R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``pixels`` (each ``[C, side, side]``, in row order, in ``rows``) laid ``[R, most a row, C,
    side, side]`` with all-zero tiles after each row's own, and their ``pixel_attention_mask``
    ``[R, most a row, side, side]`` (NOTE [ Packed tiles by row ])."""
    count = torch.bincount(torch.tensor(rows, dtype=torch.long), minlength=R)
    out = pixels[0].new_zeros((R, int(count.max()), *pixels[0].shape))
    mask = torch.zeros((R, int(count.max()), *pixels[0].shape[-2:]), dtype=torch.bool)
    place = [0] * R
    for x, r in zip(pixels, rows, strict=True):
        out[r, place[r]] = x
        mask[r, place[r]] = True
        place[r] += 1
    return out, mask
