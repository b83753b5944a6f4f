"""``tokenbucket plan`` killed with SIGKILL at random points (NOTE [ Safe output ]).

Invariants after every kill: ``--out`` holds the old manifest or the new one, and it verifies
(content hash, one row per input sample); the inputs are byte-identical; the next run leaves no
stray file in the directory.
"""

from __future__ import annotations

import hashlib
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tokenbucket.cli.main import main
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.testing import mixture_a

ROWS = 600_000  # about half a second of planning
KILLS = 12


def plan_argv(src: Path, out: Path) -> list[str]:
    return ["plan", str(src), "--gpu", "H100-SXM", "--on-oversize", "reject", "--out", str(out), "--json"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_crash_plan_killed_at_random_points_leaves_the_old_or_the_new_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(17)
    inputs = {name: tmp_path / f"{name}.parquet" for name in ("a", "b")}
    for seed, path in enumerate(inputs.values()):
        pq.write_table(mixture_a(ROWS, seed=seed), path)
    input_digests = {path: digest(path) for path in inputs.values()}
    out = tmp_path / "manifest.parquet"
    expected = {"a.parquet", "b.parquet", "manifest.parquet"}

    # each input planned once, start to finish, as a real process: the hashes, and the run time
    hashes, seconds = {}, []
    for name in ("a", "b"):
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "tokenbucket.cli.main", *plan_argv(inputs[name], out)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - start)
        hashes[name] = load_manifest(out).content_hash
    assert hashes["a"] != hashes["b"]  # so the old and the new manifest can be told apart
    run_s = max(seconds)
    write_s = _writing_starts(plan_argv(inputs["a"], out), tmp_path, expected)

    current = "b"
    killed = left_temporaries = 0
    for i in range(KILLS):
        new = "a" if current == "b" else "b"
        cmd = [sys.executable, "-m", "tokenbucket.cli.main", *plan_argv(inputs[new], out)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 2:
            time.sleep(rng.uniform(0, run_s))
        else:  # every other kill inside the write: once its temporary is seen, a little later
            _wait_for_temporary(proc, tmp_path, expected)
            time.sleep(rng.uniform(0, 0.3 * max(run_s - write_s, 0.01)))
        proc.send_signal(signal.SIGKILL)  # no-op when it already finished
        proc.wait()
        killed += proc.returncode == -signal.SIGKILL

        m = load_manifest(out)  # verifies the content hash of every column and the plan
        assert len(m) == ROWS
        if proc.returncode == 0:
            assert m.content_hash == hashes[new]
        else:
            assert m.content_hash in (hashes[current], hashes[new])
        left_temporaries += any(p.name not in expected for p in tmp_path.iterdir())

        # the next run (to completion) removes what the killed one left
        assert main(plan_argv(inputs[new], out)) == 0
        capsys.readouterr()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
        assert load_manifest(out).content_hash == hashes[new]
        current = new

    assert {path: digest(path) for path in inputs.values()} == input_digests
    # the kills did land mid-run, some of them while the manifest was being written
    assert killed >= KILLS // 4 and left_temporaries >= 1, (killed, left_temporaries)


def _writing_starts(argv: list[str], folder: Path, expected: set[str]) -> float:
    """Seconds from a run's start until its temporary appears (the write begins), by polling."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tokenbucket.cli.main", *argv], stdout=subprocess.DEVNULL)
    seen = None
    while proc.poll() is None and seen is None:
        if any(p.name not in expected for p in folder.iterdir()):
            seen = time.perf_counter() - start
        time.sleep(0.002)
    proc.wait()
    assert proc.returncode == 0 and seen is not None, "the run wrote no temporary beside --out"
    return seen


def _wait_for_temporary(proc: subprocess.Popen[bytes], folder: Path, expected: set[str]) -> None:
    """Until the run has put a temporary beside ``--out`` (or ended)."""
    while proc.poll() is None and not any(p.name not in expected for p in folder.iterdir()):
        time.sleep(0.002)
