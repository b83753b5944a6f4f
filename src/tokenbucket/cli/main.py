"""The ``tokenbucket`` command: thin wrappers over the library's functions.

    tokenbucket tokens METADATA [--config F] [--json] [spec flags]
    tokenbucket tokens --sample '{"cameras":4,"frames":16,"height":224,"width":224}' --patch 14 --json
    tokenbucket cost [model flags] --batch B --length L [--gpu NAME | --budget-gib X] [--json]
    tokenbucket ledger --sample JSON [token flags] [model flags] [--whatif frames=32 ...] [--json]
    tokenbucket profile MODULE:FACTORY [model flags] --batch B --length L [--save PROFILE.json]
    tokenbucket gpus [--json]
    tokenbucket plan METADATA... [--config F] [--gpu NAME | --budget-gib X] [--max-buckets K]
                     [--mode static|dynamic] [--on-oversize error|reject] --out manifest.parquet [--json]
    tokenbucket plan --lerobot DATASET [--delta-timestamps JSON|@FILE.json] [--cameras A,B] [plan flags as above]
    tokenbucket inspect manifest.parquet [--json] [--plot hist.png]
    tokenbucket report RUN.jsonl [--json] [--out DIR]
    tokenbucket demo [--out DIR] [--samples N] [--seed S]
    tokenbucket --version          (also: python -m tokenbucket ...)

Every verb takes ``--quiet`` (before or after the verb): no progress bars. Bars go to stderr, and
only when it is a terminal, so stdout (and ``--json``) reads the same with or without them
(NOTE [ Progress on stderr ] in :mod:`tokenbucket._progress`).

Every :class:`~tokenbucket.tokens.spec.TokenSpec` field has a flag, so a quick question needs no
config file; flags override ``--config``'s ``[tokens]`` section.

Each verb is one module beside this one (``inspect_`` for ``inspect``) with ``add_arguments(parser)``,
``run(args) -> int`` and ``EXAMPLE`` (one real command line, shown under its ``--help``); the flags
and helpers they share are in ``_common``. Every flag has a help text (tests/test_cli_help.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast

from tokenbucket._exceptions import TokenbucketError, UsageError

__all__ = ["build_parser", "main"]

# exit statuses, as Unix tools use them
EXIT_DATA, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 1, 2, 130, 141


class Verb(Protocol):
    """What a verb module provides (a module satisfies a protocol by its functions and constants)."""

    EXAMPLE: str  # one real command line, shown under the verb's --help

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# the verbs in the order `tokenbucket --help` lists them: name, module in this package, one-line help
VERBS: tuple[tuple[str, str, str], ...] = (
    ("tokens", "tokens", "token breakdown of a metadata file or of one --sample"),
    ("gpus", "gpus", "the GPU registry and each GPU's memory budget"),
    ("cost", "cost", "itemised memory, FLOPs and fit of one batch shape"),
    ("ledger", "ledger", "one sample's tokens as bytes and FLOPs, with what-ifs"),
    ("profile", "profile", "measure a model's peak memory on fake tensors (or CUDA)"),
    ("plan", "plan", "plan memory-safe buckets and write the manifest"),
    ("inspect", "inspect_", "the plan and length histogram of a manifest"),
    ("report", "report", "per-bucket latency, memory and risk of a training run's JSONL log"),
    ("calibrate", "calibrate", "fit step time and memory offsets to a training run's log"),
    ("replan", "replan", "a new plan for a manifest from a training run's measured figures"),
    ("demo", "demo", "the main job on a realistic multi-camera dataset"),
)


QUIET_HELP = "no progress bars on stderr (they show only when stderr is a terminal; stdout is the same either way)"

# argparse's words for a flag our type refused: "argument --batch: should be ..." (NOTE [ Flag values ])
_TYPE_ERROR = re.compile(r"argument (-[^:]+): (should .*)", re.DOTALL)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (NOTE [ CLI error path ]); ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        match = _TYPE_ERROR.fullmatch(message)
        if match:  # "--batch should be a positive integer, got 0": the flag as the user typed it
            message = f"{match[1]} {match[2]}"
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    """The package's ``__version__`` (``tests/test_cli_help.py`` holds it equal to the installed
    distribution's; reading the distribution's metadata would cost every call ~40 ms)."""
    # the package is imported by now (this module is inside it); read, not imported: it sits above cli
    return str(getattr(sys.modules.get("tokenbucket"), "__version__", "unknown"))


def verb_module(module: str) -> Verb:
    """The verb's module (NOTE [ Verbs load on demand ])."""
    return cast(Verb, importlib.import_module(f"tokenbucket.cli.{module}"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (``only``) one whose other verbs are listed without their flags.

    NOTE [ Verbs load on demand ]
    A verb module imports its stages at the top (torch, pyarrow: seconds), so ``main`` loads the
    module of the verb it runs and no other: ``tokenbucket gpus`` does not pay for the profiler.
    """
    parser = _Parser(
        prog="tokenbucket",
        description=__doc__.split("\n")[0],
        epilog="Example:\n  tokenbucket demo --samples 20000\n\n`tokenbucket VERB --help` shows a verb's flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tokenbucket {version()}")
    parser.add_argument("--quiet", "-q", action="store_true", help=QUIET_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB", help="what to do")
    for name, module, help_text in VERBS:
        verb_parser = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        # SUPPRESS: a verb's --quiet sets it, its absence keeps the one given before the verb
        verb_parser.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)
        if only is None or name == only:
            verb = verb_module(module)
            verb.add_arguments(verb_parser)
            verb_parser.set_defaults(func=verb.run)
            verb_parser.epilog = f"Example:\n  {verb.EXAMPLE}"
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; a user's mistake ends as one line on stderr, never a traceback.

    NOTE [ CLI error path ]
    ``tokenbucket VERB: error: MESSAGE`` and exit status 2 for a usage error (argparse's own, or a
    :class:`UsageError`: flags that do not go together), 1 for everything the input or the
    machine refused (any other :class:`TokenbucketError`, an OS error such as a missing file or a
    full disk). A reader that closes the pipe (``tokenbucket tokens ... | head -1``) ends the
    command quietly with status 141, as SIGPIPE ends ``cat``; Ctrl-C ends it with 130. Anything
    else is a bug and keeps its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)  # the verb: the first positional
    parser = build_parser(chosen or "")  # NOTE [ Verbs load on demand ]: none for --help or a bad verb
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # NOTE [ CLI error path ]: what is still buffered goes nowhere, and exit says nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except KeyboardInterrupt:
        print(f"tokenbucket {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except TokenbucketError as exc:
        print(f"tokenbucket {args.command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_DATA
    except OSError as exc:  # the file named on the command line: missing, unreadable, a full disk
        print(f"tokenbucket {args.command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_DATA


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
