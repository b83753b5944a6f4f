"""What the video DiT families' step terms share (plumbing of :mod:`tokenbucket.models`).

Each family counts what its own blocks keep (its module's NOTE, checked against the tensors autograd
saves in ``tests/test_dit_cost.py``). Two effects are the same in every family, and are stated
once here.

NOTE [ Gradients the tracker holds through backward ]
Under checkpointing the measured peak grows by a fixed amount a video token for every block the
model has, whatever its width: the measuring tracker's module hooks buffer the gradients of some
of each block's inputs until the end of backward (NOTE [ What a Wan block keeps ] in
:mod:`tokenbucket.models.wan` traces it: a module input that shares its module with a tensor every
block reads, such as the text states or the time embedding, waits on that tensor's gradient, whole
only when the last block's backward is done). Under FSDP it is ``2 D`` a block in every family
here. Unsharded, where the peak falls at the end of backward beside every gradient, it is ``2 D``
a block for LTX-Video and HunyuanVideo (both kinds of block), ``4 D`` for CogVideoX and ``6 D`` for
Cosmos: one, two and three bf16 ``T x D`` gradients, measured with tiny copies of each family at 2
to 8 blocks (the peak's slope in the tokens grows by exactly that a block) and at the published
sizes (LTX-Video with 28 and 48 blocks, Cosmos with 28 and 36); which module inputs they are was
not pinned down, so the counts are the family's measured ones. The blocks other than the one being
recomputed (whose input is :attr:`BlockTerms.checkpoint`) give :func:`held_inputs`; the family's
NOTE gives what its working set holds beyond them. The memory is the tracker's: a run with no
tracker should not hold it (the cost model follows the truth as measured).

NOTE [ LoRA's peak is in the last block's MLP backward ]
Under LoRA the frozen layers keep no inputs for their weights' gradients, so the step peaks a
little after backward starts, not at its start: in the last block's MLP, where the gradient of the
frozen output projection's input and the GELU's own input gradient (two bf16 tensors of the MLP
width, ``4 ffn`` bytes a video token) are live beside every saved tensor (the GELU's input is
freed only once its gradient is made). In full training the output projection keeps the GELU's
output for its weight gradient and frees it as the input gradient is made, so nothing is added.
Measured: with it LTX-Video 2B and 13B and Cosmos-Predict2 2B and 14B are within 0.01 % at every
shape, CogVideoX within 0.2 %. HunyuanVideo's last block is a single-stream one, whose forward
peaks higher still (NOTE [ What a HunyuanVideo block keeps ] in :mod:`tokenbucket.models.hunyuan_video`).
"""

from __future__ import annotations

from tokenbucket._exceptions import ConfigError
from tokenbucket.models._dit import DiTConfig

__all__ = ["held_inputs", "lora_mlp_peak", "mlp_width"]


def held_inputs(width: int, blocks: int, per_block: int = 2) -> int:
    """NOTE [ Gradients the tracker holds through backward ]: what the blocks but one hold, bytes
    a video token (``per_block`` bytes a channel of the width each: 2, one bf16 gradient)."""
    return per_block * width * (blocks - 1)


def lora_mlp_peak(ffn: int) -> int:
    """NOTE [ LoRA's peak is in the last block's MLP backward ]: bytes a video token."""
    return 4 * ffn


def mlp_width(cfg: DiTConfig, width: int, default: float = 4.0) -> int:
    """The MLP width of a block ``width`` wide at the config's ``mlp_ratio``, floored as diffusers'
    ``FeedForward`` (and HunyuanVideo's ``proj_mlp``) floor it."""
    ratio = cfg.get("mlp_ratio", default)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio <= 0:
        raise ConfigError(f"config.json {cfg.path!r}: key 'mlp_ratio' should be a positive number, but got {ratio!r}")
    return int(width * ratio)
