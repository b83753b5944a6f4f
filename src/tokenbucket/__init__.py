"""tokenbucket: memory-safe shape buckets for multi-camera video and VLA training.

One subpackage per stage; each imports only the stages above it in this map (tests/test_layout.py
enforces it), and ``_exceptions``, ``_values`` (with ``_arrays``, its vectorised half), ``_search``
and ``_config`` sit under them all::

    models/    one module per Hugging Face model family: its config keys, exact image tokens, stages, inputs
       ▼
    tokens/    what a sample costs in tokens: TokenSpec, metadata readers, the breakdown, LeRobot
       ▼
    cost/      what a batch shape costs in bytes and FLOPs: ModelSpec, CostModel, GPUs, ledger, profiles
       ▼
    plan/      bucket bounds and batch sizes that fit the budget (BucketPlan), packing, the manifest
       ▼
    train/     TokenBucketDataset, samplers, collates, BatchInfo, risk checks before the GPU
       ▼
    stream/    the same for webdataset and other iterable sources
       ▼
    monitor/   per-bucket latency and memory while training, sinks, the report
       ▼
    cli/       the ``tokenbucket`` command, one module per verb, and the demo

``testing`` holds the seeded reference workloads. Every public name is importable from here and
imported on first use (NOTE [ Lazy public API ]). Errors form one family rooted at
:class:`TokenbucketError` (see ``_exceptions.py``).
"""

import importlib
from typing import TYPE_CHECKING, Any

from tokenbucket._exceptions import (
    ConfigError,
    DuplicateKeyError,
    ImageTooSmallError,
    InvalidValueError,
    ManifestMismatchWarning,
    MetadataError,
    MissingColumnError,
    OOMRiskError,
    OOMRiskWarning,
    OversizeError,
    PlanDriftWarning,
    PlanError,
    StateError,
    TokenbucketError,
    UsageError,
)

