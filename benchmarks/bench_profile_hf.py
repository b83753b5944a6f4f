"""Measured mode for real models: profile_hf against the staged model, and a plan from a profile.

Command (no GPU; ``points`` ~5 min, ``plan`` ~10 min on the 2-core VM):

    .venv/bin/python benchmarks/bench_profile_hf.py points
    .venv/bin/python benchmarks/bench_profile_hf.py plan

``points``: three real configs (Qwen2-0.5B, a plain decoder; Qwen2-VL-2B; PaliGemma-3B), the
``config.json`` the truth set stores, each at three sample shapes, measured by
``tokenbucket.cost.hf_profile.profile_hf`` (one bf16 AdamW step, full training, one rank) in
fresh processes' time per point, beside ``StagedCostModel``.

``plan``: Qwen2-VL-2B on an H100-SXM over a made-up VLA workload (2,000 samples: 1-3 cameras x
1-4 frames at 224-448 px, 16-1,500 text tokens): ``tokenbucket plan`` from the staged model,
``tokenbucket profile --hf-config --bounds-of`` that plan (its bucket bounds, batch 1, 2, 4),
then ``tokenbucket plan --profile``; the two bucket tables side by side, each bucket with its
staged estimate and its measured peak (blank where the bound was not measured).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tokenbucket.cli.main import main as cli
from tokenbucket.cost.gpus import gpu_budget_bytes
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.hf_profile import profile_hf
from tokenbucket.cost.measured import Profile, SteppedCostModel
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.models._hf_json import HFConfig

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_truth.json"
POINTS = {
    "qwen2-0.5b": [Sample(text_tokens=512), Sample(text_tokens=2048), Sample(text_tokens=8192)],
    "qwen2-vl-2b": [
        Sample(images=1, height=224, width=224, text_tokens=256),
        Sample(images=4, height=448, width=448, text_tokens=512),
        Sample(images=8, height=448, width=672, text_tokens=1024),
    ],
    "paligemma-3b": [
        Sample(images=1, height=224, width=224, text_tokens=256),
        Sample(images=2, height=224, width=224, text_tokens=1024),
        Sample(images=6, height=224, width=224, text_tokens=2048),
    ],
}


def _configs() -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(FIXTURE.read_text())["configs"]
    return data


def points() -> None:
    configs = _configs()
    print("| model | sample (B = 1) | LLM tokens | measured GiB | predicted GiB | error | seconds |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for arch, samples in POINTS.items():
        cfg = HFConfig(f"<{arch}>", configs[arch])
        cost = StagedCostModel(staged_from_config(cfg, arch), TrainSetup(), config=cfg)
        for sample in samples:
            start = time.perf_counter()
            run = profile_hf(cfg, sample, 1, TrainSetup())
            seconds = time.perf_counter() - start
            pred = cost.memory(1, sample, first_step=True).peak_bytes
            shape = f"{sample.images} x {sample.height}x{sample.width} + {sample.text_tokens}" if sample.images else (
                f"{sample.text_tokens} text")  # fmt: skip
            print(
                f"| {arch} | {shape} | {run.seq_len:,} | {run.peak_bytes / 2**30:.2f} | {pred / 2**30:.2f} | "
                f"{100 * (pred / run.peak_bytes - 1):+.1f} % | {seconds:.0f} |",
                flush=True,
            )


def _workload(path: Path, n: int = 2000) -> None:
    rng = random.Random(0)
    rows = [
        {"key": f"s{i:05d}", "cameras": rng.randint(1, 3), "frames": rng.randint(1, 4),
         "height": rng.choice([224, 336, 448]), "width": rng.choice([224, 336, 448]),
         "text_tokens": rng.randint(16, 1500)}
        for i in range(n)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), path)


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(list(argv))
    if code:
        raise SystemExit(f"tokenbucket {' '.join(argv)} exited {code}")
    return out.getvalue()


def plan() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen2-vl-2b"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(_configs()["qwen2-vl-2b"]))
        meta = Path(tmp) / "vla.parquet"
        _workload(meta)
        common = ["plan", str(meta), "--hf-config", str(folder), "--gpu", "H100-SXM", "--max-buckets", "8",
                  "--vision-share", "1", "--on-oversize", "reject", "--json"]  # fmt: skip
        staged_plan = Path(tmp) / "a.parquet"
        plans = {"staged model": json.loads(_run(*common, "--out", str(staged_plan)))}
        # measure at that plan's bucket bounds (batch 1, 2, 4): the profile's line at a bound is the
        # measured peak of its worst sample at any batch, so both plans' buckets get a measured figure
        prof = Path(tmp) / "profile.json"
        start = time.perf_counter()
        _run("profile", "--hf-config", str(folder), "--bounds-of", str(staged_plan), "--batch", "4",
             "--vision-share", "1", "--save", str(prof), "--quiet")  # fmt: skip
        seconds = time.perf_counter() - start
        plans["profile"] = json.loads(_run(*common, "--out", str(Path(tmp) / "p.parquet"), "--profile", str(prof)))
        profile = Profile.load(prof)
        stepped = SteppedCostModel(profile)
        cfg = HFConfig("<qwen2-vl-2b>", _configs()["qwen2-vl-2b"])
        staged = StagedLengthModel(StagedCostModel(staged_from_config(cfg), config=cfg), vision_share=1.0)
    budget = gpu_budget_bytes("H100-SXM")
    measured_at = sorted({p[1] for p in profile.points})
    print(f"profile: {len(profile.points)} points at {measured_at} tokens, batch 1, 2, 4: {seconds:.0f} s\n")
    for name, p in plans.items():
        s = p["summary"]
        print(f"**planned from the {name}**: {s['batches']:,} batches, {s['shapes']} shapes, padding efficiency "
              f"{s['padding_efficiency']:.1%}, mean fill {s['mean_fill']:.1%}, over budget "
              f"{s['over_budget_batches']}\n")  # fmt: skip
        print("| bound | batch | samples | peak (its model) GiB | staged model GiB | measured GiB |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for b in p["buckets"]:
            n, bound = b["batch_size"], b["bound"]
            other = stepped.memory_bytes(n, bound) if bound in measured_at else float("nan")
            print(
                f"| {bound:,} | {n} | {b['samples']:,} | {b['predicted_peak_bytes'] / 2**30:.2f} | "
                f"{staged.memory(n, bound).total / 2**30:.2f} | {other / 2**30:.2f} |"
            )
        print()
    print(f"budget {budget / 2**30:.2f} GiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["points", "plan"])
    args = parser.parse_args()
    sys.exit({"points": points, "plan": plan}[args.part]())
