"""Quickstart: count every sample's tokens from metadata, then look at the tail.

python examples/count_tokens.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from tokenbucket import TokenSpec, breakdown_sample, breakdown_table, read_metadata
from tokenbucket.testing import mixture_a


def main() -> None:
    # One sample: 4 cameras x 16 frames x 224 px at patch 14.
    one = breakdown_sample({"cameras": 4, "frames": 16, "height": 224, "width": 224}, TokenSpec(patch=14))
    print(f"one sample: {one.vision:,} vision tokens")

    # A dataset: write metadata to Parquet, read it back, count every row.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metadata.parquet"
        pq.write_table(mixture_a(100_000, seed=0), path)
        spec = TokenSpec(
            patch=14,
            camera_names=("top", "wrist"),
            overrides={"wrist": {"tokens_per_frame": 64}},  # a resampler on the wrist camera
        )
        result = breakdown_table(read_metadata(path), spec, on_invalid="reject")
        summary = result.summary()
        print(
            f"{summary['count']:,} samples, {summary['rejected']} rejected; L_total p50 {summary['p50']:,}, "
            f"p99 {summary['p99']:,}, max {summary['max']:,}"
        )
        print("share of tokens:", {k: f"{v:.1%}" for k, v in summary["share"].items()})


if __name__ == "__main__":
    main()
