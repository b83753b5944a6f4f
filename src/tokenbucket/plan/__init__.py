"""plan stage: bucket bounds and batch sizes that fit the budget, and the manifest that carries them.

bucket_plan.py LengthHistogram, Bucket, BucketPlan: the plan as a serialisable value
buckets.py     plan_buckets (static / dynamic / packed), check_plan, plan_from_bounds
packing.py     pack_rows and plan_packing (mode="packed")
packing_2d.py  two-cap packing for staged models (plan_packing_2d, pack_rows_2d) and rank balance (balance_steps)
_search.py     what the planner asks a cost model (SupportsCost, PredictsMemory), batches under a budget, the oversize check
manifest.py    build_manifest / load_manifest: one Parquet row per sample plus the plan
_manifest_io.py the manifest on disk: content hash, part writer, safe replacement of --out
"""
