"""Per-bucket aggregates of a run: what the monitor keeps in memory and ``tokenbucket report``
rebuilds from the log (latency percentiles, tokens/s, predicted and measured peaks, risk)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenbucket._exceptions import ConfigError

__all__ = ["EVENT_FIELDS", "RunStats", "bucket_bounds_2d", "event_problem", "format_summary", "summarize_events"]

# NOTE [ Event fields ]
# The fields a run log's events must carry for the report: (name, kind, required) per event type.
# A required field is one the monitor always writes a value for; an optional one may be absent or
# null, and absent reads as null: ``measured_bytes`` and ``reserved_bytes`` are null in every run
# without a memory reader (CPU), the oom ``step`` and the start ``risk_threshold`` only place
# lines on the risk plot; ``rows``, ``length``, ``flops`` and ``predicted_s`` are what
# ``tokenbucket calibrate`` reads (NOTE [ Calibration fit ]). Fields not listed (``time``,
# ``tokens_per_s``, ...) are not read. ``count``: an integer >= 0; ``amount``: a finite number >= 0; both below 2**63.
# A 2D run's start event (a bucket of its ``buckets`` has a ``vision_bound``) must give every
# bucket a ``bucket``, ``bound`` and ``vision_bound`` count: the report places each bucket by
# both bounds (NOTE [ The 2D report grid ]); a 1D start's buckets are not read here.
EVENT_FIELDS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "step": (
        ("step", "count", True),
        ("bucket", "count", True),
        ("latency_s", "amount", True),
        ("real_tokens", "count", True),
        ("padded_tokens", "count", True),
        ("predicted_bytes", "amount", True),
        ("risk", "amount", True),
        ("measured_bytes", "amount", False),
        ("reserved_bytes", "amount", False),
        ("rows", "count", False),
        ("length", "count", False),
        ("flops", "amount", False),
        ("predicted_s", "amount", False),
        ("compiles", "count", False),
    ),
    "risk": (("bucket", "count", True),),
    "oom": (("bucket", "count", True), ("step", "count", False)),
    "start": (("risk_threshold", "amount", False),),
}
_LIMIT = 2**63


def _fits(value: object, kind: str) -> bool:
    # type() rather than isinstance(): a bool is no count; NaN and infinities fail the range
    if type(value) is int:
        return 0 <= value < _LIMIT
    return type(value) is float and kind == "amount" and 0 <= value < _LIMIT


def event_problem(event: Mapping[str, object]) -> str | None:
    """What keeps ``event`` from being read (NOTE [ Event fields ]), in words, or ``None``.

    Example:
        >>> event_problem({"event": "oom", "step": 3})
        "the oom event has no 'bucket' field (it needs bucket)"
        >>> event_problem({"event": "step", "step": 0, "bucket": 1, "latency_s": 0.5, "real_tokens": 96,
        ...                "padded_tokens": 128, "predicted_bytes": 2**20, "risk": 0.25}) is None  # CPU: no measured_bytes
        True
    """
    kind = event.get("event")
    if kind == "start":
        problem = _buckets_problem(event.get("buckets"))
        if problem is not None:
            return problem
    fields = EVENT_FIELDS.get(kind, ()) if isinstance(kind, str) else ()
    for name, value_kind, required in fields:
        value = event.get(name)
        if _fits(value, value_kind) or (value is None and not required):
            continue
        if name not in event:
            needed = ", ".join(n for n, _, r in fields if r)
            return f"the {kind} event has no {name!r} field (it needs {needed})"
        what = "an integer >= 0" if value_kind == "count" else "a finite number >= 0"
        return f"the {kind} event's {name!r} should be {what} below 2**63, but got {name}={_shown(value)}"
    return None


def _shown(value: object) -> str:
    return repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."


def _is_2d(buckets: list[object]) -> bool:
    """Whether a start event's ``buckets`` are a 2D plan's: one of them has a ``vision_bound``."""
    return any(isinstance(b, dict) and b.get("vision_bound") is not None for b in buckets)


def _buckets_problem(buckets: object) -> str | None:
    """What keeps a 2D start event's ``buckets`` from being read (NOTE [ Event fields ]), or ``None``."""
    if not isinstance(buckets, list) or not _is_2d(buckets):
        return None
    for i, b in enumerate(buckets):
        if not isinstance(b, dict):
            return f"the start event's buckets[{i}] should be an object, but got {_shown(b)}"
        for name in ("bucket", "bound", "vision_bound"):
            value = b.get(name)
            if _fits(value, "count"):
                continue
            if value is None:
                why = " (a 2D plan bounds every bucket's image tokens)" if name == "vision_bound" else ""
                return f"the start event's buckets[{i}] has no {name!r}{why}"
            return f"the start event's buckets[{i}][{name!r}] should be an integer >= 0 below 2**63, but got {_shown(value)}"
    return None


