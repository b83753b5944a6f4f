"""The package's shape: imports run down the stages, no circles, few deferred imports, small modules.

The rule (docs/architecture.md): a module imports only from its own stage or from stages below
it in ``STAGES``; the shared bottom (errors, value checks, the search, config files, the seeded
workloads) imports nothing above it. Function-level imports are counted too (they are how a
circle hides), and imports under ``if TYPE_CHECKING:`` obey the same rule.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tokenbucket"

# bottom to top; the top-level package (the public API) sits above them all
STAGES = ("_base", "models", "tokens", "cost", "plan", "train", "stream", "monitor", "cli")
BASE_MODULES = ("_exceptions", "_values", "_arrays", "_search", "_config", "_progress", "testing")
# ray, lightning, accelerate, hf trainer, transformers for profile --hf-config, peft for LoRA, diffusers for
# profile --hf-config PIPELINE
MAX_DEFERRED = 7
# modules that import an optional dependency at their top (ray, lightning, accelerate, transformers)
OPTIONAL_MODULES = (
    "tokenbucket.plan.ray_engine",
    "tokenbucket.train.lightning",
    "tokenbucket.train.accelerate",
    "tokenbucket.train.hf_trainer",
    "tokenbucket.cost.hf_profile",
    "tokenbucket.cost.dit_profile",
)
MAX_LINES = 700
MAX_ANY_PARAMETERS = 10


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported tokenbucket module (or the outside module), dotted
    line: int
    deferred: bool  # inside a function
    comment: str  # the source line, for the reason of a deferred import


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path, modules: set[str]) -> list[Import]:
    name = module_name(path, root)
    source = path.read_text()
    lines = source.splitlines()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def resolve(target: str) -> str:
        while target and target not in modules and target.startswith(root.name):
            target = target.rpartition(".")[0]
        return target

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            inner = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(name, resolve(alias.name), child.lineno, depth > 0, lines[child.lineno - 1]))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in modules else base
                    found.append(Import(name, resolve(target), child.lineno, depth > 0, lines[child.lineno - 1]))
            visit(child, inner)

    visit(ast.parse(source), 0)
    return found


def package_imports(root: Path) -> tuple[set[str], list[Import]]:
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    return modules, [imp for p in paths for imp in imports_of(p, root, modules)]


def stage_of(module: str, root_name: str = "tokenbucket") -> int:
    """Rank of a module's stage (the top-level package and ``python -m``'s entry rank above every stage)."""
    parts = module.split(".")
    if parts in ([root_name], [root_name, "__main__"]):
        return len(STAGES)
    if len(parts) == 2 and parts[1] in BASE_MODULES:
        return 0
    if parts[1] in STAGES:
        return STAGES.index(parts[1])
    raise AssertionError(f"{module} belongs to no stage: add it to STAGES or BASE_MODULES in tests/test_layout.py")


def upward_imports(imports: list[Import], root_name: str = "tokenbucket") -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.target} (stage {STAGES[stage_of(i.target, root_name)]} is above "
        f"{STAGES[stage_of(i.module, root_name)] if stage_of(i.module, root_name) < len(STAGES) else 'the top'})"
        for i in imports
        if i.target.startswith(root_name)
        and i.target != i.module
        and stage_of(i.target, root_name) > stage_of(i.module, root_name)
    ]


def circles(imports: list[Import], root_name: str = "tokenbucket") -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), the package ``__init__`` aside."""
    graph: dict[str, set[str]] = {}
    for i in imports:
        if i.target.startswith(root_name) and i.target != i.module and i.module != root_name:
            graph.setdefault(i.module, set()).add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return groups


def test_layout_imports_run_down_the_stages() -> None:
    _, imports = package_imports(PACKAGE)
    assert upward_imports(imports) == []


def test_layout_has_no_import_circle() -> None:
    _, imports = package_imports(PACKAGE)
    assert circles(imports) == []


def test_layout_deferred_imports_are_few_and_each_for_an_optional_dependency() -> None:
    _, imports = package_imports(PACKAGE)
    deferred = {(i.module, i.line): i for i in imports if i.deferred and not _family_measured_mode(i)}
    assert len(deferred) <= MAX_DEFERRED, sorted(deferred)
    for i in deferred.values():
        # the package's own modules are imported at the top, except one that exists to wrap an
        # optional dependency (it imports it at its own top): the CLI reaches it only when asked
        own = i.target.startswith("tokenbucket") and i.target not in OPTIONAL_MODULES
        assert not own, f"{i.module}:{i.line} defers an import of the package itself"
        assert "# optional" in i.comment, f"{i.module}:{i.line} defers an import without '# optional: why'"


