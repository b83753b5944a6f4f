"""Per-sample token accounting: metadata row → :class:`TokenBreakdown`.

Two paths give the same numbers (a property test holds them together):

- :func:`breakdown_sample` — one sample as a plain mapping, pure Python. For a quick question,
  a data loader's ``__getitem__``, or the CLI's ``--sample``.
- :func:`breakdown_table` — a whole ``pyarrow.Table`` at once, vectorised over NumPy columns
  (millions of rows per second; ``benchmarks/bench_breakdown.py``). Returns a
  :class:`Breakdowns` with one row per valid sample and a ``rejected`` table.

``L_total = L_vision + text + proprio + action + memory + Σ extras`` and
``L_vision = Σ_cameras temporal_tokens x (spatial_tokens + special_per_frame) +
special_per_camera`` (+ what a video clip adds once, LLaVA-OneVision's newline; see
:class:`tokenbucket.tokens.spec.CameraSpec` for every rule).

Example (the design document's worked example):
    >>> from tokenbucket import TokenSpec, breakdown_sample
    >>> breakdown_sample({"cameras": 4, "frames": 16, "height": 224, "width": 224},
    ...                  TokenSpec(patch=14)).vision
    16384
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenbucket import _arrays as A
from tokenbucket import _values as V
from tokenbucket._exceptions import (
    ConfigError,
    InvalidValueError,
    MetadataError,
    MissingColumnError,
)
from tokenbucket.tokens._vision import (
    _ERROR_CLASS,
    _P_KEY,
    _P_RULE,
    _P_TOTAL,
    R_DUPLICATE,
    R_NO_CAMERA_FOR_SLOTS,
    R_TOO_MANY_CAMERAS,
    R_TOO_SMALL,
    _column,
    _vision_flat,
    _vision_list,
)
from tokenbucket.tokens.spec import MODALITIES, TokenSpec, _camera_py, _fed_images

__all__ = [
    "R_DUPLICATE",
    "Breakdowns",
    "CameraTokens",
    "TokenBreakdown",
    "breakdown_sample",
    "breakdown_table",
    "duplicate_rows",
]

OnInvalid = Literal["raise", "reject"]


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


# -- the scalar path ---------------------------------------------------------------------------


class _Row:
    """Raise errors that carry the row's location."""

    def __init__(self, index: int | None, key: str | None) -> None:
        self.index, self.key = index, key

    def fail(self, reason: str, column: str, value: object) -> MetadataError:
        cls = _ERROR_CLASS.get(reason, InvalidValueError)
        return cls(reason, column=column, row=self.index, key=self.key, value=value)

    def int(self, value: object, column: str, minimum: int, maximum: int) -> int:
        number, reason = V.check_scalar(value, minimum, maximum)
        if reason is not None:
            raise self.fail(reason, column, value)
        return number


