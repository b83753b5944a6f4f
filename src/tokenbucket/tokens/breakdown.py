"""Per-sample token accounting: metadata row → :class:`TokenBreakdown`.

Two paths give the same numbers (a property test holds them together):

- :func:`breakdown_sample` — one sample as a plain mapping, pure Python. For a quick question,
  a data loader's ``__getitem__``, or the CLI's ``--sample``.
- :func:`breakdown_table` — a whole ``pyarrow.Table`` at once, vectorised over NumPy columns
  (millions of rows per second; ``benchmarks/bench_breakdown.py``). Returns a
  :class:`Breakdowns` with one row per valid sample and a ``rejected`` table.

``L_total = L_vision + text + proprio + action + memory + Σ extras`` and
``L_vision = Σ_cameras temporal_tokens x (spatial_tokens + special_per_frame) +
special_per_camera`` (see :class:`tokenbucket.tokens.spec.CameraSpec` for every rule).

Example (the design document's worked example):
    >>> from tokenbucket import TokenSpec, breakdown_sample
    >>> breakdown_sample({"cameras": 4, "frames": 16, "height": 224, "width": 224},
    ...                  TokenSpec(patch=14)).vision
    16384
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenbucket import _values as V
from tokenbucket._exceptions import (
    ConfigError,
    DuplicateKeyError,
    ImageTooSmallError,
    InvalidValueError,
    MetadataError,
    MissingColumnError,
)
from tokenbucket.tokens.spec import MODALITIES, CameraSpec, TokenSpec

__all__ = [
    "Breakdowns",
    "CameraTokens",
    "TokenBreakdown",
    "breakdown_sample",
    "breakdown_table",
]

OnInvalid = Literal["raise", "reject"]

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

_ERROR_CLASS = {
    R_DUPLICATE: DuplicateKeyError,
    R_TOO_SMALL: ImageTooSmallError,
}


@dataclass(frozen=True)
class CameraTokens:
    """One camera's (or empty slot's) share of a sample's vision tokens."""

    name: str
    frames: int
    height: int
    width: int
    temporal: int
    spatial: int
    tokens: int
    empty_slot: bool = False


