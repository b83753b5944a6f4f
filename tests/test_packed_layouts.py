"""PackedTowerCollate for the families whose pixels are not one square an entry of
``[images, C, side, side]``: those whose processor writes ``image_sizes`` beside ``pixel_values``
(LLaVA-OneVision, Mistral 3, LLaVA-NeXT; NOTE [ Packed sized-image rows ]) and Idefics3 /
SmolVLM's tiles ``[batch, images, C, side, side]`` beside a ``pixel_attention_mask`` (NOTE
[ Packed tiles by row ]), proven against tiny transformers models (random init, float32, no
download) fed by the families' own image processors: per sample, the packed row computes the
logits the sample alone computes; the images in another order, one causal mask over the row or
(OneVision) the images counted per row instead of per sample do not."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tokenbucket import ConfigError, CostModel, ModelSpec, breakdown_table
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.staged import Sample, StagedCostModel
from tokenbucket.cost.staged_length import StagedLengthModel
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.models import family
from tokenbucket.models.mistral3 import IMAGE_BREAK_ID, IMAGE_END_ID
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.packing_2d import plan_packing_2d
from tokenbucket.tokens.hf import HFConfig, token_spec_from_hf
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.packed_tower import PackedTowerCollate
from tokenbucket.train.packing_2d import PackedBatchSampler2D

transformers = pytest.importorskip("transformers")

IMAGE, VIDEO = 100, 103  # the tiny models' image and video placeholders (vocab 128)
TEXT = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "vocab_size": 128, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}  # fmt: skip
TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
PINS = [[28, 56], [56, 28], [56, 56], [28, 84], [84, 28]]  # any-resolution grids of 28-px tiles
# (images, height, width, text tokens): 0, 1 or 2 images of different sizes, text of different
# lengths; samples 1 and 4 hold images of one size, which the wrong-order check swaps
SAMPLES = [(1, 40, 70, 9), (2, 30, 50, 12), (0, 0, 0, 6), (1, 60, 44, 14), (2, 30, 50, 5), (1, 84, 30, 8)]
# rows of 3, 2 and 1 of the samples, next-fit
PACK = {"llava_onevision": 48, "mistral3": 48, "llava_next": 80, "idefics3": 90, "smolvlm": 90}
COST = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention="eager"))


def onevision() -> tuple[Any, Any, dict[str, Any]]:
    """A tiny LLaVA-OneVision: a 2-layer SigLIP over 28-px tiles (4 patches, 4 LLM tokens a tile),
    ``anyres_max_1`` (a lone image's unpadded grid past 1.1 tiles is scaled down), a 2-layer Qwen2."""
    config = transformers.LlavaOnevisionConfig(
        vision_config={"model_type": "siglip_vision_model", **TOWER, "image_size": 28, "patch_size": 14},
        text_config={"model_type": "qwen2", **TEXT}, image_token_id=IMAGE, video_token_id=VIDEO,
        image_grid_pinpoints=PINS, vision_aspect_ratio="anyres_max_1", vision_feature_layer=-1,
    )  # fmt: skip
    processor = transformers.LlavaOnevisionImageProcessorPil(
        size={"height": 28, "width": 28}, image_grid_pinpoints=PINS, do_convert_rgb=False
    )
    return config, processor, {}


def llava_next() -> tuple[Any, Any, dict[str, Any]]:
    """A tiny LLaVA-NeXT: a 2-layer CLIP over 28-px tiles (the class token dropped), every image
    tiled, a 2-layer Llama."""
    config = transformers.LlavaNextConfig(
        vision_config={"model_type": "clip_vision_model", **TOWER, "image_size": 28, "patch_size": 14,
                       "projection_dim": 32},
        text_config={"model_type": "llama", **TEXT}, image_token_id=IMAGE, image_grid_pinpoints=PINS,
    )  # fmt: skip
    processor = transformers.LlavaNextImageProcessorPil(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=PINS,
        do_convert_rgb=False,
    )  # fmt: skip
    return config, processor, {}


def mistral3() -> tuple[Any, Any, dict[str, Any]]:
    """A tiny Mistral 3: a 2-layer Pixtral of 14-px patches at each image's own size (sides
    rounded up to 28), the 2x2 merger, a 2-layer Mistral; each row of merged patches ends in
    [IMG_BREAK], the image in [IMG_END]."""
    config = transformers.Mistral3Config(
        vision_config={"model_type": "pixtral", **TOWER, "head_dim": 16, "image_size": 1024, "patch_size": 14},
        text_config={"model_type": "mistral", **TEXT, "head_dim": 8, "sliding_window": None},
        image_token_id=IMAGE, spatial_merge_size=2,
    )  # fmt: skip
    # PixtralProcessor asks its image processor for sides of patch x merge (NOTE [ Pixtral row breaks ])
    processor = transformers.PixtralImageProcessorPil(patch_size={"height": 28, "width": 28}, do_convert_rgb=False)
    return config, processor, {}


def idefics3(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """A tiny Idefics3 / SmolVLM: a 2-layer tower over 56-px tiles (16 patches, pixel shuffle 2: 4
    LLM tokens a tile), a 2-layer Llama; the processor scales an image's longest side to 112 and
    cuts 56-px tiles plus the global image."""
    cls = {"idefics3": "Idefics3", "smolvlm": "SmolVLM"}[name]
    config = getattr(transformers, f"{cls}Config")(
        vision_config={**TOWER, "image_size": 56, "patch_size": 14}, text_config={"model_type": "llama", **TEXT},
        image_token_id=IMAGE, scale_factor=2,
    )  # fmt: skip
    preprocessor = {"size": {"longest_edge": 112}, "max_image_size": {"longest_edge": 56}}
    processor = getattr(transformers, f"{cls}ImageProcessorPil")(**preprocessor, do_convert_rgb=False)
    return config, processor, preprocessor


FAMILIES = {"llava_onevision": onevision, "mistral3": mistral3, "llava_next": llava_next}
TILED = {"idefics3": functools.partial(idefics3, "idefics3"), "smolvlm": functools.partial(idefics3, "smolvlm")}
BUILD: dict[str, Callable[[], tuple[Any, Any, dict[str, Any]]]] = {**FAMILIES, **TILED}
MODELS = {
    "llava_onevision": "LlavaOnevisionForConditionalGeneration",
    "mistral3": "Mistral3ForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "idefics3": "Idefics3ForConditionalGeneration",
    "smolvlm": "SmolVLMForConditionalGeneration",
}


def metadata(samples: list[tuple[int, int, int, int]]) -> pa.Table:
    rows = [
        {"key": f"v{i}", "cameras": c, "frames": 1, "height": h or 56, "width": w or 56, "text_tokens": t}
        for i, (c, h, w, t) in enumerate(samples)
    ]
    return pa.Table.from_pylist(rows)


class ProcessedItems(Dataset[dict[str, Any]]):
    """Items as the family's processor writes them: the image processor's own ``pixel_values``,
    ``image_sizes`` (and ``batch_num_images``) or ``pixel_attention_mask`` for the sample's
    images, and ids of a prompt, each image's placeholders (Mistral 3's rows ending in
    [IMG_BREAK], the last in [IMG_END]; Idefics3's tiles without their text markers, which the
    model does not read) and an answer, labels on the answer."""

    def __init__(self, meta: pa.Table, hf: HFConfig, processor: Any) -> None:
        self.rows, self.hf, self.processor = meta.to_pylist(), hf, processor
        self.family = family(hf.model_type)
        self.layout = self.family.sized_layout(hf) if self.family.sized_pixels else None
        self.tower = None if self.family.sized_pixels else self.family.tower_image(hf)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        rng = torch.Generator().manual_seed(i)
        text = torch.randint(0, IMAGE, (row["text_tokens"],), generator=rng).tolist()
        prompt = 1 + i % 2
        n = row["cameras"]
        item: dict[str, Any] = {"uid": f"u{i}"}
        tokens = text[:prompt]
        if n:
            images = [torch.randint(0, 256, (3, row["height"], row["width"]), dtype=torch.uint8, generator=rng)
                      for _ in range(n)]  # fmt: skip
            item.update(self.processor([images], return_tensors="pt"))
            if self.tower is not None:  # every tile the tower's square
                tokens += [IMAGE] * (item["pixel_values"].shape[1] * self.tower.llm_tokens)
            for h, w in item.get("image_sizes", torch.zeros(0, 2)).tolist():
                assert self.layout is not None
                if self.layout.tiles:
                    tokens += [IMAGE] * self.family.sized_image(self.layout.rule, h, w, n).placeholders
                else:  # Pixtral: rows of merged patches, each ending in a break, the last in the end
                    side = self.layout.side
                    block = ([IMAGE] * (w // side) + [IMAGE_BREAK_ID]) * (h // side)
                    tokens += [*block[:-1], IMAGE_END_ID]
        ids = torch.tensor(tokens + text[prompt:])
        labels = ids.clone()
        labels[: len(tokens)] = -100
        item.update(input_ids=ids[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long), labels=labels[None])
        return item


class Tiny:
    """One family's tiny model, its processor's items planned packed at its PACK, and each sample's
    logits alone (SDPA)."""

    def __init__(self, name: str) -> None:
        self.config, processor, preprocessor = BUILD[name]()
        self.hf = HFConfig(f"<tiny {name}>", self.config.to_dict(), preprocessor)
        meta, spec = metadata(SAMPLES), token_spec_from_hf(self.hf)
        self.pack = PACK[name]
        plan = plan_buckets(breakdown_table(meta, spec).totals, COST, 2**19, mode="packed", pack_length=self.pack)
        self.data = TokenBucketDataset(ProcessedItems(meta, self.hf, processor), metadata=meta, spec=spec, plan=plan)
        torch.manual_seed(0)
        self.model = getattr(transformers, MODELS[name])(self.config).to(torch.float32).eval()
        self.model.set_attn_implementation("sdpa")
        self.alone = {}
        with torch.no_grad():
            for i in range(len(self.data)):
                item = self.data[i][1]
                self.alone[i] = self.model(**images_of(item), input_ids=item["input_ids"]).logits[0]


def images_of(batch: dict[str, Any]) -> dict[str, Any]:
    """The model's image inputs of an item or a packed batch."""
    return {
        k: batch[k] for k in ("pixel_values", "image_sizes", "batch_num_images", "pixel_attention_mask") if k in batch
    }


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny(request: pytest.FixtureRequest) -> Tiny:
    return Tiny(request.param)


@pytest.fixture(scope="module", params=list(TILED))
def tiled(request: pytest.FixtureRequest) -> Tiny:
    return Tiny(request.param)


@pytest.fixture(scope="module", params=[*FAMILIES, *TILED])
def anyone(request: pytest.FixtureRequest) -> Tiny:
    return Tiny(request.param)


def per_sample_worst(tiny: Tiny, batch: dict[str, Any], logits: torch.Tensor) -> list[float]:
    """|packed - alone| at worst, for each sample in row order."""
    worst = []
    for r, row in enumerate(batch["index"]):
        start = 0
        for i in row:
            n = tiny.alone[i].shape[0]
            worst.append(float((logits[r, start : start + n] - tiny.alone[i]).abs().max()))
            start += n
    return worst


def run(tiny: Tiny, batch: dict[str, Any], **changed: Any) -> torch.Tensor:
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
              "attention_mask": batch.get("attention_mask"), **images_of(batch), **changed}  # fmt: skip
    with torch.no_grad():
        logits: torch.Tensor = tiny.model(**inputs, use_cache=False).logits
    return logits


@pytest.mark.parametrize(
    ("attention", "mask_dtype"),
    [("sdpa", torch.bool), ("eager", torch.float32), ("sdpa", None)],
    ids=["sdpa-bool", "eager-additive", "sdpa-padding-free"],
)
def test_packed_layout_row_computes_what_each_sample_alone_computes(
    anyone: Tiny, attention: str, mask_dtype: torch.dtype | None
) -> None:
    tiny = anyone
    tiny.model.set_attn_implementation(attention)
    try:
        batch = PackedTowerCollate(tiny.data, tiny.pack, config=tiny.config, mask_dtype=mask_dtype)(
            [tiny.data[i] for i in range(len(tiny.data))]
        )
        sizes = [len(r) for r in batch["index"]]
        assert sizes == [3, 2, 1]  # rows of several samples
        if mask_dtype is None:  # flash-attn's input: the real tokens as one row, positions restarting per sample
            real = batch["segment_ids"] > 0
            flat = run(tiny, batch, input_ids=batch["input_ids"][real][None],
                       position_ids=batch["position_ids"][real][None])  # fmt: skip
            packed = torch.zeros(*real.shape, flat.shape[-1])
            packed[real] = flat[0]  # back to rows, so both forms are checked alike
        else:
            packed = run(tiny, batch)
    finally:
        tiny.model.set_attn_implementation("sdpa")
    worst = per_sample_worst(tiny, batch, packed)
    print(f"{tiny.config.model_type} {attention} mask_dtype={mask_dtype}: max abs logits {[f'{w:.1e}' for w in worst]}")
    assert max(worst) <= 1e-5, worst


def test_packed_layout_row_in_another_layout_computes_something_else(anyone: Tiny) -> None:
    # the check can fail: each of these breaks one rule of NOTE [ Packed sized-image rows ] or
    # NOTE [ Packed tiles by row ]
    tiny = anyone
    batch = PackedTowerCollate(tiny.data, tiny.pack, config=tiny.config)([tiny.data[i] for i in range(len(tiny.data))])
    rows = batch["image_rows"].tolist()
    segments = list(zip(rows, batch["image_segment_ids"].tolist(), strict=True))
    # where each entry lies in pixel_values (Idefics3: [rows, tiles a row, ...], each row's in turn)
    by_row = "pixel_attention_mask" in batch
    places = [(r, rows[:n].count(r)) if by_row else n for n, r in enumerate(rows)]
    sizes = batch["image_sizes"].tolist() if "image_sizes" in batch else [None] * len(rows)
    # two entries of one size from different samples (1 and 4), swapped: every shape still fits
    a, b = next((places[a], places[b]) for a in range(len(rows)) for b in range(a + 1, len(rows))
                if sizes[a] == sizes[b] and segments[a] != segments[b])  # fmt: skip
    swapped = batch["pixel_values"].clone()
    swapped[a], swapped[b] = batch["pixel_values"][b], batch["pixel_values"][a]
    worst = per_sample_worst(tiny, batch, run(tiny, batch, pixel_values=swapped))
    print(f"{tiny.config.model_type}: images swapped across samples, max abs logits per sample {worst}")
    assert max(worst) > 1e-2, worst
    # one causal mask over the row: a sample after another sees it
    P = tiny.pack
    causal = torch.ones(P, P, dtype=torch.bool).tril().expand(len(batch["index"]), 1, P, P)
    worst = per_sample_worst(tiny, batch, run(tiny, batch, attention_mask=causal))
    assert max(worst) > 1e-2, worst
    if "batch_num_images" in batch:  # OneVision's count per row, not per sample: a lone image untiled
        per_row = torch.bincount(batch["image_rows"], minlength=len(batch["index"]))
        # transformers' own check (ValueError), or, where that check is off (TRANSFORMERS_DISABLE_TORCH_CHECK,
        # or a process that traced before), the scatter of too few features into the placeholders
        with pytest.raises((ValueError, RuntimeError), match=r"image tokens do not match|source < number of ones"):
            run(tiny, batch, batch_num_images=per_row)


def test_packed_sized_row_lays_the_processors_batch_layout(tiny: Tiny) -> None:
    picked = [0, 2, 1]  # 1 image, none, 2 images of another size (OneVision: untiled)
    items = [tiny.data[i][1] for i in picked]
    batch = PackedTowerCollate(tiny.data, tiny.pack, 2, config=tiny.config, cost_model=COST)(
        [tiny.data[i] for i in picked]
    )
    assert batch["index"] == [picked, []] and "image_sizes" not in batch["uid"]
    sizes = [it["image_sizes"].tolist() if "image_sizes" in it else [] for it in items]
    assert batch["image_sizes"].tolist() == [hw for mine in sizes for hw in mine]
    counts = [len(mine) for mine in sizes]
    assert batch["image_segment_ids"].tolist() == [s for s, c in enumerate(counts, start=1) for _ in range(c)]
    assert batch["image_rows"].tolist() == [0] * sum(counts)
    pixels, layout = batch["pixel_values"], family(tiny.hf.model_type).sized_layout(tiny.hf)
    n = 0
    for it, mine_sizes in zip(items, sizes, strict=True):
        for k, (h, w) in enumerate(mine_sizes):
            mine = it["pixel_values"][k]
            if layout.tiles:  # the image's real tiles, zeros to the batch's most
                t = family(tiny.hf.model_type).sized_image(layout.rule, h, w, len(mine_sizes)).tiles
                assert torch.equal(pixels[n, :t], mine[:t]) and not pixels[n, t:].any()
            else:  # the image at the top left, zeros to the batch's largest
                assert torch.equal(pixels[n, :, :h, :w], mine[:, :h, :w])
                assert not pixels[n, :, h:].any() and not pixels[n, :, :, w:].any()
            n += 1
    assert n == pixels.shape[0]
    if layout.sample_counts:
        assert batch["batch_num_images"].tolist() == counts
    else:
        assert "batch_num_images" not in batch
    assert batch["info"].predicted_peak_bytes == int(COST.memory(2, tiny.pack).total)
    text = PackedTowerCollate(tiny.data, tiny.pack, 2, config=tiny.config)([tiny.data[2]])  # a row of text only
    assert not {"pixel_values", "image_sizes", "batch_num_images"} & set(text)


def test_packed_sized_items_that_disagree_are_one_line_config_errors(tiny: Tiny) -> None:
    collate = PackedTowerCollate(tiny.data, tiny.pack, config=tiny.config)
    i, item = tiny.data[1]
    layout = family(tiny.hf.model_type).sized_layout(tiny.hf)
    flat = item["pixel_values"].flatten(0, 1) if layout.tiles else item["pixel_values"][0]
    shape = r"\[images, tiles, 3, 28, 28\]" if layout.tiles else r"\[images, 3, H, W\]"
    n = len(item["image_sizes"])
    one_more = {**item, "image_sizes": torch.cat([item["image_sizes"], item["image_sizes"][:1]])}
    no_images = {k: v for k, v in item.items() if k not in ("pixel_values", "image_sizes")}
    video = {**item, "pixel_values_videos": torch.zeros(1, 2, 3, 28, 28)}
    for bad, message in (
        ({**item, "pixel_values": flat}, rf"its 'pixel_values' should be {shape}, but got a tensor of shape"),
        (one_more, rf"its 'image_sizes' should be \[images, 2\] integers, one \(height, width\) for each of the {n} "
                   rf"images of its 'pixel_values', but got a tensor of shape \({n + 1}, 2\)$"),
        (no_images, r"its 'input_ids' hold \d+ image placeholders \(image_token_id=100\), but its 'pixel_values' and "
                    r"'image_sizes' make 0 images of 0 placeholders in 0 tokens, and its metadata's cameras make \d+"),
        (video, r"its 'pixel_values_videos' hold clips; a packed row lays images only"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"^sample 1 \(key 'v1'\): {message}") as caught:
            collate([(i, bad)])
        assert "\n" not in str(caught.value)
    if layout.tiles:  # an image whose grid needs more tiles than its pixels hold (sample 0's lone image, tiled)
        j, lone = tiny.data[0]
        one_tile = {**lone, "pixel_values": lone["pixel_values"][:, :1]}
        with pytest.raises(
            ConfigError,
            match=r"^sample 0 \(key 'v0'\): .*image 0 of \d+x\d+ makes [2-9] tiles, but its 'pixel_values' hold 1 an",
        ):
            collate([(j, one_tile)])
    else:  # a size off the patch x merge grid
        off = {**item, "image_sizes": item["image_sizes"] - 1}
        with pytest.raises(ConfigError, match=r"should fit its 'pixel_values' of \d+x\d+ with sides multiples of 28"):
            collate([(i, off)])


def test_packed_tiles_row_lays_each_rows_tiles_then_zero_tiles_and_their_mask(tiled: Tiny) -> None:
    picked = [0, 2, 1, 3]  # 1 image, none, 2 images in row 0; 1 image in row 1
    items = [tiled.data[i][1] for i in picked]
    batch = PackedTowerCollate(tiled.data, tiled.pack, 3, config=tiled.config)([tiled.data[i] for i in picked])
    assert batch["index"][:2] == [picked[:3], picked[3:]] and batch["index"][2] == []
    tiles = [it["pixel_values"][0] if "pixel_values" in it else torch.zeros(0, 3, 56, 56) for it in items]
    mine = [torch.cat(tiles[:3]), tiles[3]]
    pixels, mask = batch["pixel_values"], batch["pixel_attention_mask"]
    assert pixels.shape == (3, len(mine[0]), 3, 56, 56) and mask.shape == (3, len(mine[0]), 56, 56)
    for r, own in enumerate([*mine, torch.zeros(0, 3, 56, 56)]):  # each row's tiles, then zero tiles
        assert torch.equal(pixels[r, : len(own)], own) and not pixels[r, len(own) :].any()
        assert mask[r, : len(own)].all() and not mask[r, len(own) :].any()
    counts = [len(t) for t in tiles]
    assert batch["image_rows"].tolist() == [0] * sum(counts[:3]) + [1] * counts[3]
    assert (
        batch["image_segment_ids"].tolist()
        == [s for s, c in enumerate(counts[:3], 1) for _ in range(c)] + [1] * counts[3]
    )
    # the model drops the zero tiles: per sample, what each computes alone
    worst = per_sample_worst(tiled, batch, run(tiled, batch))
    assert max(worst) <= 1e-5, worst
    text = PackedTowerCollate(tiled.data, tiled.pack, 2, config=tiled.config)([tiled.data[2]])  # a row of text only
    assert not {"pixel_values", "pixel_attention_mask"} & set(text)


def test_packed_tiles_item_that_disagrees_is_a_one_line_config_error(tiled: Tiny) -> None:
    collate = PackedTowerCollate(tiled.data, tiled.pack, config=tiled.config)
    i, item = tiled.data[1]
    masked = item["pixel_attention_mask"].clone()
    masked[0, 0, -1] = False  # a tile padded below: not the tower's square
    bigger = torch.zeros(1, item["pixel_values"].shape[1], 3, 84, 84)
    fewer = item["pixel_values"][:, 1:]
    for bad, message in (
        ({**item, "pixel_attention_mask": masked}, r"its 'pixel_attention_mask' masks pixels of its tiles; a packed "
                                                   r"row lays whole tiles of the tower's square"),
        ({**item, "pixel_values": bigger}, r"its 'pixel_values' should be \[images, 3, 56, 56\] \(the tower's square\), "
                                           r"but got a tensor of shape \(1, \d+, 3, 84, 84\)$"),
        ({**item, "pixel_values": fewer}, r"its 'input_ids' hold \d+ image placeholders \(image_token_id=100\), but "
                                          r"its 'pixel_values' hold \d+ images of 4 tokens"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"^sample 1 \(key 'v1'\): {message}") as caught:
            collate([(i, bad)])
        assert "\n" not in str(caught.value)


def test_packed_layout_through_the_packed_sampler_keeps_its_rows_and_caps(anyone: Tiny) -> None:
    # the collate's tower patches a sample (each image's own: its tiles, or its own size) are the
    # staged cost model's, so the two-cap sampler's rows pass the collate's caps as they are
    tiny = anyone
    rng = np.random.default_rng(0)
    rows = [(int(rng.integers(0, 3)), int(rng.choice((30, 44, 70))), int(rng.choice((30, 50, 84))),
             int(rng.integers(5, 20))) for _ in range(24)]  # fmt: skip
    meta = metadata(rows)
    cost = StagedPackedModel(StagedLengthModel(StagedCostModel(staged_from_config(tiny.hf), config=tiny.hf)))
    loads = cost.loads([Sample(images=c, height=h, width=w, text_tokens=t) for c, h, w, t in rows])
    plan = plan_packing_2d(loads, cost, 4 * 2**20, rows_per_batch=(2,), multiple=8, seed=3)
    processor = BUILD[tiny.hf.model_type]()[1]
    data = TokenBucketDataset(ProcessedItems(meta, tiny.hf, processor), metadata=meta,
                              spec=token_spec_from_hf(tiny.hf), plan=plan.bucket_plan(loads))  # fmt: skip
    assert (data.lengths == loads.llm_tokens).all()  # the items, the metadata and the cost model agree
    collate = PackedTowerCollate(data, plan.row_tokens, plan.rows_per_batch, config=tiny.config,
                                 row_patches=plan.row_patches, mask_dtype=None)  # fmt: skip
    want = [list(b) for b in PackedBatchSampler2D.from_dataset(data, plan, loads, cost)]
    seen = []
    sampler = PackedBatchSampler2D.from_dataset(data, plan, loads, cost)
    for batch, indices in zip(DataLoader(data, batch_sampler=sampler, collate_fn=collate), want, strict=True):
        index = batch["index"]
        assert [i for row in index for i in row] == [i for i in indices if i < len(data)]
        tokens = batch["segment_ids"].gt(0).sum(-1).tolist()
        assert tokens == [int(loads.llm_tokens[row].sum()) for row in index] and max(tokens) <= plan.row_tokens
        assert max(int(loads.patches[row].sum()) for row in index) <= plan.row_patches
        seen += [i for row in index for i in row]
    assert sorted(seen) == list(range(len(data)))

    # the collate counts a row's patches as the cost model does: one patch under them is refused, naming them
    def first_row(b: list[int]) -> int:  # NOTE [ Rows through the workers ]
        return int(getattr(b, "rows", (0,))[0])

    batch = next(b for b in PackedBatchSampler2D.from_dataset(data, plan, loads, cost) if first_row(b) > 1)
    first = [int(i) for i in batch[: first_row(batch)]]
    mine = int(loads.patches[first].sum())
    tight = PackedTowerCollate(data, plan.row_tokens, config=tiny.config, row_patches=mine - 1, mask_dtype=None)
    with pytest.raises(
        ConfigError, match=rf"^row 0 of the batch \(samples {re.escape(str(first))}\) holds {mine:,} patches, more"
    ):
        tight(data.__getitems__(batch))
