"""A few CPU steps of a tiny model under Hugging Face ``transformers.Trainer`` fed by tokenbucket,
checkpointed (the sampler's position goes into each checkpoint folder) and resumed exactly.

    python examples/hf_trainer_train.py [OUT_DIR]   # or: torchrun --nproc-per-node 2 ... (ddp_backend="gloo")

``BucketTrainer`` takes the Trainer's arguments plus ``sampler=`` (the dataset's ``sampler()``):
it builds the train loader over that batch sampler itself (no second rank split), passes the
model only the tensor entries its ``forward`` names, and checks a resume against the sampler
state saved in the checkpoint. Resume with ``trainer.train(resume_from_checkpoint=path)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from torch import nn

from tokenbucket import (
    BucketCollate,
    BucketTrainer,
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


def build(n: int = 96) -> tuple[TokenBucketDataset, BucketCollate]:
    """The dataset (bucketed by a plan for a tiny "GPU") and its collate."""
    meta = metadata(n)
    lengths = breakdown_table(meta, SPEC).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=1, heads=2, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, 4 * 2**20, max_buckets=3, multiple=8)
    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=meta, spec=SPEC, plan=plan)
    return data, BucketCollate(data, cost_model=cost)


class Denoiser(nn.Module):
    """A one-layer transformer that learns to reproduce its input on real tokens; ``forward``
    takes the batch's model keys and returns ``{"loss": ...}`` as the Trainer expects."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(HIDDEN, 2, 2 * HIDDEN, batch_first=True, dropout=0.0)
        self.net = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.net(tokens, src_key_padding_mask=~attention_mask)
        return {"loss": ((out - tokens) ** 2)[attention_mask].mean()}  # padding and empty rows do not count


def arguments(out: Path, **kwargs: object) -> transformers.TrainingArguments:
    """CPU training arguments for these examples and tests."""
    options: dict[str, object] = {
        "output_dir": str(out),
        "use_cpu": True,
        "learning_rate": 3e-3,
        "report_to": "none",
        "disable_tqdm": True,
        "save_strategy": "no",
        "logging_strategy": "no",
        "seed": 0,
    }
    options.update(kwargs)
    return transformers.TrainingArguments(**options)  # type: ignore[arg-type]


def main(out: Path, steps: int = 6) -> BucketTrainer:
    torch.manual_seed(0)
    data, collate = build()
    args = arguments(out, max_steps=steps, save_strategy="steps", save_steps=steps // 2)
    trainer = BucketTrainer(
        model=Denoiser(),
        args=args,
        train_dataset=data,
        data_collator=collate,
        sampler=data.sampler(seed=0),  # built before any process group: fine
    )
    result = trainer.train()
    ckpt = out / f"checkpoint-{steps // 2}"
    resumed = BucketTrainer(
        model=Denoiser(),
        args=args,
        train_dataset=data,
        data_collator=collate,
        sampler=data.sampler(seed=0),
    )
    resumed.train(resume_from_checkpoint=str(ckpt))  # the Trainer skips the trained batches; checked
    same = resumed.last_info is not None and trainer.last_info is not None
    same = same and resumed.last_info.indices == trainer.last_info.indices  # type: ignore[union-attr]
    print(f"done: {result.global_step} steps, loss {result.training_loss:.4f}; resumed at the same batch: {same}")
    return trainer


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/hf_trainer"))
