"""Static-shape warm-up: each bucket shape compiled once, largest peak first, then no recompile.

Everything runs for real on the CPU: a one-layer transformer compiled with
``torch.compile(backend="aot_eager", dynamic=False)`` (a new shape is a recompile), trained
through the real sampler, ``BucketCollate`` and ``DataLoader``. Dynamo is reset around each test,
and its recompile limit raised (a dynamic plan meets more shapes than the default 8).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch._dynamo
from torch.utils.data import DataLoader

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.testing import RandomTokens, ToyDenoiser, metadata_of_lengths
from tokenbucket.train.collate import BucketCollate, TokenBucketDataset
from tokenbucket.train.warmup import WarmupRecord, compile_count, warm_up, warmup_order

HIDDEN = 32
SPEC = TokenSpec(patch=14)  # one 14 px camera frame is one token; a sample's L_total is 1 + its text
COST = CostModel(ModelSpec(hidden=HIDDEN, layers=1, heads=4, precision="fp32", attention="eager"))
# 8 MiB: three buckets (64, 31), (160, 5), (224, 3) whose predicted peaks put bucket 2 before bucket 1
BUDGET = 8 * 2**20
LENGTHS = np.random.default_rng(0).integers(8, 200, 48)

Batch = dict[str, Any]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test compiles from nothing, with room for every shape a dynamic plan makes."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64):
        yield
    torch._dynamo.reset()


def setup(mode: str = "static") -> tuple[TokenBucketDataset, DataLoader[Batch]]:
    table = metadata_of_lengths(LENGTHS)
    lengths = breakdown_table(table, SPEC).totals
    assert lengths.tolist() == LENGTHS.tolist()
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=3, multiple=32, on_oversize="reject", mode=mode)  # type: ignore[arg-type]
    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=table, spec=SPEC, plan=plan)
    loader: DataLoader[Batch] = DataLoader(
        data, batch_sampler=data.sampler(seed=0), collate_fn=BucketCollate(data, cost_model=COST)
    )
    return data, loader


def compiled_step(update: bool = False) -> tuple[Callable[[Batch], float], Callable[[], int]]:
    """A fresh model's train step through ``torch.compile`` (forward + backward, the optimizer
    step when ``update``), and a function giving the shapes it has seen."""
    torch.manual_seed(0)
    model = ToyDenoiser(HIDDEN)
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    shapes: set[tuple[int, ...]] = set()

    def step(batch: Batch) -> float:
        shapes.add(tuple(batch["tokens"].shape))
        loss = compiled(batch["tokens"], batch["attention_mask"])
        loss.backward()
        if update:
            opt.step()
        model.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step, lambda: len(shapes)


def make_batch(batch_size: int, bound: int) -> Batch:
    """A dummy batch with the collate's tensors: float tokens, a boolean mask."""
    return {
        "tokens": torch.randn(batch_size, bound, HIDDEN),
        "attention_mask": torch.ones(batch_size, bound, dtype=torch.bool),
    }


def frames_for_one_shape() -> int:
    """What a fresh compile of one shape of the toy step takes, in :func:`compile_count` frames."""
    torch._dynamo.reset()
    step, _ = compiled_step()
    before = compile_count()
    step(make_batch(2, 32))
    frames = compile_count() - before
    torch._dynamo.reset()
    return frames


def train(
    step: Callable[[Batch], float], data: TokenBucketDataset, loader: DataLoader[Batch], epochs: int
) -> list[int]:
    """Frames compiled in each epoch of a run through the real sampler and collate."""
    sampler = loader.batch_sampler
    per_epoch = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # type: ignore[union-attr]
        before = compile_count()
        for batch in loader:
            assert np.isfinite(step(batch))
        per_epoch.append(compile_count() - before)
    return per_epoch


def test_compile_count_grows_when_a_fresh_function_compiles() -> None:
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    f = torch.compile(double, backend="aot_eager", dynamic=False)
    start = compile_count()
    f(torch.ones(3))
    first = compile_count()
    f(torch.ones(3))
    same = compile_count()
    f(torch.ones(4))
    assert first - start >= 1
    assert same == first  # the same shape runs the cached code
    assert compile_count() - same >= 1  # a new shape under dynamic=False recompiles
    torch._dynamo.reset()
    assert compile_count() >= same + 1  # a reset clears the caches, not the count


def test_compile_count_does_not_import_dynamo() -> None:
    code = (
        "import sys; from tokenbucket.train.warmup import compile_count; "
        "print(compile_count(), 'torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False"]


