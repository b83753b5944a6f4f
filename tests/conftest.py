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


# NOTE [ Long tests first ]
# make test's parallel pass splits the collected tests into one run of equal count per worker
# (xdist's worksteal), and a worker that runs out takes some of another's not-yet-started ones.
# The slow tier is a tenth of the tests and most of the time; where one of them (a model built at
# its published size, a crash loop, a trainer's own launcher) is left for the end, one worker runs
# it alone while the other has nothing left. So each worker's run starts with its share of the
# slow tests, dealt in turn, and ends with fast ones that either worker can take over. Every
# worker computes the same order, as xdist requires; a run in one process keeps pytest's order.
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers < 2:
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    size = -(-len(fast) // workers)
    items[:] = [t for w in range(workers) for t in slow[w::workers] + fast[w * size : (w + 1) * size]]