# NOTE [ Lazy public API ]
# Each name is imported from its module on first use, so a process that needs one stage (a
# sampler in a training job, the cost model in a notebook) does not pay for the others'
# imports (pyarrow alone is ~27 MiB; see benchmarks/bench_sampler.py). The names whose module needs an
# optional extra (the trainer integrations, profile_dit) are here too: `import tokenbucket` imports
# none of them, and the extra is needed only by the first use of such a name
# (tests/test_public_api.py holds both, and that examples and guides import from here).
_LAZY = {
    "DiTConfig": "models",
    "VAEFactors": "models",
    "read_pipeline": "models",
    "smart_resize": "models.qwen2_vl",
    "LeRobotSource": "tokens.lerobot_mix",
    "lerobot_mixture": "tokens.lerobot_mix",
    "split_mixture_key": "tokens.lerobot_mix",
    "Batch": "train.batch",
    "FrozenFieldError": "train.batch",
    "ModalityCollate": "train.modal",
    "ModalityKeys": "train.modal",
    "CameraSpec": "tokens.spec",
    "ColumnMap": "tokens.spec",
    "CountRule": "tokens.spec",
    "TokenSpec": "tokens.spec",
    "read_metadata": "tokens.metadata",
    "Breakdowns": "tokens.breakdown",
    "CameraTokens": "tokens.breakdown",
    "TokenBreakdown": "tokens.breakdown",
    "breakdown_sample": "tokens.breakdown",
    "breakdown_table": "tokens.breakdown",
    "lerobot_rows": "tokens.lerobot",
    "read_lerobot_metadata": "tokens.lerobot",
    "HFConfig": "tokens.hf",
    "token_spec_from_hf": "tokens.hf",
    "ModelSpec": "cost.model",
    "CostModel": "cost.memory",
    "FlopsEstimate": "cost.memory",
    "MemoryEstimate": "cost.memory",
    "GPU": "cost.gpus",
    "GPUS": "cost.gpus",
    "get_gpu": "cost.gpus",
    "gpu_budget_bytes": "cost.gpus",
    "ledger_with_whatifs": "cost.ledger",
    "shape_ledger": "cost.ledger",
    "StepTime": "cost.step_time",
    "CalibratedCostModel": "cost.calibration",
    "Calibration": "cost.calibration",
    "load_calibration": "cost.calibration",
    "calibrate_log": "monitor.calibrate",
    "MeasuredCostModel": "cost.profile",
    "profile_memory": "cost.profile",
    "ReferenceTransformer": "cost.reference",
    "StagedModel": "cost.hf_model",
    "load_hf_config": "cost.hf_model",
    "staged_from_config": "cost.hf_model",
    "Sample": "cost.staged",
    "StagedCostModel": "cost.staged",
    "TrainSetup": "cost.staged",
    "StagedLengthModel": "cost.staged_length",
    "StagedPackedModel": "cost.staged_packed",
    "LeRobotPolicy": "cost.lerobot_policy",
    "PolicyLengthModel": "cost.lerobot_plan",
    "DiTCostModel": "cost.dit",
    "DiTEstimate": "cost.dit",
    "DiTLatentCollate": "train.video_dit",
    "video_sampler": "train.video_dit",
    "DiTSetup": "cost.dit",
    "profile_dit": "cost.dit_profile",  # imports diffusers and peft: only on first use
    "Bucket": "plan.bucket_plan",
    "BucketPlan": "plan.bucket_plan",
    "LengthHistogram": "plan.bucket_plan",
    "check_plan": "plan.buckets",
    "plan_buckets": "plan.buckets",
    "plan_buckets_2d": "plan.buckets_2d",
    "plan_from_bounds": "plan.buckets",
    "plan_packing_2d": "plan.packing_2d",
    "VideoBucket": "plan.video_buckets",
    "VideoPlan": "plan.video_buckets",
    "check_bucket_config": "plan.video_buckets",
    "plan_video_buckets": "plan.video_buckets",
    "Manifest": "plan.manifest",
    "build_manifest": "plan.manifest",
    "load_manifest": "plan.manifest",
    "BatchInfo": "train.batch",
    "Segment": "train.batch",
    "token_layout": "train.batch",
    "BucketCollate": "train.collate",
    "TokenBucketDataset": "train.collate",
    "BucketBatchSampler": "train.sampler",
    "plan_id_of": "train.sampler",
    "PackedBatchSampler2D": "train.packing_2d",
    "PackedBatchSampler": "train.packing",
    "PackedCollate": "train.packing",
    "PackedModalityCollate": "train.packed_modal",
    "PackedTowerCollate": "train.packed_tower",
    "block_diagonal_mask": "train.packing",
    "RiskSplitSampler": "train.risk",
    "WarmupRecord": "train.warmup",
    "warm_up": "train.warmup",
    # the trainer integrations import their optional extra (lightning, accelerate, transformers)
    "BucketSamplerCallback": "train.lightning",
    "prepare_loader": "train.accelerate",
    "tracker_sink": "train.accelerate",
    "BucketTrainer": "train.hf_trainer",
    "StreamBucketer": "stream.bucketer",
    "BucketedStream": "stream.dataset",
    "StreamCollate": "stream.dataset",
    "index_shards": "stream.wds",
    "BucketMonitor": "monitor.hooks",
    "format_summary": "monitor.stats",
    "JsonlSink": "monitor.sinks",
    "LoggingSink": "monitor.sinks",
    "TensorBoardSink": "monitor.sinks",
    "read_events": "monitor.report",
    "write_report": "monitor.report",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenbucket' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tokenbucket.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from tokenbucket.cost.calibration import CalibratedCostModel, Calibration, load_calibration
    from tokenbucket.cost.dit import DiTCostModel, DiTEstimate, DiTSetup
    from tokenbucket.cost.dit_profile import profile_dit
    from tokenbucket.cost.gpus import GPU, GPUS, get_gpu, gpu_budget_bytes
    from tokenbucket.cost.hf_model import StagedModel, load_hf_config, staged_from_config
    from tokenbucket.cost.ledger import ledger_with_whatifs, shape_ledger
    from tokenbucket.cost.lerobot_plan import PolicyLengthModel
    from tokenbucket.cost.lerobot_policy import LeRobotPolicy
    from tokenbucket.cost.memory import CostModel, FlopsEstimate, MemoryEstimate
    from tokenbucket.cost.model import ModelSpec
    from tokenbucket.cost.profile import MeasuredCostModel, profile_memory
    from tokenbucket.cost.reference import ReferenceTransformer
    from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
    from tokenbucket.cost.staged_length import StagedLengthModel
    from tokenbucket.cost.staged_packed import StagedPackedModel
    from tokenbucket.cost.step_time import StepTime
    from tokenbucket.models import DiTConfig, VAEFactors, read_pipeline
    from tokenbucket.models.qwen2_vl import smart_resize
    from tokenbucket.monitor.calibrate import calibrate_log
    from tokenbucket.monitor.hooks import BucketMonitor
    from tokenbucket.monitor.report import read_events, write_report
    from tokenbucket.monitor.sinks import JsonlSink, LoggingSink, TensorBoardSink
    from tokenbucket.monitor.stats import format_summary
    from tokenbucket.plan.bucket_plan import Bucket, BucketPlan, LengthHistogram
    from tokenbucket.plan.buckets import check_plan, plan_buckets, plan_from_bounds
    from tokenbucket.plan.buckets_2d import plan_buckets_2d
    from tokenbucket.plan.manifest import Manifest, build_manifest, load_manifest
    from tokenbucket.plan.packing_2d import plan_packing_2d
    from tokenbucket.plan.video_buckets import VideoBucket, VideoPlan, check_bucket_config, plan_video_buckets
    from tokenbucket.stream.bucketer import StreamBucketer
    from tokenbucket.stream.dataset import BucketedStream, StreamCollate
    from tokenbucket.stream.wds import index_shards
    from tokenbucket.tokens.breakdown import Breakdowns, CameraTokens, TokenBreakdown, breakdown_sample, breakdown_table
    from tokenbucket.tokens.hf import HFConfig, token_spec_from_hf
    from tokenbucket.tokens.lerobot import lerobot_rows, read_lerobot_metadata
    from tokenbucket.tokens.lerobot_mix import LeRobotSource, lerobot_mixture, split_mixture_key
    from tokenbucket.tokens.metadata import read_metadata
    from tokenbucket.tokens.spec import CameraSpec, ColumnMap, CountRule, TokenSpec
    from tokenbucket.train.accelerate import prepare_loader, tracker_sink
    from tokenbucket.train.batch import Batch, BatchInfo, FrozenFieldError, Segment, token_layout
    from tokenbucket.train.collate import BucketCollate, TokenBucketDataset
    from tokenbucket.train.hf_trainer import BucketTrainer
    from tokenbucket.train.lightning import BucketSamplerCallback
    from tokenbucket.train.modal import ModalityCollate, ModalityKeys
    from tokenbucket.train.packed_modal import PackedModalityCollate
    from tokenbucket.train.packed_tower import PackedTowerCollate
    from tokenbucket.train.packing import PackedBatchSampler, PackedCollate, block_diagonal_mask
    from tokenbucket.train.packing_2d import PackedBatchSampler2D
    from tokenbucket.train.risk import RiskSplitSampler
    from tokenbucket.train.sampler import BucketBatchSampler, plan_id_of
    from tokenbucket.train.warmup import WarmupRecord, warm_up

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchInfo",
    "Breakdowns",
    "Bucket",
    "BucketBatchSampler",
    "BucketCollate",
    "BucketMonitor",
    "BucketPlan",
    "BucketSamplerCallback",
    "BucketTrainer",
    "BucketedStream",
    "CalibratedCostModel",
    "Calibration",
    "CameraSpec",
    "CameraTokens",
    "ColumnMap",
    "ConfigError",
    "CostModel",
    "CountRule",
    "DiTConfig",
    "DiTCostModel",
    "DiTEstimate",
    "DiTLatentCollate",
    "DiTSetup",
    "DuplicateKeyError",
    "FlopsEstimate",
    "FrozenFieldError",
    "GPU",
    "GPUS",
    "HFConfig",
    "ImageTooSmallError",
    "InvalidValueError",
    "JsonlSink",
    "LeRobotPolicy",
    "LeRobotSource",
    "LengthHistogram",
    "LoggingSink",
    "Manifest",
    "ManifestMismatchWarning",
    "MeasuredCostModel",
    "MemoryEstimate",
    "MetadataError",
    "MissingColumnError",
    "ModalityCollate",
    "ModalityKeys",
    "ModelSpec",
    "OOMRiskError",
    "OOMRiskWarning",
    "OversizeError",
    "PackedBatchSampler",
    "PackedBatchSampler2D",
    "PackedCollate",
    "PackedModalityCollate",
    "PackedTowerCollate",
    "PlanDriftWarning",
    "PlanError",
    "PolicyLengthModel",
    "ReferenceTransformer",
    "RiskSplitSampler",
    "Sample",
    "Segment",
    "StagedCostModel",
    "StagedLengthModel",
    "StagedModel",
    "StagedPackedModel",
    "StateError",
    "StepTime",
    "StreamBucketer",
    "StreamCollate",
    "TensorBoardSink",
    "TokenBreakdown",
    "TokenBucketDataset",
    "TokenSpec",
    "TokenbucketError",
    "TrainSetup",
    "UsageError",
    "VAEFactors",
    "VideoBucket",
    "VideoPlan",
    "WarmupRecord",
    "block_diagonal_mask",
    "breakdown_sample",
    "breakdown_table",
    "build_manifest",
    "calibrate_log",
    "check_bucket_config",
    "check_plan",
    "format_summary",
    "get_gpu",
    "gpu_budget_bytes",
    "index_shards",
    "ledger_with_whatifs",
    "lerobot_mixture",
    "lerobot_rows",
    "load_calibration",
    "load_hf_config",
    "load_manifest",
    "plan_buckets",
    "plan_buckets_2d",
    "plan_from_bounds",
    "plan_id_of",
    "plan_packing_2d",
    "plan_video_buckets",
    "prepare_loader",
    "profile_dit",
    "profile_memory",
    "read_events",
    "read_lerobot_metadata",
    "read_metadata",
    "read_pipeline",
    "shape_ledger",
    "smart_resize",
    "split_mixture_key",
    "staged_from_config",
    "token_layout",
    "token_spec_from_hf",
    "tracker_sink",
    "video_sampler",
    "warm_up",
    "write_report",
]
