"""Seeded workloads and fakes shared by tests, examples, benchmarks and the demo.

``mixture_a`` is the reference multi-camera workload: long-tailed like real VLA / video data,
so a planner that only looks at the median gets it wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from tokenbucket._exceptions import ConfigError

__all__ = [
    "MIXTURE_A",
    "MIXTURE_TV",
    "MIXTURE_TV_VLA_SHARE",
    "RandomTokens",
    "ToyDenoiser",
    "metadata_of_lengths",
    "mixture_a",
    "mixture_tv",
]

# NOTE [ Mixture A ]
# Per sample: cameras {1,2,3,4,6,8} (mostly 1-3), frames {1,...,32}, square 224/336/448 px at
# patch 14 (256/576/1024 patches), text ~ lognormal with mean ~60 in [1, 1024], proprio 1-16,
# action 0-64, memory 0 or 64. With the default TokenSpec(patch=14) the total has a median of a
# few thousand tokens, p99 ~70k and a max above 100k (tests/test_testing.py checks this).
MIXTURE_A = {
    "cameras": ((1, 2, 3, 4, 6, 8), (0.34, 0.30, 0.22, 0.08, 0.04, 0.02)),
    "frames": ((1, 2, 4, 8, 16, 32), (0.22, 0.20, 0.20, 0.18, 0.12, 0.08)),
    "side": ((224, 336, 448), (0.55, 0.30, 0.15)),
}


def mixture_a(num_samples: int, *, seed: int = 0) -> pa.Table:
    """``num_samples`` rows of mixture A metadata (flat schema), reproducible from ``seed``.

    Columns: ``key`` (``"a{seed}-{i:09d}"``), ``cameras``, ``frames``, ``height``, ``width``,
    ``text_tokens``, ``proprio_tokens``, ``action_tokens``, ``memory_tokens`` (all int64).

    Example:
        >>> mixture_a(3, seed=1).column_names[:5]
        ['key', 'cameras', 'frames', 'height', 'width']
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
        raise ConfigError(f"num_samples should be a non-negative integer, but got num_samples={num_samples!r}")
    rng = np.random.default_rng(seed)

    def pick(name: str) -> np.ndarray:
        values, probs = MIXTURE_A[name]
        return rng.choice(np.asarray(values, dtype=np.int64), size=num_samples, p=probs)

    cameras, frames, side = pick("cameras"), pick("frames"), pick("side")
    # lognormal mean = exp(mu + sigma^2 / 2) = 60 with sigma = 0.8
    text = np.clip(np.rint(rng.lognormal(np.log(60) - 0.32, 0.8, num_samples)), 1, 1024).astype(np.int64)
    proprio = rng.integers(1, 17, num_samples)
    action = rng.integers(0, 65, num_samples)
    memory = rng.choice(np.array([0, 64], dtype=np.int64), size=num_samples)
    keys = pa.array(np.arange(num_samples)).cast(pa.string())
    keys = pa.compute.binary_join_element_wise(f"a{seed}-", pa.compute.utf8_lpad(keys, 9, "0"), "")
    return pa.table(
        {
            "key": keys,
            "cameras": cameras,
            "frames": frames,
            "height": side,
            "width": side,
            "text_tokens": text,
            "proprio_tokens": proprio,
            "action_tokens": action,
            "memory_tokens": memory,
        }
    )


# NOTE [ Mixture TV ]
# Text and vision, for 2D buckets (NOTE [ Two-dimensional buckets ]): a VLA share of 1-3 cameras
# x 1-4 frames at 224-960 px (square) with a short instruction (lognormal, mean ~40 tokens), and
# a text share with long instructions or dialogue (lognormal, mean ~1,500 tokens, up to 12,000),
# a fifth of them with one 224-448 px image. Under Qwen2-VL's processor (patch 14, merge 2,
# max_pixels) a 960 px frame is 1,156 tokens, so the same L_total can be all text or all image.
MIXTURE_TV_VLA_SHARE = 0.55
MIXTURE_TV: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {
    "cameras": ((1, 2, 3), (0.45, 0.35, 0.20)),
    "frames": ((1, 2, 4), (0.50, 0.25, 0.25)),
    "side": ((224, 320, 448, 640, 960), (0.30, 0.25, 0.20, 0.15, 0.10)),
    "text_side": ((224, 336, 448), (0.5, 0.3, 0.2)),
}


