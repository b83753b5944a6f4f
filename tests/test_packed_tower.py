"""PackedTowerCollate: fixed-tower VLM samples (LLaVA-1.5, InternVL) packed whole into rows,
proven against tiny transformers models (random init, float32, no download): per sample, the
packed row computes the logits the sample alone computes (NOTE [ Packed fixed-tower rows ]); the
families one mask cannot pack are refused in one line (NOTE [ Families a packed row refuses ])."""

from __future__ import annotations

import itertools
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
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.plan.packing_2d import plan_packing_2d
from tokenbucket.tokens.hf import HFConfig, token_spec_from_hf
from tokenbucket.train.batch import EmptyRow
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.packed_tower import PackedTowerCollate
from tokenbucket.train.packing_2d import PackedBatchSampler2D

transformers = pytest.importorskip("transformers")

IMAGE, START, END = 100, 101, 102  # the tiny models' image placeholder and InternVL's <img> / </img> (vocab 128)
TEXT = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "vocab_size": 128, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}  # fmt: skip
TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
# (cameras, height, width, text tokens): 0, 1 or 2 images of different shapes, text of different lengths
SAMPLES = [(1, 56, 112, 9), (2, 56, 56, 14), (0, 0, 0, 6), (1, 112, 112, 20), (1, 56, 56, 5), (2, 112, 56, 11)]
PACK = 64
COST = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention="eager"))


def llava_config(**text: Any) -> Any:
    """A tiny LLaVA-1.5: a 2-layer CLIP tower at 28 px (4 patches of 14 px: 4 LLM tokens an image,
    the class token dropped), the MLP projector, a 2-layer Llama with GQA."""
    tower = {"model_type": "clip_vision_model", **TOWER, "image_size": 28, "patch_size": 14, "projection_dim": 32}
    return transformers.LlavaConfig(
        vision_config=tower, text_config={"model_type": "llama", **TEXT, **text}, image_token_id=IMAGE
    )


def internvl_config() -> Any:
    """A tiny InternVL: a 2-layer InternViT over 56-px tiles (16 patches, pixel shuffle 0.5: 4 LLM
    tokens a tile; an image is its tiles and, past one, a thumbnail), a 2-layer Qwen2."""
    tower = {**TOWER, "image_size": [56, 56], "patch_size": [14, 14]}
    return transformers.InternVLConfig(
        vision_config=tower, text_config={"model_type": "qwen2", **TEXT}, image_token_id=IMAGE, downsample_ratio=0.5
    )


CONFIGS = {"llava": llava_config, "internvl": internvl_config}
MODELS = {"llava": "LlavaForConditionalGeneration", "internvl": "InternVLForConditionalGeneration"}


def metadata(samples: list[tuple[int, int, int, int]]) -> pa.Table:
    rows = [
        {"key": f"v{i}", "cameras": c, "frames": 1, "height": h or 56, "width": w or 56, "text_tokens": t}
        for i, (c, h, w, t) in enumerate(samples)
    ]
    return pa.Table.from_pylist(rows)


class TowerItems(Dataset[dict[str, Any]]):
    """Items as the family's processor writes them (``return_tensors="pt"``): a prompt, each image
    as its placeholders (InternVL's wrapped in <img> ... </img>, which the metadata counts as
    text), an answer; ``pixel_values`` ``[images, 3, side, side]`` (InternVL: each image's tiles),
    labels on the answer only."""

    def __init__(self, meta: pa.Table, hf: HFConfig, wrap: bool) -> None:
        self.rows, self.hf, self.wrap = meta.to_pylist(), hf, wrap
        self.tower = family(hf.model_type).tower_image(hf)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row, side = self.rows[i], self.tower.side
        rng = torch.Generator().manual_seed(i)
        text = torch.randint(0, IMAGE, (row["text_tokens"],), generator=rng).tolist()
        prompt = 1 + i % 2
        tokens, tiles = text[:prompt], 0
        for _ in range(row["cameras"]):
            n = family(self.hf.model_type).vision_inputs(self.hf, row["height"], row["width"]).tower_images
            block = [IMAGE] * (n * self.tower.llm_tokens)
            tokens += [START, *block, END] if self.wrap else block
            tiles += n
        answer = text[prompt + (2 * row["cameras"] if self.wrap else 0) :]
        ids = torch.tensor(tokens + answer)
        labels = ids.clone()
        labels[: ids.shape[0] - len(answer)] = -100
        item = {
            "input_ids": ids[None],
            "attention_mask": torch.ones(1, ids.shape[0], dtype=torch.long),
            "labels": labels[None],
            "uid": f"u{i}",
        }
        if tiles:
            item["pixel_values"] = torch.randn(tiles, 3, side, side, generator=rng)
        return item