def bucket_bounds_2d(start: Mapping[str, object]) -> dict[int, tuple[int, int]]:
    """Each bucket's ``(bound, vision_bound)`` from a 2D run's ``start`` event, by bucket index;
    ``{}`` for a 1D run, a start without buckets, or buckets :func:`event_problem` refuses.

    Example:
        >>> bucket_bounds_2d({"event": "start", "buckets": [{"bucket": 0, "bound": 512, "vision_bound": 256}]})
        {0: (512, 256)}
        >>> bucket_bounds_2d({"event": "start", "buckets": [{"bucket": 0, "bound": 512}]})
        {}
    """
    buckets = start.get("buckets")
    if not isinstance(buckets, list) or not _is_2d(buckets) or _buckets_problem(buckets) is not None:
        return {}
    return {int(b["bucket"]): (int(b["bound"]), int(b["vision_bound"])) for b in buckets}


# NOTE [ Latency histogram ]
# Latencies are counted in log-spaced bins 1 % wide (sparse: a bucket's steps fill a few bins),
# so percentiles cost constant memory and state over a run of any length, within 0.5 %; the
# maximum is kept exactly.
_BIN = math.log(1.01)


def _latency_bin(seconds: float) -> int:
    return math.floor(math.log(max(seconds, 1e-9)) / _BIN)


def _percentile(bins: Mapping[int, int], total: int, q: float) -> float:
    rank = max(1, math.ceil(q / 100 * total))  # nearest rank
    seen = 0
    for b in sorted(bins):
        seen += bins[b]
        if seen >= rank:
            return math.exp((b + 0.5) * _BIN)  # the bin's geometric middle
    raise AssertionError("rank beyond the histogram's count")


@dataclass
class _Bucket:
    steps: int = 0
    latency_bins: dict[int, int] = field(default_factory=dict)
    latency_max: float = 0.0
    seconds: float = 0.0
    real_tokens: int = 0
    padded_tokens: int = 0
    predicted_peak: int = 0
    measured_peak: int | None = None
    reserved_peak: int | None = None
    max_risk: float = 0.0
    max_ratio: float | None = None
    risky: int = 0
    ooms: int = 0


