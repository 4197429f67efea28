"""Security: read-only SQL, names checked before they become paths, credentials never written or logged."""

from __future__ import annotations

import uuid

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from pipeline.catalog import ReadOnlyError, run_read_only
from pipeline.cli import app
from pipeline.store import Store

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
    csv = tmp_path / "side.csv"
    csv.write_text("a,b\n1,2\n")
    store = Store(str(tmp_path / "root"))
    assert run_read_only(store, f"select * from read_csv('{csv}')").fetchall() == [(1, 2)]
    assert run_read_only(store, "explain analyze select count(*) from embeddings").fetchall()
    assert run_read_only(store, "with a as (select 42 as x) select x from a").fetchall() == [(42,)]


@pytest.mark.parametrize("query", ["copy (select 1) to 'x.csv'", "attach 'x.db'", "install httpfs", "pragma version",
                                   "explain analyze copy (select 1) to 'x.csv'"])
def test_cli_sql_refusal_is_clear(tmp_path, query, monkeypatch):
    monkeypatch.chdir(tmp_path)
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
    summary = run_audit(settings, str(tiny_model_dir), [str(probes)], release="r1", overrides=overrides)
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
