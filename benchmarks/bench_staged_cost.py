"""Staged cost model vs measured training peaks of real Hugging Face models (per rank).

Command (reads ``tests/data/hf_truth.json``, or the files given; no GPU, a second or two):

    .venv/bin/python benchmarks/bench_staged_cost.py
    .venv/bin/python benchmarks/bench_staged_cost.py /tmp/tb/truth/part_*.json
    .venv/bin/python benchmarks/bench_staged_cost.py --summary   # the README's table

Prints a markdown table (arch x train x sharding x shape: predicted and measured GiB per rank,
error %) and the worst over- and under-prediction. The truth comes from
``benchmarks/hf_truth.py`` (one bf16 step, AdamW foreach, sdpa, MemTracker / FSDPMemTracker).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.tokens._hf_json import HFConfig

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_truth.json"
# the generator tiles SmolVLM images without upscaling them first (benchmarks/hf_truth.py _smol_tiles)
PREPROCESSORS: dict[str, dict[str, Any]] = {
    "smolvlm-256m": {"do_resize": False, "max_image_size": {"longest_edge": 512}},
}


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


def predict(point: dict[str, Any], configs: dict[str, Any]) -> tuple[int, str]:
    """(predicted peak bytes per rank, phase) of one truth point."""
    arch = point["arch"]
    cfg = HFConfig(f"<{arch}>", configs[arch], PREPROCESSORS.get(arch, {}))
    model = staged_from_config(cfg, arch)
    setup = setup_of(point)
    sample = Sample(
        images=point["images"], height=point["height"], width=point["width"], text_tokens=point["text_tokens"]
    )
    # a 1-step point is the first step; a 2-step point's peak is the second's (NOTE [ Steady state ])
    est = StagedCostModel(model, setup, config=cfg).memory(
        point["batch"], sample, first_step=point.get("steps", 1) == 1
    )
    if est.seq_len != point["seq_len"]:
        raise AssertionError(f"{arch}: seq_len {est.seq_len} != measured {point['seq_len']}")
    return est.peak_bytes, est.phase


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
        groups.setdefault((p["arch"], p["train"], p["sharding"]), []).append((p, err))
    print("| architecture | training | sharding | points (steady) | worst under | worst over |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for (arch, train, sharding), pts in sorted(groups.items()):
        steady = sum(p.get("steps", 1) == 2 for p, _ in pts)
        errs = [e for _, e in pts]
        shard = {"fsdp8": "FSDP 8", "ddp8": "DDP 8"}.get(sharding, sharding)
        print(f"| {arch} | {train} | {shard} | {len(pts)} ({steady}) | {min(errs):+.1f} % | {max(errs):+.1f} % |")
    errs = [r[3] for r in table]
    print(f"\n{len(table)} points: worst under {min(errs):+.1f} %, worst over {max(errs):+.1f} %.")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="truth files (default: the fixture)")
    parser.add_argument("--summary", action="store_true", help="one row per arch x training x sharding")
    args = parser.parse_args(argv)
    table = rows(args.paths or [FIXTURE])
    if args.summary:
        summary(table)
        return
    gib = 2**30
    print(
        "| arch | train | sharding | B x (images HxW + text) | seq | predicted GiB | measured GiB | error % | phase |"
    )
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for p, pred, phase, err in sorted(
        table, key=lambda r: (r[0]["arch"], r[0]["train"], r[0]["sharding"], r[0]["seq_len"])
    ):
        shape = f"{p['batch']} x ({p['images']} {p['height']}x{p['width']} + {p['text_tokens']})"
        print(
            f"| {p['arch']} | {p['train']} | {p['sharding']} | {shape} | {p['seq_len']} | {pred / gib:.3f} | "
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
