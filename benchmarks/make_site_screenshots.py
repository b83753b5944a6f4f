"""Screenshots of the documentation site, taken with headless Chromium (nothing drawn by hand).

Command (what docs/img/site-*.png hold; needs Debian's ``chromium``: ``apt-get install -y chromium``)::

    .venv/bin/python benchmarks/make_site_screenshots.py [--out docs/img] [--browser chromium]

It builds the site (``make docs``'s ``mkdocs build --strict`` into a temporary folder), opens two
pages from disk (``file://``; the site loads nothing from the network: ``font: false`` in
mkdocs.yml) at 1280 × 1600 and saves them as PNGs reduced to a 64-colour palette:

* ``site-front.png``: the front page (``docs/index.md``);
* ``site-guide.png``: the guide for a VLA trainer on LeRobot data (``docs/guides/vla.md``).

Reference (2 CPU cores): about 15 s; each PNG about 100-200 KB (the script fails past 300 KB).
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 300 * 1024
SIZE = (1280, 1600)
PAGES = {"site-front.png": "index.html", "site-guide.png": "guides/vla/index.html"}


def screenshot(browser: str, url: str, size: tuple[int, int]) -> Image.Image:
    """``url`` as headless Chromium paints it at ``size`` (width, height)."""
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "shot.png"
        argv = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={tmp}/profile",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={shot}",
            url,
        ]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
        return Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")


def save_small(image: Image.Image, path: Path) -> int:
    """``image`` as a 64-colour PNG at ``path``; returns its size in bytes."""
    buffer = io.BytesIO()
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(buffer, format="PNG", optimize=True)
    data = buffer.getvalue()
    if len(data) > MAX_BYTES:
        raise SystemExit(f"{path} would be {len(data):,} bytes, more than {MAX_BYTES:,}")
    path.write_bytes(data)
    return len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder for the PNGs")
    parser.add_argument("--browser", default="chromium", help="the headless Chromium to run")
    args = parser.parse_args()
    browser = shutil.which(args.browser)
    if browser is None:
        raise SystemExit(f"no {args.browser} on PATH: apt-get install -y chromium (or --browser PATH)")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        mkdocs = Path(sys.executable).with_name("mkdocs")
        subprocess.run([str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(site)], cwd=ROOT, check=True)
        for name, page in PAGES.items():
            size = save_small(screenshot(browser, (site / page).as_uri(), SIZE), args.out / name)
            print(f"{args.out / name}: {size:,} bytes ({page})")
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
