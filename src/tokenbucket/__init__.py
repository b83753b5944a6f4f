"""tokenbucket: memory-safe shape buckets for multi-camera video and VLA training.

The data flow, one module per stage::

    metadata rows (Parquet / JSONL / CSV)
       │  metadata.py    read into one Arrow table
       ▼
    TokenSpec ──► breakdown.py   per-sample tokens: vision (per camera) + text + proprio
       │          (spec.py)      + action + memory + extras; vectorised, plus a scalar path
       ▼
    ModelSpec ──► cost.py        bytes and FLOPs of a batch shape; GPU targets (gpus.py)
       │          (model.py)     profile.py: the same measured on fake tensors or CUDA,
       │                         on the user's model or the reference block (reference.py)
       ▼
    ledger.py    one sample's tokens as bytes and FLOPs, with what-ifs
    (next stages: planner → manifest → sampler / collate → monitor)

``cli.py`` holds the ``tokenbucket`` command; ``testing.py`` the seeded reference workloads.
``profile`` and ``reference`` import torch, so they are imported on use, not here.
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
from tokenbucket.cost import CostModel, FlopsEstimate, MemoryEstimate
from tokenbucket.gpus import GPU, GPUS, get_gpu, gpu_budget_bytes
from tokenbucket.ledger import ledger_with_whatifs, shape_ledger
from tokenbucket.metadata import read_metadata
from tokenbucket.model import ModelSpec
from tokenbucket.spec import CameraSpec, ColumnMap, CountRule, TokenSpec

__version__ = "0.1.0"

__all__ = [
    "Breakdowns",
    "CameraSpec",
    "CameraTokens",
    "ColumnMap",
    "ConfigError",
    "CostModel",
    "CountRule",
    "DuplicateKeyError",
    "FlopsEstimate",
    "GPU",
    "GPUS",
    "ImageTooSmallError",
    "InvalidValueError",
    "MemoryEstimate",
    "MetadataError",
    "MissingColumnError",
    "ModelSpec",
    "TokenBreakdown",
    "TokenSpec",
    "TokenbucketError",
    "breakdown_sample",
    "breakdown_table",
    "get_gpu",
    "gpu_budget_bytes",
    "ledger_with_whatifs",
    "read_metadata",
    "shape_ledger",
]
