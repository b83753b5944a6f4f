"""What the verbs share: the token-spec and model flags and their parsers, JSON flag values, budgets,
and the printed summaries, plans and histograms."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tokenbucket._config import json_object, load_toml
from tokenbucket._exceptions import ConfigError, UsageError
from tokenbucket.cost.gpus import GIB, GPU, get_gpu, gpu_budget_bytes
from tokenbucket.cost.model import ModelSpec
from tokenbucket.tokens.spec import TokenSpec

T = TypeVar("T")

# the tokenbucket.toml sections some verb reads (NOTE [ Strict config ] in tokenbucket._config)
CONFIG_SECTIONS = ("model", "tokens")

# NOTE [ Flag values ]
# A number a flag cannot take is refused by the flag's argparse ``type`` below, so the message
# names the flag the user typed ("--batch should be a positive integer, got 0") and the exit
# status is 2, as for argparse's own errors; ``_Parser.error`` in ``main`` drops argparse's
# "argument --batch:" prefix from these "should be" messages. The library still checks every
# value (a config file's included) in its own words (``batch=0``).


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "a non-negative integer")


def _int_at_least(text: str, minimum: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"should be {kind}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"should be {kind}, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (``nan``, ``inf`` and words are refused)."""
    value = _finite(text, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"should be a positive number, got {text}")
    return value


