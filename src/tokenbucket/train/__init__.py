"""train stage: the plan turned into DataLoader batches.

sampler.py     BucketBatchSampler: deterministic, rank-aware, resumable batches of indices
collate.py     TokenBucketDataset and BucketCollate (pads a batch to its bucket's shape)
batch.py       BatchInfo, Segment / token_layout, pad_rows: what every collate hands the model and monitor
packing.py     PackedBatchSampler, PackedCollate, block-diagonal and flex masks
risk.py        a batch predicted above the risk threshold, caught before the GPU; RiskSplitSampler
"""
