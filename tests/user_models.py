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


def hf_qwen2() -> torch.nn.Module:
    """A Hugging Face model built the way a user builds one: from its config, then ``.to(bf16)``.

    Under fake tensors ``.to()`` cannot swap a parameter; ``tokenbucket profile`` builds a factory
    in the spec's dtype, so this ``.to`` has nothing to convert."""
    import transformers

    config = transformers.Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1000,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)


def hf_text_inputs(sample: dict[str, int], batch: int) -> dict[str, torch.Tensor]:
    """A user's input hook: one sample's shape (``{"text_tokens": T}``) and the batch, as keyword inputs."""
    ids = torch.zeros(batch, sample["text_tokens"], dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