def dataset(name: str) -> tuple[Any, HFConfig, TokenBucketDataset]:
    """A family's tiny config, as its config.json reads, and SAMPLES planned packed at PACK."""
    config = CONFIGS[name]()
    hf = HFConfig(f"<tiny {name}>", config.to_dict())
    meta, spec = metadata(SAMPLES), token_spec_from_hf(hf)
    plan = plan_buckets(breakdown_table(meta, spec).totals, COST, 2**19, mode="packed", pack_length=PACK)
    return config, hf, TokenBucketDataset(TowerItems(meta, hf, name == "internvl"), metadata=meta, spec=spec, plan=plan)


class Family_:
    """One family's tiny model, its dataset and each sample's logits alone (SDPA)."""

    def __init__(self, name: str) -> None:
        self.config, self.hf, self.data = dataset(name)
        self.tower = family(name).tower_image(self.hf)
        torch.manual_seed(0)
        self.model = getattr(transformers, MODELS[name])(self.config).to(torch.float32).eval()
        self.model.set_attn_implementation("sdpa")
        self.alone = {}
        with torch.no_grad():
            for i in range(len(self.data)):
                item = self.data[i][1]
                self.alone[i] = self.model(input_ids=item["input_ids"], pixel_values=item.get("pixel_values")).logits[0]


@pytest.fixture(scope="module", params=["llava", "internvl"])
def fam(request: pytest.FixtureRequest) -> Family_:
    return Family_(request.param)


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Hugging Face's causal loss, summed: the logits at t scored on labels[t + 1]."""
    return torch.nn.functional.cross_entropy(
        logits[..., :-1, :].reshape(-1, logits.shape[-1]), labels[..., 1:].reshape(-1), reduction="sum"
    )


def rows_of(batch: list[int]) -> tuple[int, ...]:
    """How many of a sampler batch's indices each row holds (NOTE [ Rows through the workers ])."""
    rows = getattr(batch, "rows", None)
    assert isinstance(rows, tuple) and sum(rows) == len(batch)
    return rows


def per_sample_worst(fam: Family_, batch: dict[str, Any], logits: torch.Tensor, skip_first: bool = False) -> float:
    """The largest |packed - alone| over every sample's logits (``skip_first``: the samples that
    have another before them in their row only)."""
    worst = 0.0
    for r, row in enumerate(batch["index"]):
        start = 0
        for s, i in enumerate(row):
            n = fam.alone[i].shape[0]
            if s or not skip_first:
                worst = max(worst, float((logits[r, start : start + n] - fam.alone[i]).abs().max()))
            start += n
    return worst


