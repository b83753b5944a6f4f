"""The ``tokenbucket`` command: thin wrappers over the library's functions.

    tokenbucket tokens METADATA [--config F] [--json] [spec flags]
    tokenbucket tokens --sample '{"cameras":4,"frames":16,"height":224,"width":224}' --patch 14 --json
    tokenbucket cost [model flags] --batch B --length L [--gpu NAME | --budget-gib X] [--json]
    tokenbucket ledger --sample JSON [token flags] [model flags] [--whatif frames=32 ...] [--json]
    tokenbucket profile MODULE:FACTORY [model flags] --batch B --length L [--save PROFILE.json]
    tokenbucket gpus [--json]
    tokenbucket plan METADATA... [--config F] [--gpu NAME | --budget-gib X] [--max-buckets K]
                     [--mode static|dynamic] [--on-oversize error|reject] --out manifest.parquet [--json]
    tokenbucket plan --lerobot DATASET [--delta-timestamps JSON|@FILE.json] [--cameras A,B] [plan flags as above]
    tokenbucket inspect manifest.parquet [--json] [--plot hist.png]
    tokenbucket report RUN.jsonl [--json] [--out DIR]
    tokenbucket demo [--out DIR] [--samples N] [--seed S]

Every :class:`~tokenbucket.tokens.spec.TokenSpec` field has a flag, so a quick question needs no
config file; flags override ``--config``'s ``[tokens]`` section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenbucket._exceptions import ConfigError, TokenbucketError

__all__ = ["main"]


def _size(text: str) -> tuple[int, int]:
    parts = text.lower().replace("×", "x").split("x")
    try:
        if len(parts) == 1:
            return int(parts[0]), int(parts[0])
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH or SIDE, got {text!r}")


def _add_spec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("token spec (each overrides --config)")
    g.add_argument("--config", type=Path, help="tokenbucket.toml whose [tokens] section is the base spec")
    g.add_argument("--patch", type=int, help="patch side in pixels (default 14)")
    g.add_argument("--resize", choices=["pad", "crop", "fixed", "max_pixels"], help="resize policy")
    g.add_argument("--fixed-size", type=_size, metavar="HxW", help="frame size for --resize fixed")
    g.add_argument("--min-pixels", type=int, help="lower pixel bound for --resize max_pixels")
    g.add_argument("--max-pixels", type=int, help="upper pixel bound for --resize max_pixels")
    g.add_argument("--merge", type=int, help="spatial token merger side (2 = 2x2)")
    g.add_argument("--tubelet", type=int, help="frames per temporal token")
    g.add_argument("--causal-first-frame", action=argparse.BooleanOptionalAction, default=None,
                   help="keep frame 0 apart: 1 + ceil((frames-1)/tubelet)")
    g.add_argument("--tokens-per-frame", type=int, help="resampler output per frame (replaces patches)")
    g.add_argument("--special-per-frame", type=int, help="special tokens per temporal token")
    g.add_argument("--special-per-camera", type=int, help="special tokens per camera")
    g.add_argument("--camera-slots", type=int, help="fixed camera slots (empty ones still cost)")
    g.add_argument("--camera-names", help="comma-separated names of the flat schema's camera positions")
    g.add_argument("--override", action="append", default=[], metavar="CAMERA:FIELD=VALUE",
                   help="per-camera override, e.g. wrist:tokens_per_frame=64 (repeatable)")
    for name in ("text", "proprio", "action", "memory"):
        g.add_argument(f"--{name}", metavar="RULE",
                       help=f"{name} tokens: N, COLUMN, N*K, COLUMN*K; '?' after a column makes it optional")
    g.add_argument("--extra", action="append", default=[], metavar="NAME=RULE", help="named extra modality (repeatable)")
    g.add_argument("--column", action="append", default=[], metavar="FIELD=NAME",
                   help="metadata column mapping, e.g. key=episode_id or cameras=views (repeatable)")


def _add_model_flags(p: argparse.ArgumentParser, *, with_config: bool = False, mode_flag: str = "--mode") -> None:
    g = p.add_argument_group("model (each overrides --config's [model] and --preset; "
                             "default preset design-24L-1024)")
    if with_config:
        g.add_argument("--config", type=Path, help="tokenbucket.toml whose [model] section is the base")
    g.add_argument("--preset", help="start from a named model (see ModelSpec presets)")
    g.add_argument("--hidden", type=int, help="model width D")
    g.add_argument("--layers", type=int, help="number of blocks")
    g.add_argument("--heads", type=int, help="attention heads")
    g.add_argument("--kv-heads", type=int, help="K/V heads (GQA/MQA)")
    g.add_argument("--mlp-ratio", type=float, help="MLP width over hidden (default 4)")
    g.add_argument("--gated-mlp", action=argparse.BooleanOptionalAction, default=None, help="SwiGLU MLP")
    g.add_argument("--precision", choices=["bf16", "amp", "fp32"])
    g.add_argument("--attention", choices=["flash", "sdpa", "eager", "mem_efficient"])
    g.add_argument("--window", type=int, help="local attention window in tokens")
    g.add_argument("--checkpointing", choices=["none", "full"])
    g.add_argument(mode_flag, dest="mode", choices=["train", "infer"], help="train (default) or infer")
    g.add_argument("--optimizer", choices=["adamw", "sgd", "none"])
    g.add_argument("--extra-params", type=int, help="parameters outside the blocks (encoders, heads)")
    g.add_argument("--extra-bytes", type=int, help="fixed bytes the block model does not see")


def model_from_args(args: argparse.Namespace) -> Any:
    """The :class:`ModelSpec` that ``--config``'s ``[model]``, ``--preset`` and the flags describe."""
    from tokenbucket.cost.model import ModelSpec

    data: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        from tokenbucket._config import load_toml_section

        data = load_toml_section(args.config, "model")
    if args.preset is not None:
        data["preset"] = args.preset
    for name in ("hidden", "layers", "heads", "kv_heads", "mlp_ratio", "gated_mlp", "precision", "attention",
                 "window", "checkpointing", "mode", "optimizer", "extra_params", "extra_bytes"):
        value = getattr(args, name)
        if value is not None:
            data[name] = value
    if "preset" not in data and not {"hidden", "layers", "heads"} <= set(data):
        # no full model given: the flags change the design document's 24-layer model
        data["preset"] = "design-24L-1024"
    return ModelSpec.from_dict(data)


