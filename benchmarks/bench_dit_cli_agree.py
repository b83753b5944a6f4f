"""``tokenbucket cost`` and ``tokenbucket profile`` on the same pipeline and sample, for every video DiT family.

Command (no GPU; about a minute a family on 2 cores; prints the table docs/benchmarks.md shows):

    .venv/bin/python benchmarks/bench_dit_cli_agree.py
    .venv/bin/python benchmarks/bench_dit_cli_agree.py --only wan2.1-1.3b --train lora

Each published transformer config of ``benchmarks/dit_truth.py`` is written as a pipeline folder
(``model_index.json``, ``transformer/config.json``, ``vae/config.json``), and both commands run
as a user runs them, as processes: ``cost --hf-config PIPELINE --sample '{"videos": 1, "frames":
81, "height": 480, "width": 832, "text_tokens": 512}' --batch 1 --json`` prices the step,
``profile`` with the same flags builds diffusers' own class at its real size on fake tensors and
measures it. A family whose pipeline refuses 480 x 832 (CogVideoX 1.0's learned positions, LTX's
multiples of 32) takes its own published size instead, said in the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dit_truth import PUBLISHED

BIN = Path(sys.executable).parent
SAMPLE = {"videos": 1, "frames": 81, "height": 480, "width": 832, "text_tokens": 512}
# the published size of a family that refuses 480 x 832
OWN = {
    "CogVideoXTransformer3DModel": {"frames": 49, "height": 480, "width": 720, "text_tokens": 226},
    "LTXVideoTransformer3DModel": {"frames": 121, "height": 480, "width": 704, "text_tokens": 128},
}
VAE_CLASS = {
    "WanTransformer3DModel": "AutoencoderKLWan",
    "CosmosTransformer3DModel": "AutoencoderKLWan",
    "CogVideoXTransformer3DModel": "AutoencoderKLCogVideoX",
    "LTXVideoTransformer3DModel": "AutoencoderKLLTXVideo",
    "HunyuanVideoTransformer3DModel": "AutoencoderKLHunyuanVideo",
}


def pipeline(folder: Path, arch: str) -> Path:
    """A pipeline folder of ``arch``: its transformer config; the VAE's factors are the published ones."""
    transformer, _ = PUBLISHED[arch]
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": arch}))
    (folder / "transformer" / "config.json").write_text(json.dumps(transformer))
    return folder


def run(verb: str, pipe: Path, sample: dict[str, int], extra: list[str]) -> dict[str, object]:
    argv = [str(BIN / "tokenbucket"), verb, "--hf-config", str(pipe), "--sample", json.dumps(sample),
            "--batch", "1", "--json", *extra]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(PUBLISHED))
    parser.add_argument("--train", default="full", choices=["full", "lora"])
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args(argv)
    extra = ["--train", args.train] + (["--backbone-checkpointing", "full"] if args.checkpointing else [])
    print(f"{'model':>18} {'sample':>22} {'tokens':>8} {'cost GiB':>9} {'profile GiB':>11} {'cost - profile':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.only or sorted(PUBLISHED):
            pipe = pipeline(Path(tmp) / arch, arch)
            cls = str(PUBLISHED[arch][0]["_class_name"])
            sample = {**SAMPLE, **OWN.get(cls, {})}
            cost = run("cost", pipe, sample, extra)
            if "error" in cost:
                print(f"{arch:>18} refused: {cost['error']}")
                continue
            prof = run("profile", pipe, sample, extra)
            if "error" in prof:
                print(f"{arch:>18} profile failed: {prof['error']}")
                continue
            shape = f"{sample['frames']} x {sample['height']}x{sample['width']}"
            pred, meas = int(cost["peak_bytes"]), int(prof["measured_peak_bytes"])  # type: ignore[call-overload]
            print(f"{arch:>18} {shape:>22} {cost['video_tokens']:>8,} {pred / 2**30:>9.2f} {meas / 2**30:>11.2f} "
                  f"{100 * (pred - meas) / meas:>+13.1f}%", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
