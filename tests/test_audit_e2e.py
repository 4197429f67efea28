"""End to end: real Prefect flow, real local Dask cluster (processes), tiny local model, local + S3 roots."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats
from typer.testing import CliRunner

from flows.audit import run_audit
from pipeline.cli.main import app
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import open_store

pytestmark = pytest.mark.slow

WORDS = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "apple", "table", "chair", "window",
         "garden", "mountain", "ocean", "winter", "summer", "doctor", "animal", "flower"]


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory):
    rng = np.random.default_rng(3)
    rows = []
    for i in range(60):
        text = " ".join(rng.choice(WORDS, size=1 + i % 5))
        rows.append({"item_id": f"i{i:03d}", "text": text, "zipf": round(float(rng.uniform(1, 7)), 2),
                     "depth": float(rng.integers(1, 12))})
    path = tmp_path_factory.mktemp("probes") / "mini.csv"
    pl.DataFrame(rows).write_csv(path)
    return str(path)


def _audit(root, model_dir, probe_file, **kw):
    settings = load_settings(root=root, shard_size=16)
    return run_audit(settings, str(model_dir), [probe_file], release="r1", **kw)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_model_dir, probe_file, prefect_api):
    root = str(tmp_path_factory.mktemp("root"))
    return root, _audit(root, tiny_model_dir, probe_file)


def test_audit_stores_every_item_once_with_raw_norms(local_run, tiny_model_dir, probe_file):
    from pipeline.embedding.embed import Embedder
    from pipeline.embedding.models import get_spec, resolve_model

    root, summary = local_run
    con = open_catalog(open_store(load_settings(root=root)))
    rows = con.execute("select item_id, norm, vector, n_tokens, truncated from embeddings order by item_id").fetchall()
    assert len(rows) == 60 and len({r[0] for r in rows}) == 60
    assert summary.embedded_items == {"mini": 60}
    # stored norm = L2 of the stored raw vector, and equals an in-process forward of the same model
    vec = np.array([r[2] for r in rows], dtype=np.float64)
    norms = np.array([r[1] for r in rows])
    assert np.allclose(np.linalg.norm(vec, axis=1), norms, rtol=1e-6)
    texts = pl.read_csv(probe_file).sort("item_id")["text"].to_list()
    direct = Embedder(resolve_model(get_spec(str(tiny_model_dir)))).embed(texts)
    assert np.allclose(direct.norms, norms, rtol=1e-5)
    assert con.execute("select count(*) from runs where status = 'completed'").fetchall()[0][0] == 1
    assert con.execute("select count(*) from token_norms").fetchall()[0][0] > 100


def test_results_match_scipy_on_stored_rows(local_run):
    root, summary = local_run
    con = open_catalog(open_store(load_settings(root=root)))
    joined = con.sql(
        "select e.norm, p.value from embeddings e join probe_properties p using (probe_set, item_id) "
        "where p.property = 'depth' order by e.item_id").pl()
    expected = stats.spearmanr(joined["norm"], joined["value"]).statistic
    res = con.execute("select value, n from results where property = 'depth' and statistic = 'spearman'").fetchall()
    assert res == [(pytest.approx(expected, abs=1e-9), 60)]
    depth_stats = set(summary.results.filter(pl.col("property") == "depth")["statistic"].to_list())
    assert {"spearman", "partial_spearman_zipf"} <= depth_stats


def test_rerun_embeds_nothing(local_run, tiny_model_dir, probe_file):
    root, _ = local_run
    con = open_catalog(open_store(load_settings(root=root)))
    before = con.execute("select count(*) from embeddings").fetchall()[0][0]
    files_before = sorted(open_store(load_settings(root=root)).glob("embeddings/*/*/*/*"))
    summary = _audit(root, tiny_model_dir, probe_file)
    assert summary.embedded_items == {"mini": 0} and summary.skipped_shards == {"mini": 4}
    con = open_catalog(open_store(load_settings(root=root)))
    assert con.execute("select count(*) from embeddings").fetchall()[0][0] == before == 60
    assert sorted(open_store(load_settings(root=root)).glob("embeddings/*/*/*/*")) == files_before


def test_s3_root_gives_identical_results(local_run, tiny_model_dir, probe_file, s3_env):
    root, _ = local_run
    _audit(s3_env, tiny_model_dir, probe_file)
    q = "select item_id, norm, vector from embeddings order by item_id"
    local_rows = open_catalog(open_store(load_settings(root=root))).execute(q).fetchall()
    s3_store = open_store(load_settings(root=s3_env))
    assert not s3_store.is_local
    assert open_catalog(s3_store).execute(q).fetchall() == local_rows
    rq = ("select property, statistic, value, n from results "
          "where run_id = (select min(run_id) from results) order by property, statistic")
    s3_res = open_catalog(s3_store).execute(rq).fetchall()
    local_res = open_catalog(open_store(load_settings(root=root))).execute(rq).fetchall()
    assert [r[:2] + r[3:] for r in s3_res] == [r[:2] + r[3:] for r in local_res]
    # same rows in, so the statistics agree up to the summation order of DuckDB's parallel aggregates
    assert np.allclose([r[2] for r in s3_res], [r[2] for r in local_res], rtol=0, atol=1e-12)


def test_bad_probe_file_commits_nothing(tmp_path, tiny_model_dir, prefect_api):
    bad = tmp_path / "bad.csv"
    bad.write_text("item_id,text\na,apple\na,pear\n")
    root = str(tmp_path / "root")
    result = CliRunner().invoke(app, ["audit", "--model", str(tiny_model_dir), "--probes", str(bad),
                                      "--root", root])
    assert result.exit_code == 1
    assert "duplicate item_id ['a'] in rows 1, 2" in result.output
    store = open_store(load_settings(root=root))
    assert store.glob("embeddings/**") == [] and store.glob("probes/**") == []


def test_cli_sql_formats(local_run, tmp_path):
    root, _ = local_run
    runner = CliRunner()
    out = runner.invoke(app, ["sql", "--root", root, "--format", "csv", "select count(*) as n from embeddings"])
    assert out.exit_code == 0 and out.output.splitlines() == ["n", "60"]
    out = runner.invoke(app, ["sql", "--root", root, "--format", "json",
                              "select item_id from embeddings order by item_id limit 2"])
    assert out.exit_code == 0 and '"i000"' in out.output
    target = tmp_path / "out.parquet"
    out = runner.invoke(app, ["sql", "--root", root, "--format", "parquet", "--output", str(target),
                              "select item_id, vector from embeddings"])
    assert out.exit_code == 0 and pl.read_parquet(target).height == 60
    out = runner.invoke(app, ["sql", "--root", root, "--format", "parquet", "select 1"])
    assert out.exit_code == 1 and "--output" in out.output
    out = runner.invoke(app, ["sql", "--root", root, "delete from embeddings"])
    assert out.exit_code == 2 and "read-only" in out.output
    con = open_catalog(open_store(load_settings(root=root)))
    assert con.execute("select count(*) from embeddings").fetchall()[0][0] == 60


def test_cli_timings_come_from_prefects_records_of_the_run(tmp_path, tiny_model_dir, probe_file):
    root = str(tmp_path / "root")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # the CLI starts its own API
    env.update(NORMAUDIT_SHARD_SIZE="16", COLUMNS="200")
    cli = Path(sys.executable).parent / "normaudit"
    out = subprocess.run([str(cli), "audit", "--model", str(tiny_model_dir), "--probes", probe_file, "--root", root,
                          "--timings"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    row = re.compile(r"[│|] (\S+(?: \S+)?)\s+[│|]\s+(\d+) [│|]\s+([\d.]+) [│|]")  # step, runs, seconds
    rows = {m[1]: (int(m[2]), float(m[3])) for m in row.finditer(out.stdout)}
    assert {"api_start", "cluster_start_after_api"} <= set(rows), out.stdout  # measured before the flow
    # what Prefect recorded: 60 items in shards of 16 are 4 embed_shard task runs, committed in 1 to 4 batches
    assert rows["embed_shard"][0] == 4 and 1 <= rows["commit_batch"][0] <= 4, out.stdout
    for step in ("flow audit_release", "embed_probes", "prepare_probes", "embed_shard", "run_analyses",
                 "render_report"):  # commit_batch is one manifest write: it may round to 0.0 s
        assert rows[step][1] > 0, (step, out.stdout)
    # the preparation's wall span: one task here (prepare_probes), so its own running time or a little more
    span = re.search(r"probe preparation wall\s+[│|]\s+1 [│|]\s+([\d.]+) [│|]", out.stdout)
    assert span and float(span[1]) >= rows["prepare_probes"][1] - 0.01, out.stdout
    # the run record keeps the per-task seconds (the temporary API that held them is gone)
    recorded = open_catalog(open_store(load_settings(root=root))).execute("select timings from runs").fetchall()
    seconds = json.loads(recorded[0][0])
    assert seconds["embed_shard"] > 0 and seconds["run_analyses"] > 0 and "render_report" not in seconds


def test_cli_prints_the_claims_table_and_what_a_limit_samples(tmp_path, tiny_model_dir):
    """The installed CLI, as a user runs it: an audit of the first 300 WordNet nouns prints the line saying the
    sample is the most frequent nouns, and the claims table whose rows name that population; both are stored."""
    root = str(tmp_path / "root")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(COLUMNS="250")
    cli = Path(sys.executable).parent / "normaudit"
    out = subprocess.run([str(cli), "audit", "--model", str(tiny_model_dir), "--probes", "wordnet-nouns",
                          "--limit", "300", "--root", root], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("sample: --limit 300 took the first 300 items of each probe set in its stable order (WordNet nouns "
            "and pairs: the most frequent first)") in out.stdout
    assert "claims — " in out.stdout
    claims = open_catalog(open_store(load_settings(root=root))).execute(
        "select claim, verdict, population, n from claims order by claim, property").fetchall()
    assert {c[0] for c in claims} == {"frequency", "specificity"}
    for claim, verdict, population, n in claims:
        assert verdict in {"supported", "contradicted", "mixed", "no evidence"}
        assert population.endswith("(of the first 300 of 34,375 items, most frequent first: --limit)"), population
        assert 0 < n <= 300
        assert claim in out.stdout and verdict in out.stdout
