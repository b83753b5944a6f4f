"""One short script for a machine with a CUDA GPU: analytic vs fake-tensor vs CUDA peaks.

    python benchmarks/gpu_check_cost_model.py            # prints a Markdown table

For a few configurations of the reference block it prints the analytic prediction
(``CostModel``), the fake-tensor measurement on the CPU (``profile_memory``) and
``torch.cuda.max_memory_allocated`` over two real AdamW steps on the GPU
(``profile_memory(device="cuda")``), with the ratios. It exits with status 2, printing why, when
no CUDA device is present. Runtime on an H100-class GPU: well under a minute.
"""

from __future__ import annotations

import sys
import time

import torch

from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import profile_memory
from tokenbucket.cost.reference import ReferenceTransformer

CONFIGS = [
    # (hidden, layers, heads, precision, attention, checkpointing, batch, length)
    (1024, 8, 16, "bf16", "flash", "none", 2, 8192),
    (1024, 8, 16, "amp", "flash", "none", 2, 8192),
    (1024, 8, 16, "bf16", "eager", "none", 1, 4096),
    (1024, 8, 16, "amp", "eager", "none", 2, 2048),
    (1024, 8, 16, "bf16", "flash", "full", 4, 8192),
    (2048, 4, 16, "amp", "flash", "full", 2, 16384),
]


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}\n")
    print(
        "| D | layers | precision | attention | ckpt | B | L | analytic GiB | fake GiB | CUDA GiB "
        "| analytic/CUDA | fake/CUDA |"
    )
    print("| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    start = time.perf_counter()
    for d, n, h, prec, att, ckpt, b, length in CONFIGS:
        spec = ModelSpec(hidden=d, layers=n, heads=h, precision=prec, attention=att, checkpointing=ckpt)
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32

        def factory(spec: ModelSpec = spec) -> torch.nn.Module:
            return ReferenceTransformer(spec)

        def make_batch(bb: int, nn: int, d: int = d, dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.randn(bb, nn, d, dtype=dtype)

        analytic = CostModel(spec).memory(b, length).total
        fake = profile_memory(factory, make_batch, b, length).peak
        try:
            cuda = profile_memory(factory, make_batch, b, length, device="cuda").peak
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            print(
                f"| {d} | {n} | {prec} | {att} | {ckpt} | {b} | {length} | {analytic / 2**30:.2f} | "
                f"{fake / 2**30:.2f} | OOM | | |"
            )
            continue
        print(
            f"| {d} | {n} | {prec} | {att} | {ckpt} | {b} | {length} | {analytic / 2**30:.2f} | "
            f"{fake / 2**30:.2f} | {cuda / 2**30:.2f} | {analytic / cuda:.3f} | {fake / cuda:.3f} |"
        )
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
