"""Fine-tune a video diffusion transformer on cached latents, one bucket of resolution x frames per batch.

    python examples/train_video_dit.py

A tiny ``WanTransformer3DModel`` (diffusers' own class, at a CPU size) trains with the
flow-matching loss the fine-tuning scripts use, on clips of several resolutions and lengths. The
clips' metadata (frames, height, width, text tokens) is planned into buckets whose batch sizes the
cost model fits in a memory budget; the sampler draws each batch from one bucket, so every batch
has one latent shape, and the collate hands the transformer the latents and text states of that
shape. The latents here are synthetic stand-ins for what a VAE encode would cache (each clip's
``[16, F', H', W']`` at its bucket's size, a smooth pattern plus noise, so there is something to
learn); swap in your own cached latents and keep the tokenbucket parts: ``plan_video_buckets``,
``video_sampler`` and ``DiTLatentCollate``. Needs ``pip install 'tokenbucket[diffusers]'``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from diffusers import WanTransformer3DModel
from torch.utils.data import DataLoader, Dataset

from tokenbucket import DiTConfig, DiTCostModel, DiTLatentCollate, VAEFactors, plan_video_buckets, video_sampler

# a Wan 2.1 transformer at a CPU size: the published patch sizes, VAE factors and latent channels
CONFIG = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 2,
          "attention_head_dim": 16, "in_channels": 16, "out_channels": 16, "text_dim": 32, "freq_dim": 32,
          "ffn_dim": 64, "num_layers": 2}  # fmt: skip
VAE = VAEFactors(temporal=4, spatial=8, channels=16, source="Wan 2.1's published VAE")
TEXT_DIM = 32


def clips(n: int, seed: int = 0) -> pa.Table:
    """Clip metadata as a video dataset has it: frames, height, width and cached text tokens."""
    rng = np.random.default_rng(seed)
    sizes = np.array([(64, 112), (96, 160), (112, 64)])[rng.choice(3, n)]
    return pa.table({
        "key": [f"clip{i:04d}" for i in range(n)],
        "frames": rng.choice([9, 17, 24], n),
        "height": sizes[:, 0], "width": sizes[:, 1],
        "text_tokens": rng.integers(4, 17, n),
    })  # fmt: skip


class CachedLatents(Dataset[dict[str, Any]]):
    """Each clip's latents at its bucket's shape (what a VAE encode of the cut clip caches) and its
    text states; a clip a plan rejected is never asked for (the sampler skips it)."""

    def __init__(self, table: pa.Table, plan: Any, seed: int = 0) -> None:
        self.keys = table.column("key").to_pylist()
        self.text = table.column("text_tokens").to_pylist()
        self.plan, self.seed = plan, seed

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> dict[str, Any]:
        bucket = self.plan.buckets[int(self.plan.assignment[i])]
        frames = (bucket.frames - 1) // VAE.temporal + 1
        h, w = bucket.height // VAE.spatial, bucket.width // VAE.spatial
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        grid = torch.linspace(-1, 1, h)[:, None] * torch.linspace(-1, 1, w)[None, :]
        pattern = torch.stack([torch.sin((c + 1) * 3 * grid) for c in range(VAE.channels)])
        latents = pattern[:, None].expand(-1, frames, -1, -1) + 0.1 * torch.randn(
            VAE.channels, frames, h, w, generator=g
        )
        return {"key": self.keys[i], "latents": latents,
                "text": torch.randn(self.text[i], TEXT_DIM, generator=g)}  # fmt: skip


def main(epochs: int = 4, n: int = 48, budget_mib: int = 8, seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    table = clips(n, seed)
    cfg = DiTConfig("tiny-wan", "WanTransformer3DModel", CONFIG, VAE)
    cost = DiTCostModel(cfg)  # full fine-tuning in bf16 with AdamW, priced per bucket
    plan = plan_video_buckets(table, cost, budget_mib * 2**20, frame_buckets=[9, 17])
    for b in plan.buckets:
        print(f"bucket {b.frames:>2} frames x {b.height}x{b.width}: {b.samples} clips, batch {b.batch_size}, "
              f"{b.video_tokens} tokens, predicted {b.peak_bytes / 2**20:.1f} MiB")  # fmt: skip
    model = WanTransformer3DModel.from_config({k: v for k, v in CONFIG.items() if not k.startswith("_")})
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    seen: list[int] = []  # the sequence each step's first block receives
    model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    loader = DataLoader(CachedLatents(table, plan, seed), batch_sampler=video_sampler(plan, seed=seed),
                        collate_fn=DiTLatentCollate(patch_size=CONFIG["patch_size"]))  # fmt: skip
    losses: list[list[float]] = []
    batches, started = 0, time.perf_counter()
    for epoch in range(epochs):
        loader.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]
        losses.append([])
        for batch in loader:
            x0 = batch["latents"]
            noise = torch.randn_like(x0)
            t = torch.rand(x0.shape[0])  # flow matching: x_t on the line from the clip to noise
            xt = (1 - t.view(-1, 1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1, 1) * noise
            pred = model(hidden_states=xt, timestep=t * 1000, encoder_hidden_states=batch["encoder_hidden_states"],
                         return_dict=False)[0]  # fmt: skip
            loss = ((pred.float() - (noise - x0).float()) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            assert seen[-1] == batch["video_tokens"], (seen[-1], batch["video_tokens"])  # the bucket's shape
            losses[-1].append(float(loss.detach()))
            batches += 1
        print(f"epoch {epoch}: mean loss {np.mean(losses[-1]):.3f} over {len(losses[-1])} batches")
    seconds = time.perf_counter() - started
    print(f"{batches} batches in {seconds:.1f} s; loss {np.mean(losses[0]):.3f} -> {np.mean(losses[-1]):.3f}")
    return {"first": float(np.mean(losses[0])), "last": float(np.mean(losses[-1])), "batches": batches,
            "seconds": seconds, "planned": int((plan.assignment >= 0).sum()), "tokens_matched": len(seen)}  # fmt: skip


if __name__ == "__main__":
    main()
