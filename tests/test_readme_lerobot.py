"""The README's LeRobot examples, run as written.

Every ```bash command that uses ``--lerobot`` and every ```python block that calls ``lerobot_rows``
or ``lerobot_mixture`` is taken out of README.md and run in a folder holding ``datasets/<name>``: tiny datasets built
from the real ``info.json`` files of shared/data/lerobot with a made-up episode list.
``tokenbucket`` is the in-process :func:`tokenbucket.cli.main.main`. Each must exit 0 and leave
a manifest that lists every frame of each source as the README says: once at weight 1,
round(w x frames) times at weight w.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tokenbucket import ConfigError
from tokenbucket.cli.main import main
from tokenbucket.plan.manifest import load_manifest

README = Path(__file__).resolve().parents[1] / "README.md"

# the datasets the README names, built from these cards with these episode lengths
DATASETS = {
    "svla_so100_pickplace": ("svla_so100_pickplace.json", [(0, 6), (1, 4)]),  # 10 frames at 30 fps
    "libero": ("libero.json", [(0, 8), (1, 6)]),  # 14 frames at 10 fps
    "pusht": ("pusht.json", [(0, 5), (1, 3)]),
}
# the weights the README gives (every other source: 1)
WEIGHTS = {"libero": 0.5}

BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.S | re.M)


def readme_blocks() -> tuple[list[str], list[str]]:
    """The README's LeRobot ``tokenbucket`` commands (continuations joined) and Python blocks."""
    commands: list[str] = []
    python: list[str] = []
    for lang, body in BLOCK.findall(README.read_text()):
        if lang == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                if line.startswith("tokenbucket ") and "--lerobot" in line:
                    commands.append(line)
        elif "lerobot_rows" in body or "lerobot_mixture" in body:  # the blocks that plan LeRobot data
            python.append(body)
    return commands, python


COMMANDS, PYTHON = readme_blocks()


def build_datasets(folder: Path, lerobot_dir: str) -> dict[str, int]:
    """``folder/datasets/<name>`` for every dataset the README names; returns frames per dataset."""
    frames = {}
    for name, (card, episodes) in DATASETS.items():
        meta = folder / "datasets" / name / "meta"
        meta.mkdir(parents=True)
        (meta / "info.json").write_text(Path(lerobot_dir, card).read_text())
        lines = [json.dumps({"episode_index": e, "length": n, "tasks": ["t"]}) for e, n in episodes]
        (meta / "episodes.jsonl").write_text("\n".join(lines) + "\n")
        frames[name] = sum(n for _, n in episodes)
    return frames


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def check_manifests(folder: Path, frames: dict[str, int], single: str | None) -> int:
    """Every manifest in ``folder``: each source's frames, each once per copy; returns how many."""
    found = 0
    for path in sorted(folder.glob("*.parquet")):
        try:
            manifest = load_manifest(path)
        except ConfigError:
            continue  # the rows file the Python example writes before planning
        found += 1
        keys = manifest.table.column("key").to_pylist()
        assert len(set(keys)) == len(keys), f"{path.name}: duplicate keys"
        per_source: dict[str, list[str]] = {}
        for key in keys:
            source, _, rest = key.partition("/") if key.count("/") == 2 else (single or "", "", key)
            per_source.setdefault(source, []).append(rest)
        for source, rows in per_source.items():
            assert source in frames, f"{path.name}: key prefix {source!r} is no README dataset"
            weight = WEIGHTS.get(source, 1.0)
            assert len(rows) == int(weight * frames[source] + 0.5), (path.name, source, len(rows))
            if weight == 1.0:  # every frame exactly once
                distinct = {r.split("#")[0] for r in rows}
                assert len(distinct) == len(rows) == frames[source]
    return found


def test_readme_lerobot_examples_are_found() -> None:
    # the single-dataset command, the mixture command, and the Python mixture
    assert len(COMMANDS) >= 2
    assert any(c.count("--lerobot") >= 2 for c in COMMANDS)
    assert any("lerobot_mixture" in block for block in PYTHON)


@pytest.mark.parametrize("command", COMMANDS, ids=[f"bash{i}" for i in range(len(COMMANDS))])
def test_readme_lerobot_command_runs_as_written(
    command: str, lerobot_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frames = build_datasets(tmp_path, lerobot_dir)
    before = snapshot(tmp_path / "datasets")
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)
    assert argv[0] == "tokenbucket"
    code = main(argv[1:])
    err = capsys.readouterr().err
    assert code == 0, f"{command}\n{err}"
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--lerobot"]
    single = Path(sources[0]).name if len(sources) == 1 else None
    assert check_manifests(tmp_path, frames, single) == 1
    assert snapshot(tmp_path / "datasets") == before  # the datasets are only read


@pytest.mark.parametrize("block", PYTHON, ids=[f"python{i}" for i in range(len(PYTHON))])
def test_readme_lerobot_python_runs_as_written(
    block: str, lerobot_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = build_datasets(tmp_path, lerobot_dir)
    before = snapshot(tmp_path / "datasets")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})  # the README's own code
    assert check_manifests(tmp_path, frames, None) == 1
    assert snapshot(tmp_path / "datasets") == before
