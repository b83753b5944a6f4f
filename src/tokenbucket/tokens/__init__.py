"""tokens stage: what each sample costs in tokens, from its metadata alone (no pixels decoded).

spec.py        TokenSpec, CameraSpec, CountRule, ColumnMap: the tokenizer's rules, frozen and validated
metadata.py    read_metadata / iter_metadata_batches: Parquet, JSONL and CSV files and part directories
breakdown.py   breakdown_sample (one mapping) and breakdown_table (a whole Arrow table), with rejects
_vision.py     the per-camera formulas and the vectorised vision pass breakdown.py runs
lerobot.py     LeRobot v2.x / v3.0 datasets as per-camera metadata rows
lerobot_mix.py several LeRobot datasets as one mixture: keys prefixed per source, sampling weights
"""
