"""The CLI explains itself: every flag of every verb has a help text, every verb's --help ends with an
example command line that parses, and ``--version`` / ``python -m tokenbucket`` work."""

from __future__ import annotations

import argparse
import importlib.metadata
import shlex
import subprocess
import sys

import pytest

import tokenbucket
from tokenbucket.cli.main import VERBS, build_parser, main, version


def verb_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The verbs' parsers, read from the parser object itself (not from VERBS)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subs) == 1
    return dict(subs[0].choices)


def actions_without_help(parser: argparse.ArgumentParser) -> list[str]:
    return [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not (a.help and a.help.strip() and a.help != argparse.SUPPRESS)
    ]


def test_cli_help_every_verb_of_the_parser_is_checked() -> None:
    verbs = verb_parsers(build_parser())
    assert set(verbs) == {name for name, _, _ in VERBS}
    for name, parser in verbs.items():
        # the full parser loaded each verb's module: its flags are there to check
        assert any(a.option_strings and a.dest != "help" for a in parser._actions), name


def test_cli_help_every_flag_of_every_verb_has_a_help_text() -> None:
    parser = build_parser()
    missing = {name: actions_without_help(p) for name, p in verb_parsers(parser).items()}
    assert {name: flags for name, flags in missing.items() if flags} == {}
    assert actions_without_help(parser) == []  # --help, --version and the VERB positional


def test_cli_help_checker_catches_a_flag_without_help() -> None:
    # the walk above would fail on a new flag added without help
    parser = build_parser()
    cost = verb_parsers(parser)["cost"]
    cost.add_argument("--new-flag", type=int)
    assert actions_without_help(cost) == ["--new-flag"]


@pytest.mark.parametrize("verb", [name for name, _, _ in VERBS])
def test_cli_help_every_verb_ends_with_an_example_that_parses(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    sub = verb_parsers(parser)[verb]
    assert sub.epilog and sub.epilog.startswith("Example:\n  tokenbucket ")
    example = sub.epilog.split("\n")[1].strip()
    argv = shlex.split(example)
    assert argv[:2] == ["tokenbucket", verb]
    args = parser.parse_args(argv[1:])  # a real command line: every flag in it exists and its values parse
    assert args.command == verb
    # the epilog renders as written (RawDescriptionHelpFormatter), the example on a line of its own
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    help_text = capsys.readouterr().out
    assert info.value.code == 0
    assert f"\nExample:\n  {example}\n" in help_text


def test_cli_help_top_level_lists_the_verbs_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "Example:\n  tokenbucket demo" in out and "--version" in out
    flat = " ".join(out.split())  # argparse wraps long help texts
    for name, _, help_text in VERBS:
        assert f"{name} {help_text}" in flat


def test_cli_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert out == f"tokenbucket {importlib.metadata.version('tokenbucket')}\n"


def test_cli_version_is_the_distributions_version() -> None:
    """``version()`` reads the package's ``__version__``; it must not drift from pyproject's."""
    assert version() == tokenbucket.__version__ == importlib.metadata.version("tokenbucket")


@pytest.mark.slow
def test_python_dash_m_tokenbucket_runs_the_cli_and_passes_exit_codes() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "tokenbucket", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert ok.returncode == 0 and ok.stdout.startswith("tokenbucket ") and ok.stderr == ""
    gpus = subprocess.run(
        [sys.executable, "-m", "tokenbucket", "gpus", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert gpus.returncode == 0 and '"H100-SXM"' in gpus.stdout
    usage = subprocess.run(
        [sys.executable, "-m", "tokenbucket", "cost", "--batch", "0", "--length", "8"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    assert usage.stderr.startswith("tokenbucket cost: error: --batch should be a positive integer, got 0")
    data = subprocess.run(
        [sys.executable, "-m", "tokenbucket", "inspect", "no-such-manifest.parquet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert data.returncode == 1 and "Traceback" not in data.stderr and "no-such-manifest" in data.stderr