def _budget(args: argparse.Namespace) -> int | None:
    from tokenbucket.cost.gpus import GIB, gpu_budget_bytes

    if args.budget_gib is not None:
        if args.budget_gib <= 0:
            raise ConfigError(f"--budget-gib should be positive, but got {args.budget_gib}")
        return int(args.budget_gib * GIB)
    if args.gpu is not None:
        return gpu_budget_bytes(args.gpu)
    return None


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.2f} GiB"


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"{flag} should look like NAME=VALUE, but got {flag} {item!r}")
        out.append((name.strip(), value.strip()))
    return out


def spec_from_args(args: argparse.Namespace) -> Any:
    """The :class:`TokenSpec` that ``--config`` and the spec flags describe."""
    from tokenbucket.tokens.spec import TokenSpec

    data: dict[str, Any] = {}
    if args.config is not None:
        from tokenbucket._config import load_toml_section

        data = load_toml_section(args.config, "tokens")
    flags = {
        "patch": args.patch,
        "resize": args.resize,
        "fixed_size": args.fixed_size,
        "min_pixels": args.min_pixels,
        "max_pixels": args.max_pixels,
        "merge": args.merge,
        "tubelet": args.tubelet,
        "causal_first_frame": args.causal_first_frame,
        "tokens_per_frame": args.tokens_per_frame,
        "special_per_frame": args.special_per_frame,
        "special_per_camera": args.special_per_camera,
        "camera_slots": args.camera_slots,
        "text": args.text,
        "proprio": args.proprio,
        "action": args.action,
        "memory": args.memory,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.resize == "fixed" and args.fixed_size is None and "fixed_size" not in data:
        raise ConfigError("--resize fixed needs --fixed-size HxW")
    if args.camera_names:
        data["camera_names"] = [n.strip() for n in args.camera_names.split(",") if n.strip()]
    overrides = {k: dict(v) for k, v in data.get("overrides", {}).items()}
    for item in args.override:
        camera, sep, rest = item.partition(":")
        if not sep:
            raise ConfigError(f"--override should look like CAMERA:FIELD=VALUE, but got --override {item!r}")
        for fld, value in _pairs([rest], "--override"):
            overrides.setdefault(camera, {})[fld] = _parse_value(value)
    if overrides:
        data["overrides"] = overrides
    if args.extra:
        extras = dict(data.get("extras", {}))
        extras.update(_pairs(args.extra, "--extra"))
        data["extras"] = extras
    if args.column:
        columns = dict(data.get("columns", {}))
        columns.update(_pairs(args.column, "--column"))
        data["columns"] = columns
    return TokenSpec.from_dict(data)


def _sample_arg(text: str) -> dict[str, Any]:
    """``--sample``: one JSON object (inline or ``@file.json``)."""
    return _json_object_arg(text, "--sample")


def _print_summary(summary: dict[str, Any], source: str, out: Any = None) -> None:
    out = out or sys.stdout
    print(f"{source}: {summary['count']:,} samples, {summary['rejected']:,} rejected, "
          f"{summary['tokens']:,} tokens", file=out)
    if summary["count"]:
        print("L_total   " + "  ".join(f"{k}={summary[k]:,}" for k in ("min", "p50", "p90", "p99", "max"))
              + f"  mean={summary['mean']:,.0f}", file=out)
    print("share     " + "  ".join(f"{k} {v:6.1%}" for k, v in summary["share"].items()), file=out)


def _cmd_tokens(args: argparse.Namespace) -> int:
    from tokenbucket.tokens.breakdown import breakdown_sample, breakdown_table
    from tokenbucket.tokens.metadata import read_metadata

    spec = spec_from_args(args)
    if args.sample is not None:
        if args.metadata is not None:
            raise ConfigError("give either METADATA or --sample, not both")
        bd = breakdown_sample(_sample_arg(args.sample), spec)
        if args.json:
            print(json.dumps(bd.to_dict()))
        else:
            for k, v in bd.to_dict().items():
                if k != "cameras":
                    print(f"{k:>8}  {v:,}" if isinstance(v, int) else f"{k:>8}  {v}")
            for c in bd.cameras:
                print(f"  {c.name}: {c.frames} frames {c.height}x{c.width} -> {c.temporal} x {c.spatial} "
                      f"= {c.tokens:,}{' (empty slot)' if c.empty_slot else ''}")
        return 0
    if args.metadata is None:
        raise ConfigError("tokens needs METADATA (a file or directory) or --sample JSON")
    table = read_metadata(args.metadata, key=spec.columns.key, absent=spec.absent_as_zero())
    result = breakdown_table(table, spec, on_invalid=args.on_invalid)
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary, str(args.metadata))
        for row in result.rejected.slice(0, 5).to_pylist():
            print(f"  rejected: {row['message']}")
        if result.rejected.num_rows > 5:
            print(f"  ... and {result.rejected.num_rows - 5:,} more rejected rows")
    return 0


