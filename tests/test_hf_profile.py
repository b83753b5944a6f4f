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

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_profile import profile_hf
from tokenbucket.cost.staged import Sample, TrainSetup
from tokenbucket.tokens._hf_json import HFConfig

FIXTURE = Path(__file__).parent / "data" / "hf_truth.json"
PREPROCESSORS = {"smolvlm-256m": {"do_resize": False, "max_image_size": {"longest_edge": 512}}}
TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip


def _point(arch: str, train: str, sharding: str) -> dict[str, Any]:
    data = json.loads(FIXTURE.read_text())
    for p in data["points"]:
        if (p["arch"], p["train"], p["sharding"], p["steps"], p["batch"]) == (arch, train, sharding, 1, 1):
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
    setup = TrainSetup(train=train, sharding="fsdp" if sharding == "fsdp8" else "none", world_size=p["world"])
    sample = Sample(images=p["images"], height=p["height"], width=p["width"], text_tokens=p["text_tokens"])
    run = profile_hf(cfg, sample, p["batch"], setup)
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


@pytest.mark.parametrize(
    ("setup", "steps", "message"),
    [
        (TrainSetup(sharding="zero3", world_size=8), 1, "sharding='zero3' is DeepSpeed's and is not measured"),
        (TrainSetup(backbone_checkpointing="full"), 1, "activation checkpointing is not measured yet"),
        (TrainSetup(optimizer="sgd"), 1, "optimizer='sgd' is not measured yet"),
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
