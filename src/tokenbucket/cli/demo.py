"""The demo's training part: a short CPU run of a tiny transformer under the monitor.

The samples are the demo dataset's own (their metadata), tokenised coarsely (patch 112) so a CPU
can train on them in seconds; their token sequences are random embeddings of the exact length
the metadata gives. A small "GPU" budget makes the plan use several buckets and batch sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from torch import nn
from torch.utils.data import DataLoader

HIDDEN = 32


def train_under_monitor(table: pa.Table, out_dir: Path, *, samples: int = 384,
                        budget_bytes: int = 96 * 2**20) -> dict[str, Any]:
    """Plans ``samples`` rows of ``table`` for a tiny model and budget, trains one epoch under a
    :class:`~tokenbucket.monitor.hooks.BucketMonitor`; returns the summary, the log and the plan."""
    from tokenbucket.cost.memory import CostModel
    from tokenbucket.cost.model import ModelSpec
    from tokenbucket.monitor.hooks import BucketMonitor
    from tokenbucket.plan.buckets import plan_buckets
    from tokenbucket.testing import RandomTokens
    from tokenbucket.tokens.breakdown import breakdown_table
    from tokenbucket.tokens.spec import TokenSpec
    from tokenbucket.train.collate import BucketCollate, TokenBucketDataset

    table = table.slice(0, samples)
    spec = TokenSpec(patch=112)
    lengths = breakdown_table(table, spec).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=2, heads=4, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, budget_bytes, max_buckets=6, multiple=32, on_oversize="reject")
    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=table, spec=spec, plan=plan)
    loader = DataLoader(data, batch_sampler=data.sampler(seed=0), collate_fn=BucketCollate(data, cost_model=cost))

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(HIDDEN, 4, 4 * HIDDEN, batch_first=True, norm_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(batch: dict[str, Any]) -> float:
        mask = batch["attention_mask"]
        out = model(batch["tokens"], src_key_padding_mask=~mask)
        loss = ((out - batch["tokens"]) ** 2)[mask].mean()  # a denoising toy target on real tokens only
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    log = out_dir / "run.jsonl"
    log.unlink(missing_ok=True)
    with BucketMonitor(plan, sinks=[log], cost_model=cost, data=data) as monitor:
        train = monitor.guard(train_step, policy="split")  # an OOM would split the batch, not end the run
        losses = [train(batch) for batch in loader]
        summary = monitor.summary()
    return {"summary": summary, "log": log, "plan": plan, "steps": len(losses), "samples": table.num_rows,
            "budget_bytes": budget_bytes}
