"""A fuzz guard of the command line (NOTE [ CLI error path ]): every verb, over truncated, empty,
binary-garbage, wrong-type and huge-value inputs, ends in exit status 0 or one line on stderr,
never a traceback, and within a bounded time.

NOTE [ CLI fuzz ]
The verbs are read from the real parser (``build_parser``), so a new verb is fuzzed without an
edit here: every flag that takes a value, and every positional, is given generic bad values on
top of a command that works (``BASES``; a verb without one starts from its module's
``EXAMPLE``). The inputs that have structure are mutated from a valid seed: metadata (Parquet,
JSONL, CSV), manifests, Hugging Face ``config.json`` and ``preprocessor_config.json``,
``tokenbucket.toml``, run logs, ``--sample`` JSON, profiles, calibrations and a LeRobot
``meta/`` folder. A seed is cut short, emptied, replaced by random bytes or bit-flipped, and
each of its fields is given values of the wrong type and huge values.

Each case runs in-process through ``main()`` (a subprocess per case would cost a second each)
under an interval timer: a case still running after ``HANG_S`` seconds is a hang. A case fails
when it raises (a traceback), warns (a warning is two lines on stderr), hangs, exits with
another status than 0, 1 or 2, or is refused in anything but one ``tokenbucket VERB: error:``
line. ``test_cli_fuzz_harness_fails_on_a_traceback_a_hang_and_two_lines`` keeps the harness
honest: it must catch each of those.

The cases are deterministic (seeded); the slow ones (the profiler measuring a Hugging Face
model, the demo training, the report drawing its plots) are marked ``slow``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import decimal
import importlib
import io
import itertools
import json
import math
import random
import shlex
import signal
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbucket.cli.main import VERBS, build_parser, main
from tokenbucket.cost.measured import Profile

HANG_S = 10.0  # a case still running after this is a hang (each takes well under a second)

# -- running one case ------------------------------------------------------------------------------


class _Hang(BaseException):
    """Raised in the running case by the interval timer (a BaseException: no ``except Exception`` eats it)."""


@dataclasses.dataclass
class Outcome:
    code: int | None
    out: str
    err: str
    seconds: float
    crash: str | None = None  # the traceback, when the run raised
    hang: bool = False
    warned: list[str] = dataclasses.field(default_factory=list)

    def problem(self) -> str | None:
        """Why this run breaks the CLI's contract (None: it keeps it)."""
        if self.hang:
            return f"hang: still running after {HANG_S:g} s"
        if self.crash is not None:
            return "traceback: " + self.crash.strip().splitlines()[-1]
        if self.warned:
            return f"warning: {self.warned[0]}"
        if self.code not in (0, 1, 2):
            return f"exit status {self.code}"
        if "Traceback" in self.err or "Traceback" in self.out:
            return "traceback printed"
        if self.code != 0:
            lines = [line for line in self.err.splitlines() if line.strip()]
            if len(lines) != 1 or not (lines[0].startswith("tokenbucket") and ": error: " in lines[0]):
                return f"not one error line: {self.err[:300]!r}"
        return None


def run_cli(argv: list[str], hang_s: float = HANG_S) -> Outcome:
    """``main(argv)`` in this process, as a shell would see it, stopped after ``hang_s`` seconds."""
    out, err = io.StringIO(), io.StringIO()

    def stop(signum: int, frame: object) -> None:
        raise _Hang

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, hang_s)
    start = time.perf_counter()
    outcome = Outcome(None, "", "", 0.0)
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            try:
                outcome.code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                outcome.code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            outcome.warned = [f"{w.category.__name__}: {w.message}" for w in caught]
    except _Hang:
        outcome.hang = True
    except BaseException:  # anything else main let through is a traceback for the user
        outcome.crash = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    outcome.out, outcome.err, outcome.seconds = out.getvalue(), err.getvalue(), time.perf_counter() - start
    return outcome


# -- the verbs, from the real parser ------------------------------------------------------------------


def parser_verbs() -> dict[str, argparse.ArgumentParser]:
    """Every verb the real parser has, with its parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


VERB_PARSERS = parser_verbs()
VERB_NAMES = sorted(VERB_PARSERS)


def value_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options that take a value (not --help, not a switch)."""
    return [
        a
        for a in parser._actions
        if a.option_strings and a.nargs != 0 and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]


def positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings]


# -- seeds: one valid input of each kind ----------------------------------------------------------------

N_ROWS = 24
META_COLUMNS = ("key", "cameras", "frames", "height", "width", "text_tokens")
LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
}  # fmt: skip
QWEN_VISION = {
    "depth": 2, "embed_dim": 32, "mlp_ratio": 4, "num_heads": 2, "hidden_size": 64, "patch_size": 14,
    "spatial_merge_size": 2, "temporal_patch_size": 2,
}  # fmt: skip
QWEN = {**LLAMA, "model_type": "qwen2_vl", "vision_config": QWEN_VISION}
QWEN_PRE = {"min_pixels": 3136, "max_pixels": 200704}
TOML = '[tokens]\npatch = 14\ntext = "text_tokens"\n\n[model]\nhidden = 64\nlayers = 2\nheads = 4\n'
SAMPLE = {"cameras": 2, "frames": 4, "height": 224, "width": 224}
STAGED_SAMPLE = {"images": 1, "height": 224, "width": 224, "text_tokens": 32}
LEROBOT_INFO = {
    "codebase_version": "v2.0", "total_episodes": 3, "total_frames": 30, "fps": 10, "chunks_size": 1000,
    "features": {
        "observation.image": {"dtype": "video", "shape": [96, 96, 3], "names": ["height", "width", "channel"]},
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    },
}  # fmt: skip


