"""The public API is what ``tokenbucket`` exports: every name in ``__all__`` resolves, the list is
sorted and names where each object really lives, a user needs no submodule for the core, and the
examples and guides teach ``from tokenbucket import ...`` (every name they import is exported)."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import tokenbucket

ROOT = Path(__file__).resolve().parents[1]
# what examples and guides may import from a submodule: the seeded reference workloads (the test
# helpers' home, as torch.testing is torch's); plumbing (a `_`-prefixed module or name) is exempt too
TAUGHT_SUBMODULES = {"tokenbucket.testing"}

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


# -- examples and guides import from the top level ---------------------------------------------------


def taught_code() -> list[tuple[str, str]]:
    """``(where, code)`` for every script of examples/ and every ```python block of README.md and docs/."""
    found = [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in sorted((ROOT / "examples").glob("*.py"))]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        found += python_blocks(page.read_text(), page.relative_to(ROOT).as_posix())
    return found


def python_blocks(text: str, page: str) -> list[tuple[str, str]]:
    """The fenced ```python blocks of a Markdown page (indented ones too), each named ``page:line``."""
    fence = re.compile(r"^([ \t]*)```python[^\n]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
    return [(f"{page}:{text.count(chr(10), 0, m.start()) + 2}", textwrap.dedent(m[2])) for m in fence.finditer(text)]


def submodule_imports(code: str, where: str, exported: set[str]) -> list[str]:
    """Each import of ``code`` a user should write as ``from tokenbucket import ...``, one line each."""
    problems = []
    for node in ast.walk(ast.parse(code, where)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names if a.name.startswith("tokenbucket.")]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tokenbucket."):
            modules, names = [str(node.module)], [a.name for a in node.names]
        else:
            continue
        for module in modules:
            if module in TAUGHT_SUBMODULES or any(part.startswith("_") for part in module.split(".")):
                continue
            if not names:
                problems.append(f"{where}:{node.lineno} imports the module {module}")
            for name in names:
                if name in exported:
                    problems.append(f"{where}:{node.lineno} imports {name} from {module}: import it from tokenbucket")
                elif not name.startswith("_"):
                    problems.append(f"{where}:{node.lineno} imports {name} from {module}: tokenbucket lacks it")
    return problems


def test_exported_members_are_what_examples_and_guides_import() -> None:
    sources = taught_code()
    assert len([w for w, _ in sources if w.startswith("examples/")]) >= 15
    assert len([w for w, _ in sources if ".md:" in w]) >= 15  # the pages' blocks were found
    exported = set(tokenbucket.__all__)
    assert [p for where, code in sources for p in submodule_imports(code, where, exported)] == []


def test_exported_members_import_checker_catches_a_submodule_import() -> None:
    code = textwrap.dedent(
        """\
        import tokenbucket.cost.staged
        from tokenbucket import TokenSpec
        from tokenbucket.plan.buckets import plan_buckets
        from tokenbucket.cost.staged import ERROR_BAND, _TRAIN
        from tokenbucket.testing import RandomTokens
        from tokenbucket.models._dit import VAEFactors
        def f():
            from tokenbucket.train.collate import BucketCollate
        """
    )
    assert submodule_imports(code, "x.py", {"TokenSpec", "plan_buckets", "BucketCollate"}) == [
        "x.py:1 imports the module tokenbucket.cost.staged",
        "x.py:3 imports plan_buckets from tokenbucket.plan.buckets: import it from tokenbucket",
        "x.py:4 imports ERROR_BAND from tokenbucket.cost.staged: tokenbucket lacks it",
        "x.py:8 imports BucketCollate from tokenbucket.train.collate: import it from tokenbucket",
    ]


def test_exported_members_import_checker_reads_python_blocks_only() -> None:
    page = (
        "# T\n\n```python\nx = 1\n```\n\n"
        "```text\nfrom tokenbucket.a import b\n```\n\n"
        "- a list:\n\n  ```python\n  y = 2\n  ```\n"
    )
    assert python_blocks(page, "p.md") == [("p.md:4", "x = 1\n"), ("p.md:14", "y = 2\n")]


def test_exported_members_import_tokenbucket_imports_no_stage_and_no_extra() -> None:
    # NOTE [ Lazy public API ]: the names of the trainer integrations and profile_dit are exported,
    # yet importing the package loads none of their modules nor of their optional dependencies
    heavy = ("numpy", "pyarrow", "torch", "lightning", "accelerate", "transformers", "diffusers", "peft", "ray")
    probe = (
        "import json, sys, tokenbucket\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {(*heavy, 'tokenbucket')!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(proc.stdout) == ["tokenbucket", "tokenbucket._exceptions"]
    optional = {"train.lightning", "train.accelerate", "train.hf_trainer", "cost.dit_profile"}
    assert optional <= set(tokenbucket._LAZY.values())  # the probe covers the names that need an extra
