"""PackedTowerCollate for Gemma 3 and PaliGemma: rows under the family's own masks (NOTE [ Gemma 3
packed masks ], NOTE [ PaliGemma packed mask ]), proven against tiny transformers models (random
init, float32, no download): per sample, the packed row computes the logits the sample alone
computes with its ``token_type_ids``, and one causal block-diagonal mask does not."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tokenbucket import ConfigError, breakdown_table
from tokenbucket.models import family
from tokenbucket.models._base import PackedAttention
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.tokens.hf import HFConfig, token_spec_from_hf
from tokenbucket.train._packed_rows import dense_mask
from tokenbucket.train.batch import EmptyRow
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.packed_tower import PackedTowerCollate
from tokenbucket.train.packing import block_diagonal_mask

from .test_packed_tower import COST, END, IMAGE, START, TEXT, TOWER, TowerItems, metadata, summed_loss

transformers = pytest.importorskip("transformers")

# (cameras, height, width, text tokens): 16 LLM tokens an image; Gemma 3's text counts its
# <start_of_image> / <end_of_image> wrappers. Samples of 25, 40, 6 | 28, 5, 23 tokens: two rows
# of three at PACK, of 1, 2, 0 and 1, 0, 1 images.
SAMPLES = [(1, 56, 56, 9), (2, 56, 56, 8), (0, 0, 0, 6), (1, 56, 56, 12), (0, 0, 0, 5), (1, 56, 56, 7)]
PACK = 80
WINDOW = 6  # shorter than every sample with an image, and than an image's 16 tokens


def gemma3_config(window: int = WINDOW, **text: Any) -> Any:
    """A tiny Gemma 3: a 2-layer SigLIP at 56 px (16 patches, 16 LLM tokens an image), three text
    layers: sliding (``window`` tokens), full, sliding."""
    layers = ["sliding_attention", "full_attention", "sliding_attention"]
    return transformers.Gemma3Config(
        text_config={**TEXT, "head_dim": 8, "num_hidden_layers": 3, "sliding_window": window, "layer_types": layers,
                     **text},
        vision_config={**TOWER, "image_size": 56, "patch_size": 14}, mm_tokens_per_image=16,
        image_token_index=IMAGE, boi_token_index=START, eoi_token_index=END,
    )  # fmt: skip


def paligemma_config(**text: Any) -> Any:
    """A tiny PaliGemma: a 2-layer SigLIP at 56 px (16 LLM tokens an image), a 2-layer Gemma."""
    return transformers.PaliGemmaConfig(
        text_config={"model_type": "gemma", **TEXT, "head_dim": 8, **text}, image_token_index=IMAGE,
        vision_config={**TOWER, "image_size": 56, "patch_size": 14, "projection_dim": 32}, projection_dim=32,
    )  # fmt: skip


CONFIGS = {"gemma3": gemma3_config, "paligemma": paligemma_config}
MODELS = {"gemma3": "Gemma3ForConditionalGeneration", "paligemma": "PaliGemmaForConditionalGeneration"}


class GemmaItems(TowerItems):
    """The processor's ``token_type_ids`` beside the items: Gemma 3's 1 on the image tokens,
    PaliGemma's 0 on the prefix (prompt and images), 1 on the answer."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = super().__getitem__(i)
        if self.hf.model_type == "gemma3":
            item["token_type_ids"] = item["input_ids"].eq(IMAGE).long()
        else:
            item["token_type_ids"] = item["labels"].ne(-100).long()
        return item


class Tiny:
    """One family's tiny model, SAMPLES planned packed at PACK, and each sample's logits alone
    (SDPA, with its ``token_type_ids`` and the model's own positions)."""

    def __init__(self, name: str) -> None:
        self.config = CONFIGS[name]()
        self.hf = HFConfig(f"<tiny {name}>", self.config.to_dict())
        meta, spec = metadata(SAMPLES), token_spec_from_hf(self.hf)
        plan = plan_buckets(breakdown_table(meta, spec).totals, COST, 2**19, mode="packed", pack_length=PACK)
        items = GemmaItems(meta, self.hf, wrap=name == "gemma3")
        self.data = TokenBucketDataset(items, metadata=meta, spec=spec, plan=plan)
        torch.manual_seed(0)
        self.model = getattr(transformers, MODELS[name])(self.config).to(torch.float32).eval()
        self.model.set_attn_implementation("sdpa")
        self.alone = {}
        with torch.no_grad():
            for i in range(len(self.data)):
                it = self.data[i][1]
                self.alone[i] = self.model(input_ids=it["input_ids"], pixel_values=it.get("pixel_values"),
                                           token_type_ids=it["token_type_ids"]).logits[0]  # fmt: skip

    def worst(self, batch: dict[str, Any], logits: torch.Tensor) -> list[float]:
        """|packed - alone| at most, per sample in row order."""
        out = []
        for r, row in enumerate(batch["index"]):
            start = 0
            for i in row:
                n = self.alone[i].shape[0]
                out.append(float((logits[r, start : start + n] - self.alone[i]).abs().max()))
                start += n
        return out


