"""Lightning fed by tokenbucket: a tiny transformer, a few CPU steps, the monitor and the
sampler's position in Lightning's checkpoint.

    python examples/lightning_train.py            # then: tokenbucket report runs/lightning_train.jsonl

Three tokenbucket parts go into a Lightning run: the DataLoader's ``batch_sampler`` is the
dataset's ``sampler()``; the ``Trainer`` gets ``use_distributed_sampler=False`` (the sampler splits
batches by rank itself) and a ``BucketSamplerCallback`` (``set_epoch`` for the sampler, its
position in the checkpoint, the monitor around each step). Resume with
``trainer.fit(model, loader, ckpt_path=...)``: the run goes on at the exact batch.
"""

from __future__ import annotations

from pathlib import Path

import lightning
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from tokenbucket import (
    BucketCollate,
    BucketMonitor,
    BucketSamplerCallback,
    CostModel,
    ModelSpec,
    TokenBucketDataset,
    TokenSpec,
    breakdown_table,
    plan_buckets,
)
from tokenbucket.testing import RandomTokens

HIDDEN = 16
SPEC = TokenSpec(patch=56)  # 224 px -> 16 tokens a frame, 336 px -> 36


def metadata(n: int, seed: int = 0) -> dict[str, list[int]]:
    rng = np.random.default_rng(seed)
    side = rng.choice([224, 336], n).tolist()
    return {
        "key": [f"ep{i:04d}" for i in range(n)],
        "cameras": rng.choice([1, 2], n).tolist(),
        "frames": [1] * n,
        "height": side,
        "width": side,
        "text_tokens": rng.integers(4, 24, n).tolist(),
    }


def build(n: int = 96) -> tuple[TokenBucketDataset, BucketCollate, CostModel]:
    """The dataset (bucketed by a plan for a tiny "GPU") and its collate."""
    meta = metadata(n)
    lengths = breakdown_table(meta, SPEC).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=1, heads=2, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, 4 * 2**20, max_buckets=3, multiple=8)
    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=meta, spec=SPEC, plan=plan)
    return data, BucketCollate(data, cost_model=cost), cost


class Denoiser(lightning.LightningModule):
    """A one-layer transformer that learns to reproduce its input on real tokens."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(HIDDEN, 2, 2 * HIDDEN, batch_first=True, dropout=0.0)
        self.net = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.losses: list[float] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        mask = batch["attention_mask"]
        out = self.net(batch["tokens"], src_key_padding_mask=~mask)
        loss = ((out - batch["tokens"]) ** 2)[mask].mean()  # padding and empty rows do not count
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main(steps: int = 8, log: Path = Path("runs/lightning_train.jsonl")) -> list[float]:
    torch.manual_seed(0)
    data, collate, cost = build()
    sampler = data.sampler(seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    model = Denoiser()
    with BucketMonitor(data.plan, sinks=[log], cost_model=cost, data=data) as monitor:
        trainer = lightning.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            use_distributed_sampler=False,  # the sampler splits by rank itself
            callbacks=[BucketSamplerCallback(sampler, monitor=monitor)],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, loader)
        print(f"{monitor.step_count} steps over buckets {sorted(r['bucket'] for r in monitor.summary())}")
    print(f"loss {model.losses[0]:.3f} -> {model.losses[-1]:.3f}; run log: {log}")
    return model.losses


if __name__ == "__main__":
    main()
