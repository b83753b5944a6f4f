"""A LeRobot-shaped dataset fed to a tiny VLA through tokenbucket: per-camera frames stacked by
``ModalityCollate(layout="stacked")``, a state token, the task's words and an action chunk
learnt with a masked MSE. A few CPU steps under the monitor.

    python examples/lerobot_vla_train.py

The items are built in memory (no download) exactly as ``LeRobotDataset.__getitem__`` returns
them: ``observation.images.<cam>`` ``[T, C, H, W]`` floats in [0, 1], ``<cam>_is_pad``,
``observation.state`` ``[S]``, ``action`` ``[chunk, A]`` with ``action_is_pad``, the ``task``
string and the index tensors. The metadata table (``cameras``, ``frames``, ``height``, ``width``,
``text_tokens``, ``chunk``) is what the plan is sized from; the collate checks every item against
it. Swap in ``LeRobotDataset(...)`` and your own metadata (``tokenbucket lerobot`` writes it).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tokenbucket import (
    Batch,
    BucketMonitor,
    CostModel,
    CountRule,
    ModalityCollate,
    ModelSpec,
    TokenBucketDataset,
    TokenSpec,
    breakdown_table,
    format_summary,
    plan_buckets,
)

HIDDEN = 32
PATCH = 16  # 48 px -> 3x3 patches a frame, 64 px -> 4x4
CAMERAS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
MAX_FRAMES = 2
STATE, ACTION = 8, 6
MAX_CHUNK = 8
WORDS = ("pick", "place", "push", "the", "red", "green", "blue", "cube", "cup", "into", "bowl", "left", "right")
SPEC = TokenSpec(
    patch=PATCH,
    camera_names=CAMERAS,  # the flat schema's camera j is named by its item key
    proprio=CountRule(count=1),  # one state token
    action=CountRule(column="chunk"),  # one query token per action step
)


def metadata(n: int, seed: int = 0) -> pa.Table:
    """Per sample: 2-3 cameras of 1-2 frames at 48 or 64 px, the task's word count, the chunk."""
    rng = np.random.default_rng(seed)
    side = rng.choice([48, 64], n)
    return pa.table(
        {
            "key": [f"ep{i // 8:03d}_{i % 8}" for i in range(n)],
            "cameras": rng.choice([2, 3], n),
            "frames": rng.choice([1, MAX_FRAMES], n),
            "height": side,
            "width": side,
            "text_tokens": rng.integers(3, 8, n),
            "chunk": rng.choice([4, MAX_CHUNK], n),
        }
    )


