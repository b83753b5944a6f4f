"""Plain DDP under ``torchrun``: tokenbucket's sampler, a DataLoader with workers, checkpoints that
survive an elastic restart.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 \
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 examples/torchrun_train.py OUT_DIR

(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with restarts, torchrun's shared rendezvous store can
hand a restarted worker its dead peer's address, pytorch/pytorch#135712.)

Each process reads its rank and world size from the launcher (the sampler is built before the
process group and asks ``torch.distributed`` when an epoch starts). Every ``--every`` steps rank 0
writes ``OUT_DIR/ckpt.pt`` (model, optimizer and the sampler's position *after the batch just
trained*, not after the batches the workers fetched ahead). When torchrun restarts the workers
(``--max-restarts``), they load that checkpoint and continue from the next batch. ``--fail-at
EPOCH:STEP`` makes rank 1 die after that step on the first attempt, to see it happen. Every rank
appends what it trained to ``OUT_DIR/steps-rank{R}.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
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
from tokenbucket.testing import RandomTokens

HIDDEN = 16


def dataset(n: int = 240) -> tuple[TokenBucketDataset, CostModel]:
    rng = np.random.default_rng(0)
    side = rng.choice([224, 336], n).tolist()
    meta = {
        "key": [f"ep{i:04d}" for i in range(n)],
        "cameras": rng.choice([1, 2, 3], n).tolist(),
        "frames": rng.choice([1, 2], n).tolist(),
        "height": side,
        "width": side,
        "text_tokens": rng.integers(4, 24, n).tolist(),
    }
    spec = TokenSpec(patch=56)
    lengths = breakdown_table(meta, spec).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=1, heads=2, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, 6 * 2**20, max_buckets=3, multiple=8)
    return TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=meta, spec=spec, plan=plan), cost


def save(state: dict[str, object], path: Path) -> None:
    """Write ``path`` whole or not at all (a crash mid-write leaves the last checkpoint)."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("out", type=Path, help="directory for the checkpoint and the step logs")
    args.add_argument("--epochs", type=int, default=2, help="epochs to train")
    args.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    args.add_argument("--fail-at", default=None, help="EPOCH:STEP after which rank 1 dies on the first attempt")
    opts = args.parse_args(argv)

    data, cost = dataset()
    sampler = data.sampler(seed=3)  # before init_process_group: rank and world are read per epoch
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(HIDDEN, HIDDEN))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    opts.out.mkdir(parents=True, exist_ok=True)  # every rank: whoever comes first makes it
    ckpt = opts.out / "ckpt.pt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])
    fail = tuple(int(x) for x in opts.fail_at.split(":")) if opts.fail_at else None

    loader = DataLoader(data, batch_sampler=sampler, collate_fn=BucketCollate(data, cost_model=cost), num_workers=2)
    with open(opts.out / f"steps-rank{rank}.jsonl", "a") as log:
        for epoch in range(sampler.epoch, opts.epochs):
            sampler.set_epoch(epoch)
            for batch in loader:
                info = batch["info"]
                mask = batch["attention_mask"]
                loss = ((model(batch["tokens"]) - batch["tokens"]) ** 2)[mask].mean()
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces here: unequal step counts would hang
                optimizer.step()
                step = info.position[1]
                record = {"attempt": attempt, "epoch": epoch, "step": step, "bucket": info.bucket}
                log.write(json.dumps({**record, "ids": list(info.indices)}) + "\n")
                log.flush()
                if step % opts.every == 0 and rank == 0:
                    sampler_state = sampler.state_dict(after=info)  # not sampler.state_dict(): workers ran ahead
                    save(
                        {
                            "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "sampler": sampler_state,
                        },
                        ckpt,
                    )
                if step % opts.every == 0:
                    dist.barrier()  # the checkpoint is on disk before any rank can die
                if (epoch, step) == fail and rank == 1 and attempt == 0:
                    sys.exit(1)  # a lost worker: torchrun restarts the group from the checkpoint
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
