"""Content-addressed identity: a text changed under an unchanged item id is re-embedded, never joined to an
old vector, whichever route brings it; older stores are found by ``verify`` and repaired.

The defect (issue 16): shard ids hashed item ids, not texts, so after a text changed the rerun said "nothing
to embed" and ``probe_items`` showed the new text beside the old text's vector. Each route below changes one
text (``w05``, in the first of three shards) and checks that its shard alone is embedded again, that every
stored row's ``text_sha256`` is the sha256 of its probe item's text (:func:`_assert_invariant`), and that
``normaudit verify`` is clean. Real flows, a real local Dask cluster, the tiny local model.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.audit import run_audit
from pipeline.cli.main import app
from pipeline.probes import ProbeSet, write_probe_tables
from pipeline.probes.base import ProbeInputError, text_sha256
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.shards import committed_item_ids, pending_shards, split_shards
from pipeline.storage.store import Store, sha256_bytes
from pipeline.storage.verify import TEXT_KINDS, repair, verify_root
from tests.helpers import store_synthetic, word_probe_set

BIN = Path(sys.executable).parent
SHARD = 8
WORDS = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "apple", "table", "chair", "window",
         "garden", "mountain", "ocean", "winter", "summer", "doctor", "animal", "flower"]
TEXTS = {f"w{i:02d}": " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + i % 3)) for i in range(24)}
CHANGED = {**TEXTS, "w05": "ocean garden doctor flower"}  # one text, same id, first shard


def _csv(path: Path, texts: dict[str, str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame({"item_id": list(texts), "text": list(texts.values()),
                  "zipf": [1.0 + (i % 5) for i in range(len(texts))]}).write_csv(path)
    return str(path)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _committed(store: Store, probe_set: str = "words", model: str = "tiny", release: str = "r1"):
    """The raw rows of every committed part (not the view), and the manifest's part files by shard."""
    m = store.read_manifest(model, release, probe_set)
    d = store.embeddings_dir(model, release, probe_set)
    tables = [pq.read_table(io.BytesIO(store.read_bytes(f"{d}/{p.file}"))) for p in m.parts]
    rows = pl.from_arrow(pa.concat_tables(tables, promote_options="default"))
    return rows, {p.shard_id: (p.file, p.sha256) for p in m.parts}


def _assert_invariant(store: Store, texts: dict[str, str], probe_set: str = "words") -> pl.DataFrame:
    """Every committed row's text_sha256 is the sha256 of its probe item's text; one row per item."""
    rows, _ = _committed(store, probe_set)
    assert rows["item_id"].is_unique().all(), "an item has two committed rows"
    assert sorted(rows["item_id"].to_list()) == sorted(texts)
    for item, h in zip(rows["item_id"], rows["text_sha256"], strict=True):
        assert h == _sha(texts[item]), item
    con = open_catalog(store)
    # the same in SQL, over the views a user queries
    assert con.execute("select count(*) from probe_items where text_sha256 <> sha256(text)").fetchone()[0] == 0
    bad = con.execute("select count(*) from embeddings e join probe_items p using (probe_set, item_id) "
                      "where e.text_sha256 <> sha256(p.text)").fetchone()[0]
    assert bad == 0
    assert con.execute("select count(*) from embeddings where probe_set = ?", [probe_set]).fetchone()[0] == len(texts)
    return rows


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The installed ``normaudit`` as a user runs it: no harness API, its own temporary one."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["NORMAUDIT_SHARD_SIZE"] = str(SHARD)
    return subprocess.run([str(BIN / "normaudit"), *args], env=env, capture_output=True, text=True, timeout=timeout)


def _audit(root: str, model_dir: Path, probes: list[str], **kw):
    overrides = {"root": root, "shard_size": SHARD}
    return run_audit(load_settings(**overrides), str(model_dir), probes, release="r1", **kw)


