"""Multi-camera video clips fed to a tiny Qwen2-VL through tokenbucket's real pipeline: the token
spec read from the model's own config (each camera's frames one clip through the video
processor's rule), a plan and its bucket sampler, processor-shaped video items batched by
``ModalityCollate``, and ``transformers``' ``Qwen2VLForConditionalGeneration`` learning the
answer. A few CPU steps, no download, no weights.

    python examples/train_video_qwen2vl.py

The model is built from a tiny ``Qwen2VLConfig`` (2 layers, hidden 32); its ``config.json`` and a
``video_preprocessor_config.json`` (4-12 merged patches a frame, so the clips stay small) go to a
temporary folder, which ``token_spec_from_hf`` reads as it reads a real checkpoint's. Each sample
holds 1-3 cameras of 2-7 frames at its own sizes; each item is what
``Qwen2VLProcessor(videos=..., text=..., return_tensors="pt")`` returns for it:
``pixel_values_videos`` ``[Σ t·h·w, 3·2·14·14]`` and ``video_grid_thw`` ``[clips, 3]`` (frames
resized by ``smart_resize``, padded to a whole temporal patch by the last frame, each pair merged),
``input_ids`` with ``t·h·w / 4`` ``<|video_pad|>`` a clip between ``<|vision_start|>`` and
``<|vision_end|>``, ``mm_token_type_ids``, ``attention_mask`` and ``labels`` (the answer only). The
processor is written out here because transformers' video processors need torchvision; swap in
the real one and your own metadata. Every batch's video tokens are checked against what the
breakdown counted for its samples, by the collate (``video_token_id``) and below.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

from tokenbucket import (
    CostModel,
    ModalityCollate,
    ModelSpec,
    TokenBucketDataset,
    TokenSpec,
    breakdown_table,
    plan_buckets,
    token_spec_from_hf,
)
from tokenbucket import smart_resize as qwen_resize

HIDDEN, LAYERS, HEADS, KV_HEADS = 32, 2, 4, 2
PATCH, TEMPORAL, MERGE = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = 28 * 28 * 4, 28 * 28 * 12  # the video processor's bounds on a frame's area
PAD, EOS = 0, 1
COLOURS = (2, 3, 4, 5)  # the answer: the first camera's dominant channel, or grey
FIRST_WORD, VOCAB = 6, 96
IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END = 90, 91, 92, 93


def tiny_config() -> Qwen2VLConfig:
    """Qwen2-VL's architecture at toy size: M-RoPE sections summing to half the head dim."""
    return Qwen2VLConfig(
        text_config={
            "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "max_position_embeddings": 1024, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
            "bos_token_id": EOS, "eos_token_id": EOS, "pad_token_id": PAD,
        },
        vision_config={
            "depth": 1, "embed_dim": HIDDEN, "hidden_size": HIDDEN, "num_heads": HEADS, "mlp_ratio": 2,
            "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL, "in_channels": 3,
        },
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
    )  # fmt: skip


def write_checkpoint(cfg: Qwen2VLConfig, folder: Path) -> TokenSpec:
    """``config.json`` and ``video_preprocessor_config.json`` as a checkpoint holds them, and the
    token spec tokenbucket reads from them (``feed="video"``: each camera's frames one clip)."""
    cfg.save_pretrained(folder)
    video = {
        "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "patch_size": PATCH,
        "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
    }  # fmt: skip
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video))
    spec = token_spec_from_hf(folder)
    if spec.feed != "video":
        raise AssertionError(f"a Qwen2-VL config should give clips, but got feed={spec.feed!r}")
    return spec


def metadata(n: int, seed: int = 0) -> pa.Table:
    """Per sample: 1-3 cameras of 2-7 frames at 28-140 px a side, each its own size; the text: a
    prompt of 2-12 words, the vision start/end around each clip, the answer and EOS."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        cams = [
            {"name": f"cam{c}", "frames": int(rng.integers(2, 8)), "height": int(rng.integers(28, 141)),
             "width": int(rng.integers(28, 141))}
            for c in range(int(rng.integers(1, 4)))
        ]  # fmt: skip
        rows.append(
            {"key": f"clip{i:03d}", "cameras": cams, "text_tokens": int(rng.integers(2, 13)) + 2 * len(cams) + 2}
        )
    return pa.Table.from_pylist(rows)


def smart_resize(height: int, width: int) -> tuple[int, int]:
    """The video processor's resize: both sides multiples of 28, the area within the bounds."""
    return qwen_resize(height, width, PATCH * MERGE, MIN_PIXELS, MAX_PIXELS, floor=0)


