"""The Lightning example a newcomer copies from must keep working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_examples_lightning_train_runs_monitored_steps(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "lightning_train.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "8 steps over buckets" in proc.stdout
    log = tmp_path / "runs" / "lightning_train.jsonl"
    steps = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "step"]
    assert len(steps) == 8  # the callback ran the monitor around every training batch
