"""Render a release's report and photograph it with headless Chromium, to check a person can read it.

Usage (after an audit, e.g. ``normaudit audit --model minilm-l6 --probes wordnet-nouns --limit 3000
--root /tmp/report-demo``):

    python benchmarks/screenshot_report.py --root /tmp/report-demo --model minilm-l6 [--release R]
        [--out report.png] [--height 3000]

Writes a full-width PNG of the page (and one of the model's cross-release index) and prints how much of
the page is drawn on. Needs ``chromium`` on PATH (``apt-get install -y chromium``); a local root only.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.analysis.report import render_report
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store


def screenshot(page: Path, out: Path, width: int = 1200, height: int = 3000) -> float:
    """Photograph ``page``; returns the share of pixel rows with dark pixels (text or plot ink)."""
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={out}",
            f"--window-size={width},{height}",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )
    pixels = np.asarray(Image.open(out).convert("L"), dtype=float)
    return float((pixels.min(axis=1) < 128).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="local storage root of an audit")
    parser.add_argument("--model", required=True)
    parser.add_argument("--release", help="default: the latest audited release")
    parser.add_argument("--out", default="report.png")
    parser.add_argument("--height", type=int, default=3000)
    args = parser.parse_args()
    if shutil.which("chromium") is None:
        print("chromium is not installed: apt-get install -y chromium", file=sys.stderr)
        return 2
    store = Store(args.root)
    release = (
        args.release
        or open_catalog(store)
        .execute(
            "select release from runs where model = $m order by started_at desc limit 1", {"m": args.model}
        )
        .fetchall()[0][0]
    )
    render_report(store, args.model, release)
    out = Path(args.out)
    pages = {
        out: Path(store.path(f"reports/{args.model}/{release}/index.html")),
        out.with_name(out.stem + "-index.png"): Path(store.path(f"reports/{args.model}/index.html")),
    }
    for shot, page in pages.items():
        inked = screenshot(page, shot, height=args.height)
        print(f"{shot}: {page} ({inked:.0%} of pixel rows carry text or plot ink)")
        if inked < 0.2:
            print(f"{shot} looks blank: open {page} to see why", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
