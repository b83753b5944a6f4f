"""The webdataset stage against a plain ``.batched()`` pipeline on the same shards, in one run.

Command (what docs/benchmarks.md's table comes from):

    .venv/bin/python benchmarks/bench_stream.py [--samples 20000] [--shards 20] [--repeats 3]

Shards: mixture A (seed 0) at patch 112 (the scaled-down token counts of the tests), each sample
a ``.json`` metadata member and a float32 ``[L, 4]`` ``tokens.npy``, written once with
``TarWriter`` to a temporary directory (so both pipelines read from the page cache). Both
pipelines decode ``tokens.npy`` and yield lists of samples (no collation, which both would share):

* plain: ``.batched(B)`` with ``B`` the largest batch whose p99-length batch fits the budget
  (what a user without token accounting picks, hoping the tail is rare);
* tokenbucket: ``.compose(bucketed(plan, spec, max_buffered=4096))`` with a 16-bucket static
  plan of the same samples under the same budget (model: 2 layers, hidden 32, flash).

Per pipeline: samples/s (best of ``repeats``, interleaved), batches, padding efficiency (real
tokens over batch x longest, or over the bucket's shape), mean fill of the budget, and batches
predicted over it. The stage's overhead: the ratio of the two pipelines' times in paired runs
(median and range: this VM's noise is several percent run to run), and the stage alone on the
decoded samples in memory, as a share of the plain pipeline's time a sample.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import webdataset as wds

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.stream.bucketer import StreamBucketer
from tokenbucket.stream.wds import bucketed
from tokenbucket.testing import mixture_a

SPEC = TokenSpec(patch=112)
COST = CostModel(ModelSpec(hidden=32, layers=2, heads=4, precision="fp32", attention="flash"))
BUDGET = 256 * 2**20


def write(root: Path, n: int, shards: int) -> tuple[list[str], np.ndarray]:
    rows = mixture_a(n, seed=0).to_pylist()
    lengths = breakdown_table(pa.Table.from_pylist(rows), SPEC).totals
    urls, per = [], -(-n // shards)
    for s in range(shards):
        url = str(root / f"shard-{s:04d}.tar")
        urls.append(url)
        with wds.TarWriter(url) as sink:
            for i in range(s * per, min(n, (s + 1) * per)):
                sink.write(
                    {
                        "__key__": rows[i]["key"],
                        "json": json.dumps(rows[i]).encode(),
                        "tokens.npy": np.zeros((int(lengths[i]), 4), np.float32),
                    }
                )
    return urls, lengths


def plain(urls: list[str], batch: int) -> Any:
    return (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode(only=["tokens.npy"])
        .batched(batch, collation_fn=None)
    )


def staged(urls: list[str], plan: Any) -> Any:
    return (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode(only=["tokens.npy"])
        .compose(bucketed(plan, SPEC, max_buffered=4096))
    )


def run(pipeline: Any) -> tuple[float, list[tuple[int, int, int]]]:
    """Seconds for one pass, and per batch (rows, padded length, real tokens)."""
    shapes = []
    start = time.perf_counter()
    for batch in pipeline:
        if isinstance(batch, list):  # plain: padded to its longest sample, B rows
            lengths = [s["tokens.npy"].shape[0] for s in batch]
            shapes.append((len(batch), max(lengths), sum(lengths)))
        else:
            shapes.append((batch.rows, batch.length, sum(batch.lengths)))
    return time.perf_counter() - start, shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls, lengths = write(Path(tmp), args.samples, args.shards)
        plan = plan_buckets(lengths, COST, BUDGET, max_buckets=16, multiple=32)
        p99 = int(np.percentile(lengths, 99))
        batch = COST.max_batch(p99, BUDGET)
        best = {"plain": float("inf"), "tokenbucket": float("inf")}
        shapes: dict[str, list[tuple[int, int, int]]] = {}
        ratios = []
        for r in range(args.repeats):
            seconds = {}
            runs = [("plain", lambda: plain(urls, batch)), ("tokenbucket", lambda: staged(urls, plan))]
            for name, make in runs if r % 2 == 0 else runs[::-1]:  # alternate who goes first
                seconds[name], shapes[name] = run(make())
                best[name] = min(best[name], seconds[name])
            ratios.append(seconds["tokenbucket"] / seconds["plain"])
        # the stage alone, on the decoded samples in memory: its own cost without the tar reading
        decoded = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode(only=["tokens.npy"]))
        alone = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _batch in StreamBucketer(plan, SPEC, max_buffered=4096)(decoded):
                pass
            alone = min(alone, time.perf_counter() - start)
    print(
        f"{args.samples:,} samples in {args.shards} shards; budget {BUDGET / 2**20:.0f} MiB; plain batch size "
        f"{batch} (fits the p99 sample, {p99} tokens); tokenbucket: {len(plan.buckets)} static buckets\n"
    )
    print("| pipeline | samples/s | batches | padding efficiency | mean fill | over budget |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, sh in shapes.items():
        real = sum(r for _, _, r in sh)
        padded = sum(b * n for b, n, _ in sh)
        fills = [COST.memory(b, n).total / BUDGET for b, n, _ in sh]
        print(
            f"| {name} | {args.samples / best[name]:,.0f} | {len(sh):,} | {real / padded:.3f} | "
            f"{np.mean(fills):.3f} | {sum(f > 1 for f in fills):,} |"
        )
    per_sample = best["plain"] / args.samples
    print(
        f"\nstage overhead, paired runs: median {np.median(ratios) - 1:+.1%} (from {min(ratios) - 1:+.1%} to "
        f"{max(ratios) - 1:+.1%} over {args.repeats} pairs)"
    )
    print(
        f"the stage alone (decoded samples in memory): {alone / args.samples * 1e6:.1f} us a sample = "
        f"{alone / args.samples / per_sample:.1%} of the plain pipeline's {per_sample * 1e6:.0f} us a sample"
    )


if __name__ == "__main__":
    main()
