"""The frame operations transformers' video processors call, in plain torch (NOTE [ The torchvision stand-in ])."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from torchvision.transforms import InterpolationMode

__all__ = ["InterpolationMode", "crop", "grayscale_to_rgb", "normalize", "pad", "resize", "to_dtype", "to_tensor"]


def resize(
    image: torch.Tensor, size: Sequence[int], interpolation: object = None, antialias: bool = True, **_: object
) -> torch.Tensor:
    """``image`` [..., C, H, W] at ``size`` (height, width), in its own dtype: a frame of zeros of
    the new size, of no memory (an expanded scalar; no resampling: the oracle's frames are zeros
    and only the shape counts). What follows (padding, patchify) copies it into real memory."""
    return image.new_zeros(()).expand(*image.shape[:-2], int(size[0]), int(size[1]))


def crop(image: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    return image[..., top : top + height, left : left + width]


def pad(image: torch.Tensor, padding: Sequence[int], fill: float = 0, padding_mode: str = "constant") -> torch.Tensor:
    """torchvision's order: (left, top, right, bottom), or (left/right, top/bottom), or one for all."""
    p = list(padding) if isinstance(padding, Sequence) else [int(padding)]
    if len(p) == 1:
        p = p * 4
    elif len(p) == 2:
        p = [p[0], p[1], p[0], p[1]]
    left, top, right, bottom = p
    return F.pad(image, (left, right, top, bottom), value=fill)


def normalize(image: torch.Tensor, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> torch.Tensor:
    m = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)
    return (image - m) / s


def grayscale_to_rgb(image: torch.Tensor) -> torch.Tensor:
    return image if image.shape[-3] == 3 else image.expand(*image.shape[:-3], 3, *image.shape[-2:])


def to_dtype(image: torch.Tensor, dtype: torch.dtype = torch.float32, scale: bool = False) -> torch.Tensor:
    out = image.to(dtype)
    return out / 255 if scale and not image.dtype.is_floating_point and dtype.is_floating_point else out


def to_tensor(pic: object) -> torch.Tensor:
    return torch.as_tensor(pic)
