"""Staged cost model vs measured training peaks of real Hugging Face models (per rank).

Command (reads ``tests/data/hf_truth.json``, or the files given; no GPU, a second or two):

    .venv/bin/python benchmarks/bench_staged_cost.py
    .venv/bin/python benchmarks/bench_staged_cost.py /tmp/tb/truth/part_*.json
    .venv/bin/python benchmarks/bench_staged_cost.py --summary   # docs/cost-model.md's table

Prints a markdown table (arch x train x sharding x shape: predicted and measured GiB per rank,
error %) and the worst over- and under-prediction. A video point (clips of frames) is priced as
its clips and summed in rows of its own, ``ARCH (video)``. The truth comes from
``benchmarks/hf_truth.py`` (one bf16 step, AdamW foreach, sdpa, MemTracker / FSDPMemTracker).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.models._hf_json import HFConfig

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_truth.json"
# the generator tiles SmolVLM images without upscaling them first (benchmarks/hf_truth.py _smol_tiles)
PREPROCESSORS: dict[str, dict[str, Any]] = {
    "smolvlm-256m": {"do_resize": False, "max_image_size": {"longest_edge": 512}},
    "gemma-3-4b": {"do_pan_and_scan": True},  # the generator cuts crops (benchmarks/hf_truth.py _gemma3_passes)
}


# the video processor's keys a truth point's clips were counted with (benchmarks/hf_truth.py QWEN3_VL_VIDEO_SIZE:
# Qwen3-VL-2B-Instruct's video_preprocessor_config.json; SmolVLM2's frames at its tower's 512 px, every one
# kept); the others: their video processor's class defaults
VIDEO_PREPROCESSORS: dict[str, dict[str, Any]] = {
    "qwen3-vl-2b": {"size": {"shortest_edge": 4096, "longest_edge": 25165824}},
    "smolvlm2-256m": {"max_image_size": {"longest_edge": 512}},
}


def hf_config(arch: str, configs: dict[str, Any]) -> HFConfig:
    """The ``HFConfig`` a truth point of ``arch`` is priced with: its stored config.json and the
    processors' keys the generator counted its images and clips with."""
    return HFConfig(f"<{arch}>", configs[arch], PREPROCESSORS.get(arch, {}), VIDEO_PREPROCESSORS.get(arch))


def sample_of(point: dict[str, Any]) -> Sample:
    """The :class:`Sample` a truth point measured: its images, or its clips of ``frames`` frames at ``fps``."""
    if point.get("videos"):
        return Sample(
            videos=point["videos"], frames=point["frames"], height=point["height"], width=point["width"],
            text_tokens=point["text_tokens"], fps=point.get("fps"),
        )  # fmt: skip
    return Sample(
        images=point["images"], height=point["height"], width=point["width"], text_tokens=point["text_tokens"]
    )


def family_of(point: dict[str, Any]) -> str:
    """The table row's name of a point: its arch, and ``(video)`` for clips."""
    return point["arch"] + (" (video)" if point.get("videos") else "")


