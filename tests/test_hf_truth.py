"""The measured truth set (tests/data/hf_truth.json): coverage, token counts, and re-measured points.

The fixture comes from ``benchmarks/hf_truth.py`` (real transformers models on fake tensors);
fake measurement is deterministic, so a re-measured point equals its stored record exactly.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks import hf_truth

FIXTURE = Path(__file__).parent / "data" / "hf_truth.json"
VOLATILE = ("seconds", "versions")


def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def _stored(arch: str, train: str, sharding: str, index: int, steps: int = 1, **axes: str) -> dict[str, Any]:
    fields = hf_truth.shape_record(arch, hf_truth.SHAPES[arch][index])
    want = {**hf_truth.axes_of({}), **axes}
    for point in _data()["points"]:
        if (
            (point["arch"], point["train"], point["sharding"], point["steps"]) == (arch, train, sharding, steps)
            and all(point[k] == v for k, v in fields.items())
            and hf_truth.axes_of(point) == want
        ):
            return dict(point)
    raise AssertionError(f"no stored point {arch}/{train}/{sharding}/{fields}/steps={steps}/{axes}")


def test_hf_truth_fixture_covers_every_arch_and_setup() -> None:
    # every arch x (train, sharding) has >= 3 shapes, or the fixture says why it has fewer
    data = _data()
    shapes: dict[tuple[str, str, str], set[tuple[int, ...]]] = defaultdict(set)
    for p in data["points"]:
        shapes[p["arch"], p["train"], p["sharding"]].add(
            (p["batch"], p["images"], p["height"], p["width"], p["text_tokens"])
        )
    failed = {tag.rsplit("/", 1)[0] for tag in data["failures"]}
    missing = []
    for arch in hf_truth.ARCHS:
        for train, sharding in hf_truth.setups(arch):
            if len(shapes[arch, train, sharding]) < 3 and f"{arch}/{train}/{sharding}" not in failed:
                missing.append(f"{arch}/{train}/{sharding}")
    assert not missing, missing
    assert {p["arch"] for p in data["points"]} == set(data["configs"])
    # plain decoders never carry a frozen-vision setup
    assert not any(p["train"] == "frozen-vision" and p["images"] == p.get("videos", 0) == 0 for p in data["points"])


def test_hf_truth_fixture_tokens_add_up() -> None:
    # image tokens + text tokens = the input_ids length, counted the way each processor counts
    for p in _data()["points"]:
        assert p["image_tokens"] + p.get("video_tokens", 0) + p["text_tokens"] == p["seq_len"], p
        if p.get("videos"):  # a video point: its clips' tokens, counted from the video processors' rules
            shape = (p["batch"], p["videos"], p["frames"], p["height"], p["width"], p["text_tokens"], p["fps"])
            assert hf_truth.video_record(p["arch"], shape)["video_tokens"] == p["video_tokens"]
        else:
            shape = (p["batch"], p["images"], p["height"], p["width"], p["text_tokens"])
            assert hf_truth.shape_record(p["arch"], shape)["image_tokens"] == p["image_tokens"]
        assert p["peak_bytes"] > 0 and p["params_trainable"] <= p["params_total"]
        assert (p["world"] == 8) == (p["sharding"] in ("fsdp8", "ddp8"))


def test_hf_truth_image_tokens_match_processors() -> None:
    # Qwen2-VL: (H/14)(W/14)/4 at multiples of 28; LLaVA-1.5: 576 at 336; PaliGemma: 256 at 224
    assert hf_truth.shape_record("qwen2-vl-2b", (1, 1, 448, 448, 10))["image_tokens"] == 256
    assert hf_truth.shape_record("qwen2-vl-2b", (1, 2, 224, 224, 10))["image_tokens"] == 128
    assert hf_truth.shape_record("llava-1.5-7b", (1, 1, 336, 336, 10))["image_tokens"] == 576
    assert hf_truth.shape_record("paligemma-3b", (1, 4, 224, 224, 10))["image_tokens"] == 1024
    # Qwen3-VL: 16-px patches merged 2x2, at least 65,536 pixels (224 px is upscaled to 256)
    assert hf_truth.shape_record("qwen3-vl-2b", (1, 1, 512, 512, 10))["image_tokens"] == 256
    assert hf_truth.shape_record("qwen3-vl-2b", (1, 1, 224, 224, 10))["image_tokens"] == 64
    real, _ = hf_truth._real_inputs(
        "qwen2-vl-2b", hf_truth.build_config("qwen2-vl-2b"), hf_truth.shape_record("qwen2-vl-2b", (2, 2, 448, 448, 64))
    )
    assert tuple(real["input_ids"].shape) == (2, 512 + 64)
    assert int((real["input_ids"] == 151655).sum()) == 2 * 512


def test_hf_truth_video_tokens_match_the_video_processors() -> None:
    # Qwen2-VL: 16 frames at 448 px, 8 temporal groups of 32 x 32 patches (Qwen2VLVideoProcessor's sizes)
    assert hf_truth.video_record("qwen2-vl-2b", (1, 1, 16, 448, 448, 8, 2.0))["video_tokens"] == 8 * 256
    # a 224 px frame is upscaled to 336 (at least 128 merged patches a frame)
    assert hf_truth.video_record("qwen2.5-vl-3b", (1, 2, 4, 224, 224, 8, 2.0))["video_tokens"] == 2 * 2 * 144
    # Qwen3-VL keeps 2 frames a second (every frame at 2 fps, 4 of 48 at 24 fps) at 16-px patches
    assert hf_truth.video_record("qwen3-vl-2b", (1, 1, 16, 448, 448, 8, 2.0))["video_tokens"] == 8 * 196
    assert hf_truth.video_record("qwen3-vl-2b", (1, 1, 48, 448, 448, 8, 24.0))["video_tokens"] == 2 * 196
    config = hf_truth.build_config("qwen3-vl-2b")
    real, fake = hf_truth._real_inputs(
        "qwen3-vl-2b", config, hf_truth.video_record("qwen3-vl-2b", (2, 1, 4, 224, 224, 8, 2.0))
    )
    ids = real["input_ids"][0].tolist()  # each temporal group after its own timestamp and vision start token
    group = [100, config.vision_start_token_id, *[config.video_token_id] * 49, config.vision_end_token_id]
    assert ids == group * 2 + [100] * 2 and real["video_grid_thw"].tolist() == [[2, 14, 14]] * 2
    assert fake["pixel_values_videos"][0] == (2 * 2 * 14 * 14, 3 * 2 * 16 * 16)
    # LLaVA-OneVision: every frame 384 px, pooled to 14 x 14, and a newline a clip; SmolVLM2: 64 tokens a 512 px frame
    assert hf_truth.video_record("llava-onevision-0.5b", (1, 2, 16, 448, 448, 8, 2.0))["video_tokens"] == 2 * 3137
    assert hf_truth.video_record("smolvlm2-256m", (1, 2, 8, 336, 336, 8, 2.0))["video_tokens"] == 2 * 8 * 64
    ov = hf_truth.build_config("llava-onevision-0.5b")
    real, fake = hf_truth._real_inputs(
        "llava-onevision-0.5b", ov, hf_truth.video_record("llava-onevision-0.5b", (2, 2, 4, 224, 224, 8, 2.0))
    )
    assert fake == {"pixel_values_videos": ((4, 4, 3, 384, 384), torch.bfloat16)}
    assert real["input_ids"][0].tolist() == [ov.video_token_id] * 2 * 785 + [100] * 8
    smol = hf_truth.build_config("smolvlm2-256m")
    real, fake = hf_truth._real_inputs(
        "smolvlm2-256m", smol, hf_truth.video_record("smolvlm2-256m", (2, 2, 4, 224, 224, 8, 2.0))
    )
    assert real["pixel_values"].shape == (2, 8, 3, 512, 512) and fake["_pixels_held"][0] == (2, 8, 3, 512, 512)
    assert real["input_ids"][0].tolist() == [smol.image_token_id] * 8 * 64 + [100] * 8


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "train", "sharding"),
    [
        # qwen2-0.5b full / none is re-measured by test_profile_hf_equals_the_truth_set, and LoRA on
        # a decoder there by qwen2-vl-2b's and here by smolvlm's and gemma-2's
        ("qwen2-0.5b", "full", "fsdp8"),
        ("qwen2-0.5b", "full", "ddp8"),  # NOTE [ DDP on fake tensors ]
        ("smolvlm-256m", "lora", "none"),  # its pixels stay real (NOTE [ Real bookkeeping tensors ])
        ("qwen2.5-vl-3b", "frozen-vision", "none"),  # its window index is built on the host
        ("gemma-2-2b", "lora", "none"),  # NOTE [ Gemma 2 attention ]
    ],
)
def test_hf_truth_remeasure_equals_fixture(arch: str, train: str, sharding: str) -> None:
    stored = _stored(arch, train, sharding, 0)
    fresh = hf_truth.measure(arch, train, sharding, hf_truth.SHAPES[arch][0])
    for key in VOLATILE:
        stored.pop(key)
        fresh.pop(key)
    assert json.loads(json.dumps(fresh)) == stored


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "index", "axes"),
    [
        ("qwen2-0.5b", 0, {"loop": "held", "kernels": "cuda"}),  # the logits bound to the next step
        ("qwen2-0.5b", 0, {"optimizer": "sgd"}),
        ("smolvlm-256m", 0, {"checkpointing": "both"}),  # transformers' own, per stage
        ("paligemma-3b", 0, {"loop": "held", "kernels": "cuda"}),  # a prefix-LM mask: the efficient kernel
    ],
)
def test_hf_truth_step_shapes_remeasure_equal_fixture(arch: str, index: int, axes: dict[str, str]) -> None:
    stored = _stored(arch, "full", "none", index, 2, **axes)
    fresh = json.loads(json.dumps(hf_truth.measure(arch, "full", "none", hf_truth.SHAPES[arch][index], 2, **axes)))
    for key in VOLATILE:
        stored.pop(key)
        fresh.pop(key)
    # PaliGemma's steady-state peak moves by up to 11 KB of 29 GB between runs of the same point
    # (measured: 29,542,909,050 .. 29,542,922,266 B); every other field is exact
    peaks = ("peak_bytes", "storage_tracker_peak")
    for key in peaks:
        assert fresh.pop(key) == pytest.approx(stored.pop(key), abs=64 * 1024)
    for key in ("peak_breakdown", "phase_peaks", "storage_tracker_phase_peaks"):
        got, want = fresh.pop(key), stored.pop(key)
        assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], abs=64 * 1024) for k in want)
    assert fresh == stored


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "train"),
    [("qwen2.5-vl-3b", "frozen-vision"), ("qwen3-vl-2b", "lora"), ("llava-onevision-0.5b", "frozen-vision"),
     ("smolvlm2-256m", "lora")],
)  # fmt: skip
def test_hf_truth_video_remeasure_equals_fixture(arch: str, train: str) -> None:
    fields = hf_truth.video_record(arch, hf_truth.VIDEO_SHAPES[arch][2])
    stored = next(
        dict(p) for p in _data()["points"]
        if (p["arch"], p["train"], p["sharding"], p["steps"]) == (arch, train, "none", 1)
        and all(p.get(k) == v for k, v in fields.items())
    )  # fmt: skip
    fresh = json.loads(json.dumps(hf_truth.measure(arch, train, "none", fields)))
    for key in VOLATILE:
        stored.pop(key)
        fresh.pop(key)
    assert fresh == stored