_MISSING = object()
R_NOT_UTF8 = "should be valid UTF-8 text"


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

    specs = [spec.camera_spec(name) for name, *_ in shapes]
    # the images the sample feeds the model, which a family's rule may read (NOTE [ Images of a sample ])
    images = sum(_fed_images(cs, f) for cs, (_, f, *_) in zip(specs, shapes, strict=True))
    cameras = []
    for j, ((name, f, h, w, empty), cs) in enumerate(zip(shapes, specs, strict=True)):
        temporal, spatial, tokens, small = _camera_py(cs, f, h, w, images)
        if small is not None:
            is_list = isinstance(cams_value, (list, tuple))
            src = 0 if empty else j
            label = f"{cols.cameras}[{src}].{getattr(cols, small)}" if is_list else getattr(cols, small)
            raise row.fail(R_TOO_SMALL, label, h if small == "height" else w)
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

    vision = sum(c.tokens for c in cameras)
    if vision + sum(counts.values()) >= V.MAX_TOTAL:  # NOTE [ Value bounds ]
        raise row.fail(V.R_TOO_MANY_TOKENS, "total", vision + sum(counts.values()))
    return TokenBreakdown(
        vision=vision,
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


def _flat(arr: pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)


def breakdown_table(
    table: pa.Table | Mapping[str, Any],
    spec: TokenSpec,
    *,
    on_invalid: OnInvalid = "raise",
    per_camera: bool = False,
    check_keys: bool = True,
    min_total: int = 0,
    row_offset: int = 0,
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
        min_total: a sample with fewer tokens is invalid (the planner passes 1: a padded row of
            nothing but padding trains nothing; packing takes empty samples).
        row_offset: the input row of ``table``'s first row, when it is one batch of a larger
            input: errors and reasons name ``row_offset + i`` (``index`` columns stay 0-based).

    Raises:
        MissingColumnError: a required column is absent (in either mode).
        MetadataError: with ``on_invalid="raise"``, the first bad row's error.
    """
    if on_invalid not in ("raise", "reject"):
        raise ConfigError(f"on_invalid should be 'raise' or 'reject', but got on_invalid={on_invalid!r}")
    if not isinstance(table, pa.Table):
        if not isinstance(table, Mapping):
            raise ConfigError(
                f"table should be a pyarrow.Table or a mapping of columns, but got {type(table).__name__}"
            )
        table = pa.table(dict(table))
    cols = spec.columns
    n = table.num_rows
    problems = A.Problems()

    # keys
    if cols.key is not None:
        key_arr = _utf8_keys(_text_keys(_flat(_column(table, cols.key)), cols.key), problems, cols.key)
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
            checked[rule.column] = A.check_array(
                table.column(rule.column), 0, V.MAX_TOKENS, problems, _P_RULE + r, rule.column
            )
        counts[name] = checked[rule.column] * rule.tokens_per_unit

    total = vision.copy()
    for values in counts.values():
        total += values
    # NOTE [ Value bounds ]: the largest of each part bound the sum (Python ints: no wrap); only
    # when that bound is past MAX_TOTAL is the sum redone in float64, which cannot wrap
    parts = [vision, *counts.values()]
    if sum(int(a.max(initial=0)) for a in parts) >= V.MAX_TOTAL:
        approx = np.sum([a.astype(np.float64) for a in parts], axis=0)
        over = np.flatnonzero(approx >= V.MAX_TOTAL)
        problems.add(over, _P_TOTAL, V.R_TOO_MANY_TOKENS, "total", lambda i: int(approx[over[i]]))
        total[over] = V.MAX_TOTAL
    if min_total > 0:
        few = np.flatnonzero(total < min_total)
        problems.add(few, _P_TOTAL, f"should be at least {min_total} token(s)", "total", lambda i: int(total[few[i]]))

    index = np.arange(n, dtype=np.int64)
    rejected = REJECTED_SCHEMA.empty_table()
    keep = None
    if problems:
        if on_invalid == "raise":
            row, reason, column, value = problems.first()
            key = key_arr[row].as_py()
            cls = _ERROR_CLASS.get(reason, InvalidValueError)
            raise cls(reason, column=column, row=row + row_offset, key=key, value=value)
        chosen = problems.first_per_row()
        rows = np.array([c[0] for c in chosen], dtype=np.int64)
        keys = key_arr.take(pa.array(rows)).to_pylist()
        messages = [
            str(_ERROR_CLASS.get(reason, InvalidValueError)(reason, column=col, row=r + row_offset, key=k, value=v))
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


def _text_keys(keys: pa.Array, column: str) -> pa.Array:
    """The key column as text: string keys as they are, binary keys as the same bytes (a view:
    a cast would stop at the first invalid UTF-8 key, which :func:`_utf8_keys` names by row
    instead), numbers as their digits; a column of lists or structs holds no keys."""
    kind = keys.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return keys
    if pa.types.is_fixed_size_binary(kind):
        keys = keys.cast(pa.binary())
    if pa.types.is_binary(keys.type):
        return keys.view(pa.string())
    if pa.types.is_large_binary(keys.type):
        return keys.view(pa.large_string())
    try:
        return pc.cast(keys, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        first = next((v for v in keys.to_pylist() if v is not None), None) if len(keys) else None
        raise MetadataError(
            f"should hold text or numbers, one key a row ({kind} here)", column=column, value=first
        ) from None


def _utf8_keys(keys: pa.Array, problems: A.Problems, column: str) -> pa.Array:
    """``keys`` as they are when every one is valid UTF-8 (one validation pass); else the bad ones
    are reported and shown with their bytes escaped (a reader such as Parquet or Arrow's JSON does
    not check them, and a key that cannot be decoded could not be named, saved or looked up)."""
    try:
        keys.validate(full=True)
        return keys
    except pa.ArrowInvalid:
        pass
    raw = keys.cast(pa.large_binary() if pa.types.is_large_string(keys.type) else pa.binary()).to_pylist()
    shown: list[str | None] = []
    bad: list[int] = []
    for i, value in enumerate(raw):
        if value is None:
            shown.append(None)
            continue
        try:
            shown.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            shown.append(value.decode("utf-8", "backslashreplace"))
            bad.append(i)
    rows = np.array(bad, dtype=np.int64)
    problems.add(rows, _P_KEY, R_NOT_UTF8, column, lambda i: raw[int(rows[i])])
    return pa.array(shown, keys.type)


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


def _check_unique(key_arr: pa.Array, problems: A.Problems, column: str) -> None:
    idx = duplicate_rows(key_arr)
    problems.add(idx, _P_KEY + 1, R_DUPLICATE, column, lambda i: key_arr[int(idx[i])].as_py())
