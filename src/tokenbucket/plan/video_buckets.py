"""Buckets for a video DiT: resolution x frames, each with the largest batch that fits the GPU.

A video diffusion transformer trains on batches of one latent shape: its attention takes no mask
over video tokens, so a batch is not padded, it is cut to one ``frames x height x width``
(NOTE [ Video buckets ]). :func:`plan_video_buckets` gives every clip of a metadata table its
bucket, prices each bucket's step with a :class:`~tokenbucket.cost.dit.DiTCostModel` and gives it
the largest batch within the budget; a clip whose bucket does not fit even alone is rejected with
the reason. :meth:`VideoPlan.to_opensora` writes the plan as an Open-Sora ``bucket_config``, and
:func:`check_bucket_config` reads one (hand-written, or fitted for another GPU) and says which
buckets overflow this one, and by how much.

NOTE [ Video buckets ]
A clip goes to the bucket whose frame count is the largest of ``frame_buckets`` not above its own
(its frames are trimmed to it) and whose size is the largest of ``sizes`` that fits inside its own
(it is cropped or scaled down to it, never up), the way Open-Sora's and the fine-tuning scripts'
bucketing samplers assign clips; without ``sizes``, its own size cut down to the next multiple the
pipeline and the transformer's patches take (the family's rule, :meth:`VideoDiT.latents`). The
default frame buckets are ``8k + 1`` frames, which every family's VAE takes whole (time / 4 or / 8
after the first frame). A clip shorter than the smallest frame bucket or smaller than every size is
rejected with that reason; so is one whose bucket the family refuses (its position tables' reach)
or whose batch of one is over the budget.

Example:
    >>> import pyarrow as pa
    >>> from tokenbucket import DiTConfig, DiTCostModel, DiTSetup, VAEFactors
    >>> cfg = DiTConfig("wan-1.3b", "WanTransformer3DModel", {"num_attention_heads": 12,
    ...     "ffn_dim": 8960, "num_layers": 30}, VAEFactors(4, 8, 16, "published"))
    >>> clips = pa.table({"frames": [81, 90, 20, 10], "height": [480, 480, 720, 480],
    ...                   "width": [832, 832, 1280, 832], "text_tokens": [512, 512, 512, 512]})
    >>> plan = plan_video_buckets(clips, DiTCostModel(cfg, DiTSetup(checkpointing=True)), 70 * 2**30)
    >>> [(b.frames, b.height, b.width, b.batch_size, b.samples) for b in plan.buckets]
    [(1, 480, 832, 122, 1), (17, 720, 1280, 10, 1), (81, 480, 832, 5, 2)]
    >>> plan.to_opensora()["480x832"]
    {'1': [1.0, 122], '81': [1.0, 5]}
    >>> plan_video_buckets(clips, DiTCostModel(cfg), 70 * 2**30).rejected[0][1][:44]
    'bucket 81 x 480 x 832: predicted 137.6 GiB a'
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenbucket import _arrays as A
from tokenbucket import _values as V
from tokenbucket._exceptions import ConfigError, InvalidValueError, MissingColumnError
from tokenbucket.cost.dit import DiTCostModel
from tokenbucket.cost.gpus import GPU
from tokenbucket.plan._manifest_io import prepare_out, replace_out, temp_path

__all__ = [
    "FRAME_BUCKETS",
    "VideoBucket",
    "VideoPlan",
    "PLAN_KEY",
    "check_bucket_config",
    "is_video_plan_file",
    "plan_video_buckets",
    "size_multiple",
    "write_video_plan",
]

FRAME_BUCKETS = (1, 17, 33, 49, 65, 81, 97, 113, 129, 161, 193, 257)  # 8k + 1: whole for every family's VAE
_MULTIPLES = (8, 16, 32, 64, 128)
# the bounds of a clip's counts: the metadata's own (tokenbucket._values)
_BOUNDS = {"frames": (1, V.MAX_FRAMES), "height": (1, V.MAX_SIDE), "width": (1, V.MAX_SIDE),
           "text_tokens": (0, V.MAX_TOKENS), "views": (1, V.MAX_CAMERAS), "cameras": (1, V.MAX_CAMERAS)}  # fmt: skip


@dataclass(frozen=True)
class VideoBucket:
    """One bucket: samples of ``views`` clips (cameras; NOTE [ Views of a sample ]) cut to
    ``frames x height x width`` with ``text_tokens`` (their most),
    ``batch_size`` of them a step (0: not even one fits), ``samples`` clips in it; the step's
    ``video_tokens`` a clip, predicted ``peak_bytes`` at that batch and ``step_seconds`` (``None``
    without a GPU)."""

    frames: int
    height: int
    width: int
    text_tokens: int
    batch_size: int
    samples: int
    video_tokens: int
    peak_bytes: int
    step_seconds: float | None = None
    views: int = 1

    @property
    def steps(self) -> int:
        return math.ceil(self.samples / self.batch_size) if self.batch_size else 0


@dataclass(frozen=True)
class VideoPlan:
    """Buckets (sorted by frames, then height and width), each clip's bucket (``assignment``: an
    index into ``buckets``, -1 for a rejected clip) and the rejected clips as ``(row, reason)``."""

    buckets: tuple[VideoBucket, ...]
    assignment: np.ndarray
    rejected: list[tuple[int, str]] = field(default_factory=list)
    budget_bytes: int = 0

    @property
    def epoch_seconds(self) -> float | None:
        """Predicted seconds of one epoch on one rank (``None`` without step times)."""
        if any(b.step_seconds is None for b in self.buckets if b.batch_size):
            return None
        return float(sum(b.steps * (b.step_seconds or 0.0) for b in self.buckets if b.batch_size))

    @property
    def plan_id(self) -> str:
        """A content hash of the plan and its assignment (the sampler's ``plan_id``: part of its
        seed, and of its state, so a resumed run refuses another plan)."""
        digest = hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode())
        digest.update(np.ascontiguousarray(self.assignment, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def to_opensora(self) -> dict[str, dict[str, list[float]]]:
        """The plan as an Open-Sora ``bucket_config``: ``{"HxW": {frames: [keep probability,
        batch size]}}``, every clip kept (probability 1.0); buckets that fit nothing are left out."""
        out: dict[str, dict[str, list[float]]] = {}
        if any(b.views > 1 for b in self.buckets):
            raise ConfigError(
                "an Open-Sora bucket_config has one clip a sample: this plan's samples hold several views"
            )
        for b in self.buckets:
            if b.batch_size:
                out.setdefault(f"{b.height}x{b.width}", {})[str(b.frames)] = [1.0, b.batch_size]
        return out

    def clip_table(self, keys: pa.Array | pa.ChunkedArray | None = None) -> pa.Table:
        """One row a clip: ``row``, ``bucket`` (-1: rejected), the bucket's ``frames``, ``height``,
        ``width`` and ``video_tokens`` (null when rejected) and the ``reason`` of a rejected clip;
        ``keys`` (the metadata's key column) first when given."""
        kept = self.assignment >= 0
        index = np.where(kept, self.assignment, 0)

        def column(attr: str) -> pa.Array:
            values = np.array([getattr(b, attr) for b in self.buckets] or [0], dtype=np.int64)[index]
            return pa.array(values, pa.int64(), mask=~kept)

        reasons = dict(self.rejected)
        columns: dict[str, Any] = {} if keys is None else {"key": keys}
        columns.update(
            row=pa.array(np.arange(len(self.assignment)), pa.int64()),
            bucket=pa.array(self.assignment, pa.int64()),
            **{attr: column(attr) for attr in ("frames", "height", "width", "video_tokens")},
            reason=pa.array([reasons.get(i) for i in range(len(self.assignment))], pa.string()),
        )
        return pa.table(columns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget_bytes,
            "epoch_seconds": self.epoch_seconds,
            "buckets": [dict(vars(b)) for b in self.buckets],
            "rejected": [{"row": r, "reason": why} for r, why in self.rejected],
        }


def size_multiple(cost: DiTCostModel) -> int:
    """The smallest side the family's pipeline and patches take whole (every side a multiple)."""
    for m in _MULTIPLES:
        try:
            cost.family.latents(cost.cfg, 1, m, m)
        except ConfigError:
            continue
        return m
    raise ConfigError(f"no side up to {_MULTIPLES[-1]} px is whole for {cost.cfg.class_name}")


def _columns(clips: pa.Table, names: Sequence[str], where: str) -> list[np.ndarray]:
    """The clips' count columns as int64, checked as the metadata's are (``_arrays.check_array``):
    a missing column or a bad value (null, NaN, negative, not an integer, past the bounds) is one
    error naming ``where``, the row, the column and the value."""
    problems = A.Problems()
    out = []
    for priority, name in enumerate(names):
        if name not in clips.column_names:
            raise ConfigError(f"{where}: {MissingColumnError(name, clips.column_names)}")
        low, high = _BOUNDS[name]
        out.append(A.check_array(clips.column(name), low, high, problems, priority, name))
    if problems:
        row, reason, column, value = problems.first()
        raise ConfigError(f"{where}: {InvalidValueError(reason, column=column, row=row, value=value)}")
    return out


def plan_video_buckets(
    clips: pa.Table,
    cost: DiTCostModel,
    budget_bytes: int,
    *,
    frame_buckets: Sequence[int] = FRAME_BUCKETS,
    sizes: Sequence[tuple[int, int]] | None = None,
    gpu: str | GPU | None = None,
    view_layout: str = "time",
    where: str = "metadata",
) -> VideoPlan:
    """Every sample of ``clips`` (columns ``frames``, ``height``, ``width``; ``text_tokens`` when
    the text states vary; ``cameras`` or ``views`` when a sample holds several views, laid as
    ``view_layout`` says, NOTE [ Views of a sample ]) in its bucket (NOTE [ Video buckets ]), each
    bucket with the largest batch ``cost`` fits in ``budget_bytes``; with ``gpu``, its step seconds."""
    named = [c for c in ("views", "cameras") if c in clips.column_names]
    if len(named) > 1:
        raise ConfigError(f"{where}: columns 'views' and 'cameras' both count a sample's views: give one")
    optional = [c for c in ("text_tokens", *named) if c in clips.column_names]
    frames, heights, widths, *rest = _columns(clips, ["frames", "height", "width", *optional], where)
    found = dict(zip(optional, rest, strict=True))
    text = found.get("text_tokens", np.zeros_like(frames))
    views = found[named[0]] if named else np.ones_like(frames)
    fb = np.array(sorted(set(int(f) for f in frame_buckets)), dtype=np.int64)
    if not fb.size or fb.min() < 1:
        raise ConfigError(f"frame buckets should be positive integers, but got {list(frame_buckets)}")
    idx = np.searchsorted(fb, frames, side="right") - 1
    bucket_frames = np.where(idx >= 0, fb[np.maximum(idx, 0)], 0)
    if sizes is None:
        m = size_multiple(cost)
        bh, bw = heights // m * m, widths // m * m
    else:
        bh, bw = _fit_sizes(heights, widths, sizes)
    shapes: dict[tuple[int, int, int, int], list[int]] = {}
    rejected: list[tuple[int, str]] = []
    for row in range(len(frames)):
        f, h, w = int(bucket_frames[row]), int(bh[row]), int(bw[row])
        if f == 0:
            rejected.append((row, f"{int(frames[row])} frames: shorter than the smallest frame bucket ({fb[0]})"))
        elif h == 0 or w == 0:
            rejected.append((row, f"{int(heights[row])} x {int(widths[row])}: smaller than every bucket size"))
        else:
            shapes.setdefault((f, h, w, int(views[row])), []).append(row)
    buckets: list[VideoBucket] = []
    assignment = np.full(len(frames), -1, dtype=np.int64)
    for f, h, w, v in sorted(shapes):
        rows = shapes[(f, h, w, v)]
        t = int(text[rows].max())
        name = f"bucket {f} x {h} x {w}" + (f" x {v} views" if v > 1 else "")
        try:
            clip = cost.family.latents(cost.cfg, f, h, w)
            latents, per_sample = cost.family.laid_views(cost.cfg, clip, v, view_layout)
        except ConfigError as exc:
            rejected.extend((r, f"{name}: {exc}") for r in rows)
            continue
        text_tokens = cost.family.text_tokens(cost.cfg, t)
        batch = cost.max_batch(latents.tokens, text_tokens, budget_bytes) // per_sample  # samples, not sequences
        est = cost.memory(max(batch, 1) * per_sample, latents.tokens, text_tokens)
        seconds = None
        if gpu is not None and batch:
            seconds = cost.step_seconds(batch * per_sample, latents.tokens, text_tokens, gpu).total
        if batch == 0:
            reason = (
                f"{name}: predicted {est.peak_bytes / 2**30:.1f} GiB at batch 1, over the budget "
                f"of {budget_bytes / 2**30:.1f} GiB"
            )
            rejected.extend((r, reason) for r in rows)
        else:
            assignment[rows] = len(buckets)
        buckets.append(VideoBucket(f, h, w, t, batch, len(rows), latents.tokens, est.peak_bytes, seconds, v))
    rejected.sort()
    return VideoPlan(tuple(buckets), assignment, rejected, budget_bytes)


def _fit_sizes(
    heights: np.ndarray, widths: np.ndarray, sizes: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Each clip's largest size (by area) of ``sizes`` that fits inside its own; (0, 0): none."""
    table = sorted({(int(h), int(w)) for h, w in sizes}, key=lambda s: (s[0] * s[1], s))
    bh, bw = np.zeros_like(heights), np.zeros_like(widths)
    for h, w in table:  # ascending area: a larger size that fits overwrites a smaller one
        fits = (heights >= h) & (widths >= w)
        bh[fits], bw[fits] = h, w
    return bh, bw


def parse_bucket_config(config: Mapping[str, Any], where: str) -> list[tuple[int, int, int, int]]:
    """An Open-Sora-style ``bucket_config`` as ``(frames, height, width, batch size)`` entries:
    ``{"HxW": {frames: [probability, batch size]}}`` (a ``[p, b]`` pair, or ``[[p, ...], b]``
    where Open-Sora keeps per-frame probabilities); a bucket kept with probability 0 is skipped."""
    out: list[tuple[int, int, int, int]] = []
    for res, table in config.items():
        try:
            h_text, w_text = str(res).lower().split("x")
            height, width = int(h_text), int(w_text)
        except ValueError:
            raise ConfigError(f"{where}: resolution {res!r} should be HEIGHTxWIDTH in pixels, e.g. '480x832'") from None
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: {res!r} should map frames to [probability, batch size], but got {table!r}")
        for frames_text, entry in table.items():
            try:
                frames = int(frames_text)
                prob, batch = entry
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{where}: {res!r} frames {frames_text!r} should be [probability, batch size], but got {entry!r}"
                ) from None
            probs = prob if isinstance(prob, list | tuple) else [prob]
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0 or frames < 1:
                raise ConfigError(
                    f"{where}: {res!r} frames {frames_text!r}: batch size {batch!r} is not an integer >= 0"
                )
            if batch and any(float(p) > 0 for p in probs):
                out.append((frames, height, width, batch))
    return out


def check_bucket_config(
    config: Mapping[str, Any], cost: DiTCostModel, budget_bytes: int, *, text_tokens: int, where: str = "bucket_config"
) -> list[dict[str, Any]]:
    """Each bucket of an Open-Sora-style ``bucket_config`` priced at its own batch size: its
    predicted peak, whether it fits ``budget_bytes``, by how much it overflows, and the largest
    batch that fits instead."""
    rows = []
    for frames, height, width, batch in sorted(parse_bucket_config(config, where)):
        try:
            latents = cost.family.latents(cost.cfg, frames, height, width)
        except ConfigError as exc:
            raise ConfigError(f"{where}: bucket {height}x{width} x {frames} frames: {exc}") from None
        text = cost.family.text_tokens(cost.cfg, text_tokens)
        est = cost.memory(batch, latents.tokens, text)
        rows.append({
            "frames": frames, "height": height, "width": width, "batch_size": batch, "video_tokens": latents.tokens,
            "peak_bytes": est.peak_bytes, "fits": est.peak_bytes <= budget_bytes,
            "over_bytes": max(0, est.peak_bytes - budget_bytes),
            "over_percent": round(100.0 * (est.peak_bytes - budget_bytes) / budget_bytes, 1),
            "max_batch": cost.max_batch(latents.tokens, text, budget_bytes),
        })  # fmt: skip
    return rows


PLAN_KEY = b"tokenbucket.video_plan"  # the footer key of a video plan's Parquet file


def is_video_plan_file(path: Path) -> bool:
    """A regular file whose Parquet footer carries :data:`PLAN_KEY` (the footer only is read)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return PLAN_KEY in (pq.read_metadata(path).metadata or {})
    except (OSError, pa.ArrowException):
        return False


def write_video_plan(
    plan: VideoPlan, out: Path, *, keys: pa.Array | pa.ChunkedArray | None = None, meta: Mapping[str, Any] | None = None,
    inputs: Sequence[Path] = (), force: bool = False,
) -> None:  # fmt: skip
    """``plan``'s :meth:`VideoPlan.clip_table` as Parquet at ``out``, the plan (and ``meta``) in its
    footer, by the manifest's rules (NOTE [ Safe output ]): a file tokenbucket did not write is
    replaced only with ``force``, an input (``inputs``), a directory or a link never; written to a
    temporary and moved into place."""
    prepare_out(out, inputs, force=force, ours=is_video_plan_file, what="video plan tokenbucket wrote")
    footer = json.dumps({**plan.to_dict(), **(meta or {})}).encode()
    target = temp_path(out)
    pq.write_table(plan.clip_table(keys).replace_schema_metadata({PLAN_KEY: footer}), target)
    replace_out(target, out)
