"""Pricing a staged model (vision towers, projector, backbone, head, action expert) per rank.

:class:`StagedCostModel` walks one training step of a
:class:`~tokenbucket.cost.hf_model.StagedModel` the way PyTorch runs it: forward through the
vision tower (per image, over its pre-merge patches), the projector, the embedding, the decoder
layers and the head with the loss; backward in reverse; then the optimizer step. At every unit
it adds what is live (weights, gradients so far, what earlier units keep for backward, what
this unit needs while it runs) and reports the largest sum, itemised per stage. Stages are
priced separately and meet at the true peak rather than as a sum of their maxima.

Training setups (:class:`TrainSetup`):

- ``full``: every parameter trains; ``frozen-vision``: the tower keeps no gradients, no
  optimizer state and nothing for backward (its projector still trains); ``lora``: only rank-r
  adapters on the LLM's attention and MLP projections train, the rest is frozen, but the
  backbone still keeps what the adapters need for their gradients.
- ``fsdp``/``zero3``: weights, gradients and optimizer state divided by the world size, plus
  the gathered units in flight (NOTE [ FSDP units in flight ]); ``zero2``: gradients and
  optimizer state divided; ``ddp``/``none``: nothing divided (``ddp`` adds its gradient buckets,
  NOTE [ DDP buckets ]).

NOTE [ Steady state ]
A run goes out of memory at its worst step, and that is never the first one: the first step has
no optimizer state until its optimizer phase, while every later step carries the states (AdamW:
two per trainable parameter, sharded like the gradients) through forward and backward. So
:meth:`StagedCostModel.memory` prices a later step by default. ``first_step=True`` prices the
first; the truth set holds both (a point's ``steps``: 1, or 2 whose peak is the second step's).
For Qwen2-0.5B at 2 x 2,048 tokens the second step's peak is the first's plus exactly the AdamW
states, 1.98 GB (16.11 vs 14.13 GB measured).

The formulas per block are in :mod:`tokenbucket.cost._stage_units`; the truth they are checked
against is ``tests/data/hf_truth.json`` (``benchmarks/bench_staged_cost.py``).

Example:
    >>> from tokenbucket.cost.hf_model import StagedModel
    >>> cm = StagedCostModel(StagedModel.preset("qwen2-vl-2b"))
    >>> est = cm.memory(1, Sample(images=1, height=448, width=448, text_tokens=256))
    >>> est.phase, est.item("loop") == cm.held_bytes(1, est.seq_len) > 0  # the default loop holds the output
    ('optimizer', True)
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket._search import grow_then_bisect
from tokenbucket.cost._stage_units import BF16, Unit, build_units
from tokenbucket.cost.gpus import GPU, get_gpu
from tokenbucket.cost.hf_model import StagedModel, staged_from_config
from tokenbucket.cost.model import _positive
from tokenbucket.models._base import check_frames
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.tokens.hf import VisionInputs, vision_inputs

__all__ = [
    "ERROR_BAND", "STAGES", "STAGE_ITEMS", "Sample", "StagedCostModel", "StagedEstimate", "TrainSetup", "preset_config",
]  # fmt: skip

STAGES = ("vision", "projector", "backbone", "head_loss", "action_expert")
STAGE_ITEMS = ("weights", "gradients", "optimizer", "activations", "transients", "loop")
# the staged model's stated error band, percent of the measured peak (tests/test_staged_cost.py holds it)
ERROR_BAND = (-5.0, 7.0)
_TRAIN = ("full", "frozen-vision", "lora")
_SHARDING = ("none", "ddp", "fsdp", "zero2", "zero3")
_OPTIMIZER = ("adamw", "sgd", "none")
_CKPT = ("none", "full")
LOOPS = ("held", "dropped")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} should be one of {list(choices)}, but got {name}={value!r}")


@dataclass(frozen=True, kw_only=True)
class TrainSetup:
    """How the model is trained and sharded.

    Args:
        train: ``full``, ``frozen-vision`` or ``lora`` (adapters on the LLM's q/k/v/o and
            gate/up/down projections, everything else frozen).
        lora_rank: the adapters' rank r (LoRA only).
        sharding: ``none``, ``ddp``, ``fsdp`` (FSDP2, one unit per block), ``zero2`` or ``zero3``.
        world_size: ranks sharing the model (1 unless sharded).
        optimizer: ``adamw`` (two states and a foreach temporary), ``sgd`` (momentum), ``none``.
        vision_checkpointing: ``none`` or ``full`` (each vision block recomputed in backward).
        backbone_checkpointing: ``none`` or ``full`` (each decoder layer recomputed).
        ddp_bucket_view: DDP's ``gradient_as_bucket_view``. ``False`` (PyTorch's default) keeps
            a second copy of every trainable gradient in DDP's communication buckets, from
            the wrapper's construction on; ``True`` makes the gradients views of the buckets.
            Only read with ``sharding="ddp"`` (NOTE [ DDP buckets ]).
        loop: how the training step is written (NOTE [ What the loop holds ]): ``held`` (the
            default, the most expensive: ``outputs = model(**batch); outputs.loss.backward()``
            in a ``for`` loop, as raw loops and Accelerate's examples do) or ``dropped``
            (``loss = model(**batch).loss``: the HF ``Trainer``, a Lightning ``training_step``).
        use_cache: the ``use_cache`` the step passes: ``None`` (as the config leaves it) or a
            bool. Only a ``held`` loop pays for the cache.
    """

    train: str = "full"
    lora_rank: int = 16
    sharding: str = "none"
    world_size: int = 1
    optimizer: str = "adamw"
    vision_checkpointing: str = "none"
    backbone_checkpointing: str = "none"
    ddp_bucket_view: bool = False
    loop: str = "held"
    use_cache: bool | None = None

    def __post_init__(self) -> None:
        _choice("train", self.train, _TRAIN)
        _positive("lora_rank", self.lora_rank)
        _choice("sharding", self.sharding, _SHARDING)
        _positive("world_size", self.world_size)
        _choice("optimizer", self.optimizer, _OPTIMIZER)
        _choice("vision_checkpointing", self.vision_checkpointing, _CKPT)
        _choice("backbone_checkpointing", self.backbone_checkpointing, _CKPT)
        _choice("loop", self.loop, LOOPS)
        if self.use_cache is not None and not isinstance(self.use_cache, bool):
            raise ConfigError(f"use_cache should be None or a bool, but got use_cache={self.use_cache!r}")
        if not isinstance(self.ddp_bucket_view, bool):
            raise ConfigError(f"ddp_bucket_view should be a bool, but got ddp_bucket_view={self.ddp_bucket_view!r}")
        if self.sharding == "none" and self.world_size != 1:
            raise ConfigError(
                f"world_size should be 1 when sharding='none', but got world_size={self.world_size} "
                "(use sharding='ddp' for data parallel)"
            )

    @property
    def weight_shards(self) -> int:
        return self.world_size if self.sharding in ("fsdp", "zero3") else 1

    @property
    def state_shards(self) -> int:
        """Shards of gradients and optimizer states."""
        return self.world_size if self.sharding in ("fsdp", "zero2", "zero3") else 1


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One training sample's shape: ``images`` images, or ``videos`` clips of ``frames`` frames
    each, of ``height x width``, and ``text_tokens`` tokens.

    A clip reaches a family with a video path through its video processor (NOTE [ Frames are
    images ]); elsewhere, and for a one-frame clip, its frames are images. ``fps``: the clips' own
    frame rate, which a video processor that samples frames reads (``None``: not known).
    ``height``/``width`` are ignored (and may be 0) when the sample holds no image or clip.
    """

    images: int = 0
    height: int = 0
    width: int = 0
    text_tokens: int = 0
    videos: int = 0
    frames: int = 0
    fps: float | None = None

    def __post_init__(self) -> None:
        _positive("images", self.images, 0)
        _positive("text_tokens", self.text_tokens, 0)
        _positive("videos", self.videos, 0)
        _positive("frames", self.frames, 1 if self.videos else 0)
        if self.images and self.videos:
            raise ConfigError(
                f"a sample should hold images or videos, not both, but got images={self.images}, videos={self.videos}"
            )
        if self.frames and not self.videos:
            raise ConfigError("frames counts the frames of each video: it needs videos >= 1, but got videos=0")
        if self.fps is not None:
            check_frames(1, self.fps)
        minimum = 1 if self.images or self.videos else 0
        _positive("height", self.height, minimum)
        _positive("width", self.width, minimum)
        if self.images == 0 and self.videos == 0 and self.text_tokens == 0:
            raise ConfigError("a sample should hold at least one image, video or text token, but got none")

    def __repr__(self) -> str:  # the video fields only when set
        shown = ["images", "height", "width", "text_tokens"] + [
            k for k in ("videos", "frames", "fps") if getattr(self, k) not in (0, None)
        ]
        return f"Sample({', '.join(f'{k}={getattr(self, k)!r}' for k in shown)})"

    @classmethod
    def video(
        cls, *, cameras: int, frames: int, height: int, width: int, text_tokens: int = 0, fps: float | None = None
    ) -> Sample:
        """``cameras`` streams of ``frames`` frames each, every stream one clip."""
        _positive("cameras", cameras)
        _positive("frames", frames)
        return cls(videos=cameras, frames=frames, height=height, width=width, text_tokens=text_tokens, fps=fps)

    @classmethod
    def stills(cls, *, cameras: int, frames: int, height: int, width: int, text_tokens: int = 0) -> Sample:
        """``cameras`` streams of ``frames`` frames each, every frame one image."""
        _positive("cameras", cameras)
        _positive("frames", frames)
        return cls(images=cameras * frames, height=height, width=width, text_tokens=text_tokens)


@dataclass(frozen=True)
class StagedEstimate:
    """Predicted peak bytes of one step on one rank, itemised per stage.

    ``stages[stage][item]`` are what is live at the peak (``phase``: ``forward``, ``backward``
    or ``optimizer``); they add up to ``peak_bytes``. ``seq_len`` is the LLM sequence per sample.
    """

    peak_bytes: int
    phase: str
    batch: int
    seq_len: int
    stages: dict[str, dict[str, int]] = field(default_factory=dict)

    def item(self, name: str) -> int:
        """One item summed over the stages."""
        return sum(s[name] for s in self.stages.values())

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class _Live:
    """Bytes live, keyed by (stage, item)."""

    def __init__(self) -> None:
        self.bytes: Counter[tuple[str, str]] = Counter()

    def add(self, stage: str, item: str, n: int) -> None:
        self.bytes[(stage, item)] += n

    def with_extra(self, extra: list[tuple[str, str, int]]) -> Counter[tuple[str, str]]:
        out = Counter(self.bytes)
        for stage, item, n in extra:
            out[(stage, item)] += n
        return out


class StagedCostModel:
    """Peak bytes per rank of one training step of a :class:`StagedModel` under a :class:`TrainSetup`.

    Args:
        model: the staged model (``load_hf_config`` or ``StagedModel.preset``).
        setup: the training setup (default: full training, one rank, AdamW).
        gpu: a GPU name or :class:`GPU` (for ``fits`` with the GPU's budget); optional.
        config: the model's ``HFConfig`` (with its preprocessor), which maps an image to tower
            passes, patches and LLM tokens; without it the mapping comes from ``model`` alone
            (fixed-size towers and Qwen2-VL's default pixel range).
    """

    def __init__(
        self, model: StagedModel, setup: TrainSetup | None = None, gpu: str | GPU | None = None,
        config: HFConfig | None = None,
    ) -> None:  # fmt: skip
        if not isinstance(model, StagedModel):
            raise ConfigError(f"model should be a StagedModel, but got {type(model).__name__}")
        setup = TrainSetup() if setup is None else setup
        if not isinstance(setup, TrainSetup):
            raise ConfigError(f"setup should be a TrainSetup, but got {type(setup).__name__}")
        if config is not None and staged_from_config(config).backbone != model.backbone:
            raise ConfigError(f"config {config.path!r} does not describe model {model.name!r} (backbones differ)")
        if model.name == "pi0":  # the preset
            # NOTE [ pi0 is a LeRobot policy ]: a staged model prices a vocabulary head, its
            # cross-entropy and flash attention; pi0 runs none of them (an MSE on its action chunk,
            # eager attention with a float32 softmax over prefix and suffix, parameters without
            # gradients): +23 .. +43 % over LeRobot's measured peaks. LeRobotPolicy prices it.
            raise ConfigError(
                "the pi0 preset is LeRobot's pi0: price it as LeRobot trains it with LeRobotPolicy.preset('pi0') "
                "(CLI: --lerobot-policy pi0, or a LeRobot config.json folder); a staged model would price a "
                "vocabulary head, cross-entropy and flash attention pi0 never runs"
            )
        self.model = model
        self.setup = setup
        self.gpu = get_gpu(gpu) if gpu is not None else None
        self.config = config if config is not None else preset_config(model)

    def __repr__(self) -> str:
        return f"StagedCostModel({self.model.name!r}, {self.setup!r})"

    def clips(self, sample: Sample) -> bool:
        """Whether ``sample``'s videos reach the model as clips (NOTE [ Frames are images ])."""
        if not sample.videos or sample.frames < 2 or self.config is None or not self.model.vision:
            return False
        return models.of(self.config).has_video

    def sample_vision(self, sample: Sample) -> VisionInputs:
        """The whole sample's vision: tower passes, patches per pass and LLM tokens, summed over
        its images or clips."""
        vi = self.vision_inputs(sample)
        n = sample.images or (sample.videos if self.clips(sample) else sample.videos * sample.frames)
        return VisionInputs(vi.tower_images * n, vi.patches_per_image, vi.llm_tokens * n)

    def vision_inputs(self, sample: Sample) -> VisionInputs:
        """Tower passes, patches per pass and LLM tokens of one of ``sample``'s images or clips
        (of one frame, where a video's frames are images)."""
        if not (sample.images or sample.videos) or not self.model.vision:
            return VisionInputs(0, 0, 0)
        if self.clips(sample):
            assert self.config is not None  # clips() checks it
            return models.of(self.config).clip_inputs(
                self.config, sample.frames, sample.height, sample.width, sample.fps
            )
        if self.config is None:
            tower = self.model.vision[0]
            mt = self.model.model_type
            if tower.tokens_per_image is None or (mt in models.MODULES and models.family(mt).variable_tokens):
                raise ConfigError(
                    f"model {self.model.name!r} ({mt}) gives an image tokens and tower passes by its size (tiles, "
                    "resolution), which its config decides: give StagedCostModel its config (config=...)"
                )
            side = tower.image_size or tower.patch
            return VisionInputs(1, tower.tokens_per_image, (side // tower.patch) ** 2)
        images = sample.images or sample.videos * sample.frames
        return vision_inputs(self.config, sample.height, sample.width, images)

    def pass_grid(self, sample: Sample) -> tuple[int, int] | None:
        """The pre-merge patch grid ``(rows, cols)`` of each of ``sample``'s tower passes, where a
        tower windows over it (NOTE [ Windowed tower attention ]); ``None`` where none does."""
        if not any(t.window for t in self.model.vision) or not (sample.images or sample.videos):
            return None
        if self.config is None:
            raise ConfigError(
                f"model {self.model.name!r} has a windowing vision tower, whose FLOPs need each pass's patch grid: "
                "give StagedCostModel its config (config=...)"
            )
        frames = sample.frames if self.clips(sample) else None
        return models.of(self.config).pass_grid(self.config, sample.height, sample.width, frames, sample.fps)

    def units(self, batch: int, sample: Sample) -> list[Unit]:
        """The step's units in forward order (see :mod:`tokenbucket.cost._stage_units`)."""
        vi = self.sample_vision(sample)
        return self._units(batch, vi, vi.llm_tokens + sample.text_tokens)

    def _units(self, batch: int, vision: VisionInputs, seq_len: int) -> list[Unit]:
        _positive("batch", batch)
        s = self.setup
        return build_units(
            self.model, batch=batch, tower_images=vision.tower_images, patches=vision.patches_per_image,
            llm_image_tokens=vision.llm_tokens, seq_len=seq_len,
            train=s.train, lora_rank=s.lora_rank, backbone_checkpointing=s.backbone_checkpointing == "full",
            vision_checkpointing=s.vision_checkpointing == "full", gathered=s.weight_shards > 1,
        )  # fmt: skip

    def memory(self, batch: int, sample: Sample, *, first_step: bool = False) -> StagedEstimate:
        """The predicted peak bytes per rank of a training step at ``batch`` samples shaped like
        ``sample``: any step after the first (NOTE [ Steady state ]), or with ``first_step`` the
        first one, before the optimizer has made its states."""
        if not isinstance(sample, Sample):
            raise ConfigError(f"sample should be a Sample, but got {type(sample).__name__}")
        vi = self.sample_vision(sample)
        return self.memory_of(batch, vi, vi.llm_tokens + sample.text_tokens, first_step=first_step)

    def memory_of(self, batch: int, vision: VisionInputs, seq_len: int, *, first_step: bool = False) -> StagedEstimate:
        """:meth:`memory` of ``batch`` sequences of ``seq_len`` LLM tokens, each with ``vision``:
        ``tower_images`` tower passes of ``patches_per_image`` patches and ``llm_tokens`` image
        tokens (a packed row, NOTE [ Two-cap packed rows ] in ``tokenbucket.plan.packing_2d``)."""
        _positive("seq_len", seq_len)
        units = self._units(batch, vision, seq_len)
        phase, live = _walk(units, self.setup, steady=not first_step, held=self.held_bytes(batch, seq_len))
        stages = {st: {it: int(live.get((st, it), 0)) for it in STAGE_ITEMS} for st in STAGES}
        return StagedEstimate(
            peak_bytes=sum(sum(v.values()) for v in stages.values()), phase=phase, batch=batch, seq_len=seq_len,
            stages=stages,
        )  # fmt: skip

    def held_bytes(self, batch: int, seq_len: int) -> int:
        """What a ``held`` loop keeps bound between steps (NOTE [ What the loop holds ])."""
        if self.setup.loop != "held":
            return 0
        m = self.model
        tokens = batch * seq_len
        cache = self.setup.use_cache if self.setup.use_cache is not None else m.use_cache
        cache = cache and self.setup.backbone_checkpointing == "none"  # transformers turns it off under checkpointing
        kv = int(m.backbone.kv_heads or m.backbone.heads) * m.head_dim
        return BF16 * m.vocab * tokens + (m.backbone.layers * 2 * BF16 * kv * tokens if cache else 0)

    def fits(self, batch: int, sample: Sample, budget_bytes: int) -> bool:
        return self.memory(batch, sample).peak_bytes <= budget_bytes

    def max_batch(self, sample: Sample, budget_bytes: int) -> int:
        """The largest batch whose predicted peak fits ``budget_bytes`` (0 if not even one sample fits)."""
        _positive("budget_bytes", budget_bytes, 0)
        if not self.fits(1, sample, budget_bytes):
            return 0
        return grow_then_bisect(lambda b: self.fits(b, sample, budget_bytes), what="max_batch")


def preset_config(model: StagedModel) -> HFConfig | None:
    """A preset's config for the image mapping (only dynamic-resolution towers need one)."""
    if model.model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        tower = model.vision[0]
        vision = {"patch_size": tower.patch, "spatial_merge_size": tower.merge,
                  "temporal_patch_size": tower.temporal_patch}  # fmt: skip
        return HFConfig(f"<{model.name}>", {"model_type": model.model_type, "vision_config": vision})
    return None


# NOTE [ DDP buckets ]
# DistributedDataParallel all-reduces gradients through flat bucket tensors it allocates when it
# wraps the model, one slot per trainable parameter in the parameters' dtype. With
# ``gradient_as_bucket_view=False`` (the default) each ``param.grad`` is a tensor of its own and
# the buckets are a second copy, live for the whole run: a full-size gradient more per rank (a
# LoRA run's buckets hold the adapters' only). With ``True`` the gradients are views of the
# buckets and cost nothing extra. Measured on a fake process group (benchmarks/hf_truth.py,
# sharding ddp8): the default adds exactly the trainable parameters' bf16 bytes.

# NOTE [ FSDP units in flight ]
# FSDP2 with one unit per block and the root (embeddings, head, tower stem, projector, final
# norm) as one more: the root is gathered for the whole forward and backward; a block is
# gathered while it runs plus one all-gather buffer prefetching the next. In backward the
# block's unsharded gradients, then its reduce-scatter buffer, are live until the next block
# finishes; root gradients stay unsharded until the end of backward. A tied embedding gets a
# second full-size gradient in backward, and the sum of the two.


# NOTE [ What the loop holds ]
# A ``for`` loop that binds ``outputs = model(**batch)`` keeps the output through backward, the
# optimizer step and the next step's forward (rebinding happens when that forward returns): the
# bf16 logits (B x L x vocab) and, with ``use_cache``, the cache transformers builds in training
# too (every decoder layer's K and V). So in the steady state they are live at every phase; in
# the first step from the end of forward on. A loop that takes ``.loss`` at once (the HF
# Trainer, Lightning) holds nothing. Measured on Qwen2-0.5B, 8,192 tokens, steady state, fake
# tensors (benchmarks/hf_truth.py --loop held): 29.56 GiB held vs 27.24 GiB dropped, the
# difference being the 2.32 GiB of bf16 logits (the cache's K and V are saved for backward
# anyway at that peak); at the forward peak the previous step's cache adds its 0.09 GiB too.


def _walk(
    units: list[Unit], setup: TrainSetup, steady: bool = True, held: int = 0
) -> tuple[str, Counter[tuple[str, str]]]:
    """The largest live set over the step: (phase, bytes by (stage, item)); NOTE [ Steady state ]
    and NOTE [ What the loop holds ] (``held``: the bytes a ``held`` loop keeps)."""
    ws, gs = setup.weight_shards, setup.state_shards
    gathered = ws > 1
    live = _Live()
    states = {"adamw": 2, "sgd": 1, "none": 0}[setup.optimizer]
    buckets = setup.sharding == "ddp" and not setup.ddp_bucket_view  # NOTE [ DDP buckets ]
    for u in units:
        if buckets:
            live.add(u.stage, "gradients", BF16 * u.trainable)
        live.add(u.stage, "weights", math.ceil(BF16 * u.params / ws))
        if gathered and not u.own_unit:
            live.add(u.stage, "weights", BF16 * u.params)
        if steady:  # the states the previous step's optimizer made, live through this step
            live.add(u.stage, "optimizer", states * math.ceil(BF16 * u.trainable / gs))
    best: tuple[int, str, Counter[tuple[str, str]]] = (-1, "", Counter())

    def consider(phase: str, extra: list[tuple[str, str, int]]) -> None:
        nonlocal best
        snap = live.with_extra(extra)
        total = sum(snap.values())
        if total > best[0]:
            best = (total, phase, snap)

    if steady:  # the previous step's output, bound until this forward returns
        live.add("head_loss", "loop", held)
    own = [i for i, u in enumerate(units) if u.own_unit]
    for i, u in enumerate(units):
        extra = [(u.stage, "transients", u.fwd_work)]
        if gathered and u.own_unit:
            nxt = next((units[j] for j in own if j > i), None)
            extra.append((u.stage, "weights", BF16 * u.params + (BF16 * nxt.params if nxt else 0)))
        live.add(u.stage, "activations", u.saved)
        consider("forward", extra)
    if not steady:  # this step's output, from the end of forward on
        live.add("head_loss", "loop", held)
    done_own: Unit | None = None
    for i in reversed(range(len(units))):
        u = units[i]
        if not u.backward:
            if not u.keeps_saved:
                live.add(u.stage, "activations", -u.saved)
            continue
        extra = []
        if gathered:
            prev = next((units[j] for j in reversed(own) if j < i), None)
            extra.append(
                (u.stage, "weights", (BF16 * u.params if u.own_unit else 0) + (BF16 * prev.params if prev else 0))
            )
            if done_own is not None:
                extra.append((done_own.stage, "gradients", BF16 * done_own.trainable))
        consider("backward", [*extra, (u.stage, "transients", u.bwd_work)])
        grads = BF16 * u.trainable
        consider("backward", [*extra, (u.stage, "gradients", grads), (u.stage, "transients", u.bwd_grad_work)])
        live.add(u.stage, "activations", -u.saved)
        live.add(u.stage, "gradients", u.keeps_grad - u.releases_grad)
        keep_full = gathered and not u.own_unit  # root gradients wait for the end of backward
        live.add(u.stage, "gradients", grads if keep_full else math.ceil(grads / gs))
        if u.own_unit and u.trainable:
            done_own = u
    if gathered:  # the root is resharded and its gradients reduce-scattered at the end
        for u in units:
            if not u.own_unit:
                g = BF16 * u.trainable
                live.add(u.stage, "gradients", math.ceil(g / gs) - g)
                live.add(u.stage, "weights", -BF16 * u.params)
    if setup.optimizer != "none":
        extra = []
        for u in units:
            per = math.ceil(BF16 * u.trainable / gs)
            if not steady:  # the first step makes its states here
                extra.append((u.stage, "optimizer", states * per))
            if setup.optimizer == "adamw":
                extra.append((u.stage, "transients", per))  # foreach sqrt temporary
        consider("optimizer", extra)
    return best[1], best[2]