@dataclass(frozen=True)
class TokenBreakdown:
    """The token count of one sample, by modality."""

    vision: int
    text: int
    proprio: int
    action: int
    memory: int
    extras: Mapping[str, int] = field(default_factory=dict)
    cameras: tuple[CameraTokens, ...] = ()
    key: str | None = None

    @property
    def total(self) -> int:
        return self.vision + self.text + self.proprio + self.action + self.memory + sum(self.extras.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: modalities, ``total``, and ``cameras`` as a list of dicts."""
        out: dict[str, Any] = {"vision": self.vision}
        for name in MODALITIES:
            out[name] = getattr(self, name)
        out.update(self.extras)
        out["total"] = self.total
        out["cameras"] = [c.__dict__.copy() for c in self.cameras]
        if self.key is not None:
            out["key"] = self.key
        return out


# -- one camera: the formulas, twice (Python ints, then NumPy arrays) --------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _spatial_py(cs: CameraSpec, h: int, w: int) -> tuple[int, str | None]:
    """Spatial tokens per frame; or ``(0, "height"|"width")`` when too small under crop."""
    p, m = cs.patch, cs.merge
    if cs.resize == "crop":
        gh, gw = (h // p) // m, (w // p) // m
        if gh == 0:
            return 0, "height"
        if gw == 0:
            return 0, "width"
        return gh * gw, None
    if cs.resize == "max_pixels":
        if cs.max_pixels is None:  # CameraSpec.__post_init__ guarantees it
            raise AssertionError("cs.max_pixels is unset")
        factor = p * m
        hb = max(factor, round(h / factor) * factor)
        wb = max(factor, round(w / factor) * factor)
        if hb * wb > cs.max_pixels:
            beta = math.sqrt(h * w / cs.max_pixels)
            hb = max(factor, math.floor(h / beta / factor) * factor)
            wb = max(factor, math.floor(w / beta / factor) * factor)
        elif hb * wb < cs.min_pixels:
            beta = math.sqrt(cs.min_pixels / (h * w))
            hb = math.ceil(h * beta / factor) * factor
            wb = math.ceil(w * beta / factor) * factor
        return (hb // factor) * (wb // factor), None
    if cs.resize == "fixed":
        if cs.fixed_size is None:  # CameraSpec.__post_init__ guarantees it
            raise AssertionError("cs.fixed_size is unset")
        h, w = cs.fixed_size
    return _ceil_div(_ceil_div(h, p), m) * _ceil_div(_ceil_div(w, p), m), None


def _temporal_py(cs: CameraSpec, frames: int) -> int:
    if cs.tokens_per_frame is not None:
        return frames
    if cs.causal_first_frame:
        return 1 + _ceil_div(frames - 1, cs.tubelet)
    return _ceil_div(frames, cs.tubelet)


def _ceil_div_np(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


def _spatial_np(cs: CameraSpec, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Vectorised :func:`_spatial_py`: ``(tokens, height_too_small, width_too_small)``."""
    p, m = cs.patch, cs.merge
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


def _temporal_np(cs: CameraSpec, frames: np.ndarray) -> np.ndarray:
    if cs.tokens_per_frame is not None or cs.tubelet == 1:
        return frames
    if cs.causal_first_frame:
        return 1 + _ceil_div_np(frames - 1, cs.tubelet)
    return _ceil_div_np(frames, cs.tubelet)


def _camera_np(
    cs: CameraSpec, f: np.ndarray, h: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(tokens, temporal, spatial, height_too_small, width_too_small)`` for each camera."""
    if cs.tokens_per_frame is not None:
        spatial: np.ndarray = np.full(len(f), cs.tokens_per_frame, dtype=np.int64)
        small_h = small_w = None
    else:
        spatial, small_h, small_w = _spatial_np(cs, h, w)
    temporal = _temporal_np(cs, f)
    tokens = temporal * (spatial + cs.special_per_frame) if cs.special_per_frame else temporal * spatial
    if cs.special_per_camera:
        tokens = tokens + cs.special_per_camera
    return tokens, temporal, spatial, small_h, small_w


# -- the scalar path ---------------------------------------------------------------------------


class _Row:
    """Raise errors that carry the row's location."""

    def __init__(self, index: int | None, key: str | None) -> None:
        self.index, self.key = index, key

    def fail(self, reason: str, column: str, value: Any) -> MetadataError:
        cls = _ERROR_CLASS.get(reason, InvalidValueError)
        return cls(reason, column=column, row=self.index, key=self.key, value=value)

    def int(self, value: Any, column: str, minimum: int, maximum: int) -> int:
        number, reason = V.check_scalar(value, minimum, maximum)
        if reason is not None:
            raise self.fail(reason, column, value)
        return number


_MISSING = object()


def breakdown_sample(sample: Mapping[str, Any], spec: TokenSpec, *, index: int | None = None) -> TokenBreakdown:
    """The token breakdown of one sample, from its metadata.

    Args:
        sample: the row, e.g. ``{"cameras": 4, "frames": 16, "height": 224, "width": 224,
            "text_tokens": 40}``; ``cameras`` may instead be a list of
            ``{"name", "frames", "height", "width"}`` dicts (per-camera schema).
        spec: the token spec (its ``columns`` names the fields).
        index: the row's index, for error messages.

    Raises:
        MetadataError: a subclass naming the row, the column and the value.
    """
    cols = spec.columns
    key = None
    if cols.key is not None and cols.key in sample:
        raw_key = sample[cols.key]
        if raw_key is None:
            raise InvalidValueError(V.R_NULL, column=cols.key, row=index, value=None)
        key = str(raw_key)
    row = _Row(index, key)

    def need(column: str) -> Any:
        value = sample.get(column, _MISSING)
        if value is _MISSING:
            raise MissingColumnError(column, sorted(map(str, sample)))
        return value

    cams_value = need(cols.cameras)
    shapes: list[tuple[str, int, int, int, bool]] = []  # name, frames, height, width, empty
    if isinstance(cams_value, (list, tuple)):
        if spec.camera_slots is not None and len(cams_value) > spec.camera_slots:
            raise row.fail(R_TOO_MANY_CAMERAS, cols.cameras, cams_value)
        if spec.camera_slots is not None and not cams_value:
            raise row.fail(R_NO_CAMERA_FOR_SLOTS, cols.cameras, cams_value)
        for j, cam in enumerate(cams_value):
            label = f"{cols.cameras}[{j}]"
            if cam is None:
                raise row.fail(V.R_NULL, f"{label}.{cols.frames}", None)
            if not isinstance(cam, Mapping):
                raise row.fail("should hold {name, frames, height, width} structs", label, cam)
            dims = []
            for fld, hi in ((cols.frames, V.MAX_FRAMES), (cols.height, V.MAX_SIDE), (cols.width, V.MAX_SIDE)):
                value = cam.get(fld, _MISSING)
                if value is _MISSING:
                    raise MissingColumnError(f"{label}.{fld}", sorted(map(str, cam)))
                dims.append(row.int(value, f"{label}.{fld}", 1, hi))
            name = cam.get(cols.name)
            f, h, w = dims
            shapes.append((spec.slot_name(j) if name is None else str(name), f, h, w, False))
        n_cams = len(cams_value)
    else:
        n_cams = row.int(cams_value, cols.cameras, 0, V.MAX_CAMERAS)
        if spec.camera_slots is not None and n_cams > spec.camera_slots:
            raise row.fail(R_TOO_MANY_CAMERAS, cols.cameras, cams_value)
        f = row.int(need(cols.frames), cols.frames, 1, V.MAX_FRAMES)
        h = row.int(need(cols.height), cols.height, 1, V.MAX_SIDE)
        w = row.int(need(cols.width), cols.width, 1, V.MAX_SIDE)
        shapes = [(spec.slot_name(j), f, h, w, False) for j in range(n_cams)]
        slot_shape = (f, h, w)
    if shapes:
        slot_shape = shapes[0][1:4]
    n_slots = max(n_cams, spec.camera_slots or 0)
    for name in spec.empty_slot_names({s[0] for s in shapes}, n_cams, n_slots - n_cams):
        shapes.append((name, *slot_shape, True))

    cameras = []
    for j, (name, f, h, w, empty) in enumerate(shapes):
        cs = spec.camera_spec(name)
        if cs.tokens_per_frame is not None:
            spatial = cs.tokens_per_frame
        else:
            spatial, small = _spatial_py(cs, h, w)
            if small is not None:
                is_list = isinstance(cams_value, (list, tuple))
                src = 0 if empty else j
                label = f"{cols.cameras}[{src}].{getattr(cols, small)}" if is_list else getattr(cols, small)
                raise row.fail(R_TOO_SMALL, label, h if small == "height" else w)
        temporal = _temporal_py(cs, f)
        tokens = temporal * (spatial + cs.special_per_frame) + cs.special_per_camera
        cameras.append(CameraTokens(name, f, h, w, temporal, spatial, tokens, empty))

    counts: dict[str, int] = {}
    max_frames = max((c.frames for c in cameras if not c.empty_slot), default=0)
    for name, rule in spec.__dict__["_rules"].items():
        if rule.column is None:
            counts[name] = rule.count * rule.tokens_per_unit
            continue
        value = sample.get(rule.column, _MISSING)
        if value is _MISSING:
            if rule.column == cols.frames and isinstance(cams_value, (list, tuple)):
                value = max_frames
            elif rule.optional:
                counts[name] = 0
                continue
            else:
                raise MissingColumnError(rule.column, sorted(map(str, sample)))
        counts[name] = row.int(value, rule.column, 0, V.MAX_TOKENS) * rule.tokens_per_unit

    return TokenBreakdown(
        vision=sum(c.tokens for c in cameras),
        text=counts.pop("text"),
        proprio=counts.pop("proprio"),
        action=counts.pop("action"),
        memory=counts.pop("memory"),
        extras=counts,
        cameras=tuple(cameras),
        key=key,
    )


# -- the vectorised path -----------------------------------------------------------------------


@dataclass(frozen=True)
class Breakdowns:
    """The breakdowns of a table of samples.

    Attributes:
        table: one row per valid sample, in input order: ``key`` (string), ``index`` (the
            input row), ``vision``, ``text``, ``proprio``, ``action``, ``memory``, one column
            per extra, ``total`` (all int64), and with ``per_camera=True`` a ``camera_tokens``
            list column (one entry per camera, then per empty slot).
        rejected: one row per invalid sample: ``index``, ``key``, ``column``, ``value`` (its
            ``repr``), ``reason``, ``message``. Empty unless ``on_invalid="reject"``.
    """

    table: pa.Table
    rejected: pa.Table

    @property
    def totals(self) -> np.ndarray:
        return np.asarray(self.table.column("total").to_numpy(), dtype=np.int64)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def summary(self) -> dict[str, Any]:
        """Counts, percentiles of ``total`` and each modality's share of all tokens.

        Example:
            >>> from tokenbucket.testing import mixture_a
            >>> s = breakdown_table(mixture_a(1000), TokenSpec(patch=14)).summary()
            >>> s["count"], round(sum(s["share"].values()), 6)
            (1000, 1.0)
        """
        totals = self.totals
        modalities = [c for c in self.table.column_names if c not in ("key", "index", "total", "camera_tokens")]
        sums = {m: int(pc.sum(self.table.column(m)).as_py() or 0) for m in modalities}
        all_tokens = sum(sums.values())
        out: dict[str, Any] = {"count": len(totals), "rejected": self.rejected.num_rows}
        if len(totals):
            q = np.percentile(totals, [50, 90, 99], method="higher")
            out.update(
                min=int(totals.min()),
                p50=int(q[0]),
                p90=int(q[1]),
                p99=int(q[2]),
                max=int(totals.max()),
                mean=float(totals.mean()),
            )
        out["tokens"] = all_tokens
        out["share"] = {m: (v / all_tokens if all_tokens else 0.0) for m, v in sums.items()}
        return out


REJECTED_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("key", pa.string()),
        ("column", pa.string()),
        ("value", pa.string()),
        ("reason", pa.string()),
        ("message", pa.string()),
    ]
)


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise MissingColumnError(name, table.column_names)
    return table.column(name)


