"""Qwen2-VL-processor-shaped items fed to a tiny VLM through tokenbucket: flattened patches with
``image_grid_thw``, ``input_ids`` with the image placeholders expanded, and ``labels``, batched by
``ModalityCollate(layout="patches")`` and learnt with next-token cross-entropy. A few CPU steps.

    python examples/qwen2vl_train.py

The items are built in memory (no download) as ``Qwen2VLProcessor(images=..., text=...,
return_tensors="pt")`` returns them for one image: ``pixel_values`` ``[t·h·w, C·2·14·14]`` (patch
14, temporal patch 2, each 2x2 merge window's patches consecutive), ``image_grid_thw`` ``[1, 3]``,
``input_ids`` / ``attention_mask`` / ``labels`` ``[1, L]`` where ``L`` counts one placeholder per
merged patch. The metadata (``cameras``, ``frames``, ``height``, ``width``, ``text_tokens``) gives
the same ``L`` under the spec below; the collate checks every item against it. Swap in your
processor's output and your own metadata.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tokenbucket import (
    Batch,
    CostModel,
    ModalityCollate,
    ModelSpec,
    TokenBucketDataset,
    TokenSpec,
    breakdown_table,
    plan_buckets,
)

HIDDEN = 32
PATCH, TEMPORAL, MERGE = 14, 2, 2
WIDTH = 3 * TEMPORAL * PATCH * PATCH  # 1176, a patch row of pixel_values
SIDES = ((56, 56), (56, 84), (112, 56), (84, 84), (112, 112))  # multiples of patch x merge = 28
PAD, VISION_START, VISION_END, IMAGE_PAD, EOS = 0, 1, 2, 3, 4
COLOURS = (5, 6, 7, 8)  # the answer: the image's dominant channel, or grey
FIRST_WORD, VOCAB = 9, 64
# Qwen2-VL: a <|vision_start|> and a <|vision_end|> around each image's merged patches
SPEC = TokenSpec(
    patch=PATCH,
    merge=MERGE,
    tubelet=TEMPORAL,
    resize="max_pixels",
    min_pixels=56 * 56,
    max_pixels=112 * 112,
    special_per_camera=2,
)


def metadata(n: int, seed: int = 0) -> pa.Table:
    """Per sample: one image of one of ``SIDES`` and a prompt of 3-24 words plus answer and EOS."""
    rng = np.random.default_rng(seed)
    sides = [SIDES[k] for k in rng.integers(len(SIDES), size=n)]
    return pa.table(
        {
            "key": [f"q{i:04d}" for i in range(n)],
            "cameras": [1] * n,
            "frames": [1] * n,
            "height": [h for h, _ in sides],
            "width": [w for _, w in sides],
            "text_tokens": rng.integers(3, 25, n) + 2,  # the prompt, the answer, EOS
        }
    )


def to_patches(image: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """One image ``[C, H, W]`` as Qwen2-VL's processor cuts it: ``[t·h·w, C·2·14·14]`` and ``(t, h, w)``."""
    c, height, width = image.shape
    gh, gw = height // PATCH, width // PATCH
    frames = image[None].expand(TEMPORAL, -1, -1, -1)  # a still image fills a whole temporal patch
    x = frames.reshape(1, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # each merge window's 2x2 patches consecutive
    return x.reshape(gh * gw, c * TEMPORAL * PATCH * PATCH), (1, gh, gw)


class QwenLike(Dataset[dict[str, object]]):
    """Items as a Qwen2-VL processor returns them for one image and a chat turn; the labels are
    the answer and EOS only (``-100`` elsewhere). Each item is a pure function of its index."""

    def __init__(self, meta: pa.Table) -> None:
        self.rows = meta.to_pylist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, object]:
        row = self.rows[i]
        g = torch.Generator().manual_seed(i)
        colour = int(torch.randint(len(COLOURS), (), generator=g))
        image = 0.2 * torch.randn(3, row["height"], row["width"], generator=g)
        if colour < 3:
            image[colour] += 1.0  # red, green or blue; else grey
        patches, grid = to_patches(image)
        merged = grid[0] * grid[1] * grid[2] // MERGE**2
        prompt = torch.randint(FIRST_WORD, VOCAB, (row["text_tokens"] - 2,), generator=g)
        ids = torch.cat(
            [
                torch.tensor([VISION_START]),
                torch.full((merged,), IMAGE_PAD),
                torch.tensor([VISION_END]),
                prompt,
                torch.tensor([COLOURS[colour], EOS]),
            ]
        )[None]
        labels = torch.full_like(ids, -100)
        labels[0, -2:] = ids[0, -2:]
        return {
            "pixel_values": patches,
            "image_grid_thw": torch.tensor([grid]),
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": labels,
        }


