"""A staged model priced per packed row: whole samples laid end to end, both towers varlen.

:class:`StagedPackedModel` answers what the two-cap packing planner
(:mod:`tokenbucket.plan.packing_2d`) asks: each sample's own loads (LLM tokens, tower patches,
LLM image tokens, training FLOPs alone) and the peak and step time of a batch of packed rows.

NOTE [ A packed row's price ]
Under flash / varlen attention (NOTE [ Packed rows into flash-attn ]) nothing in a step is
quadratic in a row: the backbone keeps per token what it keeps for one sequence, and the tower
runs the row's images one after another in one patch stream, keeping per patch what it keeps
per patch. So the peak of ``R`` rows of ``T`` LLM tokens holding ``N`` tower patches and ``V``
LLM image tokens in all is the staged walk at batch ``R``, sequence ``T``, one tower pass of
``ceil(N / R)`` patches and ``ceil(V / R)`` image tokens per row (``StagedCostModel.memory_of``;
rounding up prices at most ``R - 1`` patches high). FLOPs are not linear: attention is quadratic
per sample in the backbone and per tower pass in the tower, so a batch's FLOPs are the sum of its
samples' own (``StagedLengthModel.sample_flops`` of each alone, NOTE [ Staged FLOPs ]) plus the
dense FLOPs of the padding at the end of each row (padding runs through every projection: the
conservative reading, as NOTE [ Packed FLOPs ]). The tower's attention is priced per pass as the
tower runs it: over the whole pass, or for a windowing tower (Qwen2.5-VL) per window in its
windowed blocks (NOTE [ Windowed tower attention ]); packing changes neither, since the windows
lie within each pass.

Example:
    >>> from tokenbucket.cost.hf_model import StagedModel
    >>> from tokenbucket.cost.staged import Sample, StagedCostModel
    >>> from tokenbucket.cost.staged_length import StagedLengthModel
    >>> m = StagedPackedModel(StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"))))
    >>> loads = m.loads([Sample(text_tokens=100), Sample(images=1, height=448, width=448, text_tokens=10)])
    >>> loads.llm_tokens.tolist(), loads.patches.tolist(), loads.image_tokens.tolist()
    ([100, 266], [0, 1024], [0, 256])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import GPU
from tokenbucket.cost.staged import Sample, StagedEstimate
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.step_time import FixedCost, StepTime
from tokenbucket.tokens.hf import VisionInputs

__all__ = ["PackedEstimate", "PackedStepCost", "SampleLoads", "StagedPackedModel"]


@dataclass(frozen=True)
class SampleLoads:
    """Per sample (one value each, in the order given): ``llm_tokens`` (its whole LLM sequence),
    ``patches`` (tower patches over all its passes), ``image_tokens`` (LLM image tokens),
    ``passes`` (tower passes), ``flops`` (training FLOPs of the sample alone, both towers) and
    ``vision_flops`` (the tower's and projector's share of them)."""

    llm_tokens: np.ndarray
    patches: np.ndarray
    image_tokens: np.ndarray
    passes: np.ndarray
    flops: np.ndarray
    vision_flops: np.ndarray

    def __len__(self) -> int:
        return len(self.llm_tokens)

    def take(self, index: np.ndarray) -> SampleLoads:
        """The loads of the samples at ``index``."""
        return SampleLoads(*(getattr(self, f)[index] for f in self.__dataclass_fields__))

    @classmethod
    def of(
        cls,
        llm_tokens: Sequence[int] | np.ndarray,
        patches: Sequence[int] | np.ndarray,
        flops: Sequence[float] | np.ndarray,
        *,
        image_tokens: Sequence[int] | np.ndarray | None = None,
        passes: Sequence[int] | np.ndarray | None = None,
        vision_flops: Sequence[float] | np.ndarray | None = None,
    ) -> SampleLoads:
        """Loads given directly (tests, a workload priced elsewhere); ``image_tokens`` default to
        ``patches // 4`` (a 2 x 2 merger), ``passes`` to one per sample with patches."""
        ln = np.asarray(llm_tokens, dtype=np.int64)
        pa = np.asarray(patches, dtype=np.int64)
        fl = np.asarray(flops, dtype=np.float64)
        im = pa // 4 if image_tokens is None else np.asarray(image_tokens, dtype=np.int64)
        ps = (pa > 0).astype(np.int64) if passes is None else np.asarray(passes, dtype=np.int64)
        vf = np.zeros(len(ln)) if vision_flops is None else np.asarray(vision_flops, dtype=np.float64)
        if not (ln.shape == pa.shape == fl.shape == im.shape == ps.shape == vf.shape) or ln.ndim != 1:
            raise ConfigError(
                f"loads should be 1D with one value per sample, but got shapes {ln.shape}, {pa.shape}, {fl.shape}"
            )
        if ln.size and (ln.min() < 1 or pa.min() < 0 or (im > ln).any()):
            raise ConfigError("loads should have llm_tokens >= 1, patches >= 0 and image_tokens <= llm_tokens")
        return cls(ln, pa, im, ps, fl, vf)


@dataclass(frozen=True)
class PackedEstimate:
    """The peak of a batch of packed rows: ``total`` bytes per rank (NOTE [ A packed row's price ])."""

    total: int
    estimate: StagedEstimate


