"""Video DiT token counts against the pipelines' own code (NOTE [ Video DiT tokens ]).

The oracle for each family: its diffusers pipeline, run on a stand-in ``self`` (the pipeline's
VAE factors as its ``__init__`` sets them, a scheduler, VAE and transformer that only answer what
the pipeline asks of them), gives what the pipeline hands its transformer: the latents as it
prepares them (with any frames it pads), and the grid it tells the transformer. Either the
pipeline's ``prepare_latents`` alone (Wan) or its ``__call__`` up to the first transformer call
(the others: the padding, packing and rotary tables live there). A tiny transformer of the
family's class, with the published patch sizes and latent channels, then runs its ``forward`` on
exactly that under fake tensors: the sequence its first block receives is the count. The refusals
are the pipeline's ``check_inputs``' own, or sizes the pipeline's or transformer's own code fails
on (a rotary or position table too small), or latents the patches do not tile.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tokenbucket._exceptions import ConfigError
from tokenbucket.models import dit_family
from tokenbucket.models._dit import DiTConfig, VAEFactors

diffusers = pytest.importorskip("diffusers")

FRAMES = (1, 5, 17, 49, 80, 81, 121)
SIZES = ((480, 832), (720, 1280), (256, 256), (512, 768), (480, 848), (272, 480), (248, 512), (100, 200))

Grid = tuple[int, ...]


def _grid_cfhw(kwargs: dict[str, Any]) -> Grid:
    """The latent grid of ``hidden_states`` laid out ``[B, C, F, H, W]``."""
    return tuple(kwargs["hidden_states"].shape[2:])


@dataclass(frozen=True)
class Case:
    """One family's oracle: its tiny transformer config (the published patch sizes and latent
    channels at a tiny width), the VAE factors, the pipeline class, and how to call the parts."""

    name: str
    class_name: str
    transformer: dict[str, Any]
    vae: VAEFactors
    pipeline: Callable[[], Any]
    # (pipeline class, stand-in self, frames, height, width) -> the transformer's forward kwargs,
    # as the pipeline passes them
    call: Callable[[Any, Any, int, int, int], dict[str, Any]]
    # (pipeline class, stand-in self, height, width) -> None or raises ValueError
    check: Callable[[Any, Any, int, int], None]
    # the forward kwargs -> the latent grid F' x H' x W' the pipeline made
    grid: Callable[[dict[str, Any]], Grid] = _grid_cfhw
    blocks: str = "blocks"
    frames: tuple[int, ...] = FRAMES
    sizes: tuple[tuple[int, int], ...] = SIZES
    # how many sizes a frame count should at least count (a table that takes one size: 1)
    min_sizes: int = 3


# -- the stand-in pipeline ------------------------------------------------------------------------


class _Captured(Exception):
    """The pipeline called its transformer: these are the keyword arguments it passed."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("the pipeline called its transformer")
        self.kwargs = kwargs


