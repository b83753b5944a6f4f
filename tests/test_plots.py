"""The pictures: ``inspect --plot`` (the length histogram and bucket bounds beside each bucket's
predicted peak against the budget) and the report's per-bucket plot (``buckets.png``).

Each figure is checked as a matplotlib object (its bars, lines and legend), not as pixels, and
each PNG the CLI writes is checked to be a PNG of the figure's size.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbucket._exceptions import ConfigError
from tokenbucket.cli.inspect_ import plan_figure
from tokenbucket.cli.main import main
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.monitor.report import REPORT_FILES, RunLog, bucket_figure, pyplot, read_events, report_figures
from tokenbucket.plan.manifest import Manifest, build_manifest, load_manifest
from tokenbucket.testing import mixture_a
from tokenbucket.tokens.spec import TokenSpec

from .test_report import LATENCIES, _events

pytest.importorskip("matplotlib")

GIB = 2**30
ROWS = 4000
INVALID_ROW = 7  # made invalid (negative frames): rejected with no length


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's width and height in pixels (from its IHDR chunk); fails if it is no PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """Mixture A at a 40 GiB budget: some samples fit not even alone (rejected), one row invalid."""
    tmp = tmp_path_factory.mktemp("plots")
    table = mixture_a(ROWS, seed=3)
    frames = table.column("frames").to_pylist()
    frames[INVALID_ROW] = -1
    table = table.set_column(table.schema.get_field_index("frames"), "frames", pa.array(frames))
    pq.write_table(table, tmp / "metadata.parquet")
    cost = CostModel(ModelSpec.preset("design-24L-1024"))
    return build_manifest(
        tmp / "metadata.parquet",
        TokenSpec(patch=14),
        cost,
        tmp / "manifest.parquet",
        budget_bytes=40 * GIB,
        on_oversize="reject",
        on_invalid="reject",
        progress=False,
    )


def _legend(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _horizontal_lines(ax: Any) -> list[float]:
    """The y of every horizontal line drawn across the axes (axhline)."""
    return [float(line.get_ydata()[0]) for line in ax.get_lines() if len(set(line.get_ydata())) == 1]


# -- inspect --plot --------------------------------------------------------------------------------


def test_plan_figure_histogram_bounds_rejected_and_peaks_against_the_budget(manifest: Manifest) -> None:
    plan = manifest.plan
    bucket = manifest.table.column("bucket").to_numpy()
    has_length = manifest.table.column("total").is_valid().to_numpy(zero_copy_only=False)
    oversize = int(((bucket < 0) & has_length).sum())
    assert oversize > 0 and not has_length[INVALID_ROW]  # the fixture has both kinds of rejected rows
    fig = plan_figure(manifest)
    try:
        lengths, memory = fig.axes
        # left: one vertical line per bucket bound, at the bound
        verticals = [line.get_xdata()[0] for line in lengths.get_lines() if len(set(line.get_xdata())) == 1]
        assert sorted(verticals) == [b.bound for b in plan.buckets]
        assert lengths.get_xscale() == "log"
        # kept and rejected samples are two histograms; every sample with a length is in one of them
        kept_bars, rejected_bars = lengths.containers
        assert sum(p.get_height() for p in kept_bars) == int((bucket >= 0).sum())
        assert sum(p.get_height() for p in rejected_bars) == oversize
        assert {p.get_facecolor()[:3] for p in rejected_bars} != {p.get_facecolor()[:3] for p in kept_bars}
        legend = _legend(lengths)
        assert f"rejected ({oversize:,})" in legend and "invalid rows, no length (1)" in legend
        # right: one bar per bucket at its predicted peak, and the budget as a horizontal line
        (bars,) = memory.containers
        assert len(bars) == len(plan.buckets)
        heights = [p.get_height() for p in bars]
        assert heights == pytest.approx([b.predicted_peak_bytes / GIB for b in plan.buckets])
        assert _horizontal_lines(memory) == pytest.approx([plan.budget_bytes / GIB])
        assert max(heights) <= plan.budget_bytes / GIB  # every bucket fits
    finally:
        pyplot().close(fig)


def test_cli_inspect_plot_writes_a_png_of_the_figure(
    manifest: Manifest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = manifest.path.read_bytes()
    path = tmp_path / "plan.png"
    assert main(["inspect", str(manifest.path), "--plot", str(path), "--quiet"]) == 0
    assert f"plot written to {path}" in capsys.readouterr().out
    assert png_size(path) == (1320, 440)  # 12 x 4 inches at 110 dpi
    assert 10_000 < path.stat().st_size < 400_000
    assert manifest.path.read_bytes() == before  # the manifest is only read
    assert len(load_manifest(manifest.path)) == ROWS


def test_cli_inspect_plot_without_matplotlib_names_the_extra_and_writes_nothing(
    manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    before = manifest.path.read_bytes()
    code = main(["inspect", str(manifest.path), "--plot", str(tmp_path / "plan.png")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip() == "tokenbucket inspect: error: plots need matplotlib: pip install 'tokenbucket[plot]'"
    assert list(tmp_path.iterdir()) == [] and manifest.path.read_bytes() == before


# -- report: buckets.png ---------------------------------------------------------------------------


def _log(tmp_path: Path, *, measured: bool, budget: bool = True) -> RunLog:
    events = _events(measured=measured)
    if not budget:
        del events[0]["budget_bytes"]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return read_events(path)


@pytest.mark.parametrize("measured", [False, True], ids=["cpu", "cuda"])
def test_bucket_figure_bars_per_bucket_against_the_budget(tmp_path: Path, measured: bool) -> None:
    fig = bucket_figure(_log(tmp_path, measured=measured))
    try:
        memory, timing = fig.axes
        # the hand-written log: bucket k predicts (k + 1) GiB, measures 1.1x that on a GPU; budget 4 GiB
        predicted = [float(k + 1) for k in LATENCIES]
        containers = memory.containers
        assert len(containers) == (2 if measured else 1)
        assert all(len(c) == len(LATENCIES) for c in containers)
        assert [p.get_height() for p in containers[0]] == pytest.approx(predicted)
        if measured:
            assert [p.get_height() for p in containers[1]] == pytest.approx([1.1 * p for p in predicted], rel=1e-6)
        assert _horizontal_lines(memory) == pytest.approx([4.0])
        assert "budget 4.00 GiB" in _legend(memory)
        assert ("no measured memory" in memory.get_title()) is not measured
        assert [t.get_text() for t in memory.get_xticklabels()] == [str(k) for k in LATENCIES]
        # step time: one bar per bucket at its median latency (ms), labelled with its steps
        (bars,) = [c for c in timing.containers if len(c) == len(LATENCIES) and hasattr(c, "datavalues")]
        medians = [1e3 * float(np.sort(v)[(len(v) - 1) // 2]) for v in LATENCIES.values()]
        assert [p.get_height() for p in bars] == pytest.approx(medians, rel=0.01)  # NOTE [ Latency histogram ]
        labels = [t.get_text() for t in timing.texts]
        assert labels == [f"{len(v)} steps" for v in LATENCIES.values()]
    finally:
        pyplot().close(fig)


def test_bucket_figure_without_a_budget_in_the_log_derives_it_from_risk(tmp_path: Path) -> None:
    # risk is predicted / budget (NOTE [ Risk ]): an older log without budget_bytes still gets its line
    fig = bucket_figure(_log(tmp_path, measured=False, budget=False))
    try:
        assert _horizontal_lines(fig.axes[0]) == pytest.approx([4.0])
    finally:
        pyplot().close(fig)


def test_report_figures_are_the_report_files_pngs(tmp_path: Path) -> None:
    figures = report_figures(_log(tmp_path, measured=True))
    try:
        assert list(figures) == [name for name in REPORT_FILES if name.endswith(".png")]
        assert len(figures["buckets.png"].axes) == 2
    finally:
        for fig in figures.values():
            pyplot().close(fig)


def test_cli_report_out_writes_buckets_png_beside_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, measured=True)
    before = log.path.read_bytes()
    out = tmp_path / "report"
    assert main(["report", str(log.path), "--out", str(out)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)
    assert png_size(out / "buckets.png") == (1100, 400)  # 11 x 4 inches at 100 dpi
    assert 10_000 < (out / "buckets.png").stat().st_size < 400_000
    assert 'alt="buckets"' in (out / "report.html").read_text()
    assert log.path.read_bytes() == before


def test_bucket_figure_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _log(tmp_path, measured=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ConfigError, match=r"^plots need matplotlib: pip install 'tokenbucket\[plot\]'$"):
        bucket_figure(log)
