"""stream stage: bucketing samples that arrive one at a time (webdataset shards, any ``IterableDataset``).

bucketer.py   StreamBucketer (the stage), StreamBatch, read_rejected
counting.py   ChunkCounter: a sample's key and metadata, its tokens counted a chunk at a time
emission.py   BucketBuffers (when a bucket emits), stream_batch_counts (equal steps)
state.py      StreamState (the checkpoint), StreamStats, ShardProgress (one pass's bookkeeping)
dataset.py    BucketedStream (an ``IterableDataset``), StreamCollate
estimate.py   estimate_plan / PlanEstimate: a plan from the first samples of a stream
wds.py        the webdataset glue: bucketed, index_shards, epoch_shards (the ``wds`` extra)
"""
