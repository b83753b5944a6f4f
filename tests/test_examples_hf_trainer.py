"""examples/hf_trainer_train.py runs on CPU, saves the sampler's position in its checkpoint and
resumes at the same batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_train.py"


@pytest.mark.slow
def test_example_hf_trainer_train_runs_and_resumes_at_the_same_batch(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "done: 6 steps" in done.stdout and "resumed at the same batch: True" in done.stdout
    saved = json.loads((tmp_path / "checkpoint-3" / "tokenbucket_sampler.json").read_text())
    assert (saved["sampler"]["epoch"], saved["sampler"]["step"]) == (0, 3)  # three batches trained when it saved
