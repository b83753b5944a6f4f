"""LeRobot datasets → per-sample metadata rows, from the metadata alone (no video is decoded).

A LeRobot dataset root holds ``meta/info.json`` (the fps and the features: camera shapes, the
state and action vectors) and an episode list. That is all token accounting needs: a training
sample is one frame of one episode, and ``delta_timestamps`` says which frames around it the
policy loads::

    meta/info.json ─────────► read_lerobot_info ─────► LeRobotInfo: cameras, fps, state/action sizes
    meta/episodes.jsonl (v2.x) ┐
    meta/episodes/chunk-XXX/   ├► read_lerobot_metadata ► LeRobotMetadata: + each episode's index, length
       file-XXX.parquet (v3.0) ┘        │
                                        ▼  lerobot_rows(delta_timestamps, cameras=, episodes=)
    one row per frame, in the per-camera schema that breakdown.py and manifest.py read

The episode list's place follows ``codebase_version``: ``v2.0`` and ``v2.1`` keep one JSON
object per line in ``meta/episodes.jsonl``; ``v3.0`` keeps Parquet files under
``meta/episodes/``, ``chunk-{chunk_index:03d}/file-{file_index:03d}.parquet``, read in
(chunk, file) order. Both give at least ``episode_index`` and ``length`` (frames) per episode.

Camera features are those with dtype ``video`` or ``image``. Their ``shape`` is usually
``[height, width, channels]`` but some datasets store ``[channels, height, width]``; the
feature's ``names`` say which, and we read them rather than guess.

Every problem is a :class:`~tokenbucket._exceptions.ConfigError` that names the file (and the
line or row), the field and the value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenbucket._config import json_object
from tokenbucket._exceptions import ConfigError

__all__ = [
    "ACTION_KEY",
    "LeRobotCamera",
    "LeRobotInfo",
    "LeRobotMetadata",
    "STATE_KEY",
    "frame_offsets",
    "lerobot_rows",
    "read_lerobot_info",
    "read_lerobot_metadata",
]

STATE_KEY = "observation.state"
ACTION_KEY = "action"

_CAMERA_DTYPES = ("video", "image")
# LeRobot accepts an offset whose time is within this many seconds of a whole frame.
_TOLERANCE_S = 1e-4
_V3_EPISODE_FILE = re.compile(r"chunk-(\d+)/file-(\d+)\.parquet")


@dataclass(frozen=True)
class LeRobotCamera:
    """One camera feature: its key and frame size in pixels."""

    name: str
    height: int
    width: int
    dtype: str


@dataclass(frozen=True)
class LeRobotInfo:
    """What token accounting needs from a LeRobot ``info.json``.

    Attributes:
        codebase_version: e.g. ``"v2.1"``; it decides where the episode list lives.
        fps: frames per second (an int or a float in the file; a float here).
        cameras: the ``video``/``image`` features, in file order.
        total_episodes, total_frames: as the file states them (trimmed copies can disagree
            with the episode list; the episode list wins).
        state_size: values in one ``observation.state`` vector (``None`` without that feature).
        action_size: values in one ``action`` vector (``None`` without that feature).
        features: every feature key, cameras included (what ``delta_timestamps`` may name).
    """

    codebase_version: str
    fps: float
    cameras: tuple[LeRobotCamera, ...]
    total_episodes: int | None
    total_frames: int | None
    state_size: int | None = None
    action_size: int | None = None
    features: tuple[str, ...] = ()

    def sample(self, delta_timestamps: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
        """A per-camera-schema sample: ``{"cameras": [{name, frames, height, width}, ...]}``.

        Each camera's frame count is the number of offsets ``delta_timestamps`` gives for its
        key (LeRobot loads one frame per offset, clamping at episode edges); 1 when the key is
        absent.

        Raises:
            ConfigError: a key that is neither a camera nor a feature, or a bad offset.
        """
        offsets = frame_offsets(self, delta_timestamps)
        cams = []
        for cam in self.cameras:
            frames = len(offsets.get(cam.name, (0,)))
            cams.append({"name": cam.name, "frames": frames, "height": cam.height, "width": cam.width})
        # Non-camera keys (state, action) are not vision; TokenSpec rules count them.
        return {"cameras": cams}


@dataclass(frozen=True, kw_only=True)
class LeRobotMetadata:
    """A LeRobot dataset's metadata: its info and its episodes, in the episode files' order.

    Attributes:
        root: the dataset folder (the one holding ``meta/``).
        info: its ``meta/info.json``.
        episode_index: each episode's index.
        length: each episode's number of frames, aligned with ``episode_index``.
    """

    root: Path
    info: LeRobotInfo
    episode_index: tuple[int, ...]
    length: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.episode_index) != len(self.length):
            raise ConfigError(
                f"LeRobot metadata of {str(self.root)!r}: episode_index and length should align, but got "
                f"{len(self.episode_index)} indices and {len(self.length)} lengths"
            )
        bad = next((n for n in self.length if n < 0), None)
        if bad is not None:
            raise ConfigError(f"LeRobot metadata of {str(self.root)!r}: length should be >= 0, but got length={bad}")
        if len(set(self.episode_index)) != len(self.episode_index):
            dup = next(i for i, n in Counter(self.episode_index).items() if n > 1)
            raise ConfigError(
                f"LeRobot metadata of {str(self.root)!r}: episode_index should be unique, but "
                f"episode_index={dup} appears more than once"
            )

    @property
    def total_frames(self) -> int:
        """Frames in all episodes: the number of rows :func:`lerobot_rows` gives."""
        return sum(self.length)


# -- info.json ---------------------------------------------------------------------------------


def _hw(key: str, feature: Mapping[str, Any], where: str) -> tuple[int, int]:
    shape = list(feature.get("shape") or [])
    names = feature.get("names")
    if len(shape) != 3 or not all(_is_count(s) and s > 0 for s in shape):
        raise ConfigError(
            f"{where}: camera feature {key!r} should have a 3-d shape of positive integers, but got shape={shape!r}"
        )
    if isinstance(names, Sequence) and not isinstance(names, str) and len(names) == 3:
        lowered = [str(n).lower() for n in names]
        if "height" in lowered and "width" in lowered:
            return int(shape[lowered.index("height")]), int(shape[lowered.index("width")])
    # No usable names: channels are the small axis (1, 3 or 4).
    if shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4):
        return int(shape[1]), int(shape[2])
    return int(shape[0]), int(shape[1])


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _vector_size(key: str, features: Mapping[str, Any], where: str) -> int | None:
    """Values in one vector of feature ``key`` (the product of its shape; ``[n]`` → n)."""
    feature = features.get(key)
    if feature is None:
        return None
    shape = feature.get("shape") if isinstance(feature, Mapping) else None
    if (
        not isinstance(shape, Sequence)
        or isinstance(shape, str)
        or not shape
        or not all(_is_count(s) and s > 0 for s in shape)
    ):
        raise ConfigError(f"{where}: feature {key!r} should have a shape like [n] with n > 0, but got shape={shape!r}")
    return math.prod(shape)


def read_lerobot_info(source: str | Path | Mapping[str, Any]) -> LeRobotInfo:
    """Read a LeRobot ``meta/info.json`` (a path, or the parsed dict).

    Example:
        >>> info = read_lerobot_info({"codebase_version": "v2.1", "fps": 30, "features": {
        ...     "observation.images.top": {"dtype": "video", "shape": [480, 640, 3],
        ...                                "names": ["height", "width", "channels"]},
        ...     "observation.state": {"dtype": "float32", "shape": [6]}}})
        >>> info.cameras[0].height, info.cameras[0].width, info.state_size, info.action_size
        (480, 640, 6, None)

    Raises:
        ConfigError: an unreadable file, no ``features`` table, a bad ``fps`` or shape.
    """
    if isinstance(source, Mapping):
        info: Any = dict(source)
        where = "LeRobot info"
    else:
        path = Path(source)
        where = f"LeRobot info {str(path)!r}"
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {where}: {exc}") from None
        info = json_object(text, where)
    features = info.get("features")
    if not isinstance(features, Mapping):
        raise ConfigError(f"{where} should have a 'features' table, but it has none")
    cameras = tuple(
        LeRobotCamera(key, *_hw(key, feat, where), dtype=feat["dtype"])
        for key, feat in features.items()
        if isinstance(feat, Mapping) and feat.get("dtype") in _CAMERA_DTYPES
    )
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        raise ConfigError(f"{where} should have a positive 'fps', but got fps={fps!r}")
    return LeRobotInfo(
        codebase_version=str(info.get("codebase_version", "")),
        fps=float(fps),
        cameras=cameras,
        total_episodes=info.get("total_episodes"),
        total_frames=info.get("total_frames"),
        state_size=_vector_size(STATE_KEY, features, where),
        action_size=_vector_size(ACTION_KEY, features, where),
        features=tuple(str(k) for k in features),
    )


# -- the episode list --------------------------------------------------------------------------


def _episodes_jsonl(path: Path) -> tuple[list[int], list[int]]:
    """v2.x: ``meta/episodes.jsonl``, one ``{"episode_index", "length", "tasks"}`` object a line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read LeRobot episodes {str(path)!r}: {exc}") from None
    indices: list[int] = []
    lengths: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"LeRobot episodes {str(path)!r} line {lineno}"
        entry = json_object(line, where)
        for name, out in (("episode_index", indices), ("length", lengths)):
            value = entry.get(name)
            if not _is_count(value) or value < 0:
                raise ConfigError(f"{where}: {name!r} should be a non-negative integer, but got {name}={value!r}")
            out.append(value)
    return indices, lengths


