"""Reading ``tokenbucket.toml`` (plumbing shared by every config section) and JSON objects."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def load_toml_section(path: str | Path, section: str) -> dict[str, Any]:
    """Return one top-level table of a TOML file; a missing table is an empty one."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] in {str(path)!r} should be a table, but got {table!r}")
    return table


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