def meta_rows(n: int = N_ROWS) -> list[dict[str, Any]]:
    return [
        {
            "key": f"s{i:03d}",
            "cameras": 1 + i % 3,
            "frames": 1 + i % 8,
            "height": 224,
            "width": 224,
            "text_tokens": 8 * i,
        }
        for i in range(n)
    ]


@dataclasses.dataclass
class Seeds:
    root: Path
    parquet: Path
    jsonl: Path
    csv: Path
    toml: Path
    llama: Path  # a folder holding config.json
    qwen: Path  # config.json and preprocessor_config.json
    manifest: Path
    log: Path
    calibration: Path
    profile: Path
    sample: Path
    lerobot: Path
    _count: Iterator[int] = dataclasses.field(default_factory=itertools.count)
    mutants: dict[str, list[tuple[str, Path]]] = dataclasses.field(default_factory=dict)

    def fresh(self, name: str = "out.parquet") -> Path:
        """A path no case has used (for --out and the like)."""
        folder = self.root / "outs" / str(next(self._count))
        folder.mkdir(parents=True)
        return folder / name


def _write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    from tests.test_step_time import tiny_run  # a block model's manifest and a monitor log of its run

    root = tmp_path_factory.mktemp("fuzz")
    rows = meta_rows()
    pq.write_table(pa.Table.from_pylist(rows), root / "meta.parquet")
    (root / "meta.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "meta.csv").write_text(
        ",".join(META_COLUMNS) + "\n" + "".join(",".join(str(r[c]) for c in META_COLUMNS) + "\n" for r in rows)
    )
    (root / "tokenbucket.toml").write_text(TOML)
    _write_json(root / "llama" / "config.json", LLAMA)
    _write_json(root / "qwen" / "config.json", QWEN)
    _write_json(root / "qwen" / "preprocessor_config.json", QWEN_PRE)
    (root / "run").mkdir()
    _, manifest, log = tiny_run(root / "run")
    calibration = root / "calibration.json"
    assert run_cli(["calibrate", str(log), "--out", str(calibration)]).code == 0
    profile = root / "profile.json"
    points = ((1, 64, 2**28), (2, 64, 2**29), (1, 128, 2**29), (2, 128, 2**30))
    Profile(points=points, target="fake-cpu", dtype="bf16", torch_version="2", model="m", device="fake").save(profile)
    lerobot = root / "lerobot"
    _write_json(lerobot / "meta" / "info.json", LEROBOT_INFO)
    (lerobot / "meta" / "episodes.jsonl").write_text(
        "".join(json.dumps({"episode_index": e, "length": 10, "tasks": ["t"]}) + "\n" for e in range(3))
    )
    return Seeds(
        root=root, parquet=root / "meta.parquet", jsonl=root / "meta.jsonl", csv=root / "meta.csv",
        toml=root / "tokenbucket.toml", llama=root / "llama", qwen=root / "qwen", manifest=manifest, log=log,
        calibration=calibration, profile=profile, sample=_write_json(root / "sample.json", SAMPLE), lerobot=lerobot,
    )  # fmt: skip


# -- mutants -------------------------------------------------------------------------------------------------

# values of the wrong type and huge values, for any field of a JSON or TOML input
WRONG: tuple[tuple[str, object], ...] = (
    ("text", "x"), ("fraction", 1.5), ("negative", -1), ("zero", 0), ("null", None), ("bool", True),
    ("list", [1, 2]), ("object", {"a": 1}), ("1e9", 10**9), ("2^63", 2**63), ("1e30", 10**30),
    ("1e308", 1e308), ("nan", math.nan), ("inf", math.inf),
)  # fmt: skip


