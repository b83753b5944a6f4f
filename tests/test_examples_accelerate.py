"""examples/accelerate_train.py runs on CPU and leaves an Accelerate checkpoint holding the sampler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "accelerate_train.py"


@pytest.mark.slow
def test_example_accelerate_train_runs_and_checkpoints_the_sampler(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "done: epoch 1" in done.stdout
    state = torch.load(tmp_path / "ckpt" / "custom_checkpoint_0.pkl", weights_only=False)
    assert (state["epoch"], state["step"]) == (1, 3)  # three batches handed out when it saved