def unit_fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (a utilisation)."""
    value = _finite(text, "a number in (0, 1]")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"should be a number in (0, 1], got {text}")
    return value


def share(text: str) -> float:
    """An argparse type: a number in [0, 1] (a share)."""
    value = _finite(text, "a number in [0, 1]")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"should be a number in [0, 1], got {text}")
    return value


def _finite(text: str, kind: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"should be {kind}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"should be {kind}, got {text!r}")
    return value


def _size(text: str) -> tuple[int, int]:
    parts = text.lower().replace("×", "x").split("x")
    try:
        if 1 <= len(parts) <= 2:
            height, width = int(parts[0]), int(parts[-1])
            if height >= 1 and width >= 1:
                return height, width
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"should be HEIGHTxWIDTH or SIDE in pixels (positive integers), got {text!r}")


def _add_spec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("token spec (each overrides --config)")
    g.add_argument("--config", type=Path, help="tokenbucket.toml whose [tokens] section is the base spec")
    g.add_argument("--patch", type=positive_int, help="patch side in pixels (default 14)")
    g.add_argument("--resize", choices=["pad", "crop", "fixed", "max_pixels"], help="resize policy")
    g.add_argument("--fixed-size", type=_size, metavar="HxW", help="frame size for --resize fixed")
    g.add_argument("--min-pixels", type=non_negative_int, help="lower pixel bound for --resize max_pixels")
    g.add_argument("--max-pixels", type=positive_int, help="upper pixel bound for --resize max_pixels")
    g.add_argument("--merge", type=positive_int, help="spatial token merger side (2 = 2x2)")
    g.add_argument("--tubelet", type=positive_int, help="frames per temporal token")
    g.add_argument(
        "--causal-first-frame",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep frame 0 apart: 1 + ceil((frames-1)/tubelet)",
    )
    g.add_argument("--tokens-per-frame", type=positive_int, help="resampler output per frame (replaces patches)")
    g.add_argument("--special-per-frame", type=non_negative_int, help="special tokens per temporal token")
    g.add_argument("--special-per-camera", type=non_negative_int, help="special tokens per camera")
    g.add_argument("--camera-slots", type=positive_int, help="fixed camera slots (empty ones still cost)")
    g.add_argument("--camera-names", help="comma-separated names of the flat schema's camera positions")
    g.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="CAMERA:FIELD=VALUE",
        help="per-camera override, e.g. wrist:tokens_per_frame=64 (repeatable)",
    )
    for name in ("text", "proprio", "action", "memory"):
        g.add_argument(
            f"--{name}",
            metavar="RULE",
            help=f"{name} tokens: N, COLUMN, N*K, COLUMN*K; '?' after a column makes it optional",
        )
    g.add_argument(
        "--extra", action="append", default=[], metavar="NAME=RULE", help="named extra modality (repeatable)"
    )
    g.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="FIELD=NAME",
        help="metadata column mapping, e.g. key=episode_id or cameras=views (repeatable)",
    )


def _add_model_flags(p: argparse.ArgumentParser, *, with_config: bool = False, mode_flag: str = "--mode") -> None:
    g = p.add_argument_group("model (each overrides --config's [model] and --preset; default preset design-24L-1024)")
    if with_config:
        g.add_argument("--config", type=Path, help="tokenbucket.toml whose [model] section is the base")
    g.add_argument("--preset", help="start from a named model (see ModelSpec presets)")
    g.add_argument("--hidden", type=positive_int, help="model width D")
    g.add_argument("--layers", type=positive_int, help="number of blocks")
    g.add_argument("--heads", type=positive_int, help="attention heads")
    g.add_argument("--kv-heads", type=positive_int, help="K/V heads (GQA/MQA)")
    g.add_argument("--mlp-ratio", type=positive_float, help="MLP width over hidden (default 4)")
    g.add_argument("--gated-mlp", action=argparse.BooleanOptionalAction, default=None, help="SwiGLU MLP")
    g.add_argument(
        "--precision",
        choices=["bf16", "amp", "fp32"],
        help="bf16 (all in bf16), amp (fp32 master weights, bf16 compute) or fp32",
    )
    g.add_argument(
        "--attention",
        choices=["flash", "sdpa", "eager", "mem_efficient"],
        help="attention kernel: eager materialises the score matrix, the others do not",
    )
    g.add_argument(
        "--qkv-layout",
        choices=["views", "contiguous", "fused_rotary"],
        help="what the attention kernel gets: views of the projections (default), contiguous copies, "
        "or a fused QKV with rotary Q, K (GPT-NeoX style)",
    )
    g.add_argument("--window", type=positive_int, help="local attention window in tokens")
    g.add_argument("--checkpointing", choices=["none", "full"], help="activation checkpointing of every block")
    g.add_argument(mode_flag, dest="mode", choices=["train", "infer"], help="train (default) or infer")
    g.add_argument("--optimizer", choices=["adamw", "sgd", "none"], help="optimizer states: adamw 2, sgd 1, none 0")
    g.add_argument("--extra-params", type=non_negative_int, help="parameters outside the blocks (encoders, heads)")
    g.add_argument("--extra-bytes", type=non_negative_int, help="fixed bytes the block model does not see")


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """The :class:`ModelSpec` that ``--config``'s ``[model]``, ``--preset`` and the flags describe."""
    from_file = config_section(args, "model")
    data = dict(from_file)
    if args.preset is not None:
        data["preset"] = args.preset
    for name in (
        "hidden",
        "layers",
        "heads",
        "kv_heads",
        "mlp_ratio",
        "gated_mlp",
        "precision",
        "attention",
        "qkv_layout",
        "window",
        "checkpointing",
        "mode",
        "optimizer",
        "extra_params",
        "extra_bytes",
    ):
        value = getattr(args, name)
        if value is not None:
            data[name] = value
    return _from_config(args, "model", _model_from_dict, data, from_file)  # NOTE [ Config errors name the file ]


def _model_from_dict(data: dict[str, Any]) -> ModelSpec:
    if "preset" not in data and not {"hidden", "layers", "heads"} <= set(data):
        # no full model given: the flags change the design document's 24-layer model
        data = {**data, "preset": "design-24L-1024"}
    return ModelSpec.from_dict(data)


