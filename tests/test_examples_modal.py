"""The LeRobot-shaped, Qwen2-VL-shaped and video-clip examples keep working: each runs as a
script, exits 0, trains on every sample of its in-memory dataset once an epoch, and its loss
goes down."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str) -> str:
    """Runs ``examples/<name>`` as a user does; returns its stdout after checking it exited 0."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr  # the collate's checks and the monitor stayed quiet
    return proc.stdout


def check_learnt_every_sample(out: str, epochs: int) -> None:
    """The printed facts: the loss fell, and each sample was trained on once per epoch."""
    loss = re.search(r"^loss (\d+\.\d+) -> (\d+\.\d+) over (\d+) steps$", out, re.M)
    assert loss is not None, out
    first, last, steps = float(loss[1]), float(loss[2]), int(loss[3])
    assert last < first * 0.8 and steps > epochs  # fixed seeds: the same numbers every run
    seen = re.search(r"^trained on (\d+) samples, (\d+) distinct of (\d+)$", out, re.M)
    assert seen is not None, out
    total, distinct, n = (int(g) for g in seen.groups())
    assert distinct == n > 0 and total == epochs * n  # no sample lost, none repeated within an epoch
    assert len(re.findall(r"^epoch \d+: loss \d+\.\d+$", out, re.M)) == epochs


@pytest.mark.slow
def test_examples_lerobot_vla_train_runs_and_learns() -> None:
    out = run_example("lerobot_vla_train.py")
    check_learnt_every_sample(out, epochs=3)
    buckets = re.search(r"^\d+ samples in (\d+) buckets", out, re.M)
    assert buckets is not None
    summary = re.findall(r"^\s+(\d+)\s+(\d+)\s+\d+\.\d", out, re.M)  # format_summary: one line per bucket
    assert [int(b) for b, _ in summary] == list(range(int(buckets[1])))
    steps = re.search(r"over (\d+) steps", out)
    assert steps is not None and sum(int(s) for _, s in summary) == int(steps[1])  # every step recorded


@pytest.mark.slow
def test_examples_qwen2vl_train_runs_and_learns() -> None:
    out = run_example("qwen2vl_train.py")
    check_learnt_every_sample(out, epochs=3)


@pytest.mark.slow
def test_examples_train_video_qwen2vl_runs_and_learns() -> None:
    # transformers' Qwen2-VL trained on clips: the example raises if a batch's video tokens
    # differ from what the breakdown counted for its samples, so exiting 0 says they matched
    out = run_example("train_video_qwen2vl.py")
    step = r"^step (\d+): bucket \d+ \[(\d+) x \d+\], (\d+) real rows, (\d+) video tokens, loss (\d+\.\d+)$"
    steps = re.findall(step, out, re.M)
    loss = re.search(r"^loss (\d+\.\d+) -> (\d+\.\d+) over (\d+) steps$", out, re.M)
    assert loss is not None and steps, out
    assert [int(s[0]) for s in steps] == list(range(1, int(loss[3]) + 1))  # every step printed its loss
    assert all(int(s[3]) > 0 for s in steps) and float(loss[2]) < float(loss[1])
    assert any(int(real) < int(rows) for _, rows, real, _, _ in steps)  # a bucket's last batch padded with rows
    seen = re.search(r"^trained on (\d+) samples, (\d+) distinct of (\d+)$", out, re.M)
    assert seen is not None, out
    total, distinct, n = (int(g) for g in seen.groups())
    assert distinct == n > 0 and total == 2 * n  # two epochs, every sample once in each


@pytest.mark.slow
def test_examples_train_packed_qwen2vl_holds_both_caps_and_learns() -> None:
    # transformers' Qwen2-VL on two-cap packed rows through PackedBatchSampler2D, a DataLoader and
    # PackedModalityCollate (NOTE [ Two-cap packing each epoch ]): not slow, a few seconds
    out = run_example("train_packed_qwen2vl.py")
    check_learnt_every_sample(out, epochs=2)
    plan = re.search(
        r"^\d+ samples in (\d+) batches of (\d+) rows: row_tokens=(\d+), row_patches=(\d+), "
        r"predicted peak at the caps (\d+\.\d+) MiB of (\d+) MiB$",
        out,
        re.M,
    )
    assert plan is not None, out
    batches, rows_per_batch, row_tokens, row_patches = (int(g) for g in plan.groups()[:4])
    at_caps, budget = float(plan[5]), float(plan[6])
    step = r"^step (\d+): (\d+) rows, tokens \[([\d, ]+)\], patches \[([\d, ]+)\], predicted peak (\d+\.\d+) MiB, loss (\d+\.\d+)$"
    steps = re.findall(step, out, re.M)
    assert [int(s[0]) for s in steps] == list(range(1, 2 * batches + 1))  # one rank: every batch a step, each epoch
    for _, rows, tokens, patches, peak, _ in steps:
        tokens_by_row = [int(t) for t in tokens.split(", ")]
        patches_by_row = [int(p) for p in patches.split(", ")]
        assert int(rows) <= rows_per_batch == len(tokens_by_row)
        assert max(tokens_by_row) <= row_tokens and max(patches_by_row) <= row_patches  # both caps, every row
        assert float(peak) <= at_caps <= budget  # priced at its own patches: never above the caps' price
    assert any(float(s[4]) < at_caps for s in steps)  # and below it where the rows hold fewer patches