@pytest.mark.parametrize(
    ("attention", "mask_dtype"),
    [("sdpa", torch.bool), ("eager", torch.float32), ("sdpa", None)],
    ids=["sdpa-bool-mask", "eager-additive-mask", "sdpa-padding-free"],
)
def test_packed_tower_row_computes_what_each_sample_alone_computes(
    fam: Family_, attention: str, mask_dtype: torch.dtype | None
) -> None:
    model = fam.model
    model.set_attn_implementation(attention)
    try:
        batch = PackedTowerCollate(fam.data, PACK, config=fam.config, mask_dtype=mask_dtype)(
            [fam.data[i] for i in range(len(fam.data))]
        )
        ids, positions, labels = batch["input_ids"], batch["position_ids"], batch["labels"]
        sizes = [len(r) for r in batch["index"]]
        assert max(sizes) == 3 and sum(n > 1 for n in sizes) >= 2  # rows of several samples
        if mask_dtype is None:  # flash-attn's input: the real tokens as one row, positions restarting per sample
            assert "attention_mask" not in batch
            real = batch["segment_ids"] > 0
            ids, positions = ids[real][None], positions[real][None]
        with torch.no_grad():
            packed = model(input_ids=ids, pixel_values=batch["pixel_values"], position_ids=positions,
                           attention_mask=batch.get("attention_mask"), use_cache=False).logits  # fmt: skip
            if (
                mask_dtype == torch.bool
            ):  # the check can fail: under one causal mask over the row the samples see each other
                causal = torch.ones(PACK, PACK, dtype=torch.bool).tril().expand(len(batch["index"]), 1, PACK, PACK)
                leaky = model(input_ids=ids, pixel_values=batch["pixel_values"], position_ids=positions,
                              attention_mask=causal, use_cache=False).logits  # fmt: skip
    finally:
        model.set_attn_implementation("sdpa")
    if mask_dtype is None:  # back to rows, so both forms are checked alike
        rows = torch.zeros(*batch["input_ids"].shape, packed.shape[-1])
        rows[real] = packed[0]
        packed = rows
    worst = per_sample_worst(fam, batch, packed)
    # NOTE [ Labels in a packed row ]: the rows' loss is the sum of the samples' own losses
    alone_loss = sum(summed_loss(fam.alone[i], fam.data[i][1]["labels"][0]) for i in range(len(fam.data)))
    loss = float((summed_loss(packed, labels) - alone_loss).abs())
    print(f"{fam.config.model_type} {attention} mask_dtype={mask_dtype}: max abs logits {worst:.2e}, loss {loss:.2e}")
    assert worst <= 1e-5 and loss <= 1e-4, (worst, loss)
    if mask_dtype == torch.bool:
        assert per_sample_worst(fam, batch, leaky, skip_first=True) > 1e-2


def test_packed_tower_row_lays_ids_labels_positions_and_images_in_row_order(fam: Family_) -> None:
    picked = [1, 2, 4]  # 2, 0 and 1 images; 14, 6 and 5 text tokens
    items = [fam.data[i][1] for i in picked]
    lengths = [it["input_ids"].shape[1] for it in items]
    assert sum(lengths) <= PACK and len(set(lengths)) == 3
    batch = PackedTowerCollate(fam.data, PACK, 2, config=fam.config, cost_model=COST)([fam.data[i] for i in picked])
    assert batch["index"] == [picked, []] and batch["info"].shape == (2, PACK)
    assert batch["info"].predicted_peak_bytes == int(COST.memory(2, PACK).total)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (2, PACK)
    assert batch["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()] and batch["max_seqlen"] == max(lengths)
    start = 0
    for s, (it, n) in enumerate(zip(items, lengths, strict=True), start=1):
        span = slice(start, start + n)
        assert torch.equal(batch["input_ids"][0, span], it["input_ids"][0])
        assert batch["labels"][0, start] == -100 and torch.equal(
            batch["labels"][0, start + 1 : start + n], it["labels"][0, 1:]
        )
        assert batch["segment_ids"][0, span].eq(s).all() and batch["position_ids"][0, span].tolist() == list(range(n))
        start += n
    assert batch["segment_ids"][0, start:].eq(0).all() and batch["labels"][0, start:].eq(-100).all()
    assert batch["segment_ids"][1].eq(0).all() and batch["input_ids"][1].eq(0).all()
    # the images: the samples' own, in row order, each with its row and segment
    pixels = [it["pixel_values"] for it in items if "pixel_values" in it]
    assert torch.equal(batch["pixel_values"], torch.cat(pixels))
    counts = [it["pixel_values"].shape[0] if "pixel_values" in it else 0 for it in items]
    assert batch["image_rows"].tolist() == [0] * sum(counts)
    assert batch["image_segment_ids"].tolist() == [s for s, c in enumerate(counts, start=1) for _ in range(c)]
    assert batch["uid"] == [f"u{i}" for i in picked]  # other keys: one entry a sample
    mask = batch["attention_mask"][0, 0]
    a, b = lengths[0], lengths[0] + lengths[1]
    assert torch.equal(mask[:a, :a], torch.ones(a, a, dtype=torch.bool).tril())
    assert not mask[a:b, :a].any() and torch.equal(mask[a:b, a:b], torch.ones(b - a, b - a, dtype=torch.bool).tril())


def test_packed_tower_padding_batch_runs_through_the_model_and_scores_nothing(fam: Family_) -> None:
    # a rank's padding batch (one empty row, NOTE [ Two-cap packing each epoch ]) and a row of text only
    for picked in ([], [2]):
        items = [fam.data[i] for i in picked] or [(len(fam.data), EmptyRow(0))]
        batch = PackedTowerCollate(fam.data, PACK, 2, config=fam.config)(items)
        assert batch["index"] == [picked, []] and "pixel_values" not in batch and not len(batch["image_rows"])
        assert batch["labels"].shape == (2, PACK) and int(batch["labels"].ne(-100).sum()) == (
            int(fam.data[2][1]["labels"].ne(-100).sum()) if picked else 0
        )
        with torch.no_grad():
            logits = fam.model(input_ids=batch["input_ids"], pixel_values=batch.get("pixel_values"),
                               position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]).logits  # fmt: skip
        if picked:
            assert float((logits[0, : fam.alone[2].shape[0]] - fam.alone[2]).abs().max()) <= 1e-5


