"""The release report and the models page at 12 probe properties, opened in a real browser.

A Glasgow-norms-shaped probe set (11 rated properties and zipf) is stored for three model@release pairs and
the audit's analyses step runs on each; the pages are rendered by the same code an audit calls. Debian's
headless Chromium then opens them in a 1,400 x 900 window: ``--dump-dom`` of a copy of each page with a
small measuring script appended reads the layout (the document's scroll width, each main table's box and
what its scroll box hides), and ``--screenshot`` photographs the window. Without chromium the browser tests
skip, except under ``CI=true``, where they fail (``tests.requirements.need_chromium``): CI installs it.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.analysis.models_page import render_models_page
from pipeline.analysis.report import render_report
from pipeline.audit.context import AuditContext
from pipeline.audit.release_steps import run_analyses
from pipeline.settings import load_settings
from pipeline.storage.runs import RunRecord, write_run
from pipeline.storage.store import Store
from tests.helpers import store_synthetic, word_probe_set
from tests.requirements import need_chromium

WINDOW = (1400, 900)
# the Glasgow norms' eleven rated dimensions, and word frequency: twelve properties
PROPERTIES = ("arousal", "valence", "dominance", "concreteness", "imageability", "familiarity", "aoa", "size",
              "gender", "semsize", "semgender", "zipf")
RELEASES = (("minilm-l6", "3a6f58140466"), ("minilm-l6", "9b1c2d3e4f50"), ("mpnet-base", "e83bd2c1a7f9"))
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
# Appended to a copy of a page (the pages themselves carry no script): after load, the layout as JSON
MEASURE = """<script>
addEventListener('load', () => {
  const root = document.documentElement;
  const box = e => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right}; };
  const layout = {
    viewport: root.clientWidth, scroll_width: root.scrollWidth,
    tables: [...document.querySelectorAll('table.main')].map(t => ({...box(t),
      hidden: t.parentElement.scrollWidth - t.parentElement.clientWidth})),
    images: [...document.images].map(i => ({...box(i), src: i.getAttribute('src'), drawn: i.naturalWidth})),
  };
  const out = document.createElement('pre');
  out.id = 'layout';
  out.textContent = JSON.stringify(layout);
  document.body.append(out);
});
</script>
"""


def run_chromium(page: Path, profile: Path, *args: str, window: tuple[int, int] = WINDOW) -> str:
    """Open ``page`` in headless Chromium with a fresh profile folder; returns what it printed on stdout."""
    done = subprocess.run(
        [need_chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}", *args,
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert done.returncode == 0, f"chromium failed on {page}: {done.stderr[-2000:]}"
    return done.stdout


def page_layout(page: Path, profile: Path, window: tuple[int, int] = WINDOW) -> dict:
    """The laid-out page's widths (see MEASURE), from a measuring copy written beside it (so images load)."""
    probe = page.with_name(f"layout-{page.name}")
    text = page.read_text()
    assert "</body>" in text and "<script" not in text
    probe.write_text(text.replace("</body>", MEASURE + "</body>"))
    try:
        dom = run_chromium(probe, profile, "--dump-dom", window=window)
    finally:
        probe.unlink()
    found = re.search(r"<pre id=\"layout\">(.*?)</pre>", dom, re.S)
    assert found, f"the measuring script left no layout in the DOM of {page}:\n{dom[-1000:]}"
    return json.loads(html.unescape(found[1]))


def screenshot(page: Path, out: Path, profile: Path, window: tuple[int, int] = WINDOW) -> np.ndarray:
    """Photograph ``page`` in the window; returns the PNG's pixels in grey levels (rows, columns)."""
    run_chromium(page, profile, f"--screenshot={out}", window=window)
    assert out.is_file(), f"chromium wrote no screenshot of {page} to {out}"
    return np.asarray(Image.open(out).convert("L"), dtype=float)


def _store_release(store: Store, model: str, release: str, day: int) -> None:
    rng = np.random.default_rng(day)
    n = 120
    props = {p: np.round(rng.uniform(1, 7, n), 3) for p in PROPERTIES}
    probes = word_probe_set("glasgow-norms", n, props)
    norms = 1 + 0.03 * props["arousal"] - 0.02 * props["zipf"] + rng.normal(0, 0.05, n)
    store_synthetic(store, model, release, probes, norms, n_tokens=rng.integers(2, 5, n))
    run = RunRecord(run_id=f"2024010{day}T000000-{release}", model=model, release=release,
                    fingerprint=str(day) * 64, probe_set=probes.name, params={},
                    started_at=dt.datetime(2024, 1, day, tzinfo=dt.UTC))
    write_run(store, run)
    run_analyses(AuditContext(load_settings(root=store.root_url), model, release, run.run_id, resolved=None))
    run.status = "completed"
    write_run(store, run)


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """The release report of the second release and the models page, over a 12-property probe set."""
    store = Store(str(tmp_path_factory.mktemp("pages") / "root"))
    for day, (model, release) in enumerate(RELEASES, 1):
        _store_release(store, model, release, day)
    model, release = RELEASES[1]
    render_report(store, model, release)
    render_models_page(store)
    return {"report": Path(store.path(f"reports/{model}/{release}/index.html")),
            "models": Path(store.path("reports/index.html"))}