def _cmd_gpus(args: argparse.Namespace) -> int:
    from tokenbucket.cost.gpus import GPUS, gpu_budget_bytes

    rows = [
        {"name": g.name, "visible_gib": g.visible_gib, "budget_gib": round(gpu_budget_bytes(g) / 2**30, 2),
         "bf16_tflops": g.bf16_tflops, "bandwidth_tbs": g.bandwidth_tbs}
        for g in GPUS.values()
    ]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'gpu':<11} {'visible':>9} {'budget':>9} {'bf16 TFLOP/s':>13} {'TB/s':>6}")
    for r in rows:
        tf = "no bf16" if r["bf16_tflops"] is None else f"{r['bf16_tflops']:,.0f}"
        print(f"{r['name']:<11} {r['visible_gib']:>7.2f}Gi {r['budget_gib']:>7.2f}Gi {tf:>13} {r['bandwidth_tbs']:>6.2f}")
    print("budget = (visible - 0.5 GiB CUDA context - 0.25 GiB workspace) / 1.1")
    return 0


def _cmd_cost(args: argparse.Namespace) -> int:
    from tokenbucket.cost.memory import MEMORY_ITEMS, CostModel

    model = model_from_args(args)
    cost = CostModel(model, args.gpu, mfu=args.mfu)
    mem = cost.memory(args.batch, args.length)
    flops = cost.flops(args.batch, args.length)
    budget = _budget(args)
    out: dict[str, Any] = {k: getattr(mem, k) for k in MEMORY_ITEMS}
    out.update(total=mem.total, phase=mem.phase, flops=flops.to_dict())
    if budget is not None:
        out.update(budget_bytes=budget, fits=mem.total <= budget, max_batch=cost.max_batch(args.length, budget))
    if cost.gpu is not None:
        out["step_seconds"] = cost.step_seconds(args.batch, args.length)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{model.name or 'model'}: {model.layers} x D={model.hidden}, {model.heads} heads "
          f"({model.kv_heads} kv), {model.precision}, {model.attention}, {model.mode}, "
          f"{model.params / 1e6:,.1f} M params; batch {args.batch} x length {args.length:,}")
    for k in MEMORY_ITEMS:
        print(f"  {k:<17} {_gib(getattr(mem, k)):>14}")
    print(f"  {'total (peak)':<17} {_gib(mem.total):>14}   at the {mem.phase} phase")
    print(f"  flops: forward {flops.forward:.3e}, attention {flops.attention:.3e}, training {flops.training:.3e}")
    if budget is not None:
        verdict = "fits" if out["fits"] else "does NOT fit"
        print(f"  budget {_gib(budget)}: {verdict}; largest batch at this length: {out['max_batch']}")
    if "step_seconds" in out:
        print(f"  step time at {args.mfu:.0%} of {cost.gpu.name} peak: {out['step_seconds'] * 1e3:,.1f} ms")  # type: ignore[union-attr]
    return 0


