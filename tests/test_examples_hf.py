"""The Hugging Face datasets example keeps working (run as test_examples.py runs the others)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_examples_hf_datasets_train_runs_and_learns(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("hf_datasets_train", ROOT / "examples" / "hf_datasets_train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(steps=12, n=192)
    losses = result["losses"]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < losses[0] * 0.8  # the label (an extra column) was learnt from
    stats = result["stats"]
    assert sum(s["batches"] for s in stats.values()) == 12
    assert len(result["uids"]) == sum(s["rows"] for s in stats.values())  # every real row carried its uid
    assert all(u.startswith("uid-") for u in result["uids"])
    assert result["epochs"] == 1 and len(set(result["uids"])) == len(result["uids"])  # one epoch: each sample once
    out = capsys.readouterr().out
    assert "extra columns in every batch: ['label', 'uid']" in out
    assert out.count("padding efficiency") == len(stats)  # one line per bucket
