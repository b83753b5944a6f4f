"""Hypothesis strategies for token specs and metadata rows, kept in one place."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tokenbucket import CountRule, TokenSpec

CAMERA_NAMES = ("top", "wrist", "left", "right")


@st.composite
def camera_fields(draw: st.DrawFn) -> dict[str, Any]:
    patch = draw(st.sampled_from([1, 8, 14, 16, 28]))
    merge = draw(st.sampled_from([1, 1, 2]))
    resize = draw(st.sampled_from(["pad", "crop", "fixed", "max_pixels"]))
    out: dict[str, Any] = {"patch": patch, "merge": merge, "resize": resize}
    if resize == "fixed":
        out["fixed_size"] = (draw(st.integers(1, 600)), draw(st.integers(1, 600)))
    if resize == "max_pixels":
        factor = patch * merge
        lo = factor * factor
        out["max_pixels"] = draw(st.integers(lo, 1_500_000))
        out["min_pixels"] = draw(st.integers(0, out["max_pixels"]))
    out["tubelet"] = draw(st.sampled_from([1, 2, 4]))
    out["causal_first_frame"] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        out["tokens_per_frame"] = draw(st.integers(1, 256))
    out["special_per_frame"] = draw(st.sampled_from([0, 0, 1, 2]))
    out["special_per_camera"] = draw(st.sampled_from([0, 0, 1, 3]))
    return out


rules = st.one_of(
    st.builds(
        CountRule,
        column=st.sampled_from(["text_tokens", "action_tokens"]),
        optional=st.booleans(),
        tokens_per_unit=st.integers(0, 3),
    ),
    st.builds(CountRule, count=st.integers(0, 100), tokens_per_unit=st.integers(0, 3)),
    st.builds(CountRule, column=st.just("frames"), tokens_per_unit=st.integers(1, 2)),
)


@st.composite
def token_specs(draw: st.DrawFn) -> TokenSpec:
    base = draw(camera_fields())
    overrides = {}
    for name in draw(st.lists(st.sampled_from([*CAMERA_NAMES, "camera1"]), max_size=2, unique=True)):
        change = draw(camera_fields())
        overrides[name] = change
    return TokenSpec(
        **base,
        overrides=overrides,
        camera_names=draw(st.sampled_from([(), ("top", "wrist"), ("left", "right", "top")])),
        camera_slots=draw(st.sampled_from([None, None, 2, 4])),
        text=draw(rules),
        action=draw(rules),
        extras=draw(st.sampled_from([{}, {"register": CountRule(count=4)}])),
    )


# Values a metadata cell may hold: mostly valid, sometimes each kind of invalid.
def counts(lo: int, hi: int, *, bad: bool) -> st.SearchStrategy[Any]:
    good = st.integers(lo, hi)
    if not bad:
        return good
    return st.one_of(
        good,
        good,
        good,
        good,
        st.none(),
        st.just(float("nan")),
        st.integers(-5, lo - 1) if lo > -5 else st.just(-1),
        st.just(2.5),
    )


@st.composite
def flat_rows(draw: st.DrawFn, n: int, *, bad: bool = False) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        rows.append(
            {
                "key": f"k{i}",
                "cameras": draw(counts(0, 5, bad=bad)),
                "frames": draw(counts(1, 40, bad=bad)),
                "height": draw(counts(1, 700, bad=bad)),
                "width": draw(counts(1, 700, bad=bad)),
                "text_tokens": draw(counts(0, 500, bad=bad)),
                "action_tokens": draw(counts(0, 64, bad=bad)),
            }
        )
    return rows


@st.composite
def list_rows(draw: st.DrawFn, n: int, *, bad: bool = False) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        cams = []
        for _ in range(draw(st.integers(0 if bad else 1, 4))):
            cams.append(
                {
                    "name": draw(st.one_of(st.none(), st.sampled_from(CAMERA_NAMES))),
                    "frames": draw(counts(1, 40, bad=bad)),
                    "height": draw(counts(1, 700, bad=bad)),
                    "width": draw(counts(1, 700, bad=bad)),
                }
            )
        rows.append(
            {
                "key": f"k{i}",
                "cameras": cams,
                "text_tokens": draw(counts(0, 500, bad=bad)),
                "action_tokens": draw(counts(0, 64, bad=bad)),
            }
        )
    return rows