def _cmd_ledger(args: argparse.Namespace) -> int:
    from tokenbucket.cost.ledger import ledger_with_whatifs

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
        ("one score tensor per layer", led["per_layer"]["attention_score_bytes"], "per_layer.attention_score_bytes", "b"),
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


def _load_factory(target: str) -> Any:
    import importlib

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected MODULE:FACTORY (e.g. mypkg.models:build), but got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no {attr!r}") from None


def _cmd_profile(args: argparse.Namespace) -> int:
    import inspect

    import torch

    from tokenbucket.cost.memory import CostModel
    from tokenbucket.cost.profile import profile_memory, profile_points

    model = model_from_args(args)
    factory = _load_factory(args.factory)
    takes_spec = False
    try:
        takes_spec = "spec" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        pass

    def build() -> torch.nn.Module:
        module: torch.nn.Module = factory(spec=model) if takes_spec else factory()
        return module

    dtype = torch.bfloat16 if model.precision == "bf16" else torch.float32
    if args.input is not None:
        make_batch = _load_factory(args.input)
    else:
        def make_batch(b: int, length: int) -> torch.Tensor:
            return torch.empty(b, length, model.hidden, dtype=dtype)

    train = model.mode == "train"
    points = [(args.batch, length) for length in (args.length or [])]
    rows = []
    for b, length in points:
        prof = profile_memory(build, make_batch, b, length, train=train, optimizer=model.optimizer,
                              device=args.device)
        est = CostModel(model).memory(b, length)
        rows.append({"batch": b, "length": length, "measured": prof.peak, "measured_phases": prof.peaks,
                     "analytic": est.total, "analytic_phase": est.phase, "ratio": est.total / prof.peak})
    if args.save is not None:
        grid = sorted({(b, length) for _, length in points for b in (1, 2, args.batch)})
        profile_points(build, make_batch, grid, target=args.gpu or "fake-cpu", dtype=model.precision,
                       device=args.device, train=train, optimizer=model.optimizer).save(args.save)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{args.factory} on {'fake tensors (CPU)' if args.device == 'fake' else args.device}, "
          f"{model.precision}, {model.attention}, {model.mode}")
    print(f"{'batch':>5} {'length':>8} {'measured':>12} {'analytic':>12} {'analytic/measured':>18}  measured by phase")
    for r in rows:
        phases = ", ".join(f"{k} {_gib(v)}" for k, v in r["measured_phases"].items())
        print(f"{r['batch']:>5} {r['length']:>8,} {_gib(r['measured']):>12} {_gib(r['analytic']):>12} "
              f"{r['ratio']:>18.3f}  {phases}")
    if args.save is not None:
        print(f"profile written to {args.save}")
    return 0


def _plan_json(plan: Any) -> dict[str, Any]:
    return {
        "budget_bytes": plan.budget_bytes,
        "mode": plan.mode,
        "buckets": [
            {"bound": b.bound, "batch_size": b.batch_size, "samples": b.samples, "batches": b.batches,
             "predicted_peak_bytes": b.predicted_peak_bytes, "fill": b.fill,
             "padding_efficiency": b.padding_efficiency, "step_seconds": b.step_seconds}
            for b in plan.buckets
        ],
        "summary": plan.summary(),
        "oversize": plan.oversize,
    }


