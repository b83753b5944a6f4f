"""The CLI's LeRobot policy flags: ``tokenbucket cost --lerobot-policy DIR|pi0|pi05|smolvla``.

    tokenbucket cost --lerobot-policy smolvla --batch 32 --cameras 2 --gpu H100-SXM
    tokenbucket cost --lerobot-policy outputs/train/checkpoints/last/pretrained_model --batch 8 --json

A LeRobot policy (pi0, pi0.5, SmolVLA) is priced by :class:`~tokenbucket.cost.lerobot_policy.LeRobotPolicy`
as LeRobot 0.4.4 trains it (its ``update_policy`` with AdamW); none of the block or staged
model's flags apply to it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket.cli._common import _budget, _gib, gpu_from_args, positive_int
from tokenbucket.cli._staged import STAGED_ONLY, _flag
from tokenbucket.cost.lerobot_policy import POLICY_TYPES, LeRobotPolicy, read_lerobot_config

__all__ = ["add_lerobot_flags", "is_lerobot", "lerobot_policy_arg", "refuse_lerobot_flags", "run_lerobot"]

# every other model / shape flag of `cost`: refused beside --lerobot-policy
_OTHER_FLAGS = (
    "length", "sample", "mfu", "config", "preset", "hidden", "layers", "heads", "kv_heads", "mlp_ratio",
    "gated_mlp", "precision", "attention", "qkv_layout", "window", "checkpointing", "mode", "optimizer",
    "extra_params", "extra_bytes", "hf_config", *STAGED_ONLY,
)  # fmt: skip
_OWN_FLAGS = ("cameras", "text_tokens")
_ITEMS = ("weights", "gradients", "optimizer", "activations")


def add_lerobot_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LeRobot policy (pi0, pi0.5, SmolVLA as LeRobot 0.4.4 trains them)")
    g.add_argument(
        "--lerobot-policy",
        metavar="DIR_OR_PRESET",
        help="a LeRobot policy's config.json (or the folder holding it: a checkpoint's pretrained_model), "
        "or a published default: pi0, pi05, smolvla",
    )
    g.add_argument(
        "--cameras",
        type=positive_int,
        help="cameras in each sample (default: the config's camera features, else 3); pi0 / pi0.5 run every "
        "camera feature of the config whatever the sample holds, SmolVLA the sample's cameras",
    )
    g.add_argument(
        "--text-tokens",
        type=positive_int,
        help="language tokens per sample (default: the policy's tokenizer_max_length: 48, pi0.5 200)",
    )


def is_lerobot(args: argparse.Namespace) -> bool:
    return getattr(args, "lerobot_policy", None) is not None


def refuse_lerobot_flags(args: argparse.Namespace) -> None:
    """One line naming --cameras / --text-tokens given without --lerobot-policy."""
    given = [f"--{name.replace('_', '-')}" for name in _OWN_FLAGS if getattr(args, name, None) is not None]
    if given:
        raise UsageError(
            f"{', '.join(given)} price a LeRobot policy: give --lerobot-policy DIR (or pi0, pi05, smolvla)"
        )


def lerobot_policy_arg(value: str) -> LeRobotPolicy:
    """``--lerobot-policy``'s policy: a preset name, a config.json, or the folder holding one."""
    if value in POLICY_TYPES and not Path(value).exists():
        return LeRobotPolicy.preset(value)
    path = Path(value)
    if not path.exists():
        raise UsageError(
            f"--lerobot-policy {value!r} is neither a LeRobot config.json, a folder holding one, "
            f"nor a preset ({', '.join(POLICY_TYPES)})"
        )
    try:
        return read_lerobot_config(path)
    except IsADirectoryError:
        raise ConfigError(f"no LeRobot config.json at {str(path / 'config.json')!r}") from None


def run_lerobot(args: argparse.Namespace) -> int:
    """``cost --lerobot-policy``: the policy's predicted peak at ``--batch``, and with ``--gpu`` /
    ``--budget-gib`` whether it fits and the largest batch that does."""
    given = [_flag(name) for name in _OTHER_FLAGS if getattr(args, name, None) is not None]
    if given:
        raise UsageError(
            f"{', '.join(given)}: not for --lerobot-policy (a LeRobot policy takes its sizes from its config.json)"
        )
    policy = lerobot_policy_arg(args.lerobot_policy)
    present = (policy.image_features or 3) if args.cameras is None else args.cameras
    cameras = policy.slots(present)  # NOTE [ Camera slots ]
    text_tokens = policy.tokenizer_max_length if args.text_tokens is None else args.text_tokens
    mem = policy.memory(args.batch, cameras=cameras, text_tokens=text_tokens)
    forward = mem["weights"] + mem["optimizer"] + mem["activations"]
    out: dict[str, Any] = {
        "policy": policy.type,
        "batch": args.batch,
        "cameras": cameras,
        "text_tokens": text_tokens,
        "peak_bytes": mem["peak_bytes"],
        "phase": "forward" if forward >= mem["peak_bytes"] else "optimizer",
        **{k: mem[k] for k in _ITEMS},
        "params_total": policy.params_total,
        "params_with_grad": policy.params_with_grad,
    }
    budget = _budget(args)
    if budget is not None:
        out.update(
            budget_bytes=budget,
            fits=mem["peak_bytes"] <= budget,
            max_batch=policy.max_batch(budget, cameras=cameras, text_tokens=text_tokens),
        )
    gpu = gpu_from_args(args)
    if gpu is not None:
        out["gpu"] = gpu.name
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"LeRobot {policy.type}: {policy.params_total / 1e6:,.1f} M params, {policy.params_with_grad / 1e6:,.1f} M "
        f"trained; batch {args.batch} x {cameras} cameras, {text_tokens} text tokens"
    )
    for k in _ITEMS:
        print(f"  {k:<17} {_gib(mem[k]):>14}")
    print(f"  {'total (peak)':<17} {_gib(mem['peak_bytes']):>14}   at the {out['phase']} phase")
    if budget is not None:
        verdict = "fits" if out["fits"] else "does NOT fit"
        print(f"  budget {_gib(budget)}: {verdict}; largest batch: {out['max_batch']}")
    return 0
