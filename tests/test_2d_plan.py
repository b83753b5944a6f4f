"""2D buckets (NOTE [ Two-dimensional buckets ]): the planner's DP against brute force, every sample
in one bucket or rejected, memory at both bounds, 2D never slower than 1D on the same grid, the
manifest and the CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tokenbucket import ConfigError, OversizeError, breakdown_table, gpu_budget_bytes
from tokenbucket.cli.main import main as cli_main
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import Sample, StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.bucket_plan import BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.buckets_2d import _solve, plan_buckets_2d, sorted_oracle
from tokenbucket.plan.manifest import build_manifest, load_manifest
from tokenbucket.testing import mixture_tv
from tokenbucket.tokens.hf import token_spec_from_hf
from tokenbucket.train.warmup import warm_up

BUDGET = gpu_budget_bytes("H100-SXM")


@pytest.fixture(scope="module")
def staged() -> StagedCostModel:
    return StagedCostModel(StagedModel.preset("qwen2-vl-2b"), gpu="H100-SXM")


@pytest.fixture(scope="module")
def workload(staged: StagedCostModel) -> tuple[np.ndarray, np.ndarray]:
    assert staged.config is not None
    result = breakdown_table(mixture_tv(3000, seed=2), token_spec_from_hf(staged.config))
    return result.totals.astype(np.int64), result.table.column("vision").to_numpy().astype(np.int64)


def test_every_sample_in_one_bucket_or_rejected_and_each_fits_at_its_bounds(
    staged: StagedCostModel, workload: tuple[np.ndarray, np.ndarray]
) -> None:
    lengths, vision = workload
    cost = StagedLengthModel(staged)
    plan = plan_buckets_2d(lengths, vision, cost, BUDGET, max_buckets=10, on_oversize="reject")
    assert plan.two_d and 1 < len(plan.buckets) <= 10
    where = plan.assign(lengths, vision)
    s = plan.summary()
    assert s["samples"] + s["rejected"] == len(lengths) == int((where >= 0).sum()) + s["rejected"]
    assert [b.samples for b in plan.buckets] == np.bincount(where[where >= 0], minlength=len(plan.buckets)).tolist()
    assert s["over_budget_batches"] == 0
    for k, b in enumerate(plan.buckets):
        members = where == k
        assert (lengths[members] <= b.bound).all() and (vision[members] <= b.vision_bound).all()
        assert b.predicted_peak_bytes <= BUDGET < cost.memory(b.batch_size + 1, b.bound, b.vision_bound).total
        # the bucket's worst sample is at least any member's own (l, v): memory grows with both
        heaviest = int(np.argmax(np.where(members, vision * 4 + lengths, -1)))
        assert cost.memory(b.batch_size, int(lengths[heaviest]), int(vision[heaviest])).total <= b.predicted_peak_bytes
    # rejected samples are those that fit not even alone
    for i in np.flatnonzero(where < 0)[:20].tolist():
        assert cost.memory(1, int(lengths[i]), int(vision[i])).total > BUDGET


@pytest.mark.slow
def test_2d_is_never_slower_than_1d_and_beats_the_share_priced_plan(
    staged: StagedCostModel, workload: tuple[np.ndarray, np.ndarray]
) -> None:
    lengths, vision = workload
    cost = StagedLengthModel(staged)
    kw = {"max_buckets": 8, "on_oversize": "reject"}
    two = plan_buckets_2d(lengths, vision, cost, BUDGET, **kw).summary()["predicted_epoch_seconds"]
    one = plan_buckets_2d(lengths, vision, cost, BUDGET, max_levels=1, **kw).summary()["predicted_epoch_seconds"]
    assert two <= one + 1e-9
    kept = plan_buckets_2d(lengths, vision, cost, BUDGET, **kw).assign(lengths, vision) >= 0
    share = float((vision[kept] / lengths[kept]).max())
    flat = plan_buckets(
        lengths[kept], StagedLengthModel(staged, vision_share=share), BUDGET, max_buckets=8, on_oversize="reject"
    )
    # the whole point: long text priced as images fits not even alone in 1D, and the rest is slower
    assert flat.summary()["rejected"] > 0
    assert two < flat.summary()["predicted_epoch_seconds"]
    oracle = sorted_oracle(lengths[kept], vision[kept], cost, BUDGET)
    assert oracle["batches"] > 0 and oracle["predicted_epoch_seconds"] < two  # no shape limit, own maxima


def _brute_force(
    cl: np.ndarray, cv: np.ndarray, bsz: np.ndarray, step: np.ndarray, a_of: np.ndarray, c_of: np.ndarray, k: int
) -> float:
    """The best guillotine plan of at most ``k`` buckets, by enumerating every band split and level set."""
    best = np.inf
    na, nc = len(cl), len(cv)
    for n_bands in range(1, min(k, na) + 1):
        for ends in itertools.combinations(range(na - 1), n_bands - 1):
            bands = list(zip((-1, *ends), (*ends, na - 1), strict=True))
            options = []
            for lo, hi in bands:
                members = (a_of > lo) & (a_of <= hi)
                band = []
                for n_levels in range(1, nc + 1):
                    for tops in itertools.combinations(range(nc), n_levels):
                        if members.any() and tops[-1] < c_of[members].max():
                            continue
                        cost, prev = 0.0, -1
                        for q in tops:
                            n = int((members & (c_of > prev) & (c_of <= q)).sum())
                            if n and bsz[hi, q] == 0:
                                cost = np.inf
                            elif n:
                                cost += np.ceil(n / bsz[hi, q]) * step[hi, q]
                            prev = q
                        band.append((n_levels, cost))
                options.append(band)
            for choice in itertools.product(*options):
                if sum(n for n, _ in choice) <= k:
                    best = min(best, sum(c for _, c in choice))
    return float(best)


@pytest.mark.parametrize("seed", range(6))
def test_dp_matches_brute_force_on_small_grids(seed: int) -> None:
    rng = np.random.default_rng(seed)
    na, nc, k = 4, 3, int(rng.integers(1, 5))
    cl, cv = np.arange(1, na + 1) * 100, np.arange(nc) * 30
    # batch sizes shrink with both counts; steps grow with both (a cost model's shape)
    bsz = np.maximum(0, 12 - 2 * np.arange(na)[:, None] - 3 * np.arange(nc)[None, :] + rng.integers(0, 2, (na, nc)))
    step = 1.0 + np.arange(na)[:, None] * 0.5 + np.arange(nc)[None, :] * 0.7 + rng.random((na, nc)) * 0.1
    n = 60
    a_of, c_of = rng.integers(0, na, n), rng.integers(0, nc, n)
    a_of[0], c_of[0] = na - 1, 0  # the longest sample sits in the top band
    bsz[:, 0] = np.maximum(bsz[:, 0], 1)  # text-only samples fit in every band
    expected = _brute_force(cl, cv, bsz, step, a_of, c_of, k)
    try:
        bounds, vbounds, sizes = _solve(cl, cv, bsz, step, a_of, c_of, k, k)
    except ConfigError:
        assert not np.isfinite(expected)
        return
    # the plan the DP returns costs what brute force finds best
    got = 0.0
    taken = np.zeros(n, dtype=bool)
    for u, v, b in zip(bounds, vbounds, sizes, strict=True):
        a, c = int(np.searchsorted(cl, u)), int(np.searchsorted(cv, v))
        mine = ~taken & (a_of <= a) & (c_of <= c)
        taken |= mine
        got += np.ceil(mine.sum() / b) * step[a, c] if mine.any() else 0.0
    assert taken.all() and len(bounds) <= k
    assert got == pytest.approx(expected)


def test_bad_inputs_are_one_line_errors(staged: StagedCostModel) -> None:
    cost = StagedLengthModel(staged)
    with pytest.raises(ConfigError, match=r"vision\[1\]=900 > lengths\[1\]=800"):
        plan_buckets_2d([100, 800], [0, 900], cost, BUDGET)
    with pytest.raises(ConfigError, match="one value per sample"):
        plan_buckets_2d([100, 800], [0], cost, BUDGET)
    with pytest.raises(ConfigError, match="max_levels"):
        plan_buckets_2d([100], [0], cost, BUDGET, max_levels=0)
    with pytest.raises(OversizeError, match="image tokens") as info:
        plan_buckets_2d([100, 60_000], [0, 50_000], cost, BUDGET)
    assert "\n" not in str(info.value)
    no_tower = dataclasses.replace(StagedModel.preset("qwen2-vl-2b"), model_type="qwen2", vision=(), projector=None)
    text = StagedLengthModel(StagedCostModel(no_tower), vision_share=0.0)
    with pytest.raises(ConfigError, match="needs a vision tower"):
        plan_buckets_2d([100], [50], text, BUDGET)
    plan = plan_buckets_2d([100, 800], [0, 512], cost, BUDGET, max_buckets=2)
    with pytest.raises(ConfigError, match="pass vision="):
        plan.assign([100])


def test_plan_json_round_trip_and_1d_json_unchanged(staged: StagedCostModel) -> None:
    cost = StagedLengthModel(staged)
    plan = plan_buckets_2d([300, 3000, 3000], [0, 0, 2900], cost, BUDGET, max_buckets=3)
    back = BucketPlan.from_json(plan.to_json())
    assert back == plan and back.two_d and back.vision_bounds is not None
    assert back.vision_bounds.tolist() == [b.vision_bound for b in plan.buckets]
    flat = plan_buckets([300, 3000], StagedLengthModel(staged, vision_share=0.0), BUDGET, max_buckets=2)
    assert "vision_bound" not in flat.to_json() and not flat.two_d and flat.vision_bounds is None


def test_manifest_of_a_2d_plan_keeps_every_row(tmp_path: Path, staged: StagedCostModel) -> None:
    assert staged.config is not None
    spec = token_spec_from_hf(staged.config)
    src = tmp_path / "meta.parquet"
    pq.write_table(mixture_tv(800, seed=4), src)
    manifest = build_manifest(
        src, spec, StagedLengthModel(staged), tmp_path / "m.parquet", budget_bytes=BUDGET, max_buckets=6,
        on_oversize="reject", two_d=True,
    )  # fmt: skip
    plan = load_manifest(tmp_path / "m.parquet").plan
    assert plan.two_d and len(plan.buckets) <= 6
    t = manifest.table
    bucket = t.column("bucket").to_numpy()
    assert len(bucket) == 800 and ((bucket >= 0) | (t.column("reason").is_valid().to_numpy())).all()
    kept = bucket >= 0
    total, vision = t.column("total").to_numpy(), t.column("vision").to_numpy()
    assert (plan.assign(total[kept], vision[kept]) == bucket[kept]).all()
    assert manifest.summary()["samples"] == plan.summary()["samples"] == int(kept.sum())
    with pytest.raises(ConfigError, match="static or dynamic"):  # (2D dynamic: test_2d_dynamic_manifest.py)
        build_manifest(src, spec, StagedLengthModel(staged), tmp_path / "d.parquet", budget_bytes=BUDGET,
                       mode="packed", two_d=True)  # fmt: skip


def test_cli_plan_buckets_2d(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "meta.parquet"
    pq.write_table(mixture_tv(600, seed=5), src)
    out = tmp_path / "m.parquet"
    argv = ["plan", str(src), "--preset", "qwen2-vl-2b", "--gpu", "h100-sxm", "--buckets", "2d", "--max-buckets", "6"]
    assert cli_main([*argv, "--out", str(out), "--on-oversize", "reject", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all("vision_bound" in b for b in data["buckets"]) and load_manifest(out).plan.two_d
    assert cli_main([*argv, "--out", str(out), "--on-oversize", "reject"]) == 0
    text = capsys.readouterr().out
    assert "images" in text.splitlines()[0] and "its own image-token bound" in text
    for extra, message in (
        (["--calibration", str(tmp_path / "c.json")], "drop --calibration"),
        (["--engine", "ray"], "drop --engine ray"),
        (["--vision-share", "0.5"], "drop --vision-share"),
    ):
        assert cli_main([*argv, "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert cli_main(["plan", str(src), "--gpu", "h100-sxm", "--buckets", "2d", "--out", str(out)]) == 2
    assert "needs a model with a vision tower" in capsys.readouterr().err


def test_warm_up_hands_a_2d_bucket_its_image_token_bound(staged: StagedCostModel) -> None:
    plan = plan_buckets_2d(
        [300, 3000, 3000, 2000], [0, 0, 2900, 1024], StagedLengthModel(staged), BUDGET, max_buckets=4
    )
    asked: list[tuple[int, ...]] = []

    def make_batch(*shape: int) -> tuple[int, ...]:
        asked.append(shape)
        return shape

    records = warm_up(lambda batch: None, plan, make_batch, order="plan")
    assert asked == [(b.batch_size, b.bound, b.vision_bound) for b in plan.buckets]
    assert [r.vision_bound for r in records] == [b.vision_bound for b in plan.buckets]


def test_2d_buckets_count_a_clip_in_the_image_token_dimension(tmp_path: Path, staged: StagedCostModel) -> None:
    """Qwen2-VL feeds a camera of several frames as one clip: the manifest's vision column (the
    second dimension) is the clips' LLM tokens, each sample at or under its bucket's image-token
    bound, and a sample fits at its bucket's batch as the clips it is (NOTE [ Frames are images ])."""
    assert staged.config is not None
    src = tmp_path / "meta.parquet"
    table = mixture_tv(400, seed=6)
    assert (table.column("frames").to_numpy() > 1).any()
    pq.write_table(table, src)
    build_manifest(
        src, token_spec_from_hf(staged.config), StagedLengthModel(staged), tmp_path / "m.parquet",
        budget_bytes=BUDGET, max_buckets=6, on_oversize="reject", two_d=True,
    )  # fmt: skip
    m = load_manifest(tmp_path / "m.parquet")
    rows = {r["key"]: r for r in table.to_pylist()}
    clips = 0
    for key, bucket, vision in zip(*(m.table.column(c).to_pylist() for c in ("key", "bucket", "vision")), strict=True):
        r = rows[key]
        if not r["cameras"] or bucket < 0:
            continue
        sample = Sample.video(cameras=r["cameras"], frames=r["frames"], height=r["height"], width=r["width"],
                              text_tokens=r["text_tokens"])  # fmt: skip
        assert vision == staged.sample_vision(sample).llm_tokens <= m.plan.buckets[bucket].vision_bound
        assert staged.memory(m.plan.buckets[bucket].batch_size, sample).peak_bytes <= BUDGET
        clips += r["frames"] > 1
    assert clips > 20
