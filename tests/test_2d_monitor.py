"""A 2D run (buckets bounding L_total and image tokens) through the monitor, ``tokenbucket report``
and ``tokenbucket inspect --plot`` (NOTE [ The 2D report grid ], NOTE [ Two-dimensional buckets ]).

The plan is :func:`plan_buckets_2d` over a hand-made mixture for Qwen2-VL-2B on an H100: short and
long samples, each text-only or with images (224 px: 256 image tokens each), which it cuts into
two length bands of two image-token levels. The loop runs on the CPU with a fake clock and a fake
memory reader; the log it writes is what the report reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket._exceptions import PlanDriftWarning
from tokenbucket.cli.inspect_ import bucket_rectangles, plan_figure
from tokenbucket.cli.main import main
from tokenbucket.cost.hf_model import StagedModel
from tokenbucket.cost.staged import StagedCostModel, TrainSetup
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.monitor._grid import bucket_grid, format_grid
from tokenbucket.monitor.hooks import BucketMonitor, split_batch
from tokenbucket.monitor.report import read_events, run_grid, write_report
from tokenbucket.monitor.stats import format_summary, summarize_events
from tokenbucket.plan.bucket_plan import Bucket, BucketPlan
from tokenbucket.plan.buckets_2d import plan_buckets_2d
from tokenbucket.plan.manifest import Manifest, build_manifest
from tokenbucket.testing import RandomTokens
from tokenbucket.train.collate import BucketCollate, TokenBucketDataset

from .test_monitor import TICK, FakeClock, FakeMemory
from .test_plots import png_size
from .test_report import _write

GIB = 2**30
BUDGET = 70 * GIB
SPEC = TokenSpec(patch=14)  # a 224 px image is 16 x 16 = 256 tokens, Qwen2-VL's at its default image
COST = StagedLengthModel(StagedCostModel(StagedModel.preset("qwen2-vl-2b"), TrainSetup(loop="dropped"), gpu="H100-SXM"))
HIDDEN = 8
SAMPLES = 120  # the loop's; the manifest has one more, too long to fit even alone (rejected)


def _metadata() -> pa.Table:
    rng = np.random.default_rng(0)
    kind = np.arange(SAMPLES) % 4  # short text, short with an image, long text, long with 10 images
    cameras = np.select([kind == 1, kind == 3], [1, 10], 0)
    text = np.select(
        [kind == 0, kind == 1, kind == 2],
        [rng.integers(100, 500, SAMPLES), rng.integers(50, 200, SAMPLES), rng.integers(2000, 3000, SAMPLES)],
        rng.integers(100, 400, SAMPLES),
    )
    cameras, text = np.append(cameras, 0), np.append(text, 400_000)  # the oversize row
    n = SAMPLES + 1
    return pa.table(
        {
            "key": [f"s{i:03d}" for i in range(n)],
            "cameras": cameras,
            "frames": np.ones(n, np.int64),
            "height": np.full(n, 224),
            "width": np.full(n, 224),
            "text_tokens": text,
        }
    )


@pytest.fixture(scope="module")
def meta() -> pa.Table:
    return _metadata()


@pytest.fixture(scope="module")
def plan(meta: pa.Table) -> BucketPlan:
    result = breakdown_table(meta, SPEC)
    lengths = result.totals.astype(np.int64)
    vision = result.table.column("vision").to_numpy().astype(np.int64)
    plan = plan_buckets_2d(lengths, vision, COST, BUDGET, max_buckets=4, on_oversize="reject")
    # the scenario the tests need: two bands of two levels, one of them text only, and a rejected sample
    assert plan.two_d and len(set(plan.bounds.tolist())) == 2 and 0 in plan.vision_bounds.tolist()  # type: ignore[union-attr]
    assert len(plan.buckets) == 4 and plan.oversize["count"] == 1
    return plan


def _run(plan: BucketPlan, meta: pa.Table, path: Path, *, factor: float = 1.0) -> tuple[BucketMonitor, list[Any]]:
    """One epoch of the plan's batches through a monitor; every step measures ``factor`` x its prediction."""
    kept = meta.slice(0, SAMPLES)
    lengths = breakdown_table(kept, SPEC).totals
    data = TokenBucketDataset(RandomTokens(lengths, HIDDEN), metadata=kept, spec=SPEC, plan=plan)
    collate = BucketCollate(data)
    memory = FakeMemory()
    memory.factor = factor
    monitor = BucketMonitor(plan, sinks=[path], memory=memory, clock=FakeClock(), cost_model=COST)
    infos = []
    for idx in data.sampler(seed=0):
        batch = collate([data[i] for i in idx])
        memory.predicted = batch["info"].predicted_peak_bytes
        with monitor.step(batch["info"], batch):
            pass
        infos.append(batch["info"])
    return monitor, infos


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run_log(plan: BucketPlan, meta: pa.Table, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run2d") / "run.jsonl"
    monitor, _ = _run(plan, meta, path)
    monitor.close()
    return path


# -- the monitor -------------------------------------------------------------------------------


def test_monitor_2d_start_event_lists_both_bounds_of_every_bucket(plan: BucketPlan, run_log: Path) -> None:
    start = _events(run_log)[0]
    assert start["event"] == "start"
    assert [(b["bucket"], b["bound"], b["vision_bound"], b["batch_size"]) for b in start["buckets"]] == [
        (k, b.bound, b.vision_bound, b.batch_size) for k, b in enumerate(plan.buckets)
    ]


def test_monitor_1d_start_event_has_no_vision_bound(tmp_path: Path) -> None:
    plan = BucketPlan("static", 2**20, (Bucket(64, 2, 4, 2, 200, 256, 2**19, 0.5, 0.8, 0.01),))
    BucketMonitor(plan, sinks=[tmp_path / "run.jsonl"], memory=None).close()
    (bucket,) = _events(tmp_path / "run.jsonl")[0]["buckets"]
    assert set(bucket) == {"bucket", "bound", "batch_size", "predicted_peak_bytes"}


def test_monitor_2d_steps_and_summary_rows_carry_both_bounds(plan: BucketPlan, run_log: Path) -> None:
    log = _events(run_log)
    steps = [e for e in log if e["event"] == "step"]
    assert {e["bucket"] for e in steps} == set(range(len(plan.buckets)))  # every bucket ran
    for e in steps:
        b = plan.buckets[e["bucket"]]
        assert (e["length"], e["vision_bound"]) == (b.bound, b.vision_bound)
        # FLOPs and seconds at the bucket's image-token bound, not at the worst sample of its length
        assert e["flops"] == pytest.approx(float(COST.flops(e["rows"], b.bound, b.vision_bound).training))
        assert e["predicted_s"] == pytest.approx(COST.step_seconds(e["rows"], b.bound, b.vision_bound))
    text_only = next(e for e in steps if e["vision_bound"] == 0)
    assert text_only["flops"] < float(COST.flops(text_only["rows"], text_only["length"]).training)
    (summary,) = [e for e in log if e["event"] == "summary"]
    rows = summary["buckets"]
    assert [(r["bucket"], r["bound"], r["vision_bound"]) for r in rows] == [
        (k, b.bound, b.vision_bound) for k, b in enumerate(plan.buckets)
    ]
    assert summarize_events(log) == rows  # the report rebuilds the monitor's own rows
    # the two buckets of a band share their length bound: only the image-token bound tells them apart
    assert len({r["bound"] for r in rows}) < len({(r["bound"], r["vision_bound"]) for r in rows}) == len(rows)


def test_monitor_2d_recalibration_suggests_batch_sizes_at_both_bounds(
    plan: BucketPlan, meta: pa.Table, tmp_path: Path
) -> None:
    with pytest.warns(PlanDriftWarning):
        monitor, _ = _run(plan, meta, tmp_path / "run.jsonl", factor=1.25)
    rec = monitor.recalibration()
    monitor.close()
    assert rec is not None and rec["factor"] == 1.25
    budget = rec["budget_bytes"]
    suggested = {k: v["suggested"] for k, v in rec["batch_sizes"].items()}
    assert suggested == {k: COST.max_batch(b.bound, budget, b.vision_bound) for k, b in enumerate(plan.buckets)}
    # by length alone (every token an image token) the text-only buckets would get less
    assert any(suggested[k] > COST.max_batch(b.bound, budget) for k, b in enumerate(plan.buckets))


def test_monitor_2d_refuses_a_cost_model_without_image_tokens(plan: BucketPlan, tmp_path: Path) -> None:
    length_only = CostModel(ModelSpec(hidden=8, layers=1, heads=2))
    with pytest.raises(ConfigError, match=r"2D plan.*vision=.*CostModel"):
        BucketMonitor(plan, sinks=[tmp_path / "run.jsonl"], cost_model=length_only)  # type: ignore[arg-type]
    assert not (tmp_path / "run.jsonl").exists()  # refused before the log is started


def test_split_batch_2d_parts_are_predicted_at_the_image_token_bound(plan: BucketPlan, meta: pa.Table) -> None:
    kept = meta.slice(0, SAMPLES)
    data = TokenBucketDataset(
        RandomTokens(breakdown_table(kept, SPEC).totals, HIDDEN), metadata=kept, spec=SPEC, plan=plan
    )
    collate = BucketCollate(data)
    batch = next(
        b for b in (collate([data[i] for i in idx]) for idx in data.sampler(seed=0)) if len(b["info"].keys) > 2
    )
    info = batch["info"]
    for part in split_batch(batch, 2, cost_model=COST):
        p = part["info"]
        assert p.vision_bound == info.vision_bound
        expected = COST.memory(len(p.keys), p.shape[1], min(info.vision_bound, p.shape[1])).total
        assert p.predicted_peak_bytes == expected


# -- tokenbucket report ----------------------------------------------------------------------


def _grid_lines(out: str) -> list[str]:
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("2D buckets:"))
    return lines[first : first + 2 + 2]  # caption, heading, one line per length bound (two here)


