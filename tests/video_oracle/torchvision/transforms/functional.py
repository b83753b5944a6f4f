"""``torchvision.transforms.functional`` of the stand-in (NOTE [ The torchvision stand-in ])."""

from __future__ import annotations

import numpy as np
import torch

from torchvision.transforms import InterpolationMode

__all__ = ["InterpolationMode", "pil_to_tensor"]


def pil_to_tensor(pic: object) -> torch.Tensor:
    return torch.from_numpy(np.array(pic)).permute(2, 0, 1).contiguous()
