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
    assert get_gpu("h100-sxm") is GPUS["H100-SXM"]
    assert get_gpu("a100_80gb") is GPUS["A100-80GB"]
    assert get_gpu("H100PCIE") is GPUS["H100-PCIe"]
    assert get_gpu(" mi300x ") is GPUS["MI300X"]


@pytest.mark.parametrize(
    ("prefix", "name"),
    [("mi300", "MI300X"), ("h20", "H200"), ("b2", "B200"), ("v100", "V100-32GB"), ("h100p", "H100-PCIe")],
)
def test_gpus_unique_prefix_is_enough(prefix: str, name: str) -> None:
    assert get_gpu(prefix) is GPUS[name]


def test_gpus_exact_name_wins_over_a_longer_one_it_prefixes() -> None:
    # "L4" is also the start of "L40S": the exact name is not ambiguous
    assert get_gpu("l4") is GPUS["L4"]
    assert get_gpu("l40") is GPUS["L40S"]


def test_gpus_every_registry_name_finds_itself_however_written() -> None:
    for name, gpu in GPUS.items():
        for written in (name, name.lower(), name.upper(), name.replace("-", "_"), name.replace("-", " ")):
            assert get_gpu(written) is gpu, written


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("h100", "--gpu 'h100' is ambiguous: did you mean H100-SXM or H100-PCIe?"),
        ("A100", "--gpu 'A100' is ambiguous: did you mean A100-40GB or A100-80GB?"),
        ("rtx", "--gpu 'rtx' is ambiguous: did you mean RTX-4090 or RTX-3090?"),
    ],
)
def test_gpus_ambiguous_prefix_names_the_candidates(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        get_gpu(text, source="--gpu")
    assert str(info.value) == message


def test_gpus_ambiguous_prefix_without_a_flag_says_gpu_name() -> None:
    with pytest.raises(ConfigError, match=r"^GPU name 'h100' is ambiguous: did you mean H100-SXM or H100-PCIe\?$"):
        get_gpu("h100")


def suggestions(message: str) -> list[str]:
    """The names after "did you mean" in an error message."""
    tail = message.split("did you mean ", 1)[1].rstrip("?")
    return tail.replace(" or ", ", ").split(", ")


def test_gpus_unknown_name_suggests_the_closest_few_not_the_registry() -> None:
    with pytest.raises(ConfigError) as info:
        get_gpu("H100-SXN", source="--gpu")
    assert str(info.value).startswith("--gpu 'H100-SXN': unknown GPU; did you mean ")
    assert suggestions(str(info.value))[0] == "H100-SXM"
    with pytest.raises(ConfigError) as info:
        get_gpu("4090")
    assert str(info.value) == "unknown GPU '4090'; did you mean RTX-4090, RTX-3090 or L40S?"
    for text in ("H100-SXN", "4090", "a6000", "h1OO", "H100-SXM5"):
        with pytest.raises(ConfigError) as info:
            get_gpu(text)
        names = suggestions(str(info.value))
        assert 1 <= len(names) <= 3 and set(names) <= set(GPUS), (text, names)


def test_gpus_unknown_name_with_nothing_close_points_at_the_list() -> None:
    with pytest.raises(ConfigError) as info:
        get_gpu("TPU-v5", source="--gpu")
    assert str(info.value) == f"--gpu 'TPU-v5': unknown GPU; `tokenbucket gpus` lists the {len(GPUS)} known ones"
    assert not any(name in str(info.value) for name in GPUS)
    with pytest.raises(ConfigError, match="unknown GPU ''"):
        get_gpu("")  # an empty name is no prefix of everything


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
