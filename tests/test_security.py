"""Security: read-only SQL, names checked before they become paths, credentials never written or logged."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.storage.catalog import SCHEMAS, ReadOnlyError, run_read_only
from pipeline.storage.store import Store

REFUSED = [
    "copy (select 1) to '{tmp}/out.csv'",
    "copy embeddings to '{tmp}/out.parquet'",
    "attach '{tmp}/other.db'",
    "detach memory",
    "install httpfs",
    "load httpfs",
    "set threads = 1",
    "reset threads",
    "use memory",
    "pragma database_list",
    "call pragma_version()",
    "checkpoint",
    "vacuum",
    "export database '{tmp}/export'",
    "import database '{tmp}/export'",
    "create secret (type s3, key_id 'x', secret 'y')",
    "create view v as select 1",
    "drop view embeddings",
    "insert into results select * from results",
    "update runs set status = 'x'",
    "delete from embeddings",
    "begin transaction",
    "explain analyze copy (select 1) to '{tmp}/out.csv'",
    "explain analyze create table t as select 1",
    "EXPLAIN /* hidden */ ANALYZE COPY (select 1) TO '{tmp}/out.csv'",
    "select 1; copy (select 1) to '{tmp}/out.csv'",
]


@pytest.mark.parametrize("query", REFUSED)
def test_sql_refuses_everything_that_writes_or_reconfigures(tmp_path, query):
    store = Store(str(tmp_path / "root"))
    with pytest.raises(ReadOnlyError, match="refused"):
        run_read_only(store, query.format(tmp=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # not even the root was created


def test_sql_reads_files_and_explains(tmp_path):
    csv = tmp_path / "root" / "side.csv"  # inside the root: the sandbox lets it through
    csv.parent.mkdir()
    csv.write_text("a,b\n1,2\n")
    store = Store(str(tmp_path / "root"))
    assert run_read_only(store, f"select * from read_csv('{csv}')").fetchall() == [(1, 2)]
    assert run_read_only(store, "explain analyze select count(*) from embeddings").fetchall()
    assert run_read_only(store, "with a as (select 42 as x) select x from a").fetchall() == [(42,)]


@pytest.mark.parametrize("query", ["copy (select 1) to 'x.csv'", "attach 'x.db'", "install httpfs", "pragma version",
                                   "explain analyze copy (select 1) to 'x.csv'"])
def test_cli_sql_refusal_is_clear(tmp_path, query, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "root" / "probes").mkdir(parents=True)  # a store (sql refuses a root that holds none)
    out = CliRunner().invoke(app, ["sql", "--root", str(tmp_path / "root"), query])
    assert out.exit_code == 2 and "refused" in out.output and "read-only" in out.output, out.output
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("flag,value", [("--release", "../x"), ("--release", "a/b"), ("--name", "../../etc"),
                                        ("--release", "..")])
def test_cli_refuses_names_that_would_escape_the_root(tmp_path, flag, value):
    root = tmp_path / "root"
    out = CliRunner().invoke(app, ["audit", "--model", "tiny-not-needed", "--probes", "x.csv", "--root", str(root),
                                   flag, value])
    assert out.exit_code == 1, out.output
    assert f"invalid {'release label' if flag == '--release' else 'model label'} {value!r}" in out.output
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


@pytest.mark.slow
def test_credentials_never_reach_storage_logs_or_prefect(tmp_path, s3_server, monkeypatch, capfd, tiny_model_dir,
                                                         prefect_api):
    import s3fs
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter

    from flows.audit import run_audit
    from pipeline.settings import load_settings

    key_id, secret = f"AKIAFAKE{uuid.uuid4().hex[:12].upper()}", f"fake-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"creds-{uuid.uuid4().hex[:10]}"
    fs = s3fs.S3FileSystem(endpoint_url=s3_server, key=key_id, secret=secret)
    fs.mkdir(bucket)
    probes = tmp_path / "secrets-probe.csv"
    pl.DataFrame({"item_id": [f"s{i}" for i in range(20)], "text": ["dog cat"[: 3 + i % 5] for i in range(20)],
                  "zipf": np.linspace(1, 5, 20)}).write_csv(probes)
    root = f"s3://{bucket}/normaudit"
    overrides = {"root": root, "shard_size": 8}
    settings = load_settings(**overrides)
    assert settings.aws_secret_access_key.get_secret_value() == secret  # the run really used them
    summary = run_audit(settings, str(tiny_model_dir), [str(probes)], release="r1")
    assert summary.embedded_items == {"secrets-probe": 20}

    needles = [key_id, secret]
    files = fs.find(bucket)
    assert any("data_docs" in f for f in files) and any(f.endswith(".parquet") for f in files)
    for path in files:  # every object the run wrote: parts, manifests, runs, results, reports, leases
        data = fs.cat_file(path)
        for needle in needles:
            assert needle.encode() not in data, f"{needle[:8]}… found in {path}"
    captured = capfd.readouterr()
    for needle in needles:
        assert needle not in captured.out and needle not in captured.err
        assert needle not in repr(settings) and needle not in settings.model_dump_json()

    async def prefect_records():
        async with get_client() as client:
            runs = await client.read_flow_runs()
            logs = await client.read_logs(LogFilter(flow_run_id={"any_": [r.id for r in runs]}))
            tasks = await client.read_task_runs()
        return runs, logs, tasks

    from prefect.utilities.asyncutils import run_coro_as_sync

    runs, logs, task_runs = run_coro_as_sync(prefect_records())
    assert runs and logs and task_runs
    blob = repr([r.parameters for r in runs]) + repr([r.model_dump() for r in task_runs])
    blob += "\n".join(log.message for log in logs)
    for needle in needles:
        assert needle not in blob


# ---------- the `sql` sandbox: a query reads the store and nothing else ----------

CLI = Path(sys.executable).parent / "normaudit"
ONLY_ROOT = "may only read the stored tables under"
RUN_ID = "20261201T000000-0123abcd"
SECRET = f"not-for-sql-{uuid.uuid4().hex}"
# the README's three queries (Quick start), then its s3 example and its theory-lab one
README_QUERIES = [
    ([], "select property, statistic, round(value, 4) as value, n from results order by property"),
    (["--format", "csv"], "select item_id, norm from embeddings order by norm desc limit 5"),
    (["--format", "parquet", "--output", "vectors.parquet"], "select item_id, vector::FLOAT[384] as v from embeddings"),
    (["--format", "csv"], "select count(*) from embeddings"),
    (["--format", "csv"], "select * from '{root}/theory/lab-0123/sweep.parquet'"),
]
EVERY_VIEW = "select " + ", ".join(f"(select count(*) from {v}) as {v}" for v in SCHEMAS)


def _store_release(store: Store) -> None:
    """40 committed word embeddings (dim 384), their norm_vs_property results, a run and a theory output."""
    from pipeline.analysis.analyses import run_analysis
    from pipeline.storage.catalog import open_catalog
    from pipeline.storage.runs import RunRecord, write_results, write_run
    from tests.helpers import store_synthetic, word_probe_set

    n = 40
    ps = word_probe_set("words", n, {"zipf": np.linspace(1, 6, n), "length": (np.arange(n) % 7).astype(float)})
    store_synthetic(store, "m", "r", ps, np.linspace(0.5, 3.0, n), dim=384, shard_size=16)
    con = open_catalog(store)
    write_results(store, RUN_ID, "norm_vs_property", run_analysis(con, "norm_vs_property", "m", "r", RUN_ID,
                                                                   resamples=20))
    con.close()
    write_run(store, RunRecord(RUN_ID, "m", "r", "f" * 64, "words", {"shard_size": 16}, status="completed"))
    store.write_table("theory/lab-0123/sweep.parquet", pa.table({"lr": [0.1, 0.3], "r2": [0.8, 0.9]}))


@pytest.fixture(scope="module")
def stored_root(tmp_path_factory) -> Path:
    """A file:// root with a stored release, a CSV beside it and a link inside it pointing at that CSV."""
    base = tmp_path_factory.mktemp("sandbox")
    root = base / "root"
    _store_release(Store(str(root)))
    (base / "side.csv").write_text("a,b\n1,2\n")
    (root / "link.csv").symlink_to(base / "side.csv")
    return root