class _Transformer:
    """What a pipeline reads of its transformer (the tiny model's own config); calling it stops
    the pipeline with the arguments it passed."""

    dtype = torch.float32

    def __init__(self, model: Any) -> None:
        self.config = model.config

    def cache_context(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def __call__(self, **kwargs: Any) -> Any:
        raise _Captured(kwargs)


class _Config(dict[str, Any]):
    """A config read both as ``config.key`` and ``config.get(key)``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class _Scheduler:
    """One step of a scheduler: all a pipeline asks before its first transformer call."""

    order = 1
    init_noise_sigma = 1.0

    def __init__(self) -> None:
        self.timesteps = torch.tensor([999.0])
        self.sigmas = torch.tensor([80.0, 0.0])
        self.config = _Config(final_sigmas_type="zero", sigma_max=80.0, sigma_data=0.5)

    def set_timesteps(
        self,
        num_inference_steps: int | None = None,
        device: Any = None,
        timesteps: Any = None,
        sigmas: Any = None,
        mu: Any = None,
    ) -> None:
        pass

    def set_begin_index(self, begin_index: int = 0) -> None:
        pass

    def scale_model_input(self, sample: torch.Tensor, timestep: Any) -> torch.Tensor:
        return sample

    def step(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the stand-in pipeline stops at its first transformer call")


# the pipeline's own methods the stand-in runs (bound to it), where the pipeline class has them
_OWN_METHODS = (
    "check_inputs",
    "encode_prompt",
    "prepare_latents",
    "prepare_extra_step_kwargs",
    "_prepare_rotary_positional_embeddings",
    "_pack_latents",
)


def _stand_in(case: Case, cls: Any, model: Any) -> Any:
    """What the pipeline's ``__init__`` sets on itself that ``__call__`` reads before its first
    transformer call (the VAE factors under each pipeline's own attribute names), its own methods,
    and stand-ins for its components."""
    t, s, c = case.vae.temporal, case.vae.spatial, case.vae.channels
    me = types.SimpleNamespace(
        vae_scale_factor_temporal=t,
        vae_scale_factor_spatial=s,
        vae_temporal_compression_ratio=t,
        vae_spatial_compression_ratio=s,
        transformer_spatial_patch_size=model.config.get("patch_size"),
        transformer_temporal_patch_size=model.config.get("patch_size_t"),
        channels=c,
        _callback_tensor_inputs=["latents"],
        config=types.SimpleNamespace(boundary_ratio=None),
        _execution_device=torch.device("cpu"),
        interrupt=False,
        do_classifier_free_guidance=False,
        progress_bar=lambda total=None: contextlib.nullcontext(types.SimpleNamespace(update=lambda: None)),
        transformer=_Transformer(model),
        scheduler=_Scheduler(),
        vae=types.SimpleNamespace(
            dtype=torch.float32,
            config=_Config(z_dim=c, latents_mean=[0.0] * c, latents_std=[1.0] * c),
            # the conditioning clip's latents only scale the noise: one latent pixel does
            encode=lambda video: types.SimpleNamespace(latents=torch.zeros(video.shape[0], c, 1, 1, 1)),
        ),
        video_processor=types.SimpleNamespace(preprocess=lambda image, height, width: torch.zeros(1, 3, 1, 1)),
        safety_checker=types.SimpleNamespace(to=lambda device: None),
    )
    for name in _OWN_METHODS:
        if hasattr(cls, name):
            own = inspect.getattr_static(cls, name)
            setattr(me, name, own.__func__ if isinstance(own, staticmethod) else types.MethodType(own, me))
    return me


def _until_transformer(cls: Any, me: Any, **kwargs: Any) -> dict[str, Any]:
    """Run the pipeline's ``__call__`` up to its first transformer call: the arguments it passes."""
    try:
        cls.__call__(me, **kwargs)
    except _Captured as captured:
        return captured.kwargs
    raise AssertionError(f"{cls.__name__} never called its transformer")


# -- Wan ------------------------------------------------------------------------------------------


def _wan_call(cls: Any, me: Any, frames: int, height: int, width: int) -> dict[str, Any]:
    latents = cls.prepare_latents(me, 1, me.channels, height, width, frames, torch.float32, torch.device("cpu"))
    text_dim = me.transformer.config.text_dim
    return {
        "hidden_states": latents,
        "timestep": torch.zeros(1, dtype=torch.long),
        "encoder_hidden_states": torch.zeros(1, 8, text_dim),
    }


def _wan_check(cls: Any, me: Any, height: int, width: int) -> None:
    cls.check_inputs(me, "a prompt", None, height, width)


def _wan_case(name: str, vae: VAEFactors, patch: list[int]) -> Case:
    return Case(
        name,
        "WanTransformer3DModel",
        {
            "patch_size": patch,
            "num_attention_heads": 2,
            "attention_head_dim": 12,
            "in_channels": vae.channels,
            "out_channels": vae.channels,
            "text_dim": 16,
            "freq_dim": 16,
            "ffn_dim": 32,
            "num_layers": 1,
        },
        vae,
        lambda: diffusers.WanPipeline,
        _wan_call,
        _wan_check,
    )


# -- CogVideoX ------------------------------------------------------------------------------------


def _cogvideox_call(cls: Any, me: Any, frames: int, height: int, width: int) -> dict[str, Any]:
    config = me.transformer.config
    # the pipeline pads every prompt to max_sequence_length (226), the transformer's max_text_seq_length
    embeds = torch.zeros(1, config.max_text_seq_length, config.text_embed_dim)
    return _until_transformer(
        cls,
        me,
        prompt_embeds=embeds,
        num_frames=frames,
        height=height,
        width=width,
        guidance_scale=1.0,
        num_inference_steps=1,
        max_sequence_length=config.max_text_seq_length,
    )


def _cogvideox_check(cls: Any, me: Any, height: int, width: int) -> None:
    cls.check_inputs(me, "a prompt", height, width, None, None)


def _grid_fchw(kwargs: dict[str, Any]) -> Grid:
    """The latent grid of CogVideoX's ``hidden_states``, laid out ``[B, F, C, H, W]``."""
    shape = kwargs["hidden_states"].shape
    return (shape[1], shape[3], shape[4])


def _cogvideox_case(
    name: str, frames: tuple[int, ...] = (1, 13, 49, 50, 81), min_sizes: int = 3, **config: Any
) -> Case:
    tiny = {
        "num_attention_heads": 2,
        "attention_head_dim": 16,
        "in_channels": 16,
        "out_channels": 16,
        "time_embed_dim": 8,
        "text_embed_dim": 8,
        "num_layers": 1,
        "max_text_seq_length": 8,
        "patch_size": 2,
        "temporal_compression_ratio": 4,
    }
    return Case(
        name,
        "CogVideoXTransformer3DModel",
        tiny | config,
        VAEFactors(4, 8, 16, "vae"),
        lambda: diffusers.CogVideoXPipeline,
        _cogvideox_call,
        _cogvideox_check,
        grid=_grid_fchw,
        blocks="transformer_blocks",
        frames=frames,
        sizes=((480, 720), (768, 1360), (256, 256), (488, 720), (100, 200), (2160, 3840)),
        min_sizes=min_sizes,
    )


# -- LTX-Video ------------------------------------------------------------------------------------


def _ltx_call(cls: Any, me: Any, frames: int, height: int, width: int) -> dict[str, Any]:
    config = me.transformer.config
    return _until_transformer(
        cls,
        me,
        prompt_embeds=torch.zeros(1, 8, config.caption_channels),
        prompt_attention_mask=torch.ones(1, 8, dtype=torch.bool),
        num_frames=frames,
        height=height,
        width=width,
        num_inference_steps=1,
    )


def _ltx_check(cls: Any, me: Any, height: int, width: int) -> None:
    cls.check_inputs(me, "a prompt", height, width)


def _grid_ltx(kwargs: dict[str, Any]) -> Grid:
    """The latent grid LTXPipeline tells its transformer (the latents come packed into tokens)."""
    return (kwargs["num_frames"], kwargs["height"], kwargs["width"])


LTX_CASE = Case(
    "ltx-video",
    "LTXVideoTransformer3DModel",
    {
        "in_channels": 128,
        "out_channels": 128,
        "patch_size": 1,
        "patch_size_t": 1,
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "cross_attention_dim": 24,
        "num_layers": 1,
        "caption_channels": 8,
    },
    VAEFactors(8, 32, 128, "vae"),
    lambda: diffusers.LTXPipeline,
    _ltx_call,
    _ltx_check,
    grid=_grid_ltx,
    blocks="transformer_blocks",
    frames=(1, 80, 161, 257),
    sizes=((512, 768), (704, 1280), (480, 704), (256, 256), (720, 1280), (100, 200)),
)


# -- HunyuanVideo ---------------------------------------------------------------------------------


def _hunyuan_call(cls: Any, me: Any, frames: int, height: int, width: int) -> dict[str, Any]:
    config = me.transformer.config
    return _until_transformer(
        cls,
        me,
        prompt_embeds=torch.zeros(1, 8, config.text_embed_dim),
        pooled_prompt_embeds=torch.zeros(1, config.pooled_projection_dim),
        prompt_attention_mask=torch.ones(1, 8, dtype=torch.long),
        num_frames=frames,
        height=height,
        width=width,
        num_inference_steps=1,
    )


def _hunyuan_check(cls: Any, me: Any, height: int, width: int) -> None:
    cls.check_inputs(me, "a prompt", None, height, width)


HUNYUAN_CASE = Case(
    "hunyuan-video",
    "HunyuanVideoTransformer3DModel",
    {
        "in_channels": 16,
        "out_channels": 16,
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "num_layers": 1,
        "num_single_layers": 1,
        "num_refiner_layers": 1,
        "patch_size": 2,
        "patch_size_t": 1,
        "text_embed_dim": 8,
        "pooled_projection_dim": 8,
        "rope_axes_dim": (4, 4, 4),
        "guidance_embeds": True,
    },
    VAEFactors(4, 8, 16, "vae"),
    lambda: diffusers.HunyuanVideoPipeline,
    _hunyuan_call,
    _hunyuan_check,
    blocks="transformer_blocks",
    frames=(1, 33, 80, 129),
    sizes=((720, 1280), (544, 960), (480, 848), (256, 256), (720, 1288), (100, 200)),
)


# -- Cosmos ---------------------------------------------------------------------------------------


def _cosmos2_call(cls: Any, me: Any, frames: int, height: int, width: int) -> dict[str, Any]:
    config = me.transformer.config
    return _until_transformer(
        cls,
        me,
        image=object(),  # the conditioning image: the stand-in VAE encodes it to one latent pixel
        prompt_embeds=torch.zeros(1, 8, config.text_embed_dim),
        num_frames=frames,
        height=height,
        width=width,
        num_inference_steps=1,
    )


def _cosmos1_call(cls: Any, me: Any, frames: int, height: int, width: int) -> dict[str, Any]:
    config = me.transformer.config
    return _until_transformer(
        cls,
        me,
        prompt_embeds=torch.zeros(1, 8, config.text_embed_dim),
        num_frames=frames,
        height=height,
        width=width,
        num_inference_steps=1,
    )


def _cosmos_check(cls: Any, me: Any, height: int, width: int) -> None:
    cls.check_inputs(me, "a prompt", height, width)


def _cosmos_case(
    name: str, vae: VAEFactors, pipeline: str, call: Any, frames: tuple[int, ...], min_sizes: int, **config: Any
) -> Case:
    tiny = {
        "in_channels": 16,
        "out_channels": 16,
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "num_layers": 1,
        "text_embed_dim": 8,
        "adaln_lora_dim": 4,
        "max_size": (128, 240, 240),
        "patch_size": (1, 2, 2),
        "concat_padding_mask": True,
    }
    return Case(
        name,
        "CosmosTransformer3DModel",
        tiny | config,
        vae,
        lambda: getattr(diffusers, pipeline),
        call,
        _cosmos_check,
        blocks="transformer_blocks",
        frames=frames,
        # 2048 x 2048: 128 x 128 patches, the rotary table's reach and past the learned positions'
        sizes=((704, 1280), (480, 832), (256, 256), (2048, 2048), (2160, 3840), (100, 200)),
        min_sizes=min_sizes,
    )


CASES = [
    _wan_case("wan2.1", VAEFactors(4, 8, 16, "vae"), [1, 2, 2]),
    _wan_case("wan2.2-ti2v-5b", VAEFactors(4, 16, 48, "vae"), [1, 2, 2]),
    # CogVideoX-2b: sin-cos positions recomputed for any size
    _cogvideox_case("cogvideox-2b", sample_height=60, sample_width=90, sample_frames=49),
    # CogVideoX-5b-I2V: rotary and learned positions, which take its sample size only
    _cogvideox_case(
        "cogvideox-5b-i2v",
        in_channels=32,
        sample_height=60,
        sample_width=90,
        sample_frames=49,
        use_rotary_positional_embeddings=True,
        use_learned_positional_embeddings=True,
        frames=(1, 49),
        min_sizes=1,
    ),
    # CogVideoX 1.5: 2-frame patches (the pipeline pads the latent frames) and a rotary table of
    # sample_height x sample_width patches
    _cogvideox_case(
        "cogvideox1.5-5b",
        patch_size_t=2,
        patch_bias=False,
        sample_height=300,
        sample_width=300,
        sample_frames=81,
        use_rotary_positional_embeddings=True,
    ),
    LTX_CASE,
    HUNYUAN_CASE,
    _cosmos_case(
        "cosmos-predict2-video2world",
        VAEFactors(4, 8, 16, "vae"),
        "Cosmos2VideoToWorldPipeline",
        _cosmos2_call,
        (1, 80, 93, 521),  # 521 frames: 131 latent frames, past the rotary table
        3,
        in_channels=17,
        rope_scale=(1.0, 3.0, 3.0),
        extra_pos_embed_type=None,
    ),
    _cosmos_case(
        "cosmos-1.0-text2world",
        VAEFactors(8, 8, 16, "vae"),
        "CosmosTextToWorldPipeline",
        _cosmos1_call,
        (1, 80, 121, 1033),  # 1033 frames: 130 latent frames, past the learned positions
        2,
        rope_scale=(2.0, 1.0, 1.0),
        extra_pos_embed_type="learnable",
    ),
]


# -- the oracle -----------------------------------------------------------------------------------


def _oracle(
    case: Case, model: Any, mode: FakeTensorMode, frames: int, height: int, width: int
) -> tuple[Grid, int] | str:
    """The latents' grid and the tokens the first block sees, or the pipeline's refusal."""
    cls = case.pipeline()
    me = _stand_in(case, cls, model)
    try:
        case.check(cls, me, height, width)
    except ValueError as exc:
        return f"refused: {exc}"
    seen: list[int] = []

    def first_block(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append((kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).shape[1])
        raise _Seen  # the rest of the forward does not change the count

    handle = getattr(model, case.blocks)[0].register_forward_pre_hook(first_block, with_kwargs=True)
    try:
        with mode:
            try:
                kwargs = case.call(cls, me, frames, height, width)
            except RuntimeError as exc:  # the pipeline's own tables do not reach this size
                return f"fails in the pipeline: {exc}"
            grid = case.grid(kwargs)
            try:
                model(**kwargs)
            except _Seen:
                pass
            except (RuntimeError, ValueError) as exc:  # the transformer fails on (or refuses) these latents
                return f"fails: {exc}"
    finally:
        handle.remove()
    return grid, seen[0]


class _Seen(Exception):
    pass


class _NearestResize:
    """Stands in for ``torchvision.transforms`` where torchvision is not installed: Cosmos's
    transformer resizes its padding mask to the latents with it (nearest; only the shape counts)."""

    class InterpolationMode:
        NEAREST = "nearest"

    class functional:  # torchvision's name
        @staticmethod
        def resize(img: torch.Tensor, size: list[int], interpolation: Any = None) -> torch.Tensor:
            return torch.nn.functional.interpolate(img, size=size, mode="nearest")


def _tiny_model(case: Case, mode: FakeTensorMode, monkeypatch: pytest.MonkeyPatch) -> Any:
    cls = getattr(diffusers, case.class_name)
    module = inspect.getmodule(cls)
    if case.class_name == "CosmosTransformer3DModel" and not hasattr(module, "transforms"):
        monkeypatch.setattr(module, "transforms", _NearestResize, raising=False)
    with mode:
        return cls(**case.transformer)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dit_tokens_equal_the_pipelines_latents_and_the_transformers_patches(
    case: Case, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a size the code fails on is an answer here: not the traceback fake tensors log for it
    caplog.set_level(logging.CRITICAL, logger="torch._subclasses.fake_tensor")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = _tiny_model(case, mode, monkeypatch)
    cfg = DiTConfig("test", case.class_name, case.transformer, case.vae, "pipeline")
    fam = dit_family(case.class_name)
    counted = mismatched = refused = 0
    for frames, (height, width) in itertools.product(case.frames, case.sizes):
        truth = _oracle(case, model, mode, frames, height, width)
        try:
            ours = fam.latents(cfg, frames, height, width)
        except ConfigError as exc:
            # a refusal: the pipeline refuses it too, or its patches do not tile the latents
            assert isinstance(truth, str) or _untiled(case, fam, cfg, truth), (case.name, frames, height, width, exc)
            assert "\n" not in str(exc)
            refused += 1
            continue
        assert not isinstance(truth, str), (case.name, frames, height, width, truth)
        grid, tokens = truth
        counted += 1
        mismatched += (grid, tokens) != ((ours.frames, ours.height, ours.width), ours.tokens)
    assert mismatched == 0, mismatched
    assert counted >= len(case.frames) * case.min_sizes and refused >= len(case.frames), (counted, refused)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dit_inputs_run_the_transformers_forward_to_the_target(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """The measured mode's inputs: the whole tiny transformer runs on them, its first block sees
    the counted tokens, and its output has the target's shape."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = _tiny_model(case, mode, monkeypatch)
    cfg = DiTConfig("test", case.class_name, case.transformer, case.vae, "pipeline")
    fam = dit_family(case.class_name)
    latents = fam.latents(cfg, case.frames[-2], *case.sizes[0])  # CogVideoX 1.5: padded latent frames
    seen: list[int] = []

    def first_block(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append((kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).shape[1])

    handle = getattr(model, case.blocks)[0].register_forward_pre_hook(first_block, with_kwargs=True)
    try:
        with mode:
            kwargs = fam.inputs(cfg, 2, latents, 5, torch.float32)
            target = kwargs.pop("target")
            out = model(**kwargs, return_dict=False)[0]
    finally:
        handle.remove()
    assert seen == [latents.tokens] and out.shape == target.shape, (seen, latents, out.shape, target.shape)


# (pipeline, its VAE class, a vae/config.json, the transformer class): the pipeline's __init__
# derives the VAE factors from the VAE it is given; the VAE's config says its latent channels
VAES = [
    ("CogVideoXPipeline", "AutoencoderKLCogVideoX", {}, "CogVideoXTransformer3DModel"),
    (
        "CogVideoXPipeline",
        "AutoencoderKLCogVideoX",
        {
            "block_out_channels": [128, 256, 512],
            "down_block_types": ["CogVideoXDownBlock3D"] * 3,
            "up_block_types": ["CogVideoXUpBlock3D"] * 3,
        },
        "CogVideoXTransformer3DModel",
    ),
    ("LTXPipeline", "AutoencoderKLLTXVideo", {}, "LTXVideoTransformer3DModel"),
    (
        "LTXPipeline",  # LTX-Video 0.9.5 and later: the ratios are config keys
        "AutoencoderKLLTXVideo",
        {
            "block_out_channels": [128, 256, 512, 1024],
            "down_block_types": ["LTXVideo095DownBlock3D"] * 4,
            "downsample_type": ["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
            "layers_per_block": [4, 6, 6, 2, 2],
            "spatio_temporal_scaling": [True, True, True, True],
            "decoder_block_out_channels": [256, 512, 1024],
            "decoder_layers_per_block": [5, 5, 5, 5],
            "decoder_spatio_temporal_scaling": [True, True, True],
            "decoder_inject_noise": [False] * 4,
            "upsample_residual": [True] * 3,
            "upsample_factor": [2, 2, 2],
            "spatial_compression_ratio": 32,
            "temporal_compression_ratio": 8,
        },
        "LTXVideoTransformer3DModel",
    ),
    ("HunyuanVideoPipeline", "AutoencoderKLHunyuanVideo", {}, "HunyuanVideoTransformer3DModel"),
    ("Cosmos2VideoToWorldPipeline", "AutoencoderKLWan", {}, "CosmosTransformer3DModel"),
    (
        "Cosmos2VideoToWorldPipeline",
        "AutoencoderKLWan",
        {"temperal_downsample": [False, False, True]},
        "CosmosTransformer3DModel",
    ),
    ("CosmosTextToWorldPipeline", "AutoencoderKLCosmos", {}, "CosmosTransformer3DModel"),
]


@pytest.mark.parametrize(
    ("pipeline", "vae", "config", "class_name"), VAES, ids=[f"{v[1]}-{i}" for i, v in enumerate(VAES)]
)
def test_dit_vae_factors_equal_what_the_pipeline_derives_from_its_vae(
    pipeline: str, vae: str, config: dict[str, Any], class_name: str
) -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    cls = getattr(diffusers, pipeline)
    parts: dict[str, Any] = {name: None for name in inspect.signature(cls.__init__).parameters if name != "self"}
    if "safety_checker" in parts:  # the Cosmos pipelines build a guardrail when given none
        parts["safety_checker"] = torch.nn.Identity()
    with mode:
        parts["vae"] = getattr(diffusers, vae)(**config)
        pipe = cls(**parts)
    t = getattr(pipe, "vae_scale_factor_temporal", getattr(pipe, "vae_temporal_compression_ratio", None))
    s = getattr(pipe, "vae_scale_factor_spatial", getattr(pipe, "vae_spatial_compression_ratio", None))
    channels = parts["vae"].config.get("latent_channels", parts["vae"].config.get("z_dim"))
    ours = dit_family(class_name).vae_factors({"_class_name": vae, **config}, "vae/config.json")
    assert (ours.temporal, ours.spatial, ours.channels) == (t, s, channels)


def _untiled(case: Case, fam: Any, cfg: DiTConfig, truth: tuple[Grid, int]) -> bool:
    """The pipeline took the size, but its latents are not whole patches: the transformer floors
    them and its output no longer matches the latents a loss compares it with."""
    grid, _ = truth
    p = fam.patch_sizes(cfg)
    return any(g % q for g, q in zip(grid, p, strict=True))


def test_dit_family_refuses_an_unknown_class_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^transformer _class_name 'UNetMotionModel' is not supported; supported: "):
        dit_family("UNetMotionModel")
