"""One epoch of BucketBatchSampler at 2M and 10M samples, and lhotse's DynamicBucketingSampler
at 2M in the same run.

Command (what docs/benchmarks.md's table comes from):

    .venv/bin/python benchmarks/bench_sampler.py          # needs `pip install -e '.[bench]'` for lhotse

Lengths and buckets (a 32-bucket plan of mixture A) are computed in a first process and saved;
each sampler then runs in its own process that loads them: peak memory is that process's
VmHWM (Python, numpy and torch included) and, apart, the peak above the RSS after the imports
and the load. tokenbucket: the sampler built and one epoch iterated (rank 0 of 1). lhotse: the
same lengths as cut durations (1 token = 10 ms), DynamicBucketingSampler with 32 buckets and
shuffling, one epoch; building its CutSet is reported apart.
"""

from __future__ import annotations

import json
import subprocess
import sys

PREPARE = """
import numpy as np, json
from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table, gpu_budget_bytes
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.testing import mixture_a
lengths = breakdown_table(mixture_a({n}, seed=0), TokenSpec(patch=14)).totals
plan = plan_buckets(lengths, CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM"), gpu_budget_bytes("H100-SXM"),
                    on_oversize="reject")
np.save({lengths_path!r}, lengths)
np.save({buckets_path!r}, plan.assign(lengths))
print(json.dumps(plan.batch_sizes.tolist()))
"""

_HWM = 'int([l for l in open("/proc/self/status") if l.startswith("{key}")][0].split()[1]) / 1024'

TOKENBUCKET = (
    """
import json, time
import numpy as np
from tokenbucket.train.sampler import BucketBatchSampler, plan_id_of
buckets = np.load({buckets_path!r})
base = """
    + _HWM.format(key="VmRSS")
    + """
start = time.perf_counter()
sampler = BucketBatchSampler(buckets, {sizes}, plan_id=plan_id_of("bench"), seed=0)
steps = len(sampler)
t_build = time.perf_counter() - start
start = time.perf_counter()
count = sum(1 for _ in sampler)
t_iter = time.perf_counter() - start
print(json.dumps({{"build": t_build, "iterate": t_iter, "batches": count, "peak_mib": """
    + _HWM.format(key="VmHWM")
    + """,
                  "base_mib": base}}))
"""
)

LHOTSE = (
    """
import json, time, warnings
warnings.simplefilter("ignore")
import numpy as np
from lhotse import CutSet
from lhotse.dataset.sampling import DynamicBucketingSampler
from lhotse.testing.dummies import dummy_cut
lengths = np.load({lengths_path!r})
base = """
    + _HWM.format(key="VmRSS")
    + """
start = time.perf_counter()
cuts = CutSet.from_cuts(dummy_cut(i, duration=float(l) / 100) for i, l in enumerate(lengths.tolist()))
t_cuts = time.perf_counter() - start
start = time.perf_counter()
sampler = DynamicBucketingSampler(cuts, max_duration=70_000 / 100 * 4, num_buckets=32, shuffle=True, seed=0)
count = sum(1 for _ in sampler)
t_all = time.perf_counter() - start
print(json.dumps({{"cuts": t_cuts, "epoch": t_all, "batches": count, "peak_mib": """
    + _HWM.format(key="VmHWM")
    + """,
                  "base_mib": base}}))
"""
)


def run(code: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    import importlib.util
    from pathlib import Path

    data = Path(__file__).parent / "_data"
    data.mkdir(exist_ok=True)
    rows = []
    lhotse = None
    for n in (2_000_000, 10_000_000):
        lengths_path, buckets_path = str(data / f"lengths_{n}.npy"), str(data / f"buckets_{n}.npy")
        sizes = run(PREPARE.format(n=n, lengths_path=lengths_path, buckets_path=buckets_path))
        r = run(TOKENBUCKET.format(buckets_path=buckets_path, sizes=sizes))
        rows.append((f"tokenbucket BucketBatchSampler, {n / 1e6:.0f}M", r))
        if n == 2_000_000:
            if importlib.util.find_spec("lhotse") is None:
                print("lhotse is not installed (pip install -e '.[bench]'); its row is skipped", file=sys.stderr)
            else:
                lhotse = run(LHOTSE.format(lengths_path=lengths_path))
                lhotse["build"], lhotse["iterate"] = 0.0, lhotse["epoch"]
                rows.append(("lhotse DynamicBucketingSampler, 2M", lhotse))
    print(
        "| sampler, samples | build epoch s | iterate epoch s | total s | batches | µs per batch "
        "| peak MiB | peak − imports MiB |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows:
        total = r["build"] + r["iterate"]
        print(
            f"| {name} | {r['build']:.2f} | {r['iterate']:.2f} | {total:.2f} | {int(r['batches']):,} | "
            f"{r['iterate'] / r['batches'] * 1e6:.1f} | {r['peak_mib']:,.0f} | {r['peak_mib'] - r['base_mib']:,.0f} |"
        )
    if lhotse is not None:
        tb = rows[0][1]
        print(
            f"\nat 2M samples: tokenbucket {lhotse['epoch'] / (tb['build'] + tb['iterate']):,.0f}x faster per epoch, "
            f"{(lhotse['peak_mib'] - lhotse['base_mib']) / (tb['peak_mib'] - tb['base_mib']):,.0f}x less memory "
            f"above the imports (lhotse's CutSet took {lhotse['cuts']:.1f} s more to build, not counted)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
