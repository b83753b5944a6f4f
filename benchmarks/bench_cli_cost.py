"""Seconds per ``tokenbucket cost`` / ``ledger`` call, each a fresh process, against Python's own start.

Command (no GPU; about a minute):

    .venv/bin/python benchmarks/bench_cli_cost.py            # 15 calls per command
    .venv/bin/python benchmarks/bench_cli_cost.py --calls 30

Each command runs ``--calls`` times as its own process, the way a script or a per-bucket loop
calls it; the table gives the median and the slowest wall seconds, and the median over the
median of the baseline measured in the same run (a bare ``python -c pass``, and ``import numpy``,
the floor of any command that loads it). Bytecode is compiled once into a scratch
``PYTHONPYCACHEPREFIX`` before timing, as an installed package has it; this machine's
``PYTHONDONTWRITEBYTECODE`` would otherwise make every call compile every module again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLE = json.dumps({"images": 4, "height": 448, "width": 448, "text_tokens": 512})
# Qwen2-VL-2B's config.json, the one the truth set measured
HF_CONFIG = json.loads((Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_truth.json").read_text())[
    "configs"
]["qwen2-vl-2b"]


def commands(folder: Path) -> list[tuple[str, list[str]]]:
    cli = [sys.executable, "-m", "tokenbucket"]
    staged = ["--sample", SAMPLE, "--batch", "2"]
    return [
        ("python -c pass (baseline)", [sys.executable, "-c", "pass"]),
        ("python -c 'import numpy'", [sys.executable, "-c", "import numpy"]),
        (
            "cost --preset design-24L-1024",
            [*cli, "cost", "--preset", "design-24L-1024", "--batch", "1", "--length", "16384", "--gpu", "H100-SXM"],
        ),
        ("cost --preset qwen2-vl-2b", [*cli, "cost", "--preset", "qwen2-vl-2b", *staged, "--gpu", "H100-SXM"]),
        (
            "cost --hf-config DIR --sharding fsdp",
            [*cli, "cost", "--hf-config", str(folder), *staged, "--sharding", "fsdp", "--world-size", "8"],
        ),
        ("cost --hf-config DIR --json", [*cli, "cost", "--hf-config", str(folder), *staged, "--json"]),
        ("ledger --preset qwen2-vl-2b", [*cli, "ledger", "--preset", "qwen2-vl-2b", *staged]),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=15, help="processes per command")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen2-vl-2b"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(HF_CONFIG))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        rows = []
        for name, cmd in commands(folder):
            subprocess.run(cmd, env=env, check=True, capture_output=True)  # writes the bytecode
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, capture_output=True)
                times.append(time.perf_counter() - start)
            rows.append((name, statistics.median(times), max(times)))
    base = rows[0][1]
    print(f"{args.calls} calls per command, each a fresh process; Python {sys.version.split()[0]}\n")
    print("| command | median s | slowest s | median / python -c pass |")
    print("|---|---:|---:|---:|")
    for name, med, worst in rows:
        print(f"| `{name}` | {med:.3f} | {worst:.3f} | {med / base:.1f}x |")


if __name__ == "__main__":
    main()
