"""A few steps of a tiny model under Hugging Face Accelerate (CPU, one process) with tokenbucket's
sampler, checkpointed and resumed through ``accelerator.save_state`` / ``load_state``.

    python examples/accelerate_train.py [OUT_DIR]          # or: accelerate launch --num_processes 2 ...
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from tokenbucket import Batch, BucketBatchSampler, plan_id_of, prepare_loader


def collate(ids: list[int]) -> Batch:
    return Batch(x=torch.tensor(ids, dtype=torch.float32)[:, None] / 100)


def main(out: Path) -> None:
    sampler = BucketBatchSampler([i % 3 for i in range(60)], [4, 5, 6], plan_id=plan_id_of("example"), seed=1)
    loader = DataLoader(list(range(60)), batch_sampler=sampler, collate_fn=collate)  # before the Accelerator: fine
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_loader(accelerator, loader)  # not accelerator.prepare(loader): that splits it twice
    for epoch in range(sampler.epoch, 2):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            loss = model(batch["x"]).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if epoch == 1 and step == 2:
                accelerator.save_state(str(out / "ckpt"))  # resume: accelerator.load_state(...), no skip_first_batches
    accelerator.print(f"done: epoch {sampler.epoch}, {sampler.step} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "accelerate-run"))
