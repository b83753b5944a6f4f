"""Measured mode: the fake-tensor profiler on a user's model, saved profiles, the measured
cost model, and the measured max-batch search."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenbucket import ConfigError
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import (
    MeasuredCostModel,
    Profile,
    max_batch_measured,
    model_hash,
    profile_memory,
    profile_points,
)
from tokenbucket.cost.reference import ReferenceTransformer

from .user_models import build, make_batch

SPEC = ModelSpec(hidden=256, layers=2, heads=4, attention="eager")


def ref_factory() -> torch.nn.Module:
    return ReferenceTransformer(SPEC)


def ref_batch(b: int, n: int) -> torch.Tensor:
    return torch.empty(b, n, SPEC.hidden, dtype=torch.bfloat16)


@pytest.mark.slow
def test_profile_user_model_phases_and_growth() -> None:
    small = profile_memory(build, make_batch, 1, 256)
    big = profile_memory(build, make_batch, 4, 256)
    assert set(small.peaks) == {"setup", "forward", "backward", "optimizer"}
    assert small.peak == max(small.peaks.values())
    assert small.device == "fake-cpu"
    # 4x the batch: more than 2x the activations, same weights
    assert big.peaks["backward"] - big.peaks["setup"] > 2 * (small.peaks["backward"] - small.peaks["setup"])
    inference = profile_memory(build, make_batch, 4, 256, train=False)
    assert set(inference.peaks) == {"setup", "forward"} and inference.peak < big.peak


def test_profile_optimizer_states_show_in_the_second_step() -> None:
    adam = profile_memory(ref_factory, ref_batch, 1, 64)
    sgd = profile_memory(ref_factory, ref_batch, 1, 64, optimizer="sgd")
    params_bytes = 2 * SPEC.params  # bf16
    # AdamW keeps two states and one temporary per parameter, SGD momentum one state
    assert adam.peaks["optimizer"] - sgd.peaks["optimizer"] == pytest.approx(2 * params_bytes, rel=0.02)


@pytest.mark.slow
def test_profile_measured_cost_model_fits_and_predicts_new_points() -> None:
    prof = profile_points(ref_factory, ref_batch, [(1, 256), (2, 256), (1, 1024), (2, 1024), (1, 2048)])
    measured = MeasuredCostModel(prof)
    assert measured.fit_error < 0.02
    actual = profile_memory(ref_factory, ref_batch, 3, 1536).peak
    assert measured.memory_bytes(3, 1536) == pytest.approx(actual, rel=0.02)
    est = measured.memory(3, 1536)
    assert est.phase == "measured" and abs(est.total - measured.memory_bytes(3, 1536)) <= 2
    assert est.attention_scores > 0  # eager: the fit finds the quadratic term
    # and agrees with the analytic model on the largest batch that fits
    budget = 2 * actual
    assert abs(measured.max_batch(1536, budget) - CostModel(SPEC).max_batch(1536, budget)) <= 1


@pytest.mark.slow
def test_profile_save_load_round_trip_and_refusals(tmp_path: Path) -> None:
    prof = profile_points(ref_factory, ref_batch, [(1, 128), (2, 128), (1, 512)], target="H100-SXM")
    path = tmp_path / "profile.json"
    prof.save(path)
    again = Profile.load(path)
    assert again == prof
    assert again.torch_version == torch.__version__ and again.dtype == "bf16"
    MeasuredCostModel(again, target="H100-SXM", model=prof.model)
    with pytest.raises(ConfigError, match="made for 'H100-SXM', not for 'A100-80GB'"):
        MeasuredCostModel(again, target="A100-80GB")
    with pytest.raises(ConfigError, match="made for model"):
        MeasuredCostModel(again, model="0" * 16)


def test_profile_model_hash_tells_models_apart() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = model_hash(ReferenceTransformer(SPEC))
        b = model_hash(ReferenceTransformer(ModelSpec(hidden=256, layers=2, heads=4, attention="flash")))
        c = model_hash(ReferenceTransformer(ModelSpec(hidden=256, layers=3, heads=4, attention="eager")))
        same = model_hash(ReferenceTransformer(SPEC))
    assert len({a, b, c}) == 3 and a == same


@pytest.mark.slow
def test_profile_max_batch_measured_on_fake_tensors_is_the_boundary() -> None:
    budget = profile_memory(ref_factory, ref_batch, 5, 512).peak
    b = max_batch_measured(ref_factory, ref_batch, 512, budget_bytes=budget, device="fake")
    assert b == 5
    with pytest.raises(ConfigError, match="needs budget_bytes"):
        max_batch_measured(ref_factory, ref_batch, 512, device="fake")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_profile_cuda_matches_fake_within_five_percent() -> None:
    spec = ModelSpec(hidden=512, layers=2, heads=8)
    fake = profile_memory(lambda: ReferenceTransformer(spec), ref_batch_for(spec), 2, 2048)
    cuda = profile_memory(lambda: ReferenceTransformer(spec), ref_batch_for(spec), 2, 2048, device="cuda")
    assert abs(cuda.peak / fake.peak - 1) < 0.05


def ref_batch_for(spec: ModelSpec):  # type: ignore[no-untyped-def]
    return lambda b, n: torch.empty(b, n, spec.hidden, dtype=torch.bfloat16)
