"""The vectorised half of ``_values``: whole Arrow columns checked at once, each bad row named
with the same reasons the scalar path (``check_scalar``) gives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenbucket._values import (
    R_NAN,
    R_NEGATIVE,
    R_NOT_INT,
    R_NOT_POSITIVE,
    R_NULL,
    check_scalar,
    r_too_big,
)

# strings the vectorised path casts itself (fit int64 for sure); others go through check_scalar
_SHORT_INT_RE = r"^[ \t\r\n]*-?[0-9]{1,18}[ \t\r\n]*$"


class Problems:
    """Per-row problems found by the vectorised path, in check order.

    Each entry is ``(rows, priority, reason, column, values)``: the row indices, a priority
    per row (lower = checked first, the same order the scalar path checks in), the reason,
    the column label(s) and a way to fetch the offending values.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[np.ndarray, np.ndarray, str, Any, Any]] = []

    def add(
        self, rows: np.ndarray, priority: int | np.ndarray, reason: str, column: str | Sequence[str], values: object
    ) -> None:
        if len(rows) == 0:
            return
        prio = np.broadcast_to(np.asarray(priority, dtype=np.int64), rows.shape)
        self.entries.append((rows.astype(np.int64), prio, reason, column, values))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def first_per_row(self) -> list[tuple[int, str, str, Any]]:
        """``(row, reason, column, value)`` for every bad row: its first problem in check order."""
        rows = np.concatenate([e[0] for e in self.entries])
        prio = np.concatenate([e[1] for e in self.entries])
        which = np.concatenate([np.full(len(e[0]), i) for i, e in enumerate(self.entries)])
        slot = np.concatenate([np.arange(len(e[0])) for e in self.entries])
        order = np.lexsort((which, prio, rows))
        rows_sorted = rows[order]
        keep = np.ones(len(order), dtype=bool)
        keep[1:] = rows_sorted[1:] != rows_sorted[:-1]
        chosen = order[keep]
        out: list[tuple[int, str, str, Any]] = []
        for pos in chosen:
            _, _, reason, column, values = self.entries[which[pos]]
            i = int(slot[pos])
            col = column[i] if not isinstance(column, str) else column
            value = values(i) if callable(values) else values
            out.append((int(rows[pos]), reason, col, value))
        return out

    def first(self) -> tuple[int, str, str, Any]:
        """The problem of the lowest row (what ``on_invalid="raise"`` reports)."""
        best = None
        for idx, (rows, prio, *_rest) in enumerate(self.entries):
            j = int(np.lexsort((prio, rows))[0])
            candidate = (int(rows[j]), int(prio[j]), idx, j)
            if best is None or candidate < best:
                best = candidate
        if best is None:  # callers check `if problems:` first
            raise AssertionError("first() called with no problems recorded")
        row, _, idx, j = best
        _, _, reason, column, values = self.entries[idx]
        col = column[j] if not isinstance(column, str) else column
        return row, reason, col, (values(j) if callable(values) else values)


def check_array(
    arr: pa.Array | pa.ChunkedArray,
    minimum: int,
    maximum: int,
    problems: Problems,
    priority: int | np.ndarray,
    column: str | Sequence[str],
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Validate an Arrow column of counts; return int64 values (bad entries set to ``minimum``).

    Problems go to ``problems`` with the row of each entry (``rows[i]``, or ``i``). Cheap when
    the column is clean: one min/max and a null count.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    n = len(arr)
    row_of = rows if rows is not None else np.arange(n)
    prio = np.broadcast_to(np.asarray(priority, dtype=np.int64), (n,))

    def getter(idx: np.ndarray) -> Any:
        return lambda i: arr[int(idx[i])].as_py()

    def report(mask: np.ndarray, reason: str) -> None:
        idx = np.flatnonzero(mask)
        cols = column if isinstance(column, str) else [column[int(k)] for k in idx]
        problems.add(row_of[idx], prio[idx], reason, cols, getter(idx))

    bad = np.zeros(n, dtype=bool)
    typ = arr.type
    if arr.null_count:
        nulls = np.asarray(arr.is_null())
        report(nulls, R_NULL)
        bad |= nulls
    if pa.types.is_integer(typ):
        raw = arr.fill_null(minimum).to_numpy()
        if raw.dtype == np.uint64:  # past 2**63 a cast to int64 would wrap to negatives
            raw = np.minimum(raw, np.uint64(2**62))
        values = raw.astype(np.int64, copy=False)
    elif pa.types.is_floating(typ):
        x = arr.fill_null(float(minimum)).to_numpy()
        nan = np.isnan(x)
        if nan.any():
            report(nan, R_NAN)
            bad |= nan
        with np.errstate(invalid="ignore"):
            frac = ~nan & (~np.isfinite(x) | (np.floor(x) != x))
        if frac.any():
            report(frac, R_NOT_INT)
            bad |= frac
        # huge values keep their sign (and so fail the range checks below), not a silent minimum
        x = np.where(nan | frac, float(minimum), np.clip(x, -(2.0**62), 2.0**62))
        values = x.astype(np.int64)
    elif pa.types.is_string(typ) or pa.types.is_large_string(typ):
        short = np.asarray(pc.match_substring_regex(arr, _SHORT_INT_RE).fill_null(False)) & ~bad
        clean = pc.if_else(pa.array(short), pc.utf8_trim(arr, " \t\r\n"), str(minimum))
        values = pc.cast(clean, pa.int64()).to_numpy().copy()
        # the rest ("+5", 30 digits, "abc"): the scalar rule, value by value, so both paths agree
        odd = np.flatnonzero(~short & ~bad)
        if len(odd):
            reasons: dict[str, list[int]] = {}
            for i in odd.tolist():
                number, reason = check_scalar(arr[i].as_py(), minimum, maximum)
                if reason is None:
                    values[i] = number
                else:
                    reasons.setdefault(reason, []).append(i)
            for reason, idx in reasons.items():
                mask = np.zeros(n, dtype=bool)
                mask[idx] = True
                report(mask, reason)
                bad |= mask
    else:
        notint = ~bad
        report(notint, R_NOT_INT)
        return np.full(n, minimum, dtype=np.int64)
    lo_val = values.min(initial=minimum)
    hi_val = values.max(initial=minimum)
    if lo_val < minimum:
        low = (values < minimum) & ~bad
        report(low, R_NOT_POSITIVE if minimum == 1 else R_NEGATIVE)
        bad |= low
    if hi_val > maximum:
        high = (values > maximum) & ~bad
        report(high, r_too_big(maximum))
        bad |= high
    if bad.any():
        values = np.where(bad, minimum, values)
    return np.asarray(values, dtype=np.int64)