def test_the_models_page_groups_twelve_properties_into_tables_of_three(pages):
    text = pages["models"].read_text()
    captions = re.findall(r"<caption>(.*?)</caption>", text)
    groups = np.reshape(sorted(PROPERTIES), (4, 3)).tolist()  # alphabetical, three to a table
    assert captions == [f"norm vs {', '.join(g)} (properties {3 * i + 1}–{3 * i + 3} of 12)"
                        for i, g in enumerate(groups)]
    for prop in PROPERTIES:  # every property's ρ, and its ρ given zipf but for zipf itself
        assert f"<th>{prop} ρ</th>" in text
        assert (f"<th>{prop} ρ | zipf</th>" in text) == (prop != "zipf")
    for model, release in RELEASES:  # every release in every table
        assert text.count(f"<td>{model}@{release}</td>") == 4


@pytest.mark.parametrize("name", ["models", "report"])
def test_main_tables_fit_a_1400_pixel_window(pages, name, tmp_path):
    layout = page_layout(pages[name], tmp_path / "profile")
    assert WINDOW[0] - 20 <= layout["viewport"] <= WINDOW[0]  # the window, less a vertical scroll bar
    assert layout["tables"], f"no main table on the {name} page"
    for table in layout["tables"]:
        assert 0 <= table["left"] < table["right"] <= layout["viewport"], table
        assert table["hidden"] <= 0, table  # its scroll box hides nothing: the whole table is in view
    assert layout["scroll_width"] <= layout["viewport"]  # nothing on the page runs past the window
    assert layout["images"] and all(i["drawn"] > 0 and i["right"] <= layout["viewport"] for i in layout["images"])

    shot = tmp_path / f"{name}.png"
    pixels = screenshot(pages[name], shot, tmp_path / "profile-shot")
    assert pixels.shape == (WINDOW[1], WINDOW[0])
    assert (pixels.min(axis=1) < 128).mean() > 0.3  # text and tables drawn, not a blank or error page
    keep = os.environ.get("NORMAUDIT_KEEP_SCREENSHOTS")  # a folder: to look at the window by eye
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)


def test_every_plot_is_drawn_whole(pages):
    """No label runs off a plot: a margin of background all round every PNG the pages show."""
    shown = []
    for page in pages.values():
        shown += [page.parent / src for src in re.findall(r"src='([^']+\.png)'", page.read_text())]
    assert sum(p.name.startswith("forest_") for p in shown) == 12 and len(shown) > 12
    for path in shown:
        pixels = np.asarray(Image.open(path).convert("L"), dtype=float)
        edge = np.concatenate([pixels[:4].ravel(), pixels[-4:].ravel(), pixels[:, :4].ravel(),
                               pixels[:, -4:].ravel()])
        assert edge.min() > 240, f"{path.name}: ink within 4 pixels of the edge (a label cut off)"
    forest = [np.asarray(Image.open(p)).shape[0] for p in shown if p.name.startswith("forest_")]
    assert min(forest) > 300  # three releases: rows of their own, not squeezed


def test_the_report_shows_the_claims_table_in_a_browser(tmp_path):
    """A release audited on WordNet-nouns-shaped data: the report, as Chromium lays it out, shows the claims
    table with each test's verdict, population, interval and n, and nothing of it runs past the window."""
    store = Store(str(tmp_path / "root"))
    rng = np.random.default_rng(5)
    n = 200
    props = {"zipf": rng.uniform(1, 7, n), "min_depth": rng.integers(2, 16, n).astype(float),
             "n_senses": rng.integers(1, 9, n).astype(float), "n_all_hyponyms": rng.integers(0, 40, n).astype(float)}
    n_tokens = rng.integers(1, 4, n)
    norms = 6 - 0.4 * props["zipf"] + 0.1 * n_tokens + rng.normal(0, 0.3, n)  # frequent words shorter
    store_synthetic(store, "minilm-l6", "r1", word_probe_set("wordnet-nouns", n, props), norms, n_tokens=n_tokens)
    run = RunRecord(run_id="20240101T000000-claims", model="minilm-l6", release="r1", fingerprint="1" * 64,
                    probe_set="wordnet-nouns", params={}, started_at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC))
    write_run(store, run)
    run_analyses(AuditContext(load_settings(root=store.root_url), "minilm-l6", "r1", run.run_id, resolved=None))
    run.status = "completed"
    write_run(store, run)
    page = Path(store.path("reports/minilm-l6/r1/index.html"))
    render_report(store, "minilm-l6", "r1")
    dom = run_chromium(page, tmp_path / "profile", "--dump-dom")
    table = re.search(r"<h2>Claims of the paper</h2>.*?(<table.*?</table>)", dom, re.S)
    assert table, dom[-2000:]
    rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in re.findall(r"<tr>(.*?)</tr>", table[1], re.S)]
    rows = [r for r in rows if r]
    assert [r[0] for r in rows] == ["specificity"] * 3 + ["frequency"]
    frequency = rows[-1]
    assert frequency[1] == "supported" and frequency[2] == f"wordnet-nouns: {n} items with zipf"
    assert frequency[3] == "ρ(norm, zipf | n_tokens), claimed - vs 0"
    assert re.fullmatch(r"-0\.\d{3} \[-0\.\d{3}, -0\.\d{3}\]", frequency[4]) and frequency[5] == str(n)
    assert frequency[6] == "< 0.002" and frequency[7] == "supports"  # p = 0: below its resolution 2 / 1,000
    layout = page_layout(page, tmp_path / "profile-layout")
    assert layout["scroll_width"] <= layout["viewport"]
