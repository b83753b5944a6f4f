"""A staged model priced by LLM length alone: what the planner asks, for a padded length ``L``.

The planner buckets samples by ``L_total`` (their LLM tokens). A staged model's memory also
depends on how many of those tokens are image tokens: the vision tower runs on each image's
pre-merge patches, so an image token costs the tower's activations on top of the backbone's.
:class:`StagedLengthModel` prices the worst sample a bucket of bound ``L`` can hold: up to
``vision_share x L`` image tokens, as whole images of ``image`` (H, W), the rest text
(NOTE [ The worst sample of a length ]).

Example:
    >>> from tokenbucket.cost.hf_model import StagedModel
    >>> from tokenbucket.cost.staged import StagedCostModel
    >>> m = StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b")), vision_share=0.5)
    >>> m.image, m.image_tokens, m.sample(1024)
    ((448, 448), 256, Sample(images=2, height=448, width=448, text_tokens=512))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import GPU, GPUS
from tokenbucket.cost.hf_model import STAGED_PRESETS, StagedModel, staged_from_config
from tokenbucket.cost.memory import FlopsEstimate
from tokenbucket.cost.staged import Sample, StagedCostModel, StagedEstimate, TrainSetup, preset_config
from tokenbucket.cost.step_time import (
    KERNELS_PER_BLOCK,
    FixedCost,
    StepSeconds,
    StepTime,
    comm_bytes,
    optimizer_io_bytes,
)
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.tokens.breakdown import breakdown_table
from tokenbucket.tokens.metadata import iter_metadata_batches
from tokenbucket.tokens.spec import TokenSpec

__all__ = [
    "StagedLengthEstimate",
    "StagedLengthModel",
    "default_image",
    "measure_vision_share",
    "staged_profile_key",
]


def _variable(model_type: str) -> bool:
    """Whether an image's tokens depend on its size (a preset outside the registry: a fixed tower)."""
    return model_type in models.MODULES and models.family(model_type).variable_tokens


# NOTE [ The worst sample of a length ]
# Memory grows with the LLM sequence and, at a fixed sequence, with the image tokens in it (an
# image token costs the backbone and head like a text token, plus the tower over its patches).
# So the worst sample of ``L`` tokens whose image share is at most ``s`` holds ``V = floor(s*L)``
# image tokens and ``L - V`` text tokens. A Sample holds equal images only, so V is rounded to
# whole images of ``image``, of ``T`` LLM tokens each:
# - a fixed-size tower (LLaVA-1.5, PaliGemma, OpenVLA, pi0) gives every image exactly T tokens,
#   so a real sample holds at most floor(V/T) images: the estimate is exact;
# - a dynamic tower (Qwen2-VL: 4 pre-merge patches per LLM token at any size) or a tiling one
#   (LLaVA-NeXT, Idefics3) rounds up, ceil(V/T) images with the text cut to what is left: the
#   sequence may pass L by less than one image, so a bucket is priced up to T tokens high.
# Both are monotone in L (images and the sequence never shrink as L grows) and in the batch.
# ``vision_share=0`` (or a model without a tower) is the text-only sample of L tokens.


def staged_profile_key(cost: StagedCostModel) -> str:
    """What a staged model's measured profile is for: its config (and preprocessor) and the
    training setup, hashed; ``tokenbucket plan --profile`` refuses a profile with another key."""
    what = {
        "config": cost.config.config if cost.config is not None else cost.model.name,
        "preprocessor": cost.config.preprocessor if cost.config is not None else {},
        "setup": dataclasses.asdict(cost.setup),
    }
    return "hf-" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def default_image(cost: StagedCostModel) -> tuple[int, int] | None:
    """The image size the worst case assumes: the most LLM tokens one image gets at a realistic size.

    A fixed-size tower: its own square (every size gives the same tokens). Qwen2-VL / Qwen2.5-VL:
    448 x 448 (256 tokens; the processor would take up to ``max_pixels``, 1,280 tokens, but VLA
    cameras run at 224-480 px, and a bigger image only widens the rounding of NOTE [ The worst
    sample of a length ]). LLaVA-NeXT: the any-resolution pinpoint with the most tokens.
    Idefics3 / SmolVLM: a square at the processor's longest edge (the most tiles). None without
    a tower.
    """
    model = cost.model
    if not model.vision:
        return None
    if cost.config is not None:  # the family's own choice
        return models.of(cost.config).default_image(cost.config)
    side = model.vision[0].image_size or model.vision[0].patch
    return (side, side)


