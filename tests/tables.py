"""Small metadata tables that several test modules build their datasets from."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def small_meta(n: int) -> pa.Table:
    """``n`` rows of 1–2 cameras, 1 or 3 frames at 112 or 224 px and 1–8 text tokens, keys ``s000``..."""
    rng = np.random.default_rng(0)
    side = rng.choice([112, 224], n)
    return pa.table(
        {
            "key": [f"s{i:03d}" for i in range(n)],
            "cameras": rng.choice([1, 2], n),
            "frames": rng.choice([1, 3], n),
            "height": side,
            "width": side,
            "text_tokens": rng.integers(1, 9, n),
        }
    )