def _episodes_parquet(folder: Path) -> tuple[list[int], list[int]]:
    """v3.0: ``meta/episodes/chunk-XXX/file-XXX.parquet``, read in (chunk, file) order."""
    files = []
    for path in folder.glob("chunk-*/file-*.parquet") if folder.is_dir() else ():
        match = _V3_EPISODE_FILE.fullmatch(path.relative_to(folder).as_posix())
        if match is not None:
            files.append(((int(match[1]), int(match[2])), path))
    if not files:
        raise ConfigError(
            f"LeRobot v3.0 episodes should be Parquet files at {str(folder)!r}/chunk-XXX/file-XXX.parquet, "
            f"but there are none"
        )
    indices: list[int] = []
    lengths: list[int] = []
    for _, path in sorted(files):
        where = f"LeRobot episodes {str(path)!r}"
        try:
            names = pq.read_schema(path).names
            missing = [c for c in ("episode_index", "length") if c not in names]
            if missing:
                raise ConfigError(f"{where} should have the column {missing[0]!r}, but its columns are {names}")
            table = pq.read_table(path, columns=["episode_index", "length"])
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"cannot read {where} as Parquet: {exc}") from None
        for name, out in (("episode_index", indices), ("length", lengths)):
            column = table.column(name)
            if not pa.types.is_integer(column.type):
                raise ConfigError(f"{where}: column {name!r} should hold integers, but its type is {column.type}")
            values = column.to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
            if not len(bad):
                bad = np.flatnonzero(values < 0)
            if len(bad):
                row = int(bad[0])
                raise ConfigError(
                    f"{where} row {row}: {name!r} should be a non-negative integer, "
                    f"but got {name}={column[row].as_py()!r}"
                )
            out.extend(values.astype(np.int64).tolist())
    return indices, lengths


