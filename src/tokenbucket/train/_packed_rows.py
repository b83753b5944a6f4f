"""What the packed VLM collates share (plumbing of :mod:`tokenbucket.train.packed_modal` and
:mod:`tokenbucket.train.packed_tower`): their options' checks, a batch's rows (the sampler's,
checked against both caps, or next-fit), the dense causal block-diagonal mask and the batch's
predicted peak (NOTE [ Packed VLM rows ], NOTE [ Rows through the workers ])."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

from tokenbucket._exceptions import ConfigError
from tokenbucket.cost.staged_packed import StagedPackedModel
from tokenbucket.plan._search import PredictsMemory
from tokenbucket.train.batch import EmptyRow
from tokenbucket.train.packing import block_diagonal_mask, mask_size_warning, next_fit_rows
from tokenbucket.train.sampler import rows_of

__all__ = ["as_mask_dtype", "check_packed_options", "dense_mask", "packed_peak", "packed_rows", "warn_mask_size"]


def check_packed_options(
    pack_length: object, rows_per_batch: object, row_patches: object, mask_dtype: torch.dtype | None
) -> None:
    """A packed collate's shape and mask options, each refused in one line naming it."""
    if isinstance(pack_length, bool) or not isinstance(pack_length, int) or pack_length < 1:
        raise ConfigError(f"pack_length should be a positive integer, but got pack_length={pack_length!r}")
    if row_patches is not None and (
        isinstance(row_patches, bool) or not isinstance(row_patches, int) or row_patches < 0
    ):
        raise ConfigError(
            f"row_patches should be None or an integer of at least 0, but got row_patches={row_patches!r}"
        )
    if rows_per_batch is not None and (not isinstance(rows_per_batch, int) or rows_per_batch < 1):
        raise ConfigError(
            f"rows_per_batch should be None or a positive integer, but got rows_per_batch={rows_per_batch!r}"
        )
    if mask_dtype is not None and mask_dtype != torch.bool and not mask_dtype.is_floating_point:
        raise ConfigError(f"mask_dtype should be torch.bool, a float dtype or None, but got mask_dtype={mask_dtype}")


def packed_rows(
    batch: Sequence[tuple[int, object]],
    real: list[int],
    lengths: list[int],
    patches: list[int],
    *,
    pack_length: int,
    rows_per_batch: int | None,
    row_patches: int | None,
    key_of: Callable[[int], str],
) -> list[list[int]]:
    """The batch's rows as positions into ``real`` (its real samples, in batch order, of
    ``lengths`` tokens and ``patches`` tower patches): the sampler's when it chose them (NOTE
    [ Rows through the workers ]; empty rows dropped, each row checked against both caps), else
    next-fit under both caps."""
    chosen = rows_of(batch)
    if chosen is None:
        capped = patches if row_patches is not None else None
        sizes = list(zip(real, lengths, strict=True))
        return next_fit_rows(sizes, pack_length, rows_per_batch, key_of, patches=capped, row_patches=row_patches)
    if sum(chosen) != len(batch) or min(chosen, default=1) < 1:
        raise ConfigError(
            f"the batch's rows {list(chosen)} should hold its {len(batch)} items, one or more a row: the sampler's "
            f"rows and the batch disagree"
        )
    fit: list[list[int]] = []
    position = s = 0
    for size in chosen:
        row = []
        for _, item in batch[position : position + size]:
            if not isinstance(item, EmptyRow):
                row.append(s)
                s += 1
        position += size
        if row:
            fit.append(row)
    for r, row in enumerate(fit):
        tokens, mine = sum(lengths[s] for s in row), sum(patches[s] for s in row)
        if tokens > pack_length or (row_patches is not None and mine > row_patches):
            over = (
                f"{tokens:,} tokens, more than pack_length={pack_length:,}"
                if tokens > pack_length
                else f"{mine:,} patches, more than row_patches={row_patches:,}"
            )
            raise ConfigError(
                f"row {r} of the batch (samples {[real[s] for s in row]}) holds {over}: the sampler's caps and the "
                f"collate's disagree (pass the plan's row_tokens and row_patches)"
            )
    if rows_per_batch is not None and len(fit) > rows_per_batch:
        raise ConfigError(
            f"the batch has {len(fit)} rows but the collate holds rows_per_batch={rows_per_batch}: the "
            f"sampler's plan and the collate's rows_per_batch disagree"
        )
    return fit


def dense_mask(segment_ids: torch.Tensor, mask_dtype: torch.dtype) -> torch.Tensor:
    """``[R, 1, P, P]``: causal inside each sample, nothing across samples (NOTE [ Packed VLM
    rows ]); bool (True = attend) or additive in a float ``mask_dtype`` (0, and the dtype's
    minimum where masked)."""
    return as_mask_dtype(block_diagonal_mask(segment_ids, causal=True), mask_dtype)


def as_mask_dtype(allowed: torch.Tensor, mask_dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = attend) as it is, or additive in a float ``mask_dtype``."""
    if mask_dtype == torch.bool:
        return allowed
    additive = torch.zeros(allowed.shape, dtype=mask_dtype)
    return additive.masked_fill_(~allowed, torch.finfo(mask_dtype).min)


def warn_mask_size(rows: int, pack_length: int, warned: bool) -> bool:
    """Warn (once: unless ``warned``) when a dense mask of ``rows x pack_length²`` passes 256 MiB
    (NOTE [ Dense mask size ]); whether a warning was given now or before."""
    message = mask_size_warning(rows, pack_length)
    if message is None or warned:
        return warned
    warnings.warn(message, UserWarning, stacklevel=4)
    return True


def packed_peak(
    cost_model: PredictsMemory | StagedPackedModel | None, rows: int, pack_length: int, patches: int, image_tokens: int
) -> int:
    """A packed batch's predicted peak: at ``(rows, pack_length)``, and for a ``StagedPackedModel``
    at the batch's own ``patches`` and ``image_tokens`` too (NOTE [ A packed row's price ]); 0
    without a cost model."""
    if cost_model is None:
        return 0
    if isinstance(cost_model, StagedPackedModel):
        return int(cost_model.memory(rows, pack_length, patches, image_tokens).total)
    return int(cost_model.memory(rows, pack_length).total)
