"""``tokenbucket cost --lerobot-policy``: the CLI prices what :class:`LeRobotPolicy` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli_errors import cli, one_line_error
from tokenbucket.cost.gpus import get_gpu, gpu_budget_bytes
from tokenbucket.cost.lerobot_policy import LeRobotPolicy


def test_cost_lerobot_policy_from_a_config_folder_equals_the_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"type": "smolvla", "train_expert_only": False, "freeze_vision_encoder": True, "chunk_size": 50}
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["cost", "--lerobot-policy", str(tmp_path), "--batch", "16", "--cameras", "2", "--text-tokens", "64"]
    code, out, err = cli(capsys, *argv, "--gpu", "H100-SXM", "--json")
    assert code == 0, err
    got = json.loads(out)
    policy = LeRobotPolicy.from_config(config)
    mem = policy.memory(16, cameras=2, text_tokens=64)
    assert got["peak_bytes"] == mem["peak_bytes"]
    assert {k: got[k] for k in ("weights", "gradients", "optimizer", "activations")} == {
        k: mem[k] for k in ("weights", "gradients", "optimizer", "activations")
    }
    budget = gpu_budget_bytes(get_gpu("H100-SXM"))
    assert got["budget_bytes"] == budget and got["gpu"] == "H100-SXM"
    largest = got["max_batch"]
    assert policy.memory(largest, cameras=2, text_tokens=64)["peak_bytes"] <= budget
    assert policy.memory(largest + 1, cameras=2, text_tokens=64)["peak_bytes"] > budget


@pytest.mark.parametrize("preset", ["pi0", "pi05", "smolvla"])
def test_cost_lerobot_policy_preset_table(preset: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "cost", "--lerobot-policy", preset, "--batch", "4", "--gpu", "H100-SXM")
    assert code == 0, err
    policy = LeRobotPolicy.preset(preset)  # 3 cameras; the language padded as LeRobot pads it (pi0.5: 200)
    peak = policy.memory(4, cameras=3, text_tokens=policy.tokenizer_max_length)["peak_bytes"]
    assert f"{peak / 2**30:,.2f} GiB" in out and "largest batch:" in out


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--lerobot-policy", "pi7", "--batch", "1"], ["--lerobot-policy", "pi7"]),
        (["--lerobot-policy", "smolvla", "--batch", "1", "--length", "512"], ["--length", "--lerobot-policy"]),
        (["--lerobot-policy", "pi0", "--batch", "1", "--train", "lora"], ["--train"]),
        (["--preset", "qwen2-vl-2b", "--batch", "1", "--cameras", "2"], ["--cameras", "--lerobot-policy"]),
        (["--lerobot-policy", "pi0", "--batch", "1", "--cameras", "0"], ["--cameras"]),
    ],
)
def test_cost_lerobot_policy_bad_flag_is_one_line(
    argv: list[str], names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "cost", *argv)
    assert code == 2
    one_line_error(err, *names)


def test_cost_lerobot_policy_bad_dir_or_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "cost", "--lerobot-policy", str(tmp_path), "--batch", "1")
    assert code == 1
    one_line_error(err, "no LeRobot config.json")
    (tmp_path / "config.json").write_text(json.dumps({"type": "act"}))
    code, _, err = cli(capsys, "cost", "--lerobot-policy", str(tmp_path), "--batch", "1")
    assert code == 1
    one_line_error(err, "type should be one of")
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = cli(capsys, "cost", "--lerobot-policy", str(tmp_path), "--batch", "1")
    assert code == 1
    one_line_error(err, "is not JSON")


def test_cost_preset_pi0_refuses_as_a_staged_model_naming_lerobot_policy(capsys: pytest.CaptureFixture[str]) -> None:
    sample = '{"images": 3, "height": 224, "width": 224, "text_tokens": 48}'
    code, _, err = cli(capsys, "cost", "--preset", "pi0", "--batch", "4", "--sample", sample)
    assert code == 1
    one_line_error(err, "pi0", "--lerobot-policy pi0")
