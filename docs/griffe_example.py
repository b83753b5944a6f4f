"""A griffe extension for the API reference: the house docstrings' ``Example:`` section is griffe's
``Examples:`` (STYLE.md writes ``Args/Returns/Raises/Example``; griffe's Google parser knows
only the plural), so each doctest renders as code with its output, not as Markdown prose."""

from __future__ import annotations

import re
from typing import Any

import griffe

EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class SingularExample(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
