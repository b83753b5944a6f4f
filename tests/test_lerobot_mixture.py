"""Several LeRobot datasets as one mixture: every frame of every source once per copy, keys
prefixed by the source, weights as repeat factors; and ``tokenbucket plan --lerobot`` repeated.

The datasets are the real ``info.json`` files of shared/data/lerobot with made-up episode lists
(tests/test_sources_lerobot.make_dataset): pusht (1 camera, 10 fps) and so100 (2 cameras, 30 fps).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from tokenbucket import ConfigError, TokenSpec, breakdown_table
from tokenbucket.cli.main import main
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.tokens.lerobot import lerobot_rows
from tokenbucket.tokens.lerobot_mix import LeRobotSource, lerobot_mixture, lerobot_sources, split_mixture_key

from .test_sources_lerobot import make_dataset

PUSHT_EPISODES = [(0, 5), (1, 3), (2, 7)]  # 15 frames
SVLA_EPISODES = [(0, 4), (3, 6)]  # 10 frames; episode 0 exists in both datasets
RECIPE = {
    "observation.image": [-0.1, 0.0],  # pusht's camera
    "observation.images.top": [-1 / 30, 0.0, 1 / 30],  # so100's
    "action": [0.0, 0.1, 0.2],  # both: whole frames at 10 and at 30 fps
}


@pytest.fixture
def pusht(lerobot_dir: str, tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "a", os.path.join(lerobot_dir, "pusht.json"), episodes=PUSHT_EPISODES)


@pytest.fixture
def svla(lerobot_dir: str, tmp_path: Path) -> Path:
    return make_dataset(
        tmp_path / "b", os.path.join(lerobot_dir, "svla_so100_pickplace.json"), version="v3.0", episodes=SVLA_EPISODES
    )


def frames_of(root: Path) -> list[str]:
    """The dataset's own keys: every frame once."""
    keys: list[str] = lerobot_rows(root).column("key").to_pylist()
    return keys


def snapshot(*folders: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for folder in folders for p in folder.rglob("*") if p.is_file()}


def test_lerobot_mix_public_names_sorted() -> None:
    import tokenbucket.tokens.lerobot_mix as module

    assert module.__all__ == sorted(module.__all__)


# -- two datasets, one table -------------------------------------------------------------------


def test_lerobot_mixture_every_frame_of_both_once(pusht: Path, svla: Path) -> None:
    rows = lerobot_mixture([pusht, svla], RECIPE)
    keys = rows.column("key").to_pylist()
    # 15 + 10 rows, unique keys, each source's frames exactly once under its prefix
    assert rows.num_rows == 15 + 10 == len(set(keys))
    assert keys[:15] == [f"pusht/{k}" for k in frames_of(pusht)]
    assert keys[15:] == [f"svla_so100_pickplace/{k}" for k in frames_of(svla)]
    assert Counter(rows.column("source").to_pylist()) == {"pusht": 15, "svla_so100_pickplace": 10}
    assert set(rows.column("copy").to_pylist()) == {0}
    # both hold episode 0 frame 0: the prefix keeps them apart
    assert {"pusht/ep000000/000000", "svla_so100_pickplace/ep000000/000000"} <= set(keys)
    # each source kept its own cameras and the recipe's keys it has, at its own fps
    cams = rows.column("cameras").to_pylist()
    assert [(c["name"], c["frames"]) for c in cams[0]] == [("observation.image", 2)]
    assert [(c["name"], c["frames"]) for c in cams[15]] == [
        ("observation.images.top", 3),
        ("observation.images.wrist", 1),
    ]
    # 0.2 s is 2 frames at 10 fps and 6 at 30, but the chunk is 3 steps in both
    assert set(rows.column("action_tokens").to_pylist()) == {3}
    # the same rows a source gives alone, under the prefix
    alone = lerobot_rows(svla, {k: v for k, v in RECIPE.items() if k != "observation.image"})
    assert rows.slice(15).column("cameras").equals(alone.column("cameras"))
    totals = breakdown_table(rows, TokenSpec(patch=14)).table.column("total").to_pylist()
    # pusht: 2 x 7 x 7 + 1 state + 3 actions; so100: (3 + 1) x 35 x 46 + 1 + 3
    assert totals == [98 + 1 + 3] * 15 + [4 * 1610 + 1 + 3] * 10


