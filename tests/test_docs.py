"""The documentation site's shape: generated pages equal to their generator's output, the README a
front door (short, its links alive), the pictures small. ``make docs`` builds the site itself
(``mkdocs build --strict``); tests/test_readme.py runs every code block of README.md and docs/.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250
MAX_IMAGE_BYTES = 300 * 1024


def generator() -> ModuleType:
    """``docs/gen_reference.py`` (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["reference/cli.md", "reference/api.md", "reference/notes.md"])
def test_docs_generated_page_is_the_generators_output(page: str) -> None:
    # a stale page names the fix: run the generator and commit what it wrote
    committed = (ROOT / "docs" / page).read_text()
    assert committed == generator().PAGES[page](), f"docs/{page} is stale: run .venv/bin/python docs/gen_reference.py"


def test_docs_cli_reference_holds_every_verb_and_flag() -> None:
    from tokenbucket.cli.main import build_parser

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    parser = build_parser()
    verbs = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    for name, sub in verbs.choices.items():
        assert f"\n## tokenbucket {name}\n" in page
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in page, (name, flag)


def test_docs_api_reference_lists_every_public_name() -> None:
    import tokenbucket

    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    listed = set(re.findall(r"^::: tokenbucket(?:\.\w+)*\.(\w+)$", page, flags=re.MULTILINE))
    assert set(tokenbucket.__all__) <= listed, sorted(set(tokenbucket.__all__) - listed)


def test_docs_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES, len(text.splitlines())
    for heading in ("## The two commands", "## Quickstart", "## The documentation"):
        assert f"\n{heading}\n" in text
    # relative links work on GitHub as on disk: every target exists (anchors aside)
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets and all((ROOT / t).exists() for t in targets if "://" not in t), targets
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages <= set(targets), sorted(pages - set(targets))  # every page of the site is a link away


def test_docs_pictures_are_small_and_shown() -> None:
    images = sorted((ROOT / "docs" / "img").glob("*.png"))
    assert {"site-front.png", "site-guide.png"} <= {p.name for p in images}
    for path in images:
        assert path.stat().st_size <= MAX_IMAGE_BYTES, (path.name, path.stat().st_size)
    assert "docs/img/site-front.png" in README.read_text() and "docs/img/site-guide.png" in README.read_text()
