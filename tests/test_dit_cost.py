"""The video DiT cost model against diffusers' own transformers (NOTE [ What a DiT block keeps ]).

Three oracles, none of them ours: the parameters diffusers' class builds (on the meta device), the
tensors autograd saves in its forward (``saved_tensors_hooks``, tiny sizes, fake tensors), and the
peaks of the fine-tuning step measured at the published sizes (``tests/data/dit_truth.json``, from
``benchmarks/dit_truth.py``; one point re-measured in the slow tier).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.dit import DiTCostModel, DiTSetup
from tokenbucket.models import dit_family
from tokenbucket.models._dit import DiTConfig, Latents, VAEFactors

diffusers = pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT / "tests" / "data" / "dit_truth.json"
BAND = (-3.0, 7.0)  # percent, the band around the measured peak


def _truth() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TRUTH.read_text())
    return data


def _config(arch: str) -> DiTConfig:
    entry = _truth()["configs"][arch]
    t, s, c = entry["vae"]
    return DiTConfig(arch, entry["transformer"]["_class_name"], dict(entry["transformer"]), VAEFactors(t, s, c, arch))


def _setup(point: dict[str, Any]) -> DiTSetup:
    return DiTSetup(train=point["train"], checkpointing=point["checkpointing"], sharding=point["sharding"],
                    world_size=point["world_size"])  # fmt: skip


def test_dit_truth_set_covers_every_model_setup_and_three_shapes() -> None:
    points = _truth()["points"]
    by_arch: dict[str, set[tuple[Any, ...]]] = {}
    for p in points:
        by_arch.setdefault(p["arch"], set()).add((p["train"], p["checkpointing"], p["sharding"]))
    assert by_arch and all(
        {("full", False, "none"), ("lora", False, "none"), ("full", False, "fsdp"), ("full", True, "none")} <= s
        for s in by_arch.values()
    ), by_arch
    for arch in by_arch:
        shapes = {(p["frames"], p["height"], p["width"]) for p in points if p["arch"] == arch}
        assert len(shapes) >= 3, (arch, shapes)


def test_dit_cost_is_within_the_band_of_every_measured_point() -> None:
    errors = []
    for p in _truth()["points"]:
        model = DiTCostModel(_config(p["arch"]), _setup(p))
        est = model.sample_memory(p["batch"], frames=p["frames"], height=p["height"], width=p["width"],
                                  text_tokens=p["text_tokens"])  # fmt: skip
        assert est.video_tokens == p["tokens"], p
        adapters = model.params.lora if p["train"] == "lora" else 0  # the measured model holds them
        assert model.params.total + adapters == p["params_total"], p
        err = 100.0 * (est.peak_bytes - p["peak_bytes"]) / p["peak_bytes"]
        errors.append((round(err, 2), p["arch"], p["frames"], p["train"], p["checkpointing"], p["sharding"]))
    worst = min(errors), max(errors)
    assert BAND[0] <= worst[0][0] and worst[1][0] <= BAND[1], worst


# the smallest published config of each family in the fast tier, the larger ones in the slow one
FAST_PARAMS = {"wan2.1-1.3b", "cogvideox-2b", "ltx-video-2b", "hunyuan-video", "cosmos-predict2-2b"}


@pytest.mark.parametrize(
    "arch",
    [pytest.param(a, marks=[pytest.mark.slow] * (a not in FAST_PARAMS)) for a in sorted(
        json.loads(TRUTH.read_text())["configs"])],
)  # fmt: skip
def test_dit_params_equal_what_diffusers_builds(arch: str) -> None:
    """The whole count, the fp32-kept share, the largest block and the LoRA adapters on
    ``to_q``/``to_k``/``to_v``/``to_out.0`` (whatever those names hit in the family: HunyuanVideo's
    text stream and single-stream output have other names)."""
    import peft

    from tokenbucket.cost.dit_profile import _block_lists

    cfg = _config(arch)
    cls = getattr(diffusers, cfg.class_name)
    with torch.device("meta"):
        model = cls.from_config({k: v for k, v in cfg.transformer.items() if not k.startswith("_")})
    keep = tuple(model._keep_in_fp32_modules or ())
    ours = dit_family(cfg.class_name).params(cfg, lora_rank=16)
    assert ours.total == sum(p.numel() for p in model.parameters())
    assert ours.fp32 == sum(p.numel() for n, p in model.named_parameters() if any(k in n for k in keep))
    assert ours.block == max(sum(p.numel() for p in b.parameters()) for b in _block_lists(model))
    # the tables the class builds (CogVideoX's sin-cos positions); a few MiB (Wan's rotary table) are left out
    assert abs(ours.buffers - sum(b.untyped_storage().nbytes() for b in model.buffers())) < 2**24
    # the adapters, on a copy with two blocks of each kind (peft's wrapping of every block is slow): a count per block
    two = {k: 2 if k in ("num_layers", "num_single_layers") else v for k, v in cfg.transformer.items()}
    with torch.device("meta"):
        model = cls.from_config({k: v for k, v in two.items() if not k.startswith("_")})
    before = sum(p.numel() for p in model.parameters())
    model.add_adapter(peft.LoraConfig(r=16, lora_alpha=16, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    lora = dit_family(cfg.class_name).params(DiTConfig(arch, cfg.class_name, two, cfg.vae), lora_rank=16).lora
    assert lora == sum(p.numel() for p in model.parameters()) - before


def _saved_bytes(cfg: DiTConfig, latents: Latents, text: int, train: str) -> int:
    """The bytes of every tensor autograd saves in one forward (each storage once; parameters not)."""
    from tokenbucket.cost._kernels import attention_kernels
    from tokenbucket.cost.dit_profile import build_dit
    from tokenbucket.cost.profile import default_dtype

    fam = dit_family(cfg.class_name)
    with FakeTensorMode(allow_non_fake_inputs=True), default_dtype(torch.bfloat16), attention_kernels("cuda"):
        model, _ = build_dit(cfg, train=train)
        inputs = fam.inputs(cfg, 1, latents, text, torch.bfloat16)
        kept = {StorageWeakRef(t.untyped_storage()) for t in [*model.parameters(), *model.buffers()]}
        seen: dict[StorageWeakRef, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            ref = StorageWeakRef(t.untyped_storage())
            if ref not in kept:
                seen[ref] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(**inputs)
    return sum(seen.values())


# each family's tiny transformer: its config but the width, and the keys that count each kind of block
TINY: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "WanTransformer3DModel": ({"patch_size": [1, 2, 2], "in_channels": 16, "out_channels": 16, "text_dim": 64,
                               "freq_dim": 256}, ("num_layers",)),
    "CogVideoXTransformer3DModel": ({"in_channels": 16, "out_channels": 16, "time_embed_dim": 32,
                                     "text_embed_dim": 64, "patch_size": 2}, ("num_layers",)),
    "LTXVideoTransformer3DModel": ({"in_channels": 128, "out_channels": 128, "caption_channels": 64},
                                   ("num_layers",)),
    "HunyuanVideoTransformer3DModel": ({"in_channels": 16, "out_channels": 16, "num_refiner_layers": 1,
                                        "text_embed_dim": 64, "pooled_projection_dim": 32},
                                       ("num_layers", "num_single_layers")),
    "CosmosTransformer3DModel": ({"in_channels": 17, "out_channels": 16, "text_embed_dim": 64, "adaln_lora_dim": 32,
                                  "extra_pos_embed_type": None, "rope_scale": [1.0, 3.0, 3.0]}, ("num_layers",)),
}  # fmt: skip


def _tiny(class_name: str, heads: int, head_dim: int, ratio: float, blocks: tuple[int, ...], text: int) -> DiTConfig:
    """``class_name``'s tiny transformer: ``heads x head_dim`` wide, an MLP ``ratio`` times that
    (CogVideoX's and LTX-Video's are four times, whatever the ratio), ``blocks`` of each kind, and
    ``text`` positions where the config fixes them (CogVideoX's ``max_text_seq_length``)."""
    base, keys = TINY[class_name]
    width = heads * head_dim
    t = {"_class_name": class_name, **base, "num_attention_heads": heads, "attention_head_dim": head_dim,
         **dict(zip(keys, blocks, strict=True))}  # fmt: skip
    if class_name == "WanTransformer3DModel":
        t["ffn_dim"] = int(ratio * width)
    elif class_name == "CogVideoXTransformer3DModel":
        t["max_text_seq_length"] = text
    elif class_name == "LTXVideoTransformer3DModel":
        t["cross_attention_dim"] = width
    else:
        t["mlp_ratio"] = ratio
    if class_name == "HunyuanVideoTransformer3DModel":  # the rotary axes share the head: even parts
        side = head_dim // 3 // 2 * 2
        t["rope_axes_dim"] = [head_dim - 2 * side, side, side]
    vae = VAEFactors(8, 32, 128, "tiny") if class_name == "LTXVideoTransformer3DModel" else VAEFactors(4, 8, 16, "tiny")
    return DiTConfig("tiny", class_name, t, vae)


def _tiny_saved(class_name: str, width: tuple[int, int, float], blocks: tuple[int, ...], frames: int, text: int,
                train: str) -> int:  # fmt: skip
    """:func:`_saved_bytes` of the tiny transformer (``width``: heads, head width, MLP ratio) on
    ``frames`` latent frames of 8 x 8 patches and ``text`` text states."""
    cfg = _tiny(class_name, *width, blocks, text)
    p_t, p_h, p_w = dit_family(class_name).patch_sizes(cfg)
    side = 8 * p_h
    return _saved_bytes(cfg, Latents(frames, side, side, frames // p_t * (side // p_h) * (side // p_w)), text, train)


# the fast tier: the full step of the three families whose tiny blocks build in about a second, and
# Wan's LoRA step; the slow tier: the rest (HunyuanVideo's two kinds of block, CogVideoX, the LoRA steps)
FAST_BLOCKS = {("WanTransformer3DModel", "full"), ("WanTransformer3DModel", "lora"),
               ("LTXVideoTransformer3DModel", "full"), ("CosmosTransformer3DModel", "full")}  # fmt: skip
BLOCK_CASES = [
    pytest.param(c, t, marks=[pytest.mark.slow] * ((c, t) not in FAST_BLOCKS), id=f"{c}-{t}")
    for c in sorted(TINY) for t in ("full", "lora")
]  # fmt: skip


@pytest.mark.parametrize(("class_name", "train"), BLOCK_CASES)
def test_dit_block_terms_equal_what_autograd_saves_in_diffusers_block(class_name: str, train: str) -> None:
    """Each kind of block's bytes per video token and per text token: the difference between one
    and two blocks of that kind, at two token counts and two text lengths, for two widths (head
    count, head width and MLP width all changed)."""
    kinds = len(TINY[class_name][1])
    one = (1,) * kinds
    for width in ((2, 64, 4.0), (4, 48, 2.0)):
        base = {(f, t): _tiny_saved(class_name, width, one, f, t, train) for f, t in ((4, 32), (8, 32), (4, 64))}
        terms = dit_family(class_name).step_terms(_tiny(class_name, *width, one, 32), train).blocks
        for kind, expected in enumerate(terms):
            two = tuple(2 if i == kind else 1 for i in range(kinds))
            block = {key: _tiny_saved(class_name, width, two, *key, train) - base[key] for key in base}
            per_video = (block[8, 32] - block[4, 32]) / 256  # 4 latent frames of 64 tokens more
            per_text = (block[4, 64] - block[4, 32]) / 32
            assert per_video == pytest.approx(expected.video, rel=0.01), (width, kind, per_video, expected)
            assert per_text == pytest.approx(expected.text, rel=0.01), (width, kind, per_text, expected)


def test_dit_setup_refuses_what_it_does_not_price_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^train should be one of \['full', 'lora'\] for a video DiT"):
        DiTSetup(train="frozen-vision")
    with pytest.raises(ConfigError, match=r"^world_size=8 needs sharding ddp or fsdp$"):
        DiTSetup(world_size=8)
    for image in ({"_class_name": "WanTransformer3DModel", "image_dim": 1280, "added_kv_proj_dim": 5120},
                  {"_class_name": "HunyuanVideoTransformer3DModel", "image_condition_type": "token_replace"},
                  {"_class_name": "CosmosTransformer3DModel", "img_context_dim_in": 1152}):  # fmt: skip
        with pytest.raises(ConfigError, match=r"image (conditioning|context) .* is not priced yet$"):
            DiTCostModel(DiTConfig("i2v", image["_class_name"], image, VAEFactors(4, 8, 16, "x")))


def _pipeline(tmp_path: Path, arch: str, vae: bool = True) -> Path:
    cfg = _config(arch)
    (tmp_path / "transformer").mkdir(parents=True)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(cfg.transformer))
    if vae:
        (tmp_path / "vae").mkdir()
        (tmp_path / "vae" / "config.json").write_text(json.dumps({
            "_class_name": "AutoencoderKLWan", "z_dim": cfg.vae.channels,
            "scale_factor_temporal": cfg.vae.temporal, "scale_factor_spatial": cfg.vae.spatial}))  # fmt: skip
    return tmp_path


SAMPLE = '{"videos": 1, "frames": 81, "height": 480, "width": 832, "text_tokens": 512}'


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenbucket", *argv], capture_output=True, text=True, timeout=600)


def test_dit_cost_cli_reads_a_pipeline_or_a_transformer_config_alone(tmp_path: Path, capsys: Any) -> None:
    from tokenbucket.cli.main import main

    pipe = _pipeline(tmp_path / "pipe", "wan2.2-ti2v-5b")
    assert main(["cost", "--hf-config", str(pipe), "--sample", SAMPLE.replace("480", "704").replace("832", "1280"),
                 "--batch", "1", "--gpu", "H100-SXM", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    # the Wan 2.2 VAE read from vae/config.json: 16 pixels a latent, 48 channels
    assert out["vae"]["spatial"] == 16 and out["video_tokens"] == 21 * 22 * 40 and out["fits"] is False
    alone = pipe / "transformer" / "config.json"
    assert main(["cost", "--hf-config", str(alone), "--sample", SAMPLE, "--batch", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the published VAE its 48 latent channels imply: Wan 2.2's, 16 pixels a latent
    assert out["vae"]["source"].startswith("published (Wan 2.2 VAE") and out["video_tokens"] == 21 * 15 * 26
    wan21 = _pipeline(tmp_path / "wan21", "wan2.1-1.3b") / "transformer" / "config.json"
    assert main(["cost", "--hf-config", str(wan21), "--sample", SAMPLE, "--batch", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["vae"]["source"].startswith("published (Wan 2.1 VAE") and out["video_tokens"] == 21 * 30 * 52
    for argv, message in (
        (["--sample", SAMPLE.replace("480", "470")], "multiples of 16 (WanPipeline.check_inputs)"),
        (["--sample", SAMPLE, "--train", "frozen-vision"], "--train frozen-vision freezes a VLM's tower"),
        (["--sample", SAMPLE, "--loop", "held"], "--loop describe a VLM's step"),
        (["--sample", '{"frames": 81}'], "--sample needs 'height'"),
    ):
        assert main(["cost", "--hf-config", str(pipe), "--batch", "1", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_dit_cost_and_profile_agree_at_the_published_size(tmp_path: Path) -> None:
    pipe = _pipeline(tmp_path, "wan2.1-1.3b")
    for extra in ([], ["--train", "lora"]):
        run = _cli("profile", "--hf-config", str(pipe), "--sample", SAMPLE, "--batch", "1", "--json", *extra)
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout)
        assert out["video_tokens"] == 32760 and abs(out["error_percent"]) <= 5.0, out


@pytest.mark.slow
def test_dit_truth_remeasure_equals_fixture() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import dit_truth

    stored = next(p for p in _truth()["points"] if (p["arch"], p["frames"], p["train"], p["sharding"],
                                                   p["checkpointing"]) == ("wan2.1-1.3b", 17, "full", "fsdp", True))  # fmt: skip
    fresh = dit_truth.measure("wan2.1-1.3b", (17, 480, 832, 512), ("full", True, "fsdp", 8))
    for key in ("seconds", "versions"):
        stored.pop(key)
        fresh.pop(key)
    assert json.loads(json.dumps(fresh)) == stored
