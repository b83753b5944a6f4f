"""Video DiT token counts against the pipelines' own code (NOTE [ Video DiT tokens ]).

The oracle for each family: its diffusers pipeline's ``prepare_latents`` (called on a stand-in
``self`` holding the pipeline's VAE factors, as its ``__init__`` sets them) gives the latents'
shape, and a tiny transformer of the family's class, with the published patch sizes and latent
channels, runs its ``forward`` on those latents under fake tensors: the sequence its first block
receives is the count. The refusals are the pipeline's ``check_inputs``' own.
"""

from __future__ import annotations

import itertools
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


@dataclass(frozen=True)
class Case:
    """One family's oracle: its tiny transformer config (the published patch sizes and latent
    channels at a tiny width), the VAE factors, the pipeline class, and how to call the parts."""

    name: str
    class_name: str
    transformer: dict[str, Any]
    vae: VAEFactors
    pipeline: Callable[[], Any]
    # (pipeline class, stand-in self, frames, height, width) -> latents [B, C, F', H', W']
    prepare: Callable[[Any, Any, int, int, int], torch.Tensor]
    # (pipeline class, stand-in self, height, width) -> None or raises ValueError
    check: Callable[[Any, Any, int, int], None]
    # (transformer, latents) -> forward kwargs beside hidden_states
    forward_kwargs: Callable[[Any, torch.Tensor], dict[str, Any]]
    blocks: str = "blocks"


def _wan_prepare(cls: Any, me: Any, frames: int, height: int, width: int) -> torch.Tensor:
    return cls.prepare_latents(me, 1, me.channels, height, width, frames, torch.float32, torch.device("cpu"))


def _wan_check(cls: Any, me: Any, height: int, width: int) -> None:
    cls.check_inputs(me, "a prompt", None, height, width)


def _wan_kwargs(model: Any, latents: torch.Tensor) -> dict[str, Any]:
    text_dim = model.config.text_dim
    return {"timestep": torch.zeros(1, dtype=torch.long), "encoder_hidden_states": torch.zeros(1, 8, text_dim)}


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
        _wan_prepare,
        _wan_check,
        _wan_kwargs,
    )


CASES = [
    _wan_case("wan2.1", VAEFactors(4, 8, 16, "vae"), [1, 2, 2]),
    _wan_case("wan2.2-ti2v-5b", VAEFactors(4, 16, 48, "vae"), [1, 2, 2]),
]

FRAMES = (1, 5, 17, 49, 80, 81, 121)
SIZES = ((480, 832), (720, 1280), (256, 256), (512, 768), (480, 848), (272, 480), (248, 512), (100, 200))


def _stand_in(case: Case) -> Any:
    """What the pipeline's ``__init__`` sets on itself that ``prepare_latents`` and
    ``check_inputs`` read (the VAE factors under each pipeline's own attribute names)."""
    t, s = case.vae.temporal, case.vae.spatial
    return types.SimpleNamespace(
        vae_scale_factor_temporal=t,
        vae_scale_factor_spatial=s,
        vae_temporal_compression_ratio=t,
        vae_spatial_compression_ratio=s,
        channels=case.vae.channels,
        _callback_tensor_inputs=["latents"],
        config=types.SimpleNamespace(boundary_ratio=None),
    )


def _oracle(
    case: Case, model: Any, mode: FakeTensorMode, frames: int, height: int, width: int
) -> tuple[tuple[int, ...], int] | str:
    """The latents' grid and the tokens the first block sees, or the pipeline's refusal."""
    cls, me = case.pipeline(), _stand_in(case)
    try:
        case.check(cls, me, height, width)
    except ValueError as exc:
        return f"refused: {exc}"
    latents = case.prepare(cls, me, frames, height, width)
    seen: list[int] = []

    def first_block(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append((kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).shape[1])
        raise _Seen  # the rest of the forward does not change the count

    handle = getattr(model, case.blocks)[0].register_forward_pre_hook(first_block, with_kwargs=True)
    try:
        with mode:
            fake = torch.empty(latents.shape)
            try:
                model(hidden_states=fake, **case.forward_kwargs(model, fake))
            except _Seen:
                pass
            except RuntimeError as exc:  # the patches do not tile the latents: the model fails on them
                return f"fails: {exc}"
    finally:
        handle.remove()
    return tuple(latents.shape[2:]), seen[0]


class _Seen(Exception):
    pass


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dit_tokens_equal_the_pipelines_latents_and_the_transformers_patches(case: Case) -> None:
    cls = getattr(diffusers, case.class_name)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = cls(**case.transformer)
    cfg = DiTConfig("test", case.class_name, case.transformer, case.vae, "pipeline")
    fam = dit_family(case.class_name)
    counted = mismatched = refused = 0
    for frames, (height, width) in itertools.product(FRAMES, SIZES):
        truth = _oracle(case, model, mode, frames, height, width)
        try:
            ours = fam.latents(cfg, frames, height, width)
        except ConfigError as exc:
            # a refusal: the pipeline refuses it too, or its patches do not tile the latents
            assert isinstance(truth, str) or _untiled(case, fam, cfg, truth), (case.name, frames, height, width, exc)
            refused += 1
            continue
        assert not isinstance(truth, str), (case.name, frames, height, width, truth)
        grid, tokens = truth
        counted += 1
        mismatched += (grid, tokens) != ((ours.frames, ours.height, ours.width), ours.tokens)
    assert mismatched == 0 and counted >= len(FRAMES) * 3 and refused >= len(FRAMES), (counted, refused)


def _untiled(case: Case, fam: Any, cfg: DiTConfig, truth: tuple[tuple[int, ...], int]) -> bool:
    """The pipeline took the size, but its latents are not whole patches: the transformer floors
    them and its output no longer matches the latents a loss compares it with."""
    grid, _ = truth
    p = fam.patch_sizes(cfg)
    return any(g % q for g, q in zip(grid, p, strict=True))


def test_dit_family_refuses_an_unknown_class_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^transformer _class_name 'UNetMotionModel' is not supported; supported: "):
        dit_family("UNetMotionModel")
