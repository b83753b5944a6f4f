"""The CLI, run as a user runs it (in-process through main, and once as a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tokenbucket.cli import main
from tokenbucket.testing import mixture_a


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_tokens_sample_json_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "tokens", "--sample", '{"cameras":4,"frames":16,"height":224,"width":224}',
                       "--patch", "14", "--json")
    assert code == 0
    data = json.loads(out)
    assert {k: data[k] for k in ("vision", "text", "proprio", "action", "memory", "total")} == {
        "vision": 16384, "text": 0, "proprio": 0, "action": 0, "memory": 0, "total": 16384}
    assert len(data["cameras"]) == 4


def test_cli_tokens_sample_uses_columns_present_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "tokens", "--sample",
                       '{"cameras":2,"frames":8,"height":224,"width":224,"text_tokens":30,"action_tokens":7}',
                       "--tubelet", "2", "--camera-names", "top,wrist", "--override", "wrist:tokens_per_frame=16",
                       "--memory", "64", "--extra", "register=4", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["vision"] == 4 * 256 + 8 * 16
    assert (data["text"], data["action"], data["memory"], data["register"]) == (30, 7, 64, 4)


def test_cli_tokens_pi0_slots_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "tokens", "--sample", '{"cameras":1,"frames":1,"height":480,"width":640}',
                    "--resize", "fixed", "--fixed-size", "224x224", "--camera-slots", "3",
                    "--text", "48", "--proprio", "1", "--action", "50", "--json")
    assert json.loads(out)["total"] == 867


def test_cli_tokens_metadata_summary_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.parquet"
    pq.write_table(mixture_a(2000), path)
    code, out, _ = run(capsys, "tokens", str(path), "--json")
    summary = json.loads(out)
    assert code == 0
    assert summary["count"] == 2000
    assert summary["p50"] <= summary["p99"] <= summary["max"]
    assert set(summary["share"]) == {"vision", "text", "proprio", "action", "memory"}


def test_cli_tokens_config_file_and_text_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.parquet"
    pq.write_table(mixture_a(100), path)
    config = tmp_path / "tokenbucket.toml"
    config.write_text("[tokens]\npatch = 28\n")
    _, out28, _ = run(capsys, "tokens", str(path), "--config", str(config), "--json")
    _, out14, _ = run(capsys, "tokens", str(path), "--config", str(config), "--patch", "14", "--json")
    assert json.loads(out28)["tokens"] < json.loads(out14)["tokens"]
    code, text, _ = run(capsys, "tokens", str(path))
    assert code == 0 and "p99=" in text and "vision" in text


def test_cli_bad_row_exits_1_with_the_row_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.csv"
    path.write_text("key,cameras,frames,height,width\na,1,8,224,224\nb,1,-8,224,224\n")
    code, _, err = run(capsys, "tokens", str(path))
    assert code == 1
    assert "row 1" in err and "'b'" in err and "'frames'" in err and "-8" in err
    code, out, _ = run(capsys, "tokens", str(path), "--on-invalid", "reject")
    assert code == 0 and "1 rejected" in out


def test_cli_bad_flags_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "tokens", "--sample", "{}", "--patch", "0")
    assert code == 1 and "patch=0" in err
    code, _, err = run(capsys, "tokens", "--sample", "[1]")
    assert code == 1 and "JSON object" in err


def test_cli_demo_runs_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tokenbucket.cli", "demo", "--out", str(tmp_path), "--samples", "5000"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "5,000 samples, 0 rejected" in proc.stdout
    assert (tmp_path / "metadata.parquet").exists()
