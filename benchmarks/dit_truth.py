"""Measured fine-tuning peaks of diffusers' video transformers on fake tensors: the video DiT truth set.

Command (what ``tests/data/dit_truth.json`` comes from; no GPU, no downloads):

    .venv/bin/python benchmarks/dit_truth.py                          # every model, every setup
    .venv/bin/python benchmarks/dit_truth.py --only wan2.1-1.3b --out /tmp/wan13.json
    .venv/bin/python benchmarks/dit_truth.py --merge /tmp/a.json /tmp/b.json --out tests/data/dit_truth.json

Each point builds diffusers' own transformer class (``WanTransformer3DModel``, ...) from the
published ``transformer/config.json`` values below, at the real size, in bf16 with the class's
fp32 modules kept in fp32 (NOTE [ Modules kept in fp32 ] in ``tokenbucket.cost.dit_profile``),
under ``FakeTensorMode`` on ``cpu``, and runs two fine-tuning steps on cached latents and text
states (NOTE [ The fine-tuning step ]): the steady state, AdamW's states live. The peak of live
tensor bytes comes from PyTorch's ``MemTracker`` (unsharded) and ``FSDPMemTracker`` over FSDP2
``fully_shard`` (one unit per block, the root one more) on a fake process group of 8 ranks.
Attention runs as the CUDA kernels' meta functions say a GPU runs it.

The setups: ``full`` (every parameter trained), ``lora`` (rank 16 on ``to_q``, ``to_k``, ``to_v``,
``to_out.0``, as diffusers' training scripts add it), ``full`` under FSDP-8, and diffusers' own
gradient checkpointing (``enable_gradient_checkpointing()``) alone and under FSDP-8.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tokenbucket.cost.dit_profile import profile_dit
from tokenbucket.models import dit_family
from tokenbucket.models._dit import DiTConfig, VAEFactors

_WAN = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "attention_head_dim": 128,
        "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024}  # fmt: skip

# the published transformer configs (their transformer/config.json values) and VAE factors
PUBLISHED: dict[str, tuple[dict[str, Any], VAEFactors]] = {
    "wan2.1-1.3b": ({**_WAN, "num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30},
                    VAEFactors(4, 8, 16, "Wan2.1 VAE")),
    "wan2.1-14b": ({**_WAN, "num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40},
                   VAEFactors(4, 8, 16, "Wan2.1 VAE")),
    "wan2.2-ti2v-5b": ({**_WAN, "num_attention_heads": 24, "ffn_dim": 14336, "num_layers": 30,
                        "in_channels": 48, "out_channels": 48}, VAEFactors(4, 16, 48, "Wan2.2 VAE")),
}  # fmt: skip

# frames, height, width, text tokens: a short clip, the published 480p size, and the long one
SHAPES: dict[str, list[tuple[int, int, int, int]]] = {
    "wan2.1-1.3b": [(17, 480, 832, 512), (33, 480, 832, 512), (81, 480, 832, 512)],
    "wan2.1-14b": [(17, 480, 832, 512), (49, 480, 832, 512), (81, 720, 1280, 512)],
    "wan2.2-ti2v-5b": [(33, 704, 1280, 512), (81, 704, 1280, 512), (121, 704, 1280, 512)],
}
# (train, checkpointing, sharding, world size)
SETUPS = [("full", False, "none", 1), ("lora", False, "none", 1), ("full", False, "fsdp", 8),
          ("full", True, "none", 1), ("full", True, "fsdp", 8)]  # fmt: skip


def config(arch: str) -> DiTConfig:
    transformer, vae = PUBLISHED[arch]
    return DiTConfig(arch, str(transformer["_class_name"]), dict(transformer), vae)


def measure(arch: str, shape: tuple[int, int, int, int], setup: tuple[str, bool, str, int]) -> dict[str, Any]:
    frames, height, width, text = shape
    train, ckpt, sharding, world = setup
    cfg = config(arch)
    run = profile_dit(cfg, batch=1, frames=frames, height=height, width=width, text_tokens=text, train=train,
                      checkpointing=ckpt, sharding=sharding, world_size=world, steps=2)  # fmt: skip
    return {
        "arch": arch, "class_name": cfg.class_name, "frames": frames, "height": height, "width": width,
        "text_tokens": text, "batch": 1, "train": train, "checkpointing": ckpt, "sharding": sharding,
        "world_size": world, "steps": 2, "tokens": run.tokens, "peak_bytes": run.peak_bytes,
        "peak_breakdown": run.breakdown, "params_total": run.params_total,
        "params_trainable": run.params_trainable, "seconds": run.seconds, "versions": run.versions,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(PUBLISHED))
    parser.add_argument("--out", type=Path, default=Path("tests/data/dit_truth.json"))
    parser.add_argument("--merge", nargs="+", type=Path)
    args = parser.parse_args(argv)
    configs = {arch: {"transformer": t, "vae": [v.temporal, v.spatial, v.channels]} for arch, (t, v) in PUBLISHED.items()}

    def write(points: list[dict[str, Any]]) -> None:  # after every point: a long run keeps what it measured
        args.out.write_text(json.dumps({"configs": configs, "points": points}, indent=1, sort_keys=True) + "\n")

    if args.merge:
        points = [p for path in args.merge for p in json.loads(path.read_text())["points"]]
        write(points)
    else:
        points = []
        for arch in args.only or sorted(PUBLISHED):
            dit_family(PUBLISHED[arch][0]["_class_name"])  # a class tokenbucket reads
            for shape in SHAPES[arch]:
                for setup in SETUPS:
                    started = time.perf_counter()
                    point = measure(arch, shape, setup)
                    points.append(point)
                    write(points)
                    print(f"{arch} {shape} {setup}: {point['peak_bytes'] / 2**30:.2f} GiB "
                          f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    print(f"{len(points)} points -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