def _sql(root, query: str, *args: str, home: Path, cwd: Path | None = None, columns: int = 80):
    """The installed CLI as a user runs it: no PREFECT_API_URL, a fresh HOME (where DuckDB keeps extensions)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(HOME=str(home), COLUMNS=str(columns), NORMAUDIT_TEST_SECRET=SECRET)
    return subprocess.run([str(CLI), "sql", "--root", str(root), *args, query], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def _fresh_home(tmp_path: Path) -> Path:
    """A HOME holding only a Prefect database, which no query may read."""
    home = tmp_path / "home"
    (home / ".prefect").mkdir(parents=True)
    (home / ".prefect" / "prefect.db").write_bytes(b"SQLite format 3\x00" + SECRET.encode())
    return home


def _home_untouched(home: Path) -> bool:
    """Nothing was installed or downloaded: no ~/.duckdb (extensions) or anything else appeared."""
    return sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [".prefect", ".prefect/prefect.db"]


OUTSIDE_READS = [
    "select * from read_text('/proc/self/environ')",
    "select * from read_blob('/etc/shadow')",
    "select * from glob('/root/*')",
    "select * from read_csv('{base}/side.csv')",
    "select * from sniff_csv('{base}/side.csv')",  # read files with external access off in DuckDB < 1.1.3
    "select * from read_csv('{root}/../side.csv')",
    "select * from read_csv('{root}/link.csv')",
    "select * from read_blob('{home}/.prefect/prefect.db')",
    "select * from read_text('.tmp/secret.txt')",  # DuckDB's default spill folder, which it lets queries read
    "select * from read_csv('https://example.com/data.csv')",
    "select * from read_parquet('s3://some-bucket/data.parquet')",
    "select count(*) from results where exists (select * from read_text('/proc/self/environ'))",
    "explain analyze select * from read_text('/proc/self/environ')",
]


def test_sql_connection_is_locked_down(tmp_path):
    root = tmp_path / "root"
    got = run_read_only(Store(str(root)), "select " + ", ".join(f"current_setting('{name}')" for name in (
        "enable_external_access", "allowed_directories", "autoinstall_known_extensions",
        "autoload_known_extensions", "python_enable_replacements", "lock_configuration"))).fetchall()
    (external, allowed, *rest), = got
    # besides the root, only DuckDB's own spill folder: a new, empty one (not ./.tmp, where anything may be)
    spill = [d for d in allowed if d != f"{root}/"]
    assert not external and rest == [False, False, False, True] and f"{root}/" in allowed, allowed
    assert len(spill) == 1 and "/normaudit-sql-" in spill[0] and not Path(spill[0]).exists()


@pytest.mark.parametrize("query", OUTSIDE_READS)
def test_sql_refuses_reads_outside_the_root(stored_root, tmp_path, query):
    home = _fresh_home(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.txt").write_text(SECRET)
    out = _sql(stored_root, query.format(root=stored_root, base=stored_root.parent, home=home), home=home,
               cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "refused" in out.stderr and f"{ONLY_ROOT} {stored_root}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("error:") == 1
    assert SECRET not in out.stdout + out.stderr
    assert _home_untouched(home)  # a URL made DuckDB neither install nor load an extension


def test_sql_readme_queries_and_every_view_run_in_the_sandbox(stored_root, tmp_path):
    home = _fresh_home(tmp_path)
    outs = [_sql(stored_root, q.format(root=stored_root), *args, home=home, cwd=tmp_path) for args, q in README_QUERIES]
    assert [o.returncode for o in outs] == [0] * len(outs), [o.stderr for o in outs]
    assert all(word in outs[0].stdout for word in ("zipf", "length", "spearman")), outs[0].stdout
    lines = outs[1].stdout.splitlines()
    assert lines[0] == "item_id,norm" and len(lines) == 6 and float(lines[1].split(",")[1]) == pytest.approx(3.0)
    vectors = pl.read_parquet(tmp_path / "vectors.parquet")
    assert vectors.height == 40 and vectors["v"].dtype == pl.Array(pl.Float32, 384)
    assert outs[3].stdout.splitlines()[1:] == ["40"] and outs[4].stdout.splitlines()[1:] == ["0.1,0.8", "0.3,0.9"]
    views = _sql(stored_root, EVERY_VIEW, "--format", "json", home=home)
    assert views.returncode == 0, views.stderr
    counts = pl.read_json(views.stdout.encode()).row(0, named=True)
    assert counts["embeddings"] == counts["probe_items"] == 40 and counts["results"] > 0 and counts["runs"] == 1
    # a relative root and a relative path under it, as a user in the folder above writes them
    rel = _sql("root", "select count(*) as n from 'root/results/*/*.parquet'", "--format", "csv", home=home,
               cwd=stored_root.parent)
    assert rel.returncode == 0 and rel.stdout.splitlines()[1] == str(counts["results"]), rel.stderr
    assert _home_untouched(home)


def test_sql_sandbox_on_an_s3_root(s3_env, tmp_path):
    import s3fs

    from pipeline.settings import load_settings
    from pipeline.storage.store import open_store

    store = open_store(load_settings(root=s3_env))
    _store_release(store)
    bucket = s3_env.removeprefix("s3://").split("/")[0]
    other = f"other-{uuid.uuid4().hex[:8]}"
    fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    fs.mkdir(other)
    for path in (f"{other}/x.csv", f"{bucket}/elsewhere/x.csv", f"{bucket}/normaudit-sibling/x.csv"):
        fs.pipe_file(path, b"a,b\n1,2\n")
    home = _fresh_home(tmp_path)
    for args, query in README_QUERIES:
        out = _sql(s3_env, query.format(root=s3_env), *args, home=home, cwd=tmp_path)
        assert out.returncode == 0, (query, out.stderr)
    assert pl.read_parquet(tmp_path / "vectors.parquet").height == 40
    views = _sql(s3_env, EVERY_VIEW, "--format", "json", home=home)
    assert views.returncode == 0 and pl.read_json(views.stdout.encode())["embeddings"][0] == 40, views.stderr
    for url in (f"s3://{other}/x.csv", f"s3a://{other}/x.csv", f"s3://{bucket}/elsewhere/x.csv",
                f"s3://{bucket}/normaudit-sibling/x.csv", f"{s3_env}/../elsewhere/x.csv",
                "https://example.com/data.csv"):
        out = _sql(s3_env, f"select * from read_csv('{url}')", home=home)
        assert out.returncode == 2 and f"{ONLY_ROOT} {s3_env}" in out.stderr, (url, out.stdout, out.stderr)
    assert _home_untouched(home)


def test_sql_output_inside_the_root_is_refused(stored_root, tmp_path):
    home = _fresh_home(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    for target in (stored_root / "out.csv", tmp_path / "elsewhere" / ".." / ".." / stored_root.parent.name / "root"
                   / "results" / "x.parquet"):
        out = _sql(stored_root, "select 1 as x", "--format", "csv", "--output", str(target), home=home)
        assert out.returncode == 2 and f"inside the storage root {stored_root}" in out.stderr, out.stderr
        assert not target.exists()
    out = _sql(stored_root, "select 1 as x", "--format", "csv", "--output", str(tmp_path / "x.csv"), home=home)
    assert out.returncode == 0 and (tmp_path / "x.csv").read_text().splitlines() == ["x", "1"]


def test_sql_table_of_wide_rows_fits_the_terminal(stored_root, tmp_path):
    from rich.cells import cell_len

    home = _fresh_home(tmp_path)
    out = _sql(stored_root, "select * from results order by property", home=home, columns=80)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80, "\n".join(line for line in lines if cell_len(line) > 80)
    for value in (RUN_ID, "norm_vs_property", "zipf", "length", "spearman", "words"):
        assert value in out.stdout
    n_results = pl.read_parquet(stored_root / "results" / RUN_ID / "norm_vs_property.parquet").height
    assert lines[-1] == f"({n_results} rows)" and sum(line.startswith("run_id ") for line in lines) == n_results
    narrow = _sql(stored_root, README_QUERIES[0][1], home=home, columns=80)  # four columns fit: one line a row
    assert narrow.stdout.splitlines()[0].split() == ["property", "statistic", "value", "n"]
    assert len(narrow.stdout.splitlines()) == n_results + 3 and "hint" not in narrow.stderr
    long = _sql(stored_root, "select repeat('x', 500) as long, 'a' || chr(10) || 'b' as two_lines", home=home)
    assert max(cell_len(line) for line in long.stdout.splitlines()) <= 80 and "a\\nb" in long.stdout
    assert "…" in long.stdout and "--format csv" in long.stderr
