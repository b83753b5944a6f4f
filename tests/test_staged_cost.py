"""StagedCostModel against measured training peaks of real HF models, and its setup rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks import bench_staged_cost

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.hf_model import StagedModel, staged_from_config
from tokenbucket.cost.staged import ERROR_BAND, STAGE_ITEMS, STAGES, Sample, StagedCostModel, TrainSetup
from tokenbucket.models._hf_json import HFConfig
from tokenbucket.tokens.hf import VisionInputs, vision_inputs

FIXTURE = Path(__file__).resolve().parent / "data" / "hf_truth.json"
BAND = ERROR_BAND  # percent of measured: never under by more than 5 %, over by at most 7 %
# the generator tiles SmolVLM images without upscaling them (benchmarks/hf_truth.py _smol_tiles)
PREPROCESSORS: dict[str, dict[str, Any]] = {
    "smolvlm-256m": {"do_resize": False, "max_image_size": {"longest_edge": 512}},
    "gemma-3-4b": {"do_pan_and_scan": True},  # the generator cuts crops (benchmarks/hf_truth.py _gemma3_passes)
}
# NOTE [ Mistral Small 3.1 under FSDP ]
# Two trackers' blind spots, measured at Mistral-Small-3.1-24B's smallest shape (one 224 px image,
# 328 tokens), where the 24B weights make the peak:
# - the first step's optimizer phase (full, frozen-vision): FSDPMemTracker does not see AdamW's
#   foreach temporary over the DTensor shards (one bf16 copy of the trainable shard, 5.59 GiB a
#   rank) that MemTracker sees unsharded (where the same points are exact): measured 22.36 and
#   22.08 GiB, priced 27.95 and 27.58 (+25.0 %, +24.9 %). The price keeps the temporary: a GPU
#   allocates it.
# - LoRA's forward: at the end of forward on the fake process group, FSDPMemTracker counts 1.04 GiB
#   more activations than the price holds, exactly one Mistral decoder layer's bf16 weights (a
#   third gathered layer where the price holds two): measured 15.40 GiB (forward), priced 14.54
#   (backward), -5.6 %; the steady state 15.45 and 14.58, -5.6 %. Full training's forward holds
#   the same extra (15.95 measured, 14.92 priced) under a larger optimizer-step peak; at the larger
#   shapes the peaks are in backward, where price and measure agree within 0.05 %.
_M3 = ("mistral-small-3.1-24b",)
_AXES = ("dropped", "config", "cpu", "adamw", "none")
# (arch, train, sharding, batch, seq_len, steps, *axes) -> (measured error %, why)
KNOWN_MISSES: dict[tuple[Any, ...], tuple[float, str]] = {
    (*_M3, "full", "fsdp8", 1, 328, 1, *_AXES): (25.0, "NOTE [ Mistral Small 3.1 under FSDP ]: foreach temporary"),
    (*_M3, "frozen-vision", "fsdp8", 1, 328, 1, *_AXES): (
        24.9,
        "NOTE [ Mistral Small 3.1 under FSDP ]: foreach temporary",
    ),
    (*_M3, "lora", "fsdp8", 1, 328, 1, *_AXES): (
        -5.6,
        "NOTE [ Mistral Small 3.1 under FSDP ]: a third layer in forward",
    ),
    (*_M3, "lora", "fsdp8", 1, 328, 2, *_AXES): (
        -5.6,
        "NOTE [ Mistral Small 3.1 under FSDP ]: a third layer in forward",
    ),
}


def _truth() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if not FIXTURE.exists():
        return {}, []
    data = json.loads(FIXTURE.read_text())
    return data["configs"], data["points"]


CONFIGS, POINTS = _truth()


def _key(p: dict[str, Any]) -> tuple[Any, ...]:
    axes = tuple(str(p.get(k, v)) for k, v in bench_staged_cost.AXES_DEFAULTS.items())
    clips = ("video", p["videos"], p["frames"]) if p.get("videos") else ()  # a video point: its clips and frames
    return (p["arch"], p["train"], p["sharding"], p["batch"], p["seq_len"], p.get("steps", 1), *axes, *clips)


def _predict(p: dict[str, Any]) -> int:
    cfg = HFConfig(
        f"<{p['arch']}>", CONFIGS[p["arch"]], PREPROCESSORS.get(p["arch"], {}),
        bench_staged_cost.VIDEO_PREPROCESSORS.get(p["arch"]),
    )  # fmt: skip
    setup = bench_staged_cost.setup_of(p)
    if p.get("videos"):  # clips of frames at the point's fps, through the family's video processor
        sample = Sample(videos=p["videos"], frames=p["frames"], height=p["height"], width=p["width"],
                        text_tokens=p["text_tokens"], fps=p["fps"])  # fmt: skip
    else:
        sample = Sample(images=p["images"], height=p["height"], width=p["width"], text_tokens=p["text_tokens"])
    model = StagedCostModel(staged_from_config(cfg, p["arch"]), setup, config=cfg)
    # a 1-step point is the first step; a 2-step point's peak is the second's (NOTE [ Steady state ])
    est = model.memory(p["batch"], sample, first_step=p.get("steps", 1) == 1)
    assert est.seq_len == p["seq_len"]  # the image (clip) -> LLM token mapping agrees with the processor's
    if p.get("videos"):  # the clips were priced as clips, on the grid the generator fed the model
        assert model.clips(sample) and model.sample_vision(sample).llm_tokens == p["video_tokens"]
    return est.peak_bytes


@pytest.mark.skipif(not FIXTURE.exists(), reason=f"no truth fixture at {FIXTURE} (benchmarks/hf_truth.py makes it)")
@pytest.mark.parametrize("point", POINTS, ids=["/".join(map(str, _key(p))) for p in POINTS])
def test_staged_cost_truth_point_within_band(point: dict[str, Any]) -> None:
    err = 100.0 * (_predict(point) - point["peak_bytes"]) / point["peak_bytes"]
    miss = KNOWN_MISSES.get(_key(point))
    if miss is not None:
        assert err == pytest.approx(miss[0], abs=0.5), f"known miss moved: {err:+.1f} % ({miss[1]})"
        return
    assert BAND[0] <= err <= BAND[1], f"{_key(point)}: predicted {err:+.2f} % off the measured peak"


def test_staged_cost_truth_covers_every_setup() -> None:
    if not POINTS:
        pytest.skip(f"no truth fixture at {FIXTURE}")
    setups = {(p["train"], p["sharding"]) for p in POINTS}
    assert {("full", "none"), ("lora", "none"), ("full", "fsdp8")} <= setups
    steady = {(p["arch"], p["train"], p["sharding"]) for p in POINTS if p.get("steps", 1) == 2}
    assert {p["arch"] for p in POINTS} <= {a for a, _, _ in steady}  # every architecture has steady-state points


def test_staged_cost_steady_state_carries_the_optimizer_states() -> None:
    """NOTE [ Steady state ]: a later step holds the AdamW states through backward, the first does not."""
    cm = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), TrainSetup(optimizer="adamw"))
    sample = Sample(images=4, height=448, width=448, text_tokens=1024)
    first, later = cm.memory(4, sample, first_step=True), cm.memory(4, sample)
    assert first.phase == later.phase == "backward"
    assert first.item("optimizer") == 0
    assert (
        later.peak_bytes - first.peak_bytes
        == later.item("optimizer")
        == 2 * 2 * StagedModel.preset("qwen2-vl-2b").params
    )
    sgd = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), TrainSetup(optimizer="sgd")).memory(4, sample)
    assert sgd.item("optimizer") == later.item("optimizer") // 2 and sgd.peak_bytes < later.peak_bytes


# -- setup and sample validation -----------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"train": "half"}, "train should be one of ['full', 'frozen-vision', 'lora'], but got train='half'"),
        ({"lora_rank": 0}, "lora_rank should be a positive integer, but got lora_rank=0"),
        ({"sharding": "zero1"}, "sharding should be one of"),
        ({"world_size": 0, "sharding": "fsdp"}, "world_size should be a positive integer, but got world_size=0"),
        ({"world_size": 8}, "world_size should be 1 when sharding='none', but got world_size=8"),
        ({"optimizer": "adam"}, "optimizer should be one of ['adamw', 'sgd', 'none'], but got optimizer='adam'"),
        ({"vision_checkpointing": "some"}, "vision_checkpointing should be one of ['none', 'full']"),
        ({"backbone_checkpointing": True}, "backbone_checkpointing should be one of ['none', 'full']"),
    ],
)
def test_train_setup_bad_field_raises_naming_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        TrainSetup(**kwargs)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"images": -1, "text_tokens": 3}, "images should be an integer >= 0, but got images=-1"),
        ({"images": 1, "height": 0, "width": 4}, "height should be a positive integer, but got height=0"),
        ({"images": 0, "text_tokens": 0}, "at least one image, video or text token"),
        ({"text_tokens": 2.5}, "text_tokens should be an integer >= 0, but got text_tokens=2.5"),
    ],
)
def test_sample_bad_field_raises_naming_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Sample(**kwargs)
    assert message in str(info.value)


def test_sample_video_is_one_clip_per_camera_and_stills_one_image_per_frame() -> None:
    clip = Sample.video(cameras=3, frames=4, height=224, width=224, text_tokens=8)
    assert (clip.videos, clip.frames, clip.images) == (3, 4, 0)
    assert repr(clip) == "Sample(images=0, height=224, width=224, text_tokens=8, videos=3, frames=4)"
    assert Sample.stills(cameras=3, frames=4, height=224, width=224, text_tokens=8).images == 12
    with pytest.raises(ConfigError, match="frames should be a positive integer, but got frames=0"):
        Sample.video(cameras=1, frames=0, height=224, width=224)
    with pytest.raises(ConfigError, match="images or videos, not both"):
        Sample(images=1, videos=1, frames=2, height=224, width=224)
    with pytest.raises(ConfigError, match="frames counts the frames of each video"):
        Sample(frames=2, height=224, width=224, text_tokens=1)
    with pytest.raises(ConfigError, match="fps should be a positive number"):
        Sample.video(cameras=1, frames=2, height=224, width=224, fps=0)


def test_staged_cost_prices_a_clip_on_its_temporal_patches_and_stills_per_frame() -> None:
    """Qwen2-VL: a 16-frame clip is 8 tower passes and half the LLM tokens of its 16 frames as
    images; a one-frame clip is an image; a family without a video path prices frames as images."""
    cost = StagedCostModel(StagedModel.preset("qwen2-vl-2b"))
    clip = Sample.video(cameras=2, frames=16, height=448, width=448, text_tokens=64)
    stills = Sample.stills(cameras=2, frames=16, height=448, width=448, text_tokens=64)
    vc, vs = cost.sample_vision(clip), cost.sample_vision(stills)
    assert (vc.tower_images, vc.patches_per_image, vc.llm_tokens) == (16, 1024, 4096)
    assert (vs.tower_images, vs.patches_per_image, vs.llm_tokens) == (32, 1024, 8192)
    assert cost.memory(1, clip).seq_len == 4096 + 64
    assert cost.memory(2, clip).peak_bytes < cost.memory(2, stills).peak_bytes
    one = Sample.video(cameras=2, frames=1, height=448, width=448, text_tokens=64)
    assert not cost.clips(one) and cost.sample_vision(one) == cost.sample_vision(
        Sample(images=2, height=448, width=448)
    )
    llava = StagedCostModel(StagedModel.preset("llava-1.5-7b"))
    assert not llava.clips(clip) and llava.memory(1, clip).seq_len == llava.memory(1, stills).seq_len


def test_staged_cost_model_bad_arguments_raise() -> None:
    model = StagedModel.preset("qwen2-vl-2b")
    with pytest.raises(ConfigError, match="model should be a StagedModel, but got str"):
        StagedCostModel("qwen2-vl-2b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch should be a positive integer, but got batch=0"):
        StagedCostModel(model).memory(0, Sample(text_tokens=4))
    with pytest.raises(ConfigError, match="does not describe model"):
        StagedCostModel(model, config=HFConfig("<llava>", {"model_type": "llava"}))


# -- the numbers move the right way --------------------------------------------------------

VLA = Sample(images=2, height=448, width=448, text_tokens=512)


def _peak(setup: TrainSetup, batch: int = 2, sample: Sample = VLA, name: str = "qwen2-vl-2b") -> int:
    return StagedCostModel(StagedModel.preset(name), setup).memory(batch, sample).peak_bytes


def test_staged_cost_items_add_up_to_the_peak() -> None:
    est = StagedCostModel(StagedModel.preset("llava-1.5-7b")).memory(
        2, Sample(images=1, height=336, width=336, text_tokens=64)
    )
    assert set(est.stages) == set(STAGES)
    assert all(set(v) == set(STAGE_ITEMS) for v in est.stages.values())
    assert sum(sum(v.values()) for v in est.stages.values()) == est.peak_bytes
    assert est.seq_len == 576 + 64 and est.phase == "optimizer"


def test_staged_cost_frozen_vision_and_lora_cost_less_than_full() -> None:
    full = _peak(TrainSetup())
    frozen = _peak(TrainSetup(train="frozen-vision"))
    lora = _peak(TrainSetup(train="lora"))
    assert full > frozen > lora
    cm = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), TrainSetup(train="frozen-vision"))
    est = cm.memory(2, VLA)
    assert est.stages["vision"]["gradients"] == est.stages["vision"]["optimizer"] == 0
    # a frozen tower keeps nothing for backward: at the backward peak only its output is live,
    # which the (trainable) merger keeps, one bf16 vector per patch
    patches = 2 * VLA.images * cm.vision_inputs(VLA).patches_per_image
    assert est.phase == "backward" and est.stages["vision"]["activations"] <= 2 * patches * 1280
    assert (
        StagedCostModel(StagedModel.preset("qwen2-vl-2b")).memory(2, VLA).stages["vision"]["activations"]
        > 50 * (est.stages["vision"]["activations"])
    )


def test_staged_cost_lora_keeps_activations_but_not_optimizer_state() -> None:
    setup = TrainSetup(train="lora", optimizer="none")
    big = Sample(text_tokens=8192)
    est = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), setup).memory(1, big)
    assert est.item("optimizer") == 0 and est.phase == "backward"
    assert est.stages["backbone"]["activations"] > 2**30  # the adapters still need the layers' inputs
    full = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), TrainSetup(optimizer="none")).memory(1, big)
    assert full.stages["backbone"]["activations"] > est.stages["backbone"]["activations"]


def test_staged_cost_sharding_divides_static_bytes() -> None:
    none = _peak(TrainSetup())
    fsdp = _peak(TrainSetup(sharding="fsdp", world_size=8))
    zero2 = _peak(TrainSetup(sharding="zero2", world_size=8))
    ddp = _peak(TrainSetup(sharding="ddp", world_size=8, ddp_bucket_view=True))
    assert fsdp < zero2 < ddp == none
    assert _peak(TrainSetup(sharding="fsdp", world_size=16)) < fsdp


@pytest.mark.parametrize("train", ["full", "frozen-vision", "lora"])
def test_staged_cost_ddp_buckets_hold_a_second_copy_of_the_trainable_gradients(train: str) -> None:
    """NOTE [ DDP buckets ]: the default gradient_as_bucket_view=False; True costs what no DDP does."""
    model = StagedModel.preset("qwen2-vl-2b")
    sample = Sample(images=2, height=448, width=448, text_tokens=512)

    def est(**kw: object) -> Any:
        return StagedCostModel(model, TrainSetup(train=train, **kw)).memory(2, sample)  # type: ignore[arg-type]

    none, ddp, view = est(), est(sharding="ddp", world_size=8), est(sharding="ddp", world_size=8, ddp_bucket_view=True)
    trainable = sum(u.trainable for u in StagedCostModel(model, TrainSetup(train=train)).units(2, sample))
    assert view.peak_bytes == none.peak_bytes
    assert ddp.peak_bytes - none.peak_bytes == 2 * trainable  # bf16, whatever phase the peak is in
    assert ddp.item("gradients") >= 2 * trainable


def test_staged_cost_ddp_bucket_view_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="ddp_bucket_view should be a bool, but got ddp_bucket_view='yes'"):
        TrainSetup(sharding="ddp", world_size=2, ddp_bucket_view="yes")  # type: ignore[arg-type]


def test_staged_cost_more_images_and_checkpointing_move_activations() -> None:
    setup = TrainSetup(optimizer="none")
    one = _peak(setup, sample=Sample(images=1, height=448, width=448, text_tokens=512))
    four = _peak(setup, sample=Sample(images=4, height=448, width=448, text_tokens=512))
    assert four > one
    ckpt = TrainSetup(optimizer="none", vision_checkpointing="full", backbone_checkpointing="full")
    assert _peak(ckpt, sample=Sample(images=4, height=448, width=448, text_tokens=512)) < four


def test_staged_cost_max_batch_consistent_with_memory() -> None:
    cm = StagedCostModel(StagedModel.preset("qwen2-vl-2b"), TrainSetup(train="lora"))
    budget = 40 * 2**30
    b = cm.max_batch(VLA, budget)
    assert b >= 1
    assert cm.memory(b, VLA).peak_bytes <= budget < cm.memory(b + 1, VLA).peak_bytes
    assert cm.max_batch(VLA, 2**20) == 0
    with pytest.raises(ConfigError, match="budget_bytes should be an integer >= 0"):
        cm.max_batch(VLA, -1)


# -- the image mapping ---------------------------------------------------------------------


def test_vision_inputs_follow_the_processor() -> None:
    qwen = HFConfig("<qwen>", {"model_type": "qwen2_vl"})
    assert vision_inputs(qwen, 448, 448) == VisionInputs(1, 1024, 256)
    llava = HFConfig("<llava>", {"model_type": "llava"})
    assert vision_inputs(llava, 480, 640) == VisionInputs(1, 577, 576)
    nxt = HFConfig("<next>", {"model_type": "llava_next"})
    assert vision_inputs(nxt, 672, 672).tower_images == 5  # 2x2 crops and the base image
    smol = HFConfig("<smol>", {"model_type": "smolvlm", "scale_factor": 4, "vision_config": {"image_size": 512, "patch_size": 16}},
                    PREPROCESSORS["smolvlm-256m"])  # fmt: skip
    assert vision_inputs(smol, 1024, 1024) == VisionInputs(5, 1024, 5 * 64)
    assert vision_inputs(HFConfig("<q>", {"model_type": "qwen2"}), 448, 448) == VisionInputs(0, 0, 0)


def test_staged_cost_presets_price_without_a_config() -> None:
    for name in ("llava-1.5-7b", "openvla", "paligemma-3b", "qwen2-vl-2b", "qwen2-vl-vla"):  # pi0: LeRobotPolicy
        model = StagedModel.preset(name)
        est = StagedCostModel(model, TrainSetup(train="lora")).memory(
            1, Sample(images=1, height=224, width=224, text_tokens=32)
        )
        assert est.peak_bytes > 2 * model.params  # at least the bf16 weights
        if model.action_expert is not None:
            assert est.stages["action_expert"]["weights"] > 0
    openvla = StagedCostModel(StagedModel.preset("openvla")).vision_inputs(Sample(images=1, height=224, width=224))
    assert openvla == VisionInputs(1, 261, 256)  # DINOv2's class and register tokens stay in the tower


def test_staged_cost_llava_unused_tower_block_keeps_saved_but_no_gradient() -> None:
    # NOTE [ Tower blocks past the feature layer ]: vision_feature_layer=-2 leaves CLIP's last
    # block without gradients, and what it saved (41,032 B per tower token) live into the optimizer step
    cfg = HFConfig("<next>", {"model_type": "llava_next", "text_config": {"model_type": "qwen2", "hidden_size": 896,
                   "intermediate_size": 4864, "num_hidden_layers": 2, "num_attention_heads": 14,
                   "num_key_value_heads": 2}})  # fmt: skip
    model = staged_from_config(cfg)
    cm = StagedCostModel(model, config=cfg)
    sample = Sample(images=1, height=336, width=336, text_tokens=16)
    est = cm.memory(1, sample, first_step=True)  # its peak is the first optimizer step
    tokens = cm.vision_inputs(sample).tower_images * 577
    assert est.phase == "optimizer" and est.stages["vision"]["activations"] == 41_032 * tokens
    assert est.item("gradients") == 2 * (model.params - model.vision[0].unused_params)
    frozen = StagedCostModel(model, TrainSetup(train="frozen-vision"), config=cfg).memory(1, sample, first_step=True)
    assert frozen.stages["vision"]["activations"] == 0  # a frozen tower saves nothing, used or not


@pytest.mark.skipif(not FIXTURE.exists(), reason=f"no truth fixture at {FIXTURE}")
@pytest.mark.parametrize("flag", ["--summary", "--by-step"])
def test_readme_truth_tables_are_what_the_benchmark_prints(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench_staged_cost.main([flag])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    page = (Path(__file__).resolve().parent.parent / "docs" / "cost-model.md").read_text().splitlines()
    assert printed and [line for line in printed if line not in page] == []  # the site's truth tables
