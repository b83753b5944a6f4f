"""ModalityCollate with video clips (NOTE [ Clips in the batch ]): Qwen2-VL / Qwen2.5-VL
processor-shaped clips under the spec ``token_spec_from_hf`` reads from a config, raw frames cut
into the video stream, LLaVA-OneVision's pooled frames, a 2D bucket's padded video stream, and
clips that disagree with their metadata refused in one line naming the sample and the key.

The items are built as ``Qwen2VLProcessor(videos=..., text=..., return_tensors="pt")`` returns
them, from the video processor's published grid rule (``grid``, below): transformers' own video
processor needs torchvision, so it runs only in a subprocess (the slow oracle test at the end)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import Dataset

from tests.test_modal_collate import COST, check_common, loader, mates
from tokenbucket import ConfigError, TokenSpec, breakdown_table
from tokenbucket.models import HFConfig
from tokenbucket.plan.bucket_plan import Bucket, BucketPlan
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.tokens.hf import token_spec_from_hf
from tokenbucket.tokens.spec import CountRule
from tokenbucket.train.collate import TokenBucketDataset
from tokenbucket.train.modal import ModalityCollate

ROOT = Path(__file__).resolve().parents[1]
PATCH, TEMPORAL, MERGE = 14, 2, 2
WIDTH = 3 * TEMPORAL * PATCH * PATCH  # 1176: a row of pixel_values_videos
MIN_PIXELS, MAX_PIXELS = 28 * 28 * 4, 28 * 28 * 16  # 4..16 merged patches a frame: small clips
VIDEO_KEYS = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END = 90, 91, 92, 93
HEAD, WRIST = "observation.images.head", "observation.images.wrist"


def qwen_config(model_type: str = "qwen2_vl") -> HFConfig:
    return HFConfig("<tiny>", {"model_type": model_type}, {}, dict(VIDEO_KEYS))


SPEC = token_spec_from_hf(qwen_config())


def resized(height: int, width: int) -> tuple[int, int]:
    """Qwen2-VL's smart_resize (its published rule): sides to multiples of 28, the area into
    ``[MIN_PIXELS, MAX_PIXELS]``."""
    f = PATCH * MERGE
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > MAX_PIXELS:
        beta = math.sqrt(height * width / MAX_PIXELS)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def grid(frames: int, height: int, width: int) -> tuple[int, int, int]:
    """``video_grid_thw`` of a clip: frames padded to a whole temporal patch, each pair merged."""
    h, w = resized(height, width)
    return -(-frames // TEMPORAL), h // PATCH, w // PATCH


def video_meta(n: int, seed: int = 0, stills: bool = False) -> pa.Table:
    """1-2 cameras (a head camera, with or without a wrist one) x 2-7 frames at small, varied sizes;
    ``stills``: the wrist camera holds one frame (an image either way)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        cams = []
        for name in (HEAD, WRIST)[: int(rng.integers(1, 3)) if not stills else 2]:
            frames = 1 if stills and name == WRIST else int(rng.integers(2, 8))
            h, w = (int(x) for x in rng.integers(30, 130, 2))
            cams.append({"name": name, "frames": frames, "height": h, "width": w})
        rows.append({"key": f"v{i}", "cameras": cams, "text_tokens": 0, "prompt": int(rng.integers(2, 12))})
    table = pa.Table.from_pylist(rows)
    # the text: the prompt plus a <|vision_start|> and <|vision_end|> around each camera
    text = [r["prompt"] + 2 * len(r["cameras"]) for r in rows]
    return table.set_column(table.schema.get_field_index("text_tokens"), "text_tokens", pa.array(text))