@dataclass(frozen=True)
class StagedLengthEstimate:
    """The peak of ``batch`` worst samples of a length: ``total`` bytes per rank at ``phase``."""

    total: int
    phase: str
    sample: Sample
    estimate: StagedEstimate


class StagedLengthModel:
    """What the planner asks of a cost model (``memory``, ``max_batch``, ``flops``,
    ``step_seconds`` at a padded length), answered by a :class:`StagedCostModel` for the worst
    sample of that length (NOTE [ The worst sample of a length ]). Picklable (Ray ships it).

    Args:
        cost: the staged cost model (its GPU, if any, gives ``step_seconds``).
        vision_share: the largest share of a sample's LLM tokens that are image tokens, in [0, 1].
        image: the (height, width) of those images (default: :func:`default_image`).
    """

    def __init__(
        self, cost: StagedCostModel, *, vision_share: float = 1.0, image: tuple[int, int] | None = None
    ) -> None:
        if not isinstance(cost, StagedCostModel):
            raise ConfigError(f"cost should be a StagedCostModel, but got {type(cost).__name__}")
        share = vision_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ConfigError(f"vision_share should be a number in [0, 1], but got vision_share={vision_share!r}")
        if image is not None and not (
            isinstance(image, tuple) and len(image) == 2 and all(type(v) is int and v >= 1 for v in image)
        ):
            raise ConfigError(f"image should be (height, width) in positive pixels, but got image={image!r}")
        if share > 0 and not cost.model.vision:
            raise ConfigError(f"vision_share={share} needs a vision tower, but {cost.model.name!r} has none")
        self.cost, self.vision_share = cost, float(share)
        self.image = image if image is not None else default_image(cost)
        h, w = self.image or (0, 0)
        self.image_tokens = cost.vision_inputs(Sample(images=1, height=h, width=w)).llm_tokens if self.image else 0
        self._memo: dict[tuple[int, int, int | None], StagedLengthEstimate] = {}
        self._fixed: FixedCost | None = None
        # the GPU's step-time defaults at bf16 (NOTE [ Step-time defaults ]); None without a GPU
        self.step_time: StepTime | None = StepTime.for_gpu(cost.gpu) if cost.gpu is not None else None

    def __repr__(self) -> str:
        return f"StagedLengthModel({self.cost!r}, vision_share={self.vision_share}, image={self.image})"

    def to_dict(self) -> dict[str, Any]:
        """What rebuilds this model elsewhere, JSON-ready (:meth:`from_dict`; NOTE [ A two-dimensional
        dynamic manifest ]): the staged model as its preset's name, or as the config it was read from
        (``config.json``, the preprocessor and video processor tables: the training machine need not
        hold the files), the training setup, the image and the vision share, and the GPU's name
        when it is a registry GPU (step times; memory does not depend on it).

        Raises:
            ConfigError: the staged model is neither a preset nor its config's (built by hand).
        """
        model, config = self.cost.model, self.cost.config
        source: dict[str, Any] = {"name": model.name}
        if STAGED_PRESETS.get(model.name) == model:
            source["preset"] = model.name
        elif config is None or staged_from_config(config, model.name) != model:
            raise ConfigError(
                f"staged model {model.name!r} is neither a preset nor read from a config.json, so it cannot be "
                f"written down to be rebuilt; pass the cost model itself where it is needed"
            )
        if config is not None and config != preset_config(model):  # (a preset's own is rebuilt with it)
            source["config"] = {"path": config.path, "config": config.config, "preprocessor": config.preprocessor,
                                "video": config.video}  # fmt: skip
        gpu = self.cost.gpu
        return {
            "kind": "staged_length",
            **source,
            "setup": dataclasses.asdict(self.cost.setup),
            "gpu": gpu.name if gpu is not None and GPUS.get(gpu.name) == gpu else None,
            "image": None if self.image is None else list(self.image),
            "vision_share": self.vision_share,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StagedLengthModel:
        """The model :meth:`to_dict` wrote down.

        Raises:
            ConfigError: ``data`` is not such a record (one line naming what is wrong).
        """
        try:
            if data.get("kind") != "staged_length":
                raise ConfigError(f"kind should be 'staged_length', but got {data.get('kind')!r}")
            config: HFConfig | None = None
            if data.get("config") is not None:
                c = data["config"]
                config = HFConfig(str(c["path"]), dict(c["config"]), dict(c["preprocessor"]), c["video"])
            if "preset" in data:
                model = StagedModel.preset(data["preset"])
            elif config is not None:
                model = staged_from_config(config, str(data["name"]))
            else:
                raise ConfigError("it names neither a preset nor a config")
            cost = StagedCostModel(model, TrainSetup(**data["setup"]), data.get("gpu"), config=config)
            image = data.get("image")
            return cls(cost, vision_share=float(data["vision_share"]), image=None if image is None else
                       (int(image[0]), int(image[1])))  # fmt: skip
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:  # ConfigError is a ValueError
            raise ConfigError(f"not a staged length model's record: {exc}") from None

    @property
    def gpu(self) -> GPU | None:
        return self.cost.gpu

    def sample(self, length: int, vision: int | None = None) -> Sample:
        """The worst sample of ``length`` LLM tokens (NOTE [ The worst sample of a length ]): with
        ``vision``, the worst of those with at most ``vision`` image tokens (a 2D bucket's
        bounds, NOTE [ Two-dimensional buckets ]); without, at most ``vision_share`` of them."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ConfigError(f"length should be a positive integer, but got length={length!r}")
        if vision is None:
            # the relative nudge keeps a share measured as v/L from flooring to v - 1 at L
            vision = min(length, math.floor(self.vision_share * length * (1 + 1e-12)))
        elif isinstance(vision, bool) or not isinstance(vision, int) or vision < 0:
            raise ConfigError(f"vision should be a non-negative integer, but got vision={vision!r}")
        elif vision and not self.image_tokens:
            raise ConfigError(f"vision={vision} needs a vision tower, but {self.cost.model.name!r} has none")
        vision = min(vision, length)
        t = self.image_tokens
        if not t or not vision or self.image is None:
            return Sample(text_tokens=length)
        images = vision // t if not _variable(self.cost.model.model_type) else -(-vision // t)
        if not images:
            return Sample(text_tokens=length)
        h, w = self.image
        return Sample(images=images, height=h, width=w, text_tokens=max(0, length - images * t))

    def memory(self, batch: int, length: int, vision: int | None = None) -> StagedLengthEstimate:
        """The predicted peak per rank of ``batch`` worst samples of ``length`` tokens (at most
        ``vision`` of them image tokens, when given)."""
        key = (batch, length, vision)
        if key not in self._memo:
            sample = self.sample(length, vision)
            est = self.cost.memory(batch, sample)
            self._memo[key] = StagedLengthEstimate(est.peak_bytes, est.phase, sample, est)
        return self._memo[key]

    def max_batch(self, length: int, budget_bytes: int, vision: int | None = None) -> int:
        """The largest batch of worst samples of ``length`` that fits ``budget_bytes`` (0 if none)."""
        return self.cost.max_batch(self.sample(length, vision), budget_bytes)

    def flops(self, batch: int, length: int, vision: int | None = None) -> FlopsEstimate:
        """Training FLOPs of one step on one rank (NOTE [ Staged FLOPs ])."""
        return self.sample_flops(batch, self.sample(length, vision))

    def sample_flops(self, batch: int, sample: Sample) -> FlopsEstimate:
        """Training FLOPs of one step of ``batch`` samples shaped like ``sample`` (NOTE [ Staged FLOPs ]):
        ``training_attention`` is the backbone's; the tower's attention is per tower pass."""
        model, setup = self.cost.model, self.cost.setup
        vi = self.cost.sample_vision(sample)
        seq = vi.llm_tokens + sample.text_tokens
        spec, b = model.backbone, batch
        d_attn = spec.heads * model.head_dim
        per_layer = 4 * b * seq * seq * d_attn
        attention = spec.layers * per_layer
        dense = 2 * b * seq * (spec.layers * model.decoder_layer_params + model.vocab * spec.hidden)
        back = 2 if setup.train == "lora" else 3  # LoRA: input gradients only, no weight gradients
        ckpt = int(setup.backbone_checkpointing == "full")
        training_attention = int((back + 0.5) * attention) + ckpt * attention
        training = (back + ckpt) * dense + training_attention
        forward = dense + attention
        passes = b * vi.tower_images
        if passes:
            tokens = passes * vi.patches_per_image
            v_dense = sum(2 * tokens * t.layers * t.layer_params for t in model.vision)
            grid = self.cost.pass_grid(sample)  # NOTE [ Windowed tower attention ]
            v_attn = sum(4 * passes * t.attention_pairs(vi.patches_per_image, grid) * t.hidden for t in model.vision)
            v_dense += 2 * b * vi.llm_tokens * (model.projector.params if model.projector else 0)
            trains = setup.train == "full"
            v_ckpt = int(trains and setup.vision_checkpointing == "full")
            forward += v_dense + v_attn
            training += (3 + v_ckpt if trains else 1) * v_dense + int((3.5 + v_ckpt if trains else 1) * v_attn)
        if model.action_expert is not None:
            a = 2 * b * model.action_expert.horizon * model.action_expert.params
            forward, training = forward + a, training + 3 * a
        return FlopsEstimate(
            forward=forward, attention=attention, attention_per_layer=per_layer, training=int(training),
            training_attention=training_attention,
        )  # fmt: skip

    def fixed_cost(self) -> FixedCost:
        """What every step pays on one rank whatever its tokens (NOTE [ Step time ]): the optimizer
        over this rank's share of the trainable parameters, the setup's collectives, the kernels
        of every block that runs."""
        if self._fixed is not None:
            return self._fixed
        setup = self.cost.setup
        units = self.cost.units(1, Sample(text_tokens=1))
        params = sum(u.params for u in units)
        trainable = sum(u.trainable for u in units)
        states = {"adamw": 2, "sgd": 1, "none": 0}[setup.optimizer]
        grads = 2 * trainable  # bf16, the whole model's
        optimizer = states * math.ceil(grads / setup.state_shards)
        sent = comm_bytes(setup.sharding, setup.world_size, 2 * params, grads)
        self._fixed = FixedCost(optimizer_io_bytes(optimizer, math.ceil(grads / setup.state_shards)), sent,
                                KERNELS_PER_BLOCK * len(units))  # fmt: skip
        return self._fixed

    def step_time_parts(self, batch: int, length: int, vision: int | None = None) -> StepSeconds:
        """Predicted seconds of one step on one rank, itemised (NOTE [ Step time ])."""
        st = self.step_time
        if st is None:
            raise ConfigError("step_seconds needs a GPU: StagedCostModel(model, setup, gpu='H100-SXM')")
        return st.seconds(self.flops(batch, length, vision).training, batch * length, fixed=self.fixed_cost())

    def step_seconds(self, batch: int, length: int, vision: int | None = None) -> float:
        """Predicted seconds of one step on one rank: fixed costs plus FLOPs at the utilisation of
        its tokens (NOTE [ Step time ])."""
        return self.step_time_parts(batch, length, vision).total


# NOTE [ Staged FLOPs ]
# For ranking plans, per rank: the backbone's matmuls 2 x (decoder params + the vocab head) per
# LLM token plus attention 4 x S^2 x heads x head_dim per sample and layer; training is 3x the
# matmuls (2x under LoRA: input gradients, no frozen-weight gradients) and 3.5x attention (2.5x
# under LoRA; the half is the flash/sdpa recompute). The tower: 2 x block params per patch, attention per tower pass over its
# own patches (4 x p^2 x hidden per layer; a windowing tower's windowed blocks over each window,
# NOTE [ Windowed tower attention ]), the projector over the image's LLM tokens; 3x / 3.5x when
# the tower trains, forward only when frozen. Checkpointing adds one forward of its stage. The
# patch embedding (a convolution, 2 x its weights per patch) is left out: 0.2 % of a
# Qwen2.5-VL-7B tower's forward.


def measure_vision_share(
    sources: str | Path | Sequence[str | Path], spec: TokenSpec, *, batch_rows: int = 1_000_000
) -> float:
    """The largest ``vision / total`` over the samples of some metadata (invalid rows skipped:
    the manifest refuses or rejects them itself), a record batch at a time; 0.0 for none."""
    best = 0.0
    for table in iter_metadata_batches(
        sources, batch_rows=batch_rows, key=spec.columns.key, absent=spec.absent_as_zero()
    ):
        result = breakdown_table(table, spec, on_invalid="reject", check_keys=False)
        total = np.asarray(result.table.column("total").to_numpy(), dtype=np.float64)
        vision = np.asarray(result.table.column("vision").to_numpy(), dtype=np.float64)
        ok = total > 0
        if ok.any():
            best = max(best, float((vision[ok] / total[ok]).max()))
    return best
