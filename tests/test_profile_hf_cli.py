"""``tokenbucket profile`` for real models (issue: measured mode for any model).

``--hf-config`` builds the config's transformers model on fake tensors and makes its inputs from
``--sample`` (or each ``--length``'s worst sample); ``--save`` writes a profile that ``plan
--hf-config ... --profile`` plans from, and refuses for another model, setup or vision share.
A MODULE:FACTORY may now be a Hugging Face model built with ``.to(bf16)`` and fed keyword inputs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_cli_errors import cli, one_line_error, snapshot
from tests.test_plan_hf import metadata
from tokenbucket.cost import hf_profile
from tokenbucket.cost.gpus import gpu_budget_bytes
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.measured import Profile, SteppedCostModel
from tokenbucket.cost.staged import StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.plan.manifest import load_manifest
from tokenbucket.tokens.hf import read_hf_config

# a Qwen2-VL small enough to measure in a second a point (head_dim 128: its 3-D rope sections)
TINY_VL = {
    "model_type": "qwen2_vl", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 151936, "tie_word_embeddings": True,
    "vision_config": {"depth": 2, "embed_dim": 64, "hidden_size": 256, "num_heads": 4, "mlp_ratio": 2},
}  # fmt: skip
SAMPLE = json.dumps({"images": 2, "height": 448, "width": 448, "text_tokens": 64})
LENGTHS = ("1024", "2048", "3072", "4608")


@pytest.fixture
def tiny_vl(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-vl"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_VL))
    return folder


@pytest.mark.slow
def test_profile_hf_config_one_sample_beside_the_staged_estimate(
    capsys: pytest.CaptureFixture[str], tiny_vl: Path
) -> None:
    code, out, err = cli(capsys, "profile", "--hf-config", str(tiny_vl), "--sample", SAMPLE, "--batch", "2", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["seq_len"] == 2 * 256 + 64 and r["steps"] == 2
    assert r["within_band"] and abs(r["error_percent"]) < 1.0
    assert r["measured"]["optimizer"] > 0 and r["predicted"]["optimizer"] > 0  # the steady state: states live
    code, out, _ = cli(capsys, "profile", "--hf-config", str(tiny_vl), "--sample", SAMPLE, "--train", "lora")
    assert code == 0 and "predicted" in out and "peak" in out


@pytest.fixture
def tiny_vl_fp32(tmp_path: Path) -> Path:
    """TINY_VL as a checkpoint stored in fp32 declares it (PaliGemma's config.json does)."""
    folder = tmp_path / "tiny-vl-fp32"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**TINY_VL, "torch_dtype": "float32"}))
    return folder