@pytest.fixture(scope="module", params=["gemma3", "paligemma"])
def tiny(request: pytest.FixtureRequest) -> Tiny:
    return Tiny(request.param)


@pytest.mark.parametrize(
    ("attention", "mask_dtype"), [("sdpa", torch.bool), ("eager", torch.float32)], ids=["sdpa-bool", "eager-additive"]
)
def test_packed_gemma_row_computes_what_each_sample_alone_computes(
    tiny: Tiny, attention: str, mask_dtype: torch.dtype
) -> None:
    model = tiny.model
    batch = PackedTowerCollate(tiny.data, PACK, config=tiny.config, mask_dtype=mask_dtype)(
        [tiny.data[i] for i in range(len(tiny.data))]
    )
    sizes = [len(r) for r in batch["index"]]
    assert sizes == [3, 3]  # rows of several samples, of different image counts
    mask = batch["attention_mask"]
    R = len(sizes)
    if tiny.config.model_type == "gemma3":  # one mask a layer type, each [R, 1, P, P]
        assert set(mask) == {"full_attention", "sliding_attention"}
        assert all(m.shape == (R, 1, PACK, PACK) and m.dtype == mask_dtype for m in mask.values())
    else:  # one 4-D mask, positions from 1
        assert mask.shape == (R, 1, PACK, PACK) and mask.dtype == mask_dtype
        assert batch["position_ids"][0, :3].tolist() == [1, 2, 3]

    def run(attention_mask: Any) -> torch.Tensor:
        logits: torch.Tensor = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"],
                     position_ids=batch["position_ids"], attention_mask=attention_mask, use_cache=False).logits  # fmt: skip
        return logits

    model.set_attn_implementation(attention)
    try:
        with torch.no_grad():
            packed = run(mask)
            # the checks can fail: one causal block-diagonal mask (NOTE [ Packed VLM rows ]), and
            # for Gemma 3 its masks without the window, compute something else
            leaky = run(dense_mask(batch["segment_ids"], mask_dtype))
            full = mask["full_attention"] if isinstance(mask, dict) else None
            unwindowed = run({"full_attention": full, "sliding_attention": full}) if full is not None else None
    finally:
        model.set_attn_implementation("sdpa")
    worst = tiny.worst(batch, packed)
    alone_loss = sum(summed_loss(tiny.alone[i], tiny.data[i][1]["labels"][0]) for i in range(len(tiny.data)))
    loss = float((summed_loss(packed, batch["labels"]) - alone_loss).abs())
    wrong = tiny.worst(batch, leaky)
    print(
        f"{tiny.config.model_type} {attention}: max abs logits {max(worst):.2e}, loss {loss:.2e}; one causal mask {wrong}"
    )
    assert max(worst) <= 1e-5 and loss <= 1e-4, (worst, loss)
    imaged = [i for row in batch["index"] for i in row if "pixel_values" in tiny.data[i][1]]
    # every sample with an image (the first of a row too: it is the mask, not the neighbour)
    order = [i for row in batch["index"] for i in row]
    assert min(wrong[order.index(i)] for i in imaged) > 1e-2, wrong
    if unwindowed is not None:
        assert min(tiny.worst(batch, unwindowed)[order.index(i)] for i in imaged) > 1e-2


def alone_masks(tiny: Tiny, token_type_ids: torch.Tensor, first: int) -> dict[str, torch.Tensor]:
    """The masks transformers builds for one sample alone from its ``token_type_ids`` ``[1, n]``
    (SDPA, bool ``[n, n]``), keyed as the collate's (PaliGemma's one mask: ``"all"``)."""
    from transformers import masking_utils
    from transformers.models.gemma3 import modeling_gemma3

    n = token_type_ids.shape[1]
    kwargs = {"config": tiny.model.config.get_text_config(), "inputs_embeds": torch.zeros(1, n, 32),
              "attention_mask": None, "cache": None, "position_ids": torch.arange(first, first + n)[None]}  # fmt: skip
    if tiny.config.model_type == "gemma3":
        blocks = modeling_gemma3.get_block_sequence_ids_for_mask(token_type_ids)
        theirs = modeling_gemma3.create_masks_for_vision_model(**kwargs, block_sequence_ids=blocks)
    else:
        prefix = torch.where(token_type_ids == 0, 0, -1)
        theirs = {"all": masking_utils.create_causal_mask(**kwargs, block_sequence_ids=prefix)}
    return {layer: m[0, 0] for layer, m in theirs.items()}


def packed_attention(tiny: Tiny) -> PackedAttention:
    attention = family(tiny.config.model_type).packed_attention(tiny.model.config.get_text_config())
    assert attention is not None
    return attention


