"""tokenbucket: memory-safe shape buckets for multi-camera video and VLA training.

The data flow, one module per stage::

    sources/     a dataset's own metadata as rows, no pixels decoded (lerobot.py: LeRobot)
       ▼
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
       ▼
    plan.py      bucket bounds and batch sizes that fit the budget (BucketPlan)
       ▼
    manifest.py  one Parquet row per sample + the plan: the contract with training
       ▼
    sampler.py   BucketBatchSampler: deterministic, DDP-correct, resumable batches
    collate.py   TokenBucketDataset + BucketCollate: bucket shapes, masks, BatchInfo;
       │         risk.py: a batch predicted above the risk threshold is caught here
       ▼
    monitor.py   BucketMonitor: per-bucket latency, tokens/s, predicted vs measured memory,
       │         drift, the OOM guard; sinks.py: JSONL, logging, TensorBoard, callables
       ▼
    report.py    the run log read back: per-bucket table, plots, one HTML page

    stream.py    the same plan for streams: StreamBucketer buckets samples as they arrive
                 (wds.py: the webdataset stage and the shard index for equal steps)
    packing.py   whole samples packed into rows, with block-diagonal masks and varlen offsets

``cli.py`` holds the ``tokenbucket`` command; ``testing.py`` the seeded reference workloads.
Every public name is imported on first use (NOTE [ Lazy public API ]).
Errors form one family rooted at :class:`TokenbucketError` (see ``_exceptions.py``).
"""

from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import (
    ConfigError,
    DuplicateKeyError,
    ImageTooSmallError,
    InvalidValueError,
    MetadataError,
    MissingColumnError,
    OOMRiskError,
    OOMRiskWarning,
    PlanDriftWarning,
    TokenbucketError,
)

# NOTE [ Lazy public API ]
# Each name is imported from its module on first use, so a process that needs one stage (a
# sampler in a training job, the cost model in a notebook) does not pay for the others'
# imports (pyarrow alone is ~27 MiB; see benchmarks/bench_sampler.py).
_LAZY = {
    "Breakdowns": "breakdown", "CameraTokens": "breakdown", "TokenBreakdown": "breakdown",
    "breakdown_sample": "breakdown", "breakdown_table": "breakdown",
    "CostModel": "cost", "FlopsEstimate": "cost", "MemoryEstimate": "cost",
    "GPU": "gpus", "GPUS": "gpus", "get_gpu": "gpus", "gpu_budget_bytes": "gpus",
    "ledger_with_whatifs": "ledger", "shape_ledger": "ledger",
    "read_metadata": "metadata",
    "ModelSpec": "model",
    "BucketMonitor": "monitor",
    "CameraSpec": "spec", "ColumnMap": "spec", "CountRule": "spec", "TokenSpec": "spec",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenbucket' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"tokenbucket.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from tokenbucket.breakdown import Breakdowns, CameraTokens, TokenBreakdown, breakdown_sample, breakdown_table
    from tokenbucket.cost import CostModel, FlopsEstimate, MemoryEstimate
    from tokenbucket.gpus import GPU, GPUS, get_gpu, gpu_budget_bytes
    from tokenbucket.ledger import ledger_with_whatifs, shape_ledger
    from tokenbucket.metadata import read_metadata
    from tokenbucket.model import ModelSpec
    from tokenbucket.monitor import BucketMonitor
    from tokenbucket.spec import CameraSpec, ColumnMap, CountRule, TokenSpec

__version__ = "0.1.0"

__all__ = [
    "Breakdowns",
    "BucketMonitor",
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
    "OOMRiskError",
    "OOMRiskWarning",
    "PlanDriftWarning",
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