class QwenVideos(Dataset[dict[str, Any]]):
    """Items as Qwen2-VL's processor returns them for a chat turn over each sample's clips
    (``return_tensors="pt"``): ``pixel_values_videos`` ``[Σ t·h·w, 1176]``, ``video_grid_thw``
    ``[videos, 3]`` (Qwen2.5-VL: ``second_per_grid_ts`` ``[videos]``), ``input_ids`` with
    ``t·h·w / 4`` ``<|video_pad|>`` a clip between ``<|vision_start|>`` / ``<|vision_end|>``,
    ``mm_token_type_ids`` (2 on video tokens) and ``attention_mask``, all ``[1, L]``. A one-frame
    camera is an image (``pixel_values`` / ``image_grid_thw``, ``<|image_pad|>``)."""

    def __init__(self, meta: pa.Table, seconds: bool = False, lie: dict[int, str] | None = None) -> None:
        self.rows, self.seconds, self.lie = meta.to_pylist(), seconds, lie or {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row, lie = self.rows[i], self.lie.get(i)
        ids: list[int] = []
        types: list[int] = []
        streams: dict[str, tuple[list[torch.Tensor], list[tuple[int, int, int]]]] = {
            "image": ([], []),
            "video": ([], []),
        }
        for c, cam in enumerate(row["cameras"]):
            still = cam["frames"] == 1
            t, gh, gw = (
                (1, *grid(2, cam["height"], cam["width"])[1:])
                if still
                else grid(cam["frames"], cam["height"], cam["width"])
            )
            if lie == "grid" and not still:
                gw += MERGE  # the processor's grid and the metadata disagree
            pixels, grids = streams["image" if still else "video"]
            pixels.append(torch.full((t * gh * gw, WIDTH), i + c / 10))
            grids.append((t, gh, gw))
            tokens = t * gh * gw // MERGE**2
            ids += [VISION_START, *[IMAGE_PAD if still else VIDEO_PAD] * tokens, VISION_END]
            types += [0, *[1 if still else 2] * tokens, 0]
        if lie == "placeholder":
            ids[ids.index(VIDEO_PAD)] = 5  # one placeholder short, the length unchanged
        ids += list(range(10, 10 + row["prompt"]))
        types += [0] * row["prompt"]
        item: dict[str, Any] = {
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "mm_token_type_ids": torch.tensor([types]),
            "uid": f"u{i}",
        }
        for name, (pixels_key, grid_key) in {
            "image": ("pixel_values", "image_grid_thw"),
            "video": ("pixel_values_videos", "video_grid_thw"),
        }.items():
            pixels, grids = streams[name]
            if pixels:
                item[pixels_key], item[grid_key] = torch.cat(pixels), torch.tensor(grids)
        if self.seconds and streams["video"][0]:
            n = len(streams["video"][1])
            item["second_per_grid_ts"] = torch.tensor([1.0] * (n + (lie == "seconds")))
        return item


def plan_for(meta: pa.Table, spec: TokenSpec, mode: str = "static") -> BucketPlan:
    """A real plan of 2 buckets over the metadata's breakdowns (of 2-12 rows: several rows a batch)."""
    lengths = breakdown_table(meta, spec).totals
    return plan_buckets(lengths, COST, 2**21, max_buckets=2, multiple=8, mode=mode)  # type: ignore[arg-type]


def qwen_setup(
    n: int = 24, spec: TokenSpec = SPEC, mode: str = "static", **kwargs: Any
) -> tuple[TokenBucketDataset, QwenVideos]:
    meta = video_meta(n, stills=kwargs.pop("stills", False))
    items = QwenVideos(meta, **kwargs)
    return TokenBucketDataset(items, metadata=meta, spec=spec, plan=plan_for(meta, spec, mode)), items


def test_modal_video_qwen2vl_clips_concatenated_as_the_processor_makes_them() -> None:
    data, items = qwen_setup()
    collate = ModalityCollate(data, image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD)
    seen = []
    for rank in range(2):
        for batch in loader(data, collate, world_size=2, rank=rank, seed=1):
            real = check_common(batch, data)
            seen += real
            rows, bound = batch["info"].shape
            assert {"pixel_values_videos", "video_grid_thw", "video_cu_seqlens", "video_rows"} <= set(batch)
            assert {"pixel_values", "image_grid_thw", "second_per_grid_ts"}.isdisjoint(batch)  # clips only
            src = [items[i] for i in real]
            if not src:  # a rank's padding batch: the video stream's keys and width, no clip
                assert batch["pixel_values_videos"].shape == (0, WIDTH) and batch["video_grid_thw"].shape == (0, 3)
                continue
            # the real rows' clips in row order, then camera order: what the model's tower takes
            assert torch.equal(batch["pixel_values_videos"], torch.cat([s["pixel_values_videos"] for s in src]))
            grids = batch["video_grid_thw"]
            assert torch.equal(grids, torch.cat([s["video_grid_thw"] for s in src]))
            per_row = [len(data.breakdown(i).cameras) for i in real]
            assert batch["video_rows"].tolist() == [r for r, n in enumerate(per_row) for _ in range(n)]
            assert batch["video_cu_seqlens"].tolist() == [0, *np.cumsum(grids.prod(1).tolist()).tolist()]
            assert batch["camera_keys"][: len(real)] == [["pixel_values_videos"] * n for n in per_row]
            # the video placeholders: Σ t·h·w / merge² of each row's grids, the breakdown's vision tokens
            ids = batch["input_ids"]
            assert ids.shape == batch["mm_token_type_ids"].shape == (rows, bound)
            for r, i in enumerate(real):
                mine = grids[batch["video_rows"] == r]
                placeholders = int((ids[r] == VIDEO_PAD).sum())
                assert placeholders == int(mine.prod(1).sum()) // MERGE**2 == data.breakdown(i).vision
                length = src[r]["input_ids"].shape[1]
                assert length == data.lengths[i]
                assert torch.equal(batch["mm_token_type_ids"][r, :length], src[r]["mm_token_type_ids"][0])
                assert batch["mm_token_type_ids"][r, length:].eq(0).all()
                assert int((batch["mm_token_type_ids"][r] == 2).sum()) == placeholders
            assert batch["uid"][: len(real)] == [f"u{i}" for i in real]
    assert sorted(seen) == list(range(len(data)))  # every sample once over the ranks


def test_modal_video_qwen2_5_vl_second_per_grid_ts_one_a_clip() -> None:
    spec = token_spec_from_hf(qwen_config("qwen2_5_vl"))
    data, items = qwen_setup(spec=spec, seconds=True)
    picked = mates(data, 0, 3)
    batch = ModalityCollate(data)([data[i] for i in picked])
    assert batch["second_per_grid_ts"].dtype == torch.float32
    assert torch.equal(batch["second_per_grid_ts"], torch.cat([items[i]["second_per_grid_ts"] for i in picked]))
    assert batch["second_per_grid_ts"].shape[0] == batch["video_grid_thw"].shape[0]
    assert not any(key.startswith("item.") for key in batch)  # read once, not kept again as another key
    # every clip of a batch carries it, or none does
    bare = dict(data[picked[1]][1])
    del bare["second_per_grid_ts"]
    with pytest.raises(ConfigError, match=rf"^sample {picked[1]} \(key 'v{picked[1]}'\): its \d clips come without "):
        ModalityCollate(data)([data[picked[0]], (picked[1], bare)])
    lying, _ = qwen_setup(spec=spec, seconds=True, lie={picked[0]: "seconds"})
    with pytest.raises(ConfigError, match=r"its 'second_per_grid_ts' should hold one value a clip \(\d\), but got"):
        ModalityCollate(lying)([lying[picked[0]]])


def test_modal_video_placeholders_other_than_the_grids_name_the_sample() -> None:
    data, _ = qwen_setup(lie={3: "placeholder"})
    bd = data.breakdown(3)
    with pytest.raises(ConfigError) as err:
        ModalityCollate(data, video_token_id=VIDEO_PAD)([data[3]])
    assert str(err.value) == (
        f"sample 3 (key 'v3'): its 'input_ids' hold {bd.vision - 1} video placeholders (video_token_id={VIDEO_PAD}), "
        f"but its metadata's clips {[c.name for c in bd.cameras]} make {bd.vision} tokens "
        f"(Σ t·h·w / merge² of the 'video_grid_thw' rows)"
    )
    assert ModalityCollate(data)([data[3]])["index"][0] == 3  # unchecked without the id


def test_modal_video_grid_other_than_the_metadata_names_the_clip() -> None:
    data, items = qwen_setup(lie={5: "grid"})
    g = items[5]["video_grid_thw"][0].tolist()
    cam = data.breakdown(5).cameras[0]
    with pytest.raises(ConfigError) as err:
        ModalityCollate(data)([data[5]])
    assert str(err.value) == (
        f"sample 5 (key 'v5'): its 'pixel_values_videos' clip 0 (video_grid_thw[0]={g}) makes {math.prod(g)} "
        f"patches (grid t,h,w = {g[0]},{g[1]},{g[2]}), but its metadata's camera {HEAD!r} says "
        f"{cam.temporal * cam.spatial * 4} before merge ({cam.temporal} temporal x {cam.spatial} tokens x merge 2²)"
    )


def test_modal_video_clip_count_other_than_the_metadata_is_refused() -> None:
    data, _ = qwen_setup()
    two = next(i for i in range(len(data)) if len(data.breakdown(i).cameras) == 2)
    item = dict(data[two][1])
    first = int(item["video_grid_thw"][0].prod())
    item["pixel_values_videos"] = item["pixel_values_videos"][:first]
    item["video_grid_thw"] = item["video_grid_thw"][:1]
    with pytest.raises(ConfigError) as err:
        ModalityCollate(data)([(two, item)])
    assert str(err.value) == (
        f"sample {two} (key 'v{two}'): its metadata says 0 image cameras [] and 2 clips [{HEAD!r}, {WRIST!r}] "
        f"(cameras the spec feeds as clips, NOTE [ Frames are images ]) but the item holds 0 images "
        f"('image_grid_thw' rows) and 1 videos ('video_grid_thw' rows)"
    )
    # a spec that counts the frames as images (feed="images") is told apart from a missing clip
    stills = token_spec_from_hf(qwen_config(), feed="images")
    meta = video_meta(6)
    as_images = TokenBucketDataset(QwenVideos(meta), metadata=meta, spec=stills, plan=plan_for(meta, stills))
    with pytest.raises(
        ConfigError, match=r"the token spec feeds 'observation.images.head' as images \(feed='images'\)"
    ):
        ModalityCollate(as_images)([as_images[0]])


def test_modal_video_stills_and_clips_of_one_sample_in_their_streams() -> None:
    data, items = qwen_setup(stills=True)  # a head clip and a one-frame wrist image per sample
    picked = mates(data, 0, 3)
    batch = ModalityCollate(data, image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD)([data[i] for i in picked])
    assert torch.equal(batch["pixel_values"], torch.cat([items[i]["pixel_values"] for i in picked]))
    assert torch.equal(batch["pixel_values_videos"], torch.cat([items[i]["pixel_values_videos"] for i in picked]))
    assert batch["image_rows"].tolist() == batch["video_rows"].tolist() == [0, 1, 2]
    assert batch["camera_keys"][:3] == [["pixel_values_videos", "pixel_values"]] * 3  # in the metadata's camera order


def frames_of(cam: dict[str, Any], value: float) -> torch.Tensor:
    """A camera's frames ``[T, 3, H, W]`` already resized as the video processor resizes them."""
    h, w = resized(cam["height"], cam["width"])
    return value + torch.arange(cam["frames"] * 3 * h * w, dtype=torch.float32).reshape(cam["frames"], 3, h, w) / 1e6


class RawVideos(Dataset[dict[str, Any]]):
    """LeRobot-shaped items: each camera's frames ``[T, 3, H, W]``, already resized."""

    def __init__(self, meta: pa.Table) -> None:
        self.rows = meta.to_pylist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {cam["name"]: frames_of(cam, i) for cam in self.rows[i]["cameras"]}


def test_modal_video_raw_frames_cut_into_the_video_stream() -> None:
    meta = video_meta(12)
    spec = token_spec_from_hf(qwen_config())
    data = TokenBucketDataset(RawVideos(meta), metadata=meta, spec=spec, plan=plan_for(meta, spec))
    picked = mates(data, 0, 2)
    batch = ModalityCollate(data, layout="patches")([data[i] for i in picked])
    cams = [cam for i in picked for cam in meta.to_pylist()[i]["cameras"]]
    assert batch["video_grid_thw"].tolist() == [list(grid(c["frames"], c["height"], c["width"])) for c in cams]
    assert "pixel_values" not in batch
    # Qwen2-VL's patch order: frames padded to a whole temporal patch by the last, then each
    # (t, 2x2 merge window, patch) laid out as C·t·p·p
    x = data.dataset[picked[0]][HEAD]
    x = torch.cat([x, x[-1:]]) if x.shape[0] % 2 else x
    gt, gh, gw = (int(v) for v in batch["video_grid_thw"][0])
    want = x.reshape(gt, 2, 3, gh // 2, 2, 14, gw // 2, 2, 14).permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(-1, WIDTH)
    assert torch.equal(batch["pixel_values_videos"][: gt * gh * gw], want)
    # the stacked layout keeps the frames as they are
    stacked = ModalityCollate(data)([data[i] for i in picked])
    assert "pixel_values_videos" not in stacked and stacked["frame_mask"].shape[:2] == stacked["camera_mask"].shape


class PooledVideos(Dataset[dict[str, Any]]):
    """Items as LLaVA-OneVision's processor returns them for one video: ``pixel_values_videos``
    ``[1, frames, 3, H, W]`` (every frame resized to one square), ``input_ids``."""

    def __init__(self, meta: pa.Table, side: dict[int, int] | None = None) -> None:
        self.rows, self.side = meta.to_pylist(), side or {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        frames = self.rows[i]["frames"]
        side = self.side.get(i, 32)
        return {"pixel_values_videos": torch.full((1, frames, 3, side, side), float(i)), "input_ids": torch.arange(4)}


def test_modal_video_pooled_frames_stacked_per_sample() -> None:
    rng = np.random.default_rng(2)
    meta = pa.table(
        {
            "key": [f"p{i}" for i in range(12)],
            "cameras": [1] * 12,
            "frames": rng.integers(2, 9, 12),
            "height": [32] * 12,
            "width": [32] * 12,
            "text_tokens": [4] * 12,
        }
    )
    spec = TokenSpec(patch=16, resize="fixed", fixed_size=(32, 32), text=CountRule(column="text_tokens"))
    data = TokenBucketDataset(PooledVideos(meta), metadata=meta, spec=spec, plan=plan_for(meta, spec))
    picked = mates(data, 0, 3)
    batch = ModalityCollate(data)([data[i] for i in picked])
    frames = [int(meta["frames"][i]) for i in picked]
    px, mask = batch["pixel_values_videos"], batch["video_frame_mask"]
    assert px.shape == (3, max(frames), 3, 32, 32) and batch["video_rows"].tolist() == [0, 1, 2]
    assert mask.tolist() == [[t < f for t in range(max(frames))] for f in frames]
    for n, i in enumerate(picked):
        assert px[n, : frames[n]].eq(i).all() and px[n, frames[n] :].eq(0).all()
    assert {"pixel_values", "camera_mask", "video_grid_thw"}.isdisjoint(batch)
    # frames other than the metadata's, and frames of another size than the batch's, are refused
    short = dict(data[picked[0]][1])
    short["pixel_values_videos"] = short["pixel_values_videos"][:, :1]
    with pytest.raises(ConfigError, match=rf"^sample {picked[0]} \(key 'p{picked[0]}'\): its 'pixel_values_videos' "):
        ModalityCollate(data)([(picked[0], short)])
    odd = TokenBucketDataset(PooledVideos(meta, side={picked[1]: 48}), metadata=meta, spec=spec, plan=data.plan)
    with pytest.raises(ConfigError, match=r"^the batch's pooled videos differ in frame shape"):
        ModalityCollate(odd)([odd[i] for i in picked])


def test_modal_video_2d_bucket_pads_the_video_stream() -> None:
    meta = video_meta(12)
    result = breakdown_table(meta, SPEC)
    lengths, vision = result.totals, result.table.column("vision").to_numpy()
    v = int(vision.max())
    plan = BucketPlan("static", 2**30, (Bucket(int(lengths.max()), 3, 0, 0, 0, 0, 0, 0.0, 1.0, 0.0, vision_bound=v),))
    data = TokenBucketDataset(QwenVideos(meta), metadata=meta, spec=SPEC, plan=plan)
    collate = ModalityCollate(data, layout="patches")
    for batch in (collate([data[0], data[1]]), collate([data[len(data)]])):  # real rows; empty rows only
        px, mask = batch["pixel_values_videos"], batch["video_patch_mask"]
        real = [int(i) for i in batch["index"] if i >= 0]
        patches = MERGE**2 * int(vision[real].sum())
        assert px.shape == (3 * v * MERGE**2, WIDTH) and int(mask.sum()) == patches and px[patches:].eq(0).all()
        assert int(batch["video_grid_thw"].prod(1).sum()) == patches and "patch_mask" not in batch


def test_modal_video_token_ids_are_checked() -> None:
    data, _ = qwen_setup(6)
    with pytest.raises(ConfigError, match=r"^video_token_id should be None or a non-negative integer, but got "):
        ModalityCollate(data, video_token_id=-1)
    with pytest.raises(ConfigError, match=r"^image_token_id should be None or a non-negative integer"):
        ModalityCollate(data, image_token_id=True)  # type: ignore[arg-type]


ORACLE = """
import sys, torch
from transformers import Qwen2VLVideoProcessor
clips = [tuple(int(x) for x in c.split("x")) for c in sys.argv[2:]]
vp = Qwen2VLVideoProcessor(min_pixels={lo}, max_pixels={hi})
out = [vp(videos=[torch.zeros(f, 3, h, w, dtype=torch.uint8)], return_tensors="pt") for f, h, w in clips]
torch.save([{{k: v for k, v in o.items()}} for o in out], sys.argv[1])
"""


@pytest.mark.slow
def test_modal_video_transformers_video_processor_output_collates(tmp_path: Path) -> None:
    """The oracle: transformers' Qwen2VLVideoProcessor (under tests/video_oracle's torchvision
    stand-in, in a subprocess) makes the clips; their grids are the ones the spec counted."""
    meta = video_meta(8)
    clips = [(c["frames"], c["height"], c["width"]) for r in meta.to_pylist() for c in r["cameras"]]
    out = tmp_path / "clips.pt"
    script = ORACLE.format(lo=MIN_PIXELS, hi=MAX_PIXELS)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out), *(f"{f}x{h}x{w}" for f, h, w in clips)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests" / "video_oracle")},
    )
    assert proc.returncode == 0, proc.stderr
    made = iter(torch.load(out))

    class Processed(QwenVideos):
        def __getitem__(self, i: int) -> dict[str, Any]:
            item = super().__getitem__(i)
            theirs = [next(made) for _ in self.rows[i]["cameras"]]
            item["pixel_values_videos"] = torch.cat([o["pixel_values_videos"] for o in theirs])
            item["video_grid_thw"] = torch.cat([o["video_grid_thw"] for o in theirs])
            return item

    items = Processed(meta)
    processed = [items[i] for i in range(len(items))]  # in order: the oracle's clips are the metadata's
    assert [g for it in processed for g in it["video_grid_thw"].tolist()] == [list(grid(*c)) for c in clips]
    data = TokenBucketDataset(processed, metadata=meta, spec=SPEC, plan=plan_for(meta, SPEC))
    collate = ModalityCollate(data, video_token_id=VIDEO_PAD)
    for k in range(len(data.plan.buckets)):
        picked = mates(data, k, 3)
        if picked:
            batch = collate([data[i] for i in picked])
            assert int((batch["input_ids"] == VIDEO_PAD).sum()) == sum(data.breakdown(i).vision for i in picked)
