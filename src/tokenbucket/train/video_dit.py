"""Batches for a video DiT's fine-tuning step: cached latents of one bucket's shape, text states padded.

The usual fine-tuning scripts train a video transformer on VAE latents and text-encoder states
cached beforehand (NOTE [ The fine-tuning step ] in :mod:`tokenbucket.cost.dit_profile`). Given a
:class:`~tokenbucket.plan.video_buckets.VideoPlan`, :func:`video_sampler` draws each batch from
one bucket (one ``frames x height x width``, so one latent shape) at its planned batch size, and
:class:`DiTLatentCollate` stacks the items' latents and pads their text states to the batch's
longest (zeros, with a mask of the real ones: how the pipelines pad a prompt).

Example:
    >>> import torch
    >>> items = [{"key": "a", "latents": torch.zeros(16, 3, 4, 4), "text": torch.ones(5, 8)},
    ...          {"key": "b", "latents": torch.zeros(16, 3, 4, 4), "text": torch.ones(7, 8)}]
    >>> batch = DiTLatentCollate(patch_size=(1, 2, 2))(items)
    >>> batch["latents"].shape, batch["encoder_hidden_states"].shape, batch["video_tokens"]
    (torch.Size([2, 16, 3, 4, 4]), torch.Size([2, 7, 8]), 12)
    >>> batch["encoder_attention_mask"].sum(dim=1).tolist()
    [5, 7]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.plan.video_buckets import VideoPlan
from tokenbucket.train.sampler import BucketBatchSampler, SamplerOptions

__all__ = ["DiTLatentCollate", "video_sampler"]


def video_sampler(plan: VideoPlan, **kwargs: Unpack[SamplerOptions]) -> BucketBatchSampler:
    """A :class:`~tokenbucket.train.sampler.BucketBatchSampler` over ``plan``'s buckets: every
    batch from one bucket at its batch size, each planned clip once an epoch, rejected clips never
    (``kwargs``: the sampler's ``shuffle``, ``seed``, ``drop_last``, ``rank``, ``world_size``, ...)."""
    sizes = [max(b.batch_size, 1) for b in plan.buckets]  # a bucket that fits nothing holds no clip
    return BucketBatchSampler(plan.assignment, sizes, plan_id=plan.plan_id, **kwargs)


class DiTLatentCollate:
    """Stack one bucket's cached latents ``[C, F', H', W']`` and pad the text states ``[T, D]``.

    Args:
        patch_size: the transformer's ``(p_t, p_h, p_w)``: ``video_tokens`` in the batch is the
            latent grid cut into them (what the transformer's blocks see).
        text_length: pad the text states to this many tokens (Wan's pipeline pads every prompt to
            512); ``None``: to the batch's longest.
        latents_key, text_key: the items' keys.

    Returns (per batch): ``latents`` ``[B, C, F', H', W']``, ``encoder_hidden_states``
    ``[B, T, D]``, ``encoder_attention_mask`` ``[B, T]`` (bool, True on a real text token),
    ``keys`` (the items' ``key`` where they have one) and ``video_tokens``.

    Raises:
        ConfigError: a batch mixes latent shapes (its items come from two buckets), or a text
            longer than ``text_length``.
    """

    def __init__(
        self,
        *,
        patch_size: Sequence[int] = (1, 2, 2),
        text_length: int | None = None,
        latents_key: str = "latents",
        text_key: str = "text",
    ) -> None:
        if len(patch_size) != 3 or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in patch_size):
            raise ConfigError(f"patch_size should be three positive integers, but got patch_size={patch_size!r}")
        if text_length is not None and (isinstance(text_length, bool) or text_length < 1):
            raise ConfigError(f"text_length should be a positive integer or None, but got text_length={text_length!r}")
        self.patch_size = tuple(patch_size)
        self.text_length = text_length
        self.latents_key = latents_key
        self.text_key = text_key

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not items:
            raise ConfigError("an empty batch: the sampler gave no items")
        latents = [item[self.latents_key] for item in items]
        shapes = {tuple(x.shape) for x in latents}
        if len(shapes) != 1:
            keys = [item.get("key") for item in items]
            raise ConfigError(
                f"a batch mixes latent shapes {sorted(shapes)} (keys {keys}): a video DiT's batch is one bucket; "
                "feed the DataLoader video_sampler(plan)"
            )
        grid = latents[0].shape[1:]
        if any(g % p for g, p in zip(grid, self.patch_size, strict=True)):
            raise ConfigError(f"latents of grid {tuple(grid)} are not whole {self.patch_size} patches")
        texts = [item[self.text_key] for item in items]
        longest = max(t.shape[0] for t in texts)
        length = longest if self.text_length is None else self.text_length
        if longest > length:
            raise ConfigError(f"a text of {longest} tokens is longer than text_length={length}")
        states = texts[0].new_zeros(len(texts), length, texts[0].shape[1])
        mask = torch.zeros(len(texts), length, dtype=torch.bool)
        for i, t in enumerate(texts):
            states[i, : t.shape[0]] = t
            mask[i, : t.shape[0]] = True
        batch: dict[str, Any] = {
            "latents": torch.stack(latents),
            "encoder_hidden_states": states,
            "encoder_attention_mask": mask,
            "video_tokens": math.prod(g // p for g, p in zip(grid, self.patch_size, strict=True)),
        }
        if all("key" in item for item in items):
            batch["keys"] = [item["key"] for item in items]
        return batch
