"""The Open-Sora case: a bucket table fitted on an H200, checked for an 80 GB H100, and the plan for the H100.

Command (no GPU; prints the tables that docs/benchmarks.md shows):

    .venv/bin/python benchmarks/bench_opensora_table.py
    .venv/bin/python benchmarks/bench_opensora_table.py --model wan2.1-1.3b --setup lora

Open-Sora batches by a hand-written ``bucket_config`` (``{resolution: {frames: (probability,
batch size)}}``) whose batch sizes were searched on an H200 (140 GB); on 80 GB cards they run out
of memory (Open-Sora issue 814). This benchmark rebuilds that situation for a model tokenbucket
prices, Wan 2.1 14B fine-tuned under FSDP over 8 ranks with gradient checkpointing (the cost
model is within -1 .. +3 % of diffusers' own step there, ``tests/data/dit_truth.json``):

1. the H200 table: for each resolution x frames of an Open-Sora-style grid (480p and 720p, 1 to
   121 frames), the largest power of two that fits an H200 (hand-tuned tables keep round batch
   sizes below what a search finds: what a person settles on after trying it on the H200);
2. that table checked for an H100-SXM (``tokenbucket inspect TABLE.json --hf-config ... --gpu
   H100-SXM``): every bucket that overflows, by how much;
3. the plan tokenbucket gives for the H100 (``tokenbucket plan ... --export opensora``) over a
   clip mixture, its predicted epoch against the H200 table's, counted over the buckets the H200
   table still fits on the H100 (the others run out of memory).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dit_truth import config

from tokenbucket import DiTCostModel, DiTSetup, check_bucket_config, gpu_budget_bytes, plan_video_buckets

SIZES = [(480, 832), (720, 1280)]
FRAMES = [1, 33, 49, 81, 121]
SETUPS = {
    "fsdp8-ckpt": DiTSetup(checkpointing=True, sharding="fsdp", world_size=8),
    "lora": DiTSetup(train="lora", checkpointing=True),
}


def mixture(n: int = 20_000, seed: int = 0) -> pa.Table:
    """A video mixture: mostly 480p, a fifth 720p; clip lengths from stills to 5 s at 24 fps."""
    rng = np.random.default_rng(seed)
    sizes = np.array([(480, 832), (720, 1280)])[rng.choice(2, n, p=[0.8, 0.2])]
    frames = rng.choice([1, 40, 60, 90, 130], n, p=[0.1, 0.3, 0.25, 0.25, 0.1])
    return pa.table({"frames": frames, "height": sizes[:, 0], "width": sizes[:, 1], "text_tokens": np.full(n, 512)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wan2.1-14b")
    parser.add_argument("--setup", default="fsdp8-ckpt", choices=sorted(SETUPS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cost = DiTCostModel(config(args.model), SETUPS[args.setup])
    h200, h100 = gpu_budget_bytes("H200"), gpu_budget_bytes("H100-SXM")
    fam = cost.family
    table: dict[str, dict[str, list[float]]] = {}
    for h, w in SIZES:
        for f in FRAMES:
            latents = fam.latents(cost.cfg, f, h, w)
            most = cost.max_batch(latents.tokens, 512, h200)
            batch = 1 << (most.bit_length() - 1) if most else 0  # the largest power of two that fits
            if batch:
                table.setdefault(f"{h}x{w}", {})[str(f)] = [1.0, batch]
    checked = check_bucket_config(table, cost, h100, text_tokens=512)
    clips = mixture()
    plan = plan_video_buckets(clips, cost, h100, frame_buckets=FRAMES, sizes=SIZES, gpu="H100-SXM")
    hand = {(r["frames"], r["height"], r["width"]): r for r in checked}
    ours_s = hand_s = 0.0
    compared = 0
    for b in plan.buckets:
        row = hand.get((b.frames, b.height, b.width))
        if not b.batch_size or row is None or not row["fits"]:
            continue
        latents = fam.latents(cost.cfg, b.frames, b.height, b.width)
        steps_hand = -(-b.samples // row["batch_size"])
        hand_s += steps_hand * cost.step_seconds(row["batch_size"], latents.tokens, 512, "H100-SXM").total
        ours_s += b.steps * (b.step_seconds or 0.0)
        compared += b.samples
    over = [r for r in checked if not r["fits"]]
    report = {
        "model": args.model, "setup": args.setup, "h200_table": table, "checked_on_h100": checked,
        "overflowing": len(over), "buckets": len(checked), "h100_plan": plan.to_opensora(),
        "epoch_seconds_compared": {"samples": compared, "h200_table": hand_s, "tokenbucket": ours_s},
    }  # fmt: skip
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{args.model}, {args.setup}: the H200 table checked for an H100-SXM ({h100 / 2**30:.1f} GiB budget)")
    print(f"  {'bucket':>16} {'H200 batch':>10} {'H100 peak':>10} {'over by':>16} {'H100 batch':>10}")
    for r in checked:
        over_by = f"{r['over_bytes'] / 2**30:.1f} GiB ({r['over_percent']:+.0f} %)" if not r["fits"] else "fits"
        print(f"  {r['height']}x{r['width']} x {r['frames']:>3} {r['batch_size']:>10} "
              f"{r['peak_bytes'] / 2**30:>6.1f} GiB {over_by:>16} {r['max_batch']:>10}")  # fmt: skip
    print(f"  {len(over)} of {len(checked)} buckets overflow the H100")
    print(f"predicted epoch over the {compared:,} clips whose H200 bucket still fits the H100 (of {len(clips):,}): "
          f"H200 table {hand_s / 3600:.2f} h, tokenbucket's H100 plan {ours_s / 3600:.2f} h "
          f"({ours_s / hand_s:.2f}x)" if hand_s else "no H200 bucket fits the H100")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
