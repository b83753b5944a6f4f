"""LeRobot datasets: the real ``info.json`` files of shared/data/lerobot, each with a synthetic
episode list, → per-frame rows → tokens, hand-counted here."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbucket import ConfigError, TokenSpec, breakdown_sample, breakdown_table
from tokenbucket.cli.main import main
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.tokens.lerobot import LeRobotMetadata, lerobot_rows, read_lerobot_info, read_lerobot_metadata

EXPECTED = {
    "pusht.json": [("observation.image", 96, 96)],
    "svla_so100_pickplace.json": [("observation.images.top", 480, 640), ("observation.images.wrist", 480, 640)],
    "libero.json": [("observation.images.image", 256, 256), ("observation.images.image2", 256, 256)],
    "gr00t_robot_sim_picknplace.json": [
        ("observation.images.egoview", 800, 1280),
        ("observation.images.ego_view", 256, 256),
    ],
}

# The synthetic episode list every dataset gets: (episode_index, length) → 5 + 3 + 7 = 15 frames.
EPISODES = [(0, 5), (1, 3), (2, 7)]
FRAMES = 15

# Per dataset: a sampling recipe, the frames each camera then loads, the clamped camera frames
# of episode 0 (length 5) frame by frame and over all episodes, and one sample's tokens at
# patch 14 counted by hand (one token per state vector and per action step).
CASES: dict[str, dict[str, Any]] = {
    "pusht.json": {  # v2.0, fps 10, state 2, action 2
        "deltas": {
            "observation.image": [-0.1, 0.0],
            "observation.state": [-0.1, 0.0],
            "action": [k / 10 for k in range(16)],
        },
        "frames": {"observation.image": 2},
        # frame 0 asks for frame -1: clamped, once per episode
        "padded_ep0": [1, 0, 0, 0, 0],
        "padded_all": 3,
        # vision 2 frames x ceil(96/14)^2 = 2 x 7 x 7 = 98; state 2 vectors; action 16 steps
        "tokens": 2 * 7 * 7 + 2 + 16,
    },
    "svla_so100_pickplace.json": {  # v2.1, fps 30, state 6, action 6
        "deltas": {"observation.images.top": [-1 / 30, 0.0, 1 / 30], "action": [k / 30 for k in range(50)]},
        "frames": {"observation.images.top": 3, "observation.images.wrist": 1},
        # top asks for frames -1 and +1: the first and the last frame of each episode clamp one
        "padded_ep0": [1, 0, 0, 0, 1],
        "padded_all": 6,
        # 480x640 → ceil(480/14) x ceil(640/14) = 35 x 46 = 1610 per frame; top 3 frames, wrist 1;
        # no state key → 1 state token; action 50 steps
        "tokens": 3 * 35 * 46 + 1 * 35 * 46 + 1 + 50,
    },
    "libero.json": {  # v2.1 in the file; planted here as v3.0 (Parquet episodes); fps 10
        "version": "v3.0",
        "deltas": {
            "observation.images.image": [0.0],
            "observation.images.image2": [-0.2, -0.1, 0.0],
            "observation.state": [0.0],
            "action": [k / 10 for k in range(10)],
        },
        "frames": {"observation.images.image": 1, "observation.images.image2": 3},
        # image2 asks for frames -2 and -1: frame 0 clamps both, frame 1 one
        "padded_ep0": [2, 1, 0, 0, 0],
        "padded_all": 9,
        # 256x256 → ceil(256/14)^2 = 19 x 19 = 361; image 1 frame, image2 3; 1 state, 10 action
        "tokens": 1 * 19 * 19 + 3 * 19 * 19 + 1 + 10,
    },
    "gr00t_robot_sim_picknplace.json": {  # v2.0, fps 20.0 (a float), state 44, action 44
        "deltas": {
            "observation.images.egoview": [-0.05, 0.0],
            "observation.images.ego_view": [0.0, 0.05, 0.1],
            "observation.state": [-0.05, 0.0],
            "action": [k / 20 for k in range(16)],
        },
        "frames": {"observation.images.egoview": 2, "observation.images.ego_view": 3},
        # egoview frame -1 clamps at frame 0; ego_view frames +1, +2 clamp at frames 3 (one) and 4 (two)
        "padded_ep0": [1, 0, 0, 1, 2],
        "padded_all": 3 * 1 + 3 * 3,
        # egoview 800x1280 → ceil(800/14) x ceil(1280/14) = 58 x 92 = 5336, 2 frames;
        # ego_view 256x256 → 19 x 19 = 361, 3 frames; 2 state vectors; 16 action steps
        "tokens": 2 * 58 * 92 + 3 * 19 * 19 + 2 + 16,
    },
}


def make_dataset(
    tmp_path: Path, info_file: str, *, version: str | None = None, episodes: list[tuple[int, int]] = EPISODES
) -> Path:
    """A dataset folder: the real info.json (its version optionally replaced) + a synthetic episode list."""
    root = tmp_path / Path(info_file).stem
    meta = root / "meta"
    meta.mkdir(parents=True)
    info = json.loads(Path(info_file).read_text())
    if version is not None:
        info["codebase_version"] = version
    (meta / "info.json").write_text(json.dumps(info))
    if info["codebase_version"].startswith("v3."):
        chunk = meta / "episodes" / "chunk-000"
        chunk.mkdir(parents=True)
        ends = [sum(n for _, n in episodes[: k + 1]) for k in range(len(episodes))]
        pq.write_table(
            pa.table(
                {
                    "episode_index": [e for e, _ in episodes],
                    "length": [n for _, n in episodes],
                    "tasks": [["pick the thing"] for _ in episodes],
                    "dataset_from_index": [end - n for end, (_, n) in zip(ends, episodes, strict=True)],
                    "dataset_to_index": ends,
                }
            ),
            chunk / "file-000.parquet",
        )
    else:
        lines = [json.dumps({"episode_index": e, "length": n, "tasks": ["pick the thing"]}) for e, n in episodes]
        (meta / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def pusht(lerobot_dir: str, tmp_path: Path) -> Path:
    return make_dataset(tmp_path, os.path.join(lerobot_dir, "pusht.json"))


@pytest.fixture
def svla(lerobot_dir: str, tmp_path: Path) -> Path:
    return make_dataset(tmp_path, os.path.join(lerobot_dir, "svla_so100_pickplace.json"))


def cameras_of(rows: pa.Table, row: int = 0) -> list[tuple[str, int, int, int]]:
    return [(c["name"], c["frames"], c["height"], c["width"]) for c in rows.column("cameras")[row].as_py()]


def test_lerobot_public_names_sorted_and_importable() -> None:
    import tokenbucket.tokens.lerobot as module

    assert module.__all__ == sorted(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None


# -- info.json ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_lerobot_info_cameras_match_dataset_cards(lerobot_dir: str, name: str) -> None:
    info = read_lerobot_info(os.path.join(lerobot_dir, name))
    assert [(c.name, c.height, c.width) for c in info.cameras] == EXPECTED[name]
    assert info.fps > 0


def test_lerobot_info_state_and_action_sizes_from_features(lerobot_dir: str) -> None:
    sizes = {name: read_lerobot_info(os.path.join(lerobot_dir, name)) for name in EXPECTED}
    # the cards' observation.state / action shapes
    assert [(i.state_size, i.action_size) for i in sizes.values()] == [(2, 2), (6, 6), (8, 7), (44, 44)]
    assert sizes["gr00t_robot_sim_picknplace.json"].fps == 20.0
    assert "next.reward" in sizes["pusht.json"].features


def test_lerobot_gr00t_mixed_resolution_counts_each_camera(lerobot_dir: str) -> None:
    info = read_lerobot_info(os.path.join(lerobot_dir, "gr00t_robot_sim_picknplace.json"))
    assert info.fps == 20.0  # stored as a float
    sample = info.sample({"observation.images.egoview": [-0.1, -0.05, 0.0], "action": [0.0] * 16})
    bd = breakdown_sample(sample, TokenSpec(patch=14))
    ego, small = bd.cameras
    assert (ego.frames, ego.spatial) == (3, 58 * 92)  # ceil(800/14) x ceil(1280/14)
    assert (small.frames, small.spatial) == (1, 19 * 19)
    assert bd.vision == 3 * 58 * 92 + 19 * 19
    # the same through the vectorised path
    table = pa.Table.from_pylist([{"key": "s0", **sample}])
    assert breakdown_table(table, TokenSpec(patch=14)).table.column("vision").to_pylist() == [bd.vision]


def test_lerobot_channels_first_shape_is_read_from_names() -> None:
    info = read_lerobot_info(
        {
            "fps": 10,
            "features": {
                "cam": {"dtype": "image", "shape": [3, 120, 160], "names": ["channels", "height", "width"]},
                "state": {"dtype": "float32", "shape": [6]},
            },
        }
    )
    assert [(c.height, c.width) for c in info.cameras] == [(120, 160)]


def test_lerobot_bad_info_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="features"):
        read_lerobot_info({"fps": 10})
    with pytest.raises(ConfigError, match="fps"):
        read_lerobot_info({"fps": 0, "features": {}})
    with pytest.raises(ConfigError, match=r"'action' should have a shape like \[n\].*shape=\[\]"):
        read_lerobot_info({"fps": 10, "features": {"action": {"dtype": "float32", "shape": []}}})
    bad = tmp_path / "info.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"info\.json.*JSON object"):
        read_lerobot_info(bad)


# -- dataset folder → rows → tokens ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_lerobot_rows_every_frame_counted_by_hand(lerobot_dir: str, tmp_path: Path, name: str) -> None:
    case = CASES[name]
    root = make_dataset(tmp_path, os.path.join(lerobot_dir, name), version=case.get("version"))
    meta = read_lerobot_metadata(root)
    assert meta.info.codebase_version == case.get("version", meta.info.codebase_version)
    assert (meta.episode_index, meta.length) == ((0, 1, 2), (5, 3, 7))

    rows = lerobot_rows(root, case["deltas"])
    # one row per frame of every episode, in episode then frame order
    assert rows.num_rows == FRAMES == meta.total_frames
    assert rows.column("episode_index").to_pylist() == [0] * 5 + [1] * 3 + [2] * 7
    assert rows.column("frame_index").to_pylist() == [*range(5), *range(3), *range(7)]
    assert rows.column("key").to_pylist()[:2] == ["ep000000/000000", "ep000000/000001"]
    assert rows.column("key").to_pylist()[5] == "ep000001/000000"
    # per-camera shapes from the card, frame counts from the recipe, the same on every row
    expected = [(cam, case["frames"].get(cam, 1), h, w) for cam, h, w in EXPECTED[name]]
    assert cameras_of(rows, 0) == expected
    assert cameras_of(rows, FRAMES - 1) == expected
    # clamping at the episode edges changes no frame count, only padded_frames
    assert rows.column("padded_frames").to_pylist()[:5] == case["padded_ep0"]
    assert sum(rows.column("padded_frames").to_pylist()) == case["padded_all"]
    # the planner's input: every sample the hand count, the dataset FRAMES times it
    result = breakdown_table(rows, TokenSpec(patch=14))
    assert result.table.column("total").to_pylist() == [case["tokens"]] * FRAMES
    assert result.summary()["tokens"] == FRAMES * case["tokens"]


def test_lerobot_rows_no_recipe_is_one_frame_one_state_one_action(pusht: Path) -> None:
    rows = lerobot_rows(pusht)
    assert cameras_of(rows) == [("observation.image", 1, 96, 96)]
    assert set(rows.column("padded_frames").to_pylist()) == {0}
    # 7 x 7 patches + 1 state token + 1 action token
    assert set(breakdown_table(rows, TokenSpec(patch=14)).table.column("total").to_pylist()) == {49 + 1 + 1}


def test_lerobot_rows_values_columns_for_per_value_tokenizers(pusht: Path) -> None:
    rows = lerobot_rows(pusht, CASES["pusht.json"]["deltas"])
    # 2 state vectors x 2 values; 16 action steps x 2 values
    assert (rows.column("state_values")[0].as_py(), rows.column("action_values")[0].as_py()) == (4, 32)
    spec = TokenSpec(patch=14, proprio="state_values", action="action_values")
    assert set(breakdown_table(rows, spec).table.column("total").to_pylist()) == {98 + 4 + 32}


def test_lerobot_rows_missing_features_give_zero_tokens(tmp_path: Path) -> None:
    root = tmp_path / "cams_only"
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(
        json.dumps(
            {"codebase_version": "v2.1", "fps": 15, "features": {"cam": {"dtype": "video", "shape": [64, 64, 3]}}}
        )
    )
    (root / "meta" / "episodes.jsonl").write_text('{"episode_index": 4, "length": 2}\n')
    rows = lerobot_rows(root)
    assert rows.column("proprio_tokens").to_pylist() == [0, 0]
    assert rows.column("action_tokens").to_pylist() == [0, 0]
    assert rows.column("key").to_pylist() == ["ep000004/000000", "ep000004/000001"]


def test_lerobot_rows_v3_reads_episode_files_in_chunk_file_order(lerobot_dir: str, tmp_path: Path) -> None:
    root = make_dataset(tmp_path, os.path.join(lerobot_dir, "pusht.json"), version="v3.0", episodes=[(0, 2), (1, 4)])
    # a second file in the same chunk and a second chunk; none sorts before file-000
    pq.write_table(
        pa.table({"episode_index": [2], "length": [3]}), root / "meta" / "episodes" / "chunk-000" / "file-001.parquet"
    )
    (root / "meta" / "episodes" / "chunk-001").mkdir()
    pq.write_table(
        pa.table({"episode_index": [3], "length": [1]}), root / "meta" / "episodes" / "chunk-001" / "file-000.parquet"
    )
    meta = read_lerobot_metadata(root)
    assert (meta.episode_index, meta.length) == ((0, 1, 2, 3), (2, 4, 3, 1))
    assert lerobot_rows(meta).num_rows == 2 + 4 + 3 + 1


# -- selection ---------------------------------------------------------------------------------


def test_lerobot_rows_cameras_selects_and_orders(svla: Path) -> None:
    deltas = CASES["svla_so100_pickplace.json"]["deltas"]
    rows = lerobot_rows(svla, deltas, cameras=["observation.images.wrist"])
    assert cameras_of(rows) == [("observation.images.wrist", 1, 480, 640)]
    # top's offsets belong to a dropped camera: nothing is clamped any more
    assert set(rows.column("padded_frames").to_pylist()) == {0}
    # 1 frame x 35 x 46 + 1 state + 50 action
    assert set(breakdown_table(rows, TokenSpec(patch=14)).table.column("total").to_pylist()) == {1610 + 1 + 50}
    both = lerobot_rows(svla, deltas, cameras=["observation.images.wrist", "observation.images.top"])
    assert [c[0] for c in cameras_of(both)] == ["observation.images.wrist", "observation.images.top"]


def test_lerobot_rows_unknown_camera_lists_the_available_ones(svla: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"'observation.images.side'.*"
        r"\['observation.images.top', 'observation.images.wrist'\]",
    ):
        lerobot_rows(svla, cameras=["observation.images.side"])
    with pytest.raises(ConfigError, match="list of camera keys"):
        lerobot_rows(svla, cameras="observation.images.top")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="each camera once"):
        lerobot_rows(svla, cameras=["observation.images.top", "observation.images.top"])


def test_lerobot_rows_episodes_selects_in_file_order(pusht: Path) -> None:
    rows = lerobot_rows(pusht, episodes=[2, 0])
    assert rows.num_rows == 7 + 5
    assert rows.column("episode_index").to_pylist() == [0] * 5 + [2] * 7  # file order, not the list's
    with pytest.raises(ConfigError, match=r"episode 9.*3 episodes, indices 0\.\.2"):
        lerobot_rows(pusht, episodes=[0, 9])


# -- errors ------------------------------------------------------------------------------------


def test_lerobot_rows_unknown_delta_key_is_named(pusht: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"key 'observation.images.top' is neither a camera nor a feature.*"
        r"\['observation.image'\]",
    ):
        lerobot_rows(pusht, {"observation.images.top": [0.0]})
    # any real feature may carry offsets, counted or not
    assert lerobot_rows(pusht, {"next.reward": [0.0, 0.1]}).num_rows == FRAMES
    # LeRobotInfo.sample checks its recipe the same way
    with pytest.raises(ConfigError, match=r"'observation\.images\.top' is neither a camera nor a feature"):
        read_lerobot_metadata(pusht).info.sample({"observation.images.top": [0.0]})


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ([], "non-empty list"),
        ([0.0, 0.05], r"0.05 s is not a whole number of frames at fps=10"),
        ([float("nan")], "finite numbers"),
        ("0.1", "non-empty list"),
    ],
)
def test_lerobot_rows_bad_offsets_are_config_errors(pusht: Path, offsets: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        lerobot_rows(pusht, {"action": offsets})


def test_lerobot_metadata_missing_and_bad_files_name_the_path(lerobot_dir: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a folder"):
        read_lerobot_metadata(tmp_path / "nowhere")
    root = make_dataset(tmp_path, os.path.join(lerobot_dir, "pusht.json"))
    with pytest.raises(ConfigError, match="pass the dataset folder"):
        read_lerobot_metadata(root / "meta")
    episodes = root / "meta" / "episodes.jsonl"
    episodes.write_text('{"episode_index": 0, "length": 5}\n{"episode_index": 1, "length": \n')
    with pytest.raises(ConfigError, match=r"episodes.jsonl' line 2 should be a JSON object"):
        read_lerobot_metadata(root)
    episodes.write_text('{"episode_index": 0, "length": 5}\n{"episode_index": 1}\n')
    with pytest.raises(ConfigError, match=r"line 2: 'length' should be a non-negative integer, but got length=None"):
        read_lerobot_metadata(root)
    episodes.write_text('{"episode_index": 0, "length": 5}\n{"episode_index": 0, "length": 2}\n')
    with pytest.raises(ConfigError, match=r"episode_index should be unique.*episode_index=0"):
        read_lerobot_metadata(root)
    episodes.unlink()
    with pytest.raises(ConfigError, match=r"v2.0 dataset .*episodes.jsonl', but that file does not exist"):
        read_lerobot_metadata(root)


def test_lerobot_metadata_v3_layout_errors(lerobot_dir: str, tmp_path: Path) -> None:
    root = make_dataset(tmp_path, os.path.join(lerobot_dir, "libero.json"), version="v3.0")
    file = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    pq.write_table(pa.table({"episode_index": [0, 1], "frames": [3, 4]}), file)
    with pytest.raises(ConfigError, match=r"file-000.parquet' should have the column 'length'"):
        read_lerobot_metadata(root)
    pq.write_table(pa.table({"episode_index": [0, 1], "length": [3, -4]}), file)
    with pytest.raises(ConfigError, match=r"file-000.parquet' row 1: 'length' .* length=-4"):
        read_lerobot_metadata(root)
    file.write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match=r"cannot read .*file-000.parquet' as Parquet"):
        read_lerobot_metadata(root)
    shutil.rmtree(root / "meta" / "episodes")
    with pytest.raises(ConfigError, match=r"chunk-XXX/file-XXX.parquet"):
        read_lerobot_metadata(root)


def test_lerobot_metadata_unsupported_version_is_named(lerobot_dir: str, tmp_path: Path) -> None:
    root = make_dataset(tmp_path, os.path.join(lerobot_dir, "pusht.json"), version="v1.6")
    with pytest.raises(ConfigError, match=r"info.json': codebase_version should be .* got codebase_version='v1.6'"):
        read_lerobot_metadata(root)


def test_lerobot_metadata_invariants_are_checked() -> None:
    info = read_lerobot_info({"fps": 10, "features": {}})
    with pytest.raises(ConfigError, match="should align"):
        LeRobotMetadata(root=Path("x"), info=info, episode_index=(0, 1), length=(3,))
    with pytest.raises(ConfigError, match=r"length should be >= 0, but got length=-1"):
        LeRobotMetadata(root=Path("x"), info=info, episode_index=(0,), length=(-1,))
    with pytest.raises(ConfigError, match="LeRobotInfo has no episode list"):
        lerobot_rows(info)  # type: ignore[arg-type]


# -- tokenbucket plan --lerobot ----------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


PLAN_FLAGS = ("--patch", "14", "--preset", "design-24L-1024", "--gpu", "H100-SXM", "--json")


def test_cli_plan_lerobot_one_sample_per_frame(pusht: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.parquet"
    deltas = CASES["pusht.json"]["deltas"]
    code, text, err = run(
        capsys,
        "plan",
        "--lerobot",
        str(pusht),
        "--delta-timestamps",
        json.dumps(deltas),
        "--out",
        str(out),
        *PLAN_FLAGS,
    )
    assert code == 0, err
    assert json.loads(text)["summary"]["samples"] == FRAMES
    manifest = load_manifest(out)
    # every frame planned once, each at the hand count (2 x 49 + 2 + 16)
    assert sorted(manifest.table.column("key").to_pylist()) == sorted(lerobot_rows(pusht).column("key").to_pylist())
    assert manifest.table.column("total").to_pylist() == [116] * FRAMES
    assert manifest.meta["meta"]["lerobot"] == {"path": str(pusht), "delta_timestamps": deltas, "cameras": None}
    assert list(tmp_path.glob("*.parquet")) == [out]  # the rows file does not stay behind


def test_cli_plan_lerobot_recipe_file_and_cameras(
    svla: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "deltas.json"
    recipe.write_text(json.dumps(CASES["svla_so100_pickplace.json"]["deltas"]))
    out = tmp_path / "m.parquet"
    code, text, err = run(
        capsys,
        "plan",
        "--lerobot",
        str(svla),
        "--delta-timestamps",
        f"@{recipe}",
        "--cameras",
        "observation.images.top",
        "--out",
        str(out),
        *PLAN_FLAGS,
    )
    assert code == 0, err
    assert json.loads(text)["summary"]["samples"] == FRAMES
    # top only: 3 frames x 35 x 46 + 1 state + 50 action
    assert set(load_manifest(out).table.column("total").to_pylist()) == {3 * 1610 + 1 + 50}


def test_cli_plan_lerobot_argument_errors(pusht: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "m.parquet")
    code, _, err = run(capsys, "plan", "--out", out, *PLAN_FLAGS)
    assert code == 2 and "needs METADATA" in err and "--lerobot" in err
    code, _, err = run(capsys, "plan", "meta.parquet", "--lerobot", str(pusht), "--out", out, *PLAN_FLAGS)
    assert code == 2 and "not both" in err
    code, _, err = run(capsys, "plan", "meta.parquet", "--cameras", "a", "--out", out, *PLAN_FLAGS)
    assert code == 2 and "--cameras goes with --lerobot" in err
    code, _, err = run(
        capsys, "plan", "--lerobot", str(pusht), "--delta-timestamps", "[0.1]", "--out", out, *PLAN_FLAGS
    )
    assert code == 1 and "--delta-timestamps '[0.1]' should be a JSON object" in err
    code, _, err = run(
        capsys, "plan", "--lerobot", str(pusht), "--delta-timestamps", "@missing.json", "--out", out, *PLAN_FLAGS
    )
    assert code == 1 and "cannot read --delta-timestamps file 'missing.json'" in err
    code, _, err = run(capsys, "plan", "--lerobot", str(pusht), "--cameras", "wrist", "--out", out, *PLAN_FLAGS)
    assert code == 1 and "'wrist', which is not a camera" in err and "['observation.image']" in err
    assert not (tmp_path / "m.parquet").exists()
