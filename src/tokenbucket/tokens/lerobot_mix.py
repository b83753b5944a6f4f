"""Several LeRobot datasets planned as one mixture: one metadata table, keys prefixed per source.

:func:`~tokenbucket.tokens.lerobot.lerobot_rows` gives one dataset's frames keys like
``ep000003/000042``; two datasets both have an episode 3, so their rows cannot share a manifest.
:func:`lerobot_mixture` reads each source, applies the sampling recipe and the camera choice
each source understands, and joins the rows with the source's name in front of every key::

    {"so100": root_a, "libero": (root_b, 0.5)} ──► LeRobotSource per entry (name, root, weight)
        │   lerobot_rows(root, the recipe's keys this source has, its cameras)  per source
        ▼   the weight: every frame floor(w) times + a seeded share of the rest (NOTE [ Weights ])
    key = "<source>/ep{episode:06d}/{frame:06d}" (+ "#<copy>" for copies 1, 2, ...)
    source, copy, and every lerobot_rows column

Names default to the dataset folder's name and must be unique; a name is letters, digits,
``_``, ``.`` and ``-`` (no ``/``, so the first ``/`` of a key always ends the source name).

Every problem is a :class:`~tokenbucket._exceptions.ConfigError` that names the source.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenbucket._exceptions import ConfigError
from tokenbucket.tokens.lerobot import LeRobotMetadata, lerobot_rows, read_lerobot_metadata

__all__ = ["LeRobotSource", "lerobot_mixture", "lerobot_sources", "split_mixture_key"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_KEY = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)/ep(\d+)/(\d+)(?:#(\d+))?")

Recipe = Mapping[str, Sequence[float]]


@dataclass(frozen=True, kw_only=True)
class LeRobotSource:
    """One dataset of a mixture: where it is, the name its keys carry, and its weight.

    Attributes:
        root: the dataset folder (the one holding ``meta/``).
        name: the key prefix; default the folder's name. Letters, digits, ``_ . -``.
        weight: frames per epoch relative to the dataset's own: ``2`` lists every frame twice,
            ``0.5`` a seeded half of them (NOTE [ Weights ]). Positive and finite.
    """

    root: Path
    name: str = ""
    weight: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))
        if not self.name:
            object.__setattr__(self, "name", self.root.name or self.root.resolve().name)
        if not _NAME.fullmatch(self.name):
            raise ConfigError(
                f"LeRobot source name should be letters, digits, '_', '.' or '-' (starting with a letter or "
                f"digit), but got name={self.name!r} for {str(self.root)!r}; give it a name"
            )
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ConfigError(
                f"weight of LeRobot source {self.name!r} should be a positive finite number, but got weight={w!r}"
            )
        object.__setattr__(self, "weight", float(w))

    def to_dict(self) -> dict[str, object]:
        """What a manifest records of the source."""
        return {"name": self.name, "path": str(self.root), "weight": float(self.weight)}


def _source(item: object, name: str = "") -> tuple[LeRobotSource, LeRobotMetadata | None]:
    weight: object = 1.0
    if isinstance(item, tuple):
        if len(item) != 2:
            raise ConfigError(f"a LeRobot source should be ROOT or (ROOT, WEIGHT), but got {item!r}")
        item, weight = item
    if isinstance(item, LeRobotSource):
        return item, None
    if isinstance(item, LeRobotMetadata):
        return LeRobotSource(root=item.root, name=name, weight=weight), item  # type: ignore[arg-type]
    if isinstance(item, (str, Path)):
        return LeRobotSource(root=Path(item), name=name, weight=weight), None  # type: ignore[arg-type]
    raise ConfigError(
        f"a LeRobot source should be a dataset folder, LeRobotMetadata, (ROOT, WEIGHT) or LeRobotSource, "
        f"but got {type(item).__name__}"
    )


def _resolve(sources: Mapping[str, object] | Sequence[object]) -> list[tuple[LeRobotSource, LeRobotMetadata | None]]:
    if isinstance(sources, Mapping):
        pairs = [(str(name), item) for name, item in sources.items()]
        out = [_source(item, name) for name, item in pairs]
    elif isinstance(sources, Sequence) and not isinstance(sources, (str, bytes)):
        out = [_source(item) for item in sources]
    else:
        raise ConfigError(
            f"sources should be a list of dataset folders or a mapping of names to folders, but got {sources!r}"
        )
    if not out:
        raise ConfigError("a LeRobot mixture needs at least one source, but got none")
    seen: dict[str, LeRobotSource] = {}
    for src, _ in out:
        other = seen.get(src.name)
        if other is None:
            seen[src.name] = src
        elif other.root.resolve() == src.root.resolve():
            raise ConfigError(
                f"LeRobot dataset {str(src.root)!r} is given twice as source {src.name!r}; give it once with a "
                f"weight (2 lists every frame twice) or give each entry its own name"
            )
        else:
            raise ConfigError(
                f"two LeRobot sources are named {src.name!r} ({str(other.root)!r} and {str(src.root)!r}); "
                f"name them apart (NAME=PATH on the command line, a mapping in Python)"
            )
    return out


def lerobot_sources(sources: Mapping[str, object] | Sequence[object]) -> tuple[LeRobotSource, ...]:
    """The sources of a mixture as :class:`LeRobotSource` values (names defaulted, checked unique).

    Args:
        sources: ``{name: root}`` or ``{name: (root, weight)}``, or a list of ``root``,
            ``(root, weight)`` or :class:`LeRobotSource`; a root is a folder or
            :class:`~tokenbucket.tokens.lerobot.LeRobotMetadata`.

    Raises:
        ConfigError: a bad entry, name or weight; the same dataset twice under one name, or two
            datasets under one name.

    Example:
        >>> [(s.name, s.weight) for s in lerobot_sources(["data/pusht", ("data/aloha", 2)])]
        [('pusht', 1.0), ('aloha', 2.0)]
    """
    return tuple(src for src, _ in _resolve(sources))


def _known(meta: LeRobotMetadata) -> set[str]:
    return set(meta.info.features) | {c.name for c in meta.info.cameras}


def _recipes(metas: Sequence[tuple[LeRobotSource, LeRobotMetadata]], delta_timestamps: object) -> list[Recipe | None]:
    """Each source's recipe: a per-source mapping's entry, or the shared one's keys it has."""
    if delta_timestamps is None:
        return [None] * len(metas)
    if not isinstance(delta_timestamps, Mapping):
        raise ConfigError(f"delta_timestamps should map keys to lists of seconds, but got {delta_timestamps!r}")
    names = [src.name for src, _ in metas]
    nested = [isinstance(v, Mapping) for v in delta_timestamps.values()]
    if delta_timestamps and all(nested):
        unknown = [k for k in delta_timestamps if k not in names]
        if unknown:
            raise ConfigError(
                f"delta_timestamps per source names {unknown[0]!r}, which is not a source; the sources are {names}"
            )
        return [delta_timestamps.get(name) for name in names]
    if any(nested):
        raise ConfigError(
            "delta_timestamps should be one recipe {key: [seconds]} shared by every source, or one per source "
            "{source: {key: [seconds]}}, but it mixes both"
        )
    # NOTE [ Shared recipe ]
    # Datasets of a mixture name their cameras differently (pusht's observation.image, so100's
    # observation.images.top); a shared recipe gives each source the keys it has, the way
    # LeRobot's policies build delta_timestamps from each dataset's own features. A key no
    # source has is a typo, and an error.
    known = [_known(meta) for _, meta in metas]
    for key in delta_timestamps:
        if not any(key in k for k in known):
            raise ConfigError(
                f"delta_timestamps key {key!r} is neither a camera nor a feature of any source ({', '.join(names)})"
            )
    return [{k: v for k, v in delta_timestamps.items() if k in kn} for kn in known]