def _assert_only_first_shard_replaced(before: dict, after: dict) -> None:
    """The changed item's shard has a new part; the other two parts are the same files, byte for byte."""
    assert len(before) == len(after) == 3
    kept = set(before.values()) & set(after.values())
    assert len(kept) == 2, (before, after)
    assert len(set(after) - set(before)) == 1  # one new shard id (new text hash), the old one dropped


# ---------------------------------------------------------------- (a) edit the CSV, rerun audit (installed CLI)
@pytest.mark.slow
def test_edited_csv_rerun_via_cli_is_refused_then_replaced_and_reembedded(tmp_path, tiny_model_dir):
    root, csv = str(tmp_path / "root"), _csv(tmp_path / "words.csv", TEXTS)
    audit = ["audit", "--model", str(tiny_model_dir), "--probes", csv, "--root", root, "--release", "r1",
             "--workers", "1"]
    first = _cli(*audit)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "words: embedded 24 items" in first.stdout
    store = Store(root)
    rows_before, parts_before = _committed(store)

    _csv(Path(csv), CHANGED)
    refused = _cli(*audit)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    err = " ".join(refused.stderr.split())  # rich/typer may wrap long lines
    assert "probe set 'words' is already stored at" in err and csv in err and "1 text changed" in err
    assert f"normaudit probes add words --from {csv} --replace" in err and "--replace" in err
    con = open_catalog(store)
    assert con.execute("select text from probe_items where item_id = 'w05'").fetchone()[0] == TEXTS["w05"]

    replaced = _cli(*audit, "--replace")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert "words: embedded 8 items (2 shards already committed)" in replaced.stdout
    rows = _assert_invariant(store, CHANGED)
    _, parts_after = _committed(store)
    _assert_only_first_shard_replaced(parts_before, parts_after)
    new = rows.filter(pl.col("item_id") == "w05")
    old = rows_before.filter(pl.col("item_id") == "w05")
    assert new["text_sha256"][0] != old["text_sha256"][0] and new["norm"][0] != old["norm"][0]
    verify = _cli("verify", "--root", root)
    assert verify.returncode == 0 and "ok:" in verify.stdout, verify.stdout + verify.stderr


# ---------------------------------------------------------------- (b) probes add --replace, then audit by name
@pytest.mark.slow
def test_probes_add_replace_then_audit_by_name_reembeds_the_changed_text(tmp_path, tiny_model_dir, prefect_api):
    root = str(tmp_path / "root")
    runner = CliRunner()
    add = ["probes", "add", "words", "--root", root, "--kind", "sentence"]
    assert runner.invoke(app, [*add, "--from", _csv(tmp_path / "v1.csv", TEXTS)]).exit_code == 0
    assert _audit(root, tiny_model_dir, ["words"]).embedded_items == {"words": 24}
    store = Store(root)
    _, parts_before = _committed(store)

    v2 = _csv(tmp_path / "v2.csv", CHANGED)
    out = runner.invoke(app, [*add, "--from", v2])
    assert out.exit_code == 1 and "already stored" in out.output and "--replace" in out.output
    assert runner.invoke(app, [*add, "--from", v2, "--replace"]).exit_code == 0
    # until the next audit, the stale vector is hidden from the views, and verify names its part
    con = open_catalog(store)
    assert con.execute("select count(*) from embeddings").fetchone()[0] == 23
    assert con.execute("select count(*) from embeddings where item_id = 'w05'").fetchone()[0] == 0
    stale = runner.invoke(app, ["verify", "--root", root])
    stale_file = next(f for f, _ in parts_before.values() if "w05" in _part_ids(store, f))
    assert stale.exit_code == 1 and "stale_text" in stale.output and stale_file in stale.output, stale.output

    summary = _audit(root, tiny_model_dir, ["words"])
    assert summary.embedded_items == {"words": 8} and summary.skipped_shards == {"words": 2}
    _assert_invariant(store, CHANGED)
    _assert_only_first_shard_replaced(parts_before, _committed(store)[1])
    assert runner.invoke(app, ["verify", "--root", root]).exit_code == 0


def _part_ids(store: Store, file: str) -> list[str]:
    return _part_ids_at(store, f"{store.embeddings_dir('tiny', 'r1', 'words')}/{file}")


