"""A video mixture planned for Qwen2-VL-2B on an H100, its cameras fed as clips and as stills.

Command (no GPU; ~1 min on the 2-core VM):

    .venv/bin/python benchmarks/bench_video_plan.py
    .venv/bin/python benchmarks/bench_video_plan.py --samples 20000 --seed 1

The mixture (built here, seeded): 1-3 cameras a sample, 2-16 frames a camera, four resolutions
from 224x224 to 480x640, 32-512 text tokens. Qwen2-VL-2B's ``config.json`` is the one
``benchmarks/hf_truth.py`` builds (no ``preprocessor_config.json``: the processors' defaults).
``tokenbucket plan --hf-config`` plans it twice on an H100-SXM (full training, vision and
backbone checkpointing): with each camera one clip through the video processor (the default,
``--feed video``: frame pairs merge, NOTE [ Qwen video clips ]) and with every frame one image
(``--feed images``). Then every sample is priced on its own by the staged cost model at its
bucket's batch size (the sample repeated to fill the batch, fed as the plan fed it): "over budget"
counts the samples whose batch would not fit, which must be 0 both ways. The table: samples,
LLM tokens, buckets, steps, mean batch, the predicted epoch (the step-time model's seconds summed
over the plan's batches), the worst sample's share of the budget, and each plan's wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_truth  # the truth set's configs

from tokenbucket.cli.main import main as cli_main
from tokenbucket.cost.gpus import get_gpu, gpu_budget_bytes
from tokenbucket.cost.hf_model import load_hf_config
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.tokens.hf import read_hf_config

SIZES = ((224, 224), (336, 448), (448, 448), (480, 640))
SETUP = ("--vision-checkpointing", "full", "--backbone-checkpointing", "full")


def mixture(samples: int, seed: int) -> pa.Table:
    """The seeded video mixture: cameras x frames x resolution varied per sample."""
    rng = random.Random(seed)
    rows = []
    for i in range(samples):
        h, w = rng.choice(SIZES)
        rows.append({"key": f"s{i:06d}", "cameras": rng.randint(1, 3), "frames": rng.choice([2, 4, 8, 16]),
                     "height": h, "width": w, "text_tokens": rng.randint(32, 512)})  # fmt: skip
    return pa.Table.from_pylist(rows)


def plan(meta: Path, folder: Path, out: Path, feed: str) -> tuple[dict[str, object], float]:
    """``tokenbucket plan --hf-config ... --feed FEED --json`` in this process: its JSON and wall time."""
    import contextlib
    import io

    argv = ["plan", str(meta), "--hf-config", str(folder), "--gpu", "H100-SXM", "--out", str(out), "--json"]
    buf = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        code = cli_main([*argv, *SETUP, "--feed", feed])
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"tokenbucket {' '.join(argv)} --feed {feed}: exit {code}")
    return json.loads(buf.getvalue()), seconds


def over_budget(table: pa.Table, out: Path, cost: StagedCostModel, feed: str, budget: int) -> tuple[int, float]:
    """Samples whose own batch (at their bucket's batch size) would not fit, and the worst peak / budget."""
    manifest = load_manifest(out)
    batches = manifest.plan.batch_sizes.tolist()
    bucket_of = dict(
        zip(manifest.table.column("key").to_pylist(), manifest.table.column("bucket").to_pylist(), strict=True)
    )
    seen: dict[tuple[int, ...], int] = {}
    over, worst = 0, 0.0
    for r in table.to_pylist():
        shape = (r["cameras"], r["frames"], r["height"], r["width"], r["text_tokens"], batches[bucket_of[r["key"]]])
        if shape not in seen:
            kind = Sample.video if feed == "video" else Sample.stills
            sample = kind(cameras=r["cameras"], frames=r["frames"], height=r["height"], width=r["width"],
                          text_tokens=r["text_tokens"])  # fmt: skip
            seen[shape] = cost.memory(shape[-1], sample).peak_bytes
        over += seen[shape] > budget
        worst = max(worst, seen[shape] / budget)
    return over, worst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    budget = gpu_budget_bytes(get_gpu("H100-SXM"))
    table = mixture(args.samples, args.seed)
    print(
        "| feed | samples | LLM tokens | buckets | steps | mean batch | predicted epoch | worst / budget | over budget | plan s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    epochs = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen2-vl-2b"
        folder.mkdir()
        hf_truth.build_config("qwen2-vl-2b").to_json_file(str(folder / "config.json"))
        meta = Path(tmp) / "mixture.parquet"
        pq.write_table(table, meta)
        setup = TrainSetup(vision_checkpointing="full", backbone_checkpointing="full")
        cost = StagedCostModel(load_hf_config(folder), setup, config=read_hf_config(folder))
        for feed in ("video", "images"):
            out = Path(tmp) / f"{feed}.parquet"
            got, seconds = plan(meta, folder, out, feed)
            summary = got["summary"]
            assert isinstance(summary, dict)
            tokens = sum(load_manifest(out).table.column("total").to_pylist())
            over, worst = over_budget(table, out, cost, feed, budget)
            epochs[feed] = float(summary["predicted_epoch_seconds"])
            print(
                f"| {feed} | {summary['samples']:,} | {tokens:,} | {summary['shapes']} | {summary['batches']:,} | "
                f"{summary['samples'] / summary['batches']:.1f} | {epochs[feed] / 60:.1f} min | {worst:.3f} | {over} | "
                f"{seconds:.1f} |"
            )
    print(f"\nclips / stills epoch: x{epochs['video'] / epochs['images']:.2f}")


if __name__ == "__main__":
    main()