def _cameras(metas: Sequence[tuple[LeRobotSource, LeRobotMetadata]], cameras: object) -> list[Sequence[str] | None]:
    """Each source's camera keys: a per-source mapping's entry, or the shared list's keys it has."""
    if cameras is None:
        return [None] * len(metas)
    names = [src.name for src, _ in metas]
    if isinstance(cameras, Mapping):
        unknown = [k for k in cameras if k not in names]
        if unknown:
            raise ConfigError(
                f"cameras per source names {unknown[0]!r}, which is not a source; the sources are {names}"
            )
        return [cameras.get(name) for name in names]
    if isinstance(cameras, str) or not isinstance(cameras, Sequence):
        raise ConfigError(f"cameras should be a list of camera keys or a mapping per source, but got {cameras!r}")
    out: list[Sequence[str] | None] = []
    for src, meta in metas:
        have = {c.name for c in meta.info.cameras}
        mine = [c for c in cameras if c in have]
        if not mine:
            raise ConfigError(
                f"cameras={list(cameras)!r} names no camera of LeRobot source {src.name!r}; "
                f"its cameras are {[c.name for c in meta.info.cameras]}"
            )
        out.append(mine)
    for cam in cameras:
        if not any(cam in {c.name for c in meta.info.cameras} for _, meta in metas):
            raise ConfigError(f"cameras={list(cameras)!r} names {cam!r}, which is a camera of no source")
    return out