def mixture_tv(num_samples: int, *, seed: int = 0) -> pa.Table:
    """``num_samples`` rows of mixture TV metadata (NOTE [ Mixture TV ]): ``key``, ``cameras``,
    ``frames``, ``height``, ``width``, ``text_tokens``; a text-only row has 0 cameras.

    Example:
        >>> t = mixture_tv(1000, seed=1)
        >>> 0 < int((t.column("cameras").to_numpy() == 0).sum()) < 1000
        True
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
        raise ConfigError(f"num_samples should be a non-negative integer, but got num_samples={num_samples!r}")
    rng = np.random.default_rng(seed)
    mix = MIXTURE_TV

    def pick(name: str) -> np.ndarray:
        values, probs = mix[name]
        return rng.choice(np.asarray(values, dtype=np.int64), size=num_samples, p=probs)

    vla = rng.random(num_samples) < MIXTURE_TV_VLA_SHARE
    one_image = ~vla & (rng.random(num_samples) < 0.2)
    cameras = np.where(vla, pick("cameras"), one_image.astype(np.int64))
    frames = np.where(vla, pick("frames"), 1)
    side = np.where(vla, pick("side"), pick("text_side"))
    short = np.rint(rng.lognormal(np.log(40) - 0.18, 0.6, num_samples))
    long = np.rint(rng.lognormal(np.log(1500) - 0.40, 0.9, num_samples))
    text = np.clip(np.where(vla, short, long), 1, 12_000).astype(np.int64)
    return pa.table(
        {
            "key": [f"tv{seed}-{i:08d}" for i in range(num_samples)],
            "cameras": cameras.astype(np.int64),
            "frames": frames.astype(np.int64),
            "height": side.astype(np.int64),
            "width": side.astype(np.int64),
            "text_tokens": text,
        }
    )


def metadata_of_lengths(lengths: Sequence[int] | np.ndarray) -> pa.Table:
    """Metadata rows whose ``L_total`` under ``TokenSpec(patch=14)`` is exactly ``lengths``: one
    camera, one 14x14 frame (1 token), and the rest as text tokens."""
    n = len(lengths)
    return pa.table(
        {
            "key": [f"s{i:06d}" for i in range(n)],
            "cameras": [1] * n,
            "frames": [1] * n,
            "height": [14] * n,
            "width": [14] * n,
            "text_tokens": (np.asarray(lengths, dtype=np.int64) - 1).tolist(),
        }
    )


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    """A map-style dataset whose sample ``i`` is ``{"tokens": [L_i, features]}`` of N(0, 1) values
    seeded by ``i``, ``L_i = lengths[i]``: real sequences of the lengths the metadata gives."""

    def __init__(self, lengths: Sequence[int] | np.ndarray, features: int) -> None:
        self.lengths, self.features = lengths, features

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(int(i))
        return {"tokens": torch.randn(int(self.lengths[i]), self.features, generator=g)}


class ToyDenoiser(torch.nn.Module):
    """One pre-norm encoder layer of width ``hidden`` and a denoising loss on the real tokens: the
    tiny model the warm-up tests and benchmark compile. ``forward(tokens, mask)`` returns the loss.

    An empty row (a static batch's filler) masks no key, since fully masked keys would make NaNs.
    """

    def __init__(self, hidden: int, heads: int = 4) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(
            hidden, heads, 2 * hidden, batch_first=True, norm_first=True, dropout=0.0
        )

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(tokens, src_key_padding_mask=~mask & mask.any(dim=1, keepdim=True))
        real = mask.unsqueeze(-1).to(out.dtype)
        return (((out - tokens) ** 2) * real).sum() / real.sum().clamp(min=1)