def _print_plan(plan: Any) -> None:
    print(f"{'bucket':>6} {'bound':>8} {'batch':>6} {'samples':>9} {'batches':>8} {'peak':>11} {'fill':>6} "
          f"{'padding eff':>12} {'step ms':>9}")
    for k, b in enumerate(plan.buckets):
        print(f"{k:>6} {b.bound:>8,} {b.batch_size:>6} {b.samples:>9,} {b.batches:>8,} {_gib(b.predicted_peak_bytes):>11} "
              f"{b.fill:>6.1%} {b.padding_efficiency:>12.1%} {b.step_seconds * 1e3:>9.1f}")
    s = plan.summary()
    shapes = s["shapes"] if s["shapes"] is not None else "dynamic"
    print(f"{s['samples']:,} samples in {s['batches']:,} batches, {shapes} shapes, padding efficiency "
          f"{s['padding_efficiency']:.1%}, mean fill {s['mean_fill']:.1%}, predicted epoch "
          f"{s['predicted_epoch_seconds'] / 3600:,.2f} h, over budget: {s['over_budget_batches']}; "
          f"rejected {s['rejected']:,} (budget {_gib(plan.budget_bytes)})")
    if plan.oversize:
        o = plan.oversize
        print(f"oversize: {o['count']:,} samples longer than {o['longest_fitting']:,} tokens (the largest, "
              f"{o['largest']:,} tokens, needs {_gib(o['largest_bytes'])} alone)")


def _json_object_arg(text: str, flag: str) -> dict[str, Any]:
    """A flag's JSON object, given inline or as ``@file.json``."""
    source = f"{flag} {text!r}"
    if text.startswith("@"):
        path = Path(text[1:])
        source = f"{flag} file {str(path)!r}"
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {source}: {exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} should be a JSON object, but it does not parse ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{source} should be a JSON object, but got {type(value).__name__}")
    return value


