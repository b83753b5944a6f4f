"""The training step as users write it: loop, use_cache, attention kernels, optimizer, checkpointing.

Each shape is measured by ``profile_hf`` (the real transformers model on fake tensors) and priced
by the staged model; the differences between shapes are exact byte counts a reader can check:
the bf16 logits ``B x L x vocab x 2``, the cache ``layers x 2 x kv_dim x 2`` per token, one
optimizer state ``2 x trainable``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest

from tests.test_hf_profile import TINY
from tokenbucket._exceptions import ConfigError
from tokenbucket.cost import _kernels, hf_profile
from tokenbucket.cost.hf_model import staged_from_config
from tokenbucket.cost.hf_profile import StepShape, profile_hf
from tokenbucket.cost.staged import Sample, StagedCostModel, TrainSetup
from tokenbucket.models._hf_json import HFConfig

CFG = HFConfig("<tiny>", TINY)
BATCH, SAMPLE = 2, Sample(text_tokens=256)
TOKENS = BATCH * SAMPLE.text_tokens
LOGITS = 2 * TOKENS * TINY["vocab_size"]
KV_DIM = TINY["num_key_value_heads"] * TINY["hidden_size"] // TINY["num_attention_heads"]
CACHE = TINY["num_hidden_layers"] * 2 * 2 * KV_DIM * TOKENS


def _measure(kernels: str = "cpu", *, fresh: bool = False, **setup: Any) -> hf_profile.HFProfile:
    """Two steps of the tiny model; the same shape is measured once per session (fake measurement is
    deterministic here) unless ``fresh`` (a test that patches the engine or counts its calls)."""
    if fresh:
        return profile_hf(CFG, SAMPLE, BATCH, TrainSetup(**setup), steps=2, kernels=kernels)
    return _measured(kernels, tuple(sorted(setup.items())))


@functools.cache
def _measured(kernels: str, setup: tuple[tuple[str, Any], ...]) -> hf_profile.HFProfile:
    return profile_hf(CFG, SAMPLE, BATCH, TrainSetup(**dict(setup)), steps=2, kernels=kernels)


def _predict(**setup: Any) -> int:
    return StagedCostModel(staged_from_config(CFG), TrainSetup(**setup), config=CFG).memory(BATCH, SAMPLE).peak_bytes


def test_held_loop_keeps_the_logits_through_backward_and_the_cache_into_the_next_forward() -> None:
    dropped, held = _measure(loop="dropped"), _measure(loop="held")
    assert held.peak_bytes - dropped.peak_bytes == LOGITS  # the backward peak: the cache's K, V are saved anyway
    fwd = held.phase_peaks["Peak-Forward"] - dropped.phase_peaks["Peak-Forward"]
    assert fwd == pytest.approx(LOGITS + CACHE, abs=16)  # the previous step's output, still bound
    no_cache = _measure(loop="held", use_cache=False)
    assert no_cache.phase_peaks["Peak-Forward"] - dropped.phase_peaks["Peak-Forward"] == pytest.approx(LOGITS, abs=16)


def test_staged_model_prices_the_held_loop_and_says_so_in_the_breakdown() -> None:
    model = staged_from_config(CFG)
    held = StagedCostModel(model, TrainSetup(), config=CFG).memory(BATCH, SAMPLE)
    dropped = StagedCostModel(model, TrainSetup(loop="dropped"), config=CFG).memory(BATCH, SAMPLE)
    assert TrainSetup().loop == "held"  # the default is the most expensive common shape
    assert held.item("loop") == LOGITS + CACHE and dropped.item("loop") == 0
    assert held.peak_bytes - dropped.peak_bytes == LOGITS + CACHE
    no_cache = StagedCostModel(model, TrainSetup(use_cache=False), config=CFG).memory(BATCH, SAMPLE)
    assert no_cache.item("loop") == LOGITS
    ckpt = StagedCostModel(model, TrainSetup(backbone_checkpointing="full"), config=CFG).memory(BATCH, SAMPLE)
    assert ckpt.item("loop") == LOGITS  # transformers turns the cache off under checkpointing
    first = StagedCostModel(model, TrainSetup(), config=CFG).memory(BATCH, SAMPLE, first_step=True)
    assert first.item("loop") == (0 if first.phase == "forward" else LOGITS + CACHE)  # bound once forward returns
    # the measured difference is the logits; the model's is at most the cache above it
    measured = _measure(loop="held").peak_bytes - _measure(loop="dropped").peak_bytes
    assert 0 <= (held.peak_bytes - dropped.peak_bytes) - measured <= CACHE


def test_use_cache_off_builds_no_mask_on_unpacked_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE [ Unpacked rows ]: without the cache transformers reads the position ids for packing
    assert _measure(loop="dropped", use_cache=False).peak_bytes == _measure(loop="dropped").peak_bytes
    monkeypatch.setattr(hf_profile, "_unpacked_rows", contextlib.nullcontext)
    fake_answer = _measure(loop="dropped", use_cache=False, fresh=True).peak_bytes
    assert fake_answer > _measure(loop="dropped").peak_bytes  # an L x L mask kept by every layer


def test_cuda_kernels_route_every_attention_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    real = _kernels.cuda_sdpa

    def counted(query: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(tuple(query.shape))
        return real(query, *args, **kwargs)

    monkeypatch.setattr(_kernels, "cuda_sdpa", counted)
    cuda = _measure(kernels="cuda", loop="dropped", fresh=True)
    assert len(calls) == 2 * TINY["num_hidden_layers"]  # every layer, both steps
    heads, dim = TINY["num_attention_heads"], TINY["hidden_size"] // TINY["num_attention_heads"]
    assert set(calls) == {(BATCH, heads, SAMPLE.text_tokens, dim)}
    calls.clear()
    cpu = _measure(kernels="cpu", loop="dropped", fresh=True)
    assert not calls
    # the flash op's meta saves what the CPU's does, plus its philox seed and offset
    assert 0 <= cuda.peak_bytes - cpu.peak_bytes <= 64 * TINY["num_hidden_layers"]


def test_sgd_keeps_one_state_where_adamw_keeps_two() -> None:
    adamw, sgd = _measure(loop="dropped"), _measure(loop="dropped", optimizer="sgd")
    assert adamw.peak_bytes - sgd.peak_bytes == pytest.approx(2 * adamw.params_trainable, abs=512)
    priced = _predict(loop="dropped") - _predict(loop="dropped", optimizer="sgd")
    assert priced == 2 * adamw.params_trainable


def test_backbone_checkpointing_is_transformers_own_and_frees_activations() -> None:
    full, ckpt = _measure(loop="dropped"), _measure(loop="dropped", backbone_checkpointing="full")
    assert ckpt.peak_bytes < full.peak_bytes
    assert _predict(loop="dropped", backbone_checkpointing="full") < _predict(loop="dropped")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loop": "kept"}, "loop should be one of ['dropped', 'held'], but got loop='kept'"),
        ({"kernels": "rocm"}, "kernels should be one of ['cpu', 'cuda'], but got kernels='rocm'"),
        ({"optimizer": "none"}, "optimizer should be one of ['adamw', 'sgd'], but got optimizer='none'"),
        ({"use_cache": "yes"}, "use_cache should be None (the config's) or a bool, but got use_cache='yes'"),
    ],
)
def test_step_shape_bad_field_names_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        StepShape(**kwargs)
    assert str(err.value) == message


def test_train_setup_loop_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"loop should be one of \['held', 'dropped'\], but got loop='kept'"):
        TrainSetup(loop="kept")
