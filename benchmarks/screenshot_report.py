"""Render a release's report and the models page and photograph them with headless Chromium, to check a
person can read them.

Usage (after an audit, e.g. ``normaudit audit --model minilm-l6 --probes wordnet-nouns --limit 3000
--root /tmp/report-demo``):

    python benchmarks/screenshot_report.py --root /tmp/report-demo --model minilm-l6 [--release R]
        [--out report.png] [--width 1400] [--height 3000]

Writes a PNG of the release's report, of the model's cross-release index and of the models page
(``reports/index.html``), and prints for each how much of the picture is drawn on and how wide the page lays
out in the window (its scroll width and its main tables' right edge, in CSS pixels): a page wider than the
window runs off its right edge. Chromium is driven as ``tests/test_pages_browser.py`` drives it (same flags, a
fresh profile each time). Needs ``chromium`` on PATH (``apt-get install -y chromium``); a local root only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.analysis.models_page import render_models_page  # noqa: E402 - the repository root is put on the path first
from pipeline.analysis.report import render_report  # noqa: E402
from pipeline.storage.catalog import open_catalog  # noqa: E402
from pipeline.storage.store import Store  # noqa: E402
from tests.test_pages_browser import page_layout, screenshot  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="local storage root of an audit")
    parser.add_argument("--model", required=True)
    parser.add_argument("--release", help="default: the latest audited release")
    parser.add_argument("--out", default="report.png")
    parser.add_argument("--width", type=int, default=1400)
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
    render_models_page(store)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pages = {
        out: Path(store.path(f"reports/{args.model}/{release}/index.html")),
        out.with_name(out.stem + "-index.png"): Path(store.path(f"reports/{args.model}/index.html")),
        out.with_name(out.stem + "-models.png"): Path(store.path("reports/index.html")),
    }
    window = (args.width, args.height)
    failed = False
    with tempfile.TemporaryDirectory() as profiles:
        for i, (shot, page) in enumerate(pages.items()):
            pixels = screenshot(page, shot, Path(profiles) / f"shot-{i}", window)
            inked = float((pixels.min(axis=1) < 128).mean())
            layout = page_layout(page, Path(profiles) / f"layout-{i}", window)
            tables = max((t["right"] for t in layout["tables"]), default=0.0)
            print(f"{shot}: {page} ({inked:.0%} of pixel rows carry text or plot ink; laid out "
                  f"{layout['scroll_width']} px wide in a {layout['viewport']} px window, main tables end at "
                  f"{tables:.0f} px)")
            if inked < 0.2:
                print(f"{shot} looks blank: open {page} to see why", file=sys.stderr)
                failed = True
            if layout["scroll_width"] > layout["viewport"]:
                print(f"{page} is wider than the window: it runs off the right edge", file=sys.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
