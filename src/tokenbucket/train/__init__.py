"""train stage: the plan turned into DataLoader batches.

sampler.py     BucketBatchSampler: deterministic, rank-aware, resumable batches of indices
_dynamic.py    its dynamic cut each epoch: DynamicFill (by length), DynamicFill2D (length and image tokens)
collate.py     TokenBucketDataset (any map-style or Hugging Face dataset) and BucketCollate (flattened tokens)
modal.py       ModalityCollate: LeRobot / Qwen2-VL items batched by modality (stacked cameras or patches)
_cameras.py    its camera side: images and clips matched to the metadata's cameras, stacked or in patch streams
_patches.py    the patch streams: Qwen2-VL's patch cut, grids checked, images and videos concatenated
shaping.py     BatchShape: a batch's bucket, padded shape, predicted peak and risk, for the collates
_keys.py       the keys a collate does not know: stacked, padded with a mask, or listed
batch.py       BatchInfo, Batch (.to / .pin_memory), Segment / token_layout, pad_rows: what every collate hands on
packing.py     PackedBatchSampler, PackedCollate, block-diagonal and flex masks
packed_modal.py PackedModalityCollate: VLM samples packed whole into rows (both towers' varlen inputs)
packed_tower.py PackedTowerCollate: fixed-tower VLM samples (LLaVA-1.5, InternVL) packed whole into rows
_packed_rows.py what both packed VLM collates share: option checks, the rows (the sampler's or next-fit), mask, peak
packing_2d.py  PackedBatchSampler2D: a two-cap packed plan (plan_packing_2d) each epoch, rows carried to the collate
risk.py        a batch predicted above the risk threshold, caught before the GPU; RiskSplitSampler
warmup.py      warm_up: each static bucket shape compiled once, largest first; compile_count (dynamo frames)
lightning.py   Lightning: BucketSamplerCallback (set_epoch, checkpointed position, monitor) (optional extra)
hf_trainer.py  Hugging Face Trainer: BucketTrainer (its loader, model inputs, exact resume) (optional extra)
accelerate.py  Hugging Face Accelerate: prepare_loader (no second split), exact resume, tracker_sink (optional extra)
"""
