"""The test suite's census: tests per tier, and the outside oracles each tier reaches (issue 52).

Run the suite once under the oracle plugin, then this script over what it wrote:

    TOKENBUCKET_ORACLES=/tmp/oracles.json .venv/bin/python -m pytest -p tests._oracles -q -n 2
    .venv/bin/python benchmarks/test_census.py /tmp/oracles.json

It prints the count of tests in each tier (``-m "not slow"`` and ``-m slow``), the distinct
oracles the run constructed (models, processors, tokenizers, frameworks, data libraries,
process-group backends, memory trackers), which of them the fast tier reaches, and the static
names the test files import from the oracle packages (what a subprocess runs, which the plugin
cannot see). ``--compare OLD.json`` lists oracles in OLD that the new run lost.

``--coverage COV.json`` (``coverage json`` of a run of the fast tier) lists every module under
``src/`` none of whose functions ran: "every module exercised" means a line inside a function
or method body ran, not just the import.

    .venv/bin/python -m coverage run --source=src/tokenbucket -m pytest -q -m "not slow" -p no:randomly
    .venv/bin/python -m coverage json -o /tmp/cov.json

Reference (this machine, 2 cores): see the closing note of issue 52.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import subprocess
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = (
    "transformers",
    "lightning",
    "accelerate",
    "datasets",
    "peft",
    "torchdata",
    "ray",
    "webdataset",
    "diffusers",
)


def load(path: str) -> dict[str, list[str]]:
    """The plugin's records, the workers' files merged."""
    merged: dict[str, list[str]] = {}
    for name in sorted(glob.glob(path) + glob.glob(path + ".gw*")):
        with open(name) as f:
            merged.update(json.load(f))
    if not merged:
        raise SystemExit(f"test_census: no records at {path} (run pytest with -p tests._oracles first)")
    return merged


def tier_ids(marker: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {line.strip() for line in out.splitlines() if "::" in line}


def static_names() -> set[str]:
    """Names the test files import (or reach as attributes) from the oracle packages."""
    names: set[str] = set()
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        with open(path) as f:
            tree = ast.parse(f.read())
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                for alias in node.names:
                    names.add(f"{node.module.split('.')[0]}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        aliases[alias.asname or alias.name.split(".")[0]] = alias.name.split(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                names.add(f"{aliases[node.value.id]}.{node.attr}")
    return names


def unexercised(coverage_json: str) -> list[str]:
    """Modules under src/ with functions, none of whose bodies ran in the covered run."""
    with open(coverage_json) as f:
        files = {
            os.path.relpath(os.path.abspath(k), ROOT): set(v["executed_lines"])
            for k, v in json.load(f)["files"].items()
        }
    idle = []
    for path in sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, ROOT)
        with open(path) as f:
            tree = ast.parse(f.read())
        bodies = {
            line
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for stmt in node.body
            for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        }
        if bodies and not bodies & files.get(rel, set()):
            idle.append(rel)
    return idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", help="the path given as TOKENBUCKET_ORACLES")
    parser.add_argument("--compare", help="an older census JSON (--json of a former run): oracles it had that are gone")
    parser.add_argument("--json", help="write the census here")
    parser.add_argument("--coverage", help="coverage json of a fast-tier run: modules none of whose functions ran")
    args = parser.parse_args()
    records = load(args.records)
    fast, slow = tier_ids("not slow"), tier_ids("slow")
    everything = {o for found in records.values() for o in found}
    in_fast = {o for test, found in records.items() if test in fast for o in found}
    kinds = Counter(o.split(":")[0] for o in everything)
    print(f"tests: {len(fast) + len(slow)} ({len(fast)} fast, {len(slow)} slow); {len(records)} recorded by the plugin")
    print(f"oracles constructed: {len(everything)} ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})")
    print(f"reached by the fast tier: {len(in_fast)} of {len(everything)}")
    for oracle in sorted(everything - in_fast):
        print(f"  slow tier only: {oracle}")
    static = static_names()
    print(f"static names imported from the oracle packages: {len(static)}")
    census = {
        "tests": len(fast) + len(slow),
        "fast": len(fast),
        "oracles": sorted(everything),
        "static": sorted(static),
    }
    if args.compare:
        with open(args.compare) as f:
            old = json.load(f)
        lost = sorted(set(old["oracles"]) - everything) + sorted(set(old["static"]) - static)
        print(f"against {args.compare}: {old['tests']} tests, {len(old['oracles'])} oracles; lost: {lost or 'none'}")
    if args.coverage:
        idle = unexercised(args.coverage)
        print(f"modules under src/ whose functions the covered run never entered: {idle or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(census, f, indent=1)


if __name__ == "__main__":
    main()
