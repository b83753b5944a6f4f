"""A plain PyTorch DataLoader fed by tokenbucket: a tiny multi-camera transformer, a few CPU steps.

    python examples/train_tiny.py

The dataset is synthetic (random token embeddings whose lengths follow their metadata), so the
example runs anywhere; swap in your own dataset and model and keep the three tokenbucket parts:
``TokenBucketDataset`` (breakdowns and buckets), its ``sampler()`` and ``BucketCollate``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.collate import BucketCollate, TokenBucketDataset
from tokenbucket.plan import plan_buckets

HIDDEN = 32


def metadata(n: int, seed: int = 0) -> dict[str, list[int]]:
    rng = np.random.default_rng(seed)
    side = rng.choice([224, 336], n).tolist()
    return {
        "key": [f"ep{i:04d}" for i in range(n)],
        "cameras": rng.choice([1, 2, 3], n).tolist(),
        "frames": rng.choice([1, 2, 4], n).tolist(),
        "height": side,
        "width": side,
        "text_tokens": rng.integers(4, 24, n).tolist(),
        "action_tokens": [8] * n,
    }


class SyntheticEpisodes(Dataset[dict[str, torch.Tensor]]):
    """Each sample: a [L, HIDDEN] sequence, L = the sample's token count."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"tokens": torch.randn(int(self.lengths[i]), HIDDEN, generator=g)}


def main(steps: int = 6) -> float:
    spec = TokenSpec(patch=56)  # 224 px -> 16 tokens a frame, 336 px -> 36
    meta = metadata(256)
    lengths = breakdown_table(meta, spec).totals
    model_spec = ModelSpec(hidden=HIDDEN, layers=2, heads=4, precision="fp32", attention="eager")
    cost = CostModel(model_spec)
    budget = 24 * 2**20  # a tiny "GPU", so the plan has several buckets and batch sizes
    plan = plan_buckets(lengths, cost, budget, max_buckets=4, multiple=8)

    data = TokenBucketDataset(SyntheticEpisodes(lengths), metadata=meta, spec=spec, plan=plan)
    loader = DataLoader(data, batch_sampler=data.sampler(seed=0), collate_fn=BucketCollate(data, cost_model=cost))

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(HIDDEN, 4, 4 * HIDDEN, batch_first=True, norm_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = torch.tensor(0.0)
    for step, batch in enumerate(loader):
        if step == steps:
            break
        mask = batch["attention_mask"]
        out = model(batch["tokens"], src_key_padding_mask=~mask)
        # a denoising toy target on real tokens only; empty rows and padding do not count
        loss = ((out - batch["tokens"]) ** 2)[mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        info = batch["info"]
        print(f"step {step}: bucket {info.bucket} shape {info.shape} real {info.real_tokens}/{info.padded_tokens} "
              f"tokens, predicted peak {info.predicted_peak_bytes / 2**20:.1f} MiB (risk {info.risk:.2f}), "
              f"loss {loss.item():.3f}")
    return float(loss.item())


if __name__ == "__main__":
    main()
