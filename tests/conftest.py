from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

# NOTE [ The torchvision stand-in ] (tests/video_oracle/oracle.py): the stand-in and its oracle
# run only in a subprocess; collecting them (--doctest-modules) would import the stand-in here
# as torchvision, and put its folder on sys.path.
collect_ignore = ["video_oracle"]

# shared/ lies beside the checkout (on developer machines and in CI alike).
SHARED = os.environ.get("TOKENBUCKET_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees a launcher's distributed variables."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def lerobot_dir() -> str:
    path = os.path.join(SHARED, "data", "lerobot")
    if not os.path.isdir(path):
        if os.environ.get("CI"):  # CI always has shared/: its absence is a failure, not a skip
            pytest.fail(f"shared LeRobot metadata not found at {path}")
        pytest.skip(f"shared LeRobot metadata not found at {path}")
    return path
