"""Vision tokens, the part of the breakdown that depends on cameras: the per-camera formulas
(twice: Python ints for the scalar path, NumPy arrays for the vectorised one) and the vectorised
pass over flat and per-camera (list-of-struct) columns. :mod:`tokenbucket.tokens.breakdown`
runs both paths; the shared reasons and check order live here so both report alike.

NOTE [ Images of a sample ]
A family whose image tokens depend on how many images the sample holds
(:attr:`~tokenbucket.models.Family.counts_images`: LLaVA-OneVision tiles a lone image, and makes
each of several one crop and its newline) prices each image of a row under ``resize="model"``
with :meth:`~tokenbucket.models.Family.sample_rule_inputs` at the row's image count: the frames
of every camera fed as images (a camera of one frame, or each frame of a camera under
``feed="images"``: ``stills``), empty camera slots included; a camera fed as a clip
(``feed="video"``, two frames or more) is a video, which the processor does not count. That is
the count :class:`~tokenbucket.cost.staged.Sample` hands the staged cost model (``images``, or
``videos x frames`` where the frames are images), so both stages price a sample alike. The
scalar path sums :func:`~tokenbucket.tokens.spec._fed_images` over the row's cameras; the
vectorised one sums :func:`_fed_images_np` per row and runs the rule once per distinct
``(height, width, images)``. Every other family is priced once per distinct ``(height, width)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenbucket import _arrays as A
from tokenbucket import _values as V
from tokenbucket._exceptions import (
    DuplicateKeyError,
    ImageTooSmallError,
    InvalidValueError,
    MissingColumnError,
)
from tokenbucket.models import clip_inputs, counts_images, rule_inputs
from tokenbucket.tokens.spec import CameraSpec, TokenSpec, _ceil_div

R_DUPLICATE = "should be unique"
R_TOO_SMALL = "is smaller than one patch under resize='crop'"
R_TOO_MANY_CAMERAS = "should be at most camera_slots"
R_NO_CAMERA_FOR_SLOTS = "should hold at least one camera to size the empty camera slots"

# Check order (the scalar path walks it top to bottom; the vectorised path sorts by it), so
# both report the same first problem of a row.
_P_KEY = 0
_P_CAMERAS = 2
_P_FLAT = {"frames": 3, "height": 4, "width": 5}
_P_ELEMENT = 10  # + 4 * position + field
_P_SMALL = 1_000_000  # + 4 * position + (0 height, 1 width)
_P_RULE = 2_000_000  # + rule index
_P_TOTAL = 3_000_000  # the sum of everything (NOTE [ Value bounds ])

_ERROR_CLASS = {
    R_DUPLICATE: DuplicateKeyError,
    R_TOO_SMALL: ImageTooSmallError,
}


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise MissingColumnError(name, table.column_names)
    return table.column(name)


# -- one camera: the formulas, twice (Python ints, then NumPy arrays) --------------------------


def _ceil_div_np(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


def _spatial_np(
    cs: CameraSpec, h: np.ndarray, w: np.ndarray, images: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Vectorised :func:`_spatial_py`: ``(tokens, height_too_small, width_too_small)``;
    ``images``: each camera's sample's image count (NOTE [ Images of a sample ])."""
    p, m = cs.patch, cs.merge
    if cs.resize == "model":  # a family's own rule: once per distinct size, then spread back
        return _model_np(str(cs.image_rule), h, w, images), None, None
    if cs.resize == "crop":
        gh, gw = (h // p) // m, (w // p) // m
        small_h = gh == 0
        small_w = (gw == 0) & ~small_h
        return gh * gw, small_h, small_w
    if cs.resize == "max_pixels":
        if cs.max_pixels is None:  # CameraSpec.__post_init__ guarantees it
            raise AssertionError("cs.max_pixels is unset")
        factor = p * m
        hf, wf = h.astype(np.float64), w.astype(np.float64)
        hb = np.maximum(factor, np.round(hf / factor).astype(np.int64) * factor)
        wb = np.maximum(factor, np.round(wf / factor).astype(np.int64) * factor)
        area = hb * wb
        over = area > cs.max_pixels
        under = ~over & (area < cs.min_pixels)
        if over.any():
            beta = np.sqrt((h[over] * w[over]) / cs.max_pixels)
            hb[over] = np.maximum(factor, np.floor(hf[over] / beta / factor).astype(np.int64) * factor)
            wb[over] = np.maximum(factor, np.floor(wf[over] / beta / factor).astype(np.int64) * factor)
        if under.any():
            beta = np.sqrt(cs.min_pixels / (h[under] * w[under]))
            hb[under] = np.ceil(hf[under] * beta / factor).astype(np.int64) * factor
            wb[under] = np.ceil(wf[under] * beta / factor).astype(np.int64) * factor
        return (hb // factor) * (wb // factor), None, None
    if cs.resize == "fixed":
        if cs.fixed_size is None:  # CameraSpec.__post_init__ guarantees it
            raise AssertionError("cs.fixed_size is unset")
        fh, fw = cs.fixed_size
        per = _ceil_div(_ceil_div(fh, p), m) * _ceil_div(_ceil_div(fw, p), m)
        return np.full(len(h), per, dtype=np.int64), None, None
    return _ceil_div_np(_ceil_div_np(h, p), m) * _ceil_div_np(_ceil_div_np(w, p), m), None, None


def _model_np(rule: str, h: np.ndarray, w: np.ndarray, images: np.ndarray) -> np.ndarray:
    """LLM tokens per image under a family's rule: the per-image rule of :func:`_spatial_py`, run
    once per distinct ``(h, w)`` (a metadata table holds few sizes), or ``(h, w, images)`` for a
    family that counts its sample's images (NOTE [ Images of a sample ]), and spread back to every
    row; rows whose sides are not positive (reported by the value checks) get 0."""
    if not len(h):
        return np.zeros(0, dtype=np.int64)
    # a row of clips alone holds no image: its clips' tokens here are replaced by the video rule's
    n = np.maximum(images, 1) if counts_images(rule) else np.ones(len(h), dtype=np.int64)
    keys, where = np.unique(np.stack([h, w, n], axis=1), axis=0, return_inverse=True)
    per = np.array(
        [rule_inputs(rule, int(a), int(b), int(k)).llm_tokens if a >= 1 and b >= 1 else 0 for a, b, k in keys],
        dtype=np.int64,
    )
    return per[where.reshape(-1)]


def _clip_np(rule: str, f: np.ndarray, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Temporal groups, LLM tokens per group and the tokens a clip adds once (LLaVA-OneVision's
    newline: ``llm_tokens`` past groups x per group) of each clip under a family's video rule:
    the rule of :func:`~tokenbucket.models.clip_inputs`, run once per distinct ``(frames, h, w)``
    and spread back; rows whose values are not positive (reported by the value checks) get 0."""
    if not len(f):
        return (np.zeros(0, dtype=np.int64),) * 3
    triples, where = np.unique(np.stack([f, h, w], axis=1), axis=0, return_inverse=True)
    out = np.zeros((3, len(triples)), dtype=np.int64)
    for k, (n, a, b) in enumerate(triples):
        if n >= 1 and a >= 1 and b >= 1:
            clip = clip_inputs(rule, int(n), int(a), int(b))
            per = clip.llm_tokens // clip.tower_images
            out[:, k] = clip.tower_images, per, clip.llm_tokens - clip.tower_images * per
    where = where.reshape(-1)
    return out[0][where], out[1][where], out[2][where]


def _temporal_np(cs: CameraSpec, frames: np.ndarray) -> np.ndarray:
    if cs.tokens_per_frame is not None or cs.tubelet == 1:
        return frames
    if cs.causal_first_frame:
        return 1 + _ceil_div_np(frames - 1, cs.tubelet)
    return _ceil_div_np(frames, cs.tubelet)


def _fed_images_np(cs: CameraSpec, f: np.ndarray) -> np.ndarray:
    """Vectorised :func:`~tokenbucket.tokens.spec._fed_images`: the images each camera feeds the
    model, none for a clip (NOTE [ Images of a sample ])."""
    return np.where(f > 1, 0, f) if cs.feed == "video" else f


def _camera_np(
    cs: CameraSpec, f: np.ndarray, h: np.ndarray, w: np.ndarray, images: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(tokens, temporal, spatial, height_too_small, width_too_small)`` for each camera;
    ``images``: how many images its sample feeds the model (NOTE [ Images of a sample ])."""
    if cs.tokens_per_frame is not None:
        spatial: np.ndarray = np.full(len(f), cs.tokens_per_frame, dtype=np.int64)
        small_h = small_w = None
    else:
        spatial, small_h, small_w = _spatial_np(cs, h, w, images)
    temporal = _temporal_np(cs, f)
    once = None  # what a clip adds once (LLaVA-OneVision's newline)
    if cs.feed == "video":  # clips of two frames or more: the family's video rule (NOTE [ Frames are images ])
        clip = f > 1
        if clip.any():
            groups, per, extra = _clip_np(str(cs.video_rule), f[clip], h[clip], w[clip])
            temporal, spatial = temporal.copy(), spatial.copy()
            temporal[clip], spatial[clip] = groups, per
            if extra.any():
                once = np.zeros(len(f), dtype=np.int64)
                once[clip] = extra
            if small_h is not None and small_w is not None:
                small_h, small_w = small_h & ~clip, small_w & ~clip
    tokens = temporal * (spatial + cs.special_per_frame) if cs.special_per_frame else temporal * spatial
    if cs.special_per_camera:
        tokens = tokens + cs.special_per_camera
    if once is not None:
        tokens = tokens + once
    return tokens, temporal, spatial, small_h, small_w


def _slot_positions(spec: TokenSpec, limit: int) -> dict[int, CameraSpec]:
    """Camera positions below ``limit`` whose name has an override, with their spec."""
    out = {}
    for j in range(limit):
        name = spec.slot_name(j)
        if name in spec.overrides:
            out[j] = spec.camera_spec(name)
    return out


def _vision_flat(
    table: pa.Table, spec: TokenSpec, problems: A.Problems, per_camera: bool
) -> tuple[np.ndarray, pa.Array | None]:
    cols = spec.columns
    cams = A.check_array(_column(table, cols.cameras), 0, V.MAX_CAMERAS, problems, _P_CAMERAS, cols.cameras)
    f = A.check_array(_column(table, cols.frames), 1, V.MAX_FRAMES, problems, _P_FLAT["frames"], cols.frames)
    h = A.check_array(_column(table, cols.height), 1, V.MAX_SIDE, problems, _P_FLAT["height"], cols.height)
    w = A.check_array(_column(table, cols.width), 1, V.MAX_SIDE, problems, _P_FLAT["width"], cols.width)
    if spec.camera_slots is not None:
        over = np.flatnonzero(cams > spec.camera_slots)
        problems.add(over, _P_CAMERAS, R_TOO_MANY_CAMERAS, cols.cameras, lambda i: int(cams[over[i]]))
        slots = np.maximum(cams, spec.camera_slots)
    else:
        slots = cams
    max_slots = int(slots.max(initial=0))
    positions = _slot_positions(spec, max_slots)

    if not positions and not per_camera:
        # Fast path: every camera of a row has the same shape and the same spec.
        base = spec.base_camera()
        tokens, _, _, small_h, small_w = _camera_np(base, f, h, w, slots * _fed_images_np(base, f))
        _report_small(problems, spec, small_h, small_w, slots > 0, None, h, w, np.zeros(len(f), np.int64))
        return slots * tokens, None

    # General path: one element per camera slot.
    n = len(cams)
    parent = np.repeat(np.arange(n), slots)
    starts = np.concatenate([[0], np.cumsum(slots)[:-1]]) if n else np.zeros(0, np.int64)
    pos = np.arange(len(parent)) - np.repeat(starts, slots)
    ef, eh, ew = f[parent], h[parent], w[parent]
    tokens = _element_tokens(spec, positions, pos, None, ef, eh, ew, problems, parent, None, n)
    vision = _sum_by_row(parent, tokens, n)
    lists = (
        pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(slots)]).astype(np.int32)), pa.array(tokens))
        if per_camera
        else None
    )
    return vision, lists


