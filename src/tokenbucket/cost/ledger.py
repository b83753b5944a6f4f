"""The shape ledger: one sample's tokens, turned into bytes and FLOPs, line by line.

For one sample at batch ``B`` it lists the token breakdown; per layer the hidden state
(``B·L·D·bytes``), Q/K/V (``B·L·(D + 2·D_kv)·bytes``), one materialised score tensor
(``B·H·L²·bytes``) and the attention matmul FLOPs (``4·B·L²·D``); the KV cache
(``layers·2·B·L·D_kv·bytes``); and the predicted peak for the model's attention and mode. With
what-ifs (``frames=32``, ``patch=28``, ``kv_heads=4``, ``batch=2``) each line gets its ratio to
the base, so a knob's cost reads off directly.

Example (the design document's figures):
    >>> from tokenbucket import TokenSpec
    >>> from tokenbucket.cost.model import ModelSpec
    >>> led = shape_ledger({"cameras": 4, "frames": 16, "height": 224, "width": 224},
    ...                    TokenSpec(patch=14), ModelSpec.preset("design-24L-1024"))
    >>> led["per_layer"]["hidden_bytes"] // 2**20, led["kv_cache_bytes"] / 2**30
    (32, 1.5)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.memory import CostModel
from tokenbucket.cost.model import ModelSpec
from tokenbucket.tokens.breakdown import breakdown_sample
from tokenbucket.tokens.spec import TokenSpec

__all__ = ["apply_whatif", "ledger_with_whatifs", "shape_ledger"]


def shape_ledger(sample: Mapping[str, Any], spec: TokenSpec, model: ModelSpec, *, batch: int = 1) -> dict[str, Any]:
    """The ledger of ``batch`` copies of ``sample`` (see the module docstring for the keys)."""
    bd = breakdown_sample(sample, spec)
    length = bd.total
    if length < 1:
        raise ConfigError(f"the sample has {length} tokens; the ledger needs at least one")
    cost = CostModel(model)
    c = model.compute_bytes
    t = batch * length
    memory = cost.memory(batch, length)
    tokens = {k: v for k, v in bd.to_dict().items() if k not in ("cameras", "key")}
    return {
        "batch": batch,
        "length": length,
        "tokens": tokens,
        "per_layer": {
            "hidden_bytes": t * model.hidden * c,
            "qkv_bytes": t * (model.hidden + 2 * model.kv_dim) * c,
            "attention_score_bytes": batch * model.heads * length * length * c,
            "attention_flops": cost.flops(batch, length).attention_per_layer,
        },
        "kv_cache_bytes": cost.kv_cache_bytes(batch, length),
        "peak_bytes": memory.total,
        "memory": memory.to_dict(),
    }


def apply_whatif(
    change: str, sample: Mapping[str, Any], spec: TokenSpec, model: ModelSpec, batch: int
) -> tuple[dict[str, Any], TokenSpec, ModelSpec, int]:
    """Apply one ``NAME=VALUE``: to the sample's fields, the token spec, the model or the batch."""
    name, sep, raw = change.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"a what-if should look like NAME=VALUE (frames=32), but got {change!r}")
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):  # not JSON (or nested too deeply): the text itself
        value = raw.strip()
    sample = dict(sample)
    if name == "batch":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"batch should be a positive integer, but got batch={value!r}")
        return sample, spec, model, value
    if name in ("side", "resolution"):  # square frames: set both
        sample[spec.columns.height] = sample[spec.columns.width] = value
        return sample, spec, model, batch
    if name in sample:
        sample[name] = value
        return sample, spec, model, batch
    model_fields = {f.name for f in dataclasses.fields(ModelSpec)}
    spec_fields = {f.name for f in dataclasses.fields(TokenSpec) if f.init}
    if name in spec_fields:
        return sample, dataclasses.replace(spec, **{name: value}), model, batch
    if name in model_fields:
        return sample, spec, dataclasses.replace(model, **{name: value}), batch
    raise ConfigError(
        f"what-if {name!r} is neither a sample field ({sorted(sample)}), a token spec field, a model field nor 'batch'"
    )


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in data.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def ledger_with_whatifs(
    sample: Mapping[str, Any],
    spec: TokenSpec,
    model: ModelSpec,
    whatifs: Sequence[str] = (),
    *,
    batch: int = 1,
) -> dict[str, Any]:
    """The base ledger, plus under ``whatif`` each change's ratios to it (line by line).

    Several changes in one string, separated by commas (``frames=32,cameras=8``), apply together.
    """
    base = shape_ledger(sample, spec, model, batch=batch)
    if not whatifs:
        return base
    flat = _flatten(base)
    ratios: dict[str, dict[str, float | None]] = {}
    for whatif in whatifs:
        s, sp, mo, b = dict(sample), spec, model, batch
        for change in whatif.split(","):
            s, sp, mo, b = apply_whatif(change, s, sp, mo, b)
        other = _flatten(shape_ledger(s, sp, mo, batch=b))
        ratios[whatif] = {k: (other[k] / v if v else None) for k, v in flat.items() if k in other}
    base["whatif"] = ratios
    return base
