"""Theory lab: step identity, estimators (with the checks that catch a broken one), world, config,
checkpoint export through the real loading path, and one small end-to-end run with audited checkpoints."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import polars as pl
import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from pipeline.theory import estimators
from pipeline.theory.config import LabConfig, load_config
from pipeline.theory.encoder import TrainConfig, build_model, info_nce, train
from pipeline.theory.estimators import equilibrium_norm, r2_score, score, spearman, step_terms
from pipeline.theory.identity import IdentityConfig, check_identity
from pipeline.theory.sweep import run_pair
from pipeline.theory.world import WorldConfig, build_world

TINY_WORLD = WorldConfig(depth=3, branching=2, items_per_concept=3, ambiguous_share=0.25)


@pytest.fixture(scope="module")
def world():
    return build_world(TINY_WORLD)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    # tiny matrices: extra threads only spin against other processes (100x slower on a busy machine)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- world -------------------------------------------------------------------------------------


def test_world_shape_frequencies_and_views(world):
    assert world.n_items == (2 + 4 + 8) * 3
    assert np.isclose(world.prob.sum(), 1.0) and (np.diff(np.sort(world.prob)) >= 0).all()
    assert set(world.depth.tolist()) == {1, 2, 3}
    n_amb = int((world.ambiguity > 0).sum())
    assert n_amb == round(0.25 * world.n_items) and world.ambiguity.max() <= 1.0
    rng = np.random.default_rng(0)
    anchors = world.sample_anchors(rng, 20000)
    # Zipf sampling: empirical frequencies follow prob
    freq = np.bincount(anchors, minlength=world.n_items) / len(anchors)
    assert np.abs(freq - world.prob).max() < 0.01
    positives = world.sample_positives(rng, anchors)
    assert (positives != anchors).mean() > 0.99
    # an unambiguous leaf item's views are its own concept's other items (noise aside)
    leaf = next(i for i in range(world.n_items) if world.depth[i] == 3 and world.mix[i] == 0)
    views = positives[anchors == leaf]
    same = world.concept[views] == world.concept[leaf]
    assert same.mean() > 0.9
    frame = world.probe_frame()
    assert frame.columns == ["item_id", "text", "kind", "depth", "log_frequency", "zipf", "ambiguity"]
    assert np.allclose(frame["zipf"], frame["log_frequency"] / np.log(10) + 9)


# ---- identity (THEORY.md section 2) ------------------------------------------------------------


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_step_identity_holds_to_float64_precision(world, weight_decay):
    res = check_identity(world, IdentityConfig(steps=60, lr=1.0), weight_decay)
    assert res.rows_checked > 500
    assert res.max_rel_error <= 1e-6
    assert res.max_radial_cosine < 1e-12  # the gradient is orthogonal to the row


# ---- estimators --------------------------------------------------------------------------------


def test_analytic_jvp_matches_forward_mode_autodiff(world):
    from torch.func import functional_call, jvp

    model = build_model(TrainConfig(), world.n_items)
    names, params = zip(*[(n, p.detach()) for n, p in model.named_parameters()], strict=True)
    gen = torch.Generator().manual_seed(0)
    delta = {n: torch.randn(p.shape, generator=gen, dtype=p.dtype)
             for n, p in zip(names, params, strict=True)}
    ids = torch.arange(world.n_items)
    ref = jvp(lambda *ps: functional_call(model, dict(zip(names, ps, strict=True)), (ids,)), params,
              tuple(delta[n] for n in names))[1]
    with torch.no_grad():
        assert torch.allclose(model.jvp(ids, delta), ref, rtol=0, atol=1e-12)


def test_table_heat_is_own_squared_spherical_gradient_and_drift_is_zero(world):
    cfg = TrainConfig(kind="table", lr=0.5, weight_decay=0.01)
    model = build_model(cfg, world.n_items)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(1)
    anchors = world.sample_anchors(rng, 16)
    ids = torch.arange(world.n_items)
    z = model(ids)
    info_nce(z[anchors], z[world.sample_positives(rng, anchors)], cfg.temperature).backward()
    before = model.table.detach().clone()
    grad = model.table.grad.clone()
    opt.step()
    with torch.no_grad():
        delta = {"table": model.table - before}
        r2, d, h = step_terms(before, model.jvp(ids, delta, at={"table": before}), model(ids), cfg.lr,
                              cfg.weight_decay)
    own = (r2 * (grad * grad).sum(1).numpy())
    assert np.allclose(h, own, rtol=1e-9, atol=1e-15)
    assert np.abs(d).max() < 1e-12 * r2.max() / cfg.lr
    absent = (grad == 0).all(1).numpy()
    # rows absent from the batch get no heat (their decay step is radial)
    assert absent.any() and h[absent].max() < 1e-20


def test_equilibrium_root_solves_the_quartic():
    d, h, lr, wd = np.array([0.0, 0.3, -0.2]), np.array([1.0, 2.0, 3.0]), 0.5, 0.01
    r = equilibrium_norm(d, h, lr, wd)
    assert np.isclose(r[0] ** 4, lr * h[0] / (2 * wd))  # d = 0: spherical-motion equilibrium
    big_d, v2 = d / wd, lr * h / wd
    assert np.allclose(r**4 - big_d * r**2 - v2 / 2, 0.0, atol=1e-9 * (r**4).max())
    assert np.isnan(equilibrium_norm(d, h, lr, 0.0)).all()


def test_rank_helpers_match_scipy():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 50).astype(float), rng.normal(size=50)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert r2_score(y, y) == 1.0 and r2_score(np.full(50, y.mean()), y) == pytest.approx(0.0, abs=1e-12)


@pytest.fixture(scope="module")
def scored(world):
    """Both kinds, both seeds, short but past equilibrium (eta*lambda = 0.01: tau ~ 25 steps)."""
    out = {}
    for kind in ("table", "encoder"):
        base = TrainConfig(kind=kind, lr=1.0, batch_size=16, weight_decay=0.01, steps=700, window=0.6)
        out[kind] = run_pair(world, (base, base.model_copy(update={"seed": 1})))
    return out


@pytest.mark.parametrize("kind,min_spearman", [("table", 0.7), ("encoder", 0.5)])
def test_prediction_beats_constant_heat(scored, kind, min_spearman):
    rows, _ = scored[kind]
    for row in rows:
        assert row["spearman"] >= min_spearman and row["seed_spearman"] >= min_spearman
        # the check: replacing h by a constant must make the prediction worse (a table's constant
        # prediction has no ranking at all: NaN)
        assert np.isnan(row["const_heat_spearman"]) or row["const_heat_spearman"] < row["spearman"] - 0.3
        assert row["const_heat_r2"] < row["r2"] - (0.3 if kind == "table" else 0.0)
        assert row["in_sample_spearman"] > row["spearman"]  # bookkeeping is easier than prediction
    if kind == "table":
        assert all(row["r2"] > 0.5 and row["missing_over_heat"] < 0.05 for row in rows)
        # a free row has no drift: its effective decay is lambda itself
        assert all(row["lambda_eff_over_lambda"] == pytest.approx(1.0, abs=1e-9) for row in rows)
    else:
        # the encoder's measured r^2 balance has second-order terms the formula leaves out, and decay of
        # the shared weights adds to each item's own
        assert all(row["missing_over_heat"] > 0.2 for row in rows)
        assert all(row["lambda_eff_decay_over_lambda"] > 1.5 for row in rows)
        for row in rows:
            parts = row["lambda_eff_decay_over_lambda"] + row["lambda_eff_gradient_over_lambda"]
            assert parts == pytest.approx(row["lambda_eff_over_lambda"], rel=1e-9)


def test_broken_estimator_is_caught(world, scored, monkeypatch):
    """Heat booked to the wrong items (an off-by-one in the item axis) must wreck the prediction."""
    real = estimators.step_terms

    def shifted(*args):
        r2, d, h = real(*args)
        return r2, d, np.roll(h, 1)

    monkeypatch.setattr(estimators, "step_terms", shifted)
    base = TrainConfig(kind="table", lr=1.0, batch_size=16, weight_decay=0.01, steps=700, window=0.6)
    broken = run_pair(world, (base, base.model_copy(update={"seed": 1})))[0][0]
    good = scored["table"][0][0]
    assert broken["spearman"] < good["spearman"] - 0.3 and broken["r2"] < good["r2"] - 0.3


def test_scores_are_out_of_sample(world):
    res = train(world, TrainConfig(kind="table", lr=1.0, batch_size=16, weight_decay=0.01, steps=200))
    first, second = res.tracker.estimates(0), res.tracker.estimates(1)
    assert not np.allclose(first.h, second.h)  # the halves are different data
    assert score(first.predicted_norm(), second.norm)["spearman"] > 0.5


# ---- config ------------------------------------------------------------------------------------


def test_config_files_validate_and_name_the_problem(tmp_path):
    good = tmp_path / "lab.yaml"
    good.write_text("name: quick\ntrain: {steps: 100}\n"
                    "sweep: {lrs: [0.5], batch_sizes: [8], weight_decays: [0.01]}\n")
    cfg = load_config(good)
    assert cfg.train.steps == 100 and cfg.checkpoint_steps() == (0, 25, 50, 75, 100)
    labels = [pair[0].label() for pair in cfg.grid()]
    assert cfg.base_run().label() in labels and len(labels) == 3  # table, encoder, + the base encoder
    assert load_config(None) == LabConfig()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train": {"stpes": 10}}))
    with pytest.raises(ValueError, match=r"bad.json: train.stpes: Extra inputs are not permitted"):
        load_config(bad)
    bad.write_text(json.dumps({"sweep": {"weight_decays": [0.0]}}))
    with pytest.raises(ValueError, match="weight decays must be > 0"):
        load_config(bad)


def test_cli_rejects_bad_config_before_running(tmp_path):
    from pipeline.cli.main import app

    bad = tmp_path / "bad.yaml"
    bad.write_text("world: {depht: 2}\n")
    out = CliRunner().invoke(app, ["theory", "run", "--config", str(bad), "--root", str(tmp_path / "r")])
    assert out.exit_code == 1 and "world.depht" in out.output
    assert not (tmp_path / "r").exists()


# ---- checkpoints as releases -------------------------------------------------------------------


def test_checkpoint_loads_through_the_audit_path_with_the_labs_norms(world, tmp_path):
    from pipeline.embedding.embed import Embedder
    from pipeline.embedding.models import get_spec, resolve_model
    from pipeline.theory.checkpoints import export_checkpoint

    res = train(world, TrainConfig(steps=30, batch_size=16))
    folder = export_checkpoint(res.model, world.tokens, tmp_path / "theory-x", 30)
    spec = get_spec(str(folder))
    assert (spec.name, spec.source) == ("theory-x", "checkpoint")
    resolved = resolve_model(spec)
    assert resolved.dim == 16
    embedder = Embedder(resolved, device="cpu")
    out = embedder.embed(world.tokens)
    with torch.no_grad():
        lab_norms = res.model(torch.arange(world.n_items)).norm(dim=1).numpy()
    assert np.allclose(out.norms, lab_norms, rtol=1e-5)
    assert (out.n_tokens == 1).all()  # one word-level token per item: the pooled vector is the row
    table_norms = res.model.table.detach().norm(dim=1).numpy()
    assert np.allclose(embedder.token_norms().norms[2:], table_norms, rtol=1e-5)


@pytest.mark.slow
def test_lab_run_end_to_end_audits_every_checkpoint(tmp_path, prefect_api):
    from pipeline.cli.main import app

    config = tmp_path / "tiny.yaml"
    config.write_text(
        "name: e2e\nworld: {depth: 2, branching: 3, items_per_concept: 3}\n"
        "train: {steps: 200, batch_size: 16, weight_decay: 0.01}\nidentity: {steps: 10}\n"
        "sweep: {lrs: [1.0], batch_sizes: [16], weight_decays: [0.01]}\ncheckpoints: {count: 2}\n"
    )
    root = tmp_path / "root"
    out = CliRunner().invoke(app, ["theory", "run", "--config", str(config), "--root", str(root)])
    assert out.exit_code == 0, out.output
    (folder,) = (root / "theory").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert max(summary["identity_max_rel_error"].values()) <= 1e-6
    sweep = duckdb.sql(f"select kind, seed, spearman from '{folder}/sweep.parquet' order by kind, seed")
    sweep = sweep.fetchall()
    assert [(k, s) for k, s, _ in sweep] == [("encoder", 0), ("encoder", 1), ("table", 0), ("table", 1)]
    checkpoints = pl.read_parquet(folder / "checkpoints.parquet").filter(pl.col("statistic") == "spearman")
    assert sorted(set(checkpoints["release"])) == ["step-000000", "step-000200"]
    assert sorted(set(checkpoints["property"])) == ["ambiguity", "depth", "log_frequency"]
    assert checkpoints["ci_low"].null_count() == 0 and (checkpoints["ci_low"] <= checkpoints["value"]).all()
    for png in ("predicted_vs_observed.png", "checkpoints.png"):
        assert (folder / png).read_bytes()[:4] == b"\x89PNG"
    # the last release's audited norms are the lab encoder's final norms: the same relation to depth
    items = pl.read_parquet(folder / "items.parquet").filter(pl.col("label") == "encoder-lr1-b16-wd0.01-s0")
    audited = checkpoints.filter((pl.col("release") == "step-000200") & (pl.col("property") == "depth"))
    assert items.height == 36 == audited["n"].item()
    assert audited["value"].item() == pytest.approx(spearman(items["final_norm"], items["depth"]), abs=1e-6)