def _weighted(n: int, src: LeRobotSource, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices and copy numbers for ``n`` frames under the source's weight."""
    # NOTE [ Weights ]
    # A weight w is a repeat factor, as in detectron2's RepeatFactorTrainingSampler and
    # Megatron's blended datasets: the source lists round(w x n) rows per epoch. Every frame
    # appears floor(w) times, and a seeded choice of round((w - floor(w)) x n) frames once
    # more. The choice depends on (seed, source name) only, so a source keeps its frames when
    # others are added or reordered. Doing it here, not in the sampler, makes the plan see the
    # epoch it will train: bucket sizes, batch counts and time.
    whole = math.floor(src.weight)
    extra = math.floor((src.weight - whole) * n + 0.5)
    index = [np.arange(n, dtype=np.int64)] * whole
    copy = [np.full(n, c, dtype=np.int64) for c in range(whole)]
    if extra:
        rng = np.random.default_rng([seed, zlib.crc32(src.name.encode())])
        index.append(np.sort(rng.choice(n, size=extra, replace=False)).astype(np.int64))
        copy.append(np.full(extra, whole, dtype=np.int64))
    if not index:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    idx, cp = np.concatenate(index), np.concatenate(copy)
    order = np.lexsort((cp, idx))  # a frame's copies side by side, frames in their order
    return idx[order], cp[order]


def lerobot_mixture(
    sources: Mapping[str, object] | Sequence[object],
    delta_timestamps: Recipe | Mapping[str, Recipe] | None = None,
    *,
    cameras: Sequence[str] | Mapping[str, Sequence[str] | None] | None = None,
    seed: int = 0,
) -> pa.Table:
    """One metadata table for several LeRobot datasets, each frame keyed by its source.

    Args:
        sources: see :func:`lerobot_sources`: ``{name: root}``, ``{name: (root, weight)}`` or
            a list of ``root`` / ``(root, weight)`` / :class:`LeRobotSource`.
        delta_timestamps: one recipe shared by every source (each source takes the keys it has,
            NOTE [ Shared recipe ]; a key no source has is an error) or ``{source: recipe}``
            (a source left out loads one frame per key). Offsets are checked at each source's fps.
        cameras: one list (each source keeps those it has, in the list's order; a source with
            none, or a camera of no source, is an error) or ``{source: [keys]}`` (a source left
            out keeps all its cameras).
        seed: picks the frames a fractional weight keeps (NOTE [ Weights ]); non-negative.

    Returns:
        The rows of :func:`~tokenbucket.tokens.lerobot.lerobot_rows` for every source, in the
        sources' order, with ``key`` = ``"<source>/ep{episode:06d}/{frame:06d}"`` (plus
        ``"#<copy>"`` for a repeated frame's copies 1, 2, ...; unique), ``source`` (string)
        and ``copy`` (int64, 0 for a frame's first row). :func:`split_mixture_key` reads a key back.

    Raises:
        ConfigError: see :func:`lerobot_sources` and :func:`~tokenbucket.tokens.lerobot.lerobot_rows`;
            a source's own problem names the source.

    Example:
        >>> import json, os, tempfile
        >>> def dataset(fps, cam, lengths):
        ...     root = tempfile.mkdtemp()
        ...     os.makedirs(os.path.join(root, "meta"))
        ...     info = {"codebase_version": "v2.1", "fps": fps, "features": {
        ...         cam: {"dtype": "video", "shape": [96, 96, 3]}, "action": {"dtype": "float32", "shape": [2]}}}
        ...     with open(os.path.join(root, "meta", "info.json"), "w") as f:
        ...         _ = f.write(json.dumps(info))
        ...     with open(os.path.join(root, "meta", "episodes.jsonl"), "w") as f:
        ...         _ = f.write("".join(json.dumps({"episode_index": i, "length": n}) + "\\n"
        ...                             for i, n in enumerate(lengths)))
        ...     return root
        >>> rows = lerobot_mixture({"a": dataset(10, "top", [2]), "b": (dataset(30, "wrist", [2]), 1.5)},
        ...                        {"action": [0.0, 0.1]})
        >>> rows.column("key").to_pylist()
        ['a/ep000000/000000', 'a/ep000000/000001', 'b/ep000000/000000', 'b/ep000000/000000#1', 'b/ep000000/000001']
        >>> rows.column("action_tokens").to_pylist()  # 0.1 s is 1 frame at 10 fps, 3 at 30 fps
        [2, 2, 2, 2, 2]
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed should be a non-negative integer, but got seed={seed!r}")
    resolved = _resolve(sources)
    metas: list[tuple[LeRobotSource, LeRobotMetadata]] = []
    for src, meta in resolved:
        try:
            metas.append((src, meta if meta is not None else read_lerobot_metadata(src.root)))
        except ConfigError as exc:
            raise ConfigError(f"LeRobot source {src.name!r}: {exc}") from None
    recipes = _recipes(metas, delta_timestamps)
    picks = _cameras(metas, cameras)
    tables = []
    for (src, meta), recipe, pick in zip(metas, recipes, picks, strict=True):
        try:
            rows = lerobot_rows(meta, recipe, cameras=pick)
        except ConfigError as exc:
            raise ConfigError(f"LeRobot source {src.name!r}: {exc}") from None
        index, copy = _weighted(rows.num_rows, src, seed)
        if src.weight != 1.0:  # weight 1 keeps the rows as they are
            rows = rows.take(pa.array(index))
        copies = pa.array(copy)
        suffix = pc.if_else(pc.equal(copies, 0), "", pc.binary_join_element_wise("#", pc.cast(copies, pa.string()), ""))
        key = pc.binary_join_element_wise(f"{src.name}/", rows.column("key").combine_chunks(), suffix, "")
        rows = rows.set_column(0, "key", key)
        rows = rows.add_column(1, "source", pa.repeat(pa.scalar(src.name, pa.string()), len(index)))
        tables.append(rows.add_column(2, "copy", copies))
    return pa.concat_tables(tables)


def split_mixture_key(key: str) -> tuple[str, int, int, int]:
    """A mixture key back to ``(source, episode_index, frame_index, copy)``.

    Example:
        >>> split_mixture_key("so100/ep000012/000340#1")
        ('so100', 12, 340, 1)

    Raises:
        ConfigError: a key :func:`lerobot_mixture` did not make.
    """
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise ConfigError(f"key {key!r} is not a LeRobot mixture key like 'source/ep000000/000000'")
    return match[1], int(match[2]), int(match[3]), int(match[4] or 0)
