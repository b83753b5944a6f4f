"""The shared workload: seeded, and shaped the way the issue describes mixture A."""

from __future__ import annotations

import numpy as np
import pytest

from tokenbucket import TokenSpec, breakdown_table
from tokenbucket.testing import mixture_a


def test_mixture_a_is_reproducible_from_seed() -> None:
    assert mixture_a(1000, seed=5).equals(mixture_a(1000, seed=5))
    assert not mixture_a(1000, seed=5).equals(mixture_a(1000, seed=6))


def test_mixture_a_is_long_tailed_as_specified() -> None:
    table = mixture_a(100_000, seed=0)
    cams = table.column("cameras").to_numpy()
    assert set(np.unique(cams)) <= {1, 2, 3, 4, 6, 8}
    assert np.mean(cams <= 3) > 0.8
    assert set(np.unique(table.column("frames").to_numpy())) == {1, 2, 4, 8, 16, 32}
    assert set(np.unique(table.column("height").to_numpy())) == {224, 336, 448}
    text = table.column("text_tokens").to_numpy()
    assert 1 <= text.min() and text.max() <= 1024 and 50 < text.mean() < 70
    assert set(np.unique(table.column("memory_tokens").to_numpy())) == {0, 64}
    totals = breakdown_table(table, TokenSpec(patch=14)).totals
    assert 55_000 < np.percentile(totals, 99) < 85_000
    assert totals.max() > 100_000


def test_mixture_a_rejects_bad_size() -> None:
    with pytest.raises(ValueError, match="num_samples"):
        mixture_a(-1)
