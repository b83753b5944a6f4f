"""The CLI's error path (NOTE [ CLI error path ]): a careless or hostile user's input ends as one
line on stderr with exit status 2 (usage) or 1 (data), never a traceback; no file that was there
before changes, and every sample is counted or named."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbucket import TokenSpec, breakdown_table, read_metadata
from tokenbucket.cli.main import main


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` as the shell sees it: the exit status (argparse's exit included), stdout, stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(err: str, *names: str) -> str:
    """The single stderr line of a refused command, checked to name each of ``names``."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert len(lines) == 1 or (len(lines) == 2 and lines[0].startswith("usage:")), err
    for name in names:
        assert name in lines[-1], (name, lines[-1])
    return lines[-1]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def rows(n: int, **extra: list[object]) -> pa.Table:
    data: dict[str, list[object]] = {
        "key": [f"s{i:03d}" for i in range(n)],
        "cameras": [1] * n,
        "frames": [1] * n,
        "height": [224] * n,
        "width": [224] * n,
    }
    data.update(extra)
    return pa.table(data)


# -- keys that are not text --------------------------------------------------------------------


def bad_utf8_jsonl(path: Path) -> Path:
    lines = [json.dumps({"key": f"s{i}", "cameras": 1, "frames": 1, "height": 224, "width": 224}) for i in range(5)]
    data = "\n".join(lines).encode().replace(b'"s2"', b'"s\xff2"') + b"\n"
    path.write_bytes(data)
    return path


def bad_utf8_parquet(path: Path) -> Path:
    keys = pa.array([b"s0", b"s\xff1", b"s2"], pa.binary()).view(pa.string())  # a writer that did not check
    pq.write_table(rows(3).set_column(0, "key", keys), path)
    return path


@pytest.mark.parametrize("make", [bad_utf8_jsonl, bad_utf8_parquet], ids=["jsonl", "parquet"])
def test_cli_key_that_is_not_utf8_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object
) -> None:
    path = make(tmp_path / ("m.jsonl" if make is bad_utf8_jsonl else "m.parquet"))  # type: ignore[operator]
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "tokens", str(path), "--patch", "14")
    line = one_line_error(err, "column 'key' should be valid UTF-8 text", "\\xff")
    assert code == 1 and out == "" and "row " in line
    # rejected, it is one named row and the others all count
    result = breakdown_table(read_metadata(path), TokenSpec(patch=14), on_invalid="reject")
    assert result.rejected.num_rows == 1 and result.table.num_rows + 1 == read_metadata(path).num_rows
    assert result.rejected.column("value")[0].as_py().startswith("b's\\xff")
    assert snapshot(tmp_path) == before


# -- numbers that are no numbers ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "lots"])
@pytest.mark.parametrize("flag", ["--budget-gib", "--mlp-ratio"])
def test_cli_cost_refuses_a_flag_that_is_not_a_finite_number(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    extra = [] if flag == "--budget-gib" else ["--budget-gib", "10"]
    code, out, err = cli(capsys, "cost", "--batch", "1", "--length", "64", f"{flag}={value}", *extra)
    one_line_error(err, f"{flag} should be a positive number, got {value!r}")
    assert code == 2 and out == ""


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_cli_plan_refuses_a_budget_that_is_not_finite_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    pq.write_table(rows(10), tmp_path / "m.parquet")
    before = snapshot(tmp_path)
    code, _, err = cli(
        capsys, "plan", str(tmp_path / "m.parquet"), "--budget-gib", value, "--out", str(tmp_path / "o.parquet")
    )
    one_line_error(err, f"--budget-gib should be a positive number, got {value!r}")
    assert code == 2 and snapshot(tmp_path) == before


# -- files that are not what they say -----------------------------------------------------------


def test_cli_zero_byte_parquet_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.parquet").write_bytes(b"")
    code, out, err = cli(capsys, "tokens", str(tmp_path / "m.parquet"))
    one_line_error(err, "m.parquet", "0 bytes")
    assert code == 1 and out == "" and (tmp_path / "m.parquet").read_bytes() == b""


def test_cli_text_file_named_parquet_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.parquet").write_text("key,cameras\na,1\n")
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "tokens", str(tmp_path / "m.parquet"))
    one_line_error(err, "m.parquet")
    assert code == 1 and snapshot(tmp_path) == before


def test_cli_missing_metadata_and_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "tokens", str(tmp_path / "nope.parquet"))
    one_line_error(err, "nope.parquet", "does not exist")
    assert code == 1
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("not metadata")
    code, _, err = cli(capsys, "tokens", str(tmp_path / "d"))
    one_line_error(err, "holds no")
    assert code == 1 and (tmp_path / "d" / "notes.txt").read_text() == "not metadata"