def config_section(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """``--config``'s ``[section]`` (empty without ``--config``); the whole file is read and checked
    once per command (NOTE [ Strict config ] in :mod:`tokenbucket._config`)."""
    path = getattr(args, "config", None)
    if path is None:
        return {}
    tables: dict[str, dict[str, Any]] | None = getattr(args, "config_tables", None)
    if tables is None:
        tables = load_toml(path, CONFIG_SECTIONS)
        args.config_tables = tables
    return tables[section]


def _from_config(
    args: argparse.Namespace,
    section: str,
    build: Callable[[dict[str, Any]], T],
    data: dict[str, Any],
    from_file: dict[str, Any],
) -> T:
    """``build(data)`` (``data``: ``--config``'s ``[section]`` with the flags over it); an error the
    file alone makes names the file.

    NOTE [ Config errors name the file ]
    ``from_dict`` checks the keys and values but does not know where they came from. When the
    merged values fail, the file's own values are tried alone: if they fail with the same message
    (an unknown key, a bad value no flag replaced), the file is the cause and the message names it
    ("tokenbucket.toml [model]: ..."); otherwise a flag is, and the message stands as it is.
    """
    try:
        return build(data)
    except ConfigError as exc:
        if from_file and _fails_alike(build, from_file, exc):
            where = f"{args.config}" if f"[{section}]" in str(exc) else f"{args.config} [{section}]"
            raise ConfigError(f"{where}: {exc}") from None
        raise


def _fails_alike(build: Callable[[dict[str, Any]], object], data: dict[str, Any], exc: ConfigError) -> bool:
    try:
        build(data)
    except ConfigError as alone:
        return str(alone) == str(exc)
    return False


def gpu_from_args(args: argparse.Namespace) -> GPU | None:
    """``--gpu``'s GPU (matched loosely: :func:`~tokenbucket.cost.gpus.get_gpu`), or None."""
    if args.gpu is None:
        return None
    try:
        return get_gpu(args.gpu, source="--gpu")
    except ConfigError as exc:  # a flag's value: a usage error (exit status 2)
        raise UsageError(str(exc)) from None


def _budget(args: argparse.Namespace) -> int | None:
    if args.budget_gib is not None:  # positive and finite: positive_float
        return int(args.budget_gib * GIB)
    gpu = gpu_from_args(args)
    return None if gpu is None else gpu_budget_bytes(gpu)


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.2f} GiB"


def _parse_value(text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):  # not JSON (or nested too deeply): the text itself
        return text


def _pairs(items: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} should look like NAME=VALUE, but got {flag} {item!r}")
        out.append((name.strip(), value.strip()))
    return out


def spec_from_args(args: argparse.Namespace) -> TokenSpec:
    """The :class:`TokenSpec` that ``--config`` and the spec flags describe."""
    from_file = config_section(args, "tokens")
    data = dict(from_file)
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
        raise UsageError("--resize fixed needs --fixed-size HxW")
    if args.camera_names:
        data["camera_names"] = [n.strip() for n in args.camera_names.split(",") if n.strip()]
    overrides = {k: dict(v) for k, v in data.get("overrides", {}).items()}
    for item in args.override:
        camera, sep, rest = item.partition(":")
        if not sep:
            raise UsageError(f"--override should look like CAMERA:FIELD=VALUE, but got --override {item!r}")
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
    return _from_config(args, "tokens", TokenSpec.from_dict, data, from_file)


def _sample_arg(text: str) -> dict[str, Any]:
    """``--sample``: one JSON object (inline or ``@file.json``)."""
    return _json_object_arg(text, "--sample")


def _json_object_arg(text: str, flag: str) -> dict[str, Any]:
    """A flag's JSON object, given inline or as ``@file.json``."""
    source = f"{flag} {text if len(text) <= 80 else text[:60] + ' ...'!r}"
    if text.startswith("@"):
        path = Path(text[1:])
        source = f"{flag} file {str(path)!r}"
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {source}: {exc}") from None
    return json_object(text, source)


def progress_from_args(args: argparse.Namespace) -> bool | None:
    """Whether to show progress bars: never with ``--quiet``, else when stderr is a terminal (``None``)."""
    return False if getattr(args, "quiet", False) else None