def _part_ids_at(store: Store, rel: str) -> list[str]:
    return pq.read_table(io.BytesIO(store.read_bytes(rel)), columns=["item_id"])["item_id"].to_pylist()


# ---------------------------------------------------------------- (c) a changed file straight to audit
@pytest.mark.slow
def test_changed_file_with_the_same_basename_is_refused_then_replaced(tmp_path, tiny_model_dir, prefect_api):
    root = str(tmp_path / "root")
    first, second = _csv(tmp_path / "a" / "words.csv", TEXTS), _csv(tmp_path / "b" / "words.csv", CHANGED)
    assert _audit(root, tiny_model_dir, [first]).embedded_items == {"words": 24}
    store = Store(root)
    _, parts_before = _committed(store)

    with pytest.raises(ProbeInputError) as err:
        _audit(root, tiny_model_dir, [second])
    msg = str(err.value)
    assert "probe set 'words' is already stored at" in msg and store.url("probes/probe_set=words") in msg
    assert second in msg and f"normaudit probes add words --from {second} --replace" in msg
    assert "another name" in msg
    assert open_catalog(store).execute(
        "select text from probe_items where item_id = 'w05'").fetchone()[0] == TEXTS["w05"]  # nothing written

    summary = _audit(root, tiny_model_dir, [second], replace=True)
    assert summary.embedded_items == {"words": 8}
    _assert_invariant(store, CHANGED)
    _assert_only_first_shard_replaced(parts_before, _committed(store)[1])
    report = verify_root(store, "sha256", texts=True)
    assert report.ok, report.problems


def test_basename_collision_is_refused_before_anything_is_written(tmp_path):
    from pipeline.audit.steps import load_and_store_probes

    settings = load_settings(root=str(tmp_path / "root"))
    first, second = _csv(tmp_path / "x" / "words.csv", TEXTS), _csv(tmp_path / "y" / "words.csv", CHANGED)
    load_and_store_probes(settings, first)
    load_and_store_probes(settings, first)  # the same data again is fine
    with pytest.raises(ProbeInputError, match="already stored") as err:
        load_and_store_probes(settings, second)
    assert second in str(err.value) and "1 text changed" in str(err.value)
    # a file inside a template collides the same way; the hint names the base set and the bare file
    nouns = {f"n{i}": w for i, w in enumerate(WORDS[:6])}
    load_and_store_probes(settings, _csv(tmp_path / "x" / "nouns.csv", nouns) + "@this-is-a")
    other = _csv(tmp_path / "y" / "nouns.csv", {**nouns, "n1": "ocean"})
    with pytest.raises(ProbeInputError, match="'nouns@this-is-a' is already stored") as err:
        load_and_store_probes(settings, f"{other}@this-is-a")
    assert f"normaudit probes add nouns --from {other} --replace" in str(err.value)
    load_and_store_probes(settings, second, replace=True)
    stored = open_catalog(Store(settings.root)).execute(
        "select text, text_sha256 from probe_items where probe_set = 'words' and item_id = 'w05'").fetchone()
    assert stored == (CHANGED["w05"], _sha(CHANGED["w05"]))


# ---------------------------------------------------------------- an older store (parts without text_sha256)
def _old_shard_id(item_ids: list[str], fingerprint: str, params: dict) -> str:
    """The shard id before text hashes: item ids, fingerprint and parameters only."""
    import json

    h = hashlib.sha256()
    h.update(fingerprint.encode())
    h.update(json.dumps(params, sort_keys=True).encode())
    for i in item_ids:
        h.update(b"\x00")
        h.update(i.encode())
    return h.hexdigest()[:20]