def test_cli_jsonl_that_is_one_json_array_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps([{"key": "a", "cameras": 1, "frames": 1, "height": 224, "width": 224}]))
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "tokens", str(path))
    one_line_error(err, "m.jsonl", "line 1 should be one JSON object", "but got list")
    assert code == 1 and snapshot(tmp_path) == before


def test_cli_config_that_is_missing_or_not_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = '{"cameras": 1, "frames": 1, "height": 224, "width": 224}'
    code, _, err = cli(capsys, "tokens", "--sample", sample, "--config", str(tmp_path / "nope.toml"))
    one_line_error(err, "nope.toml", "does not exist")
    assert code == 1
    (tmp_path / "bad.toml").write_text("[tokens\npatch = 14\n")
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "tokens", "--sample", sample, "--config", str(tmp_path / "bad.toml"))
    one_line_error(err, "bad.toml", "not valid TOML")
    assert code == 1 and snapshot(tmp_path) == before


def test_cli_sample_file_that_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "tokens", "--sample", f"@{tmp_path / 'nope.json'}")
    one_line_error(err, "--sample file", "nope.json")
    assert code == 1


def test_cli_a_value_of_the_wrong_type_names_row_key_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.jsonl"
    lines = [{"key": f"s{i}", "cameras": 1, "frames": 1, "height": 224, "width": 224} for i in range(4)]
    lines[3]["cameras"] = "two"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "tokens", str(path))
    one_line_error(err, "row 3 key 's3'", "column 'cameras'", "'two'")
    assert code == 1 and snapshot(tmp_path) == before
    code, out, _ = cli(capsys, "tokens", str(path), "--on-invalid", "reject", "--json")
    assert code == 0 and (json.loads(out)["count"], json.loads(out)["rejected"]) == (3, 1)  # 4 rows, all counted


# -- usage ------------------------------------------------------------------------------------------


def test_cli_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(rows(3), tmp_path / "m.parquet")
    before = snapshot(tmp_path)
    for argv in (
        ["tokens"],  # neither METADATA nor --sample
        ["tokens", str(tmp_path / "m.parquet"), "--sample", "{}"],  # both
        ["tokens", "--sample", "{}", "--resize", "fixed"],  # fixed needs --fixed-size
        ["frobnicate"],  # no such verb
        ["cost", "--batch", "one", "--length", "8"],  # not an int
    ):
        code, out, err = cli(capsys, *argv)
        one_line_error(err)
        assert code == 2 and out == "" and snapshot(tmp_path) == before, argv


# -- what the input holds, all of it -----------------------------------------------------------------


