"""LeRobot dataset metadata (``meta/info.json``) → per-camera shapes.

The first piece of the LeRobot adapter: read the camera features of a v2.x / v3.0
``info.json`` and turn a sampling recipe (``delta_timestamps``) into a per-camera-schema
sample that :func:`tokenbucket.breakdown.breakdown_sample` counts.

Camera features are those with dtype ``video`` or ``image``. Their ``shape`` is usually
``[height, width, channels]`` but some datasets store ``[channels, height, width]``; the
feature's ``names`` say which, and we read them rather than guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import ConfigError

__all__ = ["LeRobotCamera", "LeRobotInfo", "read_lerobot_info"]

_CAMERA_DTYPES = ("video", "image")


@dataclass(frozen=True)
class LeRobotCamera:
    """One camera feature: its key and frame size in pixels."""

    name: str
    height: int
    width: int
    dtype: str


@dataclass(frozen=True)
class LeRobotInfo:
    """What token accounting needs from a LeRobot ``info.json``."""

    codebase_version: str
    fps: float
    cameras: tuple[LeRobotCamera, ...]
    total_episodes: int | None
    total_frames: int | None

    def sample(self, delta_timestamps: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
        """A per-camera-schema sample: ``{"cameras": [{name, frames, height, width}, ...]}``.

        Each camera's frame count is the number of offsets ``delta_timestamps`` gives for its
        key (LeRobot loads one frame per offset, padding at episode edges); 1 when the key is
        absent.
        """
        deltas = dict(delta_timestamps or {})
        cams = []
        for cam in self.cameras:
            offsets = deltas.get(cam.name, [0.0])
            cams.append({"name": cam.name, "frames": len(offsets), "height": cam.height, "width": cam.width})
        # Non-camera keys (state, action) are not vision; TokenSpec rules count them.
        return {"cameras": cams}


def _hw(key: str, feature: Mapping[str, Any]) -> tuple[int, int]:
    shape = list(feature.get("shape") or [])
    names = feature.get("names")
    if len(shape) != 3:
        raise ConfigError(f"camera feature {key!r} should have a 3-d shape, but got shape={shape!r}")
    if isinstance(names, Sequence) and not isinstance(names, str) and len(names) == 3:
        lowered = [str(n).lower() for n in names]
        if "height" in lowered and "width" in lowered:
            return int(shape[lowered.index("height")]), int(shape[lowered.index("width")])
    # No usable names: channels are the small axis (1, 3 or 4).
    if shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4):
        return int(shape[1]), int(shape[2])
    return int(shape[0]), int(shape[1])


def read_lerobot_info(source: str | Path | Mapping[str, Any]) -> LeRobotInfo:
    """Read a LeRobot ``meta/info.json`` (a path, or the parsed dict).

    Example:
        >>> info = read_lerobot_info({"codebase_version": "v2.1", "fps": 30, "features": {
        ...     "observation.images.top": {"dtype": "video", "shape": [480, 640, 3],
        ...                                "names": ["height", "width", "channels"]}}})
        >>> info.cameras[0].height, info.cameras[0].width
        (480, 640)
    """
    if isinstance(source, Mapping):
        info = dict(source)
    else:
        path = Path(source)
        try:
            info = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read LeRobot info {str(path)!r}: {exc}") from None
    features = info.get("features")
    if not isinstance(features, Mapping):
        raise ConfigError("LeRobot info should have a 'features' table, but it has none")
    cameras = tuple(
        LeRobotCamera(key, *_hw(key, feat), dtype=feat["dtype"])
        for key, feat in features.items()
        if isinstance(feat, Mapping) and feat.get("dtype") in _CAMERA_DTYPES
    )
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0:
        raise ConfigError(f"LeRobot info should have a positive 'fps', but got fps={fps!r}")
    return LeRobotInfo(
        codebase_version=str(info.get("codebase_version", "")),
        fps=float(fps),
        cameras=cameras,
        total_episodes=info.get("total_episodes"),
        total_frames=info.get("total_frames"),
    )
