"""A plain PyTorch DataLoader fed by tokenbucket: a tiny multi-camera transformer, a few CPU steps,
under the monitor.

    python examples/train_tiny.py            # then: tokenbucket report runs/train_tiny.jsonl

The dataset is synthetic (random token embeddings whose lengths follow their metadata), so the
example runs anywhere; swap in your own dataset and model and keep the four tokenbucket parts:
``TokenBucketDataset`` (breakdowns and buckets), its ``sampler()``, ``BucketCollate`` and the
``BucketMonitor`` (per-bucket latency and risk; its guard splits a batch that runs out of memory).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from tokenbucket import (
    BucketCollate,
    BucketMonitor,
    CostModel,
    ModelSpec,
    TokenBucketDataset,
    TokenSpec,
    breakdown_table,
    format_summary,
    plan_buckets,
)
from tokenbucket.testing import RandomTokens

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


def main(steps: int = 6, log: Path = Path("runs/train_tiny.jsonl")) -> float:
    spec = TokenSpec(patch=56)  # 224 px -> 16 tokens a frame, 336 px -> 36
    meta = metadata(256)
    lengths = breakdown_table(meta, spec).totals
    model_spec = ModelSpec(hidden=HIDDEN, layers=2, heads=4, precision="fp32", attention="eager")
    cost = CostModel(model_spec)
    budget = 24 * 2**20  # a tiny "GPU", so the plan has several buckets and batch sizes
    plan = plan_buckets(lengths, cost, budget, max_buckets=4, multiple=8)

    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=meta, spec=spec, plan=plan)
    loader = DataLoader(data, batch_sampler=data.sampler(seed=0), collate_fn=BucketCollate(data, cost_model=cost))

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(HIDDEN, 4, 4 * HIDDEN, batch_first=True, norm_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(batch: dict[str, torch.Tensor]) -> float:
        mask = batch["attention_mask"]
        out = model(batch["tokens"], src_key_padding_mask=~mask)
        # a denoising toy target on real tokens only; empty rows and padding do not count
        loss = ((out - batch["tokens"]) ** 2)[mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    loss = float("nan")
    with BucketMonitor(plan, sinks=[log], cost_model=cost, data=data) as monitor:
        train = monitor.guard(train_step, policy="split")  # an OOM splits the batch; nothing is lost
        for step, batch in enumerate(loader):
            if step == steps:
                break
            loss = train(batch)
            info = batch["info"]
            print(
                f"step {step}: bucket {info.bucket} shape {info.shape} real {info.real_tokens}/"
                f"{info.padded_tokens} tokens, predicted peak {info.predicted_peak_bytes / 2**20:.1f} MiB "
                f"(risk {info.risk:.2f}), loss {loss:.3f}"
            )
        print(format_summary(monitor.summary()))
    print(f"run log: {log}")
    return loss


if __name__ == "__main__":
    main()
