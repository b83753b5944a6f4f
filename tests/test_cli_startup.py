"""``tokenbucket cost`` prices one shape without loading numpy, pyarrow or torch.

Those imports are most of a call's time (numpy alone is ~0.1-0.2 s here); the planner and
scripts call ``cost`` per bucket. The timing itself is ``benchmarks/bench_cli_cost.py``; this
checks the property that makes it fast, which one stray top-level import would break.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("numpy", "pyarrow", "torch", "tqdm")
SAMPLE = json.dumps({"images": 2, "height": 448, "width": 448, "text_tokens": 256})
PROBE = """
import json, sys
from tokenbucket.cli.main import main
code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "heavy": sorted(m for m in %r if m in sys.modules)}), file=sys.stderr)
"""


def _probe(argv: list[str]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), json.dumps(argv)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stderr.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "argv",
    [
        ["cost", "--preset", "qwen2-vl-2b", "--sample", SAMPLE, "--batch", "2", "--gpu", "H100-SXM"],
        [
            "cost",
            "--preset",
            "qwen2-vl-2b",
            "--sample",
            SAMPLE,
            "--batch",
            "2",
            "--sharding",
            "fsdp",
            "--world-size",
            "8",
            "--train",
            "lora",
            "--json",
        ],
        ["cost", "--preset", "design-24L-1024", "--batch", "1", "--length", "16384", "--gpu", "H100-SXM"],
        ["cost", "--lerobot-policy", "smolvla", "--batch", "8", "--cameras", "2", "--gpu", "H100-SXM", "--json"],
    ],
    ids=["staged", "staged-fsdp-lora-json", "block", "lerobot-policy"],
)
def test_cost_answers_without_numpy_pyarrow_or_torch(argv: list[str]) -> None:
    assert _probe(argv) == {"code": 0, "heavy": []}


def test_cost_from_an_hf_config_folder_loads_nothing_heavy(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    argv = ["cost", "--hf-config", str(tmp_path), "--sample", SAMPLE, "--batch", "1"]
    assert _probe(argv) == {"code": 0, "heavy": []}


def test_the_probe_sees_a_heavy_import() -> None:
    """The check can fail: ``tokens`` counts through the vectorised path, and the probe names numpy."""
    sample = json.dumps({"cameras": 1, "frames": 1, "height": 224, "width": 224})
    result = _probe(["tokens", "--sample", sample, "--patch", "14"])
    assert result["code"] == 0 and "numpy" in result["heavy"]  # type: ignore[operator]
