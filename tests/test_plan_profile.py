"""``tokenbucket plan --profile``: plans whose memory comes from a measured profile.

One real ``tokenbucket profile ... --save`` (a one-layer, 64-wide eager ReferenceTransformer,
batches 1/2/4 at 256 and 512 tokens: six points, about five seconds) serves the module; each
test copies it. Invariants: every planned batch's peak, by the profile's fit, is under the
budget; batch sizes are the profile's, step times the analytic model's; the manifest names the
profile by the SHA-256 of its bytes; every refusal is one line naming --profile and the file,
with exit 1 (the file) or 2 (flags), and leaves every file as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbucket.cli.main import main
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.cost.profile import MeasuredCostModel, Profile, ProfiledCostModel
from tokenbucket.plan._search import SupportsCost
from tokenbucket.plan.buckets import plan_from_bounds
from tokenbucket.plan.manifest import load_manifest

MODEL_FLAGS = ("--hidden", "64", "--layers", "1", "--heads", "2", "--attention", "eager")
SPEC = ModelSpec(hidden=64, layers=1, heads=2, attention="eager")
BUDGET_GIB = "0.5"
BUDGET = int(0.5 * 2**30)
ROWS = 400


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--quiet", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder``: its SHA-256 and mtime (what a refusal must leave alone)."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def write_metadata(path: Path, texts: np.ndarray) -> np.ndarray:
    """One 224² frame (256 tokens at patch 14) plus ``texts`` text tokens per row; returns the totals."""
    n = len(texts)
    pq.write_table(
        pa.table(
            {
                "key": [f"s{i:05d}" for i in range(n)],
                "cameras": np.ones(n, np.int64),
                "frames": np.ones(n, np.int64),
                "height": np.full(n, 224, np.int64),
                "width": np.full(n, 224, np.int64),
                "text_tokens": texts.astype(np.int64),
            }
        ),
        path,
    )
    return 256 + texts.astype(np.int64)


def plan_args(metadata: Path, out: Path, *extra: str) -> list[str]:
    return [
        "plan",
        str(metadata),
        "--patch",
        "14",
        "--text",
        "text_tokens",
        *MODEL_FLAGS,
        "--gpu",
        "H100-SXM",
        "--budget-gib",
        BUDGET_GIB,
        "--out",
        str(out),
        "--json",
        *extra,
    ]


@pytest.fixture(scope="module")
def saved_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    argv = ["--quiet", "profile", "tokenbucket.cost.reference:ReferenceTransformer", *MODEL_FLAGS]
    argv += ["--batch", "4", "--length", "256", "--length", "512", "--gpu", "h100-sxm", "--save", str(path), "--json"]
    assert main(argv) == 0
    return path


@pytest.fixture()
def work(tmp_path: Path, saved_profile: Path) -> tuple[Path, Path, np.ndarray]:
    """(profile copy, metadata of ROWS rows of 256..512 tokens, their totals) in ``tmp_path``."""
    profile = tmp_path / "profile.json"
    shutil.copyfile(saved_profile, profile)
    totals = write_metadata(tmp_path / "meta.parquet", np.random.default_rng(0).integers(0, 257, ROWS))
    return profile, tmp_path / "meta.parquet", totals


def test_plan_profile_saved_by_the_profile_command_names_its_gpu(saved_profile: Path) -> None:
    prof = Profile.load(saved_profile)
    # --gpu h100-sxm is saved as the registry's name, so plan --gpu matches it however it is typed
    assert prof.target == "H100-SXM" and prof.dtype == "bf16" and prof.device == "fake-cpu"
    assert sorted((b, n) for b, n, _ in prof.points) == [(b, n) for b in (1, 2, 4) for n in (256, 512)]
    assert prof.lengths == (256, 512)


def test_plan_profile_every_batch_under_budget_and_manifest_names_the_profile(
    capsys: pytest.CaptureFixture[str], work: tuple[Path, Path, np.ndarray]
) -> None:
    profile, metadata, totals = work
    before = profile.read_bytes()
    out = profile.parent / "manifest.parquet"
    code, text, err = run(capsys, *plan_args(metadata, out, "--profile", str(profile)))
    assert code == 0, err
    data = json.loads(text)
    measured = MeasuredCostModel(Profile.load(profile))
    analytic = CostModel(SPEC, "H100-SXM")
    assert data["budget_bytes"] == BUDGET and data["summary"]["over_budget_batches"] == 0
    for b in data["buckets"]:
        # batch sizes and peaks are the profile's fit, under the budget; step times the analytic model's
        assert b["batch_size"] == measured.max_batch(b["bound"], BUDGET) > 0
        assert b["predicted_peak_bytes"] == measured.memory(b["batch_size"], b["bound"]).total <= BUDGET
        assert measured.memory(b["batch_size"] + 1, b["bound"]).total > BUDGET  # and the largest that fits
        assert b["step_seconds"] == pytest.approx(analytic.step_seconds(b["batch_size"], b["bound"]))
    assert sum(b["samples"] for b in data["buckets"]) == ROWS  # no sample went missing
    manifest = load_manifest(out)
    assert len(manifest) == ROWS and manifest.summary()["rejected"] == 0
    recorded = manifest.meta["meta"]["profile"]
    prof = Profile.load(profile)
    assert recorded["sha256"] == hashlib.sha256(before).hexdigest()
    assert {k: recorded[k] for k in ("model", "target", "dtype", "torch_version", "path")} == {
        "model": prof.model,
        "target": "H100-SXM",
        "dtype": "bf16",
        "torch_version": prof.torch_version,
        "path": str(profile),
    }
    assert recorded["lengths"] == [256, 512] and recorded["points"] == 6
    assert manifest.meta["meta"]["gpu"] == "H100-SXM" and manifest.meta["meta"]["model"]["hidden"] == 64
    assert profile.read_bytes() == before
    assert int(totals.max()) <= 512  # (the plan stayed within the measured range)


def test_plan_profile_differs_from_the_analytic_plan_only_in_batch_sizes(
    capsys: pytest.CaptureFixture[str], work: tuple[Path, Path, np.ndarray]
) -> None:
    # What is asserted: (1) the analytic plan of the same spec takes its batch sizes from the
    # analytic model and the profile plan from the profile's fit; (2) with the profile plan's
    # bounds, the analytic model gives the same buckets (bounds, samples, tokens) and the same
    # batch size exactly where the two models' largest batches agree; (3) the two models of one
    # spec agree within 10 % (fake-tensor measurement vs the formulas) but not everywhere, so
    # the profile is what decided the batch sizes.
    profile, metadata, totals = work
    code, text, err = run(capsys, *plan_args(metadata, profile.parent / "p.parquet", "--profile", str(profile)))
    assert code == 0, err
    with_profile = json.loads(text)
    code, text, err = run(capsys, *plan_args(metadata, profile.parent / "a.parquet"))
    assert code == 0, err
    analytic_plan = json.loads(text)
    measured = MeasuredCostModel(Profile.load(profile))
    analytic = CostModel(SPEC, "H100-SXM")
    for b in analytic_plan["buckets"]:
        assert b["batch_size"] == analytic.max_batch(b["bound"], BUDGET)
    bounds = [b["bound"] for b in with_profile["buckets"]]
    same_bounds = plan_from_bounds(
        bounds, [analytic.max_batch(u, BUDGET) for u in bounds], totals, analytic, BUDGET, meta={}
    )
    for mine, theirs in zip(with_profile["buckets"], same_bounds.buckets, strict=True):
        assert (mine["bound"], mine["samples"]) == (theirs.bound, theirs.samples)
        ours, formula = measured.max_batch(mine["bound"], BUDGET), analytic.max_batch(mine["bound"], BUDGET)
        assert mine["batch_size"] == ours and theirs.batch_size == formula
        assert (mine["batch_size"] == theirs.batch_size) == (ours == formula)
        assert abs(ours / formula - 1) < 0.10
    assert any(measured.max_batch(u, BUDGET) != analytic.max_batch(u, BUDGET) for u in range(256, 513, 64))


def test_plan_profile_dynamic_mode_fills_batches_from_the_profile(
    capsys: pytest.CaptureFixture[str], work: tuple[Path, Path, np.ndarray]
) -> None:
    profile, metadata, _ = work
    out = profile.parent / "dynamic.parquet"
    code, text, err = run(capsys, *plan_args(metadata, out, "--profile", str(profile), "--mode", "dynamic"))
    assert code == 0, err
    data = json.loads(text)
    assert data["mode"] == "dynamic" and data["summary"]["over_budget_batches"] == 0
    assert sum(b["samples"] for b in data["buckets"]) == ROWS
    manifest = load_manifest(out)
    assert manifest.plan.mode == "dynamic" and manifest.meta["meta"]["profile"]["target"] == "H100-SXM"
    # what the sampler is given at training time: the profile's model answers the planner's questions
    cost: SupportsCost = ProfiledCostModel(MeasuredCostModel(Profile.load(profile)), CostModel(SPEC, "H100-SXM"))
    assert cost.max_batch(512, BUDGET) == MeasuredCostModel(Profile.load(profile)).max_batch(512, BUDGET)


def test_plan_profile_fake_cpu_profile_holds_for_any_gpu(
    capsys: pytest.CaptureFixture[str], work: tuple[Path, Path, np.ndarray]
) -> None:
    profile, metadata, _ = work
    data = json.loads(profile.read_text())
    profile.write_text(json.dumps({**data, "target": "fake-cpu"}))
    argv = plan_args(metadata, profile.parent / "m.parquet", "--profile", str(profile))
    argv[argv.index("H100-SXM")] = "a100-80"
    code, text, err = run(capsys, *argv)
    assert code == 0, err
    assert json.loads(text)["summary"]["over_budget_batches"] == 0


def _edit(data: dict[str, Any], **changes: object) -> str:
    """``data`` as JSON with ``changes`` (a key changed to None is dropped)."""
    return json.dumps({k: v for k, v in {**data, **changes}.items() if v is not None})


Rewrite = Callable[[dict[str, Any]], str]

# name -> (how to rewrite the profile JSON, extra plan flags, exit status, what the message says)
REFUSALS: dict[str, tuple[Rewrite, tuple[str, ...], int, str]] = {
    "other_gpu": (lambda d: _edit(d, target="A100-80GB"), (), 1, "was made for 'A100-80GB', not for 'H100-SXM'"),
    "not_json": (lambda d: "{not json", (), 1, "is not JSON"),
    "not_an_object": (lambda d: "[1, 2, 3]", (), 1, "should be a JSON object, but holds a list"),
    "other_format": (lambda d: _edit(d, format=2), (), 1, "should be profile format 1, but has format=2"),
    "missing_key": (lambda d: _edit(d, dtype=None), (), 1, "has no 'dtype' key"),
    "bad_point": (lambda d: _edit(d, points=[[1, 256]]), (), 1, "points[0] should be [batch, length, peak bytes]"),
    "two_points": (
        lambda d: _edit(d, points=d["points"][:2]),
        (),
        1,
        "needs at least 3 points, but --profile",
    ),
    "one_length": (
        lambda d: _edit(d, points=[p for p in d["points"] if p[1] == 256]),
        (),
        1,
        "needs points at 2 or more lengths",
    ),
    "other_precision": (lambda d: json.dumps(d), ("--precision", "fp32"), 1, "was measured in bf16"),
    "packed": (lambda d: json.dumps(d), ("--mode", "packed"), 2, "--profile cannot plan --mode packed"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_plan_profile_refusal_is_one_line_and_writes_nothing(
    case: str, capsys: pytest.CaptureFixture[str], work: tuple[Path, Path, np.ndarray]
) -> None:
    profile, metadata, _ = work
    out = profile.parent / "manifest.parquet"
    code, _, err = run(capsys, *plan_args(metadata, out, "--profile", str(profile)))
    assert code == 0, err  # an existing manifest at --out: a refusal must not replace it
    rewrite, flags, status, message = REFUSALS[case]
    profile.write_text(rewrite(json.loads(profile.read_text())))
    before = snapshot(profile.parent)
    code, text, err = run(capsys, *plan_args(metadata, out, "--profile", str(profile), *flags))
    assert code == status and text == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert message in err and "--profile" in err
    if status == 1:  # the file is named (a usage error names the flags)
        assert repr(str(profile)) in err
    assert snapshot(profile.parent) == before


def test_plan_profile_missing_file_is_one_line(
    capsys: pytest.CaptureFixture[str], work: tuple[Path, Path, np.ndarray]
) -> None:
    profile, metadata, _ = work
    before = snapshot(profile.parent)
    missing = profile.parent / "nope.json"
    code, text, err = run(capsys, *plan_args(metadata, profile.parent / "m.parquet", "--profile", str(missing)))
    assert code == 1 and text == "" and len(err.strip().splitlines()) == 1
    assert f"--profile {str(missing)!r} cannot be read: No such file or directory" in err
    assert snapshot(profile.parent) == before


@pytest.mark.parametrize(("longest", "needed", "rounded"), [(600, 600, 640), (500, 512, 512), (520, 520, 576)])
def test_plan_profile_bound_past_the_measured_lengths_is_refused(
    longest: int, needed: int, rounded: int, capsys: pytest.CaptureFixture[str], work: tuple[Path, Path, np.ndarray]
) -> None:
    # NOTE [ A profile is not extrapolated ]: measured up to 512 tokens, the plan may not need more
    profile, metadata, _ = work
    texts = np.random.default_rng(1).integers(0, 200, ROWS)
    texts[7] = longest - 256
    totals = write_metadata(metadata, texts)
    assert int(totals.max()) == longest
    before = snapshot(profile.parent)
    code, text, err = run(capsys, *plan_args(metadata, profile.parent / "m.parquet", "--profile", str(profile)))
    if longest <= 512:  # 500 rounds up to the bound 512: still measured
        assert code == 0, err
        assert max(b["bound"] for b in json.loads(text)["buckets"]) == needed
        return
    assert code == 1 and text == "" and len(err.strip().splitlines()) == 1
    assert (
        f"--profile {str(profile)!r} measured lengths 256..512 tokens, but the plan needs {needed:,}; "
        f"its fit is not extrapolated: profile again up to a length of {rounded:,} or more (bounds are rounded up "
        f"to multiples of 64)"
    ) in err
    assert snapshot(profile.parent) == before
    # the same refusal with --on-oversize reject: a guess is not a reason to drop a sample either
    code, _, err = run(
        capsys, *plan_args(metadata, profile.parent / "m.parquet", "--profile", str(profile), "--on-oversize", "reject")
    )
    assert code == 1 and "is not extrapolated" in err
    assert snapshot(profile.parent) == before


def test_plan_profile_save_needs_two_lengths_and_a_known_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    head = ("profile", "tokenbucket.cost.reference:ReferenceTransformer", *MODEL_FLAGS, "--save")
    code, _, err = run(capsys, *head, str(tmp_path / "p.json"), "--length", "256", "--length", "256")
    assert code == 2 and "--save needs two or more --length values" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, *head, str(tmp_path / "p.json"), "--length", "256", "--length", "512", "--gpu", "h999")
    assert code == 2 and "--gpu" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
