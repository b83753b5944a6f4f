"""Plan buckets for a LeRobot-format dataset from its metadata alone, and print the bucket table.

    python examples/plan_lerobot.py DATASET_DIR      # a LeRobot dataset root (the folder holding meta/)
    python examples/plan_lerobot.py DIR_A DIR_B      # several datasets as one mixture (keys NAME/ep.../...)
    python examples/plan_lerobot.py                  # a demo folder: a real info.json + made-up episodes

One sample is one frame of one episode; ``delta_timestamps`` (LeRobot's sampling recipe) says
how many frames of each camera and how many state / action steps a sample loads, so it sets the
token count. Nothing is decoded: ``meta/info.json`` and the episode list are all it reads.
The same from the shell: ``tokenbucket plan --lerobot DATASET_DIR --delta-timestamps '{...}' ...``
(repeat ``--lerobot [NAME=]DIR[:WEIGHT]`` for a mixture).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from tokenbucket import (
    CostModel,
    ModelSpec,
    TokenSpec,
    breakdown_table,
    gpu_budget_bytes,
    lerobot_mixture,
    lerobot_rows,
    plan_buckets,
    read_lerobot_metadata,
)

SHARED_INFO = Path(__file__).resolve().parents[2] / "shared" / "data" / "lerobot" / "svla_so100_pickplace.json"

# a policy that sees 2 past frames and the current one of each camera, 1 state, a 50-step action chunk
FPS = 30
RECIPE = {
    "observation.images.top": [-2 / FPS, -1 / FPS, 0.0],
    "observation.images.wrist": [-2 / FPS, -1 / FPS, 0.0],
    "observation.state": [0.0],
    "action": [i / FPS for i in range(50)],
}


def demo_dataset(root: Path, info: Path = SHARED_INFO, lengths: tuple[int, ...] = (300, 450, 120, 600)) -> Path:
    """A dataset folder with a real ``info.json`` and a made-up v2.1 episode list."""
    (root / "meta").mkdir(parents=True, exist_ok=True)
    shutil.copy(info, root / "meta" / "info.json")
    with open(root / "meta" / "episodes.jsonl", "w") as f:
        for i, n in enumerate(lengths):
            f.write(json.dumps({"episode_index": i, "tasks": ["pick and place"], "length": n}) + "\n")
    return root


def main(*roots: Path, delta_timestamps: dict[str, list[float]] | None = None) -> object:
    """Plan one dataset, or several as a mixture (a shared recipe: each takes the keys it has)."""
    recipe = RECIPE if delta_timestamps is None else delta_timestamps
    metas = [read_lerobot_metadata(root) for root in roots]
    rows = lerobot_rows(metas[0], recipe) if len(metas) == 1 else lerobot_mixture(metas, recipe)
    spec = TokenSpec(patch=14, merge=2)  # a ViT at patch 14 with 2x2 token merging
    lengths = breakdown_table(rows, spec).totals
    cost = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
    plan = plan_buckets(lengths, cost, gpu_budget_bytes("H100-SXM"), max_buckets=8, on_oversize="reject")
    for meta in metas:
        cams = ", ".join(f"{c.name} {c.height}x{c.width}" for c in meta.info.cameras)
        print(
            f"{meta.root}: {meta.total_frames:,} samples (frames) in {len(meta.episode_index)} episodes at "
            f"{meta.info.fps:g} fps; cameras {cams}"
        )
    print(f"tokens per sample: {int(lengths.min()):,} .. {int(lengths.max()):,}\n")
    print(f"{'bucket':>6} {'bound':>8} {'batch':>6} {'samples':>8} {'batches':>8} {'peak GiB':>9} {'pad eff':>8}")
    for k, b in enumerate(plan.buckets):
        print(
            f"{k:>6} {b.bound:>8,} {b.batch_size:>6} {b.samples:>8,} {b.batches:>8,} "
            f"{b.predicted_peak_bytes / 2**30:>9.2f} {b.padding_efficiency:>8.3f}"
        )
    return plan


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(*(Path(arg) for arg in sys.argv[1:]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(demo_dataset(Path(tmp)))