def test_jsonl_optional_field_first_seen_late_counts_the_earlier_lines_as_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.jsonl"
    lines = [{"key": f"s{i}", "cameras": 1, "frames": 1, "height": 224, "width": 224} for i in range(50)]
    lines[49]["text_tokens"] = 7  # Arrow's reader fills the 49 lines before with nulls
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, out, err = cli(capsys, "tokens", str(path), "--patch", "14", "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert report["count"] == 50 and report["rejected"] == 0
    assert report["tokens"] == 50 * 256 + 7


def test_jsonl_explicit_null_in_a_required_column_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    lines = [{"key": f"s{i}", "cameras": 1, "frames": 1, "height": 224, "width": 224} for i in range(3)]
    lines[1]["height"] = None
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = TokenSpec(patch=14)
    result = breakdown_table(read_metadata(path, absent=spec.absent_as_zero()), spec, on_invalid="reject")
    assert result.rejected.column("key").to_pylist() == ["s1"] and result.table.num_rows == 2


# -- a reader that stops reading -----------------------------------------------------------------------


def test_cli_closed_pipe_ends_quietly_like_a_unix_tool() -> None:
    # `tokenbucket gpus | head -0`: the reader is gone before the first line is written
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tokenbucket.cli.main import main; sys.exit(main(['gpus']))"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "0"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert code == 141 and err == ""


# -- the demo and the profiler ------------------------------------------------------------------------


def test_cli_demo_never_writes_into_a_folder_of_the_users(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "run.jsonl").write_text('{"event": "mine"}\n')  # a name the demo writes too
    (mine / "metadata.parquet").write_bytes(b"not the demo's")
    before = snapshot(mine)
    code, out, err = cli(capsys, "demo", "--out", str(mine), "--samples", "50")
    one_line_error(err, "--out", "results", "did not write")
    assert code == 2 and out == "" and snapshot(mine) == before
    (tmp_path / "f").write_text("a file")
    code, _, err = cli(capsys, "demo", "--out", str(tmp_path / "f"), "--samples", "50")
    one_line_error(err, "is a file")
    assert code == 2 and (tmp_path / "f").read_text() == "a file"


@pytest.mark.parametrize("samples", ["0", "-5", "many"])
def test_cli_demo_refuses_a_sample_count_below_one(capsys: pytest.CaptureFixture[str], samples: str) -> None:
    code, _, err = cli(capsys, "demo", f"--samples={samples}", "--out", "unused")
    one_line_error(err, "--samples should be a positive integer, got")
    assert code == 2 and not Path("unused").exists()


def test_cli_profile_factory_that_builds_no_module(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "profile", "os:getcwd", "--batch", "1", "--length", "8")
    one_line_error(err, "os:getcwd returned str, not a torch.nn.Module")
    assert code == 1


# -- samples without tokens ------------------------------------------------------------------------------


def test_plan_sample_without_tokens_is_named_or_rejected_never_the_whole_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenbucket import load_manifest

    table = rows(40, text_tokens=[5] * 40).set_column(1, "cameras", pa.array([0] + [1] * 39))
    table = table.set_column(5, "text_tokens", pa.array([0] + [5] * 39))  # row 0: no camera, no text
    pq.write_table(table, tmp_path / "m.parquet")
    base = ["plan", str(tmp_path / "m.parquet"), "--patch", "14", "--budget-gib", "10"]
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, *base, "--out", str(tmp_path / "a.parquet"))
    one_line_error(err, "row 0 key 's000'", "column 'total' should be at least 1 token(s)")
    assert code == 1 and snapshot(tmp_path) == before  # nothing written
    code, out, err = cli(capsys, *base, "--out", str(tmp_path / "b.parquet"), "--on-invalid", "reject", "--json")
    assert code == 0, err
    summary = json.loads(out)["summary"]
    manifest = load_manifest(tmp_path / "b.parquet")
    buckets = manifest.table.column("bucket").to_pylist()
    assert (summary["samples"], summary["rejected"], summary["invalid"]) == (39, 1, 1)
    assert len(buckets) == 40 and buckets[0] == -1 and min(buckets[1:]) >= 0  # every sample is somewhere
    assert "at least 1 token" in manifest.table.column("reason")[0].as_py()
    # packing takes an empty sample: it adds no row
    code, out, err = cli(capsys, *base, "--out", str(tmp_path / "c.parquet"), "--mode", "packed", "--json")
    assert code == 0, err
    assert load_manifest(tmp_path / "c.parquet").table.column("bucket").to_pylist()[0] == 0


def test_plan_flags_that_do_not_go_together_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(rows(5), tmp_path / "m.parquet")
    out = ["--out", str(tmp_path / "o.parquet")]
    for argv, named in (
        (["plan", str(tmp_path / "m.parquet"), *out], "needs a budget"),
        (["plan", *out, "--budget-gib", "1"], "needs METADATA"),
        (["plan", str(tmp_path / "m.parquet"), *out, "--budget-gib", "1", "--cameras", "a"], "--cameras goes with"),
    ):
        code, _, err = cli(capsys, *argv)
        one_line_error(err, named)
        assert code == 2, argv
    assert not (tmp_path / "o.parquet").exists()


# -- a flag's bad value, in the flag's words (NOTE [ Flag values ]) -------------------------------------------