def _family_measured_mode(i: Import) -> bool:
    """NOTE [ Families defer torch ]: a family module builds its measured-mode inputs with torch
    (and transformers' own position code) imported inside; nothing of the package is deferred."""
    return i.module.startswith("tokenbucket.models.") and i.target in ("torch", "transformers")


def test_layout_family_modules_defer_only_torch_and_transformers() -> None:
    _, imports = package_imports(PACKAGE)
    family = [i for i in imports if i.deferred and i.module.startswith("tokenbucket.models.")]
    assert family, "no family defers its measured-mode imports: the allowance above is dead"
    assert all(_family_measured_mode(i) and "# optional" in i.comment for i in family), family


def test_layout_no_module_over_the_line_limit() -> None:
    sizes = {module_name(p, PACKAGE): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


def test_layout_every_stage_is_in_the_package_docstring_map() -> None:
    import tokenbucket

    doc = tokenbucket.__doc__ or ""
    for stage in STAGES[1:]:
        assert f"{stage}/" in doc, stage


# -- the checker itself fails on what it should catch ----------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tokenbucket"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return root


def test_layout_checker_catches_an_upward_import_in_a_function(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tokens/spec.py": "def f():\n    from tokenbucket.plan.buckets import plan_buckets\n",
            "plan/buckets.py": "from tokenbucket.tokens.spec import f\n",
        },
    )
    _, imports = package_imports(root)
    assert [i.target for i in imports if i.deferred] == ["tokenbucket.plan.buckets"]
    assert len(upward_imports(imports)) == 1
    assert circles(imports) == [["tokenbucket.plan.buckets", "tokenbucket.tokens.spec"]]


def test_layout_checker_catches_a_circle_within_a_stage(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"train/a.py": "from tokenbucket.train import b\n", "train/b.py": "from . import a\n"})
    _, imports = package_imports(root)
    assert upward_imports(imports) == []
    assert circles(imports) == [["tokenbucket.train.a", "tokenbucket.train.b"]]


@pytest.mark.parametrize("module", ["tokenbucket.nowhere", "tokenbucket.helpers.x"])
def test_layout_checker_refuses_a_module_outside_every_stage(module: str) -> None:
    with pytest.raises(AssertionError, match="belongs to no stage"):
        stage_of(module)


def note_citations(root: Path) -> dict[str, int]:
    """How often each ``NOTE [ Title ]`` occurs in the package (its block, then its citations)."""
    counts: dict[str, int] = {}
    for path in root.rglob("*.py"):
        for title in re.findall(r"NOTE \[ ?([^\]\n]*?) ?\]", path.read_text()):
            counts[title] = counts.get(title, 0) + 1
    return counts


def test_layout_every_note_is_cited_where_its_rule_applies() -> None:
    counts = note_citations(PACKAGE)
    assert counts, "no NOTE blocks found"
    assert sorted(title for title, n in counts.items() if n < 2) == []


def test_layout_note_checker_counts_a_lone_note(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"tokens/a.py": "# NOTE [ Lone ]\n# NOTE [ Cited ]\nx = 1  # NOTE [ Cited ]\n"})
    assert note_citations(root) == {"Lone": 1, "Cited": 2}


def any_parameters(root: Path) -> list[str]:
    """``module:line function(parameter)`` for every parameter annotated exactly ``Any``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = fn.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
                if arg.annotation is not None and ast.unparse(arg.annotation) in ("Any", "typing.Any"):
                    found.append(f"{module_name(path, root)}:{arg.lineno} {fn.name}({arg.arg})")
    return found


def test_layout_few_parameters_are_typed_any() -> None:
    found = any_parameters(PACKAGE)
    assert len(found) <= MAX_ANY_PARAMETERS, found


def test_layout_any_checker_counts_every_kind_of_parameter(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tokens/a.py": (
                "from typing import Any\n"
                "def f(a: Any, /, b: Any, *c: Any, d: 'list[Any]', e: Any = 1, **g: Any) -> Any: ...\n"
                "class K:\n    def m(self, x: object) -> None: ...\n"
            )
        },
    )
    assert [x.split()[1] for x in any_parameters(root)] == ["f(a)", "f(b)", "f(e)", "f(c)", "f(g)"]
