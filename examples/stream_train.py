"""Webdataset shards streamed into a training loop: bucketed on the fly, equal steps per rank,
under the monitor.

    python examples/stream_train.py [SHARD_DIR]      # writes demo shards there first if it is empty

The shards hold mixture A's shapes, scaled down (patch 112), each sample a ``.json`` metadata
member and a ``tokens.npy`` sequence of the length its metadata gives. Swap in your own shards
and model; keep the four steps: index the shards' metadata, plan, ``.compose(index.bucketed(...))``,
and a ``StreamCollate`` on the loader.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import webdataset as wds
from torch import nn
from torch.utils.data import DataLoader

from tokenbucket import (
    BucketMonitor,
    CostModel,
    ModelSpec,
    StreamCollate,
    TokenSpec,
    breakdown_table,
    format_summary,
    index_shards,
    plan_buckets,
)
from tokenbucket.testing import mixture_a

HIDDEN = 16
SPEC = TokenSpec(patch=112)


def write_demo_shards(root: Path, n: int = 320, shards: int = 4) -> list[str]:
    rows = mixture_a(n, seed=1).to_pylist()
    lengths = breakdown_table(pa.Table.from_pylist(rows), SPEC).totals
    urls = []
    for s in range(shards):
        urls.append(str(root / f"shard-{s:03d}.tar"))
        with wds.TarWriter(urls[-1]) as sink:
            for i in range(s * n // shards, (s + 1) * n // shards):
                tokens = np.random.default_rng(i).standard_normal((int(lengths[i]), HIDDEN)).astype(np.float32)
                sink.write({"__key__": rows[i]["key"], "json": json.dumps(rows[i]).encode(), "tokens.npy": tokens})
    return urls


def main(root: Path, *, num_workers: int = 2, steps: int = 12) -> float:
    urls = sorted(str(p) for p in root.glob("*.tar")) or write_demo_shards(root)
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=2, heads=2, precision="fp32", attention="eager"))
    budget = 48 * 2**20

    # 1. the shards' metadata alone: every sample's token count, per shard, in order
    index = index_shards(urls, SPEC)
    # 2. a plan from those counts (too-long samples are rejected by the stage, with their keys)
    plan = plan_buckets(
        np.concatenate([np.asarray(n) for n in index.lengths]),
        cost,
        budget,
        max_buckets=4,
        multiple=16,
        on_oversize="reject",
    )
    # 3. every worker emits the same number of batches: equal steps on every rank, none left out
    stage = index.bucketed(plan, SPEC, num_workers=num_workers, max_buffered=256, rejected=str(root / "rejected.jsonl"))
    data = (
        wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, empty_check=False)
        .decode(only=["tokens.npy"])  # the .json is the stage's to read (and reject)
        .compose(stage)
    )
    # 4. padded to the bucket's shape, with masks and a BatchInfo for the monitor
    loader = DataLoader(data, batch_size=None, num_workers=num_workers, collate_fn=StreamCollate("tokens.npy"))

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(HIDDEN, 2, 2 * HIDDEN, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(batch: dict[str, torch.Tensor]) -> float:
        mask = batch["attention_mask"]
        if not bool(mask.any()):  # an equal-steps filler: nothing to learn, the step still happens
            return float("nan")
        out = model(batch["tokens"], src_key_padding_mask=~mask)
        loss = ((out - batch["tokens"]) ** 2)[mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    loss = float("nan")
    with BucketMonitor(plan, sinks=[root / "run.jsonl"], cost_model=cost) as monitor:
        train = monitor.guard(train_step)
        for step, batch in enumerate(loader):
            if step == steps:
                break
            loss = train(batch)
            info = batch["info"]
            print(
                f"step {step}: bucket {info.bucket} {info.shape} real {info.real_tokens}/{info.padded_tokens} "
                f"tokens, loss {loss:.3f}"
            )
        print(format_summary(monitor.summary()))
    return loss


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