class TinyVLM(nn.Module):
    """A linear patch embed over ``pixel_values`` rows, Qwen2-VL's merger as a linear over each
    2x2 window's concatenated patches, scattered into the placeholder positions; a small causal
    transformer and a language-model head."""

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.patch = nn.Linear(WIDTH, HIDDEN)
        self.merger = nn.Sequential(nn.LayerNorm(MERGE**2 * HIDDEN), nn.Linear(MERGE**2 * HIDDEN, HIDDEN))
        self.word = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Parameter(torch.randn(max_len, HIDDEN) * 0.02)
        layer = nn.TransformerEncoderLayer(HIDDEN, 4, 2 * HIDDEN, batch_first=True, norm_first=True, dropout=0.0)
        self.decoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits ``[B, L, VOCAB]``."""
        ids = batch["input_ids"]
        vision = self.merger(self.patch(batch["pixel_values"]).reshape(-1, MERGE**2 * HIDDEN))
        slots = ids == IMAGE_PAD
        if int(slots.sum()) != vision.shape[0]:  # the batch's images in row order, one token per window
            raise AssertionError(f"{int(slots.sum())} placeholders for {vision.shape[0]} merged patches")
        x = self.word(ids).masked_scatter(slots[..., None], vision)
        length = ids.shape[1]
        x = x + self.position[:length]
        # right padding under a causal mask: a real token never sees the padding after it
        causal = nn.Transformer.generate_square_subsequent_mask(length)
        logits: torch.Tensor = self.head(self.decoder(x, mask=causal, is_causal=True))
        return logits


def main(epochs: int = 3, n: int = 64) -> dict[str, object]:
    """Train ``epochs`` epochs; returns the losses, the indices trained on and the dataset size."""
    meta = metadata(n)
    lengths = breakdown_table(meta, SPEC).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=2, heads=4, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, 4 * 2**20, max_buckets=3, multiple=8)  # a tiny "GPU"

    data = TokenBucketDataset(QwenLike(meta), metadata=meta, spec=SPEC, plan=plan)
    sampler = data.sampler(seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=ModalityCollate(data, layout="patches"))
    print(f"{len(data)} samples in {len(plan.buckets)} buckets: {[(b.bound, b.batch_size) for b in plan.buckets]}")

    torch.manual_seed(0)
    model = TinyVLM(max_len=max(b.bound for b in plan.buckets))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses: list[float] = []
    seen: list[int] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            logits = model(batch)
            # next-token prediction: position i predicts labels[i + 1]; -100 (prompt, padding) ignored
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())
            opt.zero_grad()
            torch.autograd.backward(loss)
            opt.step()
            losses.append(loss.item())
            seen += batch["info"].indices
        print(f"epoch {epoch}: loss {losses[-1]:.3f}")
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    print(f"trained on {len(seen)} samples, {len(set(seen))} distinct of {len(data)}")
    return {"losses": losses, "seen": seen, "n": len(data), "epochs": epochs}


if __name__ == "__main__":
    main()