def test_cli_report_2d_table_and_grid_show_both_bounds(
    plan: BucketPlan, run_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(run_log)]) == 0
    out = capsys.readouterr().out
    # the per-bucket table: bucket, bound, images, steps first
    head, *body = out.split("\n\n")[0].splitlines()
    assert head.split()[:4] == ["bucket", "bound", "images", "steps"]
    rows = [line.split() for line in body]
    assert [(int(r[0]), r[1], r[2]) for r in rows] == [
        (k, f"{b.bound:,}", f"{b.vision_bound:,}") for k, b in enumerate(plan.buckets)
    ]
    # the grid: a column per image-token bound, a row per length bound, each bucket in its cell
    caption, heading, *grid = _grid_lines(out)
    assert "length bound" in caption and "image-token bound" in caption and "measured peak" in caption
    visions = sorted(set(plan.vision_bounds.tolist()))  # type: ignore[union-attr]
    assert [c.strip() for c in heading.split("|")[1:]] == [f"{v:,}" for v in visions]
    assert [line.split("|")[0].strip() for line in grid] == [f"{u:,}" for u in sorted(set(plan.bounds.tolist()))]
    steps = {r["bucket"]: r["steps"] for r in summarize_events(_events(run_log))}
    for k, b in enumerate(plan.buckets):
        line = grid[sorted(set(plan.bounds.tolist())).index(b.bound)]
        cell = line.split("|")[1 + visions.index(b.vision_bound)].strip()
        word = "step" if steps[k] == 1 else "steps"
        assert cell.startswith(f"#{k} {steps[k]} {word} {TICK * 1e3:.1f} ms "), cell
        assert cell.endswith(f"{b.predicted_peak_bytes / BUDGET:.0%}")
    assert f"events: {sum(steps.values())} steps" in out