def _flat(arr: pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)


def breakdown_table(
    table: pa.Table | Mapping[str, Any],
    spec: TokenSpec,
    *,
    on_invalid: OnInvalid = "raise",
    per_camera: bool = False,
    check_keys: bool = True,
) -> Breakdowns:
    """The token breakdown of every row of ``table``, vectorised.

    Args:
        table: metadata (see :func:`tokenbucket.tokens.metadata.read_metadata`), or a mapping of
            column name to NumPy array / list.
        spec: the token spec; ``spec.columns`` names the columns.
        on_invalid: ``"raise"`` (default) raises the first bad row's error; ``"reject"`` moves
            every bad row to ``Breakdowns.rejected`` with its reason. Nothing is dropped or
            clamped silently either way.
        per_camera: also return each sample's per-camera tokens as a list column.
        check_keys: check that keys are unique (one comparison pass when the keys are in
            increasing order, else a hash over every key; turn off only when the keys are known
            to be unique).

    Raises:
        MissingColumnError: a required column is absent (in either mode).
        MetadataError: with ``on_invalid="raise"``, the first bad row's error.
    """
    if on_invalid not in ("raise", "reject"):
        raise ConfigError(f"on_invalid should be 'raise' or 'reject', but got on_invalid={on_invalid!r}")
    if not isinstance(table, pa.Table):
        if not isinstance(table, Mapping):
            raise ConfigError(f"table should be a pyarrow.Table or a mapping of columns, but got {type(table).__name__}")
        table = pa.table(dict(table))
    cols = spec.columns
    n = table.num_rows
    problems = V.Problems()

    # keys
    if cols.key is not None:
        key_arr = _flat(_column(table, cols.key))
        if not (pa.types.is_string(key_arr.type) or pa.types.is_large_string(key_arr.type)):
            key_arr = pc.cast(key_arr, pa.string())
        if key_arr.null_count:
            idx = np.flatnonzero(np.asarray(key_arr.is_null()))
            problems.add(idx, _P_KEY, V.R_NULL, cols.key, None)
        if check_keys and n:
            _check_unique(key_arr, problems, cols.key)
    else:
        key_arr = pc.cast(pa.array(np.arange(n)), pa.string())

    # cameras → per-camera elements (or the flat fast path)
    cams_col = _column(table, cols.cameras)
    is_list = pa.types.is_list(cams_col.type) or pa.types.is_large_list(cams_col.type)
    if is_list:
        vision, camera_lists, max_frames = _vision_list(_flat(cams_col), spec, problems, per_camera)
    else:
        vision, camera_lists = _vision_flat(table, spec, problems, per_camera)
        max_frames = None

    # modalities
    counts: dict[str, np.ndarray] = {}
    checked: dict[str, np.ndarray] = {}
    for r, (name, rule) in enumerate(spec.rules().items()):
        if rule.column is None:
            counts[name] = np.full(n, rule.count * rule.tokens_per_unit, dtype=np.int64)
            continue
        if rule.column not in table.column_names:
            if rule.column == cols.frames and max_frames is not None:
                counts[name] = max_frames * rule.tokens_per_unit
            elif rule.optional:
                counts[name] = np.zeros(n, dtype=np.int64)
            else:
                raise MissingColumnError(rule.column, table.column_names)
            continue
        if rule.column not in checked:
            checked[rule.column] = V.check_array(
                table.column(rule.column), 0, V.MAX_TOKENS, problems, _P_RULE + r, rule.column
            )
        counts[name] = checked[rule.column] * rule.tokens_per_unit

    total = vision.copy()
    for values in counts.values():
        total += values

    index = np.arange(n, dtype=np.int64)
    rejected = REJECTED_SCHEMA.empty_table()
    keep = None
    if problems:
        if on_invalid == "raise":
            row, reason, column, value = problems.first()
            key = key_arr[row].as_py()
            cls = _ERROR_CLASS.get(reason, InvalidValueError)
            raise cls(reason, column=column, row=row, key=key, value=value)
        chosen = problems.first_per_row()
        rows = np.array([c[0] for c in chosen], dtype=np.int64)
        keys = key_arr.take(pa.array(rows)).to_pylist()
        messages = [
            str(_ERROR_CLASS.get(reason, InvalidValueError)(reason, column=col, row=r, key=k, value=v))
            for (r, reason, col, v), k in zip(chosen, keys, strict=True)
        ]
        rejected = pa.table(
            {
                "index": rows,
                "key": pa.array(keys, pa.string()),
                "column": [c[2] for c in chosen],
                "value": [repr(c[3]) for c in chosen],
                "reason": [c[1] for c in chosen],
                "message": messages,
            },
            schema=REJECTED_SCHEMA,
        )
        keep = np.ones(n, dtype=bool)
        keep[rows] = False

    out: dict[str, Any] = {"key": key_arr, "index": index, "vision": vision}
    out.update(counts)
    out["total"] = total
    if camera_lists is not None:
        out["camera_tokens"] = camera_lists
    result = pa.table(out)
    if keep is not None:
        result = result.filter(pa.array(keep))
    return Breakdowns(table=result, rejected=rejected)