MODEL_FLAGS = [
    ("--hidden", "0", "--hidden should be a positive integer, got 0"),
    ("--layers", "0", "--layers should be a positive integer, got 0"),
    ("--heads", "-2", "--heads should be a positive integer, got -2"),
    ("--kv-heads", "0", "--kv-heads should be a positive integer, got 0"),
    ("--mlp-ratio", "0", "--mlp-ratio should be a positive number, got 0"),
    ("--window", "0", "--window should be a positive integer, got 0"),
    ("--extra-params", "-1", "--extra-params should be a non-negative integer, got -1"),
    ("--extra-bytes", "1.5", "--extra-bytes should be a non-negative integer, got '1.5'"),
]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--batch", "0", "--batch should be a positive integer, got 0"),
        ("--batch", "two", "--batch should be a positive integer, got 'two'"),
        ("--length", "-8", "--length should be a positive integer, got -8"),
        ("--budget-gib", "0", "--budget-gib should be a positive number, got 0"),
        ("--budget-gib", "-3.5", "--budget-gib should be a positive number, got -3.5"),
        ("--mfu", "0", "--mfu should be a number in (0, 1], got 0"),
        ("--mfu", "1.5", "--mfu should be a number in (0, 1], got 1.5"),
        ("--gpu", "h100", "--gpu 'h100' is ambiguous: did you mean H100-SXM or H100-PCIe?"),
        ("--gpu", "a100", "--gpu 'a100' is ambiguous: did you mean A100-40GB or A100-80GB?"),
        ("--gpu", "H100-SXN", "--gpu 'H100-SXN': unknown GPU; did you mean H100-SXM"),
        *MODEL_FLAGS,
    ],
)
def test_cli_cost_flag_value_is_refused_in_the_flags_words(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    argv = {"--batch": "1", "--length": "64", flag: value}  # the flag under test replaces a good value
    code, out, err = cli(capsys, "cost", *(f"{k}={v}" for k, v in argv.items()))
    line = one_line_error(err)
    assert line.startswith(f"tokenbucket cost: error: {message}"), line
    assert "=0," not in line and "but got" not in line  # not the library's batch=0 form
    assert code == 2 and out == ""


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-buckets", "0", "--max-buckets should be a positive integer, got 0"),
        ("--budget-gib", "-1", "--budget-gib should be a positive number, got -1"),
        ("--gpu", "h100", "--gpu 'h100' is ambiguous: did you mean H100-SXM or H100-PCIe?"),
        ("--gpu", "TPU-v5", "--gpu 'TPU-v5': unknown GPU; `tokenbucket gpus` lists the 13 known ones"),
        ("--patch", "0", "--patch should be a positive integer, got 0"),
        ("--merge", "0", "--merge should be a positive integer, got 0"),
        ("--tubelet", "0", "--tubelet should be a positive integer, got 0"),
        ("--min-pixels", "-1", "--min-pixels should be a non-negative integer, got -1"),
        ("--max-pixels", "0", "--max-pixels should be a positive integer, got 0"),
        ("--tokens-per-frame", "0", "--tokens-per-frame should be a positive integer, got 0"),
        ("--special-per-frame", "-1", "--special-per-frame should be a non-negative integer, got -1"),
        ("--special-per-camera", "-1", "--special-per-camera should be a non-negative integer, got -1"),
        ("--camera-slots", "0", "--camera-slots should be a positive integer, got 0"),
        ("--fixed-size", "0x224", "--fixed-size should be HEIGHTxWIDTH or SIDE in pixels (positive integers), got"),
        *MODEL_FLAGS,
    ],
)
def test_cli_plan_flag_value_is_refused_in_the_flags_words_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    pq.write_table(rows(12), tmp_path / "m.parquet")
    before = snapshot(tmp_path)
    budget = {} if flag in ("--gpu", "--budget-gib") else {"--budget-gib": "10"}
    argv = [str(tmp_path / "m.parquet"), "--out", str(tmp_path / "o.parquet")]
    code, out, err = cli(capsys, "plan", *argv, *(f"{k}={v}" for k, v in {**budget, flag: value}.items()))
    line = one_line_error(err)
    assert line.startswith(f"tokenbucket plan: error: {message}"), line
    assert code == 2 and out == ""
    assert snapshot(tmp_path) == before and pq.read_table(tmp_path / "m.parquet").num_rows == 12


def test_cli_gpu_matched_loosely_gives_the_same_answer(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["cost", "--batch", "1", "--length", "4096", "--json"]
    answers = set()
    for written in ("H100-SXM", "h100-sxm", "h100_sxm", "H100 SXM", "h100s"):
        code, out, err = cli(capsys, *base, "--gpu", written)
        assert code == 0, err
        answers.add(out)
    assert len(answers) == 1 and json.loads(answers.pop())["fits"] is True


# -- issue 34: tracebacks and hangs that end as one line ----------------------------------------------


def test_cli_plan_zero_byte_parquet_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "m.parquet").write_bytes(b"")
    before = snapshot(tmp_path)
    code, out, err = cli(
        capsys, "plan", str(tmp_path / "m.parquet"), "--budget-gib", "10", "--out", str(tmp_path / "o.parquet")
    )
    one_line_error(err, "m.parquet", "0 bytes")
    assert code == 1 and out == "" and snapshot(tmp_path) == before


def binary_key_parquet(path: Path) -> Path:
    keys = pa.array([b"s0", b"s\xff1", b"s2"], pa.binary())  # a binary column, as some writers leave text
    pq.write_table(rows(3).set_column(0, "key", keys), path)
    return path