def read_lerobot_metadata(root: str | Path) -> LeRobotMetadata:
    """Read a LeRobot dataset's ``meta/info.json`` and its episode list.

    Args:
        root: the dataset folder, the one that holds ``meta/`` (a local copy; nothing is
            downloaded).

    Returns:
        The info and every episode's index and length, in the episode files' order.

    Raises:
        ConfigError: not a dataset folder, a missing or unreadable file, an unsupported
            ``codebase_version``, or a bad episode entry (naming the file and line or row).
    """
    root = Path(root)
    if not root.is_dir():
        hint = " (pass the dataset folder, the one holding meta/)" if root.name == "info.json" else ""
        raise ConfigError(
            f"LeRobot dataset {str(root)!r} should be a folder holding meta/info.json, but it is not a folder{hint}"
        )
    meta = root / "meta"
    info_path = meta / "info.json"
    if not info_path.is_file():
        hint = " (pass the dataset folder, the one holding meta/)" if (root / "info.json").is_file() else ""
        raise ConfigError(f"{str(root)!r} is not a LeRobot dataset: {str(info_path)!r} does not exist{hint}")
    info = read_lerobot_info(info_path)
    version = info.codebase_version
    if version.startswith("v2."):
        path = meta / "episodes.jsonl"
        if not path.is_file():
            raise ConfigError(
                f"LeRobot {version} dataset {str(root)!r} should list its episodes in "
                f"{str(path)!r}, but that file does not exist"
            )
        indices, lengths = _episodes_jsonl(path)
    elif version.startswith("v3."):
        indices, lengths = _episodes_parquet(meta / "episodes")
    else:
        raise ConfigError(
            f"LeRobot info {str(info_path)!r}: codebase_version should be v2.0, v2.1 or v3.0, "
            f"but got codebase_version={version!r}"
        )
    return LeRobotMetadata(root=root, info=info, episode_index=tuple(indices), length=tuple(lengths))


