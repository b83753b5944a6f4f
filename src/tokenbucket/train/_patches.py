"""The patch streams of :class:`~tokenbucket.train.modal.ModalityCollate`: images and video
clips as Qwen2-VL's flattened patches (cut from frames here, or a processor's own), each stream
concatenated over a batch's real rows, and the checks of a patch grid against its camera's
breakdown (NOTE [ Items against their metadata ], NOTE [ Clips in the batch ]).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.tokens.breakdown import CameraTokens, TokenBreakdown
from tokenbucket.tokens.spec import CameraSpec

__all__ = [
    "IMAGES",
    "STREAMS",
    "VIDEOS",
    "Cut",
    "PatchImage",
    "StreamNames",
    "ceil_div",
    "check_count",
    "check_patches",
    "cut_frames",
    "cut_of",
    "describe",
    "is_clip",
    "write_stream",
]


@dataclass(frozen=True)
class StreamNames:
    """The batch keys of one patch stream (Qwen2-VL's names, and the collate's own beside them)."""

    label: str  # what an error calls its members
    pixels: str
    grid: str
    cu_seqlens: str
    rows: str
    mask: str


IMAGES = StreamNames("patches", "pixel_values", "image_grid_thw", "cu_seqlens", "image_rows", "patch_mask")
VIDEOS = StreamNames(
    "video patches", "pixel_values_videos", "video_grid_thw", "video_cu_seqlens", "video_rows", "video_patch_mask"
)
STREAMS = (IMAGES, VIDEOS)


@dataclass(frozen=True)
class Cut:
    """How a camera's frames become patches: ``tubelet`` frames x ``patch`` x ``patch`` pixels
    a patch, ``merge x merge`` patches an LLM token."""

    tubelet: int
    patch: int
    merge: int


def is_clip(cs: CameraSpec, cam: CameraTokens) -> bool:
    """Whether the spec feeds camera ``cam`` as one video clip (NOTE [ Frames are images ])."""
    return cs.feed == "video" and cam.frames > 1


@cache
def _video_cut(rule: str) -> tuple[int | None, int | None, int | None]:
    params = json.loads(rule)
    return params.get("temporal"), params.get("patch"), params.get("merge")


def cut_of(cs: CameraSpec, clip: bool) -> Cut:
    """A camera's :class:`Cut`: the spec's ``tubelet``, ``patch`` and ``merge``, or for a clip
    its video rule's temporal patch, patch and merge (where the rule names them)."""
    if clip and cs.video_rule is not None:
        t, p, m = _video_cut(cs.video_rule)
        return Cut(int(t or cs.tubelet), int(p or cs.patch), int(m or cs.merge))
    return Cut(cs.tubelet, cs.patch, cs.merge)


@dataclass
class PatchImage:
    """One image or clip of a patch stream: frames to cut, or a processor's patches."""

    row: int
    camera: int  # its position in the sample's breakdown
    key: str
    frames: torch.Tensor | None
    patches: torch.Tensor | None
    grid: tuple[int, int, int]
    cut: Cut
    clip: bool

    @property
    def size(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def width(self) -> int:
        if self.patches is not None:
            return int(self.patches.shape[1])
        channels = int(self.frames.shape[1]) if self.frames is not None else 0
        return channels * self.cut.tubelet * self.cut.patch**2

    @property
    def dtype(self) -> torch.dtype:
        source = self.patches if self.patches is not None else self.frames
        return source.dtype if source is not None else torch.float32


def write_stream(
    out: dict[str, object], names: StreamNames, images: list[PatchImage], n_real: int, bound: int | None
) -> None:
    """One stream into ``out``: the real rows' images (``row < n_real``) concatenated in order;
    the others only give the width and dtype. ``bound``: the patch count a 2D bucket pads the
    stream to (NOTE [ Patch stream of a 2D bucket ])."""
    widths = {im.width for im in images}
    if len(widths) > 1:
        raise ConfigError(
            f"the batch's {names.label} differ in width {sorted(widths)} (C·t·p·p): one encoder takes one"
        )
    real = [im for im in images if im.row < n_real]
    counts = [im.size for im in real]
    total = sum(counts)
    size = total if bound is None else bound
    pixels = torch.empty(size, widths.pop(), dtype=images[0].dtype)
    pixels[total:] = 0
    start = 0
    for im, n in zip(real, counts, strict=True):
        if im.patches is not None:
            pixels[start : start + n] = im.patches
        elif im.frames is not None:
            cut_frames(im.frames, pixels[start : start + n], im.grid, im.cut)
        start += n
    cu = torch.zeros(len(real) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(counts, dtype=torch.int64).cumsum(0)
    out[names.pixels] = pixels
    if bound is not None:
        out[names.mask] = torch.arange(size) < total
    out[names.grid] = torch.tensor([im.grid for im in real], dtype=torch.long).reshape(-1, 3)
    out[names.cu_seqlens] = cu
    out[names.rows] = torch.tensor([im.row for im in real], dtype=torch.long)


def cut_frames(x: torch.Tensor, dest: torch.Tensor, grid: tuple[int, int, int], cut: Cut) -> None:
    """Frames ``[T, C, H, W]`` into ``dest`` ``[gt·gh·gw, C·t·p·p]`` in Qwen2-VL's patch order
    (the last frame repeated up to a whole tubelet; each merge window's patches together)."""
    gt, gh, gw = grid
    t, p, m = cut.tubelet, cut.patch, cut.merge
    if x.shape[0] != gt * t:
        x = torch.cat([x, x[-1:].expand(gt * t - x.shape[0], *x.shape[1:])])
    c = x.shape[1]
    view = x.reshape(gt, t, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    dest.view(gt, gh // m, gw // m, m, m, c, t, p, p).copy_(view)


def check_patches(where: str, grid: tuple[int, int, int], cam: CameraTokens, merge: int) -> None:
    """The patch count of ``grid`` against the breakdown's vision tokens before merge."""
    t, h, w = grid
    expected = cam.temporal * cam.spatial * merge**2
    if t * h * w != expected or h % merge or w % merge:
        raise ConfigError(
            f"{where} makes {t * h * w} patches (grid t,h,w = {t},{h},{w}), but its metadata's camera {cam.name!r} "
            f"says {expected} before merge ({cam.temporal} temporal x {cam.spatial} tokens x merge {merge}²)"
        )


def check_count(index: int, key: str, bd: TokenBreakdown, real: list[int], image_keys: list[str]) -> None:
    """As many images in the item as real cameras in the breakdown (one line naming the odd one)."""
    if len(image_keys) == len(real):
        return
    names = [bd.cameras[j].name for j in real]
    extra = [k for k in image_keys if k not in names] or image_keys[len(real) :]
    missing = (
        [n for n in names if n not in image_keys] if extra != image_keys[len(real) :] else names[len(image_keys) :]
    )
    detail = f"{extra[0]!r} has no camera in the metadata" if len(image_keys) > len(real) else f"no image for {missing}"
    raise ConfigError(
        f"sample {index} (key {key!r}): its metadata says {len(real)} cameras {names} but the item holds "
        f"{len(image_keys)} images {image_keys}: {detail}"
    )


def describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return "nothing" if value is None else type(value).__name__


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