def _report_small(
    problems: A.Problems,
    spec: TokenSpec,
    small_h: np.ndarray | None,
    small_w: np.ndarray | None,
    live: np.ndarray,
    labels: Callable[[int, str], str] | None,
    h: np.ndarray,
    w: np.ndarray,
    pos: np.ndarray,
    parent: np.ndarray | None = None,
) -> None:
    cols = spec.columns
    for mask, fld, offset, vals in ((small_h, cols.height, 0, h), (small_w, cols.width, 1, w)):
        if mask is None:
            continue
        idx = np.flatnonzero(mask & live)
        if not len(idx):
            continue
        rows = parent[idx] if parent is not None else idx
        column = fld if labels is None else [labels(int(k), fld) for k in idx]
        problems.add(
            rows, _P_SMALL + 4 * pos[idx] + offset, R_TOO_SMALL, column, lambda i, idx=idx, vals=vals: int(vals[idx[i]])
        )


def _element_tokens(
    spec: TokenSpec,
    positions: dict[int, CameraSpec],
    pos: np.ndarray,
    names: pa.Array | None,
    f: np.ndarray,
    h: np.ndarray,
    w: np.ndarray,
    problems: A.Problems,
    parent: np.ndarray,
    labels: Callable[[int, str], str] | None,
    rows: int,
) -> np.ndarray:
    """Tokens of each camera element, each with the spec its name (or position) selects.

    ``pos`` is each element's slot position (it orders the checks); ``labels`` names an
    element's column in messages; ``parent`` is each element's row of ``rows``.
    """
    base = spec.base_camera()
    groups: list[tuple[CameraSpec, np.ndarray]] = []
    if names is not None:
        encoded = pc.dictionary_encode(names)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        for code, name in enumerate(encoded.dictionary.to_pylist()):
            if name in spec.overrides:
                groups.append((spec.camera_spec(name), codes == code))
    else:
        groups = [(cs, pos == j) for j, cs in positions.items()]
    subs = [(cs, np.flatnonzero(mask)) for cs, mask in groups]
    fed = _fed_images_np(base, f).copy()  # NOTE [ Images of a sample ]: each row's, then each element's
    for cs, sub in subs:
        fed[sub] = _fed_images_np(cs, f[sub])
    images = _sum_by_row(parent, fed, rows)[parent]
    tokens, _, _, small_h, small_w = _camera_np(base, f, h, w, images)
    small_h = np.zeros(len(f), dtype=bool) if small_h is None else small_h
    small_w = np.zeros(len(f), dtype=bool) if small_w is None else small_w
    for cs, sub in subs:
        tokens[sub], _, _, sh, sw = _camera_np(cs, f[sub], h[sub], w[sub], images[sub])
        small_h[sub] = False if sh is None else sh
        small_w[sub] = False if sw is None else sw
    _report_small(problems, spec, small_h, small_w, np.ones(len(f), dtype=bool), labels, h, w, pos, parent)
    return tokens


