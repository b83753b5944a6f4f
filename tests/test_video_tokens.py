"""Video clips against the pinned transformers' own video processors (NOTE [ Qwen video clips ],
NOTE [ LLaVA-OneVision video clips ], NOTE [ SmolVLM video clips ]).

For every family with a video path, ``clip_inputs`` (tower passes, patches per pass, LLM tokens
of the whole clip) must equal what the video processor makes of a clip of zeros over a grid of
frame counts, frame sizes, clip frame rates and processor configs, and raise a one-line
:class:`ConfigError` wherever the processor raises. The breakdown (scalar and vectorised) must
sum the same counts over a table of rows with several cameras. The oracle is
tests/video_oracle/oracle.py, run in a subprocess: transformers' video processors need
torchvision, which this environment cannot load beside its torch, so the oracle runs on a
stand-in that must never reach this process (NOTE [ The torchvision stand-in ]).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tokenbucket import models
from tokenbucket._exceptions import ConfigError
from tokenbucket.models import VisionInputs
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.tokens.breakdown import breakdown_sample, breakdown_table
from tokenbucket.tokens.hf import token_spec_from_hf, vision_inputs

pytest.importorskip("transformers")

ORACLE = Path(__file__).resolve().parent / "video_oracle"
FRAMES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64)
FEW_FRAMES = (2, 3, 8, 17, 33, 64)
# (height, width): tiny (the processors scale it up), square, camera sizes, odd, portrait, large
SIZES = ((10, 300), (28, 28), (60, 100), (224, 224), (240, 320), (333, 517), (448, 448), (480, 640), (640, 360),
         (720, 1280), (1080, 1920))  # fmt: skip
BUDGET = 4_200_000  # the oracle's time: clips of more pixels (frames x height x width) only up to 4 frames
RATES = (None, 2, 8, 30)
# Qwen2.5-VL-7B-Instruct's preprocessor_config.json: it has no video_preprocessor_config.json, so
# its Qwen2VLVideoProcessor reads these (per-frame bounds of 4 to 16384 merged patches)
QWEN2_5_VL_PUBLISHED = {
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
}  # fmt: skip
# SmolVLM2-256M's tower (512 px, 16-px patches, pixel shuffle 4: 64 tokens a frame)
SMOLVLM2 = {"model_type": "smolvlm", "scale_factor": 4, "vision_config": {"image_size": 512, "patch_size": 16}}
SMOLVLM2_VIDEO = {"max_image_size": {"longest_edge": 512}, "size": {"longest_edge": 2048},
                  "video_sampling": {"fps": 1, "max_frames": 64, "video_size": {"longest_edge": 2048}}}  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One clip for the oracle, the config tokenbucket reads, and how to read the oracle's answer."""

    cfg: HFConfig
    processor: str
    kwargs: dict[str, Any]
    frames: int
    height: int
    width: int
    fps: float | None
    read: Callable[[dict[str, Any]], VisionInputs]
    tokens: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        out = {"processor": self.processor, "kwargs": self.kwargs, "frames": self.frames, "height": self.height,
               "width": self.width, "fps": self.fps}  # fmt: skip
        return {**out, "tokens": self.tokens} if self.tokens else out


