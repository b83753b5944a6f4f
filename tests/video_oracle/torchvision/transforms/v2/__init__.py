"""``torchvision.transforms.v2`` of the stand-in (NOTE [ The torchvision stand-in ])."""

from torchvision.transforms import InterpolationMode

__all__ = ["InterpolationMode"]
