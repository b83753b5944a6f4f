"""Reading ``tokenbucket.toml`` (plumbing shared by every config section) and JSON objects."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # TOML is UTF-8 text
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _table(data: dict[str, Any], path: Path, section: str) -> dict[str, Any]:
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] in {str(path)!r} should be a table, but got {table!r}")
    return table


def load_toml_section(path: str | Path, section: str) -> dict[str, Any]:
    """Return one top-level table of a TOML file; a missing table is an empty one."""
    path = Path(path)
    return _table(_read_toml(path), path, section)


def load_toml(path: str | Path, sections: Collection[str]) -> dict[str, dict[str, Any]]:
    """Every section of a ``tokenbucket.toml``, refusing what no reader of the file would read.

    NOTE [ Strict config ]
    A misspelt or misplaced section (``[plan]``, ``[token]``, a key above every section) would
    otherwise be ignored without a word, and the run would use defaults the user thinks they
    changed. The whole file is checked once here against the ``sections`` its reader knows; the
    keys inside each section are checked by the section's own ``from_dict`` (``TokenSpec``,
    ``ModelSpec``), which names the known ones.

    Args:
        path: the TOML file.
        sections: the section names the caller reads (e.g. ``("model", "tokens")``).

    Returns:
        ``{section: table}`` for every name in ``sections`` (an absent section is an empty table).

    Raises:
        ConfigError: the file is missing or not TOML, holds a section not in ``sections`` or a key
            outside every section, or a known section that is not a table. The message names the
            file, the section or key, and the known sections.
    """
    path = Path(path)
    data = _read_toml(path)
    known = ", ".join(f"[{name}]" for name in sorted(sections))
    for name, value in data.items():
        if name in sections:
            continue
        if isinstance(value, dict):
            raise ConfigError(f"{path}: unknown section [{name}]; known sections: {known}")
        raise ConfigError(f"{path}: key {name!r} is outside every section; known sections: {known}")
    return {name: _table(data, path, name) for name in sections}


def json_object(text: str, where: str) -> dict[str, Any]:
    """``text`` parsed as one JSON object, or a ConfigError naming ``where`` (a flag, a file, a line)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} should be a JSON object, but it does not parse ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{where} should be a JSON object, but it is nested too deeply to read") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{where} should be a JSON object, but got {type(value).__name__}")
    return value


def read_json_file(path: Path, label: str) -> dict[str, Any]:
    """The JSON object in the file ``path`` (``label`` names it in errors: ``config.json``), or a
    one-line ConfigError: missing, unreadable, not JSON, not an object."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{label} {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label} {str(path)!r} cannot be read: {exc}") from None
    return json_object(text, f"{label} {str(path)!r}")