def duplicate_rows(keys: pa.Array) -> np.ndarray:
    """Rows whose key an earlier row already has (nulls never count as duplicates).

    NOTE [ Duplicate keys ]
    Metadata is often written in key order: strictly increasing keys are unique, and one
    comparison pass proves it (0.09 s for 10M keys against 3 s for hashing them; see
    benchmarks/bench_breakdown.py). Otherwise one hash pass; only when the dictionary is
    shorter than the column do we pay for locating the repeats (every occurrence after the
    first is the duplicate).
    """
    n = len(keys)
    none = np.zeros(0, dtype=np.int64)
    if n < 2 or (not keys.null_count and pc.all(pc.greater(keys.slice(1), keys.slice(0, n - 1))).as_py()):
        return none
    encoded = pc.dictionary_encode(keys)
    if len(encoded.dictionary) + (1 if keys.null_count else 0) >= n:
        return none
    codes = encoded.indices.fill_null(-1).to_numpy()
    _, first = np.unique(codes, return_index=True)
    dup = np.ones(n, dtype=bool)
    dup[first] = False
    dup &= codes >= 0
    return np.flatnonzero(dup)


def _check_unique(key_arr: pa.Array, problems: V.Problems, column: str) -> None:
    idx = duplicate_rows(key_arr)
    problems.add(idx, _P_KEY + 1, R_DUPLICATE, column, lambda i: key_arr[int(idx[i])].as_py())


