"""tokenbucket: memory-safe shape buckets for multi-camera video and VLA training.

The data flow, one module per stage::

    metadata rows (Parquet / JSONL / CSV)
       │  metadata.py    read into one Arrow table
       ▼
    TokenSpec ──► breakdown.py   per-sample tokens: vision (per camera) + text + proprio
       │          (spec.py)      + action + memory + extras; vectorised, plus a scalar path
       ▼
    (next stages: cost model → planner → manifest → sampler / collate → monitor)

``cli.py`` holds the ``tokenbucket`` command; ``testing.py`` the seeded reference workloads.
Errors form one family rooted at :class:`TokenbucketError` (see ``_exceptions.py``).
"""

from tokenbucket._exceptions import (
    ConfigError,
    DuplicateKeyError,
    ImageTooSmallError,
    InvalidValueError,
    MetadataError,
    MissingColumnError,
    TokenbucketError,
)
from tokenbucket.breakdown import (
    Breakdowns,
    CameraTokens,
    TokenBreakdown,
    breakdown_sample,
    breakdown_table,
)
from tokenbucket.metadata import read_metadata
from tokenbucket.spec import CameraSpec, ColumnMap, CountRule, TokenSpec

__version__ = "0.1.0"

__all__ = [
    "Breakdowns",
    "CameraSpec",
    "CameraTokens",
    "ColumnMap",
    "ConfigError",
    "CountRule",
    "DuplicateKeyError",
    "ImageTooSmallError",
    "InvalidValueError",
    "MetadataError",
    "MissingColumnError",
    "TokenBreakdown",
    "TokenSpec",
    "TokenbucketError",
    "breakdown_sample",
    "breakdown_table",
    "read_metadata",
]
