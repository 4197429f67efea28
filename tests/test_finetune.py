"""Fine-tuning a real (tiny) encoder: the seeded split, the training trace, its gate, the formula's scores,
and the loop of issue 20 as a user runs it: `normaudit theory finetune`, then `normaudit serve --once`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
import yaml
from scipy import stats

from pipeline.embedding.embed import get_embedder
from pipeline.embedding.models import resolve_model
from pipeline.probes.splits import (
    load_reverse_dictionary_test,
    reverse_dictionary_pairs,
)
from pipeline.quality.gates import gate_trace_part
from pipeline.quality.suites import DataValidationError
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from pipeline.theory.finetune import FinetuneConfig, finetune, training_pairs
from pipeline.theory.trace import TRACE_KINDS, TRACE_SCHEMA, TraceEncoder, displacement, trace_sample
from pipeline.theory.trace_formula import read_trace, score_formula
from tests.helpers import synthetic_trace

BIN = Path(sys.executable).parent


def reference_pooled_vectors(model, texts: list[str], batch_size: int = 128) -> np.ndarray:
    """The trace's computation before the TraceEncoder (issue 20's code, kept verbatim as the reference):
    batches of 128 in sample order, tokenized at every call, eval mode, no gradients, modules up to Normalize."""
    import torch

    modules = []
    for module in model:
        if type(module).__name__ == "Normalize":
            break
        modules.append(module)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    try:
        with torch.no_grad():
            for lo in range(0, len(texts), batch_size):
                features = model.preprocess(texts[lo:lo + batch_size])
                features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
                for module in modules:
                    features = module(features)
                out.append(features["sentence_embedding"].float().cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out)


def test_split_is_seeded_disjoint_and_the_test_probe_set_holds_only_test_queries():
    train, test = reverse_dictionary_pairs("train"), reverse_dictionary_pairs("test")
    assert set(train["lemma"]).isdisjoint(test["lemma"])
    assert 0.08 < test.height / (train.height + test.height) < 0.12  # TEST_FRACTION 0.1
    assert reverse_dictionary_pairs("test").equals(test)  # the same split every time
    other = reverse_dictionary_pairs("test", seed=1)
    assert set(other["lemma"]) != set(test["lemma"])  # the seed matters
    ps = load_reverse_dictionary_test()
    queries = {i[2:] for i in ps.items.filter(pl.col("kind") == "query")["item_id"]}
    assert queries == set(test["lemma"])
    assert set(ps.relations["left_id"]) == {f"q:{w}" for w in test["lemma"]}
    assert ps.items.filter(pl.col("kind") == "doc").height == train.height + test.height  # every lemma


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory):
    """Five optimizer steps of the tiny model, a checkpoint and a trace after every one."""
    tmp = tmp_path_factory.mktemp("finetune")
    store = Store(str(tmp / "root"))
    cfg = FinetuneConfig(model=str(tiny_model_dir), steps=5, batch_size=8, learning_rate=0.05, optimizer="sgd",
                         checkpoint_every=1, trace_nouns=30, trace_definitions=20, out=str(tmp / "ckpt"),
                         run="tiny-sgd")
    summary = finetune(load_settings(root=str(tmp / "root")), store, cfg, "run-test")
    return cfg, store, summary


def test_trace_adds_up_and_equals_the_audit_embedder_on_every_checkpoint(tiny_run):
    cfg, store, summary = tiny_run
    assert [Path(c).name for c in summary["checkpoints"]] == [f"step-{s:06d}" for s in range(6)]
    trace = read_trace(store, "tiny-sgd")  # through the DuckDB view: gated parts only
    assert trace.height == 6 * 50 and trace["step"].unique().sort().to_list() == list(range(6))
    sample = trace_sample(30, 20, cfg.seed)
    vectors = []
    for ckpt in summary["checkpoints"]:  # the audit's own embedder on each saved checkpoint
        vectors.append(get_embedder(resolve_model(ckpt), device="cpu").embed(sample["text"].to_list()).vectors)
    for step in range(6):
        rows = trace.filter(pl.col("step") == step).join(sample.select("item_id"), on="item_id", how="right")
        z = vectors[step].astype(np.float64)
        np.testing.assert_allclose(rows["norm"].to_numpy(), np.linalg.norm(z, axis=1), rtol=1e-5)
        if step == 0:
            continue
        before = vectors[step - 1].astype(np.float64)
        u = before / np.linalg.norm(before, axis=1, keepdims=True)
        disp = z - before
        radial = (disp * u).sum(1)
        scale = (before**2).sum(1)
        np.testing.assert_allclose(rows["radial"].to_numpy(), radial, atol=1e-5 * np.sqrt(scale).max())
        np.testing.assert_allclose(rows["tangential"].to_numpy(), np.linalg.norm(disp - radial[:, None] * u, axis=1),
                                   atol=1e-5 * np.sqrt(scale).max())
        # the decomposition adds back up to the observed change of r^2, to float32 precision
        r_before = trace.filter(pl.col("step") == step - 1).join(sample.select("item_id"), on="item_id",
                                                                  how="right")["norm"].to_numpy()
        observed = rows["norm"].to_numpy() ** 2 - r_before**2
        parts = 2 * r_before * rows["radial"].to_numpy() + rows["radial"].to_numpy() ** 2 \
            + rows["tangential"].to_numpy() ** 2
        np.testing.assert_allclose(parts, observed, atol=1e-6 * scale.max())
        assert np.abs(observed).max() > 0  # the weights moved
    assert set(trace["lr"].filter(trace["step"] > 0).to_list()) == {0.05}


def test_the_trace_equals_the_old_trace_computation_on_every_checkpoint(tiny_run):
    """The traced rows (norm, radial, tangential) against issue 20's computation on each saved checkpoint."""
    from sentence_transformers import SentenceTransformer

    cfg, store, summary = tiny_run
    trace = read_trace(store, "tiny-sgd")
    sample = trace_sample(30, 20, cfg.seed)
    before = None
    for step, ckpt in enumerate(summary["checkpoints"]):
        old = reference_pooled_vectors(SentenceTransformer(ckpt, device="cpu"), sample["text"].to_list())
        rows = trace.filter(pl.col("step") == step).join(sample.select("item_id"), on="item_id", how="right")
        scale = np.linalg.norm(old.astype(np.float64), axis=1).max()
        np.testing.assert_allclose(rows["norm"].to_numpy(), np.linalg.norm(old.astype(np.float64), axis=1),
                                   rtol=1e-5)
        if before is not None:
            _, radial, tangential = displacement(before, old)
            np.testing.assert_allclose(rows["radial"].to_numpy(), radial, atol=1e-5 * scale)
            np.testing.assert_allclose(rows["tangential"].to_numpy(), tangential, atol=1e-5 * scale)
        before = old


