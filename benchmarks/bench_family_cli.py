"""The model zoo through the CLI: ``cost --hf-config`` beside ``profile --hf-config`` at real sizes.

Command (no GPU; ~5 min on the 2-core VM, most of it Mistral Small 3.1's 24B):

    .venv/bin/python benchmarks/bench_family_cli.py
    .venv/bin/python benchmarks/bench_family_cli.py --only gemma-3-4b --train lora

For each family of the 2026 zoo, the ``config.json`` of its published checkpoint as
``benchmarks/hf_truth.py`` builds it (real sizes, transformers' own ``to_json_file``; no
``preprocessor_config.json``: the processor's defaults) goes into a temporary folder; the
``tokenbucket`` command prices the arch's smallest truth shape with ``cost --hf-config --json`` and
measures it with ``profile --hf-config --json`` (the real transformers model on fake tensors, one
process per call), under the CLI's defaults otherwise. The table: the LLM tokens each side counted,
the predicted and the measured peak, the error and each call's wall time. The family tests run the
same two commands on configs small enough for ``make test`` (``tests/test_family_*.py``, slow).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_truth  # the truth set's configs and shapes

ZOO = ("llava-onevision-0.5b", "qwen3-vl-2b", "internvl3-1b", "gemma-3-4b", "mistral-small-3.1-24b")
BIN = Path(sys.executable).parent / "tokenbucket"


def _call(verb: str, folder: Path, sample: str, train: str, batch: int) -> tuple[dict[str, object], float]:
    argv = [str(BIN), verb, "--hf-config", str(folder), "--sample", sample, "--train", train]
    start = time.perf_counter()
    proc = subprocess.run([*argv, "--batch", str(batch), "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout)
    return (out[0] if isinstance(out, list) else out), seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=ZOO, help="arch name (repeatable)")
    parser.add_argument("--train", default="full", choices=hf_truth.TRAINS)
    args = parser.parse_args(argv)
    print("| arch | train | sample | LLM tokens | predicted GiB | measured GiB | error | cost s | profile s |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.only or ZOO:
        batch, images, h, w, text = hf_truth.SHAPES[name][0]
        sample = json.dumps({"images": images, "height": h, "width": w, "text_tokens": text})
        with tempfile.TemporaryDirectory() as tmp:
            hf_truth.build_config(name).to_json_file(str(Path(tmp) / "config.json"))
            cost, cost_s = _call("cost", Path(tmp), sample, args.train, batch)
            run, run_s = _call("profile", Path(tmp), sample, args.train, batch)
        predicted, measured = int(str(cost["peak_bytes"])), int(str(run["measured_peak_bytes"]))
        error = 100.0 * (predicted - measured) / measured
        print(
            f"| {name} | {args.train} | {batch} x {images} x {h}x{w} + {text} | {cost['seq_len']} | "
            f"{predicted / 2**30:.2f} | {measured / 2**30:.2f} | {error:+.2f} % | {cost_s:.1f} | {run_s:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