def _vision_list(
    cams: pa.Array, spec: TokenSpec, problems: A.Problems, per_camera: bool
) -> tuple[np.ndarray, pa.Array | None, np.ndarray]:
    cols = spec.columns
    n = len(cams)
    if cams.null_count:
        idx = np.flatnonzero(np.asarray(cams.is_null()))
        problems.add(idx, _P_CAMERAS, V.R_NULL, cols.cameras, None)
    counts = pc.list_value_length(cams).fill_null(0).to_numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    values = pc.list_flatten(cams)
    if not pa.types.is_struct(values.type):
        raise InvalidValueError(
            "should hold {name, frames, height, width} structs", column=cols.cameras, value=str(cams.type)
        )
    parent = np.repeat(np.arange(n), counts)
    pos = np.arange(len(parent)) - offsets[:-1][parent] if len(parent) else np.zeros(0, np.int64)
    present = {values.type.field(i).name for i in range(values.type.num_fields)}

    def labels(k: int, fld: str) -> str:
        return f"{cols.cameras}[{int(pos[k])}].{fld}"

    dims = []
    for fi, (fld, hi) in enumerate(((cols.frames, V.MAX_FRAMES), (cols.height, V.MAX_SIDE), (cols.width, V.MAX_SIDE))):
        if fld not in present:
            raise MissingColumnError(f"{cols.cameras}[].{fld}", sorted(present))
        field_arr = pc.struct_field(values, fld)  # a null struct's fields read as null
        label_list = _LazyLabels(pos, cols.cameras, fld)
        dims.append(A.check_array(field_arr, 1, hi, problems, _P_ELEMENT + 4 * pos + fi, label_list, rows=parent))
    f, h, w = dims

    if spec.camera_slots is not None:
        over = np.flatnonzero(counts > spec.camera_slots)
        problems.add(over, _P_CAMERAS, R_TOO_MANY_CAMERAS, cols.cameras, lambda i: cams[int(over[i])].as_py())
        empty = np.flatnonzero((counts == 0) & ~np.asarray(cams.is_null()))
        problems.add(empty, _P_CAMERAS, R_NO_CAMERA_FOR_SLOTS, cols.cameras, lambda i: cams[int(empty[i])].as_py())
        extra = np.where(counts > 0, np.maximum(spec.camera_slots - counts, 0), 0)
    else:
        extra = np.zeros(n, dtype=np.int64)

    # names: the struct's name, else the slot name
    slot_names = pa.array([spec.slot_name(j) for j in range(int(counts.max(initial=0)) + 1)])
    if cols.name in present:
        names = pc.struct_field(values, cols.name)
        if not pa.types.is_string(names.type):
            names = pc.cast(names, pa.string())
        if names.null_count:
            names = pc.if_else(names.is_null(), slot_names.take(pa.array(pos)), names)
    else:
        names = slot_names.take(pa.array(pos))

    source_pos = pos
    if extra.any():
        # empty slots: copies of the row's first camera, named as TokenSpec.empty_slot_names names them
        e_parent = np.repeat(np.arange(n), extra)
        e_start = np.concatenate([[0], np.cumsum(extra)[:-1]])
        e_rank = np.arange(len(e_parent)) - np.repeat(e_start, extra)
        e_pos = counts[e_parent] + e_rank
        first = offsets[:-1][e_parent]
        e_names = _empty_slot_names_np(spec, names, parent, n, e_parent, e_rank, e_pos)
        parent = np.concatenate([parent, e_parent])
        source_pos = np.concatenate([pos, np.zeros(len(e_parent), np.int64)])
        pos = np.concatenate([pos, e_pos])
        f, h, w = (np.concatenate([a, a[first]]) for a in (f, h, w))
        names = pa.concat_arrays([names, e_names])

    def small_labels(k: int, fld: str) -> str:
        return f"{cols.cameras}[{int(source_pos[k])}].{fld}"

    tokens = _element_tokens(spec, {}, pos, names, f, h, w, problems, parent, small_labels, n)
    vision = _sum_by_row(parent, tokens, n)
    real = int(counts.sum())  # elements before the appended empty slots
    max_frames = np.zeros(n, dtype=np.int64)
    np.maximum.at(max_frames, parent[:real], f[:real])
    lists = None
    if per_camera:
        order = np.lexsort((pos, parent))
        lengths = counts + extra
        lists = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)), pa.array(tokens[order])
        )
    return vision, lists, max_frames


