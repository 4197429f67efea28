"""Does the query norm add to top-1 cosine? Cross-validated logistic models of retrieval success.

For one retrieval set and outcome, :func:`out_of_fold_scores` fits, in each of ``FOLDS`` folds, an
L2-penalised logistic regression (C = 1, intercept unpenalised: the objective of
``sklearn.linear_model.LogisticRegression(C=1.0)``) on the other folds' queries, features standardised with
the training folds' mean and standard deviation, and scores the held-out fold. The pooled held-out scores'
AUROC is the cross-validated AUROC of that feature set. Folds are seeded and reproducible: query number
``pos`` (0-based, queries ordered by id) is in fold mix32(mix32(seed) xor pos) mod ``FOLDS``.

Fitting is Newton's method on the penalised log-likelihood to a step below 1e-12: the optimum is unique (the
objective is strictly convex), so any exact solver reaches the same coefficients.
"""

from __future__ import annotations

import numpy as np

from pipeline.analysis.bootstrap import mix32

FOLDS = 5
# fewer queries of either outcome than this: no cross-validated statistic (a fold would see none of them)
MIN_PER_OUTCOME = FOLDS


def fold_of(seed: int, n_units: int, folds: int = FOLDS) -> np.ndarray:
    """Each unit's fold (0 .. folds - 1) from its position."""
    key = mix32(np.array([seed % 2**32], dtype=np.uint32))[0]
    return (mix32(np.arange(n_units, dtype=np.uint32) ^ key) % np.uint32(folds)).astype(np.int64)


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float = 1.0, max_iter: int = 100) -> np.ndarray:
    """Coefficients (intercept first) minimising 0.5 * ||beta||^2 + c * sum(log-loss), intercept unpenalised.

    Args:
        x: (n, k) features (standardise them first: the penalty is on their scale).
        y: (n,) outcomes 0/1.
    """
    design = np.column_stack([np.ones(len(x)), x])
    penalty = np.eye(design.shape[1])
    penalty[0, 0] = 0.0
    beta = np.zeros(design.shape[1])
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-(design @ beta)))
        grad = c * design.T @ (p - y) + penalty @ beta
        hess = c * (design * (p * (1 - p))[:, None]).T @ design + penalty
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.max(np.abs(step)) < 1e-12:
            break
    return beta


def out_of_fold_scores(features: np.ndarray, y: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Held-out linear scores (log-odds) of each unit from the model fitted on the other folds."""
    out = np.empty(len(y))
    for f in np.unique(folds):
        train, test = folds != f, folds == f
        mean, sd = features[train].mean(axis=0), features[train].std(axis=0)
        sd[sd == 0] = 1.0
        beta = fit_logistic((features[train] - mean) / sd, y[train])
        out[test] = beta[0] + ((features[test] - mean) / sd) @ beta[1:]
    return out
