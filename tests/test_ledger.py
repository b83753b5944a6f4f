"""The shape ledger: the design document's worked figures and the knob table's ratios."""

from __future__ import annotations

import pytest

from tokenbucket import ConfigError, TokenSpec
from tokenbucket.cost.ledger import ledger_with_whatifs, shape_ledger
from tokenbucket.cost.model import ModelSpec

SAMPLE = {"cameras": 4, "frames": 16, "height": 224, "width": 224}
SPEC = TokenSpec(patch=14)
MODEL = ModelSpec.preset("design-24L-1024")
MiB, GiB = 2**20, 2**30


def test_ledger_design_figures() -> None:
    led = shape_ledger(SAMPLE, SPEC, MODEL)
    assert led["tokens"]["total"] == led["length"] == 16_384
    assert led["per_layer"] == {
        "hidden_bytes": 32 * MiB,
        "qkv_bytes": 96 * MiB,
        "attention_score_bytes": 8 * GiB,
        "attention_flops": 2**40,
    }
    assert led["kv_cache_bytes"] == 1.5 * GiB
    assert led["peak_bytes"] == led["memory"]["total"]


def test_ledger_knob_ratios() -> None:
    led = ledger_with_whatifs(SAMPLE, SPEC, MODEL, ["frames=32", "side=448", "kv_heads=4", "patch=28", "batch=2"])
    r = led["whatif"]
    assert r["frames=32"]["per_layer.hidden_bytes"] == 2 and r["frames=32"]["kv_cache_bytes"] == 2
    assert r["frames=32"]["per_layer.attention_score_bytes"] == 4
    assert r["frames=32"]["per_layer.attention_flops"] == 4
    assert r["side=448"]["per_layer.hidden_bytes"] == 4 and r["side=448"]["per_layer.attention_flops"] == 16
    # GQA lowers only the KV cache (and K, V themselves)
    gqa = r["kv_heads=4"]
    assert gqa["kv_cache_bytes"] == 0.25
    assert gqa["per_layer.hidden_bytes"] == gqa["per_layer.attention_score_bytes"] == 1
    assert gqa["per_layer.attention_flops"] == 1
    assert r["patch=28"]["tokens.total"] == 0.25
    assert r["batch=2"]["per_layer.hidden_bytes"] == 2 and r["batch=2"]["tokens.total"] == 1


def test_ledger_combined_whatif_applies_together() -> None:
    led = ledger_with_whatifs(SAMPLE, SPEC, MODEL, ["frames=32,cameras=8"])
    assert led["whatif"]["frames=32,cameras=8"]["tokens.total"] == 4


@pytest.mark.parametrize("bad", ["frames", "=3", "colour=red", "batch=0"])
def test_ledger_bad_whatif_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError):
        ledger_with_whatifs(SAMPLE, SPEC, MODEL, [bad])
