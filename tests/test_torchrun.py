"""Plain DDP launched by the real ``torchrun`` (2 gloo processes): examples/torchrun_train.py trains
2 epochs; an elastic restart after a lost worker resumes from the last checkpoint exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torchrun_train.py"
sys.path.insert(0, str(ROOT / "examples"))
from torchrun_train import dataset  # noqa: E402


def torchrun(out: Path, *script_args: str, restarts: int = 0) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", str(restarts), str(EXAMPLE), str(out), *script_args]
    # restarts re-rendezvous on torchrun's shared store, whose keys from the lost attempt can send
    # a worker to a dead peer (pytorch/pytorch#135712): the documented switch gives each attempt its own
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def steps(out: Path) -> dict[int, list[dict[str, object]]]:
    return {r: [json.loads(x) for x in (out / f"steps-rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}


@pytest.mark.slow
def test_torchrun_two_epochs_every_sample_once_and_an_elastic_restart_resumes_exactly(tmp_path: Path) -> None:
    whole = torchrun(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    runs = steps(tmp_path / "whole")
    n = len(dataset()[0])
    assert len(runs[0]) == len(runs[1]) > 4  # equal steps on the two ranks
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for a, b in zip(runs[0], runs[1], strict=True):
        assert (a["epoch"], a["step"], a["bucket"]) == (b["epoch"], b["step"], b["bucket"])  # one bucket per step
        per_epoch[int(str(a["epoch"]))] += [*a["ids"], *b["ids"]]  # type: ignore[list-item]
    assert sorted(per_epoch) == [0, 1]
    for ids in per_epoch.values():
        assert sorted(ids) == list(range(n))  # every sample exactly once per epoch, across the ranks
    assert per_epoch[0] != per_epoch[1]  # epoch 2 reshuffled

    # rank 1 dies after epoch 1 step 3, one step past the checkpoint at step 2; torchrun restarts both
    lost = torchrun(tmp_path / "lost", "--fail-at", "1:3", restarts=1)
    assert lost.returncode == 0, lost.stderr[-2000:]
    again = steps(tmp_path / "lost")
    for r in (0, 1):
        first = [s for s in again[r] if s["attempt"] == 0]
        second = [s for s in again[r] if s["attempt"] == 1]
        assert (first[-1]["epoch"], first[-1]["step"]) == (1, 3)  # it died where it was told to
        assert (second[0]["epoch"], second[0]["step"]) == (1, 3)  # and redid the step after the checkpoint
        kept = [s for s in first if (s["epoch"], s["step"]) <= (1, 2)]  # what the checkpoint holds
        trained = [{**s, "attempt": 0} for s in kept + second]
        assert trained == runs[r]  # the same batches in the same order as if the run had never stopped