def _lerobot_metadata(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """Write ``--lerobot``'s rows to ``path`` (Parquet); returns what to record in the manifest."""
    import pyarrow.parquet as pq

    from tokenbucket.tokens.lerobot import lerobot_rows

    deltas = None if args.delta_timestamps is None else _json_object_arg(args.delta_timestamps, "--delta-timestamps")
    cameras = None
    if args.cameras is not None:
        cameras = [c.strip() for c in args.cameras.split(",") if c.strip()]
        if not cameras:
            raise ConfigError(f"--cameras should name at least one camera key, but got --cameras {args.cameras!r}")
    pq.write_table(lerobot_rows(args.lerobot, deltas, cameras=cameras), path)
    return {"path": str(args.lerobot), "delta_timestamps": deltas, "cameras": cameras}


def _cmd_plan(args: argparse.Namespace) -> int:
    import tempfile

    from tokenbucket.cost.memory import CostModel
    from tokenbucket.plan.manifest import build_manifest

    if args.lerobot is None:
        if not args.metadata:
            raise ConfigError("plan needs METADATA (files or directories) or --lerobot DATASET")
        for flag, value in (("--delta-timestamps", args.delta_timestamps), ("--cameras", args.cameras)):
            if value is not None:
                raise ConfigError(f"{flag} goes with --lerobot DATASET, but no --lerobot was given")
    elif args.metadata:
        raise ConfigError(f"give either METADATA or --lerobot DATASET, not both (got METADATA {args.metadata})")
    spec = spec_from_args(args)
    model = model_from_args(args)
    budget = _budget(args)
    if budget is None:
        raise ConfigError("plan needs a budget: --gpu NAME or --budget-gib X")
    cost = CostModel(model, args.gpu)
    meta: dict[str, Any] = {"model": model.to_dict(), "gpu": args.gpu}
    with tempfile.TemporaryDirectory(prefix="tokenbucket-plan-") as tmp:
        sources: list[Any] = args.metadata
        if args.lerobot is not None:
            # the rows go through the same path as a metadata file (one Parquet file, removed after)
            rows = Path(tmp) / "lerobot-rows.parquet"
            meta["lerobot"] = _lerobot_metadata(args, rows)
            sources = [rows]
        manifest = build_manifest(sources, spec, cost, args.out, budget_bytes=budget, max_buckets=args.max_buckets,
                                  mode=args.plan_mode, on_oversize=args.on_oversize, on_invalid=args.on_invalid,
                                  meta=meta)
    if args.json:
        print(json.dumps(_plan_json(manifest.plan)))
    else:
        _print_plan(manifest.plan)
        print(f"manifest: {args.out} ({len(manifest):,} rows)")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from tokenbucket.plan.manifest import load_manifest

    manifest = load_manifest(args.manifest)
    if args.json:
        out = _plan_json(manifest.plan)
        out["rows"] = len(manifest)
        out["meta"] = manifest.meta.get("meta", {})
        print(json.dumps(out))
    else:
        print(f"{args.manifest}: {len(manifest):,} rows, created {manifest.meta.get('created')}, "
              f"hash {manifest.content_hash[:12]}")
        _print_plan(manifest.plan)
        totals = manifest.table.column("total").drop_null().to_numpy()
        if len(totals):
            print("\nL_total histogram (log2 bins):")
            print(_histogram(totals))
    if args.plot is not None:
        _plot_histogram(manifest, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from tokenbucket.monitor.hooks import format_summary, summarize_events
    from tokenbucket.monitor.report import read_events, write_report

    log = read_events(args.run)
    rows = summarize_events(log.events)
    counts = log.counts()
    if args.json:
        print(json.dumps({"buckets": rows, "events": counts, "partial_last_line": log.partial_last_line}))
    else:
        print(format_summary(rows))
        print(f"events: {len(log.of('step')):,} steps, " + ", ".join(f"{k} {n:,}" for k, n in counts.items()))
        if log.partial_last_line:
            print(f"note: the last line of {args.run} was cut short (killed run?) and was skipped")
    if args.out is not None:
        files = write_report(log, args.out)
        if not args.json:
            print(f"report written to {files.html} (plots beside it)")
    return 0


def _plot_histogram(manifest: Any, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'tokenbucket[plot]'") from None
    import numpy as np

    totals = manifest.table.column("total").drop_null().to_numpy()
    fig, ax = plt.subplots(figsize=(10, 4))
    bins = np.geomspace(max(1, totals.min()), totals.max() + 1, 120).tolist()
    ax.hist(totals, bins=bins, color="#4c72b0")
    for b in manifest.plan.buckets:
        ax.axvline(b.bound, color="#dd8452", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("L_total (tokens); orange lines: bucket bounds")
    ax.set_ylabel("samples")
    ax.set_title(f"{len(manifest):,} samples, {len(manifest.plan.buckets)} buckets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _histogram(totals: Any, width: int = 40) -> str:
    import numpy as np

    edges = 2 ** np.arange(int(np.log2(max(totals.min(), 1))), int(np.ceil(np.log2(totals.max() + 1))) + 1)
    counts, _ = np.histogram(totals, bins=edges)
    peak = counts.max()
    lines = []
    for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True):
        bar = "#" * max(1 if c else 0, round(width * c / peak))
        lines.append(f"  {int(lo):>8,} - {int(hi) - 1:>8,}  {c:>9,}  {bar}")
    return "\n".join(lines)


def _cmd_demo(args: argparse.Namespace) -> int:
    import time

    import pyarrow.parquet as pq

    from tokenbucket.testing import mixture_a
    from tokenbucket.tokens.breakdown import breakdown_table
    from tokenbucket.tokens.metadata import read_metadata
    from tokenbucket.tokens.spec import TokenSpec

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metadata.parquet"
    print(f"1. writing {args.samples:,} samples of mixture A (multi-camera, seed {args.seed}) to {path}")
    pq.write_table(mixture_a(args.samples, seed=args.seed), path)
    spec = TokenSpec(patch=14)
    print(f"2. token spec: patch {spec.patch}, resize {spec.resize}; text/proprio/action/memory from columns")
    start = time.perf_counter()
    table = read_metadata(path)
    result = breakdown_table(table, spec)
    seconds = time.perf_counter() - start
    print(f"3. read + validated + counted in {seconds:.2f} s ({args.samples / seconds:,.0f} rows/s)\n")
    summary = result.summary()
    _print_summary(summary, str(path))
    print("\nL_total histogram (log2 bins; the tail is what a fixed batch size OOMs on):")
    print(_histogram(result.totals))
    biggest = result.table.sort_by([("total", "descending")]).slice(0, 3).to_pylist()
    print("\nlargest samples (the ones that OOM a naive batch):")
    meta = table.take([r["index"] for r in biggest]).to_pylist()
    for r, m in zip(biggest, meta, strict=True):
        print(f"  {r['key']}: {m['cameras']} cameras x {m['frames']} frames x {m['height']}px "
              f"-> {r['total']:,} tokens (vision {r['vision']:,})")
    from tokenbucket.cost.gpus import gpu_budget_bytes
    from tokenbucket.cost.memory import CostModel
    from tokenbucket.cost.model import ModelSpec

    model = ModelSpec.preset("design-24L-1024")
    cost = CostModel(model, "H100-SXM")
    budget = gpu_budget_bytes("H100-SXM")
    print(f"\non {model.name} ({model.precision}, {model.attention} attention, training) on an H100-SXM "
          f"(budget {_gib(budget)}):")
    for label in ("p50", "p90", "p99", "max"):
        length = summary[label]
        print(f"  {label} sample, {length:>7,} tokens: {_gib(cost.memory(1, length).total):>10} alone, "
              f"largest batch {cost.max_batch(length, budget)}")
    wd = dataclasses.replace(spec, tubelet=2)
    halved = breakdown_table(table, wd).summary()
    print(f"(with tubelet=2 the p99 would drop from {summary['p99']:,} to {halved['p99']:,} tokens)")

    from tokenbucket.plan.manifest import build_manifest

    manifest_path = out_dir / "manifest.parquet"
    print(f"\n4. planning at most 32 static shapes under the H100 budget; samples that fit not even alone "
          f"are rejected with their reason -> {manifest_path}")
    start = time.perf_counter()
    # build_manifest records the cost model's model and GPU itself
    manifest = build_manifest(path, spec, cost, manifest_path, budget_bytes=budget, on_oversize="reject",
                              progress=False)
    print(f"   planned and written in {time.perf_counter() - start:.2f} s\n")
    _print_plan(manifest.plan)

    from tokenbucket.cli.demo import train_under_monitor
    from tokenbucket.monitor.hooks import format_summary

    print("\n5. a short CPU training run under the monitor: the first 384 samples, tokenised coarsely "
          "(patch 112), a 2-layer model, a 96 MiB \"GPU\" so the plan has several buckets")
    start = time.perf_counter()
    run = train_under_monitor(table, out_dir)
    print(f"   {run['steps']} steps over {len(run['plan'].buckets)} buckets in {time.perf_counter() - start:.1f} s; "
          f"per bucket (CPU: no measured memory):\n")
    print(format_summary(run["summary"]))
    print(f"\n   run log: {run['log']}")
    try:
        from tokenbucket.monitor.report import read_events, write_report

        files = write_report(read_events(run["log"]), out_dir / "report")
        print(f"   report: {files.html} (plots beside it); again with `tokenbucket report {run['log']} --out DIR`")
    except ConfigError as exc:  # matplotlib is the optional `plot` extra
        print(f"   no plots: {exc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenbucket", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    tokens = sub.add_parser("tokens", help="token breakdown of a metadata file or of one --sample")
    tokens.add_argument("metadata", nargs="?", help="Parquet/JSONL/CSV file or a directory of parts")
    tokens.add_argument("--sample", help="one sample as a JSON object")
    tokens.add_argument("--json", action="store_true", help="print JSON")
    tokens.add_argument("--on-invalid", choices=["raise", "reject"], default="raise",
                        help="stop at the first bad row, or report bad rows and go on")
    _add_spec_flags(tokens)
    tokens.set_defaults(func=_cmd_tokens)

    gpus = sub.add_parser("gpus", help="the GPU registry and each GPU's memory budget")
    gpus.add_argument("--json", action="store_true")
    gpus.set_defaults(func=_cmd_gpus)

    cost = sub.add_parser("cost", help="itemised memory, FLOPs and fit of one batch shape")
    cost.add_argument("--batch", type=int, required=True)
    cost.add_argument("--length", type=int, required=True, help="padded sequence length in tokens")
    cost.add_argument("--gpu", help="GPU target (see `tokenbucket gpus`)")
    cost.add_argument("--budget-gib", type=float, help="memory budget instead of a GPU's")
    cost.add_argument("--mfu", type=float, default=0.4, help="assumed FLOPs utilisation for step time")
    cost.add_argument("--json", action="store_true")
    _add_model_flags(cost, with_config=True)
    cost.set_defaults(func=_cmd_cost)

    ledger = sub.add_parser("ledger", help="one sample's tokens as bytes and FLOPs, with what-ifs")
    ledger.add_argument("--sample", required=True, help="one sample as a JSON object")
    ledger.add_argument("--batch", type=int, default=1)
    ledger.add_argument("--whatif", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                        help="e.g. frames=32, side=448, kv_heads=4, patch=28, batch=2 (repeatable)")
    ledger.add_argument("--json", action="store_true")
    _add_spec_flags(ledger)
    _add_model_flags(ledger)
    ledger.set_defaults(func=_cmd_ledger)

    prof = sub.add_parser("profile", help="measure a model's peak memory on fake tensors (or CUDA)")
    prof.add_argument("factory", help="MODULE:FACTORY returning the nn.Module (given spec= if it takes one)")
    prof.add_argument("--input", help="MODULE:FN (batch, length) -> input; default [B, L, hidden] tensor")
    prof.add_argument("--batch", type=int, default=1)
    prof.add_argument("--length", type=int, action="append", help="sequence length (repeatable)")
    prof.add_argument("--device", choices=["fake", "cuda"], default="fake")
    prof.add_argument("--gpu", help="the GPU target a saved profile is for")
    prof.add_argument("--save", type=Path, help="also measure a small grid and save a profile JSON")
    prof.add_argument("--json", action="store_true")
    _add_model_flags(prof, with_config=True)
    prof.set_defaults(func=_cmd_profile)

    plan = sub.add_parser("plan", help="plan memory-safe buckets and write the manifest")
    plan.add_argument("metadata", nargs="*", help="metadata files or directories (or give --lerobot)")
    plan.add_argument("--lerobot", type=Path, metavar="DATASET",
                      help="plan a LeRobot v2.x/v3.0 dataset from its meta/ folder (one sample per frame)")
    plan.add_argument("--delta-timestamps", metavar="JSON",
                      help="with --lerobot: LeRobot's offsets in seconds per key, as a JSON object or @file.json")
    plan.add_argument("--cameras", metavar="A,B", help="with --lerobot: the camera keys the policy uses")
    plan.add_argument("--out", required=True, type=Path, help="the manifest .parquet to write")
    plan.add_argument("--gpu", help="GPU target (see `tokenbucket gpus`)")
    plan.add_argument("--budget-gib", type=float, help="memory budget instead of a GPU's")
    plan.add_argument("--max-buckets", type=int, default=32)
    plan.add_argument("--mode", dest="plan_mode", choices=["static", "dynamic", "packed"], default="static",
                      help="static: at most K shapes; dynamic: batches padded to their own longest sample")
    plan.add_argument("--on-oversize", choices=["error", "reject"], default="error")
    plan.add_argument("--on-invalid", choices=["raise", "reject"], default="raise")
    plan.add_argument("--json", action="store_true")
    _add_spec_flags(plan)
    _add_model_flags(plan, mode_flag="--model-mode")
    plan.set_defaults(func=_cmd_plan)

    inspect_ = sub.add_parser("inspect", help="the plan and length histogram of a manifest")
    inspect_.add_argument("manifest", type=Path)
    inspect_.add_argument("--json", action="store_true")
    inspect_.add_argument("--plot", type=Path, help="write a PNG histogram with the bucket bounds")
    inspect_.set_defaults(func=_cmd_inspect)

    report = sub.add_parser("report", help="per-bucket latency, memory and risk of a training run's JSONL log")
    report.add_argument("run", type=Path, help="the monitor's RUN.jsonl")
    report.add_argument("--json", action="store_true")
    report.add_argument("--out", type=Path, help="also write four PNG plots and a self-contained report.html here")
    report.set_defaults(func=_cmd_report)

    demo = sub.add_parser("demo", help="the main job on a realistic multi-camera dataset")
    demo.add_argument("--out", default="tokenbucket-demo", help="directory for the demo's files")
    demo.add_argument("--samples", type=int, default=200_000, help="number of samples")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except TokenbucketError as exc:
        print(f"tokenbucket {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
