"""A tiny transformers Qwen2-VL trained on two-cap packed rows: the plan from ``plan_packing_2d``,
the batches from ``PackedBatchSampler2D`` through a ``DataLoader``, the rows laid out by
``PackedModalityCollate``. CPU, random init, no download; a few seconds.

    python examples/train_packed_qwen2vl.py

The cost model is the tiny model's own (its config read by ``staged_from_config``): the caps and
the predicted peak are then those of the model trained, against a toy budget of 4 MiB. The
``qwen2-vl-2b`` preset's caps on an H100 are thousands of tokens a row, which would put these
small samples all in one row and show no packing at all. Swap in your config and GPU budget.

Every row holds whole samples with at most ``row_tokens`` LLM tokens and ``row_patches`` tower
patches (NOTE [ Two-cap packed rows ]); the sampler packs again each epoch and hands each step's
batches to the ranks balanced (NOTE [ Two-cap packing each epoch ]); the collate keeps the
sampler's rows (NOTE [ Rows through the workers ]) and hands the model the real tokens as one
padding-free sequence with per-sample 3-D rope positions (NOTE [ Packed rows into flash-attn ]).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
import transformers
from torch.utils.data import DataLoader, Dataset

from tokenbucket import (
    HFConfig,
    PackedBatchSampler2D,
    PackedModalityCollate,
    Sample,
    StagedCostModel,
    StagedLengthModel,
    StagedPackedModel,
    TokenBucketDataset,
    TokenSpec,
    plan_packing_2d,
    staged_from_config,
)

SAMPLES, EPOCHS, BUDGET = 48, 2, 4 * 2**20
IMAGE, VIDEO, START, END, WORDS = 100, 101, 102, 103, 96  # placeholder / marker ids; text ids below 96
SIDES = (56, 84, 112, 168)  # multiples of patch x merge = 28
# Qwen2-VL: each image's merged patches between a <|vision_start|> and a <|vision_end|>
SPEC = TokenSpec(patch=14, merge=2, tubelet=2, resize="max_pixels", min_pixels=56 * 56, max_pixels=28 * 28 * 64,
                 special_per_camera=2)  # fmt: skip


def metadata(n: int) -> pa.Table:
    """One or two images a sample, 56 .. 168 px a side, 3 .. 39 text tokens."""
    rng = np.random.default_rng(0)
    return pa.Table.from_pylist(
        [
            {
                "key": f"s{i:03d}",
                "cameras": int(rng.integers(1, 3)),
                "frames": 1,
                "height": int(rng.choice(SIDES)),
                "width": int(rng.choice(SIDES)),
                "text_tokens": int(rng.integers(3, 40)),
            }
            for i in range(n)
        ]
    )


class QwenItems(Dataset[dict[str, torch.Tensor]]):
    """Items as ``Qwen2VLProcessor(images=..., text=..., return_tensors="pt")`` writes them: the
    images first, then a text that counts up from a start token (something to learn), labelled."""

    def __init__(self, meta: pa.Table) -> None:
        self.rows = meta.to_pylist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.rows[i]
        rng = torch.Generator().manual_seed(i)
        gh, gw = row["height"] // 14, row["width"] // 14
        image = [START, *[IMAGE] * (gh * gw // 4), END] * row["cameras"]
        text = [(i * 7 + k) % WORDS for k in range(row["text_tokens"])]
        ids = torch.tensor([*image, *text])
        labels = ids.clone()
        labels[: len(image)] = -100
        return {
            "input_ids": ids[None],
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "mm_token_type_ids": ids.eq(IMAGE).int()[None],
            "labels": labels[None],
            "pixel_values": torch.randn(row["cameras"] * gh * gw, 3 * 2 * 14 * 14, generator=rng),
            "image_grid_thw": torch.tensor([[1, gh, gw]] * row["cameras"]),
        }


def tiny_qwen2_vl() -> transformers.Qwen2VLConfig:
    return transformers.Qwen2VLConfig(
        vision_config={"depth": 2, "embed_dim": 32, "num_heads": 2, "hidden_size": 32, "mlp_ratio": 2},
        text_config={
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 64, "vocab_size": 128, "bos_token_id": None, "eos_token_id": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
        },
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    config = tiny_qwen2_vl()
    meta = metadata(SAMPLES)
    # the cost stage: the tiny model's own staged cost, priced per packed row
    staged = staged_from_config(HFConfig("<tiny qwen2-vl>", config.to_dict()))
    cost = StagedPackedModel(StagedLengthModel(StagedCostModel(staged)))
    # the cost model counts an image's start / end tokens as text: 2 a camera, as SPEC does
    samples = [Sample(images=r["cameras"], height=r["height"], width=r["width"],
                      text_tokens=r["text_tokens"] + 2 * r["cameras"]) for r in meta.to_pylist()]  # fmt: skip
    loads = cost.loads(samples)
    plan = plan_packing_2d(loads, cost, BUDGET, rows_per_batch=(2, 4), multiple=8)
    print(
        f"{SAMPLES} samples in {len(plan.batches)} batches of {plan.rows_per_batch} rows: row_tokens={plan.row_tokens}, "
        f"row_patches={plan.row_patches}, predicted peak at the caps {plan.predicted_peak_bytes / 2**20:.2f} MiB "
        f"of {BUDGET / 2**20:.0f} MiB"
    )
    data = TokenBucketDataset(QwenItems(meta), metadata=meta, spec=SPEC, plan=plan.bucket_plan(loads))
    sampler = PackedBatchSampler2D.from_dataset(data, plan, loads, cost)
    collate = PackedModalityCollate(data, plan.row_tokens, plan.rows_per_batch, row_patches=plan.row_patches,
                                    rope_config=config, mask_dtype=None, cost_model=cost)  # fmt: skip
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=collate)

    model = transformers.Qwen2VLForConditionalGeneration(config).to(torch.float32).train()
    model.set_attn_implementation("sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, seen, step = [], [], 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        epoch_losses = []
        for batch in loader:
            # NOTE [ Packed rows into flash-attn ]: the real tokens as one padding-free sequence
            real = batch["segment_ids"] > 0
            positions = torch.cat([batch["text_position_ids"][None], batch["position_ids"]])[:, real][:, None]
            out = model(
                input_ids=batch["input_ids"][real][None],
                labels=batch["labels"][real][None],
                position_ids=positions,
                pixel_values=batch["pixel_values"],
                image_grid_thw=batch["image_grid_thw"],
                use_cache=False,
            )
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            step += 1
            rows = [row for row in batch["index"] if row]
            tokens = real.sum(-1).tolist()
            patches = [
                int(batch["image_grid_thw"][batch["image_rows"] == r].prod(-1).sum()) for r in range(len(tokens))
            ]
            seen += [i for row in rows for i in row]
            losses.append(out.loss.item())
            epoch_losses.append(losses[-1])
            print(
                f"step {step}: {len(rows)} rows, tokens {tokens}, patches {patches}, predicted peak "
                f"{batch['info'].predicted_peak_bytes / 2**20:.3f} MiB, loss {losses[-1]:.4f}"
            )
        print(f"epoch {epoch}: loss {np.mean(epoch_losses):.4f}")
    print(f"caps: row_tokens {plan.row_tokens}, row_patches {plan.row_patches}")
    print(f"loss {np.mean(losses[:3]):.4f} -> {np.mean(losses[-3:]):.4f} over {step} steps")
    print(f"trained on {len(seen)} samples, {len(set(seen))} distinct of {SAMPLES}")


if __name__ == "__main__":
    main()
