"""What transformers' own video processors make of a clip: the oracle of tests/test_video_tokens.py.

Run as a subprocess, never imported by the test process (NOTE [ The torchvision stand-in ])::

    PYTHONPATH=tests/video_oracle python tests/video_oracle/oracle.py < cases.json

stdin: a JSON list of cases, each ``{"processor": class name, "kwargs": {init kwargs: the
video_preprocessor_config.json table}, "frames": F, "height": H, "width": W, "fps": the clip's
own fps or null, "call": {call kwargs, e.g. do_sample_frames}}``, and for the processors whose
token count lives in the multimodal processor, ``"tokens": {...}`` (LLaVA-OneVision:
``num_image_tokens`` and the tower's ``image_size`` / ``patch_size``; SmolVLM: ``image_seq_len``).
stdout: a JSON list, one result per case: ``{"error": "ValueError: ..."}`` when transformers
raises, else ``"frames"`` (the frames the processor keeps), ``"grid"`` (``video_grid_thw``,
Qwen), ``"pixels"`` (the shape of the processed clip's pixels) and ``"tokens"`` (the video
placeholder tokens the processor class's own code writes; LLaVA-OneVision also gives
``"helper"``, its ``_get_num_multimodal_tokens``, and ``"model"``, the frames times what the
model's ``apply_pooling`` makes of one frame, plus its newline).

NOTE [ The torchvision stand-in ]
transformers 5's video processors import torchvision, and PyPI's torchvision wheel is a CUDA
build that cannot load beside the CPU torch this project pins, so tests/video_oracle/torchvision
is a stand-in: the few transforms.v2.functional calls the processors make (resize, crop, pad,
normalize, dtype) in plain torch. Every size (sampling, smart_resize, the frames padded to the
temporal patch, the grid) is still computed by transformers' own code; the stand-in's resize
hands back a frame of zeros of the size transformers asks for, of no memory, and the oracle
feeds clips of zeros (an expanded scalar) with the value-only steps off (do_rescale,
do_normalize; SmolVLM's do_pad, which pads nothing for one clip), so a 64-frame 1080p clip
costs only what transformers' own patchify copies. No count depends on a pixel value. The
stand-in must never be on the test process's sys.path (other tests check that torchvision is
absent), so the oracle runs in a subprocess with PYTHONPATH=tests/video_oracle, all of a test's
cases in one call. SmolVLM's processor writes each clip's "series of N frames" text with
num2words, which is not installed: the oracle hands it str(), which changes text only, never
the <image> count.
"""

from __future__ import annotations

import json
import sys
import warnings
from types import SimpleNamespace
from typing import Any


def _tokens(name: str, spec: dict[str, Any], out: Any, metadata: Any) -> dict[str, Any]:
    """The video placeholder tokens the multimodal processor writes, by its own code (no tokenizer)."""
    import torch
    from transformers.models.llava_onevision import modeling_llava_onevision as ov_model
    from transformers.models.llava_onevision import processing_llava_onevision as ov
    from transformers.models.smolvlm import processing_smolvlm as smol

    if name == "LlavaOnevisionVideoProcessor":
        proc = ov.LlavaOnevisionProcessor.__new__(ov.LlavaOnevisionProcessor)
        proc.num_image_tokens, proc.video_token = spec["num_image_tokens"], "<video>"
        frames, _, height, width = out["pixel_values_videos"][0].shape
        helper = proc._get_num_multimodal_tokens(video_sizes=[(frames, height, width)])["num_video_tokens"][0]
        written = proc.replace_video_token(out, 0).count("<video>")
        # the model's own pooling of one frame's features (its apply_pooling reads only the config)
        vision = SimpleNamespace(image_size=spec["image_size"], patch_size=spec["patch_size"])
        grid = spec["image_size"] // spec["patch_size"]
        shell = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
        pooled = ov_model.LlavaOnevisionModel.apply_pooling(shell, torch.zeros(1, grid * grid, 1)).shape[1]
        return {"tokens": written, "helper": helper, "model": frames * pooled + 1}  # + the model's one newline
    if name == "SmolVLMVideoProcessor":
        smol.num2words = str  # NOTE [ The torchvision stand-in ]: frame-count text only
        proc = smol.SmolVLMProcessor.__new__(smol.SmolVLMProcessor)
        proc.image_seq_len = spec["image_seq_len"]
        proc.image_token, proc.fake_image_token, proc.global_image_token = (
            "<image>", "<fake_token_around_image>", "<global-img>"
        )  # fmt: skip
        inputs = {"pixel_values": out["pixel_values"], "video_metadata": metadata}
        return {"tokens": proc.replace_video_token(inputs, 0).count("<image>")}
    return {}


_PROCESSORS: dict[str, Any] = {}  # one processor per (class, kwargs): building one is slow


def run(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers
    from transformers.video_utils import VideoMetadata

    name = case["processor"]
    frames, height, width, fps = case["frames"], case["height"], case["width"], case.get("fps")
    call = dict(case.get("call") or {})
    try:
        key = json.dumps([name, case.get("kwargs", {})], sort_keys=True)
        if key not in _PROCESSORS:
            _PROCESSORS[key] = getattr(transformers, name)(**case.get("kwargs", {}))
        proc = _PROCESSORS[key]
        if fps is not None:
            # as transformers' decoders write it: the duration, and every frame's index
            metadata = VideoMetadata(
                total_num_frames=frames, fps=fps, duration=frames / fps, frames_indices=list(range(frames))
            )
            call["video_metadata"] = [metadata]
        if name == "SmolVLMVideoProcessor":
            call.setdefault("return_metadata", True)  # SmolVLMProcessor's videos_kwargs
            call.setdefault("do_pad", False)  # one clip a call pads nothing; its pixel mask is all the work
        call.setdefault("do_rescale", False)  # NOTE [ The torchvision stand-in ]: values only, never sizes
        call.setdefault("do_normalize", False)
        # zeros, channels first, of no memory: only the resized frames are ever made
        video = torch.zeros((), dtype=torch.uint8).expand(frames, 3, height, width)
        out = proc(videos=[video], return_tensors="pt", **call)
        result: dict[str, Any] = {}
        pixels = out.get("pixel_values_videos", out.get("pixel_values"))
        result["pixels"] = list(pixels.shape)
        if "video_grid_thw" in out:
            result["grid"] = [int(v) for v in out["video_grid_thw"][0]]
        else:
            result["frames"] = int(pixels.shape[1])
        if "tokens" in case:
            result.update(_tokens(name, case["tokens"], out, out.get("video_metadata")))
        return result
    except Exception as exc:  # the oracle reports what transformers raises
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    warnings.simplefilter("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    cases = json.load(sys.stdin)
    json.dump([run(case) for case in cases], sys.stdout)


if __name__ == "__main__":
    main()
