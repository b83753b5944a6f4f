"""What batch size fits: a LeRobot mixture of embodiments planned for pi0 (and SmolVLA) on one H100.

    python examples/plan_lerobot_mixture_policy.py                 # real info.json files, made-up episodes
    python examples/plan_lerobot_mixture_policy.py DIR_A DIR_B ...  # your LeRobot dataset folders

Three embodiments with their real ``meta/info.json`` (../shared/data/lerobot): SO-100 (two
cameras of 480 x 640), LIBERO (two of 256 x 256) and PushT (one of 96 x 96). Each sample is one
frame with its action chunk; the policy counts its tokens (``PolicyLengthModel.token_spec``) and
prices each bucket as LeRobot 0.4.4 trains it (``LeRobotPolicy``, checked against LeRobot's own
policies in tests/data/lerobot_truth.json). pi0 runs every camera slot whatever a sample holds
(an absent camera is a padded image: NOTE [ Camera slots ]), so the whole mixture is one bucket
and one batch size; SmolVLA runs a sample's own cameras, so the one-camera embodiment gets a
larger batch. The same from the shell::

    tokenbucket plan --lerobot so100=DIR_A --lerobot libero=DIR_B --lerobot pusht=DIR_C \\
        --lerobot-policy pi0 --gpu H100-SXM --out manifest.parquet
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from tokenbucket import (
    BucketPlan,
    LeRobotPolicy,
    PolicyLengthModel,
    breakdown_table,
    get_gpu,
    gpu_budget_bytes,
    lerobot_mixture,
    plan_buckets,
    read_lerobot_metadata,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "lerobot"
EMBODIMENTS = {"so100": "svla_so100_pickplace.json", "libero": "libero.json", "pusht": "pusht.json"}
GPU = "H100-SXM"
# (policy, setup, LeRobot flags)
POLICIES = [
    ("pi0", "full", {}),
    ("pi0", "frozen tower", {"freeze_vision_encoder": True}),
    ("pi0", "expert only", {"train_expert_only": True}),
    ("smolvla", "expert only (default)", {}),
]


def demo_mixture(root: Path, shared: Path = SHARED) -> list[Path]:
    """One dataset folder per embodiment: its real ``info.json`` and a made-up v2.1 episode list."""
    roots = []
    for k, (name, info) in enumerate(EMBODIMENTS.items()):
        meta = root / name / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared / info, meta / "info.json")
        with open(meta / "episodes.jsonl", "w") as f:
            for i, n in enumerate((200 + 50 * k, 300, 150)):
                f.write(json.dumps({"episode_index": i, "tasks": ["pick the cube"], "length": n}) + "\n")
        roots.append(root / name)
    return roots


def plan(roots: list[Path], policy: LeRobotPolicy, gpu: str = GPU) -> tuple[BucketPlan, PolicyLengthModel]:
    """The mixture's buckets and batch sizes for ``policy`` on ``gpu`` (one frame per camera)."""
    rows = lerobot_mixture([read_lerobot_metadata(r) for r in roots])
    cost = PolicyLengthModel.for_rows(policy, rows, gpu=gpu)  # the most cameras, the largest frame
    lengths = breakdown_table(rows, cost.token_spec()).totals
    # the policy pads nothing: every bound is a sample's own length (NOTE [ A policy's lengths ])
    return plan_buckets(lengths, cost, gpu_budget_bytes(get_gpu(gpu)), multiple=1), cost


def main(*roots: Path) -> dict[str, BucketPlan]:
    budget = gpu_budget_bytes(get_gpu(GPU))
    for root in roots:
        meta = read_lerobot_metadata(root)
        cams = ", ".join(f"{c.name} {c.height}x{c.width}" for c in meta.info.cameras)
        print(f"{root.name}: {meta.total_frames:,} frames; {cams}")
    print(f"\nbatch size per bucket on one {GPU} ({budget / 2**30:.1f} GiB budget)")
    print(
        f"{'policy':<8} {'setup':<22} {'bucket':>6} {'tokens':>7} {'cameras':>8} {'batch':>6} {'samples':>8} {'peak GiB':>9}"
    )
    plans = {}
    for name, setup, flags in POLICIES:
        got, cost = plan(list(roots), LeRobotPolicy.preset(name, **flags))
        plans[f"{name} {setup}"] = got
        for k, b in enumerate(got.buckets):
            print(
                f"{name:<8} {setup:<22} {k:>6} {b.bound:>7,} {cost.slots_at(b.bound):>8} {b.batch_size:>6} "
                f"{b.samples:>8,} {b.predicted_peak_bytes / 2**30:>9.2f}"
            )
    return plans


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(*(Path(arg) for arg in sys.argv[1:]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(*demo_mixture(Path(tmp)))