def _downgrade(store: Store) -> list[str]:
    """Rewrite every committed part, its manifest entry and the probe item tables as the code before text
    hashes wrote them: no text_sha256 column, shard ids of item ids only."""
    files = []
    for m in store.manifests():
        d = store.embeddings_dir(m.model, m.release, m.probe_set)
        for p in m.parts:
            table = pq.read_table(io.BytesIO(store.read_bytes(f"{d}/{p.file}")))
            store.rm(f"{d}/{p.file}")
            p.shard_id = _old_shard_id(table["item_id"].to_pylist(), m.fingerprint, m.params)
            p.file = f"part-{p.shard_id}.parquet"
            _, p.sha256 = store.write_table(f"{d}/{p.file}", table.drop_columns(["text_sha256"]))
            p.size = len(store.read_bytes(f"{d}/{p.file}"))
            files.append(f"{d}/{p.file}")
        store.write_manifest(m)
    for rel in store.glob("probes/*/items.parquet"):
        store.write_table(rel, store.read_table(rel).drop_columns(["text_sha256"]))
    return files


@pytest.mark.slow
def test_older_store_is_detected_by_verify_repaired_and_reembedded(tmp_path, tiny_model_dir, prefect_api):
    root, csv = str(tmp_path / "root"), _csv(tmp_path / "words.csv", TEXTS)
    _audit(root, tiny_model_dir, [csv])
    store = Store(root)
    old_files = _downgrade(store)
    con = open_catalog(store)  # an older store still opens; its unverifiable rows are hidden
    assert con.execute("select count(*) from embeddings").fetchone()[0] == 0
    hashes = dict(con.execute("select item_id, text_sha256 from probe_items").fetchall())
    assert hashes == {i: _sha(t) for i, t in TEXTS.items()}  # computed by DuckDB where not stored

    found = _cli("verify", "--root", root)
    assert found.returncode == 1, found.stdout + found.stderr
    err = " ".join(found.stderr.split())
    assert all(store.url(f) in err for f in old_files) and err.count("no_text_hash") == 3
    fixed = _cli("verify", "--root", root, "--repair")
    assert fixed.returncode == 0 and "repaired: 3 part(s)" in fixed.stdout, fixed.stdout + fixed.stderr
    assert store.read_manifest("tiny", "r1", "words").parts == []
    assert len(store.glob("quarantine/verify-*/tiny/r1/words/part-*.parquet")) == 3
    clean = _cli("verify", "--root", root)
    assert clean.returncode == 0 and "ok:" in clean.stdout, clean.stdout + clean.stderr

    assert _audit(root, tiny_model_dir, [csv]).embedded_items == {"words": 24}
    _assert_invariant(store, TEXTS)


