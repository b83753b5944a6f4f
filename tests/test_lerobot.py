"""Real LeRobot ``info.json`` files (shared/data/lerobot) → per-camera shapes → tokens."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from tokenbucket import ConfigError, TokenSpec, breakdown_sample, breakdown_table
from tokenbucket.lerobot import read_lerobot_info

EXPECTED = {
    "pusht.json": [("observation.image", 96, 96)],
    "svla_so100_pickplace.json": [("observation.images.top", 480, 640), ("observation.images.wrist", 480, 640)],
    "libero.json": [("observation.images.image", 256, 256), ("observation.images.image2", 256, 256)],
    "gr00t_robot_sim_picknplace.json": [
        ("observation.images.egoview", 800, 1280),
        ("observation.images.ego_view", 256, 256),
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_lerobot_info_cameras_match_dataset_cards(lerobot_dir: str, name: str) -> None:
    info = read_lerobot_info(os.path.join(lerobot_dir, name))
    assert [(c.name, c.height, c.width) for c in info.cameras] == EXPECTED[name]
    assert info.fps > 0


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
    info = read_lerobot_info({"fps": 10, "features": {
        "cam": {"dtype": "image", "shape": [3, 120, 160], "names": ["channels", "height", "width"]},
        "state": {"dtype": "float32", "shape": [6]},
    }})
    assert [(c.height, c.width) for c in info.cameras] == [(120, 160)]


def test_lerobot_bad_info_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="features"):
        read_lerobot_info({"fps": 10})
    with pytest.raises(ConfigError, match="fps"):
        read_lerobot_info({"fps": 0, "features": {}})
