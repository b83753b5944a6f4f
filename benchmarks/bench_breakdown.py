"""Token breakdown throughput: the vectorised path vs a plain per-row Python loop.

Command (what docs/benchmarks.md's table comes from):

    .venv/bin/python benchmarks/bench_breakdown.py    # 10M rows; the per-row loop runs the first 1M
    .venv/bin/python benchmarks/bench_breakdown.py --rows 1000000 --loop-rows 200000   # quicker

Workload: mixture A (``tokenbucket.testing.mixture_a``, seed 0) written once to Parquet under
``benchmarks/_data/``, then read back with ``read_metadata``. Everything runs on one core
(Arrow's thread pools are set to 1; the NumPy element-wise kernels are single-threaded).

Rows measured:
- ``read``: Parquet → Arrow table.
- ``vectorised``: ``breakdown_table`` — validation (nulls, NaN, types, ranges) and the arithmetic.
- ``vectorised + unique keys``: the same plus the duplicate-key check — one comparison pass
  when the keys are in order, a hash over every key when they are not (keys shuffled).
- ``per-row loop``: ``breakdown_sample`` on each row of the same table, as a user would write it;
  the ratio column is against this loop.
- ``bare formula loop``: the hard-coded formula for this one spec with no validation — the
  least any per-row loop can cost, for reference.

Reference (2-core shared VM, 2026-12-02, 10M rows): see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenbucket import TokenSpec, breakdown_sample, breakdown_table, read_metadata
from tokenbucket.testing import mixture_a

DATA = Path(__file__).parent / "_data"


def best_of(repeat: int, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument(
        "--loop-rows",
        type=int,
        default=1_000_000,
        help="the first N of the same rows go through the per-row loop (0 = all); "
        "its rate is per row either way, and all 10M take minutes",
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    DATA.mkdir(exist_ok=True)
    path = DATA / f"mixture_a_{args.rows}.parquet"
    if not path.exists():
        print(f"writing {args.rows:,} rows of mixture A to {path} ...", file=sys.stderr)
        pq.write_table(mixture_a(args.rows, seed=0), path, row_group_size=1_000_000)

    spec = TokenSpec(patch=14)
    t_read, table = best_of(args.repeat, read_metadata, path)
    n = table.num_rows
    t_vec, result = best_of(args.repeat, breakdown_table, table, spec, check_keys=False)
    t_keys, result_keys = best_of(args.repeat, breakdown_table, table, spec)
    totals = result.totals
    assert np.array_equal(totals, result_keys.totals)
    # the same keys in random order: the uniqueness check must hash them
    perm = np.random.default_rng(0).permutation(n)
    shuffled = table.set_column(0, "key", table.column("key").take(pa.array(perm)))
    t_hash, _ = best_of(1, breakdown_table, shuffled, spec)

    loop_rows = n if args.loop_rows <= 0 else min(args.loop_rows, n)
    loop_total = 0
    start = time.perf_counter()
    done = 0
    for batch in table.slice(0, loop_rows).to_batches(max_chunksize=100_000):
        for i, row in enumerate(batch.to_pylist()):
            bd = breakdown_sample(row, spec, index=done + i)
            loop_total += bd.total
        done += batch.num_rows
    t_loop = time.perf_counter() - start
    # the loop must count what the vectorised path counted
    assert loop_total == int(totals[:loop_rows].sum()), "per-row loop and vectorised path disagree"

    # A bare loop of the formula for this spec (pad, patch 14, no tubelet), no validation:
    # the least a hand-written loop can cost.
    start = time.perf_counter()
    bare_total = 0
    for batch in table.slice(0, loop_rows).to_batches(max_chunksize=100_000):
        for r in batch.to_pylist():
            patches = -(-r["height"] // 14) * -(-r["width"] // 14)
            bare_total += (
                r["cameras"] * r["frames"] * patches
                + r["text_tokens"]
                + r["proprio_tokens"]
                + r["action_tokens"]
                + r["memory_tokens"]
            )
    t_bare = time.perf_counter() - start
    assert bare_total == loop_total

    rate_loop = loop_rows / t_loop
    rows = [
        ("read Parquet → Arrow", n, t_read, n / t_read),
        ("vectorised breakdown (validation + arithmetic)", n, t_vec, n / t_vec),
        ("vectorised breakdown + unique-key check (keys in order)", n, t_keys, n / t_keys),
        ("vectorised breakdown + unique-key check (keys shuffled)", n, t_hash, n / t_hash),
        ("per-row Python loop (breakdown_sample)", loop_rows, t_loop, rate_loop),
        ("bare formula loop, no validation (reference)", loop_rows, t_bare, loop_rows / t_bare),
    ]
    print(
        f"\nmixture A, {n:,} rows, one core, python {sys.version.split()[0]}, "
        f"numpy {np.__version__}, pyarrow {pa.__version__}, {os.cpu_count()} CPUs visible\n"
    )
    print("| path | rows | seconds | rows/s | × per-row loop |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, count, seconds, rate in rows:
        print(f"| {name} | {count:,} | {seconds:.2f} | {rate / 1e6:.2f} M | {rate / rate_loop:,.0f}× |")
    print(
        f"\nL_total over {n:,} rows: p50 {int(np.percentile(totals, 50)):,}, "
        f"p99 {int(np.percentile(totals, 99)):,}, max {int(totals.max()):,}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
