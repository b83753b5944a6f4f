"""The public API is what ``tokenbucket`` exports: every name in ``__all__`` resolves, the list is
sorted and names where each object really lives, and a user needs no submodule for the core."""

from __future__ import annotations

import importlib
from typing import ClassVar

import tokenbucket

# what a user of the quickstart imports; the package must offer at least these at the top level
CORE = {
    "TokenSpec",
    "ModelSpec",
    "CostModel",
    "breakdown_table",
    "read_metadata",
    "plan_buckets",
    "build_manifest",
    "load_manifest",
    "TokenBucketDataset",
    "BucketBatchSampler",
    "BucketCollate",
    "BatchInfo",
    "BucketMonitor",
    "TokenbucketError",
}


def exported_problems(package: object) -> list[str]:
    """Each way ``package.__all__`` can be wrong, one line each (empty when it is right)."""
    names = list(getattr(package, "__all__", []))
    problems = [] if names == sorted(names) else ["__all__ is not sorted"]
    problems += [f"{n} is listed twice" for n in sorted({n for n in names if names.count(n) > 1})]
    for name in names:
        try:
            value = getattr(package, name)
        except AttributeError:
            problems.append(f"{name} is in __all__ but cannot be imported")
            continue
        home = getattr(value, "__module__", None)
        if home is not None and not home.startswith("tokenbucket"):
            problems.append(f"{name} comes from {home}, not from tokenbucket")
        elif (
            home is not None
            and getattr(importlib.import_module(home), getattr(value, "__name__", name), None) is not value
        ):
            problems.append(f"{name} says it lives in {home}, which does not define it")
    return problems


def test_exported_members_all_resolve_and_are_sorted() -> None:
    assert exported_problems(tokenbucket) == []


def test_exported_members_hold_the_core_api() -> None:
    assert sorted(CORE - set(tokenbucket.__all__)) == []


def test_exported_members_unknown_name_is_an_attribute_error() -> None:
    try:
        tokenbucket.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name should raise AttributeError")


def test_exported_members_checker_fails_on_a_broken_list() -> None:
    class Fake:
        __all__: ClassVar[list[str]] = ["b", "a", "missing", "Outside", "a"]
        a = staticmethod(tokenbucket.plan_buckets)
        b = 1
        Outside = importlib.import_module("json").JSONDecoder
        Stray = type("Stray", (), {"__module__": "tokenbucket.plan.buckets"})

    problems = exported_problems(Fake)
    assert "__all__ is not sorted" in problems
    assert "a is listed twice" in problems
    assert "missing is in __all__ but cannot be imported" in problems
    assert "Outside comes from json.decoder, not from tokenbucket" in problems
    assert "Stray is in __all__ but cannot be imported" not in problems  # not listed: not checked
    Fake.__all__ = ["Stray", "a"]
    assert exported_problems(Fake) == ["Stray says it lives in tokenbucket.plan.buckets, which does not define it"]