def byte_mutants(seed: Path, where: Path, *, name: str | None = None) -> list[tuple[str, Path]]:
    """``seed``'s bytes emptied, cut short, replaced by random bytes, bit-flipped; a folder or
    nothing in its place. Each mutant is a file named like the seed (``name``) in its own folder."""
    data = seed.read_bytes()
    rng = random.Random(len(data))
    flipped = bytearray(data)
    for i in rng.sample(range(len(data) // 4, len(data)), min(8, max(0, len(data) - len(data) // 4))):
        flipped[i] ^= 0xFF
    variants: dict[str, bytes | None] = {
        "empty": b"",
        "cut-half": data[: len(data) // 2],
        "cut-last-byte": data[:-1],
        "random-bytes": rng.randbytes(2048),
        "bit-flips": bytes(flipped),
        "nul-bytes": b"\0" * 64,
        "not-utf8": b"\xff\xfe" + data,
        "deep-nesting": b"[" * 100_000,
        "folder": None,
    }
    out = []
    for label, content in variants.items():
        path = where / f"bytes-{label}" / (name or seed.name)
        path.parent.mkdir(parents=True)
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)
        out.append((label, path))
    out.append(("missing", where / "missing" / (name or seed.name)))
    return out


def _column_arrays(n: int) -> dict[str, pa.Array]:
    """Whole-column values of the wrong type, or huge, for a Parquet file."""
    return {
        "string": pa.array(["x"] * n),
        "float": pa.array([1.5] * n),
        "negative": pa.array([-1] * n),
        "zero": pa.array([0] * n),
        "null": pa.nulls(n),
        "bool": pa.array([True] * n),
        "list": pa.array([[1, 2]] * n),
        "struct": pa.array([{"a": 1}] * n),
        "int64-max": pa.array([2**63 - 1] * n),
        "uint64-max": pa.array([2**64 - 1] * n, pa.uint64()),
        "float-huge": pa.array([1e308] * n),
        "nan": pa.array([math.nan] * n),
        "binary-not-utf8": pa.array([b"\xff%d" % i for i in range(n)], pa.binary()),
        "dictionary": pa.array([str(i) for i in range(n)]).dictionary_encode(),
        "decimal": pa.array([decimal.Decimal("1.5")] * n),
        "one-huge-row": pa.array([1] * (n - 1) + [2**62]),
        "one-negative-row": pa.array([1] * (n - 1) + [-(2**62)]),
    }


def metadata_mutants(seeds: Seeds) -> list[tuple[str, Path]]:
    """Metadata files with a broken column, row, line or cell, in each format, and their bytes broken."""
    where = seeds.root / "meta-mutants"
    out: list[tuple[str, Path]] = []
    good = pa.Table.from_pylist(meta_rows())

    def parquet(label: str, table: pa.Table) -> None:
        path = where / f"{label}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        out.append((f"parquet:{label}", path))

    for column in META_COLUMNS:
        i = good.schema.get_field_index(column)
        for label, array in _column_arrays(good.num_rows).items():
            parquet(f"{column}-{label}", good.set_column(i, column, array))
        parquet(f"no-{column}", good.remove_column(i))
    keys = pa.array([b"s%03d" % i for i in range(N_ROWS - 1)] + [b"s\xff"], pa.binary())
    parquet("key-binary-one-not-utf8", good.set_column(0, "key", keys))
    parquet("key-duplicates", good.set_column(0, "key", pa.array(["same"] * N_ROWS)))
    parquet("no-rows", good.slice(0, 0))
    parquet("no-columns", pa.table({"other": [1, 2]}))
    per_camera = [{"name": "a", "frames": 4, "height": 224, "width": 224}]
    for label, value in WRONG:
        parquet(f"cameras-list-height-{label}", _per_camera(good, [{**per_camera[0], "height": _arrow_safe(value)}]))
    parquet("cameras-list-1000", _per_camera(good, per_camera * 1000))
    parquet("cameras-list-empty", _per_camera(good, []))

    rows = meta_rows()
    for column in META_COLUMNS:
        for label, value in WRONG:
            lines = [json.dumps(r) for r in rows]
            lines[3] = json.dumps({**rows[3], column: value})
            path = where / f"{column}-{label}.jsonl"
            path.write_text("\n".join(lines) + "\n")
            out.append((f"jsonl:{column}-{label}", path))
        lines = [json.dumps(r) for r in rows]
        lines[3] = json.dumps({k: v for k, v in rows[3].items() if k != column})
        path = where / f"row-without-{column}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        out.append((f"jsonl:row-without-{column}", path))
    for label, line in (("list-line", "[1, 2]"), ("number-line", "7"), ("cut-line", '{"key": "s'), ("blank", "")):
        path = where / f"{label}.jsonl"
        path.write_text("\n".join([json.dumps(r) for r in rows[:3]] + [line] + [json.dumps(rows[3])]) + "\n")
        out.append((f"jsonl:{label}", path))

    cells = ("x", "1.5", "-1", "", "99999999999999999999999", "1e308", "nan", '"')
    for column in META_COLUMNS:
        for cell in cells:
            lines = [",".join(META_COLUMNS)] + [",".join(str(r[c]) for c in META_COLUMNS) for r in rows]
            lines[4] = ",".join(cell if c == column else str(rows[3][c]) for c in META_COLUMNS)
            path = where / f"{column}-{cells.index(cell)}.csv"
            path.write_text("\n".join(lines) + "\n")
            out.append((f"csv:{column}={cell!r}", path))
    (where / "ragged.csv").write_text(",".join(META_COLUMNS) + "\ns0,1\n")
    out.append(("csv:ragged", where / "ragged.csv"))
    (where / "header-only.csv").write_text(",".join(META_COLUMNS) + "\n")
    out.append(("csv:header-only", where / "header-only.csv"))

    for seed in (seeds.parquet, seeds.jsonl, seeds.csv):
        out += [(f"{seed.suffix[1:]}:{label}", p) for label, p in byte_mutants(seed, where / seed.suffix[1:])]
    return out


def _arrow_safe(value: object) -> object:
    """``value`` as Parquet can hold it in a struct field (ints past int64 as text)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63 else value


def _per_camera(table: pa.Table, cameras: list[dict[str, Any]]) -> pa.Table:
    """``table`` with the per-camera schema: every row's ``cameras`` is ``cameras``."""
    column = pa.array([cameras] * table.num_rows)
    return table.drop_columns(["frames", "height", "width"]).set_column(1, "cameras", column)


def json_field_mutants(
    seed: dict[str, Any], where: Path, name: str, *, nested: tuple[str, ...] = (), extra: tuple[str, ...] = ()
) -> list[tuple[str, Path]]:
    """``seed`` (a JSON object) written once per field and wrong value, and once without each field;
    ``nested`` names objects within whose fields are mutated too; ``extra`` names keys to add."""
    out: list[tuple[str, Path]] = []

    def write(label: str, data: object) -> None:
        path = where / label.replace("/", "_") / name
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(data))
        out.append((label, path))

    for key in [*seed, *extra]:
        for label, value in WRONG:
            write(f"{key}={label}", {**seed, key: value})
        if key in seed:
            write(f"no-{key}", {k: v for k, v in seed.items() if k != key})
    for outer in nested:
        inner = seed[outer]
        for key in inner:
            for label, value in WRONG:
                write(f"{outer}.{key}={label}", {**seed, outer: {**inner, key: value}})
    for label, value in (("a-list", [seed]), ("a-string", "config"), ("a-number", 7), ("null", None)):
        write(f"top-level-{label}", value)
    return out


# the composite model types, each with a key only it reads, given bad values
COMPOSITE_KEYS: dict[str, tuple[str, ...]] = {
    "llava": ("vision_feature_layer", "vision_feature_select_strategy", "multimodal_projector_bias"),
    "llava_next": ("image_grid_pinpoints", "vision_feature_layer"),
    "paligemma": ("projection_dim", "text_config"),
    "idefics3": ("scale_factor", "vision_config"),
    "smolvlm": ("scale_factor", "text_config"),
    "qwen2_5_vl": ("vision_config", "tie_word_embeddings"),
    "gemma2": ("head_dim", "final_logit_softcapping"),
    "gemma": ("head_dim", "tie_word_embeddings"),
    "qwen2": ("num_key_value_heads", "rope_scaling"),
}
IDEFICS_PRE = {"size": {"longest_edge": 1456}, "max_image_size": {"longest_edge": 364}, "do_image_splitting": True}


def hf_config_mutants(seeds: Seeds) -> list[tuple[str, Path]]:
    """config.json folders: every field of a decoder and of a Qwen2-VL tower wrong, a composite of
    each supported type with its own keys wrong, preprocessor_config.json wrong, and bytes broken."""
    where = seeds.root / "hf-mutants"
    out = [(f"llama:{label}", p.parent) for label, p in json_field_mutants(LLAMA, where / "llama", "config.json")]
    qwen = json_field_mutants(QWEN, where / "qwen", "config.json", nested=("vision_config",))
    out += [(f"qwen2_vl:{label}", p.parent) for label, p in qwen if label.startswith("vision_config")]
    for model_type, keys in COMPOSITE_KEYS.items():
        base = {"model_type": model_type}
        for key in keys:
            for label, value in WRONG:
                path = _write_json(where / model_type / f"{key}={label}" / "config.json", {**base, key: value})
                out.append((f"{model_type}:{key}={label}", path.parent))
        path = _write_json(where / model_type / "defaults" / "config.json", base)
        out.append((f"{model_type}:defaults", path.parent))
    for model_type, pre, nested in (("qwen2_vl", QWEN_PRE, ()), ("idefics3", IDEFICS_PRE, ("size", "max_image_size"))):
        for label, path in json_field_mutants(pre, where / f"{model_type}-pre", "preprocessor_config.json",
                                              nested=nested):  # fmt: skip
            _write_json(path.parent / "config.json", QWEN if model_type == "qwen2_vl" else {"model_type": model_type})
            out.append((f"{model_type}:preprocessor:{label}", path.parent))
    out += [(f"config.json:{label}", p) for label, p in byte_mutants(seeds.llama / "config.json", where / "bytes")]
    return out


def toml_mutants(seeds: Seeds) -> list[tuple[str, Path]]:
    """tokenbucket.toml with each value of [tokens] and [model] wrong, and its bytes broken."""
    where = seeds.root / "toml-mutants"
    values = (
        ("text", '"x"'), ("fraction", "1.5"), ("negative", "-1"), ("zero", "0"), ("bool", "true"),
        ("list", "[1, 2]"), ("table", "{a = 1}"), ("2^63", str(2**63)), ("1e30", str(10**30)), ("1e308", "1e308"),
        ("nan", "nan"), ("inf", "inf"),
    )  # fmt: skip
    out = []
    lines = TOML.splitlines()
    for i, line in enumerate(lines):
        if "=" not in line:
            continue
        key = line.split("=")[0].strip()
        for label, value in values:
            path = where / f"{i}-{key}={label}" / "tokenbucket.toml"
            path.parent.mkdir(parents=True)
            path.write_text("\n".join([*lines[:i], f"{key} = {value}", *lines[i + 1 :]]) + "\n")
            out.append((f"{key}={label}", path))
    path = where / "unknown-section" / "tokenbucket.toml"
    path.parent.mkdir(parents=True)
    path.write_text(TOML + "\n[mystery]\nx = 1\n")
    out.append(("unknown-section", path))
    return out + byte_mutants(seeds.toml, where / "bytes")


def log_mutants(seeds: Seeds) -> list[tuple[str, Path]]:
    """The run log with each field of its first step event wrong, events of odd kinds, and its bytes broken."""
    where = seeds.root / "log-mutants"
    lines = seeds.log.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    first_step = next(i for i, e in enumerate(events) if e.get("event") == "step")
    start = next((i for i, e in enumerate(events) if e.get("event") == "start"), 0)
    out = []

    def write(label: str, new_lines: list[str]) -> None:
        path = where / label / "run.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("\n".join(new_lines) + "\n")
        out.append((label, path))

    for index, kind in ((first_step, "step"), (start, events[start].get("event", "first"))):
        event = events[index]
        for key in list(event):
            for label, value in WRONG:
                write(f"{kind}.{key}={label}", [*lines[:index], json.dumps({**event, key: value}), *lines[index + 1 :]])
            write(f"{kind}-without-{key}", [*lines[:index], json.dumps({k: v for k, v in event.items() if k != key})])
    for label, line in (
        ("a-list-line", "[1]"), ("oom-without-bucket", '{"event": "oom", "time": 1}'),
        ("risk-huge", '{"event": "risk", "time": 1, "step": 1, "bucket": 99999999999999999999}'),
        ("unknown-event", '{"event": "mystery"}'), ("cut-middle-line", '{"event": "st'),
    ):  # fmt: skip
        write(label, [*lines[:first_step], line, *lines[first_step:]])
    write("start-only", lines[:first_step])
    return out + byte_mutants(seeds.log, where / "bytes")


def manifest_mutants(seeds: Seeds) -> list[tuple[str, Path]]:
    """The manifest's bytes broken, a metadata file in its place, and footers with each field wrong."""
    where = seeds.root / "manifest-mutants"
    out = byte_mutants(seeds.manifest, where / "bytes")
    table = pq.read_table(seeds.manifest)
    stamp = json.loads(pq.read_metadata(seeds.manifest).metadata[b"tokenbucket"])

    def write(label: str, footer: str) -> None:
        path = where / label / "manifest.parquet"
        path.parent.mkdir(parents=True)
        with pq.ParquetWriter(path, table.schema) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata({"tokenbucket": footer})
        out.append((f"footer:{label}", path))

    for key in stamp:
        for label, value in WRONG:
            write(f"{key}={label}", json.dumps({**stamp, key: value}))
        write(f"no-{key}", json.dumps({k: v for k, v in stamp.items() if k != key}))
    for label, footer in (("not-json", "{"), ("a-list", "[]"), ("empty-object", "{}"), ("deep", "[" * 100_000)):
        write(label, footer)
    out.append(("metadata-file", seeds.parquet))
    parts = where / "empty-part-folder"
    (parts / "part-00000.parquet").parent.mkdir(parents=True)
    (parts / "part-00000.parquet").write_bytes(b"")
    out.append(("empty-part-folder", parts))
    return out


def sample_mutants(seed: dict[str, Any]) -> list[tuple[str, str]]:
    """``--sample`` values: each field wrong, JSON that is not an object, text that is not JSON."""
    out = [(f"{key}={label}", json.dumps({**seed, key: value})) for key in seed for label, value in WRONG]
    out += [(f"no-{key}", json.dumps({k: v for k, v in seed.items() if k != key})) for key in seed]
    out += [
        ("empty", ""), ("cut", json.dumps(seed)[:-3]), ("list", "[1, 2]"), ("null", "null"), ("number", "7"),
        ("deep", "[" * 100_000), ("unknown-key", json.dumps({**seed, "mystery": 1})), ("huge-text", "x" * 100_000),
        ("at-missing", "@/nonexistent/sample.json"), ("at-folder", "@/"), ("at-nothing", "@"),
    ]  # fmt: skip
    return out


def file_json_mutants(seed: Path, where: Path) -> list[tuple[str, Path]]:
    """A JSON file (a profile, a calibration) with each top-level field wrong, and its bytes broken."""
    data = json.loads(seed.read_text())
    return json_field_mutants(data, where, seed.name) + byte_mutants(seed, where / "bytes")


def lerobot_mutants(seeds: Seeds) -> list[tuple[str, Path]]:
    """LeRobot dataset folders whose info.json or episodes.jsonl is wrong."""
    where = seeds.root / "lerobot-mutants"
    episodes = (seeds.lerobot / "meta" / "episodes.jsonl").read_text()
    out = []
    infos = json_field_mutants(LEROBOT_INFO, where / "info", "info.json", nested=("features",))
    infos += byte_mutants(seeds.lerobot / "meta" / "info.json", where / "info-bytes")
    for label, info in infos:
        root = where / "datasets" / f"info-{len(out)}"
        (root / "meta").mkdir(parents=True)
        if info.exists():
            (root / "meta" / "info.json").symlink_to(info)
        (root / "meta" / "episodes.jsonl").write_text(episodes)
        out.append((f"info.json:{label}", root))
    for label, path in byte_mutants(seeds.lerobot / "meta" / "episodes.jsonl", where / "episodes-bytes"):
        root = where / "datasets" / f"episodes-{len(out)}"
        (root / "meta").mkdir(parents=True)
        (root / "meta" / "info.json").write_text(json.dumps(LEROBOT_INFO))
        if path.exists():
            (root / "meta" / "episodes.jsonl").symlink_to(path)
        out.append((f"episodes.jsonl:{label}", root))
    return out


# -- the cases -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    verb: str
    name: str
    argv: tuple[str, ...]


def bases(seeds: Seeds) -> dict[str, list[str]]:
    """A command that works, per verb, that the generic flag values are added to."""
    plan_tail = ["--budget-gib", "10", "--on-oversize", "reject", "--quiet"]
    return {
        "tokens": ["tokens", str(seeds.parquet), "--patch", "14", "--text", "text_tokens"],
        "gpus": ["gpus"],
        "cost": ["cost", "--batch", "2", "--length", "256", "--hidden", "64", "--layers", "2", "--heads", "4"],
        "ledger": ["ledger", "--sample", json.dumps(SAMPLE), "--hidden", "64", "--layers", "2", "--heads", "4"],
        "profile": [
            "profile", "tokenbucket.cost.reference:ReferenceTransformer", "--hidden", "64", "--layers", "1",
            "--heads", "4", "--batch", "1", "--length", "32",
        ],
        "plan": ["plan", str(seeds.parquet), "--patch", "14", "--out", "{out}", *plan_tail],
        "inspect": ["inspect", str(seeds.manifest)],
        "report": ["report", str(seeds.log)],
        "calibrate": ["calibrate", str(seeds.log)],
        "replan": ["replan", str(seeds.manifest), "--from-log", str(seeds.log)],
        "demo": ["demo", "--samples", "20", "--out", "{out-dir}"],
    }  # fmt: skip


def base_of(verb: str, seeds: Seeds) -> list[str]:
    """``bases(seeds)[verb]``, or for a verb added since, its module's EXAMPLE (NOTE [ CLI fuzz ])."""
    known = bases(seeds)
    if verb in known:
        return known[verb]
    module = importlib.import_module(f"tokenbucket.cli.{dict((n, m) for n, m, _ in VERBS)[verb]}")
    return shlex.split(module.EXAMPLE.splitlines()[0])[1:]


# values any flag or positional is given (the flag's own type refuses most; what passes must run)
GENERIC: tuple[str, ...] = (
    "", "0", "-1", "99999999999999999999", "1e400", "nan", "x", "{", "[1, 2]", "@",
    "{garbage}", "{empty}", "{folder}", "a" * 5000, "[" * 100_000,
)  # fmt: skip


def generic_cases(verb: str, seeds: Seeds, per_flag: int = 4) -> list[Case]:
    """Every value-taking flag and positional of ``verb`` (from its parser) given ``per_flag``
    of the GENERIC values (rotating, so together they cover all) on top of the verb's base;
    each switch on; a stray argument and an unknown flag."""
    parser = VERB_PARSERS[verb]
    base = base_of(verb, seeds)
    out = []
    for k, action in enumerate(value_flags(parser)):
        flag = action.option_strings[-1]
        for j in range(per_flag):
            value = GENERIC[(k * per_flag + j) % len(GENERIC)]
            out.append(Case(verb, f"{flag} {value[:20]!r}", (*base[1:], flag, value)))
        if action.type is not None and getattr(action.type, "__name__", "") in ("positive_int", "non_negative_int"):
            out.append(Case(verb, f"{flag} huge", (*base[1:], flag, "99999999999999999999")))
    for action in parser._actions:  # each switch on, alone
        if action.option_strings and action.nargs == 0 and not isinstance(action, argparse._HelpAction):
            out.append(Case(verb, f"switch {action.option_strings[-1]}", (*base[1:], action.option_strings[-1])))
    out.append(Case(verb, "stray argument", (*base[1:], "stray")))
    out.append(Case(verb, "unknown flag", (*base[1:], "--mystery", "1")))
    given = [a for a in base[1:] if not a.startswith("-")]
    for k, _ in enumerate(positionals(parser)):
        if k >= len(given):
            break
        for value in GENERIC:
            argv = [value if a == given[k] else a for a in base[1:]]
            out.append(Case(verb, f"positional {k} {value[:20]!r}", tuple(argv)))
    return out


def structured_cases(verb: str, seeds: Seeds) -> tuple[list[Case], list[Case]]:
    """The verb's mutated inputs: (fast cases, slow cases)."""
    fast: list[Case] = []
    slow: list[Case] = []
    meta = _cached(seeds, "meta", metadata_mutants)
    hf = _cached(seeds, "hf", hf_config_mutants)
    toml = _cached(seeds, "toml", toml_mutants)
    logs = _cached(seeds, "log", log_mutants)
    manifests = _cached(seeds, "manifest", manifest_mutants)
    sample = json.dumps(SAMPLE)
    staged = json.dumps(STAGED_SAMPLE)
    plan = ["--budget-gib", "10", "--out", "{out}", "--quiet"]

    def add(into: list[Case], prefix: str, items: list[tuple[str, Any]], argv: Callable[[str], list[str]]) -> None:
        into.extend(Case(verb, f"{prefix}:{label}", tuple(argv(str(item)))) for label, item in items)

    if verb == "tokens":
        add(fast, "metadata", meta, lambda p: [p, "--patch", "14", "--text", "text_tokens?"])
        add(fast, "metadata-reject", meta, lambda p: [p, "--on-invalid", "reject", "--json"])
        add(fast, "sample", sample_mutants(SAMPLE), lambda s: ["--sample", s])
        add(fast, "config", toml, lambda p: ["--sample", sample, "--config", p])
    elif verb == "cost":
        add(
            fast, "hf-config", hf, lambda p: ["--hf-config", p, "--sample", staged, "--batch", "1", "--gpu", "H100-SXM"]
        )
        add(fast, "sample", sample_mutants(STAGED_SAMPLE), lambda s: ["--hf-config", str(seeds.qwen), "--sample", s,
                                                                       "--batch", "1", "--gpu", "H100-SXM"])  # fmt: skip
        add(fast, "config", toml, lambda p: ["--batch", "2", "--length", "256", "--config", p, "--gpu", "H100-SXM"])
    elif verb == "ledger":
        add(fast, "sample", sample_mutants(SAMPLE), lambda s: ["--sample", s, "--patch", "14"])
        add(fast, "hf-config", hf, lambda p: ["--hf-config", p, "--sample", staged])
    elif verb == "plan":
        add(fast, "metadata", meta, lambda p: [p, "--patch", "14", "--on-invalid", "reject", "--on-oversize",
                                               "reject", *plan])  # fmt: skip
        add(fast, "metadata-raise", meta[::5], lambda p: [p, "--patch", "14", *plan])
        add(fast, "hf-config", hf, lambda p: [str(seeds.parquet), "--hf-config", p, "--vision-share", "0.5", *plan])
        add(fast, "config", toml, lambda p: [str(seeds.parquet), "--config", p, *plan])
        profiles = file_json_mutants(seeds.profile, seeds.root / "profile-mutants")
        add(fast, "profile", profiles, lambda p: [str(seeds.parquet), "--patch", "14", "--profile", p, *plan])
        calibrations = file_json_mutants(seeds.calibration, seeds.root / "calibration-mutants")
        add(fast, "calibration", calibrations, lambda p: [str(seeds.parquet), "--patch", "14", "--calibration", p,
                                                          "--hidden", "64", "--layers", "2", "--heads", "4",
                                                          "--precision", "fp32", "--attention", "eager",
                                                          *plan])  # fmt: skip
        add(fast, "lerobot", lerobot_mutants(seeds), lambda p: ["--lerobot", p, *plan])
        fast.append(Case(verb, "oversize", (str(seeds.parquet), "--patch", "2", "--budget-gib", "0.001", "--out",
                                            "{out}")))  # fmt: skip
    elif verb == "profile":
        add(fast, "config", toml[::3], lambda p: [*base_of("profile", seeds)[1:], "--config", p])
        add(fast, "bounds-of", manifests, lambda p: ["--hf-config", str(seeds.llama), "--bounds-of", p])
        # NOTE [ CLI fuzz ]: the decoders' configs; a composite's go through transformers' own models
        decoders = [(label, p) for label, p in hf if label.startswith(("llama:", "config.json:"))]
        add(slow, "hf-config", decoders, lambda p: ["--hf-config", p, "--sample", staged, "--batch", "1"])
        add(slow, "sample", sample_mutants(STAGED_SAMPLE), lambda s: ["--hf-config", str(seeds.qwen), "--sample", s])
    elif verb == "inspect":
        add(fast, "manifest", manifests, lambda p: [p])
        add(fast, "manifest-json", manifests, lambda p: [p, "--json"])
    elif verb == "report":
        add(fast, "log", logs, lambda p: [p])
        add(fast, "log-json", logs, lambda p: [p, "--json"])
        add(slow, "log-out", logs[::4], lambda p: [p, "--out", "{out-dir}"])
    elif verb == "calibrate":
        add(fast, "log", logs, lambda p: [p, "--out", "{out}"])
        add(fast, "check", logs[::2], lambda p: [str(seeds.log), "--check", p, "--json"])
    elif verb == "replan":
        add(fast, "log", logs, lambda p: [str(seeds.manifest), "--from-log", p])
        add(fast, "manifest", manifests, lambda p: [p, "--from-log", str(seeds.log), "--json"])
    return fast, slow


def _cached(seeds: Seeds, kind: str, make: Callable[[Seeds], list[tuple[str, Path]]]) -> list[tuple[str, Path]]:
    if kind not in seeds.mutants:
        seeds.mutants[kind] = make(seeds)
    return seeds.mutants[kind]


def resolve(case: Case, seeds: Seeds) -> list[str]:
    """The case's argv with its placeholders filled: a fresh --out, the generic files."""
    garbage = seeds.root / "generic" / "garbage.bin"
    if not garbage.exists():
        garbage.parent.mkdir(parents=True)
        garbage.write_bytes(random.Random(0).randbytes(1024))
        (seeds.root / "generic" / "empty.json").write_bytes(b"")
        (seeds.root / "generic" / "folder").mkdir()
    fills = {
        "{garbage}": str(garbage),
        "{empty}": str(seeds.root / "generic" / "empty.json"),
        "{folder}": str(seeds.root / "generic" / "folder"),
    }
    argv = [case.verb]
    for arg in case.argv:
        if arg == "{out}":
            arg = str(seeds.fresh())
        elif arg == "{out-dir}":
            arg = str(seeds.fresh("dir"))
        argv.append(fills.get(arg, arg))
    return argv


def run_cases(cases: list[Case], seeds: Seeds, *, first_only: bool = False) -> tuple[list[str], dict[str, float]]:
    """Run every case (``first_only``: up to the first broken one); the broken ones as ``name:
    problem`` lines, and timing figures."""
    failures = []
    slowest = 0.0
    total = 0.0
    ran = 0
    for case in cases:
        outcome = run_cli(resolve(case, seeds))
        problem = outcome.problem()
        ran += 1
        slowest = max(slowest, outcome.seconds)
        total += outcome.seconds
        if problem is not None:
            failures.append(f"{case.verb} {case.name}: {problem}")
            if first_only:
                break
    return failures, {"cases": ran, "seconds": round(total, 2), "slowest_s": round(slowest, 2)}


# -- the tests -------------------------------------------------------------------------------------------------


@pytest.fixture
def in_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A case that writes to a relative path (``--out x``) writes here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_fuzz_every_verb_of_the_parser_has_cases(seeds: Seeds) -> None:
    # a verb added to the parser is fuzzed through its flags at once, from its EXAMPLE if need be
    assert set(VERB_NAMES) == {name for name, _, _ in VERBS}
    for verb in VERB_NAMES:
        assert generic_cases(verb, seeds), verb


# the verbs whose cases build models, plan datasets or draw plots (2-10 s each) are fuzzed in the slow tier
SLOW_VERBS = {"plan", "profile", "demo", "tokens", "report", "replan", "cost"}


@pytest.mark.parametrize(
    "verb", [pytest.param(v, marks=pytest.mark.slow) if v in SLOW_VERBS else v for v in VERB_NAMES]
)
def test_cli_fuzz_verb_ends_in_status_0_or_one_line_never_a_traceback_or_a_hang(
    verb: str, seeds: Seeds, in_scratch: Path, record_property: Callable[[str, object], None]
) -> None:
    base = run_cli(resolve(Case(verb, "base", tuple(base_of(verb, seeds)[1:])), seeds))
    if verb in bases(seeds):  # the mutants start from a command that works
        assert base.code == 0 and base.problem() is None, (base.problem(), base.err)
    fast, _ = structured_cases(verb, seeds)
    cases = generic_cases(verb, seeds, per_flag=1 if verb == "demo" else 4) + fast
    failures, figures = run_cases(cases, seeds)
    record_property("fuzz", figures)
    print(f"fuzz {verb}: {figures}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize(
    "verb",
    [
        pytest.param(
            "profile",
            marks=pytest.mark.xfail(
                strict=True,
                reason="profile --hf-config: a --sample or a config.json size past what transformers can build "
                "(hidden_size 1e30, text_tokens 1e9, images 1e9) still fails inside transformers or torch",
            ),
        ),
        "report",
    ],
)
def test_cli_fuzz_slow_inputs_end_in_status_0_or_one_line(
    verb: str, seeds: Seeds, in_scratch: Path, request: pytest.FixtureRequest
) -> None:
    # the profiler measuring a Hugging Face model (about a second each), the report drawing its plots.
    # Under a strict xfail one broken case is the whole verdict (a case after it that broke too would
    # not show), so that run stops there; once no case breaks, every case runs and the XPASS says so
    _, slow = structured_cases(verb, seeds)
    failures, figures = run_cases(slow, seeds, first_only=request.node.get_closest_marker("xfail") is not None)
    print(f"fuzz {verb} (slow): {figures}")
    assert not failures, "\n".join(failures)


def test_cli_fuzz_harness_fails_on_a_traceback_a_hang_and_two_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    # the guard would be worthless if it could not fail: each breach is caught
    module = importlib.import_module("tokenbucket.cli.gpus")

    def crash(args: argparse.Namespace) -> int:
        raise pa.ArrowInvalid("Invalid UTF8 payload")

    def hang(args: argparse.Namespace) -> int:
        while True:
            time.sleep(0.01)

    def two_lines(args: argparse.Namespace) -> int:
        print("tokenbucket gpus: error: one\nand another", file=__import__("sys").stderr)
        return 1

    def warns(args: argparse.Namespace) -> int:
        warnings.warn("overflow encountered", RuntimeWarning, stacklevel=1)
        return 0

    for fake, expected in ((crash, "traceback: pyarrow.lib.ArrowInvalid"), (hang, "hang"),
                           (two_lines, "not one error line"), (warns, "warning: RuntimeWarning")):  # fmt: skip
        monkeypatch.setattr(module, "run", fake)
        problem = run_cli(["gpus"], hang_s=0.5).problem()
        assert problem is not None and problem.startswith(expected), (fake.__name__, problem)
    monkeypatch.undo()
    assert run_cli(["gpus"]).problem() is None