def _sum_by_row(parent: np.ndarray, tokens: np.ndarray, n: int) -> np.ndarray:
    """Each row's sum of its elements' tokens, exact in int64; a row past ``MAX_TOTAL`` reads
    ``MAX_TOTAL`` (the total check rejects it: NOTE [ Value bounds ])."""
    tokens = np.asarray(tokens, dtype=np.int64)
    approx = np.bincount(parent, weights=tokens, minlength=n)  # float64: cannot wrap
    if approx.max(initial=0) < 2**53:  # every partial sum is then exact: bincount's fast path
        return approx.astype(np.int64)
    over = approx >= V.MAX_TOTAL
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, parent, np.where(over[parent], 0, tokens))
    out[over] = V.MAX_TOTAL
    return out


def _empty_slot_names_np(
    spec: TokenSpec,
    names: pa.Array,
    parent: np.ndarray,
    n: int,
    e_parent: np.ndarray,
    e_rank: np.ndarray,
    e_pos: np.ndarray,
) -> pa.Array:
    """The vectorised :meth:`TokenSpec.empty_slot_names`: the e-th empty slot of a row takes the
    e-th of ``camera_names`` its real cameras (``names``, by element) do not use, else the name of
    its position."""
    k = len(spec.camera_names)
    candidates = [*spec.camera_names, *(spec.slot_name(j) for j in range(int(e_pos.max(initial=0)) + 1))]
    idx = k + e_pos  # the position's name
    if k:
        used = np.zeros((n, k), dtype=bool)
        for j, name in enumerate(spec.camera_names):
            used[parent[np.asarray(pc.equal(names, name).fill_null(False))], j] = True
        free_first = np.argsort(used, axis=1, kind="stable")  # per row, unused names first, in order
        n_free = k - used.sum(axis=1)
        take = e_rank < n_free[e_parent]
        idx = np.where(take, free_first[e_parent, np.minimum(e_rank, k - 1)], idx)
    return pa.array(candidates).take(pa.array(idx))


class _LazyLabels(Sequence[str]):
    """``cameras[j].field`` labels, built only for the entries an error or a rejection names."""

    def __init__(self, pos: np.ndarray, cameras: str, fld: str) -> None:
        self.pos, self.cameras, self.fld = pos, cameras, fld

    def __len__(self) -> int:
        return len(self.pos)

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> list[str]: ...

    def __getitem__(self, k: int | slice) -> str | list[str]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return f"{self.cameras}[{int(self.pos[k])}].{self.fld}"
