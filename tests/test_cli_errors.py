"""One line for every failure: an exception no command anticipated (a library's) ends every command with one
``error:`` line and exit 1, its traceback in the log file the line names; our own errors and usage errors
are unchanged and write no log. The installed CLI in a subprocess, no PREFECT_API_URL; every input fails
within seconds, before Prefect, Dask or a model start."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
LOG_NAMED = re.compile(r"the traceback is in (\S+\.log)")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """Inputs a library cannot read: a run record, a manifest and a stored probe set that are not what their
    names say, a tokenizer.json of the wrong shape, WordNet data that is not UTF-8, a file where a folder
    belongs."""
    base = tmp_path_factory.mktemp("cli-errors")
    paths = {name: base / name for name in ("empty", "store", "bad-runs", "bad-manifest", "bad-probes", "wordnet")}
    for path in paths.values():
        path.mkdir()
    (paths["store"] / "probes").mkdir()  # a store with nothing in it yet
    (paths["bad-runs"] / "runs").mkdir()
    (paths["bad-runs"] / "runs" / "20240101T000000-aaaaaaaa.parquet").write_bytes(b"not a parquet file")
    manifest = paths["bad-manifest"] / "embeddings" / "model=m" / "release=r" / "probe_set=p" / "_manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("{")
    items = paths["bad-probes"] / "probes" / "probe_set=p" / "items.parquet"
    items.parent.mkdir(parents=True)
    items.write_bytes(b"garbage")
    (paths["wordnet"] / "cntlist.rev").write_bytes(b"\xff\xfe not utf-8\n")
    paths["model"] = base / "tiny-bad-tokenizer"
    shutil.copytree(tiny_model_dir, paths["model"])
    (paths["model"] / "tokenizer.json").write_text('{"model": {"type": "WordPiece", "unk_token": "[UNK]"}}')
    paths["words"] = base / "words.csv"
    paths["words"].write_text("item_id,text\na,dog\nb,cat\nc,tree\n")
    paths["checkpoints"] = base / "checkpoints"
    paths["checkpoints"].mkdir()
    paths["audits"] = base / "audits.yaml"
    paths["audits"].write_text(yaml.safe_dump({"watch": [{"name": "m", "checkpoints": str(paths["checkpoints"]),
                                                          "probes": [str(paths["words"])]}]}))
    return paths


def _run(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "NORMAUDIT_N_WORKERS")}
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PREFECT_HOME=str(tmp_path / "prefect-home"), **env)
    return subprocess.run([str(BIN / "normaudit"), *args], env=clean, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


BAD_SETTING, INVALID = {"NORMAUDIT_N_WORKERS": "two"}, "pydantic_core.ValidationError"
# (command, its arguments built from the inputs, extra environment, the exception the line names)
CASES = [
    ("sql", lambda p: ["--root", p["store"], "--format", "csv", "--output", p["empty"], "select 1 as x"], {},
     "IsADirectoryError"),
    ("audit", lambda p: ["--model", p["model"], "--probes", p["words"], "--root", p["empty"]], {}, "Exception"),
    ("compare", lambda p: ["--model", "m", "--root", p["bad-runs"]], {}, "duckdb.InvalidInputException"),
    ("report", lambda p: ["--model", "m", "--root", p["bad-runs"]], {}, "duckdb.InvalidInputException"),
    ("verify", lambda p: ["--root", p["bad-manifest"]], {}, "json.JSONDecodeError"),
    ("probes list", lambda p: ["--root", p["bad-probes"]], {}, "pyarrow.ArrowInvalid"),
    ("probes add", lambda p: ["x", "--from", p["words"], "--root", p["words"]], {}, "NotADirectoryError"),
    ("probes build-wordnet", lambda p: ["--wordnet-dir", p["wordnet"], "--output", p["empty"] / "n.parquet",
                                        "--pairs-output", p["empty"] / "p.parquet"], {}, "UnicodeDecodeError"),
    # a setting pydantic cannot parse, read before anything starts
    ("serve", lambda p: ["--config", p["audits"], "--once"], BAD_SETTING, INVALID),
    ("theory run", lambda p: ["--root", p["empty"]], BAD_SETTING, INVALID),
    ("theory finetune", lambda p: ["--root", p["empty"]], BAD_SETTING, INVALID),
    ("theory formula", lambda p: ["--run", "x", "--root", p["empty"]], BAD_SETTING, INVALID),
]


def test_every_command_is_covered():
    """A command added to the CLI must be added to CASES."""
    from typer.main import get_command

    from pipeline.cli.main import app

    def leaves(group, prefix=()):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from leaves(command, (*prefix, name))
            else:
                yield " ".join((*prefix, name))

    assert set(leaves(get_command(app))) == {case[0] for case in CASES}


@pytest.mark.parametrize("command, args, env, raised", CASES, ids=[case[0] for case in CASES])
def test_a_library_error_is_one_line_and_its_traceback_is_in_the_named_log(tmp_path, inputs, command, args, env,
                                                                           raised):
    out = _run(tmp_path, [*command.split(), *map(str, args(inputs))], **env)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr[-4000:]
    assert "error:" not in out.stdout and "Traceback" not in out.stdout + out.stderr
    line = errors[0]
    assert line.startswith(f"error: normaudit {command} failed on ") and f": {raised}" in line, line
    log = Path(LOG_NAMED.search(line).group(1))
    assert log.parent == tmp_path / "cache" / "normaudit" / "logs"  # $XDG_CACHE_HOME, as the models' cache
    text = log.read_text()
    assert f"command: normaudit {command} " in text
    _, traceback = text.split("Traceback (most recent call last):", 1)
    assert raised.split(".")[-1] + ":" in traceback


def test_verbose_prints_the_traceback_above_the_one_line(tmp_path, inputs):
    out = _run(tmp_path, ["sql", "--verbose", "--root", str(inputs["store"]), "--format", "csv", "--output",
                          str(inputs["empty"]), "select 1 as x"])
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert lines[-1].startswith("error: normaudit sql failed") and sum(ln.startswith("error:") for ln in lines) == 1
    assert "Traceback (most recent call last):" in out.stderr and "IsADirectoryError:" in out.stderr
    assert Path(LOG_NAMED.search(lines[-1]).group(1)).is_file()


def test_our_own_errors_and_usage_errors_are_unchanged_and_write_no_log(tmp_path, inputs):
    refused = _run(tmp_path, ["sql", "--root", str(inputs["store"]), "delete from runs"])
    assert refused.returncode == 2 and refused.stderr.startswith("error: refused:"), refused.stderr
    missing = _run(tmp_path, ["compare", "--model", "nope", "--root", str(inputs["empty"])])
    assert missing.returncode == 1 and missing.stderr.startswith("error: no finished audit of model 'nope'")
    usage = _run(tmp_path, ["sql", "--no-such-option", "select 1"])
    assert usage.returncode == 2 and "No such option" in usage.stderr
    assert not (tmp_path / "cache" / "normaudit" / "logs").exists()


def _tree(base: Path) -> list[Path]:
    """Everything under ``base`` but the per-user cache the commands run with ($XDG_CACHE_HOME)."""
    return sorted(p.relative_to(base) for p in base.rglob("*") if not p.is_relative_to(base / "cache"))


READERS = {"sql": ["sql", "select 1"], "verify": ["verify"], "report --models": ["report", "--models"],
           "report --model": ["report", "--model", "m"]}


@pytest.mark.parametrize("kind", ["missing", "file", "empty folder"])
def test_a_root_without_a_store_is_one_error_line_and_nothing_is_created(tmp_path, kind):
    """A mistyped root never reads as an empty store (0 rows, "ok" for 0 parts) and is never created."""
    root = tmp_path / "typo" / "normaudit-dta"
    if kind == "file":
        root.parent.mkdir()
        root.write_text("not a store")
    elif kind == "empty folder":
        root.mkdir(parents=True)
    before = _tree(tmp_path)
    for name, args in READERS.items():
        out = _run(tmp_path, [*args, "--root", str(root)])
        assert out.returncode == 1, (name, out.stdout, out.stderr)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: no normaudit store at {root} (given by --root)"), \
            (name, out.stderr)
        assert "default root" in lines[0] and "Traceback" not in out.stderr and out.stdout == "", (name, out.stdout)
    # without --root, the default root in the current folder is named as such (and is not created either)
    out = _run(tmp_path, ["verify"])
    assert out.returncode == 1 and f"no normaudit store at {tmp_path / 'normaudit-data'} (the default root)" \
        in out.stderr, out.stderr
    assert _tree(tmp_path) == before  # nothing created anywhere


ODD_TYPES = ["select 'x'::blob, 1::bit, map([1],[2]), union_value(k := 1)", "select * from duckdb_settings()"]


@pytest.mark.parametrize("fmt", ["json", "csv", "table"])
@pytest.mark.parametrize("query", ODD_TYPES, ids=["blob-bit-map-union", "duckdb_settings"])
def test_every_type_prints_as_rows_or_one_error_line_never_a_panic(tmp_path, inputs, query, fmt):
    out = _run(tmp_path, ["sql", "--root", str(inputs["store"]), "--format", fmt, query])
    assert "Traceback" not in out.stderr + out.stdout and "panicked" not in out.stderr + out.stdout, out.stderr
    if out.returncode != 0:
        assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith("error:"), out.stderr
        return
    if "blob" in query:  # the strings they are printed as: a BLOB's hex, the others' DuckDB text
        for shown in ("78", "0" * 31 + "1", "{1=2}"):
            assert shown in out.stdout, out.stdout
    else:
        assert "access_mode" in out.stdout and "automatic" in out.stdout, out.stdout[:2000]
    if fmt == "json":
        rows = json.loads(out.stdout)
        assert rows and all(isinstance(v, (str, int, float, bool, list, type(None))) for r in rows for v in r.values())


def test_a_parquet_result_keeps_blobs_and_writes_unions_as_text(tmp_path, inputs):
    import polars as pl

    target = tmp_path / "out.parquet"
    out = _run(tmp_path, ["sql", "--root", str(inputs["store"]), "--format", "parquet", "--output", str(target),
                          "select 'x'::blob as b, union_value(k := 1) as u"])
    assert out.returncode == 0, out.stderr
    assert pl.read_parquet(target).rows() == [(b"x", "1")]


def test_an_analysis_memory_too_small_names_the_setting_and_a_rerun_with_more_finishes(tmp_path, inputs,
                                                                                        tiny_model_dir):
    """DuckDB's out-of-memory error in the analyses is said as the setting to raise (not DuckDB's own advice,
    `SET memory_limit`, which a user of the CLI cannot reach); the embeddings stay committed and the rerun
    with the default budget finishes the audit."""
    root = tmp_path / "root"
    args = ["audit", "--model", str(tiny_model_dir), "--probes", str(inputs["words"]), "--root", str(root)]
    out = _run(tmp_path, args, NORMAUDIT_ANALYSIS_MEMORY="1MB")
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ": pipeline.MemoryBudgetError: the analyses needed more than " \
        "NORMAUDIT_ANALYSIS_MEMORY=1MB of DuckDB memory" in errors[0], out.stderr[-3000:]
    assert "set NORMAUDIT_ANALYSIS_MEMORY higher" in errors[0] and "SET memory_limit" not in errors[0]
    again = _run(tmp_path, args)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "words: nothing to embed: all 1 shards were already committed" in again.stdout + again.stderr
    assert "report: " in again.stdout