@pytest.mark.parametrize("verb", ["tokens", "plan"])
def test_cli_binary_key_column_with_invalid_utf8_names_the_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    path = binary_key_parquet(tmp_path / "m.parquet")
    plan = ["--budget-gib", "10", "--out", str(tmp_path / "o.parquet")] if verb == "plan" else []
    code, out, err = cli(capsys, verb, str(path), "--patch", "14", *plan)
    one_line_error(err, "row 1 key 's\\\\xff1'", "column 'key' should be valid UTF-8 text")
    assert code == 1 and out == ""
    # rejected, it is one named row and the other two count
    code, out, err = cli(capsys, verb, str(path), "--patch", "14", "--on-invalid", "reject", "--json", *plan)
    assert code == 0, err
    report = json.loads(out)
    if verb == "plan":
        assert (report["summary"]["samples"], report["summary"]["rejected"]) == (2, 1)
    else:
        assert (report["count"], report["rejected"]) == (2, 1)


def hf_config(folder: Path, **changes: object) -> Path:
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 256, **changes}  # fmt: skip
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@contextlib.contextmanager
def stopped_after(seconds: float) -> Iterator[None]:
    """Fail a command still running after ``seconds`` instead of hanging the suite."""

    def stop(signum: int, frame: object) -> None:
        raise AssertionError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


STAGED = ["--sample", '{"text_tokens": 64}', "--batch", "1", "--gpu", "H100-SXM"]


@pytest.mark.parametrize(
    "argv",
    [
        ["cost", *STAGED],
        ["ledger", "--sample", '{"text_tokens": 64}'],
        ["profile", "--sample", '{"text_tokens": 64}'],
        ["plan", "META", "--budget-gib", "10", "--vision-share", "0", "--out", "OUT"],
    ],
    ids=["cost", "ledger", "profile", "plan"],
)
def test_cli_hf_config_with_a_billion_layers_is_refused_at_once_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # it ran for hours: the staged model prices (and the profiler builds) every layer
    config = hf_config(tmp_path / "huge", num_hidden_layers=10**9)
    pq.write_table(rows(3), tmp_path / "m.parquet")
    argv = [{"META": str(tmp_path / "m.parquet"), "OUT": str(tmp_path / "o.parquet")}.get(a, a) for a in argv]
    start = time.perf_counter()
    with stopped_after(10):  # (before the fix it ran for hours)
        code, out, err = cli(capsys, argv[0], "--hf-config", str(config), *argv[1:])
    one_line_error(err, "huge/config.json", "key 'num_hidden_layers' should be at most 1024", "1000000000")
    assert code == 1 and out == "" and time.perf_counter() - start < 5
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_attention_heads": 5}, ("key 'num_attention_heads' should divide key 'hidden_size'", "64 / 5")),
        ({"num_key_value_heads": 3}, ("key 'num_key_value_heads' should divide key 'num_attention_heads'",)),
        (
            {
                "model_type": "llava",
                "text_config": {"model_type": "llama", "hidden_size": 100, "num_attention_heads": 8},
            },
            ("key 'text_config.num_attention_heads' should divide key 'text_config.hidden_size'",),
        ),
        (
            {"model_type": "llava", "vision_config": {"hidden_size": 100, "num_attention_heads": 8}},
            ("key 'vision_config.num_attention_heads' should divide key 'vision_config.hidden_size'",),
        ),
    ],
    ids=["heads", "kv-heads", "text-config", "vision-config"],
)
def test_cli_hf_config_heads_that_do_not_divide_the_width_name_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object], named: tuple[str, ...]
) -> None:
    config = hf_config(tmp_path / "odd", **changes)
    code, out, err = cli(capsys, "cost", "--hf-config", str(config), *STAGED)
    one_line_error(err, "odd/config.json", *named)
    assert code == 1 and out == ""


def test_cli_plan_oversize_says_the_flag_not_the_python_keyword(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenbucket import OversizeError, plan_buckets
    from tokenbucket.cost.memory import CostModel
    from tokenbucket.cost.model import ModelSpec

    big = rows(3).set_column(2, "frames", pa.array([1, 1, 4096]))  # one sample of 4096 frames
    pq.write_table(big, tmp_path / "m.parquet")
    code, _, err = cli(
        capsys, "plan", str(tmp_path / "m.parquet"), "--budget-gib", "1", "--out", str(tmp_path / "o.parquet")
    )
    line = one_line_error(err, "do not fit the budget even alone", "or pass --on-oversize reject to plan without them")
    assert code == 1 and "on_oversize=" not in line
    # the library keeps Python's words (one message, worded per front end)
    with pytest.raises(OversizeError, match="on_oversize='reject'") as info:
        plan_buckets(np.array([10**6]), CostModel(ModelSpec.preset("design-24L-1024")), 2**30)
    assert info.value.worded("--on-oversize reject").endswith("or pass --on-oversize reject to plan without them")
