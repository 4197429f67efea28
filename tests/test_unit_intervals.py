"""Query- and token-level bootstrap intervals, paired AUROC differences and the cross-validated "adds" statistic
against an independent computation: the same seeded Poisson resamples (tests.helpers.poisson_weights), rows
repeated with numpy, sklearn's AUROC and LogisticRegression, numpy's quantiles; to 1e-9."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from pipeline.analysis.analyses import run_analysis
from pipeline.analysis.unit_bootstrap import bootstrap_p, partial_rank_correlation
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import _mix32, poisson_weights, store_synthetic, word_probe_set
from tests.test_retrieval import _reference, retrieval_store  # noqa: F401  (the fixture)

SEED, B = 20240607, 60
SIGNALS = {"query_norm": "norm", "top1_cosine": "top1", "top1_margin": "margin", "query_n_tokens": "n_tokens"}


def _interval(values):
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return (*np.quantile(values, [0.025, 0.975]), len(values))


def _auroc(y, score):
    return roc_auc_score(y, score) if 0 < y.mean() < 1 else np.nan


def _selective(s1, score, ids, tenths):
    order = np.lexsort((ids, -score))
    kept = -(-tenths * len(order) // 10)
    return s1[order][:kept].mean()


def _folds(n):
    key = _mix32(np.array([SEED], dtype=np.uint64))[0]
    return (_mix32(np.arange(n, dtype=np.uint64) ^ key) % 5).astype(int)


def _oof(features, y, folds):
    out = np.empty(len(y))
    for f in range(5):
        train, test = folds != f, folds == f
        mean, sd = features[train].mean(axis=0), features[train].std(axis=0)
        fit = LogisticRegression(C=1.0, tol=1e-12, max_iter=10_000).fit((features[train] - mean) / sd, y[train])
        out[test] = fit.decision_function((features[test] - mean) / sd)
    return out


def test_retrieval_intervals_signal_differences_and_cv_gain_match_sklearn(retrieval_store):  # noqa: F811
    store, vectors, relations, n_tokens = retrieval_store
    ref = _reference(vectors, relations, n_tokens)[0.0].sort("query")
    con = open_catalog(store)
    calib = run_analysis(con, "retrieval_calibration", "m", "r1", "run-1", resamples=B)
    signals = run_analysis(con, "retrieval_signals", "m", "r1", "run-1", resamples=B)
    got = {(r["analysis"], r["property"], r["statistic"]): r
           for r in pl.concat([calib, signals]).iter_rows(named=True)}
    n = ref.height
    w = poisson_weights(SEED, B, n)  # queries by id: q000, q001, ... is the reference's order
    ids = ref["query"].to_numpy()
    cols = {c: ref[c].to_numpy().astype(np.float64) for c in ("s1", "s10", *SIGNALS.values())}
    folds = _folds(n)
    checked = 0
    for target, ycol in (("success_at_1", "s1"), ("success_at_10", "s10")):
        y = cols[ycol]
        if y.min() == y.max():
            continue
        oof = {"cv_auroc_top1_cosine": _oof(cols["top1"][:, None], y, folds),
               "cv_auroc_top1_cosine_and_query_norm": _oof(np.column_stack([cols["top1"], cols["norm"]]), y, folds)}
        reps: dict[str, list[float]] = {}
        for b in range(B):
            yb = np.repeat(y, w[b])
            auc = {s: _auroc(yb, np.repeat(cols[c], w[b])) for s, c in SIGNALS.items()}
            for s in SIGNALS:
                reps.setdefault(f"auroc_{s}", []).append(auc[s])
            for other in ("top1_cosine", "top1_margin"):
                reps.setdefault(f"auroc_query_norm_minus_{other}", []).append(auc["query_norm"] - auc[other])
            cv = {k: _auroc(yb, np.repeat(v, w[b])) for k, v in oof.items()}
            for k, v in cv.items():
                reps.setdefault(k, []).append(v)
            reps.setdefault("cv_auroc_gain_query_norm", []).append(
                cv["cv_auroc_top1_cosine_and_query_norm"] - cv["cv_auroc_top1_cosine"])
        for statistic, values in reps.items():
            analysis = "retrieval_calibration" if statistic in {f"auroc_{s}" for s in SIGNALS} else \
                "retrieval_signals"
            row = got[(analysis, target, statistic)]
            low, high, kept = _interval(values)
            assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high), abs=1e-9), (target, statistic)
            assert row["n_resamples"] == kept and row["ci_method"] == "poisson bootstrap"
            checked += 1
        # point values: the paired differences and the cross-validated AUROCs on the full sample
        full = {s: roc_auc_score(y, cols[c]) for s, c in SIGNALS.items()}
        assert got[("retrieval_signals", target, "auroc_query_norm_minus_top1_cosine")]["value"] == pytest.approx(
            full["query_norm"] - full["top1_cosine"], abs=1e-9)
        cv_full = {k: roc_auc_score(y, v) for k, v in oof.items()}
        assert got[("retrieval_signals", target, "cv_auroc_gain_query_norm")]["value"] == pytest.approx(
            cv_full["cv_auroc_top1_cosine_and_query_norm"] - cv_full["cv_auroc_top1_cosine"], abs=1e-9)
        assert got[("retrieval_signals", target, "cv_auroc_top1_cosine")]["n"] == n
    assert checked >= 11
    # selective accuracy: every coverage point and the mean, on the repeated rows ordered by signal then id
    for signal, col in (("query_norm", "norm"), ("top1_cosine", "top1")):
        curves = np.array([[_selective(np.repeat(cols["s1"], w[b]), np.repeat(cols[col], w[b]),
                                       np.repeat(ids, w[b]), t) for t in range(1, 11)] for b in range(B)])
        prop = f"selective_accuracy_{signal}"
        for j in range(10):
            row = got[("retrieval_calibration", prop, f"coverage_{(j + 1) / 10:.1f}")]
            assert (row["ci_low"], row["ci_high"]) == pytest.approx(_interval(curves[:, j])[:2], abs=1e-9)
        row = got[("retrieval_calibration", prop, "mean_selective_accuracy")]
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(_interval(curves.mean(axis=1))[:2], abs=1e-9)
    # the means keep their normal-approximation interval and say so
    mean_row = got[("retrieval_calibration", "retrieval", "mean_success_at_1")]
    assert mean_row["ci_method"] == "normal approximation" and mean_row["n_resamples"] is None
    assert calib["ci_low"].is_not_null().all() and signals["ci_low"].is_not_null().all()


def test_a_resample_with_one_outcome_only_is_dropped_and_counted():
    """An AUROC undefined in a replicate (every resampled query succeeded) is left out of the interval, and
    n_resamples says how many replicates defined it."""
    from pipeline.analysis.unit_bootstrap import AurocOrder, interval

    y = np.array([1, 1, 1, 1, 1, 1, 0], dtype=np.float64)
    score = np.arange(7, dtype=np.float64)
    w = poisson_weights(SEED, 200, 7).astype(np.float64)
    reps = AurocOrder(score).auroc(y, w)
    defined = (w[:, :6].sum(axis=1) > 0) & (w[:, 6] > 0)
    assert (~defined).any() and np.isnan(reps[~defined]).all()
    expected = [roc_auc_score(np.repeat(y, w[b].astype(int)), np.repeat(score, w[b].astype(int)))
                for b in np.flatnonzero(defined)]
    np.testing.assert_allclose(reps[defined], expected, rtol=0, atol=1e-12)
    assert interval(reps)[2] == defined.sum()


def test_token_norm_intervals_match_a_numpy_bootstrap(tmp_path):
    rng = np.random.default_rng(4)
    words = [f"word{i}" for i in range(150)]
    zipf = np.round(rng.uniform(1, 7, len(words)), 1)  # ties in zipf
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("words", len(words), {"zipf": zipf})
    ps.items = ps.items.with_columns(pl.Series("text", words))
    store_synthetic(store, "m", "r1", ps, np.ones(len(words)))
    token_norms = 2 - 0.1 * zipf + rng.normal(0, 0.1, 150)
    store.write_table(f"{store.token_norms_dir('m', 'r1')}/part-0.parquet", pl.DataFrame(
        {"model": "m", "release": "r1", "token_id": np.arange(150), "token": words, "norm": token_norms}).to_arrow())
    res = run_analysis(open_catalog(store), "token_norm_vs_frequency", "m", "r1", "run-1", resamples=B)
    got = {r["statistic"]: r for r in res.iter_rows(named=True)}
    w = poisson_weights(SEED, B, 150)
    rho = [stats.spearmanr(np.repeat(token_norms, w[b]), np.repeat(zipf, w[b])).statistic for b in range(B)]
    r = [stats.pearsonr(np.log(np.repeat(token_norms, w[b])), np.repeat(zipf, w[b])).statistic for b in range(B)]
    for statistic, values in (("spearman", rho), ("pearson_log_norm", r)):
        low, high, kept = _interval(values)
        assert (got[statistic]["ci_low"], got[statistic]["ci_high"]) == pytest.approx((low, high), abs=1e-9)
        assert got[statistic]["n_resamples"] == kept and got[statistic]["ci_method"] == "poisson bootstrap"


def test_partial_rank_correlation_with_two_controls_matches_rank_residuals():
    """Spearman of x and y given two controls = Pearson r of the rank residuals after regressing on both
    controls' ranks (scipy ranks, numpy least squares), replicate by replicate."""
    rng = np.random.default_rng(9)
    n = 90
    z1, z2 = rng.normal(size=n), np.round(rng.normal(size=n), 1)
    x = z1 + 0.5 * z2 + rng.normal(size=n)
    y = 0.3 * x + z1 + rng.normal(size=n)
    w = poisson_weights(SEED, 25, n)
    got = partial_rank_correlation([x, y, z1, z2], w.astype(np.float64))
    for b in range(25):
        cols = [stats.rankdata(np.repeat(v, w[b])) for v in (x, y, z1, z2)]
        design = np.column_stack([np.ones_like(cols[0]), cols[2], cols[3]])
        ex = cols[0] - design @ np.linalg.lstsq(design, cols[0], rcond=None)[0]
        ey = cols[1] - design @ np.linalg.lstsq(design, cols[1], rcond=None)[0]
        assert got[b] == pytest.approx(stats.pearsonr(ex, ey).statistic, abs=1e-9)


def test_bootstrap_p_is_twice_the_smaller_tail():
    reps = np.array([-0.1, 0.2, 0.3, 0.4, np.nan, 0.5])
    assert bootstrap_p(reps, 0.0) == pytest.approx(2 * 1 / 5)
    assert bootstrap_p(reps, 1.0) == pytest.approx(0.0)
    assert bootstrap_p(np.array([0.1, 0.2]), 0.15) == pytest.approx(1.0)