# -- delta_timestamps and the rows -------------------------------------------------------------


def frame_offsets(
    info: LeRobotInfo, delta_timestamps: Mapping[str, Sequence[float]] | None
) -> dict[str, tuple[int, ...]]:
    """``delta_timestamps`` (seconds per key) as frame offsets: ``round(offset x fps)``.

    Raises:
        ConfigError: a key that is neither a camera nor a feature of the dataset, a key with
            no offsets, a non-finite offset, or one more than 1e-4 s away from a whole frame
            (LeRobot refuses those too).
    """
    if delta_timestamps is None:
        return {}
    if not isinstance(delta_timestamps, Mapping):
        raise ConfigError(f"delta_timestamps should map keys to lists of seconds, but got {delta_timestamps!r}")
    cameras = [c.name for c in info.cameras]
    known = set(info.features) | set(cameras)
    out: dict[str, tuple[int, ...]] = {}
    for key, seconds in delta_timestamps.items():
        if key not in known:
            others = sorted(k for k in info.features if k not in cameras)
            raise ConfigError(
                f"delta_timestamps key {key!r} is neither a camera nor a feature of the dataset; "
                f"its cameras are {cameras} and its other features {others}"
            )
        if isinstance(seconds, (str, bytes)) or not isinstance(seconds, (Sequence, np.ndarray)) or not len(seconds):
            raise ConfigError(
                f"delta_timestamps[{key!r}] should be a non-empty list of offsets in seconds, but got {seconds!r}"
            )
        frames = []
        for s in seconds:
            if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) or not math.isfinite(s):
                raise ConfigError(f"delta_timestamps[{key!r}] should hold finite numbers of seconds, but got {s!r}")
            exact = float(s) * info.fps
            whole = round(exact)
            if abs(exact - whole) / info.fps > _TOLERANCE_S:
                raise ConfigError(
                    f"delta_timestamps[{key!r}] offset {s!r} s is not a whole number of frames at "
                    f"fps={info.fps:g} ({s!r} x {info.fps:g} = {exact:g}); use multiples of "
                    f"1/fps = {1 / info.fps:g} s"
                )
            frames.append(whole)
        out[key] = tuple(frames)
    return out


def _select_cameras(info: LeRobotInfo, cameras: Sequence[str] | None) -> tuple[LeRobotCamera, ...]:
    if cameras is None:
        return info.cameras
    available = [c.name for c in info.cameras]
    if isinstance(cameras, str) or not isinstance(cameras, Sequence):
        raise ConfigError(
            f"cameras should be a list of camera keys, but got cameras={cameras!r}; "
            f"the dataset's cameras are {available}"
        )
    by_name = {c.name: c for c in info.cameras}
    for name in cameras:
        if name not in by_name:
            raise ConfigError(
                f"cameras={list(cameras)!r} names {name!r}, which is not a camera of the dataset; "
                f"its cameras are {available}"
            )
    if len(set(cameras)) != len(cameras):
        raise ConfigError(f"cameras should name each camera once, but got cameras={list(cameras)!r}")
    return tuple(by_name[name] for name in cameras)


