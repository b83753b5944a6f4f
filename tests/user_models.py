"""A model as a user would write it, for the measured-mode tests (not the reference block)."""

from __future__ import annotations

import torch
from torch import nn


class TinyViT(nn.Module):
    """Patch tokens through PyTorch's own TransformerEncoder (fp32, math attention)."""

    def __init__(self, hidden: int = 128, layers: int = 2) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            hidden, nhead=4, dim_feedforward=4 * hidden, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out


def build() -> nn.Module:
    return TinyViT()


def make_batch(batch: int, length: int) -> torch.Tensor:
    return torch.empty(batch, length, 128)
