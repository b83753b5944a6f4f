"""PackedModalityCollate: Qwen2-VL-shaped samples packed whole into rows, proven against a tiny
transformers Qwen2-VL (random init, float32, no download): per sample, the packed row computes
what the sample alone computes, in the vision tower and in the LLM (NOTE [ Packed VLM rows ])."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.packed_modal import PackedModalityCollate
from tokenbucket.train.packing import PackedBatchSampler

transformers = pytest.importorskip("transformers")

IMAGE, VIDEO, START, END = 100, 101, 102, 103  # the tiny model's placeholder and marker ids (vocab 128)
SPEC = TokenSpec(
    patch=14, merge=2, tubelet=2, resize="max_pixels", min_pixels=56 * 56, max_pixels=28 * 28 * 64, special_per_camera=2
)
COST = CostModel(ModelSpec(hidden=16, layers=1, heads=2, precision="fp32", attention="eager"))
# (cameras, height, width, text tokens): image sizes and text lengths that differ sample to sample
SAMPLES = [(1, 56, 84, 5), (1, 112, 56, 12), (2, 84, 84, 7), (1, 56, 56, 3), (1, 84, 56, 20), (1, 56, 112, 9)]
PACK = 64


def vlm_meta() -> pa.Table:
    rows = [
        {"key": f"v{i}", "cameras": c, "frames": 1, "height": h, "width": w, "text_tokens": t}
        for i, (c, h, w, t) in enumerate(SAMPLES)
    ]
    return pa.Table.from_pylist(rows)


class QwenItems(Dataset[dict[str, Any]]):
    """Items as Qwen2VLProcessor writes them (``return_tensors="pt"``): a prompt, each image as
    <vision_start> <image_pad> x (h·w / 4) <vision_end>, an answer; the patches, the grid, the
    token types (text 0, image 1) and labels on the answer only."""

    def __init__(self, meta: pa.Table) -> None:
        self.rows = meta.to_pylist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        rng = torch.Generator().manual_seed(i)
        gh, gw = row["height"] // 14, row["width"] // 14
        text = torch.randint(0, IMAGE, (row["text_tokens"],), generator=rng)
        prompt = 1 + i % 2  # a text token or two before the images, the rest after them
        image = [START, *[IMAGE] * (gh * gw // 4), END]
        ids = torch.tensor([*text[:prompt].tolist(), *image * row["cameras"], *text[prompt:].tolist()])
        labels = ids.clone()
        labels[: ids.shape[0] - (row["text_tokens"] - prompt)] = -100
        return {
            "input_ids": ids[None],
            "attention_mask": torch.ones(1, ids.shape[0], dtype=torch.long),
            "mm_token_type_ids": ids.eq(IMAGE).int()[None],
            "labels": labels[None],
            "pixel_values": torch.randn(row["cameras"] * gh * gw, 3 * 2 * 14 * 14, generator=rng),
            "image_grid_thw": torch.tensor([[1, gh, gw]] * row["cameras"]),
            "uid": f"u{i}",
        }


@pytest.fixture(scope="module")
def data() -> TokenBucketDataset:
    meta = vlm_meta()
    lengths = breakdown_table(meta, SPEC).totals
    plan = plan_buckets(lengths, COST, 2**19, mode="packed", pack_length=PACK)
    return TokenBucketDataset(QwenItems(meta), metadata=meta, spec=SPEC, plan=plan)


@pytest.fixture(scope="module")
def model() -> Any:
    """A tiny Qwen2-VL: 2 vision blocks of width 32, a 2-layer backbone of width 32 with GQA and
    M-RoPE sections (1, 1, 2) over its head dim of 8."""
    config = transformers.Qwen2VLConfig(
        vision_config={"depth": 2, "embed_dim": 32, "num_heads": 2, "hidden_size": 32, "mlp_ratio": 2},
        text_config={
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 64, "vocab_size": 128, "bos_token_id": None, "eos_token_id": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
        },
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).to(torch.float32).eval()


@pytest.fixture(scope="module")
def alone(data: TokenBucketDataset, model: Any) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each sample run unpacked (SDPA), positions from the model's own get_rope_index: its logits
    and its images' embeddings from the vision tower."""
    model.set_attn_implementation("sdpa")
    out = {}
    with torch.no_grad():
        for i in range(len(data)):
            item = data[i][1]
            logits = model(
                input_ids=item["input_ids"],
                pixel_values=item["pixel_values"],
                image_grid_thw=item["image_grid_thw"],
                mm_token_type_ids=item["mm_token_type_ids"],
            ).logits[0]
            out[i] = logits, model.model.visual(item["pixel_values"], grid_thw=item["image_grid_thw"]).pooler_output
    return out


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Hugging Face's causal loss, summed: the logits at t scored on labels[t + 1]."""
    return torch.nn.functional.cross_entropy(
        logits[..., :-1, :].reshape(-1, logits.shape[-1]), labels[..., 1:].reshape(-1), reduction="sum"
    )


