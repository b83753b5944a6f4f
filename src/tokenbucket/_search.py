"""The one largest-that-fits search, shared by the cost model, the profiler, the planner and the
packing plan: every "largest batch" or "longest row" question is a monotone predicate searched
here.

NOTE [ Doubling then bisection ]
Memory grows with the batch and with the length, so ``fits(n)`` is true up to some ``n*`` and
false above it. Doubling from a point that fits finds an upper end that does not; bisecting
between the two finds ``n*`` exactly in ``O(log n*)`` calls of ``fits``.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenbucket._exceptions import ConfigError

__all__ = ["grow_then_bisect", "largest_fitting"]


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest ``n`` in ``[lo, hi)`` with ``fits(n)``, given ``fits(lo)`` (or ``lo`` a floor
    to fall back on) and not ``fits(hi)``.

    Example:
        >>> largest_fitting(lambda n: n * n <= 50, 0, 100)
        7
    """
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def grow_then_bisect(
    fits: Callable[[int], bool], start: int = 1, *, limit: int = 1 << 40, what: str = "the search"
) -> int:
    """The largest ``n >= start`` with ``fits(n)``, ``start - 1`` when ``fits(start)`` is false
    (NOTE [ Doubling then bisection ]).

    Raises:
        ConfigError: ``fits`` is still true past ``limit`` (``what`` names the search).

    Example:
        >>> grow_then_bisect(lambda n: n <= 1000)
        1000
    """
    if not fits(start):
        return start - 1
    lo, hi = start, max(2, 2 * start)
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            raise ConfigError(f"{what} did not converge: memory does not grow with the size searched")
    return largest_fitting(fits, lo, hi)
