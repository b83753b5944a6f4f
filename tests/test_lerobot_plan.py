"""A LeRobot policy as the planner's cost model: a batch size per bucket of a mixture of
embodiments (NOTE [ A policy's lengths ], NOTE [ Camera slots ]), checked against LeRobot's own
policies measured with fewer cameras than features, 480 x 640 frames and pi0.5's 200 tokens."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.test_cli_errors import cli, one_line_error
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.gpus import get_gpu, gpu_budget_bytes
from tokenbucket.cost.lerobot_plan import PolicyLengthModel
from tokenbucket.cost.lerobot_policy import LeRobotPolicy
from tokenbucket.tokens.breakdown import breakdown_sample

FIXTURE = Path(__file__).resolve().parent / "data" / "lerobot_truth.json"
BUDGET = gpu_budget_bytes(get_gpu("H100-SXM"))
# three embodiments with their real info.json: two cameras of 480 x 640, two of 256 x 256, one of 96 x 96
EMBODIMENTS = {"so100": "svla_so100_pickplace.json", "libero": "libero.json", "pusht": "pusht.json"}
FRAMES = {"so100": 1500, "libero": 1000, "pusht": 2000}


def _planner_points() -> list[Any]:
    """The fixture's points at the planner's shapes: the language as the policy pads it, and a
    batch of fewer cameras or frames of another size where the point says so."""
    out = []
    for p in json.loads(FIXTURE.read_text())["points"]:
        policy = LeRobotPolicy.from_config(p["config"])
        if p["text_tokens"] != policy.tokenizer_max_length:
            continue
        tag = f"{p['policy']}-{p['variant']}-b{p['batch']}-{p.get('present', p['cameras'])}cams"
        out.append(pytest.param(p, id=tag + ("-{}x{}".format(*p["frame"]) if "frame" in p else "")))
    return out


@pytest.mark.parametrize("point", _planner_points())
def test_lerobot_plan_bucket_price_is_within_band_of_lerobots_peak(point: dict[str, Any]) -> None:
    # issue 38's band (+-7 %); the planner prices a bucket of `present` cameras at its frame size
    policy = dataclasses.replace(LeRobotPolicy.from_config(point["config"]), image_features=point["cameras"])
    cost = PolicyLengthModel(policy, slots=point["cameras"], frame=tuple(point.get("frame", (224, 224))))
    present = point.get("present", point["cameras"])
    predicted = cost.memory(point["batch"], cost.length(present)).total
    error = 100.0 * (predicted - point["peak_bytes"]) / point["peak_bytes"]
    assert abs(error) <= 7.0, f"{error:+.2f} % off LeRobot's measured peak"


def test_lerobot_plan_fixture_holds_the_planner_shapes() -> None:
    points = json.loads(FIXTURE.read_text())["points"]
    shapes = {(p["policy"], p.get("present", 3), tuple(p.get("frame", (224, 224))), p["text_tokens"]) for p in points}
    # pi0 and SmolVLA with 1, 2, 3 of 3 cameras at 480 x 640; pi0.5 at its own 200 tokens
    for policy in ("pi0", "smolvla"):
        assert {(policy, n, (480, 640), 48) for n in (1, 2, 3)} <= shapes
    assert ("pi05", 3, (224, 224), 200) in shapes


@pytest.mark.parametrize(
    ("name", "counts"),
    # pi0: three fixed slots of 256 + 48 text + 1 state + 50 actions (867, openpi's published count,
    # ../shared/data/SOURCES.md) whatever a sample holds; pi0.5: 200 text, no state token; SmolVLA:
    # 64 tokens per camera it holds + 48 + 1 + 50
    [("pi0", [867, 867, 867]), ("pi05", [1018, 1018, 1018]), ("smolvla", [163, 227, 291])],
)
def test_lerobot_plan_token_spec_counts_the_policy_s_sequence(name: str, counts: list[int]) -> None:
    cost = PolicyLengthModel(LeRobotPolicy.preset(name), slots=3)
    spec = cost.token_spec()
    got = [breakdown_sample({"cameras": n, "frames": 1, "height": 480, "width": 640}, spec).total for n in (1, 2, 3)]
    assert got == counts == [cost.length(n) for n in (1, 2, 3)]
    assert [cost.slots_at(c) for c in counts] == [cost.slots(n) for n in (1, 2, 3)]


def test_lerobot_plan_slots_follow_lerobot_s_padding() -> None:
    # NOTE [ Camera slots ]: pi0 runs every camera feature, SmolVLA pads at most empty_cameras
    pi0 = LeRobotPolicy.preset("pi0", image_features=3)
    assert [pi0.slots(n) for n in (1, 2, 3)] == [3, 3, 3]
    smol = LeRobotPolicy.preset("smolvla", image_features=3)
    assert [smol.slots(n) for n in (1, 2, 3)] == [1, 2, 3]
    assert [dataclasses.replace(smol, empty_cameras=1).slots(n) for n in (1, 2, 3)] == [2, 3, 3]
    with pytest.raises(ConfigError, match="present should be a positive number of cameras, but got present=0"):
        smol.slots(0)


@pytest.mark.parametrize("name", ["pi0", "smolvla"])
def test_lerobot_plan_max_batch_is_the_largest_that_fits(name: str) -> None:
    cost = PolicyLengthModel(LeRobotPolicy.preset(name), slots=3, frame=(480, 640))
    for present in (1, 2, 3):
        length = cost.length(present)
        largest = cost.max_batch(length, BUDGET)
        assert largest >= 1
        assert cost.memory(largest, length).total <= BUDGET < cost.memory(largest + 1, length).total
    # larger frames only lower the batch (the float32 inputs are on the GPU for the step)
    small = PolicyLengthModel(LeRobotPolicy.preset(name), slots=3, frame=(96, 96))
    assert small.max_batch(small.length(3), BUDGET) >= cost.max_batch(cost.length(3), BUDGET)


def _mixture(tmp_path: Path, lerobot_dir: str) -> list[str]:
    argv = []
    for name, info in EMBODIMENTS.items():
        meta = tmp_path / name / "meta"
        meta.mkdir(parents=True)
        shutil.copy(Path(lerobot_dir) / info, meta / "info.json")
        with open(meta / "episodes.jsonl", "w") as f:
            f.write(json.dumps({"episode_index": 0, "tasks": ["t"], "length": FRAMES[name]}) + "\n")
        argv += ["--lerobot", f"{name}={tmp_path / name}"]
    return argv


def test_lerobot_plan_cli_smolvla_gives_each_embodiment_its_batch(
    tmp_path: Path, lerobot_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.parquet"
    argv = ["plan", *_mixture(tmp_path, lerobot_dir), "--lerobot-policy", "smolvla", "--gpu", "H100-SXM"]
    code, stdout, err = cli(capsys, *argv, "--out", str(out), "--json")
    assert code == 0, err
    got = json.loads(stdout)
    cost = PolicyLengthModel(LeRobotPolicy.preset("smolvla"), slots=2, frame=(480, 640))
    # PushT's one camera and the two-camera embodiments: two buckets, each at its own batch
    assert [(b["camera_slots"], b["samples"]) for b in got["per_bucket"]] == [
        (1, FRAMES["pusht"]),
        (2, FRAMES["so100"] + FRAMES["libero"]),
    ]
    for b in got["per_bucket"]:
        assert b["bound"] == cost.length(b["camera_slots"])
        assert b["batch_size"] == cost.max_batch(b["bound"], BUDGET)
    assert got["summary"]["over_budget_batches"] == 0 and got["summary"]["rejected"] == 0
    assert pq.read_metadata(out).num_rows == sum(FRAMES.values())  # every sample in a bucket


def test_lerobot_plan_cli_pi0_config_runs_all_its_camera_features(
    tmp_path: Path, lerobot_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    visual = {"type": "VISUAL", "shape": [3, 224, 224]}
    features = {f"observation.images.cam{i}": visual for i in range(3)}
    config = {"type": "pi0", "freeze_vision_encoder": True, "input_features": features}
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text(json.dumps(config))
    argv = ["plan", *_mixture(tmp_path, lerobot_dir), "--lerobot-policy", str(tmp_path / "policy")]
    code, stdout, err = cli(capsys, *argv, "--gpu", "H100-SXM", "--out", str(tmp_path / "m.parquet"), "--json")
    assert code == 0, err
    got = json.loads(stdout)
    # one bucket: every sample runs the config's three slots (867 tokens), one camera or two
    assert [(b["camera_slots"], b["bound"], b["samples"]) for b in got["per_bucket"]] == [
        (3, 867, sum(FRAMES.values()))
    ]
    policy = LeRobotPolicy.preset("pi0", freeze_vision_encoder=True)
    largest = policy.max_batch(BUDGET, cameras=3, present=2, frame=(480, 640))
    assert got["per_bucket"][0]["batch_size"] == largest
    assert got["policy"]["camera_slots"] == 3 and got["policy"]["lerobot_policy"] == "pi0"


def test_lerobot_plan_cli_rejects_samples_with_more_cameras_than_features(
    tmp_path: Path, lerobot_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"type": "pi0", "input_features": {"observation.image": {"type": "VISUAL", "shape": [3, 96, 96]}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["plan", *_mixture(tmp_path, lerobot_dir), "--lerobot-policy", str(tmp_path / "config.json")]
    argv += ["--gpu", "H100-SXM", "--out", str(tmp_path / "m.parquet"), "--on-invalid", "reject", "--json"]
    code, stdout, err = cli(capsys, *argv)
    assert code == 0, err
    got = json.loads(stdout)
    # the two-camera embodiments are rejected with their reason; PushT plans
    assert got["summary"]["rejected"] == FRAMES["so100"] + FRAMES["libero"]
    assert [(b["camera_slots"], b["samples"]) for b in got["per_bucket"]] == [(1, FRAMES["pusht"])]


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (["--patch", "14"], ["--patch", "--lerobot-policy"]),
        (["--buckets", "2d"], ["--buckets 2d", "--lerobot-policy"]),
        (["--hf-config", "x"], ["--hf-config", "--lerobot-policy"]),
        (["--mode", "packed"], ["--mode packed"]),
        (["--delta-timestamps", '{"observation.image": [-0.1, 0.0]}'], ["observation.image", "2 frames"]),
    ],
)
def test_lerobot_plan_cli_refusals_are_one_line(
    extra: list[str], names: list[str], tmp_path: Path, lerobot_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", *_mixture(tmp_path, lerobot_dir), "--lerobot-policy", "pi0", "--gpu", "H100-SXM"]
    code, _, err = cli(capsys, *argv, "--out", str(tmp_path / "m.parquet"), *extra)
    assert code == 2
    one_line_error(err, *names)
    assert not (tmp_path / "m.parquet").exists()


def test_lerobot_plan_cli_policy_needs_lerobot_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(
        capsys, "plan", "x.parquet", "--lerobot-policy", "pi0", "--gpu", "H100-SXM", "--out", "m.parquet"
    )
    assert code == 2
    one_line_error(err, "--lerobot-policy", "--lerobot DATASET")


def test_lerobot_plan_cli_dataset_without_cameras_is_one_line(
    tmp_path: Path, lerobot_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    info = json.loads((Path(lerobot_dir) / "pusht.json").read_text())
    info["features"] = {k: v for k, v in info["features"].items() if v["dtype"] not in ("video", "image")}
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text(json.dumps(info))
    (tmp_path / "meta" / "episodes.jsonl").write_text(json.dumps({"episode_index": 0, "length": 5}) + "\n")
    argv = ["plan", "--lerobot", str(tmp_path), "--lerobot-policy", "smolvla", "--gpu", "H100-SXM"]
    code, _, err = cli(capsys, *argv, "--out", str(tmp_path / "m.parquet"))
    assert code == 2
    one_line_error(err, "--lerobot-policy needs cameras")


def test_lerobot_plan_step_time_counts_each_policy_s_own_layers() -> None:
    pi0 = PolicyLengthModel(LeRobotPolicy.preset("pi0"), slots=3, gpu="H100-SXM")
    smol = PolicyLengthModel(LeRobotPolicy.preset("smolvla"), slots=3, gpu="H100-SXM")
    # pi0: 18 backbone + 18 expert layers + 27 SigLIP blocks; SmolVLA: 16 VLM + 16 expert + 12 tower
    assert pi0.fixed_cost().kernels // (18 + 18 + 27) == smol.fixed_cost().kernels // (16 + 16 + 12)
    assert pi0.step_seconds(8, pi0.length(3)) > smol.step_seconds(8, smol.length(3)) > 0


def test_lerobot_plan_smolvla_with_empty_cameras_prices_its_features_as_the_spec_counts() -> None:
    # with empty_cameras a SmolVLA sample runs up to the config's features: the spec's upper bound
    cost = PolicyLengthModel(LeRobotPolicy.preset("smolvla", image_features=3, empty_cameras=1), slots=2)
    spec = cost.token_spec()
    got = [breakdown_sample({"cameras": n, "frames": 1, "height": 96, "width": 96}, spec).total for n in (1, 2, 3)]
    assert got == [cost.length(n) for n in (1, 2, 3)] == [291, 291, 291]
