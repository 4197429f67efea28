"""The seam between library and orchestration, checked on the source tree.

``pipeline/`` is the library; ``flows/`` wires it into Prefect flows on Dask. Only the CLI entry
(``pipeline/cli/``) may import ``flows``. No import cycles, lazy imports only with a reason, only
public names of Prefect, Dask and Great Expectations, modules of a readable size.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "flows")
ORCHESTRATION_LIBS = ("prefect", "prefect_dask", "dask", "distributed", "great_expectations")
# Third-party packages whose import is a measured start-up cost: a function may import them lazily
# without a comment (each module says why once). Anything else imported inside a function needs a
# comment on the line or the line above saying why it is lazy, or the module's docstring saying why its
# imports stay inside its functions (the CLI's command modules: `normaudit --help` must not load Prefect).
LAZY_REASON = re.compile(r"\bimport\w*\b[^.]*\binside\b", re.IGNORECASE)
HEAVY = {"torch", "transformers", "sentence_transformers", "tokenizers", "great_expectations", "matplotlib",
         "huggingface_hub", "wordfreq", "prefect", "prefect_dask", "distributed", "dask", "s3fs", "scipy",
         "botocore", "aiobotocore", "aiohttp", "pandas"}
# Modules allowed to touch a library's private surface, one adapter per library (none today).
ADAPTERS: set[str] = set()
MAX_MODULE_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path):
    """``(imported module, node, is_lazy)`` for every import statement of a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        lazy = id(node) not in top and not _in_type_checking(tree, node)
        for target in targets:
            yield target, node, lazy


def _in_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    for stmt in tree.body:
        if (isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test)
                and any(child is node for child in ast.walk(stmt))):
            return True
    return False


def _own(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _graph() -> dict[str, set[str]]:
    graph = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for target, _, _ in _imports(name, path):
            own = _own(target)
            if own and own != name:
                graph[name].add(own)
    return graph


def test_library_never_imports_flows():
    offenders = [
        f"{path.relative_to(REPO)}:{node.lineno} imports {target}"
        for name, path in MODULES.items()
        if name.startswith("pipeline") and not name.startswith("pipeline.cli")
        for target, node, _ in _imports(name, path)
        if target == "flows" or target.startswith("flows.")
    ]
    assert not offenders, "the library imports the orchestration layer:\n" + "\n".join(offenders)


def test_no_import_cycles():
    """Tarjan's strongly connected components over every import, lazy ones included."""
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_check_sees_a_cycle():
    """The cycle check is not vacuous: the graph holds the edges the code has."""
    graph = _graph()
    assert "pipeline.storage.store" in graph["pipeline.storage.catalog"]
    assert "pipeline.audit.steps" in {w for ws in graph.values() for w in ws}


def test_lazy_imports_say_why():
    offenders = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        if LAZY_REASON.search(ast.get_docstring(ast.parse(path.read_text())) or ""):
            continue
        for target, node, lazy in _imports(name, path):
            if not lazy or target.split(".")[0] in HEAVY:
                continue
            here, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
            if "#" not in here and not above.strip().startswith("#"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    offenders = sorted(set(offenders))
    assert not offenders, "import at module top, or say why it is lazy in a comment:\n" + "\n".join(offenders)


def test_only_public_names_of_orchestration_libraries():
    offenders = []
    for name, path in MODULES.items():
        if name in ADAPTERS:
            continue
        text = path.read_text()
        rel = path.relative_to(REPO)
        if "PREFECT__" in text:
            offenders.append(f"{rel}: sets a PREFECT__ (private) variable")
        if "os._exit" in text:
            offenders.append(f"{rel}: os._exit skips every exit handler")
        for target, node, _ in _imports(name, path):
            root = target.split(".")[0]
            if root not in ORCHESTRATION_LIBS:
                continue
            if any(part.startswith("_") for part in target.split(".")):
                offenders.append(f"{rel}:{node.lineno} imports the private {target}")
            if target.startswith("prefect.server"):
                offenders.append(f"{rel}:{node.lineno} imports Prefect's server internals ({target})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = ast.unparse(node.value).split(".")[0]
                if base in ORCHESTRATION_LIBS:
                    offenders.append(f"{rel}:{node.lineno} uses the private {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)


def test_modules_are_small():
    big = {str(p.relative_to(REPO)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) >
           MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


def test_readme_is_a_guide_that_begins_with_the_two_commands():
    readme = (REPO / "README.md").read_text().splitlines()
    assert len(readme) <= 300, f"README.md has {len(readme)} lines; measurements belong in docs/benchmarks.md"
    block = readme[readme.index("```bash") + 1: readme.index("```bash") + 3]
    assert block[0].endswith("normaudit audit --model minilm-l6 --probes wordnet-nouns")
    assert block[1].endswith("-m pytest -q")
    assert block[1] in (REPO / ".ci" / "run").read_text()


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each module imports on its own (no import works only because another module ran first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}

    def check(name: str):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        return name, proc.returncode, proc.stderr[-600:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [(n, err) for n, rc, err in pool.map(check, sorted(MODULES)) if rc != 0]
    assert not failed, "\n\n".join(f"{n}:\n{err}" for n, err in failed)