def test_packed_tower_items_that_disagree_are_one_line_config_errors(fam: Family_) -> None:
    collate = PackedTowerCollate(fam.data, PACK, config=fam.config)
    i, item = fam.data[1]
    side = fam.tower.side
    no_images = {k: v for k, v in item.items() if k != "pixel_values"}
    wrong_square = {**item, "pixel_values": torch.zeros(2, 3, side + 14, side + 14)}
    text = item["input_ids"][item["input_ids"].ne(IMAGE)][None]
    short = {"input_ids": text, "pixel_values": item["pixel_values"]}
    for bad, message in (
        (no_images, r"^sample 1 \(key 'v1'\): its 'input_ids' hold \d+ image placeholders \(image_token_id=100\), but "
                    r"its 'pixel_values' hold 0 images"),
        (wrong_square, rf"^sample 1 \(key 'v1'\): its 'pixel_values' should be \[images, 3, {side}, {side}\] \(the "
                       rf"tower's square\), but got a tensor of shape \(2, 3, {side + 14}, {side + 14}\)$"),
        (short, r"^sample 1 \(key 'v1'\): its 'input_ids' hold \d+ tokens, but its metadata says total=\d+; a packed row"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=message) as caught:
            collate([(i, bad)])
        assert "\n" not in str(caught.value)
    longest = int(np.argmax(fam.data.lengths))
    n = int(fam.data.lengths[longest])
    with pytest.raises(
        ConfigError, match=rf"^sample {longest} \(key 'v{longest}'\) has {n} tokens, more than pack_length={n - 1}$"
    ):
        PackedTowerCollate(fam.data, n - 1, config=fam.config)([fam.data[i] for i in range(len(fam.data))])


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (lambda: transformers.Qwen2VLConfig(), r"PackedModalityCollate's \(rope_config=\)"),
        (lambda: transformers.Qwen3VLConfig(), r"PackedModalityCollate's \(rope_config=\)"),
        (lambda: transformers.LlamaConfig(), r"no vision tower: pack its text with PackedCollate"),
    ],
    ids=["qwen2_vl", "qwen3_vl", "llama"],
)  # fmt: skip
def test_packed_tower_family_one_mask_cannot_pack_is_refused_in_one_line(config: Any, reason: str) -> None:
    _, _, data = dataset("llava")
    cfg = config()
    with pytest.raises(ConfigError, match=rf"^model_type {cfg.model_type!r} cannot be packed by PackedTowerCollate: .*"
                                          rf"{reason}.*\(NOTE \[ Families a packed row refuses \]\)$") as caught:  # fmt: skip
        PackedTowerCollate(data, PACK, config=cfg)
    assert "\n" not in str(caught.value)


def test_packed_tower_sliding_window_shorter_than_a_row_is_refused() -> None:
    config, _, data = dataset("llava")
    windowed = llava_config(model_type="mistral", sliding_window=PACK - 1)
    with pytest.raises(ConfigError, match=rf"sliding window of {PACK - 1} tokens, shorter than pack_length={PACK}; a "
                                          r"packed row's 4-D mask replaces the window"):  # fmt: skip
        PackedTowerCollate(data, PACK, config=windowed)
    # a window as long as the row never binds in it, packed or alone
    assert PackedTowerCollate(data, PACK, config=llava_config(model_type="mistral", sliding_window=PACK)).tower
    with pytest.raises(ConfigError, match=r"^config should be the model's transformers config"):
        PackedTowerCollate(data, PACK, config={"model_type": "llava"})
    with pytest.raises(ConfigError, match=r"mask_dtype should be torch.bool, a float dtype or None"):
        PackedTowerCollate(data, PACK, config=config, mask_dtype=torch.int8)


