"""examples/train_video_dit.py: a tiny diffusers video transformer fine-tuned on the CPU through the
video plan's sampler and collate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_example_video_dit_trains_on_one_bucket_shape_a_batch_and_learns() -> None:
    pytest.importorskip("diffusers")
    spec = importlib.util.spec_from_file_location("train_video_dit", ROOT / "examples" / "train_video_dit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.main(epochs=3, n=24)
    # every planned clip trained once an epoch; every batch's sequence was its bucket's token count
    assert run["planned"] == 24 and run["tokens_matched"] == run["batches"] > 3 * 3
    assert run["last"] < 0.9 * run["first"], run  # the flow-matching loss falls