@pytest.mark.parametrize(
    ("flags", "dtype", "why"),
    [
        ([], "bf16", "built in bf16: --precision not given; config.json declares torch_dtype=float32, which is how "
                     "the checkpoint is stored, not how it trains"),
        (["--precision", "fp32"], "fp32", "built in fp32 as --precision asks"),
        (["--precision", "bf16"], "bf16", "built in bf16 as --precision asks; config.json declares torch_dtype=float32"),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_profile_hf_header_says_the_dtype_built_and_why(
    capsys: pytest.CaptureFixture[str], tiny_vl_fp32: Path, flags: list[str], dtype: str, why: str
) -> None:
    argv = ["profile", "--hf-config", str(tiny_vl_fp32), "--sample", SAMPLE, "--batch", "2", *flags]
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    header, *rest = out.splitlines()
    assert f"on fake tensors (CPU), {dtype}, train full" in header
    assert any(line.startswith(f"  note: {why}") for line in rest), rest  # which dtype, and why
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["dtype"] == dtype and r["notes"][0].startswith(why)
    # the staged model prices bf16 and is exact on this model; an fp32 build is 2x in weights and states
    assert r["measured_breakdown"]["Parameter"] == (2 if dtype == "bf16" else 4) * r["params_total"]
    assert r["within_band"] == (dtype == "bf16")


@pytest.mark.slow
def test_profile_hf_outside_the_band_names_the_suspect_and_why(
    capsys: pytest.CaptureFixture[str], tiny_vl_fp32: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["profile", "--hf-config", str(tiny_vl_fp32), "--sample", SAMPLE, "--batch", "2"]
    # an fp32 build against the bf16 staged model: the measurement is of another precision
    code, out, err = cli(capsys, *argv, "--precision", "fp32")
    assert code == 0, err
    assert "trust the measurement" not in out
    (verdict,) = [line for line in out.splitlines() if line.startswith("the staged model is ")]
    assert "outside its band" in verdict
    assert "suspect: the measurement, it measured the fp32 build and the staged model prices bf16" in verdict
    # a checked bf16 build of the staged model's parameter count, twice the predicted peak: the staged model
    real = hf_profile.profile_hf
    cfg = read_hf_config(tiny_vl_fp32)
    staged_params = staged_from_config(cfg).params

    def doubled(*args: Any, **kwargs: Any) -> hf_profile.HFProfile:
        run = real(*args, **kwargs)
        return dataclasses.replace(run, peak_bytes=2 * run.peak_bytes, **changes)

    changes: dict[str, int] = {}
    monkeypatch.setattr(hf_profile, "profile_hf", doubled)
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["params_total"] == staged_params and -51 < r["error_percent"] < -49
    assert r["suspect"]["which"] == "the staged model"
    assert f"bf16 parameters, {staged_params:,} of them as the staged model counts" in r["suspect"]["why"]
    code, out, err = cli(capsys, *argv)
    assert f"suspect: the staged model, the build is checked (bf16 parameters, {staged_params:,}" in out
    assert f"the staged model is {r['error_percent']:+.1f} % off it for this model" in out
    # another parameter count than transformers built: the staged model describes another model
    changes["params_total"] = staged_params + 1000
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    assert (
        f"suspect: the staged model's reading of config.json, transformers built {staged_params + 1000:,} parameters "
        f"and the staged model counts {staged_params:,}"
    ) in out


@pytest.mark.slow
def test_profile_hf_grid_then_plan_from_it_stays_under_budget(
    capsys: pytest.CaptureFixture[str], tiny_vl: Path, tmp_path: Path
) -> None:
    prof = tmp_path / "profile.json"
    lengths = [x for n in LENGTHS for x in ("--length", n)]
    code, _, err = cli(capsys, "profile", "--hf-config", str(tiny_vl), *lengths, "--batch", "4",
                       "--vision-share", "0.9", "--save", str(prof), "--quiet")  # fmt: skip
    assert code == 0, err
    saved = Profile.load(prof)
    assert saved.staged is not None and saved.staged["transformers"]  # the version it was measured with
    assert {k: saved.staged[k] for k in ("vision_share", "image", "steps")} == {
        "vision_share": 0.9, "image": [448, 448], "steps": 2}  # fmt: skip
    assert {p[0] for p in saved.points} == {1, 2, 4} and {p[1] for p in saved.points} == {int(n) for n in LENGTHS}
    meta, _ = metadata(tmp_path)
    plans = {}
    for name, extra in (("analytic", []), ("profile", ["--profile", str(prof)])):
        out_path = tmp_path / f"{name}.parquet"
        code, out, err = cli(capsys, "plan", str(meta), "--hf-config", str(tiny_vl), "--gpu", "H100-SXM",
                             "--max-buckets", "4", "--vision-share", "0.9", "--on-oversize", "reject",
                             "--out", str(out_path), "--json", *extra)  # fmt: skip
        assert code == 0, err
        plans[name] = json.loads(out)
    budget = gpu_budget_bytes("H100-SXM")
    cfg = read_hf_config(tiny_vl)
    exact = StagedLengthModel(StagedCostModel(staged_from_config(cfg), config=cfg), vision_share=0.9)
    for name, plan in plans.items():
        assert plan["summary"]["over_budget_batches"] == 0, name
        for b in plan["buckets"]:  # the staged model is exact on this model: every bucket truly fits
            assert exact.memory(b["batch_size"], b["bound"]).total <= budget, (name, b)
    # the analytic plan's bucket bounds as the grid: the profiled plan can take the very same bounds
    bounded = tmp_path / "bounds.json"
    code, _, err = cli(capsys, "profile", "--hf-config", str(tiny_vl), "--bounds-of", str(tmp_path / "analytic.parquet"),
                       "--batch", "2", "--vision-share", "0.9", "--save", str(bounded), "--quiet")  # fmt: skip
    assert code == 0, err
    assert {p[1] for p in Profile.load(bounded).points} == {b["bound"] for b in plans["analytic"]["buckets"]}
    footer = load_manifest(tmp_path / "profile.parquet").meta["meta"]
    assert footer["profile"]["staged"]["vision_share"] == 0.9 and footer["profile"]["points"] == 12
    assert footer["profile"]["staged_model_disagrees"] == []  # exact on this model


def test_plan_refuses_a_staged_profile_made_for_another_setup_or_a_lighter_share(
    capsys: pytest.CaptureFixture[str], tiny_vl: Path, tmp_path: Path
) -> None:
    cfg = read_hf_config(tiny_vl)
    from tokenbucket.cost.staged_length import staged_profile_key

    key = staged_profile_key(StagedCostModel(staged_from_config(cfg), config=cfg))
    points = tuple((b, n, 2**30 * b + n * 2**20) for n in (1024, 4608) for b in (1, 2))
    prof = tmp_path / "p.json"
    Profile(points, "fake-cpu", "bf16", "2.13", key, "fake", staged={"vision_share": 0.5, "image": [448, 448],
                                                                     "steps": 2}).save(prof)  # fmt: skip
    meta, _ = metadata(tmp_path)
    before = snapshot(tmp_path)
    base = ["plan", str(meta), "--hf-config", str(tiny_vl), "--gpu", "H100-SXM", "--out", str(tmp_path / "m.parquet"),
            "--profile", str(prof)]  # fmt: skip
    code, _, err = cli(capsys, *base, "--vision-share", "0.9")
    assert code == 1
    one_line_error(err, str(prof), "vision share 0.5", "--vision-share 0.9")
    # the right key and share, but made-up peaks: the plan follows them and says the staged model disagrees
    code, out, err = cli(capsys, *base, "--vision-share", "0.5", "--on-oversize", "reject")
    assert code == 0, err
    assert "the staged model disagrees with the profile at 4 of 4 points" in out
    code, _, err = cli(capsys, *base, "--vision-share", "0.5", "--train", "lora")
    assert code == 1
    one_line_error(err, str(prof), key, "training setup")
    block = tmp_path / "block.json"
    Profile(points, "fake-cpu", "bf16", "2.13", "abc", "fake").save(block)
    code, _, err = cli(capsys, *base[:-1], str(block), "--vision-share", "0.5")
    assert code == 1
    one_line_error(err, "block model")
    written = {"block.json": block.read_bytes(), "m.parquet": (tmp_path / "m.parquet").read_bytes()}
    assert snapshot(tmp_path) == {**before, **written}  # the refused commands wrote nothing


def test_stepped_profile_prices_a_length_at_the_next_measured_one() -> None:
    points = ((1, 1024, 10 * 2**30), (2, 1024, 12 * 2**30), (1, 2048, 20 * 2**30), (3, 2048, 30 * 2**30))
    model = SteppedCostModel(Profile(points, "fake-cpu", "bf16", "2.13", "m", "fake", staged={"vision_share": 1}))
    assert model.memory_bytes(4, 1024) == pytest.approx(16 * 2**30, rel=1e-9)  # 8 GiB static + 2 GiB a sample
    assert model.memory_bytes(4, 1025) == model.memory_bytes(4, 2048) == pytest.approx(35 * 2**30, rel=1e-9)
    assert model.memory_bytes(1, 64) == pytest.approx(10 * 2**30, rel=1e-9)
    assert model.max_batch(1024, 16 * 2**30) == 4
    with pytest.raises(Exception, match="past the profile's longest length, 2,048"):
        model.memory_bytes(1, 2049)
    one_batch = Profile(((1, 1024, 2**30), (1, 2048, 2**31)), "fake-cpu", "bf16", "2.13", "m", "fake")
    with pytest.raises(Exception, match="one batch size at 1,024 tokens"):
        SteppedCostModel(one_batch)


def test_profile_factory_may_be_an_hf_model_built_with_to_bf16_and_fed_keywords(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The user's path: Qwen2ForCausalLM(cfg).to(torch.bfloat16), a ModelOutput, keyword inputs."""
    code, out, err = cli(capsys, "profile", "tests.user_models:hf_qwen2", "--input", "tests.user_models:hf_text_inputs",
                         "--sample", '{"text_tokens": 128}', "--length", "128", "--batch", "2",
                         "--hidden", "64", "--layers", "2", "--heads", "4", "--json")  # fmt: skip
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["measured"] > 0
    code, out, err = cli(capsys, "profile", "tests.user_models:hf_qwen2", "--input", "tests.user_models:hf_text_inputs",
                         "--sample", '{"text_tokens": 128}', "--length", "128", "--batch", "2",
                         "--hidden", "64", "--layers", "2", "--heads", "4")  # fmt: skip
    assert code == 0, err
    assert f"the block model is {row['ratio']:.2f}x the measured peak" in out  # said, not buried in a column


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--hf-config", "DIR"], ["--sample", "--length"]),
        (["--hf-config", "DIR", "--sample", SAMPLE, "--length", "1024"], ["--sample", "--length"]),
        (["--hf-config", "DIR", "--sample", SAMPLE, "--save", "p.json"], ["--save", "--length"]),
        (["--hf-config", "DIR", "--sample", SAMPLE, "--input", "m:f"], ["--input"]),
        (["m:f", "--hf-config", "DIR", "--sample", SAMPLE], ["MODULE:FACTORY", "--hf-config"]),
        (["--preset", "qwen2-vl-2b", "--batch", "1"], ["--preset qwen2-vl-2b", "--hf-config"]),
        (["--hf-config", "DIR", "--sample", SAMPLE, "--precision", "amp"], ["--precision amp", "bf16 or fp32"]),
        ([], ["MODULE:FACTORY", "--hf-config"]),
    ],
)
def test_profile_hf_usage_mistakes_are_one_line(
    capsys: pytest.CaptureFixture[str], tiny_vl: Path, argv: list[str], names: list[str]
) -> None:
    argv = [str(tiny_vl) if a == "DIR" else a for a in argv]
    code, out, err = cli(capsys, "profile", *argv)
    assert code == 2 and out == ""
    one_line_error(err, *names)
