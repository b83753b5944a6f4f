"""A LeRobot policy as the planner's cost model: a batch size per bucket of a LeRobot mixture.

:class:`PolicyLengthModel` answers what the planner asks (``memory``, ``max_batch``, ``flops``,
``step_seconds`` at a bucket's length) for a :class:`~tokenbucket.cost.lerobot_policy.LeRobotPolicy`,
and :meth:`PolicyLengthModel.token_spec` says how the policy counts a sample's tokens, so that a
length maps back to the camera slots the policy runs (NOTE [ A policy's lengths ]).

Example (SmolVLA's published default on an H100; a one-camera sample and a three-camera one):
    >>> from tokenbucket.cost.lerobot_policy import LeRobotPolicy
    >>> cost = PolicyLengthModel(LeRobotPolicy.preset("smolvla"), slots=3, gpu="H100-SXM")
    >>> [cost.length(c) for c in (1, 2, 3)]
    [163, 227, 291]
    >>> from tokenbucket.cost.gpus import get_gpu, gpu_budget_bytes
    >>> budget = gpu_budget_bytes(get_gpu("H100-SXM"))
    >>> [cost.max_batch(cost.length(c), budget) for c in (1, 2, 3)]
    [552, 353, 249]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import GPU, get_gpu
from tokenbucket.cost.lerobot_policy import _GEMMA, _SIGLIP_SO400M, _SMOLVLM2_500M, LeRobotPolicy
from tokenbucket.cost.memory import FlopsEstimate
from tokenbucket.cost.step_time import FixedCost, StepSeconds, StepTime, optimizer_io_bytes
from tokenbucket.tokens.spec import CountRule, TokenSpec

__all__ = ["PolicyEstimate", "PolicyLengthModel"]

# launched kernels per step and layer, for the fixed part of a step's time (NOTE [ Step time ])
_KERNELS_PER_LAYER = 40

# NOTE [ A policy's lengths ]
# The planner buckets samples by length. A policy's sample is its prefix (the camera slots it
# runs, the language tokens it pads to, SmolVLA's state token) and its suffix (pi0's state token,
# the action chunk): the token spec counts exactly those, so every length is
#     fixed + slots x image_tokens
# and a bucket's bound gives back the slots of its worst sample (the largest whole number of
# cameras under it). pi0 / pi0.5 run every camera feature (NOTE [ Camera slots ]): the spec's
# camera_slots, so every sample has one length and one batch size; SmolVLA runs the cameras a
# sample has, so a mixture of one- and three-camera embodiments plans two batch sizes. The
# language is priced at tokenizer_max_length (pi0 / pi0.5 pad to it; SmolVLA pads to the batch's
# longest prompt, which metadata does not hold: at most this). The input frames are priced at
# the largest camera frame of the plan, ``frame`` (a smaller frame only lowers the peak).


@dataclass(frozen=True)
class PolicyEstimate:
    """The predicted peak of ``batch`` samples of ``slots`` camera slots: ``total`` bytes."""

    total: int
    batch: int
    slots: int
    items: dict[str, int]


class PolicyLengthModel:
    """A :class:`LeRobotPolicy` priced at the planner's lengths (NOTE [ A policy's lengths ]).

    Args:
        policy: the LeRobot policy (its ``config.json`` or a preset).
        slots: the most cameras a sample of the plan holds (the policy's camera features where its
            config lists them: those win).
        frame: the largest camera frame (height, width) of the plan's samples, as the dataset
            hands it to the policy.
        gpu: the GPU (name or :class:`GPU`) whose step-time defaults give ``step_seconds``.
    """

    def __init__(
        self,
        policy: LeRobotPolicy,
        *,
        slots: int,
        frame: tuple[int, int] = (224, 224),
        gpu: str | GPU | None = None,
    ) -> None:
        if not isinstance(policy, LeRobotPolicy):
            raise ConfigError(f"policy should be a LeRobotPolicy, but got {type(policy).__name__}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"slots should be a positive number of cameras, but got slots={slots!r}")
        if not (isinstance(frame, tuple) and len(frame) == 2 and all(type(v) is int and v >= 1 for v in frame)):
            raise ConfigError(f"frame should be (height, width) in positive pixels, but got frame={frame!r}")
        self.policy, self.frame = policy, frame
        # pi0 / pi0.5 with their camera features listed run those; else the plan's most cameras
        self.cameras = policy.image_features if policy.type != "smolvla" and policy.image_features else slots
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        self.step_time: StepTime | None = StepTime.for_gpu(self.gpu) if self.gpu is not None else None
        self._memo: dict[tuple[int, int], PolicyEstimate] = {}

    @classmethod
    def for_rows(cls, policy: LeRobotPolicy, rows: pa.Table, *, gpu: str | GPU | None = None) -> PolicyLengthModel:
        """The model for LeRobot rows (``lerobot_rows`` / ``lerobot_mixture``): the most cameras a
        sample holds and the largest camera frame (by area) of ``rows``."""
        cams = rows.column("cameras").combine_chunks()
        flat = cams.flatten()
        if not len(flat):
            raise ConfigError("a LeRobot policy needs cameras, but the rows hold none")
        h = flat.field("height").to_numpy(zero_copy_only=False).astype(np.int64)
        w = flat.field("width").to_numpy(zero_copy_only=False).astype(np.int64)
        i = int(np.argmax(h * w))
        slots = int(pc.max(pc.list_value_length(cams)).as_py())
        return cls(policy, slots=slots, frame=(int(h[i]), int(w[i])), gpu=gpu)

    def __repr__(self) -> str:
        return f"PolicyLengthModel({self.policy.type}, slots={self.cameras}, frame={self.frame})"

    # -- lengths --------------------------------------------------------------------------------

    @property
    def fixed_tokens(self) -> int:
        """A sample's tokens besides its cameras: the padded language, the state token, the chunk."""
        p = self.policy
        return p.tokenizer_max_length + p.state_tokens + p.chunk_size

    def slots(self, present: int) -> int:
        """The camera slots the policy runs for a sample of ``present`` cameras (NOTE [ Camera slots ])."""
        p = self.policy
        if p.type == "smolvla" and not p.empty_cameras:
            return p.slots(present)
        # pi0 / pi0.5 run every slot; SmolVLA padding empty cameras is priced at its features (the spec's bound)
        return max(p.image_features or self.cameras, p.slots(present))

    def length(self, present: int) -> int:
        """The length of a sample with ``present`` cameras."""
        return self.fixed_tokens + self.slots(present) * self.policy.image_tokens

    def slots_at(self, length: int) -> int:
        """The camera slots of the worst sample of ``length`` (0: no camera fits under it)."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ConfigError(f"length should be a positive integer, but got length={length!r}")
        return max(0, (length - self.fixed_tokens) // self.policy.image_tokens)

    def token_spec(self) -> TokenSpec:
        """How the policy counts a sample's tokens (NOTE [ A policy's lengths ]); one frame per camera."""
        p = self.policy
        text, proprio = CountRule(count=p.tokenizer_max_length), CountRule(count=p.state_tokens)
        action, memory = CountRule(count=p.chunk_size), CountRule(count=0)
        if p.type == "smolvla":
            c = _SMOLVLM2_500M
            side = c["image"]
            return TokenSpec(
                patch=c["patch"], merge=c["scale_factor"], resize="fixed", fixed_size=(side, side),
                camera_slots=None if not p.empty_cameras else (p.image_features or self.cameras),
                text=text, proprio=proprio, action=action, memory=memory,
            )  # fmt: skip
        side = p.image_size
        return TokenSpec(
            patch=_SIGLIP_SO400M["patch"], resize="fixed", fixed_size=(side, side), camera_slots=self.cameras,
            text=text, proprio=proprio, action=action, memory=memory,
        )  # fmt: skip

    # -- what the planner asks ------------------------------------------------------------------

    def memory(self, batch: int, length: int) -> PolicyEstimate:
        """The predicted peak of ``batch`` worst samples of ``length`` (their cameras all present,
        at the plan's largest frame)."""
        key = (batch, length)
        if key not in self._memo:
            slots = self.slots_at(length)
            if slots < 1:
                raise ConfigError(
                    f"length {length} holds no camera for {self.policy.type} (a sample is {self.fixed_tokens} "
                    f"tokens and {self.policy.image_tokens} per camera)"
                )
            got = self.policy.memory(
                batch,
                cameras=slots,
                text_tokens=self.policy.tokenizer_max_length,
                present=min(slots, self.cameras),
                frame=self.frame,
            )
            items = {k: v for k, v in got.items() if k != "peak_bytes"}
            self._memo[key] = PolicyEstimate(got["peak_bytes"], batch, slots, items)
        return self._memo[key]

    def max_batch(self, length: int, budget_bytes: int) -> int:
        """The largest batch of worst samples of ``length`` within ``budget_bytes`` (0 if none)."""
        slots = self.slots_at(length)
        if slots < 1:
            return 0
        p = self.policy
        return p.max_batch(
            budget_bytes,
            cameras=slots,
            text_tokens=p.tokenizer_max_length,
            present=min(slots, self.cameras),
            frame=self.frame,
        )

    def flops(self, batch: int, length: int) -> FlopsEstimate:
        """Training FLOPs of one step, for ranking plans (NOTE [ Policy FLOPs ])."""
        # NOTE [ Policy FLOPs ]: 2 x the weights a token passes through, per token: the tower per
        # patch, the VLM layers per prefix token, the expert per suffix token; attention 4 x T^2 x
        # heads x head_dim per layer over the joint sequence (pi0 / pi0.5 attend prefix and suffix
        # at once; SmolVLA's cross layers less, priced as joint: an upper bound). Training is 3x
        # where weights train and 2x where only the input gradient flows (the prefix feeds the
        # expert's attention), the frozen tower forward only.
        p = self.policy
        slots = self.slots_at(length)
        if p.type == "smolvla":
            c = _SMOLVLM2_500M
            patches = (c["image"] // c["patch"]) ** 2
            t_hidden, t_ffn, t_layers = c["vision_hidden"], c["vision_ffn"], c["vision_layers"]
            d, f = c["text_hidden"], c["text_ffn"]
            layers = min(p.num_vlm_layers, c["text_layers"])
            width = c["heads"] * c["head_dim"]
            w = int(d * p.expert_width_multiplier)
            e_params = 4 * w * w + 3 * w * 4 * w
            vlm_params = 4 * d * d + 3 * d * f
        else:
            patches = (p.image_size // _SIGLIP_SO400M["patch"]) ** 2
            t_hidden, t_ffn, t_layers = _SIGLIP_SO400M["hidden"], _SIGLIP_SO400M["ffn"], _SIGLIP_SO400M["layers"]
            vlm, e = _GEMMA[p.paligemma_variant], _GEMMA[p.action_expert_variant]
            layers = vlm.depth
            width = vlm.heads * vlm.head_dim
            vlm_params = vlm.width * (vlm.heads + 2 * vlm.kv_heads) * vlm.head_dim + width * vlm.width
            vlm_params += 3 * vlm.width * vlm.mlp
            e_params = e.width * (e.heads + 2 * e.kv_heads) * e.head_dim + e.heads * e.head_dim * e.width
            e_params += 3 * e.width * e.mlp
        prefix = length - p.chunk_size - (1 if p.type == "pi0" else 0)
        suffix = length - prefix
        tower = 2 * batch * slots * patches * t_layers * (4 * t_hidden * t_hidden + 2 * t_hidden * t_ffn)
        tower += 4 * batch * slots * t_layers * patches * patches * t_hidden
        vlm_dense = 2 * batch * prefix * layers * vlm_params
        expert = 2 * batch * suffix * layers * e_params
        per_layer = 4 * batch * length * length * width
        attention = layers * per_layer
        tower_trains = not (p.freeze_vision_encoder or p.train_expert_only)
        forward = tower + vlm_dense + expert + attention
        training = (3 if tower_trains else 1) * tower + (2 if p.train_expert_only else 3) * vlm_dense
        training += 3 * expert + 3 * attention
        return FlopsEstimate(
            forward=int(forward), attention=int(attention), attention_per_layer=int(per_layer),
            training=int(training), training_attention=int(3 * attention),
        )  # fmt: skip

    def fixed_cost(self) -> FixedCost:
        """The optimizer's memory traffic (AdamW over the parameters that get a gradient) and the
        kernels of every layer; one GPU, no collectives."""
        p = self.policy
        static = p.static_bytes()
        if p.type == "smolvla":  # VLM layers, as many expert layers at most, the tower
            c = _SMOLVLM2_500M
            layers = 2 * min(p.num_vlm_layers, c["text_layers"]) + c["vision_layers"]
        else:
            layers = _GEMMA[p.paligemma_variant].depth + _GEMMA[p.action_expert_variant].depth
            layers += _SIGLIP_SO400M["layers"]
        return FixedCost(optimizer_io_bytes(static["optimizer"], static["gradients"]), 0, _KERNELS_PER_LAYER * layers)

    def step_time_parts(self, batch: int, length: int) -> StepSeconds:
        st = self.step_time
        if st is None:
            raise ConfigError("step_seconds needs a GPU: PolicyLengthModel(policy, slots=..., gpu='H100-SXM')")
        return st.seconds(self.flops(batch, length).training, batch * length, fixed=self.fixed_cost())

    def step_seconds(self, batch: int, length: int) -> float:
        """Predicted seconds of one step (NOTE [ Step time ])."""
        return self.step_time_parts(batch, length).total

    def record(self) -> dict[str, object]:
        """What a manifest records of the policy and how its lengths were read."""
        p = self.policy
        return {
            "lerobot_policy": p.type,
            "freeze_vision_encoder": p.freeze_vision_encoder,
            "train_expert_only": p.train_expert_only,
            "camera_slots": self.cameras,
            "image_tokens": p.image_tokens,
            "fixed_tokens": self.fixed_tokens,
            "frame": list(self.frame),
            "params": p.params_total,
            "params_with_grad": p.params_with_grad,
        }