class LeRobotLike(Dataset[dict[str, object]]):
    """Items as ``LeRobotDataset`` returns them (with ``delta_timestamps`` on the cameras and the
    action), each a pure function of its index. The action follows the state and the top camera's
    brightness, so a model that reads both can learn it."""

    def __init__(self, meta: pa.Table) -> None:
        self.rows = meta.to_pylist()
        self.mix = torch.randn(STATE, ACTION, generator=torch.Generator().manual_seed(1)) / STATE**0.5

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, object]:
        row = self.rows[i]
        g = torch.Generator().manual_seed(i)
        t, side, chunk = row["frames"], row["height"], row["chunk"]
        item: dict[str, object] = {}
        brightness = torch.rand((), generator=g)
        for name in CAMERAS[: row["cameras"]]:
            frames = brightness + 0.1 * torch.rand(t, 3, side, side, generator=g)
            item[name] = frames.clamp(0, 1)
            item[f"{name}_is_pad"] = torch.zeros(t, dtype=torch.bool)
        state = torch.randn(STATE, generator=g)
        steps = torch.linspace(0, 1, chunk)[:, None]
        item["observation.state"] = state
        item["action"] = state @ self.mix + steps * (2 * brightness - 1)
        item["action_is_pad"] = torch.zeros(chunk, dtype=torch.bool)
        item["task"] = " ".join(WORDS[int(k)] for k in torch.randint(len(WORDS), (row["text_tokens"],), generator=g))
        item["timestamp"] = torch.tensor((i % 8) / 30)
        item["frame_index"] = torch.tensor(i % 8)
        item["episode_index"] = torch.tensor(i // 8)
        item["index"] = torch.tensor(i)
        item["task_index"] = torch.tensor(0)
        return item


def tokenize(tasks: list[str | None], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Word ids ``[B, L]`` (1-based; 0 pads) and their mask; empty rows (``None``) are all padding."""
    words = [t.split() if t is not None else [] for t in tasks] + [[]] * (rows - len(tasks))
    length = max(1, *(len(w) for w in words))
    ids = torch.zeros(rows, length, dtype=torch.long)
    for r, w in enumerate(words):
        ids[r, : len(w)] = torch.tensor([WORDS.index(x) + 1 for x in w], dtype=torch.long)
    return ids, ids > 0


class TinyVLA(nn.Module):
    """Patch embed per frame (+ camera and frame embeddings), task words, a state token and one
    query per action step through a small transformer; a linear head reads the queries."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, HIDDEN, PATCH, stride=PATCH)
        self.camera = nn.Parameter(torch.zeros(len(CAMERAS), HIDDEN))
        self.frame = nn.Parameter(torch.zeros(MAX_FRAMES, HIDDEN))
        self.word = nn.Embedding(len(WORDS) + 1, HIDDEN, padding_idx=0)
        self.state = nn.Linear(STATE, HIDDEN)
        self.query = nn.Parameter(torch.randn(MAX_CHUNK, HIDDEN) * 0.02)
        layer = nn.TransformerEncoderLayer(HIDDEN, 4, 2 * HIDDEN, batch_first=True, norm_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, ACTION)

    def tokens(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence ``[B, L, HIDDEN]`` and its mask: vision, text, state, action queries."""
        px = batch["pixel_values"]  # [B, cameras, T, C, H, W], zero padded
        b, k, t = px.shape[:3]
        x = self.patch(px.flatten(0, 2))  # [B·K·T, D, h, w]
        h, w = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2).reshape(b, k, t, h * w, HIDDEN)
        x = x + self.camera[:k, None, None] + self.frame[None, :t, None]
        # a smaller image's patches past its own size are padding
        sizes = -(-batch["image_sizes"] // PATCH)  # [B, K, 2] patches
        ys, xs = torch.arange(h)[:, None], torch.arange(w)[None, :]
        inside = (ys < sizes[..., 0, None, None]) & (xs < sizes[..., 1, None, None])  # [B, K, h, w]
        vision_mask = batch["frame_mask"][..., None] & inside.flatten(2)[:, :, None]  # [B, K, T, h·w]
        ids, text_mask = tokenize(batch["task"], b)
        chunk = batch["action"].shape[1]
        seq = torch.cat(
            [
                x.reshape(b, -1, HIDDEN),
                self.word(ids),
                self.state(batch["observation.state"])[:, None],
                self.query[:chunk].expand(b, -1, -1),
            ],
            1,
        )
        state_mask = batch["row_mask"][:, None]
        mask = torch.cat([vision_mask.reshape(b, -1), text_mask, state_mask, batch["action_mask"]], 1)
        return seq, mask

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The predicted chunk ``[B, chunk, A]`` and the real-token mask ``[B, L]``."""
        seq, mask = self.tokens(batch)
        # an empty row attends to its own (zero) tokens rather than to nothing (NaN)
        keep = mask | ~batch["row_mask"][:, None]
        out = self.encoder(seq, src_key_padding_mask=~keep)
        pred: torch.Tensor = self.head(out[:, -batch["action"].shape[1] :])
        return pred, mask


def main(epochs: int = 3, n: int = 48, log: Path | None = None) -> dict[str, object]:
    """Train ``epochs`` epochs; returns the losses, the indices trained on and the dataset size."""
    meta = metadata(n)
    lengths = breakdown_table(meta, SPEC).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=2, heads=4, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, 6 * 2**20, max_buckets=3, multiple=8)  # a tiny "GPU"

    data = TokenBucketDataset(LeRobotLike(meta), metadata=meta, spec=SPEC, plan=plan)
    sampler = data.sampler(seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=ModalityCollate(data, layout="stacked"))
    print(f"{len(data)} samples in {len(plan.buckets)} buckets: {[(b.bound, b.batch_size) for b in plan.buckets]}")

    torch.manual_seed(0)
    model = TinyVLA()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses: list[float] = []
    seen: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        sinks = [log if log is not None else Path(tmp) / "run.jsonl"]
        with BucketMonitor(plan, sinks=sinks, cost_model=cost, data=data, memory=None) as monitor:
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                for batch in loader:
                    info = batch["info"]
                    with monitor.step(info, batch):
                        pred, mask = model(batch)
                        # the model's real tokens are the metadata's breakdown, sample by sample
                        real = batch["row_mask"]
                        if mask[real].sum(1).tolist() != data.lengths[list(info.indices)].tolist():
                            raise AssertionError("the model's tokens disagree with the breakdown")
                        err = (pred - batch["action"]) ** 2
                        loss = err[batch["action_mask"]].mean()  # empty rows and short chunks do not count
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                    losses.append(loss.item())
                    seen += info.indices
                print(f"epoch {epoch}: loss {losses[-1]:.3f}")
            print(format_summary(monitor.summary()))
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    print(f"trained on {len(seen)} samples, {len(set(seen))} distinct of {len(data)}")
    return {"losses": losses, "seen": seen, "n": len(data), "epochs": epochs}


if __name__ == "__main__":
    main()
