"""``tokenbucket demo``: the main job on a realistic multi-camera dataset, end to end.

    tokenbucket demo [--out DIR] [--samples N] [--seed S]

The demo's training part (:func:`train_under_monitor`): a short CPU run of a tiny transformer under the monitor.

The samples are the demo dataset's own (their metadata), tokenised coarsely (patch 112) so a CPU
can train on them in seconds; their token sequences are random embeddings of the exact length
the metadata gives. A small "GPU" budget makes the plan use several buckets and batch sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from torch.utils.data import DataLoader

from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket.cli._common import _gib, non_negative_int, positive_int
from tokenbucket.cli._tables import _histogram, _print_plan, _print_summary
from tokenbucket.cost.gpus import gpu_budget_bytes
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.monitor.hooks import BucketMonitor
from tokenbucket.monitor.report import read_events, write_report
from tokenbucket.monitor.stats import format_summary
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.manifest import build_manifest
from tokenbucket.testing import RandomTokens, mixture_a
from tokenbucket.tokens.breakdown import breakdown_table
from tokenbucket.tokens.metadata import read_metadata
from tokenbucket.tokens.spec import TokenSpec
from tokenbucket.train.collate import BucketCollate, TokenBucketDataset

__all__ = ["EXAMPLE", "add_arguments", "run", "train_under_monitor"]

EXAMPLE = "tokenbucket demo --out tokenbucket-demo --samples 20000"

HIDDEN = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="tokenbucket-demo", help="directory for the demo's files (default tokenbucket-demo)"
    )
    parser.add_argument(
        "--samples",
        type=_sample_count,
        default=200_000,
        help=f"number of samples (default 200000, at most {MAX_SAMPLES:,})",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of the synthetic dataset (default 0)")


MAX_SAMPLES = 10_000_000  # the demo makes its dataset in memory: about 80 bytes a sample


def _sample_count(text: str) -> int:
    """An argparse type (NOTE [ Flag values ]): a positive integer up to MAX_SAMPLES."""
    count = positive_int(text)
    if count > MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"should be a positive integer up to {MAX_SAMPLES:,}, got {count}")
    return count


def run(args: argparse.Namespace) -> int:
    out_dir = _claim(Path(args.out))
    path = out_dir / "metadata.parquet"
    print(f"1. writing {args.samples:,} samples of mixture A (multi-camera, seed {args.seed}) to {path}")
    # NOTE [ Mixture A ]: the long-tailed reference workload
    pq.write_table(mixture_a(args.samples, seed=args.seed), path)
    spec = TokenSpec(patch=14)
    print(f"2. token spec: patch {spec.patch}, resize {spec.resize}; text/proprio/action/memory from columns")
    start = time.perf_counter()
    table = read_metadata(path)
    result = breakdown_table(table, spec)
    seconds = time.perf_counter() - start
    print(f"3. read + validated + counted in {seconds:.2f} s ({args.samples / seconds:,.0f} rows/s)\n")
    summary = result.summary()
    _print_summary(summary, str(path))
    print("\nL_total histogram (log2 bins; the tail is what a fixed batch size OOMs on):")
    print(_histogram(result.totals))
    biggest = result.table.sort_by([("total", "descending")]).slice(0, 3).to_pylist()
    print("\nlargest samples (the ones that OOM a naive batch):")
    meta = table.take([r["index"] for r in biggest]).to_pylist()
    for r, m in zip(biggest, meta, strict=True):
        print(
            f"  {r['key']}: {m['cameras']} cameras x {m['frames']} frames x {m['height']}px "
            f"-> {r['total']:,} tokens (vision {r['vision']:,})"
        )

    model = ModelSpec.preset("design-24L-1024")
    cost = CostModel(model, "H100-SXM")
    budget = gpu_budget_bytes("H100-SXM")
    print(
        f"\non {model.name} ({model.precision}, {model.attention} attention, training) on an H100-SXM "
        f"(budget {_gib(budget)}):"
    )
    for label in ("p50", "p90", "p99", "max"):
        length = summary[label]
        print(
            f"  {label} sample, {length:>7,} tokens: {_gib(cost.memory(1, length).total):>10} alone, "
            f"largest batch {cost.max_batch(length, budget)}"
        )
    wd = dataclasses.replace(spec, tubelet=2)
    halved = breakdown_table(table, wd).summary()
    print(f"(with tubelet=2 the p99 would drop from {summary['p99']:,} to {halved['p99']:,} tokens)")

    manifest_path = out_dir / "manifest.parquet"
    print(
        f"\n4. planning at most 32 static shapes under the H100 budget; samples that fit not even alone "
        f"are rejected with their reason -> {manifest_path}"
    )
    start = time.perf_counter()
    # build_manifest records the cost model's model and GPU itself
    manifest = build_manifest(
        path, spec, cost, manifest_path, budget_bytes=budget, on_oversize="reject", progress=False
    )
    print(f"   planned and written in {time.perf_counter() - start:.2f} s\n")
    _print_plan(manifest.plan)

    print(
        "\n5. a short CPU training run under the monitor: the first 384 samples, tokenised coarsely "
        '(patch 112), a 2-layer model, a 96 MiB "GPU" so the plan has several buckets'
    )
    start = time.perf_counter()
    training = train_under_monitor(table, out_dir)
    print(
        f"   {training['steps']} steps over {len(training['plan'].buckets)} buckets in "
        f"{time.perf_counter() - start:.1f} s; per bucket (CPU: no measured memory):\n"
    )
    print(format_summary(training["summary"]))
    print(f"\n   run log: {training['log']}")
    try:
        files = write_report(read_events(training["log"]), out_dir / "report")
        print(f"   report: {files.html} (plots beside it); again with `tokenbucket report {training['log']} --out DIR`")
    except ConfigError as exc:  # matplotlib is the optional `plot` extra
        print(f"   no plots: {exc}")
    return 0


DEMO_MARKER = ".tokenbucket-demo"


def _claim(out_dir: Path) -> Path:
    """``out_dir``, made the demo's: a new or empty directory gets a marker file, and a directory
    with files in it is used only if it has the marker (the demo overwrites its own files there,
    never a user's)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {str(out_dir)!r} is a file; the demo writes a directory of files")
    if out_dir.is_dir() and not (out_dir / DEMO_MARKER).exists() and any(out_dir.iterdir()):
        raise UsageError(
            f"--out {str(out_dir)!r} already holds files the demo did not write; give a new or empty directory"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / DEMO_MARKER).write_text("written by `tokenbucket demo`: the files here are the demo's own\n")
    return out_dir


def train_under_monitor(
    table: pa.Table, out_dir: Path, *, samples: int = 384, budget_bytes: int = 96 * 2**20
) -> dict[str, Any]:
    """Plans ``samples`` rows of ``table`` for a tiny model and budget, trains one epoch under a
    :class:`~tokenbucket.monitor.hooks.BucketMonitor`; returns the summary, the log and the plan."""
    table = table.slice(0, samples)
    spec = TokenSpec(patch=112)
    lengths = breakdown_table(table, spec).totals
    cost = CostModel(ModelSpec(hidden=HIDDEN, layers=2, heads=4, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, budget_bytes, max_buckets=6, multiple=32, on_oversize="reject")
    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=table, spec=spec, plan=plan)
    loader = DataLoader(data, batch_sampler=data.sampler(seed=0), collate_fn=BucketCollate(data, cost_model=cost))

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(HIDDEN, 4, 4 * HIDDEN, batch_first=True, norm_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(batch: dict[str, Any]) -> float:
        mask = batch["attention_mask"]
        out = model(batch["tokens"], src_key_padding_mask=~mask)
        loss = ((out - batch["tokens"]) ** 2)[mask].mean()  # a denoising toy target on real tokens only
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    log = out_dir / "run.jsonl"
    log.unlink(missing_ok=True)
    with BucketMonitor(plan, sinks=[log], cost_model=cost, data=data) as monitor:
        train = monitor.guard(train_step, policy="split")  # an OOM would split the batch, not end the run
        losses = [train(batch) for batch in loader]
        summary = monitor.summary()
    return {
        "summary": summary,
        "log": log,
        "plan": plan,
        "steps": len(losses),
        "samples": table.num_rows,
        "budget_bytes": budget_bytes,
    }