def test_lerobot_mixture_names_from_a_mapping_and_split_back(pusht: Path, svla: Path) -> None:
    rows = lerobot_mixture({"push": pusht, "so100": (svla, 2)})
    keys = rows.column("key").to_pylist()
    assert Counter(rows.column("source").to_pylist()) == {"push": 15, "so100": 20}
    parts = [split_mixture_key(k) for k in keys]
    assert [p[0] for p in parts] == rows.column("source").to_pylist()
    assert [p[1] for p in parts] == rows.column("episode_index").to_pylist()
    assert [p[2] for p in parts] == rows.column("frame_index").to_pylist()
    assert [p[3] for p in parts] == rows.column("copy").to_pylist()
    with pytest.raises(ConfigError, match=r"key 'ep000000/000000' is not a LeRobot mixture key"):
        split_mixture_key("ep000000/000000")


def test_lerobot_mixture_per_source_recipe_and_cameras(pusht: Path, svla: Path) -> None:
    rows = lerobot_mixture(
        {"push": pusht, "so100": svla},
        {"push": {"action": [0.0, 0.1]}, "so100": {"observation.images.wrist": [-1 / 30, 0.0]}},
        cameras={"so100": ["observation.images.wrist"]},
    )
    cams = rows.column("cameras").to_pylist()
    assert [(c["name"], c["frames"]) for c in cams[0]] == [("observation.image", 1)]
    assert [(c["name"], c["frames"]) for c in cams[15]] == [("observation.images.wrist", 2)]
    assert rows.column("action_tokens").to_pylist() == [2] * 15 + [1] * 10


def test_lerobot_mixture_shared_cameras_each_source_keeps_its_own(pusht: Path, svla: Path) -> None:
    rows = lerobot_mixture([pusht, svla], cameras=["observation.images.wrist", "observation.image"])
    cams = rows.column("cameras").to_pylist()
    assert [c["name"] for c in cams[0]] == ["observation.image"]
    assert [c["name"] for c in cams[15]] == ["observation.images.wrist"]
    assert rows.num_rows == 25


# -- weights -----------------------------------------------------------------------------------


def test_lerobot_mixture_weights_repeat_and_subsample(pusht: Path, svla: Path) -> None:
    rows = lerobot_mixture([(pusht, 0.5), (svla, 2.5)], seed=3)
    source = rows.column("source").to_pylist()
    keys = rows.column("key").to_pylist()
    # round(w x frames): 0.5 x 15 = 7.5 -> 8; 2.5 x 10 = 25
    assert Counter(source) == {"pusht": 8, "svla_so100_pickplace": 25}
    assert len(set(keys)) == len(keys)
    # pusht: 8 distinct frames of its 15, each once, in frame order
    push = [k.removeprefix("pusht/") for k, s in zip(keys, source, strict=True) if s == "pusht"]
    assert len(set(push)) == 8 and set(push) <= set(frames_of(pusht))
    assert push == sorted(push, key=frames_of(pusht).index)
    # so100: every frame twice, half of them (5) a third time, a frame's copies side by side
    base = Counter(k.split("/", 1)[1].split("#")[0] for k, s in zip(keys, source, strict=True) if s != "pusht")
    assert set(base) == set(frames_of(svla))
    assert sorted(base.values()) == [2] * 5 + [3] * 5
    assert rows.column("copy").to_pylist()[8:11] in ([0, 1, 2], [0, 1, 0])


def test_lerobot_mixture_weights_are_seeded_and_independent_of_other_sources(pusht: Path, svla: Path) -> None:
    def kept(table: pa.Table) -> list[str]:
        return [k for k in table.column("key").to_pylist() if k.startswith("pusht/")]

    first = kept(lerobot_mixture([(pusht, 0.5)], seed=7))
    assert first == kept(lerobot_mixture([(pusht, 0.5)], seed=7))  # same seed, same frames
    # another source added before it changes nothing of pusht's choice
    assert first == kept(lerobot_mixture([svla, (pusht, 0.5)], seed=7))
    others = {tuple(kept(lerobot_mixture([(pusht, 0.5)], seed=s))) for s in range(8)}
    assert len(others) > 1  # the seed does pick


@pytest.mark.parametrize("weight", [0, -1, math.nan, math.inf, True, "2"])
def test_lerobot_mixture_bad_weight_is_named(pusht: Path, weight: object) -> None:
    before = snapshot(pusht)
    with pytest.raises(ConfigError, match=r"weight of LeRobot source 'pusht' should be a positive finite number"):
        lerobot_mixture([(pusht, weight)])
    assert snapshot(pusht) == before


