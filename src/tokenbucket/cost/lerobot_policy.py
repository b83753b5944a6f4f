"""LeRobot VLA policies (pi0, pi0.5, SmolVLA) read from their ``config.json``: parameters as LeRobot builds them.

A LeRobot policy is not a Hugging Face model with a head: LeRobot 0.4.4 builds a VLM prefix
(PaliGemma or SmolVLM) beside an action expert, converts part of it to bf16, keeps a list of
parameters in float32, freezes what ``freeze_vision_encoder`` / ``train_expert_only`` say, and
leaves some parameters that never get a gradient (pi0's expert keeps the vocabulary head of its
``GemmaForCausalLM``; the backbone's last layer computes prefix outputs that no loss reads). What
AdamW keeps state for is the parameters that get a gradient, in their own dtype.

:class:`LeRobotPolicy` lists those parameters as :class:`ParamGroup` s (count, dtype, trainable,
gets a gradient), from the policy's ``config.json`` (``type``: ``pi0``, ``pi05``, ``smolvla``) and
the published backbone configs the policy builds (PaliGemma-3B with Gemma-2B / Gemma-300M for
pi0 and pi0.5, SmolVLM2-500M-Video-Instruct for SmolVLA). The counts are checked against
LeRobot's own classes in ``tests/data/lerobot_truth.json`` (``benchmarks/lerobot_truth``).
:meth:`LeRobotPolicy.memory` prices a steady-state step (its static bytes, and what each
sample keeps for backward: NOTE [ pi0's saved tensors ], NOTE [ SmolVLA's saved tensors ]),
within -1.3 .. +0.2 % of the measured peaks of pi0 / pi0.5 and -1.1 .. -0.2 % of SmolVLA's
(frozen VLM, VLM trained, all trained) at batch 1 to 64.

Example:
    >>> pi0 = LeRobotPolicy.preset("pi0")
    >>> pi0.params_total, pi0.params_with_grad
    (3501372176, 3133186832)
    >>> pi0.dtype_split()["float32"]
    4335264
    >>> pi0.static_bytes()["optimizer"]  # AdamW's states, bf16 where the parameter is
    12550072000
    >>> smolvla = LeRobotPolicy.preset("smolvla")  # the expert trains, the VLM is frozen
    >>> smolvla.memory(8, cameras=3, text_tokens=48)["peak_bytes"]
    3725626728
    >>> smolvla.max_batch(40 * 2**30, cameras=3)  # the largest batch within 40 GiB
    138
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokenbucket._exceptions import ConfigError

__all__ = ["POLICY_TYPES", "LeRobotPolicy", "ParamGroup", "read_lerobot_config"]

POLICY_TYPES = ("pi0", "pi05", "smolvla")
Dtype = Literal["bfloat16", "float32"]
BF16: Dtype = "bfloat16"
FP32: Dtype = "float32"
_BYTES = {BF16: 2, FP32: 4}


@dataclass(frozen=True)
class ParamGroup:
    """``params`` parameters of one part of the policy, in ``dtype``; ``trainable``: they require
    grad; ``grad``: they get one in a training step (so AdamW keeps state for them)."""

    name: str
    params: int
    dtype: Dtype
    trainable: bool
    grad: bool


@dataclass(frozen=True)
class _Gemma:
    """openpi's Gemma variants (LeRobot's ``get_gemma_config``)."""

    width: int
    depth: int
    mlp: int
    heads: int = 8
    kv_heads: int = 1
    head_dim: int = 256


_GEMMA = {"gemma_2b": _Gemma(2048, 18, 16_384), "gemma_300m": _Gemma(1024, 18, 4096)}
_PALIGEMMA_VOCAB = 257_152
_SIGLIP_SO400M = {"hidden": 1152, "layers": 27, "ffn": 4304, "patch": 14}  # PaliGemma-3B's tower
_PALIGEMMA_PROJECTION = 2048
# HuggingFaceTB/SmolVLM2-500M-Video-Instruct (SmolVLA's default vlm_model_name)
_SMOLVLM2_500M = {
    "text_hidden": 960, "text_ffn": 2560, "text_layers": 32, "heads": 15, "kv_heads": 5, "head_dim": 64,
    "vocab": 49_280, "vision_hidden": 768, "vision_layers": 12, "vision_ffn": 3072, "patch": 16, "image": 512,
    "scale_factor": 4,
}  # fmt: skip


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _siglip(hidden: int, layers: int, ffn: int, patch: int, image: int) -> dict[str, int]:
    """A SigLIP-style tower without its pooling head: patch convolution, positions, blocks, final norm."""
    block = 2 * hidden + 4 * _linear(hidden, hidden) + 2 * hidden + _linear(hidden, ffn) + _linear(ffn, hidden)
    return {
        "patch_embedding": 3 * patch * patch * hidden + hidden,
        "position_embedding": (image // patch) ** 2 * hidden,
        "blocks": layers * block,
        "post_layernorm": 2 * hidden,
    }


def _smolvla_ffn(hidden: int) -> int:
    """SmolVLA's expert MLP width (LeRobot's ``get_intermediate_size``): 8/3 of the width, up to a multiple of 256."""
    width = 4 * int(2 * hidden / 3)
    return 256 * ((width + 255) // 256)


@dataclass(frozen=True, kw_only=True)
class LeRobotPolicy:
    """A LeRobot policy's configuration, as far as its parameters and their training go.

    Args:
        type: ``pi0``, ``pi05`` or ``smolvla`` (the config.json's ``type``).
        freeze_vision_encoder: the vision tower trains not.
        train_expert_only: the whole VLM (tower, projector, language model) trains not.
        chunk_size: actions per chunk (the flow-matching expert's suffix).
        max_state_dim: the state vector's padded width.
        max_action_dim: the action vector's padded width.
        image_size: the square the policy resizes each camera to.
        paligemma_variant: pi0 / pi0.5's backbone (``gemma_2b``).
        action_expert_variant: pi0 / pi0.5's expert (``gemma_300m``).
        dtype: pi0 / pi0.5's ``dtype`` (``bfloat16``: LeRobot's float32 list kept; ``float32``).
        num_vlm_layers: SmolVLA's language layers kept (the first ones).
        num_expert_layers: SmolVLA's expert layers (0 or less: as many as the VLM's).
        self_attn_every_n_layers: SmolVLA's expert self-attends every n-th layer, cross-attends else.
        expert_width_multiplier: SmolVLA's expert width over the language model's.
        attention_mode: SmolVLA's ``cross_attn`` or ``self_attn``.
        load_vlm_weights: SmolVLA's VLM loaded with ``from_pretrained(torch_dtype="bfloat16")``
            (bf16 VLM and expert) rather than built from its config (float32).
        train_state_proj: SmolVLA's state projection trains.
        image_features: the policy's camera features (the config's ``VISUAL`` input features,
            LeRobot's ``empty_camera_i`` among them); ``None``: not given (a preset).
        empty_cameras: SmolVLA pads this many missing cameras (pi0 / pi0.5 pad every one).
        tokenizer_max_length: the language tokens (0: the type's default, 48 for pi0 and
            SmolVLA, 200 for pi0.5, whose prompt carries the discretised state). pi0 / pi0.5 pad
            every prompt to it; SmolVLA pads to the batch's longest, at most this.
    """

    type: str
    freeze_vision_encoder: bool = False
    train_expert_only: bool = False
    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    image_size: int = 224
    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    dtype: str = "bfloat16"
    num_vlm_layers: int = 16
    num_expert_layers: int = -1
    self_attn_every_n_layers: int = 2
    expert_width_multiplier: float = 0.75
    attention_mode: str = "cross_attn"
    load_vlm_weights: bool = True
    train_state_proj: bool = True
    image_features: int | None = None
    empty_cameras: int = 0
    tokenizer_max_length: int = 0

    def __post_init__(self) -> None:
        if self.tokenizer_max_length == 0 and self.type in POLICY_TYPES:
            object.__setattr__(self, "tokenizer_max_length", 200 if self.type == "pi05" else 48)
        if self.type not in POLICY_TYPES:
            raise ConfigError(f"type should be one of {list(POLICY_TYPES)}, but got type={self.type!r}")
        for name in ("paligemma_variant", "action_expert_variant"):
            if getattr(self, name) not in _GEMMA:
                raise ConfigError(f"{name} should be one of {list(_GEMMA)}, but got {name}={getattr(self, name)!r}")
        if self.dtype not in (BF16, FP32):
            raise ConfigError(f"dtype should be 'bfloat16' or 'float32', but got dtype={self.dtype!r}")
        for name in ("chunk_size", "max_state_dim", "max_action_dim", "image_size", "num_vlm_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} should be a positive integer value, but got {name}={value!r}")
        if self.image_features is not None and (
            not isinstance(self.image_features, int) or isinstance(self.image_features, bool) or self.image_features < 1
        ):
            raise ConfigError(
                f"the policy should have at least one camera feature (VISUAL input feature), "
                f"but got {self.image_features!r}"
            )
        for name in ("empty_cameras", "tokenizer_max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} should be a non-negative integer value, but got {name}={value!r}")
        for name in ("num_expert_layers", "self_attn_every_n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{name} should be an integer value, but got {name}={value!r}")
        for name in ("freeze_vision_encoder", "train_expert_only", "load_vlm_weights", "train_state_proj"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} should be true or false, but got {name}={getattr(self, name)!r}")
        m = self.expert_width_multiplier
        if not isinstance(m, (int, float)) or isinstance(m, bool) or not 0 < m < float("inf"):
            raise ConfigError(f"expert_width_multiplier should be a positive number, but got {m!r}")
        if self.attention_mode not in ("cross_attn", "self_attn"):
            raise ConfigError(
                f"attention_mode should be 'cross_attn' or 'self_attn', but got attention_mode={self.attention_mode!r}"
            )

    @classmethod
    def preset(cls, name: str, **changes: object) -> LeRobotPolicy:
        """The published defaults of LeRobot 0.4.4's config class ``name`` (pi0 / pi0.5 in bf16,
        as they train), with ``changes``."""
        if name not in POLICY_TYPES:
            raise ConfigError(f"unknown LeRobot policy preset {name!r}; known presets: {list(POLICY_TYPES)}")
        defaults: dict[str, object] = {"type": name}
        if name == "smolvla":
            defaults.update(freeze_vision_encoder=True, train_expert_only=True, image_size=512)
        return dataclasses.replace(cls(**defaults), **changes)  # type: ignore[arg-type]

    @classmethod
    def from_config(cls, config: Mapping[str, object], path: str = "<config>") -> LeRobotPolicy:
        """The policy a LeRobot ``config.json`` (already parsed) describes; unknown keys are ignored."""
        kind = config.get("type")
        if kind not in POLICY_TYPES:
            raise ConfigError(f"{path}: type should be one of {list(POLICY_TYPES)}, but got type={kind!r}")
        base = cls.preset(str(kind))
        fields = {f.name for f in dataclasses.fields(cls)} - {"type", "image_size"}
        changes = {k: config[k] for k in fields if k in config}
        size = config.get("resize_imgs_with_padding" if kind == "smolvla" else "image_resolution")
        if isinstance(size, (list, tuple)) and size:
            changes["image_size"] = size[0]
        features = config.get("input_features")
        if features is not None:
            if not isinstance(features, Mapping) or not all(isinstance(f, Mapping) for f in features.values()):
                raise ConfigError(
                    f"{path}: input_features should map each key to {{type, shape}}, but got {features!r}"
                )
            changes["image_features"] = sum(1 for f in features.values() if f.get("type") == "VISUAL")
        try:
            return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
        except (TypeError, ConfigError) as exc:
            raise ConfigError(f"{path}: {exc}") from None

    # -- what a sample is to the policy -------------------------------------------------------

    @property
    def image_tokens(self) -> int:
        """Prefix tokens per camera slot: SigLIP's patches at the policy's square (pi0 / pi0.5),
        or SmolVLM's after its pixel shuffle (SmolVLA: 64 at 512 px)."""
        if self.type == "smolvla":
            c = _SMOLVLM2_500M
            return (c["image"] // c["patch"] // c["scale_factor"]) ** 2
        return (self.image_size // _SIGLIP_SO400M["patch"]) ** 2

    @property
    def state_tokens(self) -> int:
        """pi0's state token (the suffix's first), SmolVLA's (the prefix's last); pi0.5 has none
        (its state is in the prompt)."""
        return 0 if self.type == "pi05" else 1

    def slots(self, present: int) -> int:
        """The camera slots a batch of ``present`` cameras runs (NOTE [ Camera slots ]).

        NOTE [ Camera slots ]: LeRobot 0.4.4's pi0 / pi0.5 run every camera feature of the
        policy, a missing camera as an image of -1 with its mask off (``_preprocess_images``):
        a sample costs all ``image_features`` slots whatever it holds. SmolVLA pads at most
        ``empty_cameras`` missing ones (``prepare_images``) and runs the others not at all: a
        sample costs its cameras plus that many. Without ``image_features`` (a preset) pi0 /
        pi0.5 run the cameras given.
        """
        if isinstance(present, bool) or not isinstance(present, int) or present < 1:
            raise ConfigError(f"present should be a positive number of cameras, but got present={present!r}")
        n = self.image_features
        if self.type == "smolvla":
            missing = self.empty_cameras if n is None else max(n - present, 0)
            return present + min(missing, self.empty_cameras)
        return present if n is None else max(present, n)

    # -- parameters ---------------------------------------------------------------------------

    def param_groups(self) -> list[ParamGroup]:
        """Every parameter, once, as LeRobot 0.4.4 builds and trains the policy."""
        if self.type == "smolvla":
            return self._smolvla_groups()
        return self._pi_groups()

    def _pi_groups(self) -> list[ParamGroup]:
        vlm, expert = _GEMMA[self.paligemma_variant], _GEMMA[self.action_expert_variant]
        low: Dtype = BF16 if self.dtype == BF16 else FP32
        vision_on = not (self.freeze_vision_encoder or self.train_expert_only)
        vlm_on = not self.train_expert_only
        groups: list[ParamGroup] = []

        def add(name: str, params: int, dtype: Dtype, trainable: bool, grad: bool = True) -> None:
            groups.append(ParamGroup(name, params, dtype, trainable, trainable and grad))

        tower = _siglip(image=self.image_size, **_SIGLIP_SO400M)
        add("vision.patch_embedding", tower["patch_embedding"], FP32, vision_on)  # LeRobot's float32 list
        add("vision.position_embedding", tower["position_embedding"], FP32, vision_on)
        add("vision.blocks", tower["blocks"] + tower["post_layernorm"], low, vision_on)
        add("projector", _linear(_SIGLIP_SO400M["hidden"], _PALIGEMMA_PROJECTION), low, vlm_on)
        add("backbone.embed_tokens", _PALIGEMMA_VOCAB * vlm.width, low, vlm_on)  # tied with its lm_head
        qkv = vlm.width * (vlm.heads + 2 * vlm.kv_heads) * vlm.head_dim
        o_mlp = vlm.heads * vlm.head_dim * vlm.width + 3 * vlm.width * vlm.mlp
        add("backbone.layers", (vlm.depth - 1) * (qkv + o_mlp), low, vlm_on)
        add("backbone.norms", (vlm.depth - 1) * 2 * vlm.width, FP32, vlm_on)
        # NOTE [ Unused prefix outputs ]: the last backbone layer's prefix outputs feed no loss
        # (only the expert's suffix does): its o_proj, MLP and post-attention norm, and the
        # final norm, get no gradient. Its q/k/v do (the suffix attends to the prefix's keys and
        # values, and the concatenated queries carry a gradient for every row).
        add("backbone.last_layer.qkv", qkv, low, vlm_on)
        add("backbone.last_layer.o_mlp", o_mlp, low, vlm_on, grad=False)
        add("backbone.last_layer.input_layernorm", vlm.width, FP32, vlm_on)
        add("backbone.last_layer.post_attention_layernorm", vlm.width, FP32, vlm_on, grad=False)
        add("backbone.norm", vlm.width, FP32, vlm_on, grad=False)
        e = expert
        e_layer = e.width * (e.heads + 2 * e.kv_heads) * e.head_dim + e.heads * e.head_dim * e.width
        add("expert.layers", e.depth * (e_layer + 3 * e.width * e.mlp), low, True)
        # pi0.5's expert norms are adaptive (AdaRMS: a dense layer from the time embedding to
        # scale, shift and gate); pi0's are plain RMSNorm weights. Both are on the float32 list.
        norm = _linear(e.width, 3 * e.width) if self.type == "pi05" else e.width
        add("expert.norms", (2 * e.depth + 1) * norm, FP32, True)
        add("expert.lm_head", _PALIGEMMA_VOCAB * e.width, low, True, grad=False)  # NOTE [ Unused prefix outputs ]
        a, s, w = self.max_action_dim, self.max_state_dim, e.width
        # the projections are built after the bf16 conversion: float32
        if self.type == "pi0":
            heads = _linear(a, w) + _linear(w, a) + _linear(s, w) + _linear(2 * w, w) + _linear(w, w)
        else:  # pi0.5: no state projection (the state is in the prompt), a time MLP for AdaRMS
            heads = _linear(a, w) + _linear(w, a) + 2 * _linear(w, w)
        add("action_projections", heads, FP32, True)
        return groups

    def _smolvla_groups(self) -> list[ParamGroup]:
        c = _SMOLVLM2_500M
        low: Dtype = BF16 if self.load_vlm_weights else FP32
        vision_on = not (self.freeze_vision_encoder or self.train_expert_only)
        vlm_on = not self.train_expert_only
        groups: list[ParamGroup] = []

        def add(name: str, params: int, dtype: Dtype, trainable: bool, grad: bool = True) -> None:
            groups.append(ParamGroup(name, params, dtype, trainable, trainable and grad))

        tower = _siglip(c["vision_hidden"], c["vision_layers"], c["vision_ffn"], c["patch"], c["image"])
        add("vision", sum(tower.values()), low, vision_on)
        add("connector", c["vision_hidden"] * c["scale_factor"] ** 2 * c["text_hidden"], low, vlm_on)
        d, kv = c["text_hidden"], c["kv_heads"] * c["head_dim"]
        q = c["heads"] * c["head_dim"]
        layers = min(self.num_vlm_layers, c["text_layers"])
        text_layer = 2 * d * q + 2 * d * kv + 3 * d * c["text_ffn"] + 2 * d
        w = int(d * self.expert_width_multiplier)
        ffn = _smolvla_ffn(w)
        n = layers if self.num_expert_layers <= 0 else self.num_expert_layers
        cross = [
            "cross" in self.attention_mode
            and not (self.self_attn_every_n_layers > 0 and i % self.self_attn_every_n_layers == 0)
            for i in range(n)
        ]
        add("text.embed_tokens", c["vocab"] * d, low, vlm_on)
        add("text.layers", (layers - 1) * text_layer, low, vlm_on)
        # NOTE [ Unused prefix outputs ] in SmolVLA: the last VLM layer's prefix output feeds no
        # loss; its k/v (and the norm before them) do, read by the expert. Its q does too where
        # that expert layer self-attends over the joint sequence, not where it cross-attends.
        last_q = not cross[-1]
        add("text.last_layer.kv", 2 * d * kv + d + (d * q if last_q else 0), low, vlm_on)
        add(
            "text.last_layer.q_o_mlp", (0 if last_q else d * q) + q * d + 3 * d * c["text_ffn"], low, vlm_on, grad=False
        )
        add("text.last_layer.post_attention_layernorm", d, low, vlm_on, grad=False)
        add("text.norm", d, low, vlm_on, grad=False)
        add("text.lm_head", c["vocab"] * d, low, False)  # frozen in every setup (set_requires_grad)
        base = w * q + 2 * w * kv + q * w + 3 * w * ffn + 2 * w
        # a cross-attending layer's k/v read the VLM's keys and values: new float32 Linears
        # (kv -> kv), built after the expert, replace its own (w -> kv)
        add("expert.layers", n * base - sum(cross) * 2 * w * kv + w, low, True)
        add("expert.cross_kv", sum(cross) * 2 * kv * kv, FP32, True)
        a, s = self.max_action_dim, self.max_state_dim
        add("state_proj", _linear(s, d), FP32, self.train_state_proj)
        add("action_projections", _linear(a, w) + _linear(w, a) + _linear(2 * w, w) + _linear(w, w), FP32, True)
        return groups

    @property
    def params_total(self) -> int:
        return sum(g.params for g in self.param_groups())

    @property
    def params_trainable(self) -> int:
        return sum(g.params for g in self.param_groups() if g.trainable)

    @property
    def params_with_grad(self) -> int:
        return sum(g.params for g in self.param_groups() if g.grad)

    def static_bytes(self) -> dict[str, int]:
        """``weights`` (every parameter, in its dtype), ``gradients`` and ``optimizer`` (AdamW's two
        states) of the parameters that get a gradient, each in its parameter's dtype (``zeros_like``)."""
        groups = self.param_groups()
        weights = sum(g.params * _BYTES[g.dtype] for g in groups)
        grads = sum(g.params * _BYTES[g.dtype] for g in groups if g.grad)
        return {"weights": weights, "gradients": grads, "optimizer": 2 * grads}

    def activation_bytes(self, *, cameras: int = 3, text_tokens: int = 48) -> int:
        """What one sample keeps for backward at the end of pi0 / pi0.5's forward (NOTE [ pi0's saved tensors ]).

        ``cameras``: the image slots (LeRobot runs a missing camera as a padded image too).
        SmolVLA's are priced by its own forward (NOTE [ SmolVLA's saved tensors ])."""
        if self.type == "smolvla":
            return self._smolvla_activation_bytes(cameras=cameras, text_tokens=text_tokens)
        # NOTE [ pi0's saved tensors ]: per token and layer, in bytes, as autograd keeps them in
        # LeRobot's compute_layer_complete (bf16 weights, float32 norms and softmax):
        # - RMSNorm (openpi's): square(x.float()) keeps x in fp32 (4 d), x * rsqrt keeps x (2 d),
        #   the scale keeps the fp32 normed (4 d) where the weight trains: 10 d, else 6 d;
        # - a Linear keeps its input only where its weight trains: q/k/v share one (2 d), the
        #   gated MLP's gate/up share one (2 d) and down keeps the product (2 f); gelu keeps its
        #   input and the product keeps both factors (6 f): 8 f + 2 d trained, 6 f frozen;
        # - attention runs over prefix + suffix at once (one matmul, float32 softmax): q, the
        #   8-head-repeated k and v, and the output before o_proj (4 x 2 H hd over all tokens,
        #   o_proj's input is a slice of it and keeps it whole), and the scores: the fp32 softmax
        #   and its bf16 copy, 6 H L^2. The suffix attends to the prefix, so the prefix stream
        #   needs gradients from the first attention on even with the VLM frozen.
        # - SigLIP (trained only): per token, LN and Linear inputs (10 h), gelu in/out (4 f), and
        #   the flash kernel's q, k, v and output with the head padded to a multiple of 8, and
        #   its fp32 log-sum-exp.
        vlm, e = _GEMMA[self.paligemma_variant], _GEMMA[self.action_expert_variant]
        side = self.image_size // _SIGLIP_SO400M["patch"]
        prefix = cameras * side * side + text_tokens
        suffix = self.chunk_size + (1 if self.type == "pi0" else 0)  # pi0's state token
        tokens = prefix + suffix
        width = vlm.heads * vlm.head_dim
        vlm_on = not self.train_expert_only
        d, f = vlm.width, vlm.mlp
        if vlm_on:
            prefix_layer = prefix * (2 * 10 * d + 2 * d + 8 * f + 2 * d)
        else:
            prefix_layer = prefix * (2 * 6 * d + 6 * f)
        expert_layer = suffix * (2 * 10 * e.width + 2 * e.width + 8 * e.mlp + 2 * e.width)
        if self.type == "pi05":
            expert_layer += suffix * 2 * 2 * e.width  # the gated residuals keep the branch output
        attention = tokens * 4 * 2 * width + 6 * vlm.heads * tokens * tokens
        total = vlm.depth * (prefix_layer + expert_layer + attention)
        total += 4 * tokens * tokens  # the float32 4-D attention mask, one for every layer
        if not (self.freeze_vision_encoder or self.train_expert_only):
            h, fv, heads = _SIGLIP_SO400M["hidden"], _SIGLIP_SO400M["ffn"], 16
            padded = heads * -(-(h // heads) // 8) * 8
            block = 10 * h + 4 * fv + 4 * 2 * padded + 4 * heads
            total += _SIGLIP_SO400M["layers"] * cameras * side * side * block
        return total

    def _smolvla_activation_bytes(self, *, cameras: int, text_tokens: int) -> int:
        """What one SmolVLA sample keeps at the peak of its forward (NOTE [ SmolVLA's saved tensors ])."""
        # NOTE [ SmolVLA's saved tensors ]: LeRobot 0.4.4's SmolVLMWithExpertModel.forward, per
        # token and layer, in bytes (bf16 weights; the expert's cross-attention k/v Linears and
        # the action / state projections float32):
        # - the prefix is the images (the connector's pixel shuffle: (image / patch / scale)^2
        #   tokens per camera), the text, and one state token; the state projection trains, so
        #   the prefix stream needs gradients from the first layer on even with the VLM frozen;
        # - LlamaRMSNorm keeps its float32 upcast (4 d); where its weight trains, also the bf16
        #   normed input of the weight product and its output, the next Linear's input: 8 d;
        # - the gated MLP keeps silu's input, its output and the up projection (6 f), and where
        #   its down projection trains, their product (8 f);
        # - eager attention (float32 softmax): q and the head-repeated k upcast to float32 for
        #   the score matmul, the head-repeated bf16 v, the float32 softmax and its bf16 copy
        #   (6 H per score); the output before o_proj (2 H hd) where an o_proj that trains reads it.
        #   Every n-th layer the prefix and the expert attend jointly (one T x T score matrix);
        #   else the prefix attends to itself (P x P) and the expert cross-attends to the
        #   prefix's keys and values through its float32 k/v Linears (their float32 inputs and
        #   outputs repeated to every head, a float32 softmax of S x P and no bf16 copy, the
        #   float32 output cast to bf16 for o_proj);
        # - RoPE keeps its sin and cos (2 x 128 bytes a token per rotation), q and k;
        # - the peak is at the end of the expert stack: the last layer's prefix branch (which no
        #   loss reads) and the prefix's final norm are still alive, freed when the forward returns
        #   (with the VLM trained, their weights require grad: NOTE [ Unused prefix outputs ] in SmolVLA);
        # - the policy's forward holds each camera resized to the tower's square, float32;
        # - a trained connector keeps its input (the shuffled tower output); a trained tower
        #   keeps per token and layer the LayerNorm inputs and the Linears' inputs, q, k, v and
        #   the output of SDPA's memory-efficient kernel (its mask: the 4-D bias, once), gelu's
        #   input and output: 16 h + 4 f, and its float32 log-sum-exp.
        c = _SMOLVLM2_500M
        d, f, heads, hd = c["text_hidden"], c["text_ffn"], c["heads"], c["head_dim"]
        q, kv = heads * hd, c["kv_heads"] * hd
        w = int(d * self.expert_width_multiplier)
        ffn = _smolvla_ffn(w)
        tower = c["image"] // c["patch"]
        image_tokens = (tower // c["scale_factor"]) ** 2
        prefix = cameras * image_tokens + text_tokens + 1
        suffix = self.chunk_size
        tokens = prefix + suffix
        layers = min(self.num_vlm_layers, c["text_layers"])
        vlm_on = not self.train_expert_only
        rope = 2 * 128
        total = 0
        experts = layers if self.num_expert_layers <= 0 else self.num_expert_layers
        every = layers // experts  # get_model_layers: the expert runs beside every `every`-th VLM layer
        for i in range(layers):
            # the last layer's weights require grad too (set_requires_grad's names miss them)
            # though no loss reads its prefix output: its prefix branch keeps what a trained one does
            trained = vlm_on
            expert = every <= 0 or i % every == 0
            joint = "cross" not in self.attention_mode or (
                self.self_attn_every_n_layers > 0 and i % self.self_attn_every_n_layers == 0
            )
            if trained:
                total += prefix * (8 * d + 8 * d + 8 * f)
            else:
                total += prefix * (4 * d + 4 * d + 6 * f)
            if not expert:  # the prefix alone attends to itself
                total += prefix * (4 * q + 4 * q + 2 * q) + 6 * heads * prefix * prefix + 2 * prefix * rope
                total += prefix * 2 * q if trained else 0
                continue
            total += suffix * (8 * w + 8 * w + 8 * ffn)  # the expert trains
            if joint:
                total += tokens * (4 * q + 4 * q + 2 * q + 2 * q) + 6 * heads * tokens * tokens
                total += 2 * tokens * rope
            else:
                total += prefix * (4 * q + 4 * q + 2 * q) + 6 * heads * prefix * prefix
                total += prefix * 2 * q if trained else 0
                total += prefix * (2 * 4 * kv + 4 * q + 4 * q) + suffix * 4 * q + 4 * heads * suffix * prefix
                total += suffix * 2 * q
                total += (2 * prefix + suffix) * rope
        total += tokens * tokens  # the boolean 2-D attention mask
        total += prefix * (6 if vlm_on else 4) * d  # the prefix's final norm (its weight requires grad with the VLM)
        total += suffix * (6 * w + 4 * w)  # the expert's final norm, action_out_proj's float32 input
        a = self.max_action_dim
        total += suffix * (4 * a + 4 * 2 * w + 4 * w + 4 * w) + 2 * suffix * 4 * a  # action/time MLP, MSE
        total += cameras * 3 * c["image"] ** 2 * 4  # the resized cameras, float32
        if vlm_on:
            total += cameras * image_tokens * c["scale_factor"] ** 2 * c["vision_hidden"] * 2
        if not (self.freeze_vision_encoder or self.train_expert_only):
            n, h, fv, vh = tower * tower, c["vision_hidden"], c["vision_ffn"], 12
            block = 16 * h + 4 * fv + 4 * vh
            total += cameras * (c["vision_layers"] * n * block + 2 * n * n + 3 * c["image"] ** 2 * 2 + 2 * n * h)
        return total

    @staticmethod
    def input_bytes(frames: int, frame: tuple[int, int] = (224, 224)) -> int:
        """One sample's camera frames as the preprocessor hands them to the policy: ``frames``
        float32 images of 3 x ``frame`` (LeRobot's datasets give [0, 1] floats; the batch is on
        the GPU for the whole step, at the dataset's own size: the policy resizes a copy)."""
        h, w = frame
        return frames * 3 * h * w * 4

    def _input_excess(self, cameras: int, present: int | None, frame: tuple[int, int] | None) -> int:
        """What a sample's input frames add over those :meth:`activation_bytes` was fitted with
        (``cameras`` frames of 224 x 224, all present; a padded slot's image is the policy's own,
        in the fit either way): negative where fewer or smaller frames come in."""
        if present is None and frame is None:
            return 0
        n = cameras if present is None else present
        return self.input_bytes(n, frame or (224, 224)) - self.input_bytes(cameras)

    def memory(
        self,
        batch: int,
        *,
        cameras: int = 3,
        text_tokens: int = 48,
        present: int | None = None,
        frame: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """The predicted peak bytes of a steady-state LeRobot step (``update_policy`` with AdamW):
        the larger of the end of forward (weights, AdamW states, ``batch`` samples' saved
        tensors and input frames) and the optimizer step (weights, gradients, states, and the
        foreach temporaries of one gradient's size). Returns ``peak_bytes`` and the items.

        ``cameras``: the slots the policy runs (:meth:`slots`); ``present`` of them are in the
        batch (default: all) as frames of ``frame`` (default 224 x 224)."""
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ConfigError(f"batch should be a positive integer value, but got batch={batch!r}")
        static = self.static_bytes()
        per_sample = self.activation_bytes(cameras=cameras, text_tokens=text_tokens)
        activations = batch * (per_sample + self._input_excess(cameras, present, frame))
        forward = static["weights"] + static["optimizer"] + activations
        step = static["weights"] + 2 * static["gradients"] + static["optimizer"]
        return {"peak_bytes": max(forward, step), "activations": activations, **static}

    def max_batch(
        self,
        budget_bytes: int,
        *,
        cameras: int = 3,
        text_tokens: int = 48,
        present: int | None = None,
        frame: tuple[int, int] | None = None,
    ) -> int:
        """The largest batch whose :meth:`memory` peak fits ``budget_bytes`` (0: not even one sample)."""
        one = self.memory(1, cameras=cameras, text_tokens=text_tokens, present=present, frame=frame)
        if one["peak_bytes"] > budget_bytes:
            return 0
        # the optimizer step does not grow with the batch; the end of forward does, linearly
        return max(1, (budget_bytes - one["weights"] - one["optimizer"]) // one["activations"])

    def dtype_split(self, *, trainable: bool = False) -> dict[str, int]:
        """Parameters per dtype (only the trainable ones with ``trainable``)."""
        out: dict[str, int] = {}
        for g in self.param_groups():
            if g.trainable or not trainable:
                out[g.dtype] = out.get(g.dtype, 0) + g.params
        return dict(sorted(out.items()))


def read_lerobot_config(path: str | Path) -> LeRobotPolicy:
    """The policy of a LeRobot ``config.json`` (or the folder holding it: a checkpoint's
    ``pretrained_model``)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no LeRobot config.json at {str(p)!r}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{str(p)!r} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{str(p)!r} should hold a JSON object, but holds {type(data).__name__}")
    return LeRobotPolicy.from_config(data, str(p))