class RunStats:
    """Per-bucket aggregates of step, risk and oom events; the monitor's and the report's."""

    def __init__(self) -> None:
        self.buckets: dict[int, _Bucket] = {}
        # a 2D run's (bound, vision_bound) per bucket, from its first start event; not state: the plan's
        self.bounds: dict[int, tuple[int, int]] = {}

    def _bucket(self, k: int) -> _Bucket:
        b = self.buckets.get(k)
        if b is None:
            b = self.buckets[k] = _Bucket()
        return b

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event["event"]
        if kind == "step":
            self.add_step(
                event["bucket"],
                event["latency_s"],
                event["real_tokens"],
                event["padded_tokens"],
                event["predicted_bytes"],
                event.get("measured_bytes"),  # NOTE [ Event fields ]: optional, absent reads as null
                event.get("reserved_bytes"),
                event["risk"],
            )
        elif kind == "oom":
            self._bucket(event["bucket"]).ooms += 1
        elif kind == "risk":
            self._bucket(event["bucket"]).risky += 1
        elif kind == "start" and not self.bounds:
            self.bounds = bucket_bounds_2d(event)

    def add_step(
        self,
        bucket: int,
        latency: float,
        real_tokens: int,
        padded_tokens: int,
        predicted: int,
        measured: int | None,
        reserved: int | None,
        risk: float,
    ) -> None:
        # plain comparisons, not max(): this runs every step (benchmarks/bench_monitor.py)
        b = self.buckets.get(bucket) or self._bucket(bucket)
        b.steps += 1
        k = _latency_bin(latency)
        b.latency_bins[k] = b.latency_bins.get(k, 0) + 1
        if latency > b.latency_max:
            b.latency_max = latency
        b.seconds += latency
        b.real_tokens += real_tokens
        b.padded_tokens += padded_tokens
        if predicted > b.predicted_peak:
            b.predicted_peak = predicted
        if risk > b.max_risk:
            b.max_risk = risk
        if measured is not None:
            b.measured_peak = max(b.measured_peak or 0, measured)
            b.reserved_peak = max(b.reserved_peak or 0, reserved or 0)
            if predicted > 0:  # a ratio to nothing predicted is no drift figure
                ratio = measured / predicted
                b.max_ratio = ratio if b.max_ratio is None else max(b.max_ratio, ratio)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per bucket seen, by bucket (the keys :func:`format_summary` prints); a 2D run's
        also carry the bucket's ``bound`` and ``vision_bound`` (``None`` for a bucket the plan lacks)."""
        out = []
        for k in sorted(self.buckets):
            b = self.buckets[k]
            bounds = self.bounds.get(k, (None, None))
            out.append(
                {
                    "bucket": k,
                    **({"bound": bounds[0], "vision_bound": bounds[1]} if self.bounds else {}),
                    "steps": b.steps,
                    # NOTE [ Latency histogram ]: percentiles within 1 %, capped by the exact maximum
                    "latency_p50_s": min(_percentile(b.latency_bins, b.steps, 50), b.latency_max) if b.steps else None,
                    "latency_p95_s": min(_percentile(b.latency_bins, b.steps, 95), b.latency_max) if b.steps else None,
                    "latency_max_s": b.latency_max if b.steps else None,
                    "tokens_per_s": b.real_tokens / b.seconds if b.seconds > 0 else None,
                    "padding_efficiency": b.real_tokens / b.padded_tokens if b.padded_tokens else None,
                    "predicted_peak_bytes": b.predicted_peak,
                    "measured_peak_bytes": b.measured_peak,
                    "reserved_peak_bytes": b.reserved_peak,
                    "max_risk": b.max_risk,
                    "drift_ratio": b.max_ratio,
                    "risky_batches": b.risky,
                    "ooms": b.ooms,
                }
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        # JSON-ready: string keys throughout
        return {
            str(k): {**vars(b), "latency_bins": {str(i): c for i, c in b.latency_bins.items()}}
            for k, b in self.buckets.items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buckets = {
            int(k): _Bucket(**{**v, "latency_bins": {int(i): c for i, c in v["latency_bins"].items()}})
            for k, v in state.items()
        }


def summarize_events(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The per-bucket table of a run log's events (what ``tokenbucket report`` prints).

    Raises:
        ConfigError: an event lacks a field the table needs, or holds a wrong value there
            (NOTE [ Event fields ]); the message names the event by its 0-based position.
    """
    stats = RunStats()
    for i, event in enumerate(events):
        problem = event_problem(event)
        if problem is not None:
            raise ConfigError(f"event {i}: {problem}")
        stats.add(event)
    return stats.rows()


def format_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """The per-bucket table as text."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f}"

    # GiB for real GPUs, MiB for the small budgets of CPU runs and tests
    unit, scale = (
        ("GiB", 2**30) if max((r["predicted_peak_bytes"] for r in rows), default=0) >= 2**30 else ("MiB", 2**20)
    )

    def size(v: int | None) -> str:
        return "-" if v is None else f"{v / scale:.2f}"

    # a 2D run's rows name both bounds of their bucket (NOTE [ The 2D report grid ])
    two_d = any("vision_bound" in r for r in rows)

    def bounds(r: Mapping[str, Any]) -> str:
        if not two_d:
            return ""
        return "".join(f"{'-' if r.get(k) is None else f'{r[k]:,}':>8} " for k in ("bound", "vision_bound"))

    head = (
        f"{'bucket':>6} "
        + (f"{'bound':>8} {'images':>8} " if two_d else "")
        + f"{'steps':>6} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'tokens/s':>10} {'pad eff':>7} "
        f"{'pred ' + unit:>8} {'meas ' + unit:>8} {'max risk':>8} {'drift':>6} {'risky':>5} {'ooms':>4}"
    )
    lines = [head]
    for r in rows:
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        eff = "-" if r.get("padding_efficiency") is None else f"{r['padding_efficiency']:.3f}"
        drift = "-" if r["drift_ratio"] is None else f"{r['drift_ratio']:.3f}"
        lines.append(
            f"{r['bucket']:>6} {bounds(r)}{r['steps']:>6} {ms(r['latency_p50_s']):>8} {ms(r['latency_p95_s']):>8} "
            f"{ms(r['latency_max_s']):>8} {tps:>10} {eff:>7} {size(r['predicted_peak_bytes']):>8} "
            f"{size(r['measured_peak_bytes']):>8} {r['max_risk']:>8.3f} {drift:>6} "
            f"{r.get('risky_batches', 0):>5} {r['ooms']:>4}"
        )
    return "\n".join(lines)