# -- names -------------------------------------------------------------------------------------


def test_lerobot_mixture_same_dataset_twice_is_an_error(pusht: Path, tmp_path: Path, lerobot_dir: str) -> None:
    with pytest.raises(ConfigError, match=r"given twice as source 'pusht'; give it once with a weight"):
        lerobot_mixture([pusht, pusht])
    other = make_dataset(tmp_path / "c", os.path.join(lerobot_dir, "pusht.json"))
    with pytest.raises(ConfigError, match=r"two LeRobot sources are named 'pusht' .* name them apart"):
        lerobot_sources([pusht, other])
    # named apart, the same folder twice is two sources with distinct prefixes (a second view)
    rows = lerobot_mixture({"p1": pusht, "p2": pusht})
    assert Counter(rows.column("source").to_pylist()) == {"p1": 15, "p2": 15}
    assert len(set(rows.column("key").to_pylist())) == 30


def test_lerobot_mixture_bad_inputs_name_the_thing(pusht: Path, svla: Path) -> None:
    before = snapshot(pusht, svla)
    with pytest.raises(ConfigError, match=r"name should be letters.*name='a/b'"):
        lerobot_mixture({"a/b": pusht})
    with pytest.raises(ConfigError, match="at least one source"):
        lerobot_mixture([])
    with pytest.raises(ConfigError, match=r"should be ROOT or \(ROOT, WEIGHT\)"):
        lerobot_mixture([(pusht, 1, 2)])
    with pytest.raises(ConfigError, match="seed should be a non-negative integer"):
        lerobot_mixture([pusht], seed=-1)
    with pytest.raises(ConfigError, match=r"key 'observation.images.side' is neither a camera nor a feature of any"):
        lerobot_mixture([pusht, svla], {"observation.images.side": [0.0]})
    with pytest.raises(ConfigError, match=r"per source names 'nope', which is not a source"):
        lerobot_mixture([pusht, svla], {"nope": {"action": [0.0]}})
    with pytest.raises(ConfigError, match="mixes both"):
        lerobot_mixture([pusht, svla], {"pusht": {"action": [0.0]}, "action": [0.0]})
    # a source's own problem names the source: 1/30 s is no whole frame at pusht's 10 fps
    with pytest.raises(ConfigError, match=r"LeRobot source 'pusht': delta_timestamps\['action'\] offset 0.0333"):
        lerobot_mixture([pusht, svla], {"action": [0.0, 1 / 30]})
    with pytest.raises(ConfigError, match=r"names no camera of LeRobot source 'pusht'"):
        lerobot_mixture([pusht, svla], cameras=["observation.images.top"])
    with pytest.raises(ConfigError, match=r"'observation.images.side', which is a camera of no source"):
        lerobot_mixture(
            [pusht, svla], cameras=["observation.image", "observation.images.top", "observation.images.side"]
        )
    with pytest.raises(ConfigError, match=r"LeRobot source 'nowhere': LeRobot dataset .* not a folder"):
        lerobot_mixture([pusht, pusht.parent / "nowhere"])
    assert snapshot(pusht, svla) == before


# -- tokenbucket plan --lerobot, repeated ------------------------------------------------------