def test_trace_encoder_equals_the_old_batching_with_less_padding(tiny_model_dir):
    """Length-sorted, pre-tokenized batches give the old vectors (to float32 rounding) in the sample's order,
    in eval mode, and leave a model in training mode as it was."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model_dir), device="cpu")
    texts = trace_sample(120, 60, 3)["text"].to_list()  # short nouns, then longer definitions
    model.train()
    encoder = TraceEncoder(model, texts, max_tokens=256)
    got = encoder.vectors()
    assert model.training  # restored
    want = reference_pooled_vectors(model, texts)
    assert got.shape == want.shape == (180, model.get_embedding_dimension())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    tokens = [min(len(model.tokenizer(t)["input_ids"]), model.max_seq_length) for t in texts]
    old_padded = sum(len(b) * max(b) for b in (tokens[i:i + 128] for i in range(0, len(tokens), 128)))
    real = sum(tokens)
    assert real <= encoder.padded_tokens < old_padded
    assert len(encoder.batches) > 1 and all(f["attention_mask"].numel() <= 256 for _, f in encoder.batches)


def test_decay_norms_puts_every_parameter_in_the_decayed_group(tiny_model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model_dir), device="cpu")
    exempt = sum(p.numel() for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < exempt < total
    for decay_norms, optimizer in ((False, "sgd"), (True, "adamw")):  # adamw: the fused kernel, on CPU
        cfg = FinetuneConfig(model=str(tiny_model_dir), steps=2, batch_size=8, optimizer=optimizer, learning_rate=0.05,
                             trace_nouns=5, trace_definitions=5, trace_every=2, decay_norms=decay_norms,
                             out=str(tmp_path / f"ckpt-{decay_norms}"), run=f"decay-{decay_norms}")
        summary = finetune(load_settings(root=str(tmp_path / "root")), Store(str(tmp_path / "root")), cfg, "r")
        assert summary["decay_parameters"] == ({"decayed": total, "exempt": 0} if decay_norms
                                               else {"decayed": total - exempt, "exempt": exempt})
        assert summary["seconds"]["trace"] > 0 and summary["trace_tokens"] > 0
    assert FinetuneConfig(decay_norms=True).label() == "minilm-l6-adamw-decaynorms-s0"


def test_shuffled_pairs_keep_the_texts_and_lose_the_pairing():
    semantic = training_pairs(FinetuneConfig())
    shuffled = training_pairs(FinetuneConfig(pairs="shuffled", seed=1))
    assert shuffled["definition"].to_list() == semantic["definition"].to_list()
    assert sorted(shuffled["word"].to_list()) == sorted(semantic["word"].to_list())
    assert (shuffled["word"] == semantic["word"]).mean() < 0.01  # a permutation keeps ~1/n in place
    assert training_pairs(FinetuneConfig(pairs="shuffled", seed=1)).equals(shuffled)  # seeded
    assert not training_pairs(FinetuneConfig(pairs="shuffled", seed=2)).equals(shuffled)
    assert FinetuneConfig(pairs="shuffled", optimizer="sgd").label() == "minilm-l6-sgd-shuffled-s0"


def test_a_broken_trace_part_is_quarantined_and_never_visible(tmp_path):
    store = Store(str(tmp_path / "root"))
    n = 4
    table = pa.table({"run": ["r"] * n, "step": [3] * n, "item_id": list("abcd"), "kind": ["noun"] * n,
                      "norm": [1.0] * n, "r2_change": [0.5, 0.0, 0.0, 0.0],  # row a: parts give 0, not 0.5
                      "radial": [0.0] * n, "tangential": [0.0] * n, "lr": [0.1] * n, "steps_since": [1] * n},
                     schema=TRACE_SCHEMA)
    with pytest.raises(DataValidationError, match="quarantined"):
        gate_trace_part(store, table, "r", TRACE_KINDS, "run-x")
    assert store.glob("quarantine/run-x/training_trace/r/part-000003.parquet")
    con = open_catalog(store)
    assert con.execute("select count(*) from training_trace").fetchone()[0] == 0
    good = table.set_column(table.schema.get_field_index("r2_change"), "r2_change", pa.array([0.0] * n))
    gate_trace_part(store, good, "r", TRACE_KINDS, "run-x")
    assert open_catalog(store).execute("select count(*) from training_trace").fetchone()[0] == n


def test_formula_scores_equal_an_independent_numpy_scipy_computation():
    items, steps, lr, wd = 40, 9, 0.1, 0.05
    trace = synthetic_trace(items, steps, lr)
    got = score_formula(trace, wd)
    # independent: steps 1..8, first half 1..4 predicts 5..8
    t = trace.filter(pl.col("step") > 0).sort("item_id", "step")
    norm_m = t["norm"].to_numpy().reshape(items, 8)
    r2 = norm_m**2 - t["r2_change"].to_numpy().reshape(items, 8)
    d = np.sqrt(r2) * t["radial"].to_numpy().reshape(items, 8) / lr + wd * r2
    h = r2 * t["tangential"].to_numpy().reshape(items, 8) ** 2 / lr**2
    big_d, v2 = d[:, :4].mean(1) / wd, lr * h[:, :4].mean(1) / wd
    predicted = np.sqrt(0.5 * (big_d + np.sqrt(big_d**2 + 2 * v2)))
    observed = norm_m[:, 4:].mean(1)
    r2_expected = 1 - ((observed - predicted) ** 2).sum() / ((observed - observed.mean()) ** 2).sum()
    assert got["window"] == [1, 5, 8]
    assert got["second_half"]["formula"]["r2"] == pytest.approx(r2_expected, abs=1e-9)
    assert got["second_half"]["formula"]["spearman"] == pytest.approx(stats.spearmanr(predicted, observed)[0],
                                                                       abs=1e-9)
    persistence = norm_m[:, :4].mean(1)
    assert got["final"]["persistence"]["spearman"] == pytest.approx(stats.spearmanr(persistence, norm_m[:, -1])[0],
                                                                    abs=1e-9)
    heat_only = (lr * h[:, :4].mean(1) / (2 * wd)) ** 0.25  # r^4 = eta h / (2 lambda)
    assert got["final"]["heat_only"]["r2"] == pytest.approx(
        1 - ((norm_m[:, -1] - heat_only) ** 2).sum() / ((norm_m[:, -1] - norm_m[:, -1].mean()) ** 2).sum(), abs=1e-9)
    # the same terms as a forecast: the balance stepped forward from the norm after step 4, over steps 5..8
    r2_now, path = norm_m[:, 3] ** 2, []
    for _ in range(4):
        r2_now = r2_now + 2 * lr * (d[:, :4].mean(1) - wd * r2_now) + lr**2 * h[:, :4].mean(1) / r2_now
        path.append(np.sqrt(r2_now))
    forecast = np.mean(path, axis=0)
    assert got["second_half"]["integrated"]["spearman"] == pytest.approx(stats.spearmanr(forecast, observed)[0],
                                                                         abs=1e-9)
    assert got["final"]["integrated"]["r2"] == pytest.approx(
        1 - ((norm_m[:, -1] - path[-1]) ** 2).sum() / ((norm_m[:, -1] - norm_m[:, -1].mean()) ** 2).sum(), abs=1e-9)
    with pytest.raises(ValueError, match="every step"):
        score_formula(trace.with_columns(pl.col("steps_since") * 2), wd)


def test_the_readme_fine_tune_config_is_valid_and_watches_the_default_run():
    from pipeline.audit.watch import load_audits_config

    cfg = load_audits_config(Path(__file__).resolve().parents[1] / "infra" / "finetune-audits.yaml")
    (watched,) = cfg.watch
    assert watched.checkpoints == f"normaudit-checkpoints/{FinetuneConfig(optimizer='adamw').label()}"
    assert "wordnet-reverse-dictionary-test" in watched.probes


def _cli(*args, env, timeout=600):
    return subprocess.run([str(BIN / "normaudit"), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_finetune_verbose_restores_the_libraries_output(tiny_model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    out = _cli("theory", "finetune", "--model", str(tiny_model_dir), "--steps", "2", "--batch-size", "8",
               "--trace-nouns", "5", "--trace-definitions", "5", "--optimizer", "sgd", "--run", "loud",
               "--out", str(tmp_path / "ckpt"), "--root", str(tmp_path / "root"), "--verbose", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2/2 steps" in out.stdout
    assert "Loading weights" in out.stderr  # transformers' bar
    assert "Finished in state Completed()" in out.stderr  # Prefect's per-task lines


@pytest.mark.slow
def test_finetune_then_serve_once_audits_each_checkpoint_as_a_release(tiny_model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    env["COLUMNS"] = "200"
    root, ckpt = tmp_path / "root", tmp_path / "ckpt"
    bad = _cli("theory", "finetune", "--model", str(tiny_model_dir), "--optimizer", "lion", "--root", str(root),
               env=env)
    assert bad.returncode != 0 and "optimizer" in bad.stderr and "adamw" in bad.stderr
    out = _cli("theory", "finetune", "--model", str(tiny_model_dir), "--steps", "4", "--batch-size", "8",
               "--checkpoint-every", "2", "--trace-nouns", "30", "--trace-definitions", "20", "--lr", "0.05",
               "--optimizer", "sgd", "--run", "tiny", "--out", str(ckpt), "--root", str(root), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "checkpoints: 3" in out.stdout and "norm formula" in out.stdout
    # the progress bar's last state (steps of total, elapsed, left, loss), the trace's share, nothing else
    assert re.search(r"fine-tune tiny .* 4/4 steps \d+:\d\d:\d\d left \d+:\d\d:\d\d loss \d+\.\d{4}", out.stdout), \
        out.stdout
    assert re.search(r"trace: \d+s of \d+s wall \(\d+%; [\d,]+ padded tokens a traced step\)", out.stdout)
    for chatter in ("Computing widget examples", "Loading weights", "it/s", "INFO", "Warning"):
        assert chatter not in out.stdout + out.stderr, chatter
    scored = _cli("theory", "formula", "--run", "tiny", "--root", str(root), env=env)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "steps 1-2 predict 3-4" in scored.stdout and "persistence" in scored.stdout
    missing = _cli("theory", "formula", "--run", "nope", "--root", str(root), env=env)
    assert missing.returncode == 1 and "no fine-tune run 'nope'" in missing.stderr
    again = _cli("theory", "finetune", "--model", str(tiny_model_dir), "--steps", "2", "--run", "tiny2",
                 "--out", str(ckpt), "--root", str(root), env=env)
    assert again.returncode == 1 and f"checkpoint folder {ckpt} is not empty" in again.stderr
    # the traced nouns as a probe file: their audited norms must be the trace's
    sample = trace_sample(30, 20, 0)
    probes = tmp_path / "traced.csv"
    sample.with_columns(pl.col("item_id").str.len_chars().cast(pl.Float64).alias("length")).select(
        "item_id", "text", "length").write_csv(probes)
    config = tmp_path / "audits.yaml"
    config.write_text(yaml.safe_dump({
        "root": str(root), "thresholds": {"default": 1e9},
        "watch": [{"name": "tiny-ft", "checkpoints": str(ckpt), "probes": [str(probes)]}]}))
    served = _cli("serve", "--config", str(config), "--once", env=env, timeout=900)
    assert served.returncode == 0, served.stderr[-3000:]
    assert "tiny-ft: audited 3 new release(s): step-000000, step-000002, step-000004" in served.stdout
    con = open_catalog(Store(str(root)))
    runs = con.execute("select release, status from runs where model = 'tiny-ft' order by release").fetchall()
    assert runs == [("step-000000", "completed"), ("step-000002", "completed"), ("step-000004", "completed")]
    pairs = con.execute("select distinct base_release, release from comparisons order by 1").fetchall()
    assert pairs == [("step-000000", "step-000002"), ("step-000002", "step-000004")]  # each with the previous
    joined = con.execute("""
        select t.norm as traced, e.norm as audited from training_trace t
        join embeddings e on e.item_id = t.item_id and e.release = printf('step-%06d', t.step)
        where t.run = 'tiny' and e.model = 'tiny-ft'""").fetchnumpy()
    assert len(joined["traced"]) == 3 * 50
    np.testing.assert_allclose(joined["traced"], joined["audited"], rtol=1e-5)
    page = (root / "reports" / "tiny-ft" / "index.html").read_text()  # the trends page, with each step
    assert "Release to release" in page
    assert "step-000000 → step-000002:" in page and "step-000002 → step-000004:" in page
    again = _cli("serve", "--config", str(config), "--once", env=env, timeout=600)
    assert again.returncode == 0 and "tiny-ft: audited 0 new release(s)" in again.stdout


def test_the_finetune_commands_defaults_are_the_configs():
    """The CLI spells its defaults out (it imports no torch to show --help): they must stay the config's."""
    import typer.main

    from pipeline.cli.main import app

    command = typer.main.get_command(app).commands["theory"].commands["finetune"]
    cfg = FinetuneConfig()
    shared = {p.name: p.default for p in command.params if p.name in FinetuneConfig.model_fields and p.name != "lr"}
    assert {"steps", "batch_size", "trace_nouns", "trace_definitions", "trace_every"} <= set(shared)
    assert shared == {name: getattr(cfg, name) for name in shared}
