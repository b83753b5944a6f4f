"""The rank-balance gather's cost per step (NOTE [ Rank balance ]): 2 gloo CPU processes run the
same trivial steps under a monitor with ``rank_balance=False`` and ``True``, interleaved, and
the bare all-gather of two float64 numbers alone.

Command (what the NOTE's figure comes from):

    .venv/bin/python benchmarks/bench_rank_balance.py [--steps 2000] [--repeats 5] [--world 2]

Each configuration runs ``repeats`` times and the fastest run counts; a run starts after a
barrier, so both ranks start together. "off" is the monitor as one process runs it (no sink,
``perf_counter`` timing); "on" adds the gather and the balance sums; a bare barrier is the floor
of any collective on the machine. Reference, 2 processes on the shared 2-core VM under other
load (torch 2.13 CPU, gloo over loopback), 2,000 steps, best of 5, two runs:

    | configuration | us / step | overhead us / step |
    |---|---:|---:|
    | monitor, rank_balance=False | 2.4 / 2.3 | 0.0 |
    | monitor, rank_balance=True | 492.1 / 967.1 | 489.7 / 964.8 |
    | all_gather alone | 456.2 / 693.4 | - |
    | barrier alone | 344.8 / 355.6 | - |

The gather costs a collective's round trip (here one to three barriers); 3 processes on the same
2 cores: about 2 ms, the cores oversubscribed.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tokenbucket.monitor.hooks import BucketMonitor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_monitor import plan_and_batches


def _run(steps: int, balance: bool | str | None) -> float:
    plan, batches = plan_and_batches()
    dist.barrier()
    if balance == "barrier":  # the floor: a collective that moves no data
        start = time.perf_counter()
        for _ in range(steps):
            dist.barrier()
        return time.perf_counter() - start
    if balance is None:  # the collective alone
        mine = torch.zeros(2, dtype=torch.float64)
        parts = [torch.empty(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
        start = time.perf_counter()
        for _ in range(steps):
            dist.all_gather(parts, mine)
            torch.cat(parts).tolist()
        return time.perf_counter() - start
    monitor = BucketMonitor(plan, sinks=[], memory=None, rank_balance=bool(balance))
    start = time.perf_counter()
    for i in range(steps):
        batch = batches[i % len(batches)]
        with monitor.step(batch["info"], batch):
            pass
    return time.perf_counter() - start


def _worker(rank: int, world: int, port: int, steps: int, repeats: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    names: dict[str, bool | str | None] = {
        "monitor, rank_balance=False": False,
        "monitor, rank_balance=True": True,
        "all_gather alone": None,
        "barrier alone": "barrier",
    }
    best = dict.fromkeys(names, float("inf"))
    for _ in range(repeats):
        for name, balance in names.items():
            best[name] = min(best[name], _run(steps, balance))
    if rank == 0:
        off = best["monitor, rank_balance=False"] / steps * 1e6
        print(f"{world} gloo processes, {steps:,} steps, best of {repeats}\n")
        print("| configuration | us / step | overhead us / step |")
        print("|---|---:|---:|")
        for name, seconds in best.items():
            per = seconds / steps * 1e6
            print(f"| {name} | {per:.1f} | {f'{per - off:.1f}' if isinstance(names[name], bool) else '-'} |")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    mp.spawn(_worker, args=(args.world, port, args.steps, args.repeats), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