def _slot_positions(spec: TokenSpec, limit: int) -> dict[int, CameraSpec]:
    """Camera positions below ``limit`` whose name has an override, with their spec."""
    out = {}
    for j in range(limit):
        name = spec.slot_name(j)
        if name in spec.overrides:
            out[j] = spec.camera_spec(name)
    return out


def _vision_flat(
    table: pa.Table, spec: TokenSpec, problems: V.Problems, per_camera: bool
) -> tuple[np.ndarray, pa.Array | None]:
    cols = spec.columns
    cams = V.check_array(_column(table, cols.cameras), 0, V.MAX_CAMERAS, problems, _P_CAMERAS, cols.cameras)
    f = V.check_array(_column(table, cols.frames), 1, V.MAX_FRAMES, problems, _P_FLAT["frames"], cols.frames)
    h = V.check_array(_column(table, cols.height), 1, V.MAX_SIDE, problems, _P_FLAT["height"], cols.height)
    w = V.check_array(_column(table, cols.width), 1, V.MAX_SIDE, problems, _P_FLAT["width"], cols.width)
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
        tokens, _, _, small_h, small_w = _camera_np(spec.base_camera(), f, h, w)
        _report_small(problems, spec, small_h, small_w, slots > 0, None, h, w, np.zeros(len(f), np.int64))
        return slots * tokens, None

    # General path: one element per camera slot.
    n = len(cams)
    parent = np.repeat(np.arange(n), slots)
    starts = np.concatenate([[0], np.cumsum(slots)[:-1]]) if n else np.zeros(0, np.int64)
    pos = np.arange(len(parent)) - np.repeat(starts, slots)
    ef, eh, ew = f[parent], h[parent], w[parent]
    tokens = _element_tokens(spec, positions, pos, None, ef, eh, ew, problems, parent, None)
    vision = _sum_by_row(parent, tokens, n)
    lists = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(slots)]).astype(np.int32)), pa.array(tokens)) if per_camera else None
    return vision, lists


