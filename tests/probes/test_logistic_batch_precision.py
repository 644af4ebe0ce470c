"""The engine's precision phases and threads: float32 products keep float64 answers; bad options are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from fmaudit.io import FmauditInputError
from fmaudit.probes import fit_logistic_batch


def mixture(n, dim, n_classes, seed):
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((n_classes, dim))
    y = rng.integers(0, n_classes, n)
    X = means[y] + rng.standard_normal((n, dim)) * np.exp(0.5 * rng.standard_normal(dim)) * 1.5 + 2.0
    return X.astype(np.float32), y


def nested_subsets(y, seeds=(0, 1)):
    out = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(y.size)
        out += [np.sort(order[: int(f * y.size)]) for f in (0.2, 0.5)]
    return out + [np.arange(y.size)]


def test_default_float32_products_reach_a_tight_tol_like_float64_and_sklearn():
    X, y = mixture(600, 24, 4, seed=3)
    subsets = nested_subsets(y)
    tight = dict(tol=1e-10, max_iter=100_000)
    mixed = fit_logistic_batch(X, y, subsets, 1.0, 4, **tight)  # float32 products, then float64 to certify
    exact = fit_logistic_batch(X, y, subsets, 1.0, 4, dtype=torch.float64, **tight)
    assert mixed.converged_.all() and exact.converged_.all()
    # both stop on scikit-learn's relative-decrease test (64 float64 epsilons) before tol 1e-10: ~1e-6 apart
    np.testing.assert_allclose(mixed.predict_proba(X), exact.predict_proba(X), atol=1e-5)
    idx = subsets[1]
    scaler = StandardScaler().fit(X[idx].astype(np.float64))
    model = LogisticRegression(C=1.0, **tight).fit(scaler.transform(X[idx].astype(np.float64)), y[idx])
    assert np.abs(mixed.predict_proba(X, 1) - model.predict_proba(scaler.transform(X.astype(np.float64)))).max() < 1e-5


def test_float32_only_stops_where_float32_stalls_and_says_so():
    X, y = mixture(600, 24, 4, seed=4)
    only32 = fit_logistic_batch(X, y, [np.arange(600)], 1.0, 4, dtype=torch.float32, tol=1e-13, max_iter=5_000)
    mixed = fit_logistic_batch(X, y, [np.arange(600)], 1.0, 4, tol=1e-13, max_iter=5_000)
    assert not only32.converged_[0]  # float32 products cannot certify 1e-13, and it is not claimed
    assert mixed.converged_[0]  # the default goes on in float64 from there and gets to 1e-13
    # where float32 stalled is near the optimum: probabilities within float32's reach of the float64 answer
    np.testing.assert_allclose(only32.predict_proba(X), mixed.predict_proba(X), atol=1e-3)


def test_threads_give_the_same_fit_and_runs_are_deterministic():
    X, y = mixture(500, 16, 3, seed=5)
    subsets = nested_subsets(y, seeds=(0, 1, 2))
    one = fit_logistic_batch(X, y, subsets, [0.5, 1.0, 0.5, 1.0, 0.5, 1.0, 2.0], 3, n_threads=1, tol=1e-8)
    two = fit_logistic_batch(X, y, subsets, [0.5, 1.0, 0.5, 1.0, 0.5, 1.0, 2.0], 3, n_threads=2, tol=1e-8)
    again = fit_logistic_batch(X, y, subsets, [0.5, 1.0, 0.5, 1.0, 0.5, 1.0, 2.0], 3, n_threads=2, tol=1e-8)
    assert one.converged_.all() and two.converged_.all()
    np.testing.assert_allclose(one.predict_proba(X), two.predict_proba(X), atol=1e-4)  # summation order differs
    np.testing.assert_array_equal(two.W_, again.W_)
    np.testing.assert_array_equal(two.n_iter_, again.n_iter_)


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(dtype=torch.float16), "dtype"), (dict(dtype="float32"), "dtype"), (dict(n_threads=0), "n_threads")],
)
def test_engine_rejects_bad_precision_and_thread_options(kwargs, message):
    X, y = mixture(60, 4, 3, seed=6)
    with pytest.raises(FmauditInputError, match=message):
        fit_logistic_batch(X, y, [np.arange(60)], 1.0, 3, **kwargs)