# -- through the two-cap packed sampler (NOTE [ Rows through the workers ]) ---------------------


def sampler_setup(fam: Family_) -> tuple[TokenBucketDataset, Any, Any, Any]:
    """48 samples of 0 to 2 images and 3 .. 39 answer tokens, planned two-cap by the tiny model's own staged cost."""
    rng = np.random.default_rng(0)
    sides = (56, 112)
    rows = [(int(rng.integers(0, 3)), int(rng.choice(sides)), int(rng.choice(sides)), int(rng.integers(7, 40)))
            for _ in range(48)]  # fmt: skip
    meta = metadata(rows)
    cost = StagedPackedModel(StagedLengthModel(StagedCostModel(staged_from_config(fam.hf), config=fam.hf)))
    loads = cost.loads([Sample(images=c, height=h, width=w, text_tokens=t) for c, h, w, t in rows])
    plan = plan_packing_2d(loads, cost, 4 * 2**20, world_size=2, rows_per_batch=(2,), multiple=8, seed=3)
    data = TokenBucketDataset(TowerItems(meta, fam.hf, fam.config.model_type == "internvl"), metadata=meta,
                              spec=token_spec_from_hf(fam.hf), plan=plan.bucket_plan(loads))  # fmt: skip
    return data, plan, loads, cost


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_tower_through_the_packed_sampler_keeps_its_rows_and_caps(fam: Family_, workers: int) -> None:
    data, plan, loads, cost = sampler_setup(fam)
    assert (data.lengths == loads.llm_tokens).all()  # the items, the metadata and the cost model agree
    patches = fam.tower.patches
    seen, world = [], 2
    for rank in range(world):
        reference = PackedBatchSampler2D.from_dataset(data, plan, loads, cost, rank=rank, world_size=world)
        want = [[list(b[x:y]) for x, y in itertools.pairwise(np.cumsum([0, *rows_of(b)]).tolist())] for b in reference]
        sampler = PackedBatchSampler2D.from_dataset(data, plan, loads, cost, rank=rank, world_size=world)
        collate = PackedTowerCollate(data, plan.row_tokens, plan.rows_per_batch, config=fam.config,
                                     row_patches=plan.row_patches, mask_dtype=None, cost_model=cost)  # fmt: skip
        got = []
        for batch in DataLoader(data, batch_sampler=sampler, collate_fn=collate, num_workers=workers):
            index = batch["index"]
            assert len(index) == plan.rows_per_batch
            tokens = batch["segment_ids"].gt(0).sum(-1).tolist()
            mine = torch.bincount(batch["image_rows"], minlength=len(index)).mul(patches).tolist()
            assert tokens == [int(loads.llm_tokens[row].sum()) for row in index] and max(tokens) <= plan.row_tokens
            assert mine == [int(loads.patches[row].sum()) for row in index] and max(mine) <= plan.row_patches
            assert batch["info"].predicted_peak_bytes > 0
            got.append([row for row in index if row])
            seen += [i for row in index for i in row]
        assert got == [[row for row in rows if row != [len(data)]] for rows in want]  # the sampler's rows, kept
    assert sorted(seen) == list(range(len(data)))  # every sample once over the ranks


def test_packed_tower_row_over_a_cap_is_a_one_line_config_error(fam: Family_) -> None:
    data, plan, loads, cost = sampler_setup(fam)
    batch = next(b for b in PackedBatchSampler2D.from_dataset(data, plan, loads, cost) if rows_of(b)[0] > 1)
    fetched = data.__getitems__(batch)
    first = [int(i) for i in batch[: rows_of(batch)[0]]]
    mine = int(loads.patches[first].sum())
    collate = PackedTowerCollate(data, plan.row_tokens, config=fam.config, row_patches=mine - 1, mask_dtype=None)
    with pytest.raises(ConfigError) as caught:
        collate(fetched)
    assert str(caught.value) == (
        f"row 0 of the batch (samples {first}) holds {mine:,} patches, more than row_patches={mine - 1:,}: "
        f"the sampler's caps and the collate's disagree (pass the plan's row_tokens and row_patches)"
    )