@pytest.mark.parametrize(
    ("attention", "mask_dtype"),
    [("sdpa", torch.bool), ("eager", torch.float32), ("sdpa", None)],
    ids=["sdpa-bool-mask", "eager-additive-mask", "sdpa-padding-free-4-row-positions"],
)
def test_packed_vlm_row_computes_what_each_sample_alone_computes(
    data: TokenBucketDataset,
    model: Any,
    alone: dict[int, tuple[torch.Tensor, torch.Tensor]],
    attention: str,
    mask_dtype: torch.dtype | None,
) -> None:
    model.set_attn_implementation(attention)
    collate = PackedModalityCollate(data, PACK, rope_config=model.config, mask_dtype=mask_dtype)
    batch = collate([data[i] for i in range(len(data))])
    ids, positions, labels = batch["input_ids"], batch["position_ids"], batch["labels"]
    if mask_dtype is None:  # flash-attn's input (NOTE [ Packed VLM rows ]): the real tokens as one
        # padding-free sequence, text positions as row 0 of 4; transformers cuts it where they restart
        assert "attention_mask" not in batch
        real = batch["segment_ids"] > 0
        ids, labels = ids[real][None], labels[real][None]
        positions = torch.cat([batch["text_position_ids"][None], positions])[:, real][:, None]
    with torch.no_grad():
        packed = model(
            input_ids=ids,
            pixel_values=batch["pixel_values"],
            image_grid_thw=batch["image_grid_thw"],
            position_ids=positions,
            attention_mask=batch.get("attention_mask"),
            use_cache=False,  # with a cache transformers does not look for packed positions
        ).logits
        tower = model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"]).pooler_output
    if mask_dtype is None:  # back to rows, so both forms are checked alike
        rows = torch.zeros(*batch["input_ids"].shape, packed.shape[-1])
        rows[real] = packed[0]
        packed, labels = rows, batch["labels"]
    assert len([r for r in batch["index"] if len(r) > 1]) >= 2  # rows of several samples
    worst = {"logits": 0.0, "tower": 0.0, "loss": 0.0}
    image, loss_alone = 0, torch.zeros(())
    for r, row in enumerate(batch["index"]):
        start = 0
        for i in row:
            item = data[i][1]
            n = item["input_ids"].shape[1]
            logits, embeds = alone[i]
            worst["logits"] = max(worst["logits"], float((packed[r, start : start + n] - logits).abs().max()))
            mine = tower[image : image + embeds.shape[0]]
            worst["tower"] = max(worst["tower"], float((mine - embeds).abs().max()))
            loss_alone = loss_alone + summed_loss(logits, item["labels"][0])
            image += embeds.shape[0]
            start += n
    assert image == tower.shape[0]  # every image of the batch, in row order
    if mask_dtype == torch.bool:  # the check can fail: without the mask the samples see each other
        with torch.no_grad():
            leaky = model(input_ids=ids, pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
                          position_ids=positions, use_cache=False).logits  # fmt: skip
        assert float((leaky - packed).abs().max()) > 1e-3
    # NOTE [ Labels in a packed row ]: the rows' loss is the sum of the samples' own losses
    worst["loss"] = float((summed_loss(packed, labels) - loss_alone).abs())
    print(f"{attention} mask_dtype={mask_dtype}: max abs difference {worst}")
    assert worst["logits"] <= 1e-5 and worst["tower"] <= 1e-5 and worst["loss"] <= 1e-4, worst


