"""``tokenbucket ledger``: one sample's tokens as bytes and FLOPs, with what-ifs.

tokenbucket ledger --sample JSON [token flags] [model flags] [--whatif frames=32 ...] [--json]
tokenbucket ledger --hf-config DIR --sample JSON [--batch B] [training flags] [--json]
"""

from __future__ import annotations

import argparse
import json

from tokenbucket._exceptions import UsageError
from tokenbucket.cli._common import (
    _add_model_flags,
    _add_spec_flags,
    _gib,
    _sample_arg,
    model_from_args,
    positive_int,
    spec_from_args,
)
from tokenbucket.cli._staged import (
    add_staged_flags,
    is_staged,
    print_estimate,
    refuse_staged_flags,
    sample_from_args,
    staged_cost_from_args,
    staged_json,
)
from tokenbucket.cost.ledger import ledger_with_whatifs

__all__ = ["EXAMPLE", "add_arguments", "run"]

EXAMPLE = (
    'tokenbucket ledger --sample \'{"cameras":4,"frames":16,"height":224,"width":224}\' '
    "--patch 14 --whatif frames=32 --whatif kv_heads=4"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sample", required=True, help="one sample as a JSON object (inline or @file.json)")
    parser.add_argument("--batch", type=positive_int, default=1, help="samples in the batch (default 1)")
    parser.add_argument(
        "--whatif",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="e.g. frames=32, side=448, kv_heads=4, patch=28, batch=2 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    _add_spec_flags(parser)
    _add_model_flags(parser)
    add_staged_flags(parser)


def run(args: argparse.Namespace) -> int:
    if is_staged(args):
        return _run_staged(args)
    refuse_staged_flags(args)
    spec = spec_from_args(args)
    model = model_from_args(args)
    led = ledger_with_whatifs(_sample_arg(args.sample), spec, model, args.whatif, batch=args.batch)
    if args.json:
        print(json.dumps(led))
        return 0
    heads = ["base", *args.whatif]
    print(f"{'line':<34}" + "".join(f"{h:>16}" for h in heads))
    lines = [
        ("tokens (L)", led["tokens"]["total"], "tokens.total", "n"),
        ("hidden per layer", led["per_layer"]["hidden_bytes"], "per_layer.hidden_bytes", "b"),
        ("Q/K/V per layer", led["per_layer"]["qkv_bytes"], "per_layer.qkv_bytes", "b"),
        (
            "one score tensor per layer",
            led["per_layer"]["attention_score_bytes"],
            "per_layer.attention_score_bytes",
            "b",
        ),
        ("attention FLOPs per layer", led["per_layer"]["attention_flops"], "per_layer.attention_flops", "f"),
        ("KV cache (all layers)", led["kv_cache_bytes"], "kv_cache_bytes", "b"),
        (f"predicted peak ({model.attention}, {model.mode})", led["peak_bytes"], "peak_bytes", "b"),
    ]
    for label, value, key, kind in lines:
        base = f"{value:,}" if kind == "n" else (f"{value:.3e}" if kind == "f" else _gib(value))
        cells = [f"{base:>16}"]
        for w in args.whatif:
            ratio = led["whatif"][w].get(key)
            cells.append(f"{'' if ratio is None else f'x{ratio:.2f}':>16}")
        print(f"{label:<34}" + "".join(cells))
    return 0


def _run_staged(args: argparse.Namespace) -> int:
    """A staged model's ledger: the sample's vision passes and tokens, then bytes per stage."""
    if args.whatif:
        raise UsageError("--whatif changes the block model's knobs; with --hf-config, run the ledger per variant")
    cost = staged_cost_from_args(args)
    sample = sample_from_args(args.sample)
    vi = cost.sample_vision(sample)
    est = cost.memory(args.batch, sample)
    out = staged_json(cost, est, None, sample)
    clips = cost.clips(sample)
    tokens = {
        "images": sample.images if not sample.videos or clips else sample.videos * sample.frames,
        "videos": sample.videos if clips else 0,
        "frames": sample.frames if clips else 0,
        "tower_passes": vi.tower_images,
        "patches_per_pass": vi.patches_per_image,
        "image_tokens": vi.llm_tokens,
        "text_tokens": sample.text_tokens,
        "llm_tokens": est.seq_len,
    }
    params = cost.model.params_by_stage()
    out.update(tokens=tokens, params_by_stage=params)
    if args.json:
        print(json.dumps(out))
        return 0
    what = (
        f"{sample.videos} videos of {sample.frames} frames"
        if clips
        else f"{tokens['images']} images" + (" (video frames as images)" if sample.videos else "")
    )
    print(
        f"one sample: {what} of {sample.height}x{sample.width} -> {tokens['tower_passes']:,} vision "
        f"passes of {vi.patches_per_image:,} patches -> {tokens['image_tokens']:,} image tokens + "
        f"{sample.text_tokens:,} text = {est.seq_len:,} LLM tokens"
    )
    print("parameters: " + ", ".join(f"{k} {v / 1e6:,.0f} M" for k, v in params.items() if v))
    print_estimate(cost, est, out)
    return 0
