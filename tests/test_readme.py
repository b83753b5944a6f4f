"""Every ```python and ```bash block of README.md and of every page of the site (docs/**/*.md), run as
written in a fresh folder.

The folder holds what the README assumes a reader has: ``metadata.parquet`` (and ``metadata/``
of part files) with realistic multi-camera columns, a ``tokenbucket.toml``, ``examples/`` and
LeRobot folders ``datasets/<name>`` built from the real ``info.json`` files of
shared/data/lerobot. A section is a page and a heading (``docs/trainers/lightning.md#Under
Lightning``); Python blocks of one section share one namespace in order, as a reader runs them;
a section whose prose takes names from earlier ones
("with ``data``, ``cost`` ... as above") gets them from a small setup here, built with the
examples' own functions. A statement followed by ``# <value>`` must evaluate to that value.
Bash blocks run command by command through bash with the real ``tokenbucket`` script on PATH:
each exits 0, a ``# {...}`` line after a command is its JSON output (``[...]`` matches
anything), and every ``--out`` / ``--save`` / ``--plot`` it names exists afterwards.
A block preceded by ``<!-- no-run: reason -->`` is not run (at most 3 in all, each with a reason).
A page that shows README.md's text (``--8<-- "README.md:two-commands"``, pymdownx.snippets) holds no
fence of its own there: the block is README.md's, run once.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the front door, then the site's pages in a fixed order (docs/reference/ is generated: ```text only)
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent  # .venv/bin: the console script `tokenbucket` lives beside python
sys.path.insert(0, str(EXAMPLES))

Namespace = dict[str, object]


def example(name: str) -> ModuleType:
    """``examples/<name>.py`` (examples/ is on sys.path, not a package)."""
    return importlib.import_module(name)


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, its section, its place in the section, its first code line in the page."""

    section: str
    index: int
    lang: str
    code: str
    line: int
    no_run: str | None
    page: str = "README.md"  # relative to the repository root

    @property
    def where(self) -> str:
        """``page#heading``: the section a reader runs in one go (what SETUPS is keyed by)."""
        return f"{self.page}#{self.section}"

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-")
        return f"{self.page.removesuffix('.md')}#{slug}-{self.index}"


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The ```python and ```bash blocks of one page (```text, bare fences and tables are not code)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    section, counts, i = "", dict[str, int](), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        elif line.startswith("```"):
            lang = line[3:].strip()
            end = lines.index("```", i + 1)
            if lang in ("python", "bash"):
                before = next((x for x in reversed(lines[:i]) if x.strip()), "")
                marker = re.fullmatch(r"<!-- no-run:(.*)-->", before.strip())
                index = counts.get(section, 0)
                counts[section] = index + 1
                code = "\n".join(lines[i + 1 : end]) + "\n"
                no_run = marker[1].strip() if marker else None
                blocks.append(Block(section, index, lang, code, i + 2, no_run, page))
            i = end
        i += 1
    return blocks


BLOCKS = [b for page in PAGES for b in readme_blocks(page.read_text(), page.relative_to(ROOT).as_posix())]
RUN = [b for b in BLOCKS if b.no_run is None]
# the cases that take more than ~3 s (a trainer, a profile on fake tensors, a subprocess)
SLOW = {
    "README#quickstart-0",
    "docs/cost-model#will-it-fit-1",
    "docs/trainers/plain#feed-a-dataloader-0",
    "docs/trainers/lightning#under-lightning-0",
    "docs/trainers/hf-trainer#under-the-hugging-face-trainer-0",
    "docs/trainers/plain#under-torchrun-elastic-0",
    "docs/cli#cli-0",
    "docs/guides/platform#beyond-one-machine-the-ray-engine-0",
    "docs/guides/vlm#measure-a-real-model-instead-profile-hf-config-0",
    "docs/guides/world-models#buckets-of-resolution-frames-0",
}
# blocks that time real training steps on this machine and fit them (`tokenbucket calibrate` on the
# demo's CPU run): a neighbour on the cores can flatten the times it fits, so they run alone
# (`make test` runs the serial ones after its parallel pass)
SERIAL = {b.name for b in RUN if "calibrate" in b.code and "demo" in b.code}


# ----------------------------------------------------------------------------------------------
# the reader's files


def write_metadata(folder: Path, n: int = 240, seed: int = 0) -> pa.Table:
    """Multi-camera metadata as a VLA dataset has it: ``metadata.parquet`` and ``metadata/`` in 3 parts."""
    rng = np.random.default_rng(seed)
    side = rng.choice([224, 256, 448], n, p=[0.6, 0.3, 0.1])
    table = pa.table(
        {
            "key": [f"episode_{i // 10:04d}/frame_{i % 10:03d}" for i in range(n)],
            "cameras": rng.choice([1, 2, 3, 4], n),
            "frames": rng.choice([1, 2, 4, 8, 16], n),
            "height": side,
            "width": (side * rng.choice([1.0, 4 / 3], n)).astype(np.int64),
            "text_tokens": rng.integers(8, 96, n),
            "proprio_tokens": np.full(n, 1),
            "action_tokens": np.full(n, 50),
        }
    )
    pq.write_table(table, folder / "metadata.parquet")
    (folder / "metadata").mkdir()
    for p, start in enumerate(range(0, n, n // 3)):
        pq.write_table(table.slice(start, n // 3), folder / "metadata" / f"part-{p:05d}.parquet")
    return table


# the LeRobot datasets the README names: card in shared/data/lerobot, (episode, length) list
DATASETS = {
    "svla_so100_pickplace": ("svla_so100_pickplace.json", [(0, 6), (1, 4)]),
    "libero": ("libero.json", [(0, 8), (1, 6)]),
    "pusht": ("pusht.json", [(0, 5), (1, 7)]),
}
WEIGHTS = {"libero": 0.5}  # the weights the README gives (every other source: 1)


def write_datasets(folder: Path, lerobot_dir: str) -> dict[str, int]:
    """``datasets/<name>``: the real ``info.json`` and a made-up episode list; frames per dataset."""
    frames = {}
    for name, (card, episodes) in DATASETS.items():
        meta = folder / "datasets" / name / "meta"
        meta.mkdir(parents=True)
        (meta / "info.json").write_text(Path(lerobot_dir, card).read_text())
        lines = [json.dumps({"episode_index": e, "length": n, "tasks": ["pick"]}) for e, n in episodes]
        (meta / "episodes.jsonl").write_text("\n".join(lines) + "\n")
        frames[name] = sum(n for _, n in episodes)
    return frames


@dataclass
class Workspace:
    folder: Path
    metadata: pa.Table
    frames: dict[str, int]


@pytest.fixture
def workspace(tmp_path: Path, lerobot_dir: str, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    table = write_metadata(tmp_path)
    (tmp_path / "tokenbucket.toml").write_text('[tokens]\npatch = 14\ntext = "text_tokens"\n')
    (tmp_path / "examples").mkdir()
    for path in EXAMPLES.iterdir():
        if path.is_file():
            (tmp_path / "examples" / path.name).write_bytes(path.read_bytes())
    frames = write_datasets(tmp_path, lerobot_dir)
    # models/qwen2-vl-2b: Qwen2-VL-2B's config.json, the one the truth set measured (no weights)
    (tmp_path / "models" / "qwen2-vl-2b").mkdir(parents=True)
    configs = json.loads((Path(__file__).parent / "data" / "hf_truth.json").read_text())["configs"]
    (tmp_path / "models" / "qwen2-vl-2b" / "config.json").write_text(json.dumps(configs["qwen2-vl-2b"]))
    write_video_dit(tmp_path)
    monkeypatch.chdir(tmp_path)
    return Workspace(tmp_path, table, frames)


def write_video_dit(folder: Path) -> None:
    """``models/wan-1.3b``: Wan 2.1 T2V 1.3B's pipeline JSON files as the DiT truth set measured
    them (no weights), and ``clips.parquet``: video clips at three sizes and four lengths."""
    data = json.loads((Path(__file__).parent / "data" / "dit_truth.json").read_text())["configs"]["wan2.1-1.3b"]
    wan = folder / "models" / "wan-1.3b"
    (wan / "transformer").mkdir(parents=True)
    (wan / "vae").mkdir()
    (wan / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (wan / "transformer" / "config.json").write_text(json.dumps(data["transformer"]))
    t, s, c = data["vae"]
    vae = {"_class_name": "AutoencoderKLWan", "z_dim": c, "scale_factor_temporal": t, "scale_factor_spatial": s}
    (wan / "vae" / "config.json").write_text(json.dumps(vae))
    rng = np.random.default_rng(0)
    sizes = np.array([(480, 832), (720, 1280), (832, 480)])[rng.choice(3, 500)]
    pq.write_table(pa.table({
        "key": [f"clip{i:04d}" for i in range(500)], "frames": rng.choice([33, 49, 81, 121], 500),
        "height": sizes[:, 0], "width": sizes[:, 1], "text_tokens": np.full(500, 512),
    }), folder / "clips.parquet")  # fmt: skip


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------------------------
# what a section's prose takes from earlier sections ("as above"), built small


def tiny_setup(ns: Namespace) -> None:
    """``examples/lightning_train.py``'s tiny run: spec, lengths, cost, budget, plan, data, model."""
    lightning_train = example("lightning_train")

    from tokenbucket import BucketCollate, TokenBucketDataset, breakdown_table, plan_buckets
    from tokenbucket.testing import RandomTokens

    data, collate, cost = lightning_train.build()
    meta = lightning_train.metadata(96)
    lengths = breakdown_table(meta, lightning_train.SPEC).totals
    ns.update(
        spec=lightning_train.SPEC,
        metadata_table=meta,
        lengths=lengths,
        cost=cost,
        budget=4 * 2**20,
        plan=data.plan,
        data=data,
        collate=collate,
        my_dataset=RandomTokens(lengths, lightning_train.HIDDEN),
        model=lightning_train.Denoiser(),
        epochs=2,
        DataLoader=torch.utils.data.DataLoader,
        BucketCollate=BucketCollate,
        TokenBucketDataset=TokenBucketDataset,
        plan_buckets=plan_buckets,
    )


def setup_lightning(ns: Namespace) -> None:
    from tokenbucket import BucketMonitor

    tiny_setup(ns)
    ns["monitor"] = BucketMonitor(ns["plan"], sinks=["runs/lightning.jsonl"], cost_model=ns["cost"], data=ns["data"])  # type: ignore[arg-type]


def setup_accelerate(ns: Namespace) -> None:
    tiny_setup(ns)
    model = torch.nn.Linear(4, 4)
    ns.update(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def setup_hf_trainer(ns: Namespace) -> None:
    from tokenbucket import BucketCollate

    hf_trainer_train = example("hf_trainer_train")
    data, _ = hf_trainer_train.build()
    ns.update(data=data, model=hf_trainer_train.Denoiser(), BucketCollate=BucketCollate)


def setup_vla(ns: Namespace) -> None:
    from tokenbucket import CostModel, ModelSpec, TokenBucketDataset, breakdown_table, plan_buckets

    vla = example("lerobot_vla_train")

    meta = vla.metadata(24)
    lengths = breakdown_table(meta, vla.SPEC).totals
    cost = CostModel(ModelSpec(hidden=vla.HIDDEN, layers=2, heads=4, precision="fp32", attention="eager"))
    plan = plan_buckets(lengths, cost, 6 * 2**20, max_buckets=3, multiple=8)
    data = TokenBucketDataset(vla.LeRobotLike(meta), metadata=meta, spec=vla.SPEC, plan=plan)
    ns.update(data=data, cost=cost, DataLoader=torch.utils.data.DataLoader)


def setup_packing(ns: Namespace) -> None:
    tiny_setup(ns)
    calls: list[tuple[int, ...]] = []

    def model(tokens: torch.Tensor, position_ids: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        rows, length = position_ids.shape
        assert tokens.shape[:2] == (rows, length) and attn_mask.shape[-2:] == (length, length)
        calls.append(tuple(tokens.shape))
        return tokens

    ns.update(model=model, model_calls=calls)


def setup_stream(ns: Namespace) -> None:
    from tokenbucket import CostModel, ModelSpec, plan_buckets

    stream_train = example("stream_train")

    shards = Path("shards")
    shards.mkdir()
    ns.update(
        urls=stream_train.write_demo_shards(shards, n=64, shards=4),
        spec=stream_train.SPEC,
        cost=CostModel(ModelSpec(hidden=16, layers=2, heads=2, precision="fp32", attention="eager")),
        budget=48 * 2**20,
        world_size=2,
        plan_buckets=plan_buckets,
    )


def setup_monitor(ns: Namespace) -> None:
    tiny_setup(ns)
    data, model = ns["data"], ns["model"]
    ns["loader"] = torch.utils.data.DataLoader(data, batch_sampler=data.sampler(seed=0), collate_fn=ns["collate"])  # type: ignore[attr-defined, arg-type]

    def train_step(batch: dict[str, torch.Tensor]) -> float:
        mask = batch["attention_mask"]
        out = model.net(batch["tokens"], src_key_padding_mask=~mask)  # type: ignore[attr-defined]
        return float(((out - batch["tokens"]) ** 2)[mask].mean().detach())

    ns["train_step"] = train_step


def setup_cli(ws: Workspace) -> None:
    """A monitor log for ``tokenbucket report runs/run.jsonl`` (the README's *Monitor the run* writes one)."""
    example("train_tiny").main(steps=4, log=Path("runs/run.jsonl"))


# keyed by Block.where: the page and the heading whose prose says what it takes from elsewhere
SETUPS: dict[str, Callable[[Namespace], None]] = {
    "docs/trainers/plain.md#Feed a DataLoader": tiny_setup,
    "docs/trainers/lightning.md#Under Lightning": setup_lightning,
    "docs/trainers/accelerate.md#Under Accelerate": setup_accelerate,
    "docs/trainers/hf-trainer.md#Under the Hugging Face Trainer": setup_hf_trainer,
    "docs/guides/vla.md#Batches a VLA or VLM model eats": setup_vla,
    "docs/guides/workflow.md#Pack instead of pad": setup_packing,
    "docs/guides/video.md#Stream webdataset shards": setup_stream,
    "docs/guides/workflow.md#Monitor the run": setup_monitor,
}
CLI = "docs/cli.md#CLI"  # its `report runs/run.jsonl` reads a monitor log: setup_cli writes one


# ----------------------------------------------------------------------------------------------
# running Python blocks


STATED = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.operator, ast.unaryop, ast.Load)


def stated_value(comment: str) -> object | None:
    """The value a ``# 16*35*46 + 16*64`` or ``# ('a', 0): what it is`` comment states, else None."""
    for text in (comment, comment.split(":")[0]):
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            continue
        if all(isinstance(node, STATED) for node in ast.walk(tree)):
            value: object = eval(compile(tree, "<comment>", "eval"), {"__builtins__": {}})
            if isinstance(value, int | float | tuple):  # not a word in quotes, not `...`
                return value
    return None


def comments(code: str) -> dict[int, str]:
    """Line (1-based, in the block) → the text of its ``#`` comment."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string[1:].strip()
    return found


def statements(block: Block) -> list[tuple[ast.stmt, object | None]]:
    """The block's top-level statements (line numbers as in its page), each with its stated value."""
    tree = ast.parse(block.code, filename=block.page)
    notes = comments(block.code)
    out: list[tuple[ast.stmt, object | None]] = []
    for stmt in tree.body:
        expected = None
        if isinstance(stmt, ast.Expr) and stmt.end_lineno in notes:
            expected = stated_value(notes[stmt.end_lineno])
        ast.increment_lineno(stmt, block.line - 1)
        out.append((stmt, expected))
    return out


def run_python(block: Block, ns: Namespace) -> int:
    """Run ``block`` in ``ns`` statement by statement; returns how many stated values it checked."""
    checked = 0
    for stmt, expected in statements(block):
        if expected is None:
            exec(compile(ast.Module([stmt], []), block.page, "exec"), ns)
            continue
        value = eval(compile(ast.Expression(stmt.value), block.page, "eval"), ns)  # type: ignore[attr-defined]
        assert value == expected, f"{block.page}:{stmt.lineno}: {value!r}, the page says {expected!r}"
        checked += 1
    return checked


# ----------------------------------------------------------------------------------------------
# running bash blocks


def commands(code: str) -> list[tuple[str, str | None]]:
    """Each command (continuations joined) with the JSON output a ``# {...}`` line after it states."""
    out: list[tuple[str, str | None]] = []
    for line in code.replace("\\\n", " ").splitlines():
        text = line.strip()
        if text.startswith("# {") and out:
            out[-1] = (out[-1][0], text[2:])
        elif text and not text.startswith("#"):
            out.append((text, None))
    return out


def matches(actual: object, stated: object) -> bool:
    """``stated`` (``None`` where the README wrote ``[...]``) holds in ``actual``."""
    if stated is None:
        return True
    if isinstance(stated, dict):
        return isinstance(actual, dict) and all(k in actual and matches(actual[k], v) for k, v in stated.items())
    return actual == stated


def outputs(command: str) -> list[str]:
    """The files a command is asked to write."""
    argv = shlex.split(command, comments=True)
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--out", "--save", "--plot")]


def check_lerobot_manifest(path: Path, frames: dict[str, int], sources: list[str]) -> None:
    """Each source's frames, as many times as its weight says; keys prefixed with the source name in a mixture."""
    from tokenbucket.plan.manifest import load_manifest

    keys = load_manifest(path).table.column("key").to_pylist()
    assert len(set(keys)) == len(keys), f"{path.name}: duplicate keys"
    per_source: dict[str, int] = {}
    for key in keys:
        source = key.split("/")[0] if len(sources) > 1 else Path(sources[0].split("=")[-1]).name
        per_source[source] = per_source.get(source, 0) + 1
    names = {Path(s.split("=")[-1].split(":")[0]).name if "=" not in s else s.split("=")[0] for s in sources}
    assert set(per_source) == names, (path.name, per_source)
    for source, count in per_source.items():
        assert count == int(WEIGHTS.get(source, 1.0) * frames[source] + 0.5), (path.name, source, count)


def run_bash(block: Block, ws: Workspace) -> int:
    """Run every command of ``block``; returns how many stated outputs it checked."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    checked = 0
    for command, stated in commands(block.code):
        if "torchrun_train.py" in command:
            command += " --epochs 1"  # a short run: the elastic restart is tests/test_torchrun.py's
        proc = subprocess.run(
            ["bash", "-c", command], cwd=ws.folder, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, (
            f"{block.page} block {block.name}: `{command}` exit {proc.returncode}\n{proc.stderr[-3000:]}"
        )
        if stated is not None:
            wanted = json.loads(stated.replace("[...]", "null"))
            assert matches(json.loads(proc.stdout), wanted), (
                f"`{command}` printed {proc.stdout}, {block.page} says {stated}"
            )
            checked += 1
        for path in outputs(command):
            assert (ws.folder / path).exists(), f"`{command}` wrote no {path}"
        argv = shlex.split(command, comments=True)
        if "--lerobot" in argv:
            sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--lerobot"]
            check_lerobot_manifest(ws.folder / outputs(command)[0], ws.frames, sources)
            checked += 1
        if "torchrun" in argv:
            runs = [(ws.folder / "out" / f"steps-rank{r}.jsonl").read_text().splitlines() for r in (0, 1)]
            ids = [i for lines in runs for line in lines for i in json.loads(line)["ids"]]
            assert len(runs[0]) == len(runs[1]) > 0 and len(ids) == len(set(ids)) == 240  # each sample once
            checked += 1
    return checked


# ----------------------------------------------------------------------------------------------
# the tests


def test_readme_blocks_are_found_and_no_run_markers_say_why() -> None:
    sections = {b.where for b in BLOCKS}
    assert (
        len(BLOCKS) >= 29
        and {
            "README.md#Quickstart",
            "docs/getting-started.md#Quickstart",
            CLI,
            "docs/trainers/plain.md#Under torchrun (elastic)",
        }
        <= sections
    )
    # every page of the site is read, and every page but the generated ones and the home page has code
    assert {b.page for b in BLOCKS} >= {p.relative_to(ROOT).as_posix() for p in PAGES} - {
        "docs/index.md",
        "docs/limits.md",
        "docs/architecture.md",
        "docs/benchmarks.md",
        "docs/reference/cli.md",
        "docs/reference/api.md",
        "docs/reference/notes.md",
    }
    skipped = [b for b in BLOCKS if b.no_run is not None]
    assert len(skipped) <= 3, [b.name for b in skipped]
    for b in skipped:
        assert len(b.no_run or "") >= 10, f"{b.name}: a no-run marker needs its reason"
    assert set(SETUPS) <= sections and SLOW <= {b.name for b in BLOCKS}  # no setup for a section gone


def test_readme_the_serial_pass_has_its_tests() -> None:
    """``make test`` ends with ``pytest -m serial``, which exits 5 (a failure) when it selects nothing:
    the blocks that calibrate the demo's real CPU run are the ones it runs alone."""
    assert SERIAL == {"docs/cli#cli-0", "docs/guides/workflow#step-time-calibrate-from-the-run-replan-0"}, SERIAL
    assert all(b.name not in SERIAL or ("tokenbucket demo" in b.code) for b in RUN)
    # and it collects only the files that hold them: every file with a serial test is on its list
    listed = re.search(r"^SERIAL_FILES := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    marked = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py") if "mark.serial" in p.read_text()
    }
    assert listed is not None and set(listed.group(1).split()) == marked, marked


def test_readme_stated_outputs_are_found() -> None:
    # the values the Quickstart and the LeRobot section state, and the CLI's JSON
    stated = [e for b in RUN if b.lang == "python" for _, e in statements(b) if e is not None]
    assert 16384 in stated and 16 * 35 * 46 + 16 * 64 in stated and ("svla_so100_pickplace", 0, 0, 0) in stated
    assert any(s is not None for b in RUN if b.lang == "bash" for _, s in commands(b.code))


def test_readme_a_failing_block_fails() -> None:
    bad = Block("x", 0, "python", "1 + 1   # 3\n", 1, None)
    with pytest.raises(AssertionError, match="the page says 3"):
        run_python(bad, {})
    with pytest.raises(NameError):
        run_python(Block("x", 0, "python", "undefined_name\n", 1, None), {})


# the README's num_workers=4 is more workers than this 2-core machine has: torch says so
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
# the trainers' own notes on a CPU machine without tensorboard (Lightning's default logger, HF's pin_memory)
@pytest.mark.filterwarnings("ignore:Starting from v1.9.0, `tensorboardX`:UserWarning")
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")
@pytest.mark.filterwarnings("ignore:The number of training batches .* is smaller than the logging interval")
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            b,
            id=b.name,
            marks=[pytest.mark.slow] * (b.name in SLOW | SERIAL) + [pytest.mark.serial] * (b.name in SERIAL),
        )
        for b in RUN
    ],
)
def test_readme_block_runs_as_written(block: Block, workspace: Workspace) -> None:
    inputs = snapshot(workspace.folder / "datasets") | snapshot(workspace.folder / "metadata")
    if block.lang == "bash":
        if block.where == CLI:
            setup_cli(workspace)
        run_bash(block, workspace)
    else:
        ns: Namespace = {"__name__": "readme"}
        if block.where in SETUPS:
            SETUPS[block.where](ns)
        for earlier in (b for b in RUN if b.where == block.where and b.index < block.index):
            run_python(earlier, ns)  # the section's blocks before this one, as a reader runs them
        run_python(block, ns)
        check_after(block, ns, workspace)
    assert snapshot(workspace.folder / "datasets") | snapshot(workspace.folder / "metadata") == inputs  # only read


def check_after(block: Block, ns: Namespace, ws: Workspace) -> None:
    """What a block leaves behind, where the README says what it does."""
    n = ws.metadata.num_rows
    if 'build_manifest("metadata/"' in block.code:
        manifest = ns["manifest"]
        assert manifest.table.num_rows == n  # type: ignore[attr-defined]  # every sample: in a bucket or rejected
    if "lerobot_mixture" in block.code:
        check_lerobot_manifest(Path("lerobot-manifest.parquet"), ws.frames, ["svla_so100_pickplace", "libero"])
    if block.where == "docs/getting-started.md#Quickstart" and block.index == 0:
        assert ns["result"].table.num_rows + ns["result"].rejected.num_rows == n  # type: ignore[attr-defined]
    if block.where == "README.md#Quickstart":  # a batch of the plan, within its budget
        info = ns["batch"]["info"]  # type: ignore[index]
        assert ns["batch"]["tokens"].shape[-1] == 8 and info.predicted_peak_bytes <= ns["plan"].budget_bytes  # type: ignore[index, attr-defined]
    if block.where == "docs/guides/workflow.md#Pack instead of pad":
        assert ns["model_calls"], "the packed loader gave no batch"
    if block.where == "docs/guides/workflow.md#Monitor the run":
        steps = [json.loads(x) for x in Path("runs/run.jsonl").read_text().splitlines()]
        assert sum(e["event"] == "step" for e in steps) == len(ns["loader"])  # type: ignore[arg-type]