def check_block_diagonal(
    tiny: Tiny, masks: dict[str, torch.Tensor], segment_ids: torch.Tensor, types: torch.Tensor
) -> None:
    """Each sample's block of the rows' ``masks`` is transformers' own mask for it alone; nothing
    across samples; a padding token sees itself only."""
    first = packed_attention(tiny).first_position
    for r in range(segment_ids.shape[0]):
        for seg in sorted(set(segment_ids[r].tolist())):
            mine = segment_ids[r] == seg
            theirs = alone_masks(tiny, types[r, mine][None], first) if seg else None
            assert theirs is None or theirs.keys() == masks.keys()
            for layer, m in masks.items():
                rows = m[r, 0, mine]
                want = theirs[layer] if theirs is not None else torch.eye(int(mine.sum()), dtype=torch.bool)
                assert torch.equal(rows[:, mine], want), (layer, r, seg)
                assert not rows[:, ~mine].any(), (layer, r, seg)


def test_packed_gemma_masks_are_transformers_own_on_the_block_diagonal(tiny: Tiny) -> None:
    batch = PackedTowerCollate(tiny.data, PACK, config=tiny.config)([tiny.data[i] for i in range(len(tiny.data))])
    mask = batch["attention_mask"]
    masks = mask if isinstance(mask, dict) else {"all": mask}
    check_block_diagonal(tiny, masks, batch["segment_ids"], batch["token_type_ids"])
    if tiny.config.model_type == "gemma3":  # the window binds: some pair the full mask allows, the sliding one not
        assert int((masks["full_attention"] & ~masks["sliding_attention"]).sum()) > 0
    # a sample ending on image tokens (Gemma 3) or its prefix (PaliGemma) beside one starting on
    # them: the blocks stop where a sample does (transformers' alone cannot see it; a row can)
    segments = torch.tensor([[1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 0]])
    types = torch.tensor([[0, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0]])
    if tiny.config.model_type == "paligemma":
        types = 1 - types
        types[segments == 0] = 0
    built = packed_attention(tiny).masks(block_diagonal_mask(segments, causal=True), segments, types)
    check_block_diagonal(tiny, built if isinstance(built, dict) else {"all": built}, segments, types)


def test_packed_gemma_options_its_masks_cannot_follow_are_one_line_config_errors(tiny: Tiny) -> None:
    with pytest.raises(ConfigError, match=r"its packed rows attend under the family's own masks, which cu_seqlens "
                                          r"cannot say .* pass mask_dtype=torch.bool") as caught:  # fmt: skip
        PackedTowerCollate(tiny.data, PACK, config=tiny.config, mask_dtype=None)
    assert "\n" not in str(caught.value)
    if tiny.config.model_type == "gemma3":
        # the masks apply the window: one shorter than the row is no refusal; EmbeddingGemma's switch is
        assert PackedTowerCollate(tiny.data, PACK, config=tiny.config).attention is not None
        with pytest.raises(ConfigError, match=r"sets use_bidirectional_attention, whose masks a packed row"):
            PackedTowerCollate(tiny.data, PACK, config=gemma3_config(use_bidirectional_attention=True))
    else:  # a Gemma 2 text (PaliGemma 2): the one 4-D mask stands for its sliding layers too
        windowed = paligemma_config(model_type="gemma2", sliding_window=PACK - 1)
        with pytest.raises(ConfigError, match=rf"sliding window of {PACK - 1} tokens, shorter than pack_length={PACK}"):
            PackedTowerCollate(tiny.data, PACK, config=windowed)
        assert PackedTowerCollate(tiny.data, PACK, config=paligemma_config(model_type="gemma2", sliding_window=PACK))
    assert family(tiny.config.model_type).unpacked_reason is None


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_gemma_padding_batch_and_text_row_run_through_the_model(tiny: Tiny, workers: int) -> None:
    # a rank's padding batch (one empty row) and a row of text only, through a DataLoader: the
    # masks (Gemma 3's dict too) reach the model, which computes the text sample's own logits
    for picked in ([], [2]):
        items = [tiny.data[i] for i in picked] or [(len(tiny.data), EmptyRow(0))]
        collate = PackedTowerCollate(tiny.data, PACK, 2, config=tiny.config)
        one: list[Any] = [items]  # one batch, handed whole to the collate (no auto-batching)
        (batch,) = DataLoader(cast("Dataset[Any]", one), batch_size=None, collate_fn=collate, num_workers=workers)
        assert batch["index"] == [picked, []] and "pixel_values" not in batch
        assert isinstance(batch["attention_mask"], dict) == (tiny.config.model_type == "gemma3")
        with torch.no_grad():
            logits = tiny.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                                attention_mask=batch["attention_mask"], use_cache=False).logits  # fmt: skip
        assert torch.isfinite(logits).all()
        if picked:
            assert float((logits[0, : tiny.alone[2].shape[0]] - tiny.alone[2]).abs().max()) <= 1e-5
