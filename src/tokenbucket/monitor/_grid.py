"""A 2D run's buckets laid out by their two bounds, for ``tokenbucket report``: as a value
(``--json``), as text and as an HTML table.

NOTE [ The 2D report grid ]
A 2D plan's buckets (NOTE [ Two-dimensional buckets ]) are length bands, each cut into
image-token levels. The report lays them out as a grid: a row per distinct length bound
(``bound``, L_total), a column per distinct image-token bound (``vision_bound``), both
ascending. A bucket's cell holds its steps, median step time and peak memory over the budget:
the measured peak when the run measured memory (a GPU run), else the predicted one, the same
for every cell. A cell with no bucket is blank (``null`` in JSON), one whose bucket never ran
says so. ``inspect --plot`` draws the same buckets as rectangles over the samples' (L_total,
image tokens): bucket k's from the previous band's bound to its bound, and from its band's
previous level (0 for the first) to its ``vision_bound``. That is the region it holds when
every band's top level holds its band's samples, as a planned one does; a sample above its
band's top level goes to a later band (a sample goes to the first bucket holding both counts).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["bucket_grid", "format_grid", "grid_html"]


def bucket_grid(
    bounds: Mapping[int, tuple[int, int]], rows: Sequence[Mapping[str, Any]], budget_bytes: float | None
) -> dict[str, Any] | None:
    """The grid of NOTE [ The 2D report grid ], or ``None`` for a 1D run (no ``bounds``).

    Args:
        bounds: every planned bucket's ``(bound, vision_bound)`` by index
            (:func:`~tokenbucket.monitor.stats.bucket_bounds_2d` of the start event).
        rows: the per-bucket rows (:func:`~tokenbucket.monitor.stats.summarize_events`).
        budget_bytes: the run's memory budget (``None`` when the log does not say: no fractions).

    Returns:
        ``length_bounds`` (the rows), ``vision_bounds`` (the columns), ``peak`` (``"measured"``
        or ``"predicted"``), ``budget_bytes``, and ``cells``: per row, per column, ``None`` or
        ``bucket``, ``steps``, ``latency_p50_s``, ``peak_bytes`` and ``peak_fraction`` (of the budget).

    Example:
        >>> g = bucket_grid({0: (512, 0), 1: (512, 256), 2: (1024, 256)}, [], 2**30)
        >>> g["length_bounds"], g["vision_bounds"], [[c and c["bucket"] for c in row] for row in g["cells"]]
        ([512, 1024], [0, 256], [[0, 1], [None, 2]])
    """
    if not bounds:
        return None
    lengths = sorted({bound for bound, _ in bounds.values()})
    visions = sorted({vision for _, vision in bounds.values()})
    by_bucket = {r["bucket"]: r for r in rows}
    measured = any(r.get("measured_peak_bytes") is not None for r in rows)
    key = "measured_peak_bytes" if measured else "predicted_peak_bytes"
    cells: list[list[dict[str, Any] | None]] = [[None] * len(visions) for _ in lengths]
    for k, (bound, vision) in sorted(bounds.items()):
        i, j = lengths.index(bound), visions.index(vision)
        if cells[i][j] is not None:  # a later bucket of the same bounds holds nothing (the first takes all)
            continue
        r = by_bucket.get(k)
        peak = None if r is None else r.get(key)
        cells[i][j] = {
            "bucket": k,
            "steps": 0 if r is None else r["steps"],
            "latency_p50_s": None if r is None else r["latency_p50_s"],
            "peak_bytes": peak,
            "peak_fraction": peak / budget_bytes if peak is not None and budget_bytes else None,
        }
    return {
        "length_bounds": lengths,
        "vision_bounds": visions,
        "peak": "measured" if measured else "predicted",
        "budget_bytes": None if budget_bytes is None else round(budget_bytes),
        "cells": cells,
    }


def _cell_text(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return ""
    if not cell["steps"]:
        return f"#{cell['bucket']} no steps"
    p50 = "-" if cell["latency_p50_s"] is None else f"{cell['latency_p50_s'] * 1e3:,.1f} ms"
    peak = "-" if cell["peak_fraction"] is None else f"{cell['peak_fraction']:.0%}"
    steps = f"{cell['steps']:,} step" + ("s" if cell["steps"] != 1 else "")
    return f"#{cell['bucket']} {steps} {p50} {peak}"


def _caption(grid: Mapping[str, Any]) -> str:
    return (
        "2D buckets: a row per length bound (L_total), a column per image-token bound; "
        f"a cell: bucket, steps, p50 step time, {grid['peak']} peak / budget"
    )


def format_grid(grid: Mapping[str, Any]) -> str:
    """The grid as text: a caption, then a row per length bound (NOTE [ The 2D report grid ])."""
    corner = "L_total \\ images"
    texts = [[_cell_text(c) for c in row] for row in grid["cells"]]
    first = max(len(corner), *(len(f"{b:,}") for b in grid["length_bounds"]))
    widths = [max(len(f"{v:,}"), *(len(row[j]) for row in texts)) for j, v in enumerate(grid["vision_bounds"])]
    lines = [
        _caption(grid),
        f"{corner:>{first}} | " + " | ".join(f"{v:>{w},}" for v, w in zip(grid["vision_bounds"], widths, strict=True)),
    ]
    for bound, row in zip(grid["length_bounds"], texts, strict=True):
        lines.append(f"{bound:>{first},} | " + " | ".join(f"{t:>{w}}" for t, w in zip(row, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def grid_html(grid: Mapping[str, Any]) -> str:
    """The grid as an HTML table with its caption (NOTE [ The 2D report grid ])."""
    head = "<tr><th>L_total \\ images</th>" + "".join(f"<th>{v:,}</th>" for v in grid["vision_bounds"]) + "</tr>"
    body = "".join(
        f"<tr><th>{bound:,}</th>" + "".join(f"<td>{html.escape(_cell_text(c))}</td>" for c in row) + "</tr>"
        for bound, row in zip(grid["length_bounds"], grid["cells"], strict=True)
    )
    return f"<h2>{html.escape(_caption(grid))}</h2><table>{head}{body}</table>"
