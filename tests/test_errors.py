"""One error family: every error tokenbucket raises on purpose is a ``TokenbucketError``.

The test walks every ``raise`` in the package's source and resolves what it raises in the
module's own namespace. Outside the family only protocol errors are allowed, each for a stated
reason; an expression that is not a class (``raise row.fail(...)``) must be listed with the
family member it builds, and a test elsewhere exercises it.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
from pathlib import Path

import pytest

import tokenbucket
from tokenbucket import _exceptions as errors

PACKAGE = Path(tokenbucket.__file__).resolve().parent

# outside the family on purpose: Python's own protocols and internal invariants
PROTOCOL_ERRORS: dict[type[BaseException], str] = {
    AssertionError: "an internal invariant, not the user's input (STYLE: raise AssertionError)",
    AttributeError: "the module __getattr__ protocol of the lazy public API",
    ImportError: "an optional extra that is not installed; the message names the pip extra",
    argparse.ArgumentTypeError: "argparse turns it into a usage line naming the flag",
}

# raise sites whose expression builds the error: (module, expression) -> the family member it builds
BUILT_ERRORS: dict[tuple[str, str], type[errors.TokenbucketError]] = {
    ("tokenbucket.tokens.breakdown", "row.fail"): errors.MetadataError,  # _Row.fail -> a MetadataError subclass
    ("tokenbucket.tokens.breakdown", "self.fail"): errors.MetadataError,
    ("tokenbucket.tokens.breakdown", "cls"): errors.MetadataError,  # _ERROR_CLASS.get(reason, InvalidValueError)
    ("tokenbucket.train.sampler", "resplit_error"): errors.ConfigError,  # one message for the sampler and accelerate
    ("tokenbucket.train.accelerate", "resplit_error"): errors.ConfigError,
}


def raise_problems(module: str, source: str, namespace: dict[str, object]) -> list[str]:
    """One line per ``raise`` in ``source`` that raises something outside the family."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue  # a bare `raise` re-raises what was caught
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        text = ast.unparse(target)
        first, *rest = text.split(".")
        value: object = namespace.get(first, getattr(builtins, first, None))
        for part in rest:
            value = getattr(value, part, None)
        if isinstance(value, type) and issubclass(value, BaseException):
            if not issubclass(value, errors.TokenbucketError) and value not in PROTOCOL_ERRORS:
                problems.append(f"{module}:{node.lineno} raises {value.__name__}, outside TokenbucketError")
        elif (module, text) not in BUILT_ERRORS:
            problems.append(f"{module}:{node.lineno} raises {text}, which is not an error class")
    return sorted(problems, key=lambda line: int(line.split(":")[1].split()[0]))


def package_modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


@pytest.mark.parametrize("module", package_modules())
def test_errors_every_raise_site_is_in_the_family(module: str) -> None:
    mod = importlib.import_module(module)
    source = Path(mod.__file__ or "").read_text()
    assert raise_problems(module, source, vars(mod)) == []


def test_errors_the_kinds_share_one_root() -> None:
    kinds = (errors.MetadataError, errors.PlanError, errors.StateError, errors.ConfigError, errors.OOMRiskError)
    assert all(issubclass(kind, errors.TokenbucketError) for kind in kinds)
    assert issubclass(errors.OversizeError, errors.PlanError)
    assert all(
        issubclass(cls, errors.MetadataError)
        for cls in (
            errors.MissingColumnError,
            errors.InvalidValueError,
            errors.DuplicateKeyError,
            errors.ImageTooSmallError,
        )
    )
    for name in errors.__all__:
        assert getattr(tokenbucket, name) is getattr(errors, name)  # each importable from the top


def test_errors_built_errors_are_family_members() -> None:
    assert all(issubclass(kind, errors.TokenbucketError) for kind in BUILT_ERRORS.values())


def test_errors_checker_fails_on_a_stray_raise() -> None:
    source = "def f(x):\n    if x:\n        raise ValueError('bad')\n    raise helper(x)\n    raise ConfigError('ok')\n"
    assert raise_problems("m", source, {"ValueError": ValueError, "ConfigError": errors.ConfigError}) == [
        "m:3 raises ValueError, outside TokenbucketError",
        "m:4 raises helper, which is not an error class",
    ]