@dataclass(frozen=True)
class PackedStepCost:
    """What pricing a batch of packed rows for the rank balance takes, as a value: a padding
    token's FLOPs and the step-time model with its fixed cost (NOTE [ Step time ]; ``None``: no
    GPU, FLOPs at 1 PFLOP/s). A manifest stores it, so a sampler re-packs each epoch without the
    model's config (NOTE [ A two-cap packed manifest ]); its seconds are the model's, bit for bit.

    Example:
        >>> c = PackedStepCost(pad_flops_per_token=1e9)
        >>> c.step_seconds(2e15, 4096), PackedStepCost.from_dict(c.to_dict()) == c
        (2.0, True)
    """

    pad_flops_per_token: float
    step_time: StepTime | None = None
    fixed: FixedCost | None = None

    def __post_init__(self) -> None:
        if (self.step_time is None) != (self.fixed is None):
            raise ConfigError("a packed step cost needs step_time and fixed together, or neither (no GPU)")

    def step_seconds(self, flops: float, tokens: int) -> float:
        """Seconds of one step of ``flops`` training FLOPs over ``tokens`` carried LLM tokens."""
        if self.step_time is None or self.fixed is None:
            return float(flops) / 1e15
        return self.step_time.seconds(flops, tokens, fixed=self.fixed).total

    def to_dict(self) -> dict[str, Any]:
        return {
            "pad_flops_per_token": self.pad_flops_per_token,
            "step_time": None if self.step_time is None else self.step_time.to_dict(),
            "fixed": None if self.fixed is None else asdict(self.fixed),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PackedStepCost:
        """The inverse of :meth:`to_dict`; a damaged entry is a one-line ConfigError."""
        try:
            st, fixed = data["step_time"], data["fixed"]
            return cls(
                float(data["pad_flops_per_token"]),
                None if st is None else StepTime.from_dict(dict(st), source="packed step cost"),
                None if fixed is None else FixedCost(**fixed),
            )
        except (KeyError, TypeError, ValueError) as exc:  # ConfigError is a ValueError too
            raise ConfigError(f"a packed step cost cannot be read from {dict(data)!r:.80}: {exc}") from None


class StagedPackedModel:
    """Prices packed rows of a staged model (NOTE [ A packed row's price ]).

    Args:
        cost: the :class:`StagedLengthModel` of the model (its GPU, if any, gives step times).
    """

    def __init__(self, cost: StagedLengthModel) -> None:
        if not isinstance(cost, StagedLengthModel):
            raise ConfigError(f"cost should be a StagedLengthModel, but got {type(cost).__name__}")
        self.length_model = cost
        self.staged = cost.cost
        probe = cost.sample_flops(1, Sample(text_tokens=1024))
        # the dense training FLOPs of one LLM token (linear in tokens: what a padding token costs)
        self.pad_flops_per_token = (probe.training - probe.training_attention) / 1024
        self._memo: dict[tuple[int, int, int, int], PackedEstimate] = {}

    def __repr__(self) -> str:
        return f"StagedPackedModel({self.length_model!r})"

    @property
    def gpu(self) -> GPU | None:
        return self.staged.gpu

    def loads(self, samples: Sequence[Sample]) -> SampleLoads:
        """Each sample's loads (one cost-model call per distinct sample)."""
        seen: dict[Sample, tuple[int, int, int, int, float, float]] = {}
        rows = []
        for s in samples:
            if s not in seen:
                vi = self.staged.sample_vision(s)
                seq = vi.llm_tokens + s.text_tokens
                total = self.length_model.sample_flops(1, s).training
                text = self.length_model.sample_flops(1, Sample(text_tokens=seq)).training
                seen[s] = (seq, vi.tower_images * vi.patches_per_image, vi.llm_tokens, vi.tower_images, float(total),
                           float(total - text))  # fmt: skip
            rows.append(seen[s])
        cols = list(zip(*rows, strict=True)) if rows else [()] * 6
        return SampleLoads(*(np.asarray(c, dtype=np.int64) for c in cols[:4]),
                           *(np.asarray(c, dtype=np.float64) for c in cols[4:]))  # fmt: skip

    def memory(self, rows: int, row_tokens: int, patches: int, image_tokens: int) -> PackedEstimate:
        """The peak of ``rows`` rows of ``row_tokens`` LLM tokens holding ``patches`` tower patches
        and ``image_tokens`` LLM image tokens in all (NOTE [ A packed row's price ])."""
        key = (rows, row_tokens, patches, image_tokens)
        if key not in self._memo:
            if patches < 0 or image_tokens < 0 or image_tokens > rows * row_tokens:
                raise ConfigError(
                    f"a packed batch should hold 0 <= image_tokens <= rows x row_tokens and patches >= 0, but got "
                    f"rows={rows}, row_tokens={row_tokens}, patches={patches}, image_tokens={image_tokens}"
                )
            vi = VisionInputs(1, -(-patches // rows), -(-image_tokens // rows)) if patches else VisionInputs(0, 0, 0)
            est = self.staged.memory_of(rows, vi, row_tokens)
            self._memo[key] = PackedEstimate(est.peak_bytes, est)
        return self._memo[key]

    def step_cost(self) -> PackedStepCost:
        """This model's step pricing as a value (what a two-cap packed manifest stores)."""
        st = self.length_model.step_time
        fixed = None if st is None else self.length_model.fixed_cost()
        return PackedStepCost(self.pad_flops_per_token, st, fixed)

    def step_seconds(self, flops: float, tokens: int) -> float:
        """Seconds of one step of ``flops`` training FLOPs over ``tokens`` carried LLM tokens
        (NOTE [ Step time ]); without a GPU, the FLOPs at 1 PFLOP/s (a ranking by FLOPs)."""
        return self.step_cost().step_seconds(flops, tokens)
