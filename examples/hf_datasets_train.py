"""A Hugging Face ``datasets.Dataset`` fed straight to tokenbucket: its columns are the metadata,
its rows the items, its extra columns (``label``, ``uid``) reach the batch. A few CPU steps.

    pip install 'tokenbucket[hf]'
    python examples/hf_datasets_train.py

The dataset is built in memory (no download): metadata columns (``cameras``, ``frames``,
``height``, ``width``, ``text_tokens``), a ``label`` and a ``uid``, and a ``tokens`` column of
``[L, HIDDEN]`` embeddings whose length ``L`` follows the metadata. Swap in your own
``load_dataset(...)`` / ``load_from_disk(...)``: ``TokenBucketDataset(ds, spec=..., plan=...)``
reads the columns as Arrow (also after ``.shuffle()`` / ``.select()``), never row by row.
"""

from __future__ import annotations

from collections import defaultdict

import datasets
import numpy as np
import pyarrow as pa
import torch
from torch import nn
from torch.utils.data import DataLoader

from tokenbucket import (
    BucketCollate,
    CostModel,
    ModelSpec,
    TokenBucketDataset,
    TokenSpec,
    breakdown_table,
    plan_buckets,
)

HIDDEN = 16
CLASSES = 4


def build_dataset(n: int, spec: TokenSpec, seed: int = 0) -> datasets.Dataset:
    """``n`` samples: metadata, ``label``, ``uid`` and ``tokens`` (noise around the label's prototype)."""
    rng = np.random.default_rng(seed)
    side = rng.choice([112, 224], n)
    meta = pa.table(
        {
            "key": [f"clip{i:04d}" for i in range(n)],
            "cameras": rng.choice([1, 2], n),
            "frames": rng.choice([1, 2, 4], n),
            "height": side,
            "width": side,
            "text_tokens": rng.integers(2, 12, n),
            "label": rng.integers(0, CLASSES, n),
            "uid": [f"uid-{rng.integers(1 << 30):08x}" for _ in range(n)],
        }
    )
    lengths = breakdown_table(meta, spec).totals
    prototypes = rng.normal(size=(CLASSES, HIDDEN)).astype(np.float32)
    labels = meta.column("label").to_numpy()
    rows = np.repeat(np.arange(n), lengths)  # the sample of every token
    flat = prototypes[labels[rows]] + rng.normal(scale=1.0, size=(len(rows), HIDDEN)).astype(np.float32)
    per_token = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), HIDDEN)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    tokens = pa.ListArray.from_arrays(offsets, per_token)
    return datasets.Dataset(meta.append_column("tokens", tokens))


class Classifier(nn.Module):
    """A one-layer transformer, mean-pooled over the real tokens, then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(HIDDEN, 2, 2 * HIDDEN, batch_first=True, norm_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.encoder(tokens, src_key_padding_mask=~mask)
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1)
        out: torch.Tensor = self.head(pooled)
        return out


def main(steps: int = 12, n: int = 192) -> dict[str, object]:
    """Train ``steps`` steps; returns the first and last losses, the per-bucket stats and the uids seen."""
    spec = TokenSpec(patch=56)  # 112 px -> 4 tokens a frame, 224 px -> 16
    ds = build_dataset(n, spec).shuffle(seed=0).with_format("torch")  # shuffled: an indices mapping
    lengths = breakdown_table(ds.with_format("arrow")[:], spec).totals  # or a metadata file you keep
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=1, heads=2, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, 2 * 2**20, max_buckets=3, multiple=8)  # a tiny "GPU"

    data = TokenBucketDataset(ds, spec=spec, plan=plan)  # the Dataset is its own metadata
    print(f"{len(data)} samples, extra columns in every batch: {list(data.meta_columns)}")
    sampler = data.sampler(seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=BucketCollate(data))

    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stats: dict[int, dict[str, float]] = defaultdict(lambda: {"batches": 0, "rows": 0, "real": 0, "padded": 0})
    losses: list[float] = []
    uids: list[str] = []
    step = epoch = 0
    while step < steps:
        sampler.set_epoch(epoch)  # a new order every epoch
        epoch += 1
        for batch in loader:
            if step == steps:
                break
            real = batch["row_mask"]
            logits = model(batch["tokens"], batch["attention_mask"])
            loss = nn.functional.cross_entropy(logits[real], batch["meta"]["label"][real])
            opt.zero_grad()
            loss.backward()
            opt.step()
            info = batch["info"]
            s = stats[info.bucket]
            s["batches"] += 1
            s["rows"] += int(real.sum())
            s["real"] += info.real_tokens
            s["padded"] += info.padded_tokens
            losses.append(loss.item())
            uids += [u for u in batch["meta"]["uid"] if u is not None]
            step += 1
    for bucket in sorted(stats):
        s = stats[bucket]
        b = plan.buckets[bucket]
        print(
            f"bucket {bucket} (bound {b.bound}, batch {b.batch_size}): {int(s['batches'])} batches, "
            f"{int(s['rows'])} samples, padding efficiency {s['real'] / s['padded']:.2f}"
        )
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps ({epoch} epoch(s))")
    return {"losses": losses, "stats": dict(stats), "uids": uids, "epochs": epoch}


if __name__ == "__main__":
    main()