def load(paths: list[Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    configs: dict[str, Any] = {}
    points: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(path.read_text())
        configs.update(data["configs"])
        points += data["points"]
    return configs, points


# a truth point's step-shape fields (benchmarks/hf_truth.py AXES), and their defaults for the
# points measured before the field existed
AXES_DEFAULTS = {
    "loop": "dropped",
    "use_cache": "config",
    "kernels": "cpu",
    "optimizer": "adamw",
    "checkpointing": "none",
}


def setup_of(point: dict[str, Any]) -> TrainSetup:
    """The :class:`TrainSetup` that prices the step a truth point measured (its kernels are not
    a setting: the model prices the GPU's, and is held to the CPU's too)."""
    axes = {k: point.get(k, v) for k, v in AXES_DEFAULTS.items()}
    ckpt = axes["checkpointing"]
    return TrainSetup(
        train=point["train"], sharding={"none": "none", "fsdp8": "fsdp", "ddp8": "ddp"}[point["sharding"]],
        world_size=point["world"], optimizer=axes["optimizer"], loop=axes["loop"],
        use_cache=None if axes["use_cache"] == "config" else False,
        vision_checkpointing="full" if ckpt in ("vision", "both") else "none",
        backbone_checkpointing="full" if ckpt in ("backbone", "both") else "none",
    )  # fmt: skip


def predict(point: dict[str, Any], configs: dict[str, Any], *, default_loop: bool = False) -> tuple[int, str]:
    """(predicted peak bytes per rank, phase) of one truth point; ``default_loop``: priced with
    :class:`TrainSetup`'s default loop instead of the point's own (what a user who never says
    how the step is written gets)."""
    arch = point["arch"]
    cfg = hf_config(arch, configs)
    model = staged_from_config(cfg, arch)
    setup = setup_of(point)
    if default_loop:
        setup = dataclasses.replace(setup, loop=TrainSetup().loop, use_cache=None)
    sample = sample_of(point)
    # a 1-step point is the first step; a 2-step point's peak is the second's (NOTE [ Steady state ])
    est = StagedCostModel(model, setup, config=cfg).memory(
        point["batch"], sample, first_step=point.get("steps", 1) == 1
    )
    if est.seq_len != point["seq_len"]:
        raise AssertionError(f"{arch}: seq_len {est.seq_len} != measured {point['seq_len']}")
    return est.peak_bytes, est.phase


def _step_tag(p: dict[str, Any]) -> str:
    """The point's steps and its step-shape fields off their defaults, e.g. ``2 held cuda``."""
    axes = [str(p.get(k, v)) for k, v in AXES_DEFAULTS.items() if str(p.get(k, v)) != v]
    return " ".join([str(p.get("steps", 1)), *axes])


def rows(paths: list[Path]) -> list[tuple[dict[str, Any], int, str, float]]:
    configs, points = load(paths)
    out = []
    for p in points:
        pred, phase = predict(p, configs)
        out.append((p, pred, phase, 100.0 * (pred - p["peak_bytes"]) / p["peak_bytes"]))
    return out


def summary(table: list[tuple[dict[str, Any], int, str, float]]) -> None:
    """One row per (arch, training, sharding): points (steady-state ones), worst under and over."""
    groups: dict[tuple[str, str, str], list[tuple[dict[str, Any], float]]] = {}
    for p, _, _, err in table:
        groups.setdefault((family_of(p), p["train"], p["sharding"]), []).append((p, err))
    print("| architecture | training | sharding | points (steady) | worst under | worst over |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for (arch, train, sharding), pts in sorted(groups.items()):
        steady = sum(p.get("steps", 1) == 2 for p, _ in pts)
        errs = [e for _, e in pts]
        shard = {"fsdp8": "FSDP 8", "ddp8": "DDP 8"}.get(sharding, sharding)
        print(f"| {arch} | {train} | {shard} | {len(pts)} ({steady}) | {min(errs):+.1f} % | {max(errs):+.1f} % |")
    errs = [r[3] for r in table]
    print(f"\n{len(table)} points: worst under {min(errs):+.1f} %, worst over {max(errs):+.1f} %.")


def by_step_shape(paths: list[Path]) -> None:
    """Two tables: family x loop x kernels over every point (each priced with its own loop, and
    with the default loop, ``held``, whatever loop it measured: the issue's goal is no point under
    by more than 3 % with the default); and family x the other step-shape fields where they are
    not the default (checkpointing, SGD, use_cache off)."""
    configs, points = load(paths)
    loops: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    others: dict[tuple[str, str], list[float]] = {}
    for p in points:
        axes = {k: str(p.get(k, v)) for k, v in AXES_DEFAULTS.items()}
        own = 100.0 * (predict(p, configs)[0] - p["peak_bytes"]) / p["peak_bytes"]
        default = 100.0 * (predict(p, configs, default_loop=True)[0] - p["peak_bytes"]) / p["peak_bytes"]
        loops.setdefault((family_of(p), axes["loop"], axes["kernels"]), []).append((own, default))
        extra = [f"{k} {axes[k]}" for k in ("checkpointing", "optimizer", "use_cache") if axes[k] != AXES_DEFAULTS[k]]
        if extra:
            others.setdefault((family_of(p), ", ".join(extra)), []).append(own)
    print(
        "| family | loop | kernels | points | its own loop: worst under / over | the default loop: worst under / over |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for (arch, loop, kernels), errs in sorted(loops.items()):
        own, default = [e[0] for e in errs], [e[1] for e in errs]
        print(f"| {arch} | {loop} | {kernels} | {len(errs)} | {min(own):+.1f} % / {max(own):+.1f} % | "
              f"{min(default):+.1f} % / {max(default):+.1f} % |")  # fmt: skip
    own = [e[0] for v in loops.values() for e in v]
    default = [e[1] for v in loops.values() for e in v]
    print(f"\n{len(own)} points; their own loop: worst under {min(own):+.1f} %, worst over {max(own):+.1f} %; "
          f"the default loop: worst under {min(default):+.1f} %, worst over {max(default):+.1f} %.\n")  # fmt: skip
    print("| family | step | points | worst under | worst over |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (arch, extra), errs in sorted(others.items()):
        print(f"| {arch} | {extra} | {len(errs)} | {min(errs):+.1f} % | {max(errs):+.1f} % |")
    errs = [e for v in others.values() for e in v]
    if errs:
        print(f"\n{len(errs)} points: worst under {min(errs):+.1f} %, worst over {max(errs):+.1f} %.")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="truth files (default: the fixture)")
    parser.add_argument("--summary", action="store_true", help="one row per arch x training x sharding")
    parser.add_argument("--by-step", action="store_true", help="one row per family x loop x kernels (the site's)")
    args = parser.parse_args(argv)
    if args.by_step:
        by_step_shape(args.paths or [FIXTURE])
        return
    table = rows(args.paths or [FIXTURE])
    if args.summary:
        summary(table)
        return
    gib = 2**30
    print(
        "| arch | train | sharding | step | B x (images or clips HxW + text) | seq | predicted GiB | measured GiB | error % "
        "| phase |"
    )
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for p, pred, phase, err in sorted(
        table, key=lambda r: (r[0]["arch"], r[0]["train"], r[0]["sharding"], r[0]["seq_len"])
    ):
        vision = f"{p['videos']} x {p['frames']} frames" if p.get("videos") else str(p["images"])
        shape = f"{p['batch']} x ({vision} {p['height']}x{p['width']} + {p['text_tokens']})"
        print(
            f"| {p['arch']} | {p['train']} | {p['sharding']} | {_step_tag(p)} | {shape} | {p['seq_len']} | "
            f"{pred / gib:.3f} | "
            f"{p['peak_bytes'] / gib:.3f} | {err:+.1f} | {phase} |"
        )
    if table:
        over = max(table, key=lambda r: r[3])
        under = min(table, key=lambda r: r[3])
        for label, (p, _, _, err) in (("worst over", over), ("worst under", under)):
            print(
                f"\n{label}: {err:+.1f} % ({p['arch']} {p['train']} {p['sharding']} B={p['batch']} seq={p['seq_len']})"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
