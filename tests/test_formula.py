"""Issue 35's estimators against independent numpy/scipy computations on synthetic traces whose true values are
known: d and h of a simulated SGD on a scale-invariant loss, the equilibrium root (plain and with h = c r^k),
the scaling exponent, the heat's power, every baseline and its intervals, the frozen head's exact per-item
displacements and the per-module recorder and equilibria."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
from scipy import stats

from pipeline.theory.baselines import BASELINES, baseline_predictions, bootstrap_differences, holds, seed_summary
from pipeline.theory.estimators import equilibrium_norm, step_terms
from pipeline.theory.power_laws import corrected_equilibrium, fit_exponent, fit_heat_power, integrate_corrected
from pipeline.theory.trace_formula import formula_predictions, integrate_balance
from tests.helpers import synthetic_trace


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only contend with other processes
    yield
    torch.set_num_threads(before)


def simulate_sgd(heat: np.ndarray, eta: float, lam: float, steps: int, dim: int = 8, seed: int = 0):
    """Free rows under SGD on a scale-invariant loss: z' = (1 − ηλ) z − η g / r, g ⟂ z with ‖g‖² = heat (known).

    Returns the norms after every step [steps, N] and the last step's (z, z') pair.
    """
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(heat.size, dim))
    norms = np.empty((steps, heat.size))
    for t in range(steps):
        r = np.linalg.norm(z, axis=1)
        g = rng.normal(size=z.shape)
        g -= (g * z).sum(1, keepdims=True) / r[:, None] ** 2 * z  # tangential: the loss cannot see the scale
        g *= np.sqrt(heat)[:, None] / np.linalg.norm(g, axis=1, keepdims=True)
        z_new = (1 - eta * lam) * z - eta * g / r[:, None]
        norms[t] = np.linalg.norm(z_new, axis=1)
        last = (z, z_new)
        z = z_new
    return norms, last


def test_d_and_h_of_a_simulated_scale_invariant_sgd_are_the_true_ones():
    heat, eta, lam = np.array([0.5, 2.0, 8.0, 1.0]), 0.05, 0.02
    _, (z, z_after) = simulate_sgd(heat, eta, lam, steps=5)
    r2, d, h = step_terms(torch.from_numpy(z), torch.from_numpy(z_after - z), torch.from_numpy(z_after), eta, lam)
    # independent: the tangential part of the move by projection, and the first-order radial term
    disp = z_after - z
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    tangential = disp - (disp * u).sum(1, keepdims=True) * u
    np.testing.assert_allclose(h, (z * z).sum(1) * (tangential**2).sum(1) / eta**2, rtol=1e-6)
    np.testing.assert_allclose(h, heat, rtol=1e-6)  # the heat the simulation put in
    np.testing.assert_allclose(d, 0.0, atol=1e-6 * heat.max())  # no drift: the move is decay plus tangential
    np.testing.assert_allclose(r2, (z * z).sum(1), rtol=1e-12)


def test_the_simulated_norms_settle_at_the_predicted_equilibrium():
    heat, eta, lam = np.array([0.5, 2.0, 8.0]), 0.1, 0.05
    norms, _ = simulate_sgd(heat, eta, lam, steps=20 * int(1 / (eta * lam)))
    # exact fixed point of r'^2 = (1 - eta lam)^2 r^2 + eta^2 h / r^2, and the formula's first-order one
    exact = (eta**2 * heat / (1 - (1 - eta * lam) ** 2)) ** 0.25
    predicted = equilibrium_norm(np.zeros(3), heat, eta, lam)
    np.testing.assert_allclose(norms[-100:].mean(0), exact, rtol=1e-6)  # deterministic in r: no fluctuation
    np.testing.assert_allclose(predicted, (eta * heat / (2 * lam)) ** 0.25, rtol=1e-12)
    np.testing.assert_allclose(predicted, exact, rtol=eta * lam)  # first order in eta lambda


def test_the_corrected_root_equals_closed_forms_and_numpy_roots():
    eta, lam = 0.1, 0.05
    d = np.array([0.0, 0.3, -0.2, 1.0])
    c = np.array([2.0, 1.0, 5.0, 0.5])
    scale = np.ones(4)
    # k = 0: constant heat, section 4's closed form
    np.testing.assert_allclose(corrected_equilibrium(d, c, np.zeros(4), eta, lam, scale),
                               equilibrium_norm(d, c, eta, lam), rtol=1e-9)
    # k = 2: heat eta c, linear in s: s = (2 d + eta c) / (2 lambda)
    np.testing.assert_allclose(corrected_equilibrium(d, c, np.full(4, 2.0), eta, lam, scale) ** 2,
                               (2 * d + eta * c) / (2 * lam), rtol=1e-9)
    # k = 1: with u = r, -2 lambda u^3 + 2 d u + eta c = 0; the largest real positive root
    for di, ci in zip(d, c, strict=True):
        roots = np.roots([-2 * lam, 0.0, 2 * di, eta * ci])
        expected = max(r.real for r in roots if abs(r.imag) < 1e-9 and r.real > 0)
        got = corrected_equilibrium(di, ci, 1.0, eta, lam, np.array(1.0))
        assert float(got) == pytest.approx(expected, rel=1e-9)
    # d = 0: s* = (eta c / 2 lambda)^(2 / (4 - k)) for k < 4; for k = 4 and k > 4 no stable root
    for k in (0.5, 3.0, 3.9):
        expected = (eta * 2.0 / (2 * lam)) ** (1 / (4 - k))
        assert float(corrected_equilibrium(0.0, 2.0, k, eta, lam, np.array(1.0))) == pytest.approx(expected, rel=1e-9)
    assert np.isnan(corrected_equilibrium(0.0, 2.0, 4.0, eta, lam, np.array(1.0)))
    assert np.isnan(corrected_equilibrium(0.0, 2.0, 5.0, eta, lam, np.array(1.0)))


def test_the_corrected_forecast_with_k_zero_is_the_plain_one():
    rng = np.random.default_rng(1)
    r2, d, h = rng.uniform(1, 4, 10), rng.normal(0, 0.1, 10), rng.uniform(0.5, 2, 10)
    plain = integrate_balance(r2, d, h, 0.05, 0.01, 30)
    corrected = integrate_corrected(r2, d, h, np.zeros(10), 0.05, 0.01, 30)
    for a, b in zip(plain, corrected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # k = 2: heat c r^2; stepped by hand
    s = r2.copy()
    for _ in range(30):
        s = s + 2 * 0.05 * (d - 0.01 * s) + 0.05**2 * h * s / s
    np.testing.assert_allclose(integrate_corrected(r2, d, h, np.full(10, 2.0), 0.05, 0.01, 30)[1], np.sqrt(s),
                               rtol=1e-12)


def test_the_exponent_fit_equals_scipy_and_recovers_a_quarter_across_simulated_settings():
    x, y = [], []
    for eta in (0.05, 0.2):
        for lam in (0.01, 0.04):
            heat = np.array([0.5, 2.0])
            norms, _ = simulate_sgd(heat, eta, lam, steps=12 * int(1 / (eta * lam)), seed=int(eta * 100 + lam * 1000))
            x.extend(np.log(eta * heat / lam))
            y.extend(np.log(norms[-50:].mean(0)))
    fit = fit_exponent(np.array(x), np.array(y))
    ref = stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(x) - 2) * ref.stderr
    assert fit["slope"] == pytest.approx(ref.slope, abs=1e-6)
    assert fit["intercept"] == pytest.approx(ref.intercept, abs=1e-6)
    assert (fit["lo"], fit["hi"]) == pytest.approx((ref.slope - half, ref.slope + half), abs=1e-6)
    assert fit["slope"] == pytest.approx(0.25, abs=0.01)  # r^4 = eta h / (2 lambda) up to O(eta lambda)


def test_the_heat_power_fit_equals_numpy_polyfit_per_item():
    rng = np.random.default_rng(2)
    norms = rng.uniform(0.5, 3, (40, 5))
    k_true = np.array([0.0, 1.0, 2.0, 4.0, 5.5])
    heat = 0.7 * norms**k_true * np.exp(rng.normal(0, 0.1, norms.shape))
    heat[3, 2] = 0.0  # a step without heat has no log: left out of that item's fit
    k, log_c = fit_heat_power(norms, heat)
    for i in range(5):
        keep = heat[:, i] > 0
        slope, intercept = np.polyfit(np.log(norms[keep, i]), np.log(heat[keep, i]), 1)
        assert k[i] == pytest.approx(slope, abs=1e-6)
        assert log_c[i] == pytest.approx(intercept, abs=1e-6)
    np.testing.assert_allclose(k, k_true, atol=0.1)
    k_flat, _ = fit_heat_power(np.ones((10, 1)), np.ones((10, 1)))  # a norm that never varies has no slope
    assert np.isnan(k_flat[0])


def test_every_baseline_equals_an_independent_computation():
    # the norms of the simulated scale-invariant SGD, on their way to equilibrium: steps 11..20 predict 21..30
    eta, lam = 0.1, 0.2
    path, _ = simulate_sgd(np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0]), eta, lam, steps=30, seed=4)
    steps, norms, target = np.arange(11, 21), path[10:20], np.arange(21, 31)
    got = baseline_predictions(norms, steps, target, eta, lam)
    assert set(got) == set(BASELINES)
    np.testing.assert_allclose(got["persistence"], norms.mean(0), rtol=1e-12)
    np.testing.assert_allclose(got["last"], norms[-1], rtol=1e-12)
    np.testing.assert_allclose(got["decay"], norms[-1] * np.mean([(1 - eta * lam) ** (t - 20) for t in target]),
                               rtol=1e-12)
    trend = [np.mean(np.polyval(np.polyfit(steps, norms[:, i], 1), target)) for i in range(6)]
    np.testing.assert_allclose(got["trend"], trend, rtol=1e-9)
    falling = baseline_predictions(np.array([[3.0], [2.0], [1.0]]), np.arange(3), np.array([10]), eta, lam)
    assert falling["trend"][0] == pytest.approx(1e-9)  # clipped: a norm cannot fall below zero


def test_seed_summary_and_holds_follow_student_t():
    scores = [{"formula": {"r2": a, "r2_log": a, "spearman": a}, "persistence": {"r2": b, "r2_log": b, "spearman": b}}
              for a, b in ((0.9, 0.5), (0.8, 0.6), (0.95, 0.55))]
    summary = seed_summary(scores)
    diff = np.array([0.4, 0.2, 0.4])
    half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
    assert summary["difference"]["persistence"]["r2"] == pytest.approx([diff.mean(), diff.mean() - half,
                                                                        diff.mean() + half], abs=1e-9)
    assert summary["formula"]["spearman"][0] == pytest.approx(np.mean([0.9, 0.8, 0.95]))
    assert holds(summary, "r2", ("persistence",))
    scores[1]["persistence"]["r2"] = 1.5  # one seed where the baseline wins by far: the interval spans 0
    assert not holds(seed_summary(scores), "r2", ("persistence",))


def test_bootstrap_differences_equal_a_scipy_recomputation_on_the_same_resamples():
    rng = np.random.default_rng(5)
    observed = rng.uniform(1, 3, 30)
    preds = {"formula": observed + rng.normal(0, 0.1, 30), "last": observed + rng.normal(0, 0.5, 30)}
    got = bootstrap_differences(preds, observed, n_boot=200, seed=7)
    draws = np.random.default_rng(7)
    diffs = []
    for _ in range(200):
        idx = draws.integers(0, 30, 30)
        rho = [stats.spearmanr(preds[n][idx], observed[idx])[0] for n in ("formula", "last")]
        diffs.append(rho[0] - rho[1])
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    point = stats.spearmanr(preds["formula"], observed)[0] - stats.spearmanr(preds["last"], observed)[0]
    assert got["difference"]["last"]["spearman"] == pytest.approx([point, lo, hi], abs=1e-9)
    assert got["difference"]["last"]["spearman"][1] > 0  # the closer prediction wins beyond resampling noise


def test_the_trace_formula_scores_every_baseline_and_the_corrected_balance():
    items, steps, lr, wd = 12, 13, 0.1, 0.05
    trace = synthetic_trace(items, steps, lr)
    got, facts = formula_predictions(trace, wd)
    t = trace.filter(pl.col("step") > 0).sort("item_id", "step")
    norm_m = t["norm"].to_numpy().reshape(items, 12).T  # [step, item], steps 1..12; first half 1..6
    r2 = norm_m**2 - t["r2_change"].to_numpy().reshape(items, 12).T
    h = r2 * t["tangential"].to_numpy().reshape(items, 12).T ** 2 / lr**2
    d = np.sqrt(r2) * t["radial"].to_numpy().reshape(items, 12).T / lr + wd * r2
    np.testing.assert_allclose(got["last"], norm_m[5], rtol=1e-12)
    np.testing.assert_allclose(got["decay"], norm_m[5] * np.mean((1 - lr * wd) ** np.arange(1, 7)), rtol=1e-12)
    np.testing.assert_allclose(got["decay_final"], norm_m[5] * (1 - lr * wd) ** 6, rtol=1e-12)
    trend = [np.polyval(np.polyfit(np.arange(1, 7), norm_m[:6, i], 1), 9.5) for i in range(items)]
    np.testing.assert_allclose(got["trend"], np.maximum(trend, 1e-9), rtol=1e-9)
    k = np.array([np.polyfit(np.log(np.sqrt(r2[:6, i])), np.log(h[:6, i]), 1)[0] for i in range(items)])
    np.testing.assert_allclose(got["heat_power_k"], k, rtol=1e-6)
    log_c = np.array([np.polyfit(np.log(np.sqrt(r2[:6, i])), np.log(h[:6, i]), 1)[1] for i in range(items)])
    root = corrected_equilibrium(d[:6].mean(0), np.exp(log_c), k, lr, wd, r2[:6].mean(0))
    np.testing.assert_allclose(got["corrected"], root, rtol=1e-9)
    assert facts["fixed_point_share"] == pytest.approx(np.isfinite(root).mean())


def test_the_frozen_head_measures_exact_displacements_and_settles():
    from pipeline.theory.frozen_head import HeadRun, train_head

    rng = np.random.default_rng(0)
    base = rng.normal(size=(128, 16))
    defs, lems = base + 0.5 * rng.normal(size=base.shape), base + 0.5 * rng.normal(size=base.shape)
    measured = np.concatenate([defs[:6], lems[:6]])
    run = HeadRun(lr=0.5, weight_decay=0.05, dim=8, batch=16, relax=10, window=4, min_window=100)
    out = train_head(defs, lems, measured, run)
    # the accumulated per-step displacements (through the Gram matrix) land where the weights put the items
    np.testing.assert_allclose(out["norms"][-1], np.linalg.norm(measured @ out["weights"].T, axis=1), rtol=1e-9)
    assert out["norms"].shape == (run.window_steps, 12) and run.burn_in == 400
    # Δz is the JVP exactly: the balance's second-order term vanishes, what is left is the radial square
    assert abs(out["balance"]["second_order"]) < 1e-12 * abs(out["balance"]["tangential"])
    # the tangential heat of the first half, from r and the move, matches the tracker's mean h
    np.testing.assert_allclose(out["heat"].mean(0), out["first"].h, rtol=1e-9)
    # the whole weight matrix is scale invariant: its norm holds at the spherical-motion equilibrium
    assert out["second"].norm.mean() / out["first"].norm.mean() == pytest.approx(1.0, abs=0.1)


def test_the_module_recorder_sees_the_optimizer_step_without_its_decay():
    from pipeline.theory.rotational import module_equilibria, module_norm_recorder

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4, bias=False)
    unused = torch.nn.Parameter(torch.ones(3))  # no gradient: the optimizer skips it, so must the recorder
    model.register_parameter("unused", unused)
    eta, lam = 0.01, 0.5
    opt = torch.optim.AdamW(model.parameters(), lr=eta, weight_decay=lam)
    recorder = module_norm_recorder()
    w0 = model.weight.detach().clone().double()
    model(torch.randn(5, 6)).pow(2).sum().backward()
    recorder.on_pre_optimizer_step(None, SimpleNamespace(global_step=0), None, model=model)
    opt.step()
    recorder.on_optimizer_step(None, SimpleNamespace(global_step=0), None, model=model, optimizer=opt)
    frame = recorder.frame()
    assert frame["name"].to_list() == ["weight"]
    u = model.weight.detach().double() - (1 - eta * lam) * w0  # decoupled decay, then Adam's own step
    row = frame.row(0, named=True)
    assert row["u2"] == pytest.approx(float((u * u).sum()), rel=1e-6)
    assert row["wu"] == pytest.approx(float((w0 * u).sum()), rel=1e-6, abs=1e-12)
    assert row["u2"] == pytest.approx(eta**2 * 24, rel=1e-3)  # Adam's first step: |update| = eta per element
    # equilibria from a synthetic record: AdamW's law and SGD's, against numpy
    rows = pl.DataFrame({"step": np.arange(1, 7), "name": "w", "numel": 24, "lr": eta, "weight_decay": lam,
                         "w2": np.linspace(4, 5, 6), "u2": np.linspace(1e-4, 2e-4, 6), "wu": 0.0,
                         "w2_after": np.linspace(4.1, 5.1, 6)})
    denom = 2 * eta * lam - (eta * lam) ** 2
    adam = module_equilibria(rows, "adamw", (1, 3), (4, 6)).row(0, named=True)
    u2, w2 = rows["u2"].to_numpy(), rows["w2"].to_numpy()
    assert adam["predicted"] == pytest.approx(np.sqrt(u2[:3].mean() / denom), rel=1e-9)
    assert adam["kosson"] == pytest.approx(np.sqrt(eta * 24 / (2 * lam)), rel=1e-9)
    assert adam["observed"] == pytest.approx(np.sqrt(rows["w2_after"][3:].to_numpy()).mean(), rel=1e-9)
    sgd = module_equilibria(rows, "sgd", (1, 3), (4, 6)).row(0, named=True)
    assert sgd["predicted"] == pytest.approx((np.mean(w2[:3] * u2[:3]) / denom) ** 0.25, rel=1e-9)
    assert sgd["reached"] == (abs(sgd["observed"] / sgd["predicted"] - 1) <= 0.1)
