"""Sources of per-sample metadata: dataset formats read into the rows that ``breakdown.py`` counts.

Each module reads one format's own metadata (never its pixels) and returns a ``pyarrow.Table``
in the per-camera schema: :func:`tokenbucket.breakdown.breakdown_table` counts it as it is, and
written to Parquet it is a metadata file for :func:`tokenbucket.manifest.build_manifest`.

    lerobot.py   LeRobot v2.0 / v2.1 / v3.0 datasets: ``meta/info.json`` + the episode list
"""