def test_older_part_counts_as_not_done_and_is_superseded_without_repair(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("w", 20, {"zipf": np.arange(20)})
    store_synthetic(store, "m", "r", ps, np.linspace(1, 2, 20), shard_size=SHARD)
    old_files = _downgrade(store)
    manifest = store.read_manifest("m", "r", "w")
    committed = committed_item_ids(store, manifest)
    assert all(h is None for rows in committed.values() for h in rows.values())
    shards = split_shards("w", ps.items, "f" * 64, {"pooling": "mean"}, SHARD)
    assert pending_shards(shards, committed) == shards
    store_synthetic(store, "m", "r", ps, np.linspace(1, 2, 20), shard_size=SHARD)  # what the next audit commits
    rows, parts = _committed(store, "w", "m", "r")
    assert rows.height == 20 and rows["item_id"].is_unique().all() and rows["text_sha256"].null_count() == 0
    assert not any(store.exists(f) for f in old_files)  # dropped after the manifest stopped listing them
    assert verify_root(store, "sha256", texts=True).ok


# ---------------------------------------------------------------- planning, views, gates and verify, in small
def test_a_changed_text_is_pending_is_hidden_and_is_stale_until_reembedded(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("w", 20, {"zipf": np.arange(20)})
    store_synthetic(store, "m", "r", ps, np.linspace(1, 2, 20), shard_size=SHARD)
    assert verify_root(store, "sha256", texts=True).ok
    changed = ProbeSet("w", ps.items.with_columns(
        pl.when(pl.col("item_id") == "w00011").then(pl.lit("another text")).otherwise(pl.col("text")).alias("text")),
        ps.properties)
    write_probe_tables(store, changed)
    shards = split_shards("w", changed.items, "f" * 64, {"pooling": "mean"}, SHARD)
    todo = pending_shards(shards, committed_item_ids(store, store.read_manifest("m", "r", "w")))
    assert [s.start for s in todo] == [8]  # only the shard holding w00011
    con = open_catalog(store)
    assert con.execute("select count(*) from embeddings").fetchone()[0] == 19
    problems = verify_root(store, "sha256", texts=True).problems
    assert [p.kind for p in problems] == ["stale_text"] and problems[0].kind in TEXT_KINDS
    assert "w00011" in problems[0].detail and "w00011" in _part_ids_at(store, problems[0].file)
    folder = repair(store, problems)
    assert store.exists(f"{folder}/m/r/w/{problems[0].file.rsplit('/', 1)[1]}")
    assert verify_root(store, "sha256", texts=True).ok
    assert open_catalog(store).execute("select count(*) from embeddings").fetchone()[0] == 12


def test_limit_after_a_text_change_embeds_the_whole_shard(tmp_path, tiny_model_dir):
    from pipeline.audit.context import AuditContext
    from pipeline.audit.steps import plan_shards
    from pipeline.embedding.models import get_spec, resolve_model

    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("w", 20, {"zipf": np.arange(20)})
    store_synthetic(store, "m", "r", ps, np.linspace(1, 2, 20), shard_size=SHARD)
    changed = ProbeSet("w", ps.items.with_columns(
        pl.when(pl.col("item_id") == "w00002").then(pl.lit("another text")).otherwise(pl.col("text")).alias("text")),
        ps.properties)
    settings = load_settings(root=store.root_url, shard_size=SHARD)
    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    ctx = AuditContext(settings, "m", "r", "run", resolved)
    todo, done = plan_shards(ctx, changed, limit=5)
    # a 5-item part could replace only some rows of the committed 8-item part: the whole shard is embedded
    assert [(s.start, s.size) for s in todo] == [(0, SHARD)] and done == 0
    assert plan_shards(ctx, ps, limit=5) == ([], 1)  # unchanged: nothing to do


def test_python_and_duckdb_text_hashes_agree():
    import duckdb

    texts = ["dog", "Ünïcödé ß", "emoji 🐕 dog", "tab\tand\nnewline", " leading space"]
    got = [r[0] for r in duckdb.execute("select sha256(t) from unnest(?) as u(t)", [texts]).fetchall()]
    assert text_sha256(texts) == got == [_sha(t) for t in texts]


def test_a_part_with_another_texts_hash_fails_its_gate(tmp_path):
    from pipeline.quality.gates import gate_part
    from pipeline.storage.parts import PartValidationError, embeddings_table, encode_table
    from pipeline.storage.shards import Shard
    from pipeline.storage.store import Manifest
    from tests.helpers import FakeResult

    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("w", 6, {"zipf": np.arange(6)})
    shard = split_shards("w", ps.items, "f" * 64, {}, 6)[0]
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(6, 4)).astype(np.float32)
    res = FakeResult(vectors, np.linalg.norm(vectors.astype(np.float64), axis=1), np.full(6, 3), np.zeros(6, bool))
    table = embeddings_table("m", "r", shard, res)
    assert table["text_sha256"].to_pylist() == shard.text_sha256 == [_sha(t) for t in shard.texts]
    template = Manifest("m", "r", "w", "f" * 64, {}, 4, "float32")
    planned = [*shard.text_sha256[:2], _sha("a text that was not embedded"), *shard.text_sha256[3:]]
    as_planned = Shard(shard.probe_set, shard.shard_id, shard.start, shard.item_ids, shard.texts, planned)
    data = encode_table(table)
    with pytest.raises(PartValidationError, match="text_is_shards") as err:
        gate_part(store, table, data, as_planned, template, "run-1")
    assert "w00002" in str(err.value)
    assert sha256_bytes(store.read_bytes(f"quarantine/run-1/w/part-{shard.shard_id}.parquet")) == sha256_bytes(data)