@pytest.mark.slow
def test_warm_up_compiles_each_bucket_shape_once_largest_peak_first() -> None:
    data, _ = setup()
    plan = data.plan
    assert len(plan.buckets) == 3
    one_shape = frames_for_one_shape()
    assert one_shape >= 1

    step, shapes = compiled_step()
    records = warm_up(step, plan, make_batch)
    peaks = [b.predicted_peak_bytes for b in plan.buckets]
    expected = sorted(range(len(peaks)), key=lambda k: -peaks[k])
    assert expected != list(range(len(peaks)))  # the fixture's plan: largest first is not the plan order
    assert [r.bucket for r in records] == expected
    assert [r.predicted_peak_bytes for r in records] == sorted(peaks, reverse=True)
    assert [(r.batch_size, r.bound) for r in records] == [
        (plan.buckets[k].batch_size, plan.buckets[k].bound) for k in expected
    ]
    assert [r.compiles for r in records] == [one_shape] * len(records)
    assert all(r.seconds > 0 for r in records)
    assert shapes() == len(plan.buckets)

    again = warm_up(step, plan, make_batch, order="plan")
    assert [r.bucket for r in again] == [0, 1, 2]
    assert [r.compiles for r in again] == [0, 0, 0]  # every shape is compiled already


def test_static_run_after_warm_up_compiles_nothing_in_two_epochs() -> None:
    data, loader = setup()
    plan = data.plan
    step, _ = compiled_step(update=True)
    records = warm_up(step, plan, make_batch)
    assert sum(r.compiles for r in records) > 0

    seen: list[tuple[tuple[int, ...], int]] = []
    collate = loader.collate_fn

    def watch(batch: list[tuple[int, Any]]) -> Batch:
        out: Batch = collate(batch)
        seen.append((tuple(out["attention_mask"].shape), int(out["row_mask"].sum())))
        return out

    loader.collate_fn = watch
    assert train(step, data, loader, epochs=2) == [0, 0]

    shapes = {(b.batch_size, b.bound) for b in plan.buckets}
    assert {shape for shape, _ in seen} == shapes  # every batch at its bucket's full shape
    assert any(real < shape[0] for shape, real in seen)  # partial batches too, padded with empty rows
    assert sum(real for _, real in seen) == 2 * len(LENGTHS)


@pytest.mark.slow  # ~15 s: every dynamic batch shape compiles
def test_dynamic_plan_recompiles_in_training_and_warm_up_refuses_it() -> None:
    data, loader = setup("dynamic")
    with pytest.raises(ConfigError, match="static plan") as caught:
        warm_up(lambda batch: None, data.plan, make_batch)
    assert "\n" not in str(caught.value) and "mode='dynamic'" in str(caught.value)

    one_shape = frames_for_one_shape()
    step, shapes = compiled_step(update=True)
    per_epoch = train(step, data, loader, epochs=2)
    # each new (rows, longest) shape is a recompile, epoch 2 included: more shapes than buckets
    assert sum(per_epoch) == shapes() * one_shape, per_epoch
    assert shapes() > len(data.plan.buckets)
    assert sum(per_epoch) > 0


@pytest.mark.parametrize(
    ("mode", "order", "match"),
    [
        ("packed", "largest_first", "static plan"),
        ("static", "smallest_first", "order should be one of"),
    ],
)
def test_warm_up_refuses_a_plan_or_order_it_cannot_warm(mode: str, order: str, match: str) -> None:
    plan = BucketPlan(mode=mode, budget_bytes=BUDGET, buckets=setup()[0].plan.buckets)
    calls: list[object] = []
    with pytest.raises(ConfigError, match=match) as caught:
        warm_up(calls.append, plan, make_batch, order=order)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
    assert calls == []  # nothing ran


def test_warm_up_runs_uncompiled_steps_in_order_and_names_the_failing_bucket() -> None:
    plan = setup()[0].plan
    calls: list[tuple[int, int]] = []

    def step(batch: Batch) -> None:
        calls.append(tuple(batch["attention_mask"].shape))

    records = warm_up(step, plan, make_batch, order="plan")
    assert calls == [(b.batch_size, b.bound) for b in plan.buckets]
    assert records == [
        WarmupRecord(k, b.batch_size, b.bound, b.predicted_peak_bytes, r.seconds, 0)
        for k, (b, r) in enumerate(zip(plan.buckets, records, strict=True))
    ]
    assert warmup_order(plan) == [r.bucket for r in warm_up(step, plan, make_batch)]

    def oom(batch: Batch) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    first = warmup_order(plan)[0]
    with pytest.raises(torch.OutOfMemoryError) as caught:
        warm_up(oom, plan, make_batch)
    if sys.version_info >= (3, 11):
        assert f"bucket {first} (batch {plan.buckets[first].batch_size} x" in caught.value.__notes__[0]
