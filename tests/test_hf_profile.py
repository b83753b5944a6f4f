"""profile_hf: a config.json's real transformers model measured on fake tensors, from one sample's shape.

The truth set (tests/data/hf_truth.json) was made by benchmarks/hf_truth.py with its own configs
and its own image-token counting; profile_hf builds the model from the stored config.json and
the inputs from tokenbucket's counting, so equal peaks check both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.test_profile_hf_cli import TINY_VL
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost import hf_profile
from tokenbucket.cost.hf_profile import profile_hf
from tokenbucket.cost.staged import Sample, TrainSetup
from tokenbucket.models._hf_json import HFConfig

FIXTURE = Path(__file__).parent / "data" / "hf_truth.json"
PREPROCESSORS = {"smolvlm-256m": {"do_resize": False, "max_image_size": {"longest_edge": 512}}}
TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip


def _point(arch: str, train: str, sharding: str) -> dict[str, Any]:
    data = json.loads(FIXTURE.read_text())
    for p in data["points"]:
        if (p["arch"], p["train"], p["sharding"], p["steps"], p["batch"], p.get("videos", 0)) == (
            arch, train, sharding, 1, 1, 0
        ):  # fmt: skip
            return {**p, "config": data["configs"][arch]}
    raise AssertionError(f"no stored point {arch}/{train}/{sharding}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "train", "sharding"),
    [
        ("qwen2-0.5b", "full", "none"),  # a plain decoder
        ("qwen2-vl-2b", "lora", "none"),  # a Qwen2-VL-style VLM: grids, 3-D rope positions
        ("paligemma-3b", "frozen-vision", "none"),  # a PaliGemma-style VLM: prefix and suffix
        ("smolvlm-256m", "full", "fsdp8"),  # tiles, real pixels, FSDP over 8 fake ranks
    ],
)
def test_profile_hf_equals_the_truth_set(arch: str, train: str, sharding: str) -> None:
    p = _point(arch, train, sharding)
    cfg = HFConfig(f"<{arch}>", p["config"], PREPROCESSORS.get(arch, {}))
    setup = TrainSetup(
        train=train, sharding="fsdp" if sharding == "fsdp8" else "none", world_size=p["world"], loop="dropped"
    )  # the point's step: output dropped, the CPU kernels
    sample = Sample(images=p["images"], height=p["height"], width=p["width"], text_tokens=p["text_tokens"])
    run = profile_hf(cfg, sample, p["batch"], setup, kernels="cpu")
    assert run.seq_len == p["seq_len"]  # the same image tokens as the processor's rules
    assert (run.params_total, run.params_trainable) == (p["params_total"], p["params_trainable"])
    assert run.peak_bytes == pytest.approx(p["peak_bytes"], rel=1e-3)


def test_profile_hf_reads_a_config_folder_and_batch_scales_activations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    monkeypatch.delenv("TRANSFORMERS_DISABLE_TORCH_CHECK", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    one = profile_hf(tmp_path, Sample(text_tokens=256), 1)
    # the checks are off only while the step runs: a user's process keeps its own settings
    assert "TRANSFORMERS_DISABLE_TORCH_CHECK" not in os.environ and "HF_HUB_OFFLINE" not in os.environ
    four = profile_hf(tmp_path, Sample(text_tokens=256), 4)
    assert one.seq_len == four.seq_len == 256
    assert four.peak_bytes > one.peak_bytes and four.params_total == one.params_total
    assert set(one.breakdown) >= {"Parameter", "Gradient", "Optstate", "Total"}


def test_profile_hf_decoder_inputs_are_text_ids_whatever_the_shape_holds() -> None:
    # a decoder's sample is text: sample_shape drops its images, and the family's own inputs (the
    # Family contract every model type answers) hold input_ids of the text alone, no pixels
    from tokenbucket.cost.hf_profile import sample_shape
    from tokenbucket.models import decoders
    from tokenbucket.models._base import TEXT_TOKEN, Shape

    cfg = HFConfig("<tiny>", TINY)
    assert sample_shape(cfg, Sample(images=2, height=224, width=224, text_tokens=64), 3).images == 0
    real, fake = decoders.FAMILY.inputs(cfg, None, Shape(3, 2, 224, 224, 64), torch.bfloat16)  # type: ignore[arg-type]
    assert set(real) == {"input_ids"} and fake == {}
    assert real["input_ids"].shape == (3, 64) and bool((real["input_ids"] == TEXT_TOKEN).all())


@pytest.mark.parametrize(
    ("setup", "steps", "message"),
    [
        (TrainSetup(sharding="zero3", world_size=8), 1, "sharding='zero3' is DeepSpeed's and is not measured"),
        (TrainSetup(optimizer="none"), 1, "optimizer='none' is not measured"),
        (TrainSetup(), 3, "steps should be 1 or 2, but got steps=3"),
        (TrainSetup(sharding="ddp", world_size=8), 2, "DDP is measured over one step"),
    ],
)
def test_profile_hf_refuses_what_it_cannot_measure(setup: TrainSetup, steps: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        profile_hf(HFConfig("<tiny>", TINY), Sample(text_tokens=64), 1, setup, steps=steps)


def test_profile_hf_unknown_model_type_names_the_supported_ones(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ConfigError, match=r"model_type 'mamba' is not supported.*qwen2_vl"):
        profile_hf(tmp_path, Sample(text_tokens=64))


# a Qwen2-VL whose config.json declares fp32, as PaliGemma's does: transformers hands the top-level
# torch_dtype to text_config, and builds the language model in it (NOTE [ The build dtype ])
SMALL = Sample(images=1, height=56, width=56, text_tokens=8)  # weights dominate the peak


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.slow
def test_profile_hf_config_declaring_float32_builds_in_bf16_unless_asked(key: str) -> None:
    cfg = HFConfig("<tiny-fp32>", {**TINY_VL, key: "float32"})
    default = profile_hf(cfg, SMALL, steps=2)
    # every parameter in bf16: the tracker's parameter bytes are 2 a parameter (old: a mixed build)
    assert default.dtype == "bf16" and default.breakdown["Parameter"] == 2 * default.params_total
    assert default.notes[0].startswith("built in bf16: --precision not given")
    assert f"config.json declares {key}=float32" in default.notes[0]
    fp32 = profile_hf(cfg, SMALL, steps=2, precision="fp32")
    assert fp32.dtype == "fp32" and fp32.breakdown["Parameter"] == 4 * fp32.params_total
    assert fp32.notes[0] == "built in fp32 as --precision asks" and fp32.params_total == default.params_total
    assert default.peak_bytes == pytest.approx(fp32.peak_bytes / 2, rel=0.01)  # pixels, states, logits: all half
    bf16 = profile_hf(cfg, SMALL, steps=2, precision="bf16")
    assert bf16.dtype == "bf16" and bf16.peak_bytes == default.peak_bytes
    assert bf16.notes[0] == f"built in bf16 as --precision asks; config.json declares {key}=float32"


def test_profile_hf_asserts_every_parameter_is_in_the_reported_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    apply = hf_profile.apply_training

    def one_fp32(model: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.float())  # type: ignore[union-attr]
        return apply(model, *args, **kwargs)

    monkeypatch.setattr(hf_profile, "apply_training", one_fp32)
    with pytest.raises(AssertionError, match=r"built qwen2 in bf16, but parameter lm_head.weight is torch.float32"):
        profile_hf(HFConfig("<tiny>", TINY), Sample(text_tokens=8))


def test_profile_hf_refuses_amp() -> None:
    with pytest.raises(ConfigError, match=r"precision should be one of \['bf16', 'fp32'\].*precision='amp'"):
        profile_hf(HFConfig("<tiny>", TINY), Sample(text_tokens=8), precision="amp")
