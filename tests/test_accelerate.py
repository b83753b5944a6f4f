"""Accelerate: a 2-process gloo run (loader built after / before the ``Accelerator``), every sample
once per epoch, equal steps, one bucket per step across ranks, a new order in epoch 2, and an exact
mid-epoch resume through ``save_state`` / ``load_state``; the double-split check; the tracker sink."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pytest.importorskip("accelerate")

from accelerate import Accelerator

from tests._dist import free_port, spawn
from tokenbucket import ConfigError
from tokenbucket.train.accelerate import check_not_resharded, prepare_loader, tracker_sink
from tokenbucket.train.batch import Batch
from tokenbucket.train.sampler import BucketBatchSampler, plan_id_of

N = 203  # samples; 4 buckets of batch sizes 4, 5, 3, 6 -> uneven tails, empty rows
BUCKETS = [i % 4 for i in range(N)]
SIZES = [4, 5, 3, 6]
PLAN_ID = plan_id_of("accelerate")
STOP = 7  # the resumed run saves after this many steps of epoch 1


class Indices(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def collate(ids: list[int]) -> Batch:
    return Batch(ids=torch.tensor(ids), x=torch.tensor(ids, dtype=torch.float32)[:, None] / N)


def bucket_of(i: int) -> int:
    return BUCKETS[i] if i < N else i - N  # an empty row (index N + bucket) names its bucket


def _loader() -> DataLoader[Any]:
    sampler = BucketBatchSampler(BUCKETS, SIZES, plan_id=PLAN_ID, seed=4)
    return DataLoader(Indices(), batch_sampler=sampler, collate_fn=collate)


def _worker(rank: int, port: int, out: str, before: bool, ckpt: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ["WORLD_SIZE"] = "2"
    early = _loader() if before else None  # built before the Accelerator, as user code often is
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2
    raw = early if early is not None else _loader()
    sampler = raw.batch_sampler
    assert isinstance(sampler, BucketBatchSampler)
    model = torch.nn.Linear(1, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optim = accelerator.prepare(model, optim)
    wrapped = accelerator.prepare(raw)  # the plain way splits again: caught
    try:
        check_not_resharded(wrapped)
        caught = ""
    except ConfigError as exc:
        caught = str(exc)
    try:  # the ordinary path, as accelerate's documentation teaches it: refused at its first batch
        first_batch = f"trained on {next(iter(wrapped))['ids'].tolist()}"
    except ConfigError as exc:
        first_batch = str(exc)
    assert (sampler.epoch, sampler.step) == (0, 0)  # the refusal moved nothing
    loader = prepare_loader(accelerator, wrapped)  # unwraps it and prepares it right
    record: dict[str, Any] = {"caught": caught, "first_batch": first_batch, "epochs": [], "resumed": []}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        steps = []
        for step, batch in enumerate(loader):
            steps.append(batch["ids"].tolist())
            loss = model(batch["x"]).pow(2).mean()
            accelerator.backward(loss)
            optim.step()
            optim.zero_grad()
            if epoch == 1 and step + 1 == STOP:
                accelerator.save_state(ckpt)
        record["epochs"].append(steps)
    # as a restarted run: a new Accelerator, model, optimizer, loader and sampler; load_state
    # continues epoch 1 at step STOP
    again = Accelerator(cpu=True)
    model2 = torch.nn.Linear(1, 1)
    again.prepare(model2, torch.optim.SGD(model2.parameters(), lr=0.1))
    fresh = _loader()
    loader2 = prepare_loader(again, fresh)
    again.load_state(ckpt)
    assert fresh.batch_sampler.epoch == 1  # type: ignore[union-attr]
    record["resumed"] = [b["ids"].tolist() for b in loader2]  # no set_epoch: the counter must not reset it
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()
    accelerator.end_training()


@pytest.mark.slow
@pytest.mark.parametrize("before", [False, True], ids=["loader-after", "loader-before"])
def test_accelerate_gloo_two_ranks_every_sample_once_and_exact_resume(tmp_path: Path, before: bool) -> None:
    spawn(_worker, args=(free_port(), str(tmp_path), before, str(tmp_path / "ckpt")), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert "prepare_loader(accelerator, loader)" in r["caught"]
        assert "split the tokenbucket batch sampler again over 2 processes" in r["first_batch"]
        assert "prepare_loader(accelerator, loader)" in r["first_batch"] and "\n" not in r["first_batch"]
    for epoch in (0, 1):
        per_rank = [r["epochs"][epoch] for r in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) > STOP  # equal steps
        real = [i for batches in per_rank for b in batches for i in b if i < N]
        assert sorted(real) == list(range(N))  # every sample exactly once
        for a, b in zip(*per_rank, strict=True):
            assert len({bucket_of(i) for i in a + b}) == 1  # one bucket per step across ranks
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]  # epoch 2 reshuffled
    for r in ranks:
        assert r["resumed"] == r["epochs"][1][STOP:]  # exact: the rest of epoch 1, nothing twice


def test_prepare_loader_refuses_a_plain_batch_sampler_and_leaves_files(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("x")
    before = kept.stat().st_mtime_ns
    accelerator = Accelerator(cpu=True)
    plain = DataLoader(Indices(), batch_size=4)
    with pytest.raises(ConfigError, match=r"prepare_loader needs a DataLoader\(batch_sampler=\.\.\.\).*BatchSampler"):
        prepare_loader(accelerator, plain)
    assert kept.stat().st_mtime_ns == before and kept.read_text() == "x"


def test_prepare_loader_one_process_every_sample_once_and_resume_across_epochs() -> None:
    accelerator = Accelerator(cpu=True)
    raw = _loader()
    loader = prepare_loader(accelerator, raw, checkpoint=False)
    sampler = raw.batch_sampler
    assert isinstance(sampler, BucketBatchSampler)
    first = [b["ids"].tolist() for b in loader]  # no set_epoch: accelerate's counter drives it
    assert sorted(i for b in first for i in b if i < N) == list(range(N))
    state = sampler.state_dict()  # epoch 0 done
    second = [b["ids"].tolist() for b in loader]
    assert second != first and sampler.epoch == 1
    resumed_raw = _loader()
    resumed_raw.batch_sampler.load_state_dict(state)  # type: ignore[union-attr]
    again = [b["ids"].tolist() for b in prepare_loader(accelerator, resumed_raw, checkpoint=False)]
    assert again == second  # a done epoch resumes at the next one, not back at 0


def test_tracker_sink_logs_step_numbers_on_the_main_process() -> None:
    logged: list[tuple[dict[str, float], object]] = []

    class Fake:
        is_main_process = True

        def log(self, values: dict[str, float], step: int | None = None) -> None:
            logged.append((values, step))

    fake = Fake()
    sink = tracker_sink(fake)
    sink({"event": "step", "step": 3, "bucket": 2, "latency_s": 0.5, "measured_bytes": None, "rows": 4})
    sink({"event": "drift", "step": 4, "bucket": 2, "ratio": 1.3})
    sink({"event": "start", "buckets": []})
    assert logged == [
        (
            {
                "tokenbucket/latency_s": 0.5,
                "tokenbucket/bucket2/latency_s": 0.5,
                "tokenbucket/rows": 4.0,
                "tokenbucket/bucket2/rows": 4.0,
            },
            3,
        ),
        ({"tokenbucket/drift": 1.0}, 4),
    ]
    fake.is_main_process = False
    sink({"event": "step", "step": 5, "bucket": 0, "rows": 1})
    assert len(logged) == 2  # other ranks log nothing