def _report_small(
    problems: V.Problems,
    spec: TokenSpec,
    small_h: np.ndarray | None,
    small_w: np.ndarray | None,
    live: np.ndarray,
    labels: Any,
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
        problems.add(rows, _P_SMALL + 4 * pos[idx] + offset, R_TOO_SMALL, column, lambda i, idx=idx, vals=vals: int(vals[idx[i]]))


def _element_tokens(
    spec: TokenSpec,
    positions: dict[int, CameraSpec],
    pos: np.ndarray,
    names: pa.Array | None,
    f: np.ndarray,
    h: np.ndarray,
    w: np.ndarray,
    problems: V.Problems,
    parent: np.ndarray,
    labels: Any,
) -> np.ndarray:
    """Tokens of each camera element, each with the spec its name (or position) selects.

    ``pos`` is each element's slot position (it orders the checks); ``labels`` names an
    element's column in messages.
    """
    tokens, _, _, small_h, small_w = _camera_np(spec.base_camera(), f, h, w)
    small_h = np.zeros(len(f), dtype=bool) if small_h is None else small_h
    small_w = np.zeros(len(f), dtype=bool) if small_w is None else small_w
    groups: list[tuple[CameraSpec, np.ndarray]] = []
    if names is not None:
        encoded = pc.dictionary_encode(names)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        for code, name in enumerate(encoded.dictionary.to_pylist()):
            if name in spec.overrides:
                groups.append((spec.camera_spec(name), codes == code))
    else:
        groups = [(cs, pos == j) for j, cs in positions.items()]
    for cs, mask in groups:
        sub = np.flatnonzero(mask)
        tokens[sub], _, _, sh, sw = _camera_np(cs, f[sub], h[sub], w[sub])
        small_h[sub] = False if sh is None else sh
        small_w[sub] = False if sw is None else sw
    _report_small(problems, spec, small_h, small_w, np.ones(len(f), dtype=bool), labels, h, w, pos, parent)
    return tokens


def _vision_list(
    cams: pa.Array, spec: TokenSpec, problems: V.Problems, per_camera: bool
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
        dims.append(V.check_array(field_arr, 1, hi, problems, _P_ELEMENT + 4 * pos + fi, label_list, rows=parent))
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

    tokens = _element_tokens(spec, {}, pos, names, f, h, w, problems, parent, small_labels)
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
    """Each row's sum of its elements' tokens, exact in int64."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if int(tokens.sum()) < 2**53:  # every partial sum is then exact in float64: bincount's fast path
        return np.bincount(parent, weights=tokens, minlength=n).astype(np.int64)
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, parent, tokens)
    return out


def _empty_slot_names_np(spec: TokenSpec, names: pa.Array, parent: np.ndarray, n: int, e_parent: np.ndarray,
                         e_rank: np.ndarray, e_pos: np.ndarray) -> pa.Array:
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

    def __getitem__(self, k: Any) -> Any:
        return f"{self.cameras}[{int(self.pos[k])}].{self.fld}"
