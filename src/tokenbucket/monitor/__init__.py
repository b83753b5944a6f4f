"""monitor stage: per-bucket latency, memory and OOM risk while training, and the report after.

hooks.py       BucketMonitor: step records, drift, the OOM guard
_split.py      split_batch (a 2D bucket's parts priced at its image-token bound)
_grid.py       a 2D run's buckets as a grid (report)
stats.py       per-bucket aggregates (RunStats), summarize_events, format_summary
ranks.py       rank balance under data parallelism: each rank's step times gathered, the imbalance
sinks.py       JSONL, logging and TensorBoard sinks
report.py      a run log read back: table, plots, one HTML page
calibrate.py   a run log fitted into a Calibration (tokenbucket calibrate), and replan
"""
