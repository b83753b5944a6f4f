"""Patches that let a real ``transformers`` step run on fake tensors as it runs on real ones.

Plumbing of :mod:`tokenbucket.cost.hf_profile` (its NOTE [ Real bookkeeping tensors ] and NOTE
[ Root-only peak stats ]): ops on real bookkeeping tensors run for real, the trackers keep the
root module's peaks only, frozen parameters get no grad hooks, peft's device moves are no-ops,
transformers' value checks are off, Qwen2.5-VL's window index is built on the host, Qwen3-VL's
DeepStack adds its features by index (NOTE [ DeepStack on fake tensors ]), and the
packed-sequence check answers as it does on real position ids (NOTE [ Unpacked rows ]).
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import masking_utils
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
from transformers.models.qwen3_vl import modeling_qwen3_vl

__all__ = [
    "deepstack_by_index",
    "host_window_index",
]


class _RealOps(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Runs ops whose tensor inputs are all real on real tensors (NOTE [ Real bookkeeping tensors ])."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def __torch_dispatch__(
        self, func: Any, types_: Sequence[type], args: tuple[object, ...] = (), kwargs: dict[str, object] | None = None
    ) -> object:
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if tensors and not any(isinstance(t, FakeTensor) for t in tensors):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def _root_only_peaks(tracker: MemTracker, root: torch.nn.Module) -> None:
    """NOTE [ Root-only peak stats ]: the stock peak logic, over the root module's stats only."""

    def update(self: MemTracker, peak_state: Any) -> None:
        curr = self._curr_mem_snap
        stats = self.memory_tracking.get(root)  # type: ignore[no-untyped-call]
        if stats is not None and stats.mod_fqn in self._mod_tracker.parents and peak_state in stats.snapshots:
            for dev, snap in curr.items():
                if stats.local_peak.get(dev, 0) < snap["Total"]:
                    stats.local_peak[dev] = snap["Total"]
                    stats.snapshots[peak_state][-1][dev] = dict(snap)
        for dev, snap in curr.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)

    tracker._update_peak_stats = types.MethodType(update, tracker)  # type: ignore[method-assign]


class _NoHook:
    def remove(self) -> None:
        pass


def _skip_frozen_hooks(tracker: MemTracker, model: torch.nn.Module) -> None:
    """MemTracker hooks every parameter's grad, and ``register_hook`` raises on a frozen one:
    frozen parameters get a no-op handle pair, so the tracker sees them as hooked already."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


@contextlib.contextmanager
def _no_adapter_move() -> Iterator[None]:
    """``Module.to`` as a no-op while peft adds adapters (NOTE [ peft under fake mode ])."""
    orig = torch.nn.Module.to
    torch.nn.Module.to = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = orig  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_torch_checks() -> Iterator[None]:
    """transformers' ``torch_compilable_check``s off while a step runs: they read tensor values,
    and a fake tensor has none (the variable is read at each check; it is restored after)."""
    old = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"]
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = old


@contextlib.contextmanager
def host_window_index() -> Iterator[None]:
    """Qwen2.5-VL's window index, built from the real grid on the host (NOTE [ Real bookkeeping tensors ]).

    It starts from ``torch.arange``, a factory with no tensor input, so under fake mode it would
    come out fake and its ``!= -100`` mask could not select."""
    orig = modeling_qwen2_5_vl.get_vision_window_index  # type: ignore[attr-defined]

    def on_host(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return orig(*args, **kwargs)

    modeling_qwen2_5_vl.get_vision_window_index = on_host  # type: ignore[attr-defined]
    try:
        yield
    finally:
        modeling_qwen2_5_vl.get_vision_window_index = orig  # type: ignore[attr-defined]


@contextlib.contextmanager
def _unpacked_rows() -> Iterator[None]:
    """NOTE [ Unpacked rows ]: transformers' packed-sequence check answers as it does on real position ids.

    Without a cache (``use_cache=False``) transformers reads the position ids to find packed
    sequences (``find_packed_sequence_indices``: a position that does not follow the previous one
    starts a new sequence). A fake tensor has no values, so the check cannot read them and
    answers "packed": an explicit ``B x L x L`` mask, which every layer's sdpa turns into a bf16
    one and keeps for backward, and K and V repeated to all heads (no GQA with a mask). On a GPU
    the model's own ``arange`` positions are read, found unpacked, and sdpa runs causal without a
    mask. Every row measured here is one sequence (the inputs are made here, never packed), so
    the check's answer on the real values is "not packed", and that is the answer given. Measured
    on Qwen2-0.5B, one sample of 8,192 tokens, steady state: 30.80 GiB with the fake answer,
    27.24 GiB with the real one (the same as with the cache on, where the check never runs)."""
    orig = masking_utils.find_packed_sequence_indices

    def not_packed(position_ids: torch.Tensor) -> torch.Tensor | None:
        if isinstance(position_ids, FakeTensor):
            return None
        return orig(position_ids)

    masking_utils.find_packed_sequence_indices = not_packed
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = orig


@contextlib.contextmanager
def deepstack_by_index() -> Iterator[None]:
    """NOTE [ DeepStack on fake tensors ]: Qwen3-VL's DeepStack adds each merger's features to the
    image positions of the first decoder layers' output, selected by a boolean mask made from
    ``input_ids`` (``hidden[mask, :] += features``). A fake mask has no values, so the selection
    (a data-dependent ``nonzero``) cannot run; the same step is run with an index of the image
    positions' count instead, the number of feature rows. The tensors are the same as on a GPU:
    the clone of the hidden states, the gathered rows, their sum and the in-place scatter (which
    rows they are does not change the bytes); the int64 index is one tensor where the mask's
    nonzero makes two (batch, position), a few bytes per image token."""
    cls = modeling_qwen3_vl.Qwen3VLTextModel
    orig = cls._deepstack_process

    def by_index(
        self: modeling_qwen3_vl.Qwen3VLTextModel, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor,
        visual_embeds: torch.Tensor,
    ) -> Any:  # fmt: skip
        if not isinstance(visual_pos_masks, FakeTensor):
            return orig(self, hidden_states, visual_pos_masks, visual_embeds)
        visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
        flat = hidden_states.clone().view(-1, hidden_states.shape[-1])
        index = torch.arange(visual_embeds.shape[0], device=hidden_states.device)
        flat[index, :] = flat[index, :] + visual_embeds
        return flat.view(hidden_states.shape)

    cls._deepstack_process = by_index  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls._deepstack_process = orig  # type: ignore[method-assign]
