"""A ``tokenbucket.toml`` is read strictly (NOTE [ Strict config ], NOTE [ Config errors name the file ]):
a section or key no verb reads is an error naming the file, the section or key and the known ones,
one line on stderr with exit status 1, never a traceback, and the file is left as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli_errors import cli
from tokenbucket import ConfigError
from tokenbucket._config import load_toml

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = '{"cameras": 1, "frames": 1, "height": 480, "width": 640}'
KNOWN = "known sections: [model], [tokens]"


def the_line(err: str) -> str:
    """The one stderr line of a refused command."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def write_config(folder: Path, text: str) -> tuple[Path, bytes, int]:
    path = folder / "tokenbucket.toml"
    path.write_text(text)
    return path, path.read_bytes(), path.stat().st_mtime_ns


def unchanged(path: Path, data: bytes, mtime: int) -> bool:
    return path.read_bytes() == data and path.stat().st_mtime_ns == mtime


# each verb that reads --config, with the flags it needs besides
VERBS = {
    "tokens": ["tokens", "--sample", SAMPLE],
    "cost": ["cost", "--batch", "1", "--length", "64"],
    "ledger": ["ledger", "--sample", SAMPLE],
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_config_unknown_section_names_file_section_and_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path, data, mtime = write_config(tmp_path, "[tokens]\npatch = 14\n\n[plan]\nmax_buckets = 4\n")
    code, out, err = cli(capsys, *VERBS[verb], "--config", "tokenbucket.toml")
    assert the_line(err) == f"tokenbucket {verb}: error: tokenbucket.toml: unknown section [plan]; {KNOWN}"
    assert code == 1 and out == "" and unchanged(path, data, mtime)


def test_config_unknown_section_in_plan_writes_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    n = 20
    columns = {"key": [f"s{i}" for i in range(n)], "cameras": [1] * n, "frames": [1] * n}
    pq.write_table(pa.table({**columns, "height": [224] * n, "width": [224] * n}), tmp_path / "m.parquet")
    before = (tmp_path / "m.parquet").read_bytes()
    path, data, mtime = write_config(tmp_path, "[token]\npatch = 14\n")  # a misspelt [tokens]
    code, _, err = cli(
        capsys, "plan", "m.parquet", "--config", "tokenbucket.toml", "--budget-gib", "10", "--out", "o.parquet"
    )
    assert the_line(err) == f"tokenbucket plan: error: tokenbucket.toml: unknown section [token]; {KNOWN}"
    assert code == 1 and unchanged(path, data, mtime)
    assert not (tmp_path / "o.parquet").exists() and (tmp_path / "m.parquet").read_bytes() == before
    assert pq.read_table(tmp_path / "m.parquet").num_rows == n  # every sample still there


def test_config_key_outside_every_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path, data, mtime = write_config(tmp_path, "patch = 14\n\n[tokens]\nmerge = 2\n")
    code, _, err = cli(capsys, *VERBS["tokens"], "--config", "tokenbucket.toml")
    assert (
        the_line(err) == f"tokenbucket tokens: error: tokenbucket.toml: key 'patch' is outside every section; {KNOWN}"
    )
    assert code == 1 and unchanged(path, data, mtime)


@pytest.mark.parametrize(
    ("verb", "text", "named"),
    [
        ("tokens", "[tokens]\npach = 14\n", "tokenbucket.toml: unknown [tokens] keys ['pach']; expected some of ["),
        (
            "cost",
            "[model]\npreset = 'design-24L-1024'\nhiden = 512\n",
            "tokenbucket.toml: unknown [model] keys ['hiden']",
        ),
        ("ledger", "[model]\nlayer = 2\n", "tokenbucket.toml: unknown [model] keys ['layer']"),
    ],
)
def test_config_unknown_key_names_file_key_and_known_keys(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    verb: str,
    text: str,
    named: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    path, data, mtime = write_config(tmp_path, text)
    code, out, err = cli(capsys, *VERBS[verb], "--config", "tokenbucket.toml")
    line = the_line(err)
    assert line.startswith(f"tokenbucket {verb}: error: {named}"), line
    assert "'patch'" in line if verb == "tokens" else "'hidden'" in line and "'layers'" in line  # the valid ones
    assert code == 1 and out == "" and unchanged(path, data, mtime)


def test_config_bad_value_in_the_file_names_the_file_and_a_flag_can_replace_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path, data, mtime = write_config(tmp_path, "[model]\nhidden = 0\nlayers = 2\nheads = 4\n\n[tokens]\npatch = 0\n")
    code, _, err = cli(capsys, *VERBS["cost"], "--config", "tokenbucket.toml")
    assert the_line(err) == (
        "tokenbucket cost: error: tokenbucket.toml [model]: hidden should be a positive integer, but got hidden=0"
    )
    assert code == 1
    code, _, err = cli(capsys, *VERBS["tokens"], "--config", "tokenbucket.toml")
    assert the_line(err) == (
        "tokenbucket tokens: error: tokenbucket.toml [tokens]: patch should be a positive integer, but got patch=0"
    )
    assert code == 1
    # the flags override the file's values: nothing wrong is left
    code, _, err = cli(capsys, *VERBS["cost"], "--config", "tokenbucket.toml", "--hidden", "64", "--json")
    assert code == 0, err
    code, _, err = cli(capsys, *VERBS["tokens"], "--config", "tokenbucket.toml", "--patch", "16", "--json")
    assert code == 0, err
    assert unchanged(path, data, mtime)


def test_config_error_a_flag_causes_does_not_blame_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path, data, mtime = write_config(tmp_path, "[model]\npreset = 'design-24L-1024'\n")
    code, _, err = cli(capsys, *VERBS["cost"], "--config", "tokenbucket.toml", "--hidden", "1000")
    line = the_line(err)
    assert line.startswith("tokenbucket cost: error: heads should divide hidden, but got hidden=1000")
    assert "tokenbucket.toml" not in line and code == 1 and unchanged(path, data, mtime)


def test_config_strict_error_through_a_real_process(tmp_path: Path) -> None:
    path, data, mtime = write_config(tmp_path, "[tokens]\npatch = 14\n[monitor]\nevery = 10\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tokenbucket", "tokens", "--sample", SAMPLE, "--config", "tokenbucket.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"tokenbucket tokens: error: tokenbucket.toml: unknown section [monitor]; {KNOWN}\n"
    assert unchanged(path, data, mtime)


def test_config_example_file_still_loads(capsys: pytest.CaptureFixture[str]) -> None:
    example = ROOT / "examples" / "tokenbucket.toml"
    before = example.read_bytes()
    tables = load_toml(example, ("model", "tokens"))
    assert tables["model"] == {} and tables["tokens"]["patch"] == 14
    code, out, err = cli(capsys, "tokens", "--sample", SAMPLE, "--config", str(example), "--json")
    assert code == 0, err
    assert '"total": 867' in out  # pi0: three 224x224 slots, 48 text, 1 state, 50 actions
    assert example.read_bytes() == before


def test_load_toml_refuses_unknown_and_returns_every_known_section(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[tokens]\npatch = 14\n[tokens.columns]\nkey = 'id'\n")
    assert load_toml(path, ("model", "tokens")) == {"model": {}, "tokens": {"patch": 14, "columns": {"key": "id"}}}
    with pytest.raises(ConfigError, match=r"c.toml: unknown section \[tokens\]; known sections: \[model\]$"):
        load_toml(path, ("model",))
    path.write_text("model = 3\n")
    with pytest.raises(ConfigError, match=r"\[model\] in '.*c.toml' should be a table, but got 3"):
        load_toml(path, ("model", "tokens"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml", ("model",))
