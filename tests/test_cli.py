"""The CLI, run as a user runs it (in-process through main, and once as a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tokenbucket.cli.main import main
from tokenbucket.cost.memory import MEMORY_ITEMS
from tokenbucket.testing import mixture_a


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_tokens_sample_json_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "tokens", "--sample", '{"cameras":4,"frames":16,"height":224,"width":224}', "--patch", "14", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert {k: data[k] for k in ("vision", "text", "proprio", "action", "memory", "total")} == {
        "vision": 16384,
        "text": 0,
        "proprio": 0,
        "action": 0,
        "memory": 0,
        "total": 16384,
    }
    assert len(data["cameras"]) == 4


def test_cli_tokens_sample_uses_columns_present_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "tokens",
        "--sample",
        '{"cameras":2,"frames":8,"height":224,"width":224,"text_tokens":30,"action_tokens":7}',
        "--tubelet",
        "2",
        "--camera-names",
        "top,wrist",
        "--override",
        "wrist:tokens_per_frame=16",
        "--memory",
        "64",
        "--extra",
        "register=4",
        "--json",
    )
    data = json.loads(out)
    assert code == 0
    assert data["vision"] == 4 * 256 + 8 * 16
    assert (data["text"], data["action"], data["memory"], data["register"]) == (30, 7, 64, 4)


def test_cli_tokens_pi0_slots_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(
        capsys,
        "tokens",
        "--sample",
        '{"cameras":1,"frames":1,"height":480,"width":640}',
        "--resize",
        "fixed",
        "--fixed-size",
        "224x224",
        "--camera-slots",
        "3",
        "--text",
        "48",
        "--proprio",
        "1",
        "--action",
        "50",
        "--json",
    )
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


def test_cli_bad_flags_exit_2_and_bad_values_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:  # a flag's value: argparse's usage error, in the flag's words
        main(["tokens", "--sample", "{}", "--patch", "0"])
    assert info.value.code == 2 and "--patch should be a positive integer, got 0" in capsys.readouterr().err
    code, _, err = run(capsys, "tokens", "--sample", "[1]")
    assert code == 1 and "JSON object" in err


@pytest.mark.slow
def test_cli_demo_runs_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tokenbucket.cli.main", "demo", "--out", str(tmp_path), "--samples", "5000"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "5,000 samples, 0 rejected" in proc.stdout
    assert (tmp_path / "metadata.parquet").exists()
    # it ends with the CPU training run under the monitor, its per-bucket table and report
    log = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    steps = [e for e in log if e["event"] == "step"]
    assert log[0]["event"] == "start" and log[-1]["event"] == "summary"
    assert f"{len(steps)} steps over {len(log[0]['buckets'])} buckets" in proc.stdout
    assert "p50 ms" in proc.stdout and (tmp_path / "report" / "report.html").stat().st_size > 10_000


def test_cli_gpus_lists_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpus", "--json")
    names = {g["name"] for g in json.loads(out)}
    assert code == 0 and {"H100-SXM", "V100-32GB", "MI300X"} <= names


def test_cli_cost_json_has_items_total_and_flops(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "cost",
        "--preset",
        "design-24L-1024",
        "--batch",
        "1",
        "--length",
        "16384",
        "--gpu",
        "H100-SXM",
        "--json",
    )
    data = json.loads(out)
    assert code == 0
    for key in (
        *MEMORY_ITEMS,
        "total",
        "flops",
        "fits",
        "max_batch",
    ):
        assert key in data
    assert data["flops"]["attention_per_layer"] == 2**40
    assert data["fits"] is True and data["max_batch"] >= 1


def test_cli_cost_model_flags_and_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "cost",
        "--hidden",
        "1024",
        "--layers",
        "24",
        "--heads",
        "16",
        "--attention",
        "eager",
        "--batch",
        "1",
        "--length",
        "16384",
        "--budget-gib",
        "80",
    )
    assert code == 0 and "does NOT fit" in out
    code, _, err = run(
        capsys, "cost", "--hidden", "1000", "--layers", "2", "--heads", "16", "--batch", "1", "--length", "8"
    )
    assert code == 1 and "heads should divide hidden" in err
    code, _, err = run(capsys, "cost", "--batch", "1", "--length", "8", "--gpu", "H100-SXN")
    assert code == 2 and "--gpu 'H100-SXN': unknown GPU; did you mean H100-SXM" in err


def test_cli_ledger_json_with_whatif(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "ledger",
        "--sample",
        '{"cameras":4,"frames":16,"height":224,"width":224}',
        "--patch",
        "14",
        "--whatif",
        "frames=32",
        "--json",
    )
    data = json.loads(out)
    assert code == 0
    assert set(data) >= {"tokens", "per_layer", "kv_cache_bytes", "peak_bytes", "memory", "whatif"}
    assert data["per_layer"]["attention_score_bytes"] == 8 * 2**30
    assert data["whatif"]["frames=32"]["per_layer.attention_score_bytes"] == 4
    code, text, _ = run(
        capsys, "ledger", "--sample", '{"cameras":4,"frames":16,"height":224,"width":224}', "--whatif", "side=448"
    )
    assert code == 0 and "x16.00" in text


@pytest.mark.slow
def test_cli_profile_user_model_side_by_side(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(
        capsys,
        "profile",
        "tokenbucket.cost.reference:ReferenceTransformer",
        "--hidden",
        "256",
        "--layers",
        "2",
        "--heads",
        "4",
        "--batch",
        "2",
        "--length",
        "512",
        "--length",
        "1024",
        "--save",
        str(tmp_path / "p.json"),
        "--json",
    )
    rows = json.loads(out)
    assert code == 0 and [r["length"] for r in rows] == [512, 1024]
    for r in rows:
        assert abs(r["ratio"] - 1) < 0.05
    assert (tmp_path / "p.json").exists()
    code, out, _ = run(
        capsys,
        "profile",
        "tests.user_models:build",
        "--input",
        "tests.user_models:make_batch",
        "--hidden",
        "128",
        "--layers",
        "2",
        "--heads",
        "4",
        "--precision",
        "fp32",
        "--batch",
        "2",
        "--length",
        "256",
    )
    assert code == 0 and "measured" in out and "analytic" in out
    code, _, err = run(capsys, "profile", "no_such_module:build")
    assert code == 1 and "cannot import" in err


@pytest.mark.slow
def test_cli_plan_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.parquet"
    pq.write_table(mixture_a(5000, seed=2), src)
    out = tmp_path / "manifest.parquet"
    code, text, _ = run(
        capsys, "plan", str(src), "--gpu", "H100-SXM", "--on-oversize", "reject", "--out", str(out), "--json"
    )
    data = json.loads(text)
    assert code == 0 and out.exists()
    assert set(data["summary"]) >= {
        "samples",
        "rejected",
        "batches",
        "shapes",
        "padding_efficiency",
        "mean_fill",
        "predicted_epoch_seconds",
        "over_budget_batches",
    }
    assert data["summary"]["over_budget_batches"] == 0
    for b in data["buckets"]:
        assert set(b) >= {
            "bound",
            "batch_size",
            "samples",
            "batches",
            "predicted_peak_bytes",
            "fill",
            "padding_efficiency",
        }
    code, text, _ = run(capsys, "inspect", str(out), "--plot", str(tmp_path / "h.png"))
    assert code == 0 and "padding efficiency" in text and (tmp_path / "h.png").stat().st_size > 1000
    code, _, err = run(capsys, "plan", str(src), "--gpu", "H100-SXM", "--out", str(tmp_path / "x.parquet"))
    assert code == 1 and "do not fit the budget even alone" in err
    code, _, err = run(capsys, "plan", str(src), "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "needs a budget" in err


def test_cli_loads_only_the_verb_it_runs() -> None:
    # NOTE [ Verbs load on demand ]: `tokenbucket gpus` must not import torch (seconds) for a table
    code = (
        "import sys, contextlib, io\n"
        "from tokenbucket.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['gpus'])\n"
        "print(rc, 'torch' in sys.modules, 'tokenbucket.cli.profile' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False", "False"]


@pytest.mark.parametrize("text", ["[1, 2]", '{"cameras": 4', "[" * 100_000 + "]" * 100_000])
def test_cli_sample_that_is_no_json_object_is_a_one_line_error(capsys: pytest.CaptureFixture[str], text: str) -> None:
    code, out, err = run(capsys, "tokens", "--sample", text)
    assert code != 0 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--sample" in err and "should be a JSON object" in err and len(err) < 400