def oracle(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What transformers makes of each case: one subprocess for all of them, with the
    torchvision stand-in on its path alone (NOTE [ The torchvision stand-in ])."""
    env = {**os.environ, "PYTHONPATH": str(ORACLE)}
    done = subprocess.run(
        [sys.executable, str(ORACLE / "oracle.py")], input=json.dumps(payloads), capture_output=True, text=True,
        env=env, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout)
    assert len(results) == len(payloads)
    return results


def compare(cases: list[Case]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Cases where ``clip_inputs`` differs from the processor (or raises where it does not, or
    does not raise a one-line ConfigError where it does), and the oracle's answers."""
    results = oracle([c.payload() for c in cases])
    bad = []
    for case, result in zip(cases, results, strict=True):
        ours: VisionInputs | ConfigError
        try:
            ours = models.of(case.cfg).clip_inputs(case.cfg, case.frames, case.height, case.width, case.fps)
        except ConfigError as exc:
            ours = exc
        if "error" in result:
            ok = isinstance(ours, ConfigError) and "\n" not in str(ours)
        else:
            ok = ours == case.read(result)
        if not ok:
            bad.append((case.cfg.config["model_type"], case.kwargs, case.frames, case.height, case.width, case.fps,
                        ours, result))  # fmt: skip
    return bad, results


def grid(
    frames: Iterable[int] = FRAMES, rates: Iterable[float | None] = (None,), sizes: Iterable[tuple[int, int]] = SIZES
) -> list[tuple[Any, ...]]:
    """(frames, height, width, fps) over the grid, large frames in clips within ``BUDGET`` pixels
    (1080 x 1920: up to 4 frames; 480 x 640: up to 13)."""
    return [
        (f, h, w, fps)
        for f in frames for h, w in sizes for fps in rates
        if f * h * w <= BUDGET or f <= 4
    ]  # fmt: skip


# -- Qwen2-VL / Qwen2.5-VL / Qwen3-VL -----------------------------------------------------------


def _qwen_read(result: dict[str, Any]) -> VisionInputs:
    t, rows, cols = result["grid"]
    return VisionInputs(t, rows * cols, t * rows * cols // 4)


def _qwen(model_type: str, kwargs: dict[str, Any], points: list[tuple[Any, ...]], *, video: bool = True) -> list[Case]:
    processor = "Qwen3VLVideoProcessor" if model_type == "qwen3_vl" else "Qwen2VLVideoProcessor"
    # video: a video_preprocessor_config.json; else the table is preprocessor_config.json
    cfg = HFConfig(f"<{model_type}>", {"model_type": model_type}, {} if video else kwargs, kwargs if video else None)
    return [Case(cfg, processor, kwargs, f, h, w, fps, _qwen_read) for f, h, w, fps in points]


QWEN2_CONFIGS: list[tuple[str, dict[str, Any], list[tuple[Any, ...]]]] = [
    ("qwen2_vl", {}, grid()),  # the class defaults: no sampling, 128..768 merged patches a frame
    ("qwen2_vl", {"cap_pixels_per_frame": False}, grid(FEW_FRAMES, (30,))),
    ("qwen2_vl", {"min_pixels": 200704, "max_pixels": 401408}, grid(FEW_FRAMES)),
    ("qwen2_vl", {"size": {"shortest_edge": 3136, "longest_edge": 250880}}, grid(FEW_FRAMES)),
    ("qwen2_vl", {"size": {"shortest_edge": 3136, "longest_edge": 250880}, "max_pixels": 100352}, grid((5, 64))),
    ("qwen2_vl", {"cap_pixels_per_frame": True, "max_video_tokens": 4096}, grid(FEW_FRAMES)),
    ("qwen2_vl", {"cap_pixels_per_frame": True}, grid((2, 64))),
    ("qwen2_vl", {"do_sample_frames": True, "fps": 2}, grid(FRAMES, RATES, SIZES[::3])),
    ("qwen2_vl", {"do_sample_frames": True, "fps": 4, "min_frames": 6, "max_frames": 20},
     grid(FEW_FRAMES, RATES, SIZES[1::3])),
    ("qwen2_vl", {"do_sample_frames": True, "num_frames": 8}, grid(FRAMES[::2], (None,), SIZES[::2])),
    ("qwen2_vl", {"do_sample_frames": False, "num_frames": 8, "fps": 2}, grid((3, 16))),  # not sampling: unread
]  # fmt: skip


@pytest.mark.slow  # the oracle: a subprocess that imports transformers (~7 s) and runs it
def test_video_tokens_qwen2_vl_and_qwen2_5_vl_equal_the_video_processor() -> None:
    cases = [case for model_type, kwargs, points in QWEN2_CONFIGS for case in _qwen(model_type, kwargs, points)]
    # Qwen2.5-VL's published checkpoint: its video processor reads preprocessor_config.json
    cases += _qwen("qwen2_5_vl", QWEN2_5_VL_PUBLISHED, grid((2, 3, 9, 16)), video=False)
    bad, results = compare(cases)
    assert bad == []
    assert len(cases) >= 650, len(cases)
    assert sum("error" in r for r in results) >= 20  # impossible sampling, tiny/long frames compared as errors too


QWEN3_CONFIGS: list[tuple[dict[str, Any], list[tuple[Any, ...]]]] = [
    ({}, grid(FRAMES) + grid(FRAMES, RATES[1:], SIZES[::3])),  # the class defaults: 2 fps (24 assumed), clip-wide bounds
    ({"cap_pixels_per_frame": True}, grid(FEW_FRAMES, (None, 30))),
    ({"cap_pixels_per_frame": True, "max_video_tokens": 64, "fps": 8}, grid(FEW_FRAMES, (30,))),
    # Qwen3-VL-8B-Instruct's video_preprocessor_config.json bounds
    ({"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
      "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}, grid(FEW_FRAMES, (None, 8))),
    ({"do_sample_frames": False}, grid(FRAMES[::2])),
    ({"do_sample_frames": False, "min_pixels": 4096, "max_pixels": 10**6}, grid((2, 9))),  # keys it does not read
    ({"num_frames": 8, "fps": None}, grid(FEW_FRAMES)),
    ({"fps": 1, "min_frames": 2, "max_frames": 12}, grid(FEW_FRAMES, (8, 30))),
]  # fmt: skip


@pytest.mark.slow  # the oracle: a subprocess that imports transformers (~7 s) and runs it
def test_video_tokens_qwen3_vl_equal_the_video_processor() -> None:
    cases = [case for kwargs, points in QWEN3_CONFIGS for case in _qwen("qwen3_vl", kwargs, points)]
    bad, results = compare(cases)
    assert bad == []
    assert len(cases) >= 700, len(cases)
    assert sum("error" in r for r in results) >= 20  # a clip that samples to one frame, long frames


# -- LLaVA-OneVision -----------------------------------------------------------------------------


def _onevision_read(patch: int, class_token: bool) -> Callable[[dict[str, Any]], VisionInputs]:
    def read(result: dict[str, Any]) -> VisionInputs:
        _, frames, _, height, width = result["pixels"]
        # the count the processor writes, its own counting helper and the model's pooling agree
        tokens = result["tokens"] if result["tokens"] == result["helper"] == result["model"] else -1
        return VisionInputs(frames, (height // patch) * (width // patch) + class_token, tokens)

    return read


def _onevision(
    tower: dict[str, Any], video: dict[str, Any], points: list[tuple[Any, ...]], **config: Any
) -> list[Case]:
    side, patch = tower["image_size"], tower["patch_size"]
    cfg = HFConfig("<ov>", {"model_type": "llava_onevision", "vision_config": tower, **config}, {}, video)
    tokens = {"num_image_tokens": (side // patch) ** 2, "image_size": side, "patch_size": patch}
    read = _onevision_read(patch, tower.get("model_type") == "clip_vision_model")
    return [Case(cfg, "LlavaOnevisionVideoProcessor", video, f, h, w, fps, read, tokens) for f, h, w, fps in points]


SIGLIP_384 = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304, "patch_size": 14,
              "image_size": 384, "num_hidden_layers": 26, "num_attention_heads": 16, "vision_use_head": False}  # fmt: skip


def _square(side: int) -> dict[str, Any]:
    return {"size": {"height": side, "width": side}}


@pytest.mark.slow  # the oracle: a subprocess that imports transformers (~7 s) and runs it
def test_video_tokens_llava_onevision_equal_the_processor_and_the_model_pooling() -> None:
    cases = _onevision(SIGLIP_384, {}, grid())  # the class defaults: every frame at 384 x 384
    cases += _onevision(SIGLIP_384, {"do_sample_frames": True, "fps": 1}, grid(FRAMES, RATES, SIZES[::4]))
    cases += _onevision(SIGLIP_384, {"do_sample_frames": True, "num_frames": 8}, grid(FEW_FRAMES, (None,), SIZES[::4]))
    cases += _onevision(SIGLIP_384, {"size": {"height": 400, "width": 400}, "do_center_crop": True,
                                     "crop_size": {"height": 384, "width": 384}}, grid((2, 9), (None,), SIZES[::2]))  # fmt: skip
    cases += _onevision(SIGLIP_384, {"do_resize": False}, grid((2, 5), (None, 30), SIZES[::3]))  # frames as they come
    # other towers: the pooling's ceil(grid / 2) a side (24 -> 12, 26 -> 13, 32 -> 16, 14 -> 7)
    clip_336 = {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}
    cases += _onevision(clip_336, _square(336), grid(FEW_FRAMES), vision_feature_select_strategy="default")
    for side, patch in ((364, 14), (448, 14), (224, 16)):
        tower = {**SIGLIP_384, "image_size": side, "patch_size": patch}
        cases += _onevision(tower, _square(side), grid((2, 5, 16), (None,), SIZES[::2]))
    bad, results = compare(cases)
    assert bad == []
    assert len(cases) >= 400, len(cases)
    assert {r["tokens"] for r in results if "tokens" in r} >= {2 * 196 + 1, 64 * 196 + 1, 2 * 144 + 1, 2 * 49 + 1}


# -- SmolVLM2 ------------------------------------------------------------------------------------


def _smolvlm_read(patch: int) -> Callable[[dict[str, Any]], VisionInputs]:
    def read(result: dict[str, Any]) -> VisionInputs:
        _, frames, _, height, width = result["pixels"]
        return VisionInputs(frames, (height // patch) * (width // patch), result["tokens"])

    return read


def _smolvlm(
    config: dict[str, Any], video: dict[str, Any], points: list[tuple[Any, ...]], pre: dict[str, Any] | None = None
) -> list[Case]:
    cfg = HFConfig("<smolvlm>", config, pre or {}, video)
    tower = config["vision_config"]
    tokens = {"image_seq_len": (tower["image_size"] // tower["patch_size"]) ** 2 // config["scale_factor"] ** 2}
    read = _smolvlm_read(tower["patch_size"])
    return [Case(cfg, "SmolVLMVideoProcessor", video, f, h, w, fps, read, tokens) for f, h, w, fps in points]


@pytest.mark.slow  # the oracle: a subprocess that imports transformers (~7 s) and runs it
def test_video_tokens_smolvlm_equal_the_processor() -> None:
    cases = _smolvlm(SMOLVLM2, SMOLVLM2_VIDEO, grid())  # the class default: every frame, one 512 x 512 image each
    sample = {**SMOLVLM2_VIDEO, "do_sample_frames": True}
    cases += _smolvlm(SMOLVLM2, sample, grid(FRAMES, RATES, SIZES[::4]))
    # long clips: a second skipped at each end, and repeats dropped when fps asks for more than there is
    long = grid((48, 100, 150, 301), (2, 8, 30), ((28, 28), (60, 100)))
    cases += _smolvlm(SMOLVLM2, {**sample, "video_sampling": {"fps": 1, "max_frames": 8}}, long)
    cases += _smolvlm(SMOLVLM2, {**sample, "video_sampling": {"fps": 4, "max_frames": 64}}, long)
    cases += _smolvlm(SMOLVLM2, {"do_sample_frames": True, "fps": 2, "num_frames": 16, "max_image_size":
                                 {"longest_edge": 512}}, grid(FEW_FRAMES, (8, 30), SIZES[::4]))  # fmt: skip
    # SmolVLM2-2.2B's tower: 384 px, 14-px patches, pixel shuffle 3 (81 tokens a frame)
    big = {"model_type": "smolvlm", "scale_factor": 3, "vision_config": {"image_size": 384, "patch_size": 14}}
    cases += _smolvlm(big, {**SMOLVLM2_VIDEO, "max_image_size": {"longest_edge": 384}}, grid(FEW_FRAMES))
    cases += _smolvlm(SMOLVLM2, {**SMOLVLM2_VIDEO, "do_resize": False}, grid((2, 7), (None,), SIZES[2::3]))
    # the first resize's size in its forms, and a video_sampling without video_size (transformers fails)
    for odd in ({"size": 512}, {"size": {"height": 300, "width": 500}}, {"size": {"shortest_edge": 512}},
                {"video_sampling": {"fps": 1, "max_frames": 8}},
                {"video_sampling": {"fps": 1, "max_frames": 8}, "size": {"longest_edge": 1024}}):  # fmt: skip
        cases += _smolvlm(
            SMOLVLM2, {"max_image_size": {"longest_edge": 512}, **odd}, grid((2, 9), RATES[::3], SIZES[2::4])
        )
    bad, results = compare(cases)
    assert bad == []
    assert len(cases) >= 400, len(cases)
    assert {r["tokens"] for r in results if "tokens" in r} >= {2 * 64, 64 * 64, 2 * 81}


# -- the breakdown: rows of several cameras --------------------------------------------------------

ROWS = [
    [("head", 16, 480, 640), ("wrist", 9, 224, 224), ("side", 1, 360, 640)],
    [("head", 2, 720, 1280), ("wrist", 33, 240, 320)],
    [("head", 64, 224, 224)],
    [("wrist", 5, 448, 448), ("head", 3, 1080, 1920), ("side", 17, 333, 517)],
    [("wrist", 1, 480, 640), ("head", 7, 60, 100)],
]
SMOLVLM2_PRE = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}
BREAKDOWN_CONFIGS: dict[str, tuple[HFConfig, str, dict[str, Any], dict[str, Any]]] = {
    # name: (config, video processor, its kwargs, the oracle's token spec)
    "qwen2_vl": (HFConfig("<q2>", {"model_type": "qwen2_vl"}), "Qwen2VLVideoProcessor", {}, {}),
    "qwen2_5_vl": (HFConfig("<q25>", {"model_type": "qwen2_5_vl"}, QWEN2_5_VL_PUBLISHED), "Qwen2VLVideoProcessor",
                   QWEN2_5_VL_PUBLISHED, {}),
    "qwen3_vl": (HFConfig("<q3>", {"model_type": "qwen3_vl"}), "Qwen3VLVideoProcessor", {}, {}),
    "llava_onevision": (HFConfig("<ov>", {"model_type": "llava_onevision"}), "LlavaOnevisionVideoProcessor", {},
                        {"num_image_tokens": 729, "image_size": 384, "patch_size": 14}),
    "smolvlm": (HFConfig("<s>", SMOLVLM2, SMOLVLM2_PRE, SMOLVLM2_VIDEO), "SmolVLMVideoProcessor", SMOLVLM2_VIDEO,
                {"image_seq_len": 64}),
}  # fmt: skip


def _clip_tokens(result: dict[str, Any]) -> int:
    if "grid" in result:
        return int(result["grid"][0] * result["grid"][1] * result["grid"][2] // 4)
    return int(result["tokens"])


@pytest.mark.slow  # the oracle: a subprocess that imports transformers (~7 s) and runs it
def test_video_tokens_breakdown_sums_the_processor_counts_of_each_camera() -> None:
    clips = sorted({cam[1:] for row in ROWS for cam in row if cam[1] > 1})
    payloads = [
        {"processor": proc, "kwargs": kwargs, "frames": f, "height": h, "width": w, "fps": None, "tokens": tokens}
        for _, proc, kwargs, tokens in BREAKDOWN_CONFIGS.values() for f, h, w in clips
    ]  # fmt: skip
    results = iter(oracle(payloads))
    table = pa.table({"key": [f"r{i}" for i in range(len(ROWS))],
                      "cameras": [[{"name": n, "frames": f, "height": h, "width": w} for n, f, h, w in row]
                                  for row in ROWS]})  # fmt: skip
    flat = pa.table({"key": [f"c{i}" for i in range(len(clips))], "cameras": [2] * len(clips), "frames": [c[0] for c in clips], "height": [c[1] for c in clips],
                     "width": [c[2] for c in clips]})  # fmt: skip
    for name, (cfg, *_) in BREAKDOWN_CONFIGS.items():
        clip = {c: _clip_tokens(next(results)) for c in clips}

        def image(h: int, w: int, images: int, cfg: HFConfig = cfg) -> int:
            # one of the sample's images (NOTE [ Images of a sample ]: OneVision tiles a lone one only)
            return vision_inputs(cfg, h, w, images).llm_tokens

        # feed="video" (the default), stills=("wrist",), feed="images": each camera as the processors
        # count it; its images: every frame of a camera not fed as a clip (a clip is a video)
        stills = {
            "video": [sum(f for _, f, *_ in row if f == 1) for row in ROWS],
            "stills": [sum(f for n, f, *_ in row if f == 1 or n == "wrist") for row in ROWS],
            "images": [sum(f for _, f, *_ in row) for row in ROWS],
        }
        expected = {
            "video": [sum(clip[(f, h, w)] if f > 1 else image(h, w, k) for _, f, h, w in row)
                      for row, k in zip(ROWS, stills["video"], strict=True)],
            "stills": [sum(clip[(f, h, w)] if f > 1 and n != "wrist" else f * image(h, w, k) for n, f, h, w in row)
                       for row, k in zip(ROWS, stills["stills"], strict=True)],
            "images": [sum(f * image(h, w, k) for _, f, h, w in row) for row, k in zip(ROWS, stills["images"], strict=True)],
        }  # fmt: skip
        specs = {"video": token_spec_from_hf(cfg), "stills": token_spec_from_hf(cfg, stills=("wrist",)),
                 "images": token_spec_from_hf(cfg, feed="images")}  # fmt: skip
        for feed, spec in specs.items():
            rows = [{"key": f"r{i}", "cameras": table.column("cameras")[i].as_py()} for i in range(len(ROWS))]
            scalar = [breakdown_sample(row, spec).vision for row in rows]
            out = breakdown_table(table, spec)
            assert out.rejected.num_rows == 0, (name, feed)
            vectorised = out.table.column("vision").to_pylist()
            assert scalar == vectorised == expected[feed], (name, feed)
        # the flat schema: two cameras of one clip each
        vectorised = breakdown_table(flat, specs["video"]).table.column("vision").to_pylist()
        assert vectorised == [2 * clip[c] for c in clips], name
        assert [breakdown_sample(dict(zip(flat.column_names, r, strict=True)), specs["video"]).vision
                for r in zip(*flat.to_pydict().values(), strict=True)] == vectorised, name  # fmt: skip
    assert next(results, None) is None


# -- errors: where transformers raises, a one-line ConfigError -------------------------------------

ERRORS: list[tuple[str, dict[str, Any], tuple[int, int, int, float | None], str]] = [
    ("qwen3_vl", {}, (1, 448, 448, None), r"needs at least 2 frames \(its temporal patch\), but got frames=1$"),
    ("qwen3_vl", {"num_frames": 8}, (16, 448, 448, None), r"fps and num_frames are mutually exclusive"),
    ("qwen2_vl", {"do_sample_frames": True, "fps": 2}, (16, 448, 448, None), r"needs each clip's own fps"),
    ("qwen2_vl", {"do_sample_frames": True}, (16, 448, 448, 30), r"do_sample_frames needs fps or num_frames"),
    ("qwen2_vl", {"do_sample_frames": True, "num_frames": 40}, (16, 448, 448, None),
     r"a clip of 16 frames cannot be sampled to 40 frames"),
    ("qwen2_vl", {"do_sample_frames": True, "num_frames": 1}, (16, 448, 448, None), r"cannot be sampled to 0 frames"),
    ("qwen2_vl", {}, (4, 10, 3000, None), r"a video frame of 10x3000 has an aspect ratio past 200"),
    ("qwen2_vl", {"size": {"longest_edge": 10**6}}, (4, 448, 448, None),
     r"size should hold shortest_edge and longest_edge"),
    ("llava_onevision", {"do_sample_frames": True, "num_frames": 20}, (16, 448, 448, None),
     r"a clip of 16 frames cannot be sampled to 20 frames"),
    ("llava_onevision", {"do_sample_frames": True, "fps": 1}, (16, 448, 448, None), r"needs each clip's own fps"),
    ("smolvlm", {**SMOLVLM2_VIDEO, "do_sample_frames": True}, (16, 448, 448, None), r"needs each clip's own fps"),
]  # fmt: skip
PROCESSORS = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen3_vl": "Qwen3VLVideoProcessor",
              "llava_onevision": "LlavaOnevisionVideoProcessor", "smolvlm": "SmolVLMVideoProcessor"}  # fmt: skip


@pytest.mark.slow  # the oracle: a subprocess that imports transformers (~7 s) and runs it
def test_video_tokens_where_the_processor_raises_a_one_line_config_error() -> None:
    payloads = [{"processor": PROCESSORS[mt], "kwargs": kwargs, "frames": f, "height": h, "width": w, "fps": fps}
                for mt, kwargs, (f, h, w, fps), _ in ERRORS]  # fmt: skip
    for (mt, kwargs, (f, h, w, fps), message), result in zip(ERRORS, oracle(payloads), strict=True):
        assert "error" in result, (mt, kwargs, result)
        config = SMOLVLM2 if mt == "smolvlm" else {"model_type": mt}
        cfg = HFConfig(f"<{mt}>", config, {}, kwargs)
        with pytest.raises(ConfigError, match=message) as info:
            models.of(cfg).clip_inputs(cfg, f, h, w, fps)
        assert "\n" not in str(info.value)


def test_video_tokens_oracle_stays_out_of_this_process() -> None:
    # NOTE [ The torchvision stand-in ]: never collected, never on this process's path
    assert importlib.util.find_spec("torchvision") is None
    assert "oracle" not in sys.modules and not any(Path(p).resolve() == ORACLE for p in sys.path if p)


def test_video_tokens_families_with_a_video_path() -> None:
    with_video = {mt for mt in models.SUPPORTED_MODEL_TYPES if models.family(mt).has_video}
    assert with_video == {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava_onevision", "smolvlm"}
    assert token_spec_from_hf(HFConfig("<i>", {"model_type": "idefics3"})).feed == "images"  # Idefics3 has none
    assert token_spec_from_hf(HFConfig("<s>", SMOLVLM2, SMOLVLM2_PRE, SMOLVLM2_VIDEO)).feed == "video"


def test_video_tokens_refuses_a_frame_size_the_onevision_pooling_cannot_view() -> None:
    # the processor makes these frames; the model's pooling views only the tower's square
    for video in ({"size": {"shortest_edge": 384}}, {"do_center_crop": True, "crop_size": {"shortest_edge": 384}}):
        cfg = HFConfig("<ov>", {"model_type": "llava_onevision"}, {}, video)
        with pytest.raises(ConfigError, match=r"should be \{'height': \.\.\., 'width': \.\.\.\} \(the tower's square"):
            token_spec_from_hf(cfg)
