"""Measured mode: the fake-tensor profiler on a user's model, saved profiles, the measured
cost model, and the measured max-batch search."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tokenbucket import ConfigError
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import (
    MeasuredCostModel,
    Profile,
    ProfiledCostModel,
    max_batch_measured,
    model_hash,
    profile_memory,
    profile_points,
    read_profile,
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


# -- saved profiles: refusals and the planner's adapter (hand-made points, no profiling) ----------


def synthetic_profile(points: tuple[tuple[int, int, int], ...] | None = None, target: str = "fake-cpu") -> Profile:
    """Peaks exactly ``1 MiB + B·(1000·L + 2·L²)`` at batches 1, 2 and lengths 256, 512."""
    if points is None:
        points = tuple((b, n, 2**20 + b * (1000 * n + 2 * n * n)) for b in (1, 2) for n in (256, 512))
    return Profile(points, target, "bf16", torch.__version__, "0" * 16, "fake-cpu")


@pytest.mark.parametrize("key", ["points", "target", "dtype", "torch_version", "model", "device"])
def test_profile_from_dict_missing_key_is_a_config_error_naming_it(key: str) -> None:
    data = synthetic_profile().to_dict()
    del data[key]
    with pytest.raises(ConfigError, match=rf"profile 'p\.json' has no '{key}' key"):
        Profile.from_dict(data, source="profile 'p.json'")


def test_profile_read_profile_hashes_the_bytes_it_parsed_and_names_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    synthetic_profile().save(path)
    prof, digest = read_profile(path)
    assert prof == synthetic_profile() and digest == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(json.dumps({**synthetic_profile().to_dict(), "points": [[1, 256, "big"]]}))
    with pytest.raises(ConfigError, match=r"points\[0\] should be \[batch, length, peak bytes\]"):
        read_profile(path)
    path.write_text("[]")
    with pytest.raises(ConfigError, match=f"profile {str(path)!r} should be a JSON object, but holds a list"):
        Profile.load(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_profile(tmp_path / "missing.json")


def test_profile_measured_cost_model_refuses_one_length_and_matches_gpu_names_loosely() -> None:
    one_length = synthetic_profile(((1, 256, 3 << 20), (2, 256, 5 << 20), (4, 256, 9 << 20)))
    with pytest.raises(ConfigError, match="needs points at 2 or more lengths, but this profile measured only 256"):
        MeasuredCostModel(one_length)
    # a target saved as typed by hand still matches the registry's name
    MeasuredCostModel(synthetic_profile(target="h100-sxm"), target="H100-SXM")
    with pytest.raises(ConfigError, match=r"profile 'p\.json' was made for 'H100-SXM', not for 'A100-80GB'"):
        MeasuredCostModel(synthetic_profile(target="H100-SXM"), target="A100-80GB", source="profile 'p.json'")


def test_profile_profiled_cost_model_memory_from_the_fit_time_from_the_formulas() -> None:
    measured = MeasuredCostModel(synthetic_profile())
    analytic = CostModel(SPEC, "H100-SXM")
    cost = ProfiledCostModel(measured, analytic, source="profile 'p.json'")
    assert measured.fit_error < 1e-6 and cost.gpu is analytic.gpu and cost.model == SPEC
    assert cost.memory(3, 384).total == measured.memory(3, 384).total
    assert cost.max_batch(512, 64 << 20) == measured.max_batch(512, 64 << 20) == (63 << 20) // (1000 * 512 + 2 * 512**2)
    assert cost.flops(3, 384) == analytic.flops(3, 384)
    assert cost.step_seconds(3, 384) == analytic.step_seconds(3, 384)
    assert cost.memory(1, 64).total > 0  # shorter than measured: answered (the static part anchors it)
    # NOTE [ A profile is not extrapolated ]
    for ask in (lambda: cost.memory(1, 513), lambda: cost.max_batch(513, 64 << 20)):
        with pytest.raises(
            ConfigError, match=r"measured lengths 256\.\.512 tokens, but the plan needs 513; .* 576 or more"
        ):
            ask()
    record = cost.record("ab" * 32)
    assert record["sha256"] == "ab" * 32 and record["lengths"] == [256, 512] and record["points"] == 4
