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

Every :class:`~tokenbucket.tokens.spec.TokenSpec` field has a flag, so a quick question needs no
config file; flags override ``--config``'s ``[tokens]`` section.

Each verb is one module beside this one (``inspect_`` for ``inspect``) with ``add_arguments(parser)``
and ``run(args) -> int``; the flags and helpers they share are in ``_common``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from tokenbucket._exceptions import TokenbucketError

__all__ = ["build_parser", "main"]


class Verb(Protocol):
    """What a verb module provides (a module satisfies a protocol by its functions)."""

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
    ("demo", "demo", "the main job on a realistic multi-camera dataset"),
)


def verb_module(module: str) -> Verb:
    """The verb's module (NOTE [ Verbs load on demand ])."""
    return cast(Verb, importlib.import_module(f"tokenbucket.cli.{module}"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (``only``) one whose other verbs are listed without their flags.

    NOTE [ Verbs load on demand ]
    A verb module imports its stages at the top (torch, pyarrow: seconds), so ``main`` loads the
    module of the verb it runs and no other: ``tokenbucket gpus`` does not pay for the profiler.
    """
    parser = argparse.ArgumentParser(prog="tokenbucket", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module, help_text in VERBS:
        verb_parser = sub.add_parser(name, help=help_text)
        if only is None or name == only:
            verb = verb_module(module)
            verb.add_arguments(verb_parser)
            verb_parser.set_defaults(func=verb.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)  # the verb: the first positional
    parser = build_parser(chosen or "")  # NOTE [ Verbs load on demand ]: none for --help or a bad verb
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except TokenbucketError as exc:
        print(f"tokenbucket {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