PLAN_FLAGS = ("--patch", "14", "--preset", "design-24L-1024", "--gpu", "H100-SXM", "--json")


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv, *PLAN_FLAGS])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_plan_lerobot_repeated_keeps_every_source(
    pusht: Path, svla: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.parquet"
    code, text, err = plan(
        capsys,
        "--lerobot",
        str(pusht),
        "--lerobot",
        f"so100={svla}:1.5",
        "--delta-timestamps",
        json.dumps({"action": [0.0, 0.1]}),
        "--out",
        str(out),
    )
    assert code == 0, err
    # 15 + round(1.5 x 10) = 30 samples: the last --lerobot did not replace the first
    assert json.loads(text)["summary"]["samples"] == 30
    keys = load_manifest(out).table.column("key").to_pylist()
    assert len(set(keys)) == 30
    assert Counter(k.split("/")[0] for k in keys) == {"pusht": 15, "so100": 15}
    assert {k for k in keys if k.startswith("pusht/")} == {f"pusht/{k}" for k in frames_of(pusht)}
    record = load_manifest(out).meta["meta"]["lerobot"]
    assert record["sources"] == [
        {"name": "pusht", "path": str(pusht), "weight": 1.0, "rows": 15},
        {"name": "so100", "path": str(svla), "weight": 1.5, "rows": 15},
    ]
    assert (record["delta_timestamps"], record["cameras"], record["seed"]) == ({"action": [0.0, 0.1]}, None, 0)
    assert list(tmp_path.glob("*.parquet")) == [out]  # the rows file does not stay behind


def test_cli_plan_lerobot_one_named_source_is_prefixed(
    pusht: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.parquet"
    code, _, err = plan(capsys, "--lerobot", f"push={pusht}", "--out", str(out))
    assert code == 0, err
    assert sorted(load_manifest(out).table.column("key").to_pylist()) == sorted(f"push/{k}" for k in frames_of(pusht))


def test_cli_plan_lerobot_folder_with_colon_is_a_path(
    lerobot_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_dataset(tmp_path / "x:2", os.path.join(lerobot_dir, "pusht.json"))
    odd = root.rename(root.parent / "pusht:2")  # a folder whose name looks like PATH:WEIGHT
    out = tmp_path / "m.parquet"
    code, _, err = plan(capsys, "--lerobot", str(odd), "--out", str(out))
    assert code == 0, err
    assert len(load_manifest(out)) == 15  # the folder as it is, weight 1, no prefix


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{}:0", "WEIGHT should be a positive number, but got '0'"),
        ("{}:-2", "WEIGHT should be a positive number, but got '-2'"),
        ("{}:abc", "WEIGHT should be a positive number, but got 'abc'"),
        ("{}:nan", "WEIGHT should be a positive number, but got 'nan'"),
        ("{}:", "WEIGHT should be a positive number, but got ''"),
    ],
)
def test_cli_plan_lerobot_bad_weight_is_a_usage_error(
    pusht: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    out = tmp_path / "m.parquet"
    assert plan(capsys, "--lerobot", str(pusht), "--out", str(out))[0] == 0
    before = snapshot(tmp_path)
    flag = value.format(pusht)
    code, _, err = plan(capsys, "--lerobot", str(pusht), "--lerobot", flag, "--out", str(out))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"--lerobot {flag!r}: {message}" in lines[0] and "[NAME=]DATASET[:WEIGHT]" in lines[0]
    assert snapshot(tmp_path) == before  # the earlier manifest and the datasets untouched
    assert len(load_manifest(out)) == 15  # no sample went missing from it


def test_cli_plan_lerobot_source_errors(
    pusht: Path, svla: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "m.parquet")
    before = snapshot(tmp_path)
    code, _, err = plan(capsys, "--lerobot", str(pusht), "--lerobot", str(pusht), "--out", out)
    assert code == 1 and "given twice as source 'pusht'" in err
    code, _, err = plan(capsys, "--lerobot", f"x={pusht}", "--lerobot", f"x={svla}", "--out", out)
    assert code == 1 and "two LeRobot sources are named 'x'" in err
    code, _, err = plan(capsys, "--lerobot", str(pusht), "--lerobot", str(svla), "--seed", "-1", "--out", out)
    assert code == 2 and "--seed should be a non-negative integer, but got --seed -1" in err
    code, _, err = plan(capsys, "meta.parquet", "--seed", "1", "--out", out)
    assert code == 2 and "--seed goes with --lerobot" in err
    code, _, err = plan(capsys, "--lerobot", str(pusht), "--lerobot", f"{svla}:2", "--cameras", "wrist", "--out", out)
    assert code == 1 and "names no camera of LeRobot source" in err
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "m.parquet").exists()


def test_lerobot_source_defaults_and_record(tmp_path: Path) -> None:
    src = LeRobotSource(root=tmp_path / "so100", weight=2)
    assert (src.name, src.weight) == ("so100", 2.0)
    assert src.to_dict() == {"name": "so100", "path": str(tmp_path / "so100"), "weight": 2.0}


def test_example_plan_lerobot_plans_a_mixture(
    lerobot_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "plan_lerobot.py"
    spec = importlib.util.spec_from_file_location("plan_lerobot", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    card = Path(lerobot_dir) / "svla_so100_pickplace.json"
    arm1 = module.demo_dataset(tmp_path / "arm1", card, lengths=(30, 20))
    arm2 = module.demo_dataset(tmp_path / "arm2", card, lengths=(10,))
    plan = module.main(arm1, arm2)
    assert sum(b.samples for b in plan.buckets) == 30 + 20 + 10  # every frame of both, once
    printed = capsys.readouterr().out
    assert "arm1: 50 samples" in printed and "arm2: 10 samples" in printed
