"""Turning metadata values into validated integers: one rule set for the scalar and the
vectorised paths (``_arrays``), so both name the same problem with the same words.

This module is the scalar half and the shared reasons and bounds; it imports neither numpy nor
pyarrow, so the paths that price one sample (``tokenbucket cost``) start fast.

The reasons below are what a rejected table stores and what an error message embeds.
"""

from __future__ import annotations

import math
import numbers
import re

R_NULL = "should not be null"
R_NAN = "should not be NaN"
R_NOT_INT = "should hold an integer"
R_NEGATIVE = "should not be negative"
R_NOT_POSITIVE = "should be at least 1"

# NOTE [ Value bounds ]
# Bounds keep every product in int64: a camera's tokens are at most
# frames (2**20) x height (2**15) x width (2**15) with patch 1, i.e. 2**50, times 256 cameras
# is 2**58. Larger values are metadata errors, never silently wrapped. A list of cameras may be
# longer and rules multiply their counts, so a sample's total is checked on its own: past
# MAX_TOTAL the row is invalid (the check sums in float64, which cannot wrap).
# NOTE [ Value bounds ]
MAX_CAMERAS = 256
MAX_TOTAL = 2**62
R_TOO_MANY_TOKENS = "should add up to less than 2**62 tokens"
MAX_FRAMES = 2**20
MAX_SIDE = 2**15
MAX_TOKENS = 2**31

# NOTE [ Layer counts are bounded ]
# The staged cost model prices each decoder and tower layer as its own unit (FSDP gathers one
# at a time, NOTE [ FSDP units in flight ]) and the profiler builds every layer it measures, so
# their work grows with the layer count: a config.json or a --layers flag saying 10**9 would
# keep `cost`, `plan` or `profile` busy for hours. The deepest published transformers have
# about 130 layers; a count past MAX_LAYERS is refused up front, naming the file and key or
# the flag. (The block model's formulas do not loop over layers: it takes any count.)
MAX_LAYERS = 1024


def r_too_big(maximum: int) -> str:
    return f"should be at most {maximum}"


# ASCII digits and plain whitespace only: what the vectorised path's regex reads the same way
_INT_RE = re.compile(r"^[ \t\r\n]*[+-]?[0-9]+[ \t\r\n]*$")


def check_scalar(value: object, minimum: int, maximum: int) -> tuple[int, str | None]:
    """Validate one value; return ``(int_value, None)`` or ``(0, reason)``."""
    if type(value) is int:  # the common case, without the ABC checks below
        if minimum <= value <= maximum:
            return value, None
    if value is None:
        return 0, R_NULL
    if isinstance(value, bool):  # numpy's bool_ is no number: it falls to the last branch
        return 0, R_NOT_INT
    if isinstance(value, numbers.Integral):
        number = int(value)
    elif isinstance(value, numbers.Real):
        real = float(value)
        if math.isnan(real):
            return 0, R_NAN
        if not math.isfinite(real) or not real.is_integer():
            return 0, R_NOT_INT
        number = int(real)
    elif isinstance(value, str) and _INT_RE.match(value):
        number = int(value)
    else:
        return 0, R_NOT_INT
    if number < minimum:
        return 0, R_NOT_POSITIVE if minimum == 1 else R_NEGATIVE
    if number > maximum:
        return 0, r_too_big(maximum)
    return number, None
