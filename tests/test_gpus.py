"""GPU registry and budgets."""

from __future__ import annotations

import pytest

from tokenbucket import ConfigError
from tokenbucket.cost.gpus import GIB, GPUS, get_gpu, gpu_budget_bytes
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec

REQUIRED = [
    "A100-40GB",
    "A100-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "B200",
    "L40S",
    "RTX-4090",
    "RTX-3090",
    "A10G",
    "L4",
    "MI300X",
    "V100-32GB",
]


def test_gpus_registry_has_every_required_target_with_sane_numbers() -> None:
    assert set(REQUIRED) <= set(GPUS)
    for g in GPUS.values():
        assert 16 < g.visible_gib < 200
        assert g.bandwidth_tbs > 0
        assert g.bf16_tflops is None or g.bf16_tflops > g.fp32_tflops


def test_gpus_lookup_ignores_case_and_separators() -> None:
    assert get_gpu("h100_sxm") is GPUS["H100-SXM"]
    assert get_gpu("rtx 4090") is GPUS["RTX-4090"]


def test_gpus_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        get_gpu("TPU-v5")
    for name in REQUIRED:
        assert name in str(info.value)


def test_gpus_budget_is_visible_minus_context_and_workspace_over_safety() -> None:
    g = GPUS["A100-80GB"]
    assert gpu_budget_bytes(g) == int((g.visible_bytes - GIB // 2 - GIB // 4) / 1.1)
    assert gpu_budget_bytes(g, safety=1.0) > gpu_budget_bytes(g)
    with pytest.raises(ConfigError, match="safety"):
        gpu_budget_bytes(g, safety=0.5)


def test_gpus_v100_has_no_bf16_and_says_so() -> None:
    with pytest.raises(ConfigError, match="V100-32GB has no bf16"):
        CostModel(ModelSpec.preset("design-24L-1024"), "V100-32GB")
    fp32 = ModelSpec(hidden=1024, layers=24, heads=16, precision="fp32")
    assert CostModel(fp32, "V100-32GB").step_seconds(1, 1024) > 0