def test_packed_vlm_three_samples_of_different_sizes_share_one_row(data: TokenBucketDataset) -> None:
    picked = [0, 1, 3]  # 56x84, 112x56 and 56x56 images; 5, 12 and 3 text tokens
    items = [data[i][1] for i in picked]
    lengths = [it["input_ids"].shape[1] for it in items]
    assert sum(lengths) <= PACK and len(set(lengths)) == 3
    batch = PackedModalityCollate(data, PACK, rows_per_batch=2, cost_model=COST)([data[i] for i in picked])
    assert batch["index"] == [picked, []] and batch["info"].shape == (2, PACK)
    assert batch["info"].predicted_peak_bytes == int(COST.memory(2, PACK).total)  # priced at the rows' shape
    assert batch["input_ids"].shape == batch["labels"].shape == batch["segment_ids"].shape == (2, PACK)
    assert batch["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert batch["max_seqlen"] == max(lengths) and batch["cu_seqlens"].dtype == torch.int32
    start = 0
    for s, (it, n) in enumerate(zip(items, lengths, strict=True), start=1):
        span = slice(start, start + n)
        assert torch.equal(batch["input_ids"][0, span], it["input_ids"][0])
        assert torch.equal(batch["mm_token_type_ids"][0, span], it["mm_token_type_ids"][0])
        assert batch["segment_ids"][0, span].eq(s).all()
        assert batch["text_position_ids"][0, span].tolist() == list(range(n))
        start += n
    # padding: pad ids, segment 0, ignored labels, and an empty second row
    assert batch["segment_ids"][0, start:].eq(0).all() and batch["input_ids"][0, start:].eq(0).all()
    assert batch["labels"][0, start:].eq(-100).all() and batch["segment_ids"][1].eq(0).all()
    # the vision tower: every image's patches in row order, one segment each
    sizes = [int(it["image_grid_thw"].prod(-1).sum()) for it in items]
    assert torch.equal(batch["pixel_values"], torch.cat([it["pixel_values"] for it in items]))
    assert batch["image_grid_thw"].tolist() == [[1, 4, 6], [1, 8, 4], [1, 4, 4]]
    assert batch["image_cu_seqlens"].tolist() == [0, *np.cumsum(sizes).tolist()]
    assert batch["image_rows"].tolist() == [0, 0, 0] and batch["image_segment_ids"].tolist() == [1, 2, 3]
    assert batch["uid"] == [f"u{i}" for i in picked]  # other keys: one entry a sample
    # the mask: causal inside a sample, nothing across samples, padding attends to itself
    mask = batch["attention_mask"][0, 0]
    a, b = lengths[0], lengths[0] + lengths[1]
    assert mask.shape == (PACK, PACK) and mask.dtype == torch.bool
    assert torch.equal(mask[:a, :a], torch.ones(a, a, dtype=torch.bool).tril())
    assert not mask[a:b, :a].any() and not mask[:a, a:].any()
    assert torch.equal(mask[start:, start:], torch.eye(PACK - start, dtype=torch.bool))


def test_packed_vlm_labels_never_cross_a_boundary(data: TokenBucketDataset) -> None:
    batch = PackedModalityCollate(data, PACK)([data[i] for i in range(len(data))])
    seg, labels = batch["segment_ids"], batch["labels"]
    # every target (the label at t + 1 that the logits at t are scored on) is in t's own sample
    scored = labels[:, 1:].ne(-100)
    assert scored.any() and torch.equal(seg[:, :-1][scored], seg[:, 1:][scored])
    assert seg[:, 1:][scored].gt(0).all()
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    assert labels[starts & seg.gt(0)].eq(-100).all() and labels[seg.eq(0)].eq(-100).all()
    # elsewhere the items' own labels, untouched
    for r, row in enumerate(batch["index"]):
        start = 0
        for i in row:
            own = data[i][1]["labels"][0]
            assert torch.equal(labels[r, start + 1 : start + own.shape[0]], own[1:])
            start += own.shape[0]


def test_packed_vlm_position_ids_equal_get_rope_index_per_sample(data: TokenBucketDataset, model: Any) -> None:
    batch = PackedModalityCollate(data, PACK, rope_config=model.config)([data[i] for i in range(len(data))])
    positions = batch["position_ids"]
    assert positions.shape == (3, len(batch["index"]), PACK)
    checked = 0
    for r, row in enumerate(batch["index"]):
        start = 0
        for i in row:
            item = data[i][1]
            n = item["input_ids"].shape[1]
            own, _ = model.model.get_rope_index(
                item["input_ids"], item["mm_token_type_ids"], image_grid_thw=item["image_grid_thw"]
            )
            assert torch.equal(positions[:, r, start : start + n], own[:, 0])
            checked += 1
            start += n
        assert positions[:, r, start:].eq(0).all()  # padding
    assert checked == len(data)
    # the sample of two images: its second image's positions start after the first's
    two = next(r for r, row in enumerate(batch["index"]) if 2 in row)
    assert int(positions[0, two].max()) > 0


def test_packed_vlm_too_long_sample_is_a_one_line_config_error(data: TokenBucketDataset) -> None:
    longest = int(np.argmax(data.lengths))
    n = int(data.lengths[longest])
    with pytest.raises(ConfigError) as caught:
        PackedModalityCollate(data, n - 1)([data[i] for i in range(len(data))])
    message = str(caught.value)
    assert message == f"sample {longest} (key 'v{longest}') has {n} tokens, more than pack_length={n - 1}"


def test_packed_vlm_ids_without_the_image_placeholders_are_refused(data: TokenBucketDataset) -> None:
    i, item = data[1]
    text = item["input_ids"][item["input_ids"].ne(IMAGE) & item["input_ids"].ne(START) & item["input_ids"].ne(END)]
    short = {**item, "input_ids": text[None], "attention_mask": None, "labels": None, "mm_token_type_ids": None}
    with pytest.raises(ConfigError, match=r"^sample 1 \(key 'v1'\): its 'input_ids' hold 12 tokens, the text only"):
        PackedModalityCollate(data, PACK)([(i, short)])


@pytest.mark.parametrize("world_size", [1, 4])
def test_packed_vlm_through_the_packed_sampler_every_sample_once(data: TokenBucketDataset, world_size: int) -> None:
    seen, empty = [], 0
    for rank in range(world_size):
        sampler = PackedBatchSampler.from_dataset(data, seed=1, rank=rank, world_size=world_size)
        collate = PackedModalityCollate(data, PACK, sampler.rows_per_batch, mask_dtype=None)
        for batch in DataLoader(data, batch_sampler=sampler, collate_fn=collate):
            assert batch["input_ids"].shape == (sampler.rows_per_batch, PACK)
            assert int(batch["segment_ids"].gt(0).sum()) == int(batch["cu_seqlens"][-1])
            rows = batch["index"]
            seen += [i for row in rows for i in row]
            # a rank's padding batch (an empty row): no token, no image, the shapes kept
            if not any(rows):
                empty += 1
                assert batch["pixel_values"].shape == (0, 1176) and not batch["segment_ids"].any()
    assert sorted(seen) == list(range(len(data)))  # every sample once, over all ranks
    assert (empty > 0) == (world_size > 1)


def test_packed_vlm_options_are_checked(data: TokenBucketDataset) -> None:
    with pytest.raises(ConfigError, match=r"mask_dtype should be torch.bool, a float dtype or None"):
        PackedModalityCollate(data, PACK, mask_dtype=torch.int8)
    with pytest.raises(ConfigError, match=r"pack_length should be a positive integer, but got pack_length=0"):
        PackedModalityCollate(data, 0)
    with pytest.raises(ConfigError, match=r"rope_config should be the transformers config of one of"):
        PackedModalityCollate(data, PACK, rope_config=transformers.LlamaConfig())
