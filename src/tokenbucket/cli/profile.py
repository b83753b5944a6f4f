"""``tokenbucket profile``: measure a model's peak memory on fake tensors (or CUDA), beside the estimate.

tokenbucket profile MODULE:FACTORY [model flags] --batch B --length L [--save PROFILE.json]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket._progress import progress
from tokenbucket.cli._common import (
    _add_model_flags,
    _gib,
    gpu_from_args,
    model_from_args,
    positive_int,
    progress_from_args,
)
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.profile import profile_memory, profile_points

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = (
    "tokenbucket profile tokenbucket.cost.reference:ReferenceTransformer --hidden 256 --layers 2 --heads 4 "
    "--batch 2 --length 512 --length 1024"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("factory", help="MODULE:FACTORY returning the nn.Module (given spec= if it takes one)")
    parser.add_argument("--input", help="MODULE:FN (batch, length) -> input; default [B, L, hidden] tensor")
    parser.add_argument("--batch", type=positive_int, default=1, help="samples in the batch (default 1)")
    parser.add_argument("--length", type=positive_int, action="append", help="sequence length in tokens (repeatable)")
    parser.add_argument(
        "--device",
        choices=["fake", "cuda"],
        default="fake",
        help="fake: fake tensors on the CPU (no GPU needed, the default); cuda: measure on the GPU",
    )
    parser.add_argument(
        "--gpu",
        help="the GPU target a saved profile is for (see `tokenbucket gpus`; default fake-cpu: any GPU); "
        "`plan --profile` refuses the profile for another --gpu",
    )
    parser.add_argument(
        "--save",
        type=Path,
        help="also measure a small grid (batch 1, 2 and --batch at each --length; two or more lengths) and save "
        "a profile JSON for `tokenbucket plan --profile`",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of the table")
    _add_model_flags(parser, with_config=True)


def _load_factory(target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FACTORY (e.g. mypkg.models:build), but got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from None
    try:
        factory: Callable[..., Any] = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no {attr!r}") from None
    return factory


def run(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    gpu = gpu_from_args(args)  # before measuring: an unknown --gpu fails now, not after the grid
    if args.save is not None and len(set(args.length or [])) < 2:
        raise UsageError(
            f"--save needs two or more --length values (a fit separates the per-token and the per-token² "
            f"memory), but got {len(set(args.length or []))}"
        )
    factory = _load_factory(args.factory)
    takes_spec = False
    try:
        takes_spec = "spec" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        pass

    def build() -> torch.nn.Module:
        module = factory(spec=model) if takes_spec else factory()
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"{args.factory} returned {type(module).__name__}, not a torch.nn.Module")
        return module

    dtype = torch.bfloat16 if model.precision == "bf16" else torch.float32
    if args.input is not None:
        make_batch = _load_factory(args.input)
    else:

        def make_batch(b: int, length: int) -> torch.Tensor:
            return torch.empty(b, length, model.hidden, dtype=dtype)

    train = model.mode == "train"
    points = [(args.batch, length) for length in (args.length or [])]
    rows = []
    shown = progress_from_args(args)  # NOTE [ Progress on stderr ]: a step per point
    for b, length in progress(points, desc="profiling", unit="points", enabled=shown):
        prof = profile_memory(build, make_batch, b, length, train=train, optimizer=model.optimizer, device=args.device)
        est = CostModel(model).memory(b, length)
        rows.append(
            {
                "batch": b,
                "length": length,
                "measured": prof.peak,
                "measured_phases": prof.peaks,
                "analytic": est.total,
                "analytic_phase": est.phase,
                "ratio": est.total / prof.peak,
            }
        )
    if args.save is not None:
        grid = sorted({(b, length) for _, length in points for b in (1, 2, args.batch)})
        profile_points(
            build,
            make_batch,
            grid,
            target="fake-cpu" if gpu is None else gpu.name,
            dtype=model.precision,
            device=args.device,
            train=train,
            optimizer=model.optimizer,
            progress=shown,
        ).save(args.save)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{args.factory} on {'fake tensors (CPU)' if args.device == 'fake' else args.device}, "
        f"{model.precision}, {model.attention}, {model.mode}"
    )
    print(f"{'batch':>5} {'length':>8} {'measured':>12} {'analytic':>12} {'analytic/measured':>18}  measured by phase")
    for r in rows:
        phases = ", ".join(f"{k} {_gib(v)}" for k, v in r["measured_phases"].items())
        print(
            f"{r['batch']:>5} {r['length']:>8,} {_gib(r['measured']):>12} {_gib(r['analytic']):>12} "
            f"{r['ratio']:>18.3f}  {phases}"
        )
    if args.save is not None:
        print(f"profile written to {args.save}")
    return 0
