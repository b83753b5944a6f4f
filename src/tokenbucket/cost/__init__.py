"""cost stage: what a batch shape costs in bytes and FLOPs on a target GPU.

model.py       ModelSpec and its presets
memory.py      CostModel: itemised memory, FLOPs, step time, the largest batch that fits
gpus.py        the GPU registry, memory budgets and step-time defaults (with their sources)
step_time.py   StepTime: a step's seconds as fixed costs plus FLOPs at a utilisation knee
calibration.py a run's fit (Calibration) and any cost model wrapped with it (CalibratedCostModel)
ledger.py      one sample's tokens as bytes and FLOPs, with what-ifs
profile.py     measured mode: peaks on fake tensors (or CUDA), saved profiles, MeasuredCostModel
reference.py   the reference transformer block the cost model describes
staged_packed.py a staged model priced per packed row (StagedPackedModel, SampleLoads)
"""