def test_cli_report_2d_json_has_the_grid(plan: BucketPlan, run_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    grid = data["grid"]
    assert grid["length_bounds"] == sorted(set(plan.bounds.tolist()))
    assert grid["vision_bounds"] == sorted(set(plan.vision_bounds.tolist()))  # type: ignore[union-attr]
    assert grid["peak"] == "measured" and grid["budget_bytes"] == BUDGET  # the fake reader measured the prediction
    placed = {
        (grid["length_bounds"][i], grid["vision_bounds"][j]): cell
        for i, row in enumerate(grid["cells"])
        for j, cell in enumerate(row)
        if cell is not None
    }
    assert {(u, v): c["bucket"] for (u, v), c in placed.items()} == {
        (b.bound, b.vision_bound): k for k, b in enumerate(plan.buckets)
    }
    for c in placed.values():
        b = plan.buckets[c["bucket"]]
        assert c["peak_fraction"] == pytest.approx(b.predicted_peak_bytes / BUDGET)
        assert c["latency_p50_s"] == pytest.approx(TICK, rel=0.005)
    assert [(r["bound"], r["vision_bound"]) for r in data["buckets"]] == [
        (b.bound, b.vision_bound) for b in plan.buckets
    ]


def test_cli_report_1d_output_has_no_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "run.jsonl", truncated=False)
    assert main(["report", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "grid" not in data and all("vision_bound" not in r for r in data["buckets"])
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2D buckets" not in out and out.splitlines()[0].split()[:2] == ["bucket", "steps"]
    assert run_grid(read_events(path)) is None


def test_bucket_grid_blank_where_no_bucket_and_says_when_a_bucket_never_ran() -> None:
    bounds = {0: (512, 0), 1: (512, 256), 2: (2048, 1024)}
    rows = [
        {"bucket": 0, "steps": 3, "latency_p50_s": 0.02, "predicted_peak_bytes": GIB, "measured_peak_bytes": GIB // 2},
        {"bucket": 2, "steps": 1, "latency_p50_s": 0.5, "predicted_peak_bytes": GIB, "measured_peak_bytes": None},
    ]
    grid = bucket_grid(bounds, rows, 2 * GIB)
    assert grid is not None and grid["peak"] == "measured"  # the run measured memory: every cell says measured
    assert [[c and c["bucket"] for c in row] for row in grid["cells"]] == [[0, 1, None], [None, None, 2]]
    assert grid["cells"][0][0]["peak_fraction"] == 0.25 and grid["cells"][1][2]["peak_fraction"] is None
    lines = format_grid(grid).splitlines()
    assert [c.strip() for c in lines[1].split("|")] == ["L_total \\ images", "0", "256", "1,024"]
    assert len(lines[1]) == len(lines[3])  # the columns line up (the last line ends in a cell)
    cells = [[c.strip() for c in line.split("|")[1:]] for line in lines[2:]]
    assert cells == [["#0 3 steps 20.0 ms 25%", "#1 no steps", ""], ["", "", "#2 1 step 500.0 ms -"]]
    assert bucket_grid({}, rows, GIB) is None


@pytest.mark.slow
def test_write_report_2d_page_holds_the_grid(run_log: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    files = write_report(read_events(run_log), tmp_path / "report", progress=False)
    page = files.html.read_text()
    assert "2D buckets: a row per length bound" in page and "<th>L_total \\ images</th>" in page
    assert page.count("<table>") == 2 and "<th>vision bound</th>" in page


def _start_line(buckets: list[dict[str, Any]]) -> str:
    return json.dumps({"event": "start", "time": 0.0, "budget_bytes": GIB, "buckets": buckets}) + "\n"


@pytest.mark.parametrize(
    ("bucket", "message"),
    [
        (
            {"bucket": 1, "bound": 512},
            "buckets[1] has no 'vision_bound' (a 2D plan bounds every bucket's image tokens)",
        ),
        ({"bucket": 1, "bound": 512, "vision_bound": -256}, "buckets[1]['vision_bound'] should be an integer >= 0"),
        ({"bucket": 1, "vision_bound": 256}, "buckets[1] has no 'bound'"),
    ],
    ids=["missing", "negative", "no-bound"],
)
def test_cli_report_2d_start_with_a_bad_bucket_fails_in_one_line(
    run_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], bucket: dict[str, Any], message: str
) -> None:
    lines = run_log.read_text().splitlines(keepends=True)
    path = tmp_path / "bad.jsonl"
    path.write_text(_start_line([{"bucket": 0, "bound": 512, "vision_bound": 0}, bucket]) + "".join(lines[1:]))
    assert main(["report", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith(f"tokenbucket report: error: run log {str(path)!r} line 1: the start event's ")
    assert message in err


def test_format_summary_2d_rows_name_both_bounds() -> None:
    row = {
        "bucket": 0, "bound": 4096, "vision_bound": 2560, "steps": 2, "latency_p50_s": 0.01,
        "latency_p95_s": 0.01, "latency_max_s": 0.01, "tokens_per_s": 10.0, "padding_efficiency": 0.5,
        "predicted_peak_bytes": GIB, "measured_peak_bytes": None, "max_risk": 0.5, "drift_ratio": None, "ooms": 0,
    }  # fmt: skip
    head, line = format_summary([row]).splitlines()
    assert head.split()[:3] == ["bucket", "bound", "images"] and line.split()[:3] == ["0", "4,096", "2,560"]
    one_d = {k: v for k, v in row.items() if k not in ("bound", "vision_bound")}
    assert format_summary([one_d]).splitlines()[0].split()[:2] == ["bucket", "steps"]


# -- tokenbucket inspect --plot ----------------------------------------------------------------


@pytest.fixture(scope="module")
def manifest(plan: BucketPlan, meta: pa.Table, tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    tmp = tmp_path_factory.mktemp("manifest2d")
    pq.write_table(meta, tmp / "metadata.parquet")
    return build_manifest(
        tmp / "metadata.parquet", SPEC, plan, tmp / "manifest.parquet", on_oversize="reject", progress=False
    )


def test_bucket_rectangles_span_the_band_and_the_level_below() -> None:
    def b(u: int, v: int) -> Bucket:
        return Bucket(u, 1, 0, 0, 0, 0, 0, 0.0, 1.0, 0.0, vision_bound=v)

    plan = BucketPlan("static", 1, (b(448, 0), b(448, 256), b(2961, 0), b(2961, 1024), b(2961, 2560)))
    assert bucket_rectangles(plan) == [
        (0, 448, 0, 0),
        (0, 448, 0, 256),
        (448, 2961, 0, 0),
        (448, 2961, 0, 1024),
        (448, 2961, 1024, 2560),
    ]
    with pytest.raises(ConfigError, match="2D plan"):
        bucket_rectangles(BucketPlan("static", 1, (Bucket(64, 1, 0, 0, 0, 0, 0, 0.0, 1.0, 0.0),)))


def test_plan_figure_2d_histogram_rectangles_and_rejected(manifest: Manifest) -> None:
    pytest.importorskip("matplotlib")
    from tokenbucket.monitor.report import pyplot

    plan = manifest.plan
    bucket = manifest.table.column("bucket").to_numpy()
    fig = plan_figure(manifest)
    try:
        samples, memory, _colorbar = fig.axes
        assert samples.get_xlabel() == "L_total (tokens)" and samples.get_ylabel() == "image tokens"
        # the 2D histogram counts every sample in a bucket, once
        (mesh,) = [
            c
            for c in samples.collections
            if hasattr(c, "get_array") and c.get_array() is not None and c.get_array().ndim == 2
        ]
        assert int(np.ma.sum(mesh.get_array())) == int((bucket >= 0).sum()) == SAMPLES
        # one rectangle per bucket, where bucket_rectangles puts it
        boxes = [(p.get_x(), p.get_x() + p.get_width(), p.get_y(), p.get_y() + p.get_height()) for p in samples.patches]
        assert boxes == [tuple(float(v) for v in r) for r in bucket_rectangles(plan)]
        legend = [t.get_text() for t in samples.get_legend().get_texts()]
        assert "rejected (1)" in legend and "buckets" in legend
        # right: the predicted peaks, labelled by both bounds
        (bars,) = memory.containers
        assert [p.get_height() for p in bars] == pytest.approx([b.predicted_peak_bytes / GIB for b in plan.buckets])
        assert [t.get_text() for t in memory.get_xticklabels()] == [
            f"{b.bound:,}/{b.vision_bound:,}" for b in plan.buckets
        ]
    finally:
        pyplot().close(fig)


def test_cli_inspect_2d_plot_writes_a_png(
    manifest: Manifest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "plan.png"
    assert main(["inspect", str(manifest.path), "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"plot written to {path}" in out and "images" in out  # the plan table names both bounds
    assert png_size(path) == (1320, 550)  # 12 x 5 inches at 110 dpi
    assert 10_000 < path.stat().st_size < 400_000


def test_cli_inspect_2d_plot_into_a_missing_folder_fails_in_one_line(
    manifest: Manifest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    code = main(["inspect", str(manifest.path), "--json", "--plot", str(tmp_path / "nowhere" / "plan.png")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("tokenbucket inspect: error: ") and "nowhere" in err
