"""Progress bars for the long parts of a command: tqdm on stderr, or nothing.

NOTE [ Progress on stderr ]
A bar is written to stderr only, never to stdout: stdout carries the results (one JSON object
under ``--json``), which must read the same with and without a bar. A bar shows only where a
person watches it, when stderr is a terminal; a log file, a pipe or a test's capture gets
nothing. ``enabled=False`` (the CLI's ``--quiet``) turns it off on a terminal too. Work done
in one vectorised call gets no fake granularity: its phases are the steps.

Example:
    >>> sum(progress(range(4), desc="adding", enabled=False))
    6
    >>> bar = progress(10, desc="rows", enabled=False)
    >>> bar.update(10)
    >>> bar.close()
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar, cast, overload

# tqdm ships no type hints; `unused-ignore` keeps this line clean once stubs are installed
from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

__all__ = ["Bar", "Counter", "progress", "stderr_is_terminal"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Counter(Protocol):
    """A bar counted by hand: ``update(n)`` as work is done, ``close()`` at the end."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


class Bar(Counter, Protocol[T_co]):
    """A bar over an iterable: iterating it yields the items and moves the bar."""

    def __iter__(self) -> Iterator[T_co]: ...


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (NOTE [ Progress on stderr ]); False when there is none."""
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


@overload
def progress(items: int | None, *, desc: str, enabled: bool | None = None, unit: str = "it") -> Counter: ...


@overload
def progress(
    items: Iterable[T], *, desc: str, enabled: bool | None = None, unit: str = "it", total: int | None = None
) -> Bar[T]: ...


def progress(
    items: int | Iterable[T] | None,
    *,
    desc: str,
    enabled: bool | None = None,
    unit: str = "it",
    total: int | None = None,
) -> Counter | Bar[T]:
    """A progress bar on stderr over ``items`` (an iterable), or counting to ``items`` (an int;
    ``None``: a count with no known end).

    Args:
        items: what to iterate, or how many units the work has (then ``update(n)`` by hand).
        desc: what is being done, shown before the bar (e.g. ``"writing manifest"``).
        enabled: ``None``: show it when stderr is a terminal; ``False``: never (``--quiet``);
            ``True``: always (NOTE [ Progress on stderr ]).
        unit: what one step is, e.g. ``"rows"``, ``"points"``, ``"plots"``.
        total: with an iterable that has no length, how many items it holds.

    Returns:
        A tqdm bar on stderr, or (disabled) one that writes nothing and costs next to nothing.
    """
    show = stderr_is_terminal() if enabled is None else bool(enabled)
    options = {
        "desc": desc,
        "unit": unit,
        "disable": not show,
        "file": sys.stderr,  # NOTE [ Progress on stderr ]: never stdout
        "leave": False,  # the bar is a status, not a result: a finished bar clears its line
        "dynamic_ncols": True,
        "unit_scale": unit == "rows",  # 1.20M rows, not 1200000
    }
    if items is None or isinstance(items, int):
        return cast(Counter, tqdm(total=items, **options))
    return cast("Bar[T]", tqdm(items, total=total, **options))