def to_patches(frames: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """A resized clip ``[T, C, H, W]`` as the processor flattens it: ``[t·h·w, C·2·14·14]`` and
    ``(t, h, w)`` (the last frame repeated up to a whole temporal patch; merge windows together)."""
    if frames.shape[0] % TEMPORAL:
        frames = torch.cat([frames, frames[-1:].expand(TEMPORAL - frames.shape[0] % TEMPORAL, -1, -1, -1)])
    t, c, height, width = frames.shape
    gt, gh, gw = t // TEMPORAL, height // PATCH, width // PATCH
    x = frames.reshape(gt, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * TEMPORAL * PATCH * PATCH), (gt, gh, gw)


class VideoChats(Dataset[dict[str, torch.Tensor]]):
    """Processor-shaped items: every camera one clip; the answer names the first camera's colour.
    Each item is a pure function of its index."""

    def __init__(self, meta: pa.Table) -> None:
        self.rows = meta.to_pylist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.rows[i]
        g = torch.Generator().manual_seed(i)
        colour = int(torch.randint(len(COLOURS), (), generator=g))
        patches, grids, ids = [], [], []
        for cam in row["cameras"]:
            h, w = smart_resize(cam["height"], cam["width"])
            frames = 0.2 * torch.randn(cam["frames"], 3, h, w, generator=g)
            tint = colour if cam is row["cameras"][0] else int(torch.randint(len(COLOURS), (), generator=g))
            if tint < 3:
                frames[:, tint] += 1.0  # red, green or blue; else grey
            x, grid = to_patches(frames)
            patches.append(x)
            grids.append(grid)
            ids += [VISION_START, *[VIDEO_PAD] * (x.shape[0] // MERGE**2), VISION_END]
        prompt = row["text_tokens"] - 2 * len(row["cameras"]) - 2
        ids += [*torch.randint(FIRST_WORD, IMAGE_PAD, (prompt,), generator=g).tolist(), COLOURS[colour], EOS]
        input_ids = torch.tensor([ids])
        labels = torch.full_like(input_ids, -100)
        labels[0, -2:] = input_ids[0, -2:]
        return {
            "pixel_values_videos": torch.cat(patches),
            "video_grid_thw": torch.tensor(grids),
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == VIDEO_PAD).long() * 2,  # 0 text, 1 image, 2 video
            "labels": labels,
        }


def main(epochs: int = 2, n: int = 24) -> dict[str, object]:
    """Train ``epochs`` epochs; returns the losses and the indices trained on."""
    start = time.perf_counter()
    torch.manual_seed(0)
    cfg = tiny_config()
    with tempfile.TemporaryDirectory() as tmp:
        spec = write_checkpoint(cfg, Path(tmp))
    meta = metadata(n)
    lengths = breakdown_table(meta, spec).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS, precision="fp32"))
    plan = plan_buckets(lengths, cost, 3 * 2**20, max_buckets=3, multiple=8)  # a tiny "GPU"
    data = TokenBucketDataset(VideoChats(meta), metadata=meta, spec=spec, plan=plan)
    sampler = data.sampler(seed=0)
    collate = ModalityCollate(data, layout="patches", video_token_id=cfg.video_token_id)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    print(f"{len(data)} samples in {len(plan.buckets)} buckets: {[(b.bound, b.batch_size) for b in plan.buckets]}")

    model = Qwen2VLForConditionalGeneration(cfg)
    # the vision tower frozen but its merger, as VLM fine-tuning often runs (and CPU conv3d backward is slow)
    for name, param in model.model.visual.named_parameters():
        param.requires_grad_(name.startswith("merger."))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses: list[float] = []
    seen: list[int] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            real = batch["row_mask"]
            indices = batch["index"][real].tolist()
            # the batch's video tokens are what the breakdown counted for its samples
            counted = [data.breakdown(i).vision for i in indices]
            placeholders = (batch["input_ids"][real] == cfg.video_token_id).sum(1).tolist()
            grid_tokens = int(batch["video_grid_thw"].prod(1).sum()) // MERGE**2
            if placeholders != counted or grid_tokens != sum(counted):
                raise AssertionError(f"video tokens {placeholders} ({grid_tokens} by the grids), counted {counted}")
            # a static bucket's last batch pads rows; Qwen2-VL's M-RoPE index needs a token in
            # every row it is given, so the model takes the real rows (the clips are theirs only)
            text = {k: batch[k][real] for k in ("input_ids", "attention_mask", "mm_token_type_ids", "labels")}
            out = model(
                **text, pixel_values_videos=batch["pixel_values_videos"], video_grid_thw=batch["video_grid_thw"]
            )
            opt.zero_grad()
            torch.autograd.backward(out.loss)
            opt.step()
            losses.append(out.loss.item())
            seen += indices
            rows, length = batch["info"].shape
            print(f"step {len(losses)}: bucket {batch['info'].bucket} [{rows} x {length}], {len(indices)} real rows, "
                  f"{sum(counted)} video tokens, loss {losses[-1]:.3f}")  # fmt: skip
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    print(f"trained on {len(seen)} samples, {len(set(seen))} distinct of {len(data)}")
    print(f"{time.perf_counter() - start:.1f} s")
    return {"losses": losses, "seen": seen, "n": len(data), "epochs": epochs}


if __name__ == "__main__":
    main()