def _select_episodes(meta: LeRobotMetadata, episodes: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
    index = np.asarray(meta.episode_index, dtype=np.int64)
    length = np.asarray(meta.length, dtype=np.int64)
    if episodes is None:
        return index, length
    if isinstance(episodes, str) or not isinstance(episodes, Sequence) or not all(_is_count(e) for e in episodes):
        raise ConfigError(f"episodes should be a list of episode indices, but got episodes={episodes!r}")
    if len(set(episodes)) != len(episodes):
        raise ConfigError(f"episodes should name each episode once, but got episodes={list(episodes)!r}")
    present = set(meta.episode_index)
    unknown = [e for e in episodes if e not in present]
    if unknown:
        span = f"{int(index.min())}..{int(index.max())}" if len(index) else "none"
        raise ConfigError(
            f"episodes={list(episodes)!r} names episode {unknown[0]}, which the dataset "
            f"{str(meta.root)!r} does not list ({len(index)} episodes, indices {span})"
        )
    keep = np.isin(index, np.asarray(episodes, dtype=np.int64))
    return index[keep], length[keep]


def lerobot_rows(
    source: str | Path | LeRobotMetadata,
    delta_timestamps: Mapping[str, Sequence[float]] | None = None,
    *,
    cameras: Sequence[str] | None = None,
    episodes: Sequence[int] | None = None,
) -> pa.Table:
    """One metadata row per training sample (every frame of every episode) of a LeRobot dataset.

    Args:
        source: the dataset folder (the one holding ``meta/``), or what
            :func:`read_lerobot_metadata` returned for it.
        delta_timestamps: LeRobot's sampling recipe: offsets in seconds per key, e.g.
            ``{"observation.images.top": [-0.1, 0.0], "action": [0.0, 0.1, ...]}``. Keys may
            name cameras and other features; any other key is an error.
        cameras: the camera keys the policy uses, in its order (default: every camera of the
            dataset, in ``info.json`` order); the others are dropped.
        episodes: only these episode indices (default: all). Rows keep the episode files'
            order either way.

    Returns:
        A table with one row per frame, in episode-file order then frame order:

        ==================  ==============================================================
        ``key``             ``"ep{episode_index:06d}/{frame_index:06d}"`` (unique; sorted
                            when the episode files list episodes in index order)
        ``episode_index``   int64
        ``frame_index``     int64, 0 .. length-1 within the episode
        ``cameras``         list<struct<name: string, frames, height, width: int64>>, one
                            entry per selected camera; ``frames`` = the number of offsets
                            for its key (1 without one)
        ``proprio_tokens``  int64: the number of ``observation.state`` offsets (1 without
                            a key), 0 if the dataset has no ``observation.state``
        ``action_tokens``   int64: the number of ``action`` offsets (1 without a key), 0 if
                            the dataset has no ``action``
        ``state_values``    int64: state offsets x values per state vector
        ``action_values``   int64: action offsets x values per action vector
        ``padded_frames``   int64: how many of the row's camera frames LeRobot clamps to the
                            episode (see NOTE [ Clamped frames ])
        ==================  ==============================================================

        The token columns follow one token per vector, the way pi0 feeds its state (one
        token) and its action chunk (one token per step): they are what a default
        :class:`~tokenbucket.tokens.spec.TokenSpec` reads. A per-value tokenizer (OpenVLA's 7 action
        tokens for 7 action values) reads ``state_values`` / ``action_values`` instead
        (``TokenSpec(action="action_values")``).

    Raises:
        ConfigError: see :func:`read_lerobot_metadata` and :func:`frame_offsets`; an unknown
            camera (listing the dataset's) or episode.

    Example:
        >>> import json, os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> os.makedirs(os.path.join(root, "meta"))
        >>> info = {"codebase_version": "v2.1", "fps": 10, "features": {
        ...     "observation.image": {"dtype": "video", "shape": [96, 96, 3]},
        ...     "observation.state": {"dtype": "float32", "shape": [2]},
        ...     "action": {"dtype": "float32", "shape": [2]}}}
        >>> with open(os.path.join(root, "meta", "info.json"), "w") as f:
        ...     _ = f.write(json.dumps(info))
        >>> with open(os.path.join(root, "meta", "episodes.jsonl"), "w") as f:
        ...     _ = f.write('{"episode_index": 0, "length": 3, "tasks": ["push the T"]}\\n')
        >>> rows = lerobot_rows(root, {"observation.image": [-0.1, 0.0], "action": [0.0, 0.1, 0.2, 0.3]})
        >>> rows.column("key").to_pylist()
        ['ep000000/000000', 'ep000000/000001', 'ep000000/000002']
        >>> rows.column("cameras")[0].as_py()
        [{'name': 'observation.image', 'frames': 2, 'height': 96, 'width': 96}]
        >>> rows.column("padded_frames").to_pylist()  # frame 0 has no frame before it
        [1, 0, 0]
        >>> rows.column("proprio_tokens")[0].as_py(), rows.column("action_tokens")[0].as_py()
        (1, 4)
    """
    if isinstance(source, LeRobotMetadata):
        meta = source
    elif isinstance(source, (str, Path)):
        meta = read_lerobot_metadata(source)
    else:
        raise ConfigError(
            f"source should be a LeRobot dataset folder or LeRobotMetadata, but got "
            f"{type(source).__name__} (a LeRobotInfo has no episode list: pass the folder)"
        )
    info = meta.info
    offsets = frame_offsets(info, delta_timestamps)
    cams = _select_cameras(info, cameras)
    episode, length = _select_episodes(meta, episodes)

    n = int(length.sum())
    n_cams = len(cams)
    if n * n_cams >= 2**31:
        raise ConfigError(
            f"{n:,} frames x {n_cams} cameras is more than one table holds; split the dataset with episodes="
        )
    starts = np.cumsum(length) - length
    episode_col = np.repeat(episode, length)
    frame_col = np.arange(n, dtype=np.int64) - np.repeat(starts, length)
    length_col = np.repeat(length, length)

    # NOTE [ Clamped frames ]
    # LeRobot loads frame_index + round(offset x fps) for each offset, clamped into
    # [0, length - 1], and flags the clamped ones in `<key>_is_pad`. Clamped frames are still
    # decoded and fed to the model, so they count as tokens like any other; padded_frames only
    # says how many of them repeat an edge frame. One pass per (camera, offset), each over all
    # rows at once: no Python loop over frames.
    padded = np.zeros(n, dtype=np.int64)
    for cam in cams:
        for step in offsets.get(cam.name, ()):
            if step:
                target = frame_col + step
                padded += (target < 0) | (target >= length_col)

    def count(key: str, size: int | None) -> tuple[int, int]:
        if size is None:
            return 0, 0
        steps = len(offsets.get(key, (0,)))
        return steps, steps * size

    proprio, state_values = count(STATE_KEY, info.state_size)
    action, action_values = count(ACTION_KEY, info.action_size)

    # the cameras column: the same list of selected cameras on every row
    names = pa.array([c.name for c in cams], pa.string())
    per_cam = np.array([[len(offsets.get(c.name, (0,))), c.height, c.width] for c in cams], dtype=np.int64)
    per_cam = per_cam.reshape(n_cams, 3)
    slot = np.tile(np.arange(n_cams, dtype=np.int64), n)
    elements = pa.StructArray.from_arrays(
        [names.take(pa.array(slot)), *(pa.array(per_cam[slot, j]) for j in range(3))],
        names=["name", "frames", "height", "width"],
    )
    list_offsets = (np.arange(n + 1, dtype=np.int64) * n_cams).astype(np.int32)
    camera_col = pa.ListArray.from_arrays(pa.array(list_offsets), elements)

    def padded6(values: np.ndarray) -> pa.Array:
        return pc.utf8_lpad(pc.cast(pa.array(values), pa.string()), width=6, padding="0")

    key_col = pc.binary_join_element_wise("ep", padded6(episode_col), "/", padded6(frame_col), "")

    def const(value: int) -> pa.Array:
        return pa.array(np.full(n, value, dtype=np.int64))

    return pa.table(
        {
            "key": key_col,
            "episode_index": pa.array(episode_col),
            "frame_index": pa.array(frame_col),
            "cameras": camera_col,
            "proprio_tokens": const(proprio),
            "action_tokens": const(action),
            "state_values": const(state_values),
            "action_values": const(action_values),
            "padded_frames": pa.array(padded),
        }
    )
