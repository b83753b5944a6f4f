"""LeRobotPolicy's predicted peaks against LeRobot's own policies (tests/data/lerobot_truth.json).

    .venv/bin/python benchmarks/bench_lerobot_policy.py            # one row per policy, setup and sample shape
    .venv/bin/python benchmarks/bench_lerobot_policy.py --points   # every point

Each point of the fixture is one steady-state LeRobot 0.4.4 training step measured on fake
tensors (``benchmarks/lerobot_truth/measure.py``, its own environment); the prediction is
:meth:`LeRobotPolicy.memory` for the same policy config, batch and sample: the camera slots the
policy runs for the cameras the batch holds (NOTE [ Camera slots ]), the language tokens, the
frame size of the input cameras. Nothing here imports LeRobot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from tokenbucket.cost.lerobot_policy import LeRobotPolicy

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "lerobot_truth.json"


def predicted(p: dict[str, Any]) -> int:
    policy = dataclasses.replace(LeRobotPolicy.from_config(p["config"]), image_features=p["cameras"])
    present = p.get("present", p["cameras"])
    frame = tuple(p.get("frame", (p["image_size"], p["image_size"])))
    mem = policy.memory(
        p["batch"], cameras=policy.slots(present), text_tokens=p["text_tokens"], present=present, frame=frame
    )
    return int(mem["peak_bytes"])


def shape(p: dict[str, Any]) -> str:
    present = p.get("present", p["cameras"])
    h, w = p.get("frame", (p["image_size"], p["image_size"]))
    return f"{present} of {p['cameras']} x {h}x{w} + {p['text_tokens']}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", action="store_true", help="one row per point")
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    args = parser.parse_args(argv)
    points = json.loads(args.fixture.read_text())["points"]
    errors = []
    rows: dict[tuple[str, str, str], list[tuple[int, float, int, int]]] = {}
    for p in points:
        pred = predicted(p)
        err = 100.0 * (pred - p["peak_bytes"]) / p["peak_bytes"]
        errors.append(err)
        rows.setdefault((p["policy"], p["variant"], shape(p)), []).append((p["batch"], err, p["peak_bytes"], pred))
    if args.points:
        print("| policy | variant | cameras x frame + text | batch | LeRobot GiB | predicted GiB | error |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
        for (policy, variant, sh), got in rows.items():
            for b, err, real, pred in sorted(got):
                print(f"| {policy} | {variant} | {sh} | {b} | {real / 2**30:.2f} | {pred / 2**30:.2f} | {err:+.2f} % |")
    else:
        print("| policy | variant | cameras x frame + text | batches | worst under | worst over |")
        print("| --- | --- | --- | --- | ---: | ---: |")
        for (policy, variant, sh), got in rows.items():
            batches = ", ".join(str(b) for b, *_ in sorted(got))
            low, high = min(e for _, e, *_ in got), max(e for _, e, *_ in got)
            print(f"| {policy} | {variant} | {sh} | {batches} | {low:+.2f} % | {high:+.2f} % |")
    print(f"\n{len(errors)} points; worst under {min(errors):+.2f} %, worst over {max(errors):+.2f} % (band: +-7 %)")


if __name__ == "__main__":
    main()
