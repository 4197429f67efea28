"""A model that returns NaN for some items: its batch is quarantined, the flow fails naming them, views stay clean."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from flows.audit import run_audit
from pipeline.quality.datadocs import data_docs_path
from pipeline.quality.suites import suite_name
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.parts import PartValidationError
from pipeline.storage.store import Store
from tests.builders import build_tiny_model

pytestmark = pytest.mark.slow

WORDS = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "table", "chair"]
POISON = "apple"  # its embedding row becomes NaN, so exactly the items that contain it come out NaN
POISONED = ["i020", "i021", "i022"]


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory):
    """The tiny model with the input embedding row of one token set to NaN."""
    # lazy: torch and transformers take seconds to import, a cost every collection of the suite would pay
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("nan-model") / "tiny-nan")
    token_id = AutoTokenizer.from_pretrained(path).convert_tokens_to_ids(POISON)
    weights = load_file(path / "model.safetensors")
    weights["embeddings.word_embeddings.weight"][token_id] = float("nan")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_nan_items_are_quarantined_and_named(tmp_path, nan_model_dir, prefect_api):
    rng = np.random.default_rng(7)
    ids = [f"i{i:03d}" for i in range(48)]
    texts = [" ".join(rng.choice(WORDS, size=1 + i % 3)) for i in range(48)]
    for i in POISONED:
        texts[int(i[1:])] = f"{POISON} {texts[int(i[1:])]}"
    probes = tmp_path / "nanprobe.csv"
    pl.DataFrame({"item_id": ids, "text": texts, "zipf": rng.uniform(1, 7, 48)}).write_csv(probes)
    root = str(tmp_path / "root")
    overrides = {"root": root, "shard_size": 16}

    with pytest.raises(PartValidationError) as err:
        run_audit(load_settings(**overrides), str(nan_model_dir), [str(probes)], release="r1")
    msg = str(err.value)
    assert "expect_column_values_to_not_be_null(norm) failed for 3 rows" in msg, msg
    assert "vector_finite" in msg and all(f"'{i}'" in msg for i in POISONED)
    assert "quarantine/" in msg and suite_name("embeddings") in msg

    store = Store(root)
    con = open_catalog(store)
    bad_shard = ids[16:32]  # the shard that held the NaN items
    placeholders = ",".join("?" * len(bad_shard))
    assert con.execute(f"select count(*) from embeddings where item_id in ({placeholders})",
                       bad_shard).fetchall() == [(0,)]
    assert con.execute("select count(*) from embeddings where not isfinite(norm) or norm <= 0").fetchall() == [(0,)]
    run_id, status, message = con.execute("select run_id, status, message from runs").fetchall()[0]
    assert status == "failed" and "PartValidationError" in message and "i020" in message

    parts = store.glob(f"quarantine/{run_id}/nanprobe/part-*.parquet")
    assert len(parts) == 1
    quarantined = pl.read_parquet(store.path(parts[0]))
    assert sorted(quarantined["item_id"].to_list()) == bad_shard
    assert sorted(quarantined.filter(pl.col("norm").is_nan())["item_id"].to_list()) == POISONED
    record = json.loads(store.read_bytes(parts[0].replace(".parquet", ".report.json")))
    assert record["validation_result"]["success"] is False and record["suite"] == suite_name("embeddings")
    assert any("i021" in f for f in record["failures"])
    # the run's Data Docs were built in the flow's finally, failure included
    index = data_docs_path(store, run_id)
    assert store.exists(index.removeprefix(store.base + "/"))
    assert "Failed" in store.read_bytes(index.removeprefix(store.base + "/")).decode()
