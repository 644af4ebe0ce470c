"""The batched logistic engine against scikit-learn's optimum, on nested, masked and repeated subsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from fmaudit.io import FmauditInputError
from fmaudit.probes import (
    ABSENT_CLASS_LOGIT_GAP,
    fit_logistic_batch,
    label_fraction_subsample,
)

TIGHT = dict(tol=1e-10, max_iter=100_000)


def mixture(n, dim, n_classes, separation=1.0, seed=0, offset=3.0):
    """Overlapping Gaussian classes with unequal feature scales and a non-zero mean."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((n_classes, dim)) * separation
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    scales = np.exp(0.5 * rng.standard_normal(dim))
    X = means[y] + rng.standard_normal((n, dim)) * scales * 1.5 + offset
    return X, y


def sklearn_proba(X, y, X_test, C, n_classes):
    """Converged scikit-learn probabilities on features standardised on X, as (N, n_classes)."""
    scaler = StandardScaler().fit(X)
    model = LogisticRegression(C=C, **TIGHT).fit(scaler.transform(X), y)
    out = np.zeros((X_test.shape[0], n_classes))
    out[:, model.classes_] = model.predict_proba(scaler.transform(X_test))
    return out


@pytest.mark.parametrize(
    "n, dim, n_classes, C",
    [
        (150, 10, 2, 1.0),  # binary
        (200, 12, 4, 1.0),  # multiclass
        (40, 80, 3, 1e-2),  # D > N, small C
        (40, 80, 3, 1e2),  # D > N, large C: nearly separable, slow to converge
        (30, 60, 2, 1e2),  # binary, D > N, large C
    ],
)
def test_engine_matches_sklearn(n, dim, n_classes, C):
    X, y = mixture(n + 100, dim, n_classes, seed=n + dim)
    X_train, y_train, X_test = X[:n], y[:n], X[n:]
    fit = fit_logistic_batch(X_train, y_train, [np.arange(n)], C, n_classes, **TIGHT)
    expected = sklearn_proba(X_train, y_train, X_test, C, n_classes)
    got = fit.predict_proba(X_test, 0)
    assert fit.converged_.all()
    assert np.abs(got - expected).max() < 1e-3
    np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))
    # The documented accuracy of tol=1e-8 holds too.
    loose = fit_logistic_batch(X_train, y_train, [np.arange(n)], C, n_classes, tol=1e-8, max_iter=100_000)
    assert np.abs(loose.predict_proba(X_test, 0) - expected).max() < 1e-3


def test_engine_batch_matches_separate_fits_with_nested_repeated_and_masked_subsets():
    X, y = mixture(400, 16, 3, seed=1)
    X_test = mixture(60, 16, 3, seed=2)[0]
    rng = np.random.default_rng(0)
    nested_small = label_fraction_subsample(y, 0.25, random_state=3)
    nested_large = label_fraction_subsample(y, 0.5, random_state=3)
    with_repeats = np.concatenate([nested_small, nested_small[:20]])
    mask = np.zeros(400, dtype=bool)
    mask[rng.choice(400, 150, replace=False)] = True
    subsets = [nested_small, nested_large, with_repeats, mask, np.arange(400)]
    Cs = np.array([0.5, 0.5, 2.0, 1.0, 0.1])
    fit = fit_logistic_batch(X, y, subsets, Cs, 3, **TIGHT)
    got = fit.predict_proba(X_test)
    assert got.shape == (5, 60, 3)
    for r, subset in enumerate(subsets):
        idx = np.flatnonzero(subset) if subset.dtype == bool else subset
        expected = sklearn_proba(X[idx], y[idx], X_test, Cs[r], 3)
        assert np.abs(got[r] - expected).max() < 1e-3, r
        np.testing.assert_allclose(fit.mean_[r], X[idx].mean(0))
        np.testing.assert_allclose(fit.scale_[r], X[idx].std(0))


def test_engine_accepts_a_boolean_mask_matrix_and_shares_identical_problems():
    X, y = mixture(120, 6, 3, seed=4)
    masks = np.zeros((3, 120), dtype=bool)
    masks[0, :80] = True
    masks[1, :80] = True
    masks[2, 40:] = True
    fit = fit_logistic_batch(X, y, masks, 1.0, 3, tol=1e-8)
    assert fit.problem_index_[0] == fit.problem_index_[1] != fit.problem_index_[2]
    np.testing.assert_array_equal(fit.W_[0], fit.W_[1])
    separate = fit_logistic_batch(X, y, [np.arange(80)], 1.0, 3, tol=1e-8)
    np.testing.assert_allclose(fit.predict_proba(X, 0), separate.predict_proba(X, 0), atol=1e-6)


def test_engine_keeps_k_columns_when_a_subset_misses_classes():
    X, y = mixture(300, 8, 4, seed=5)
    only_01 = np.flatnonzero(y < 2)  # binary subset of a 4-class problem
    no_3 = np.flatnonzero(y != 3)
    fit = fit_logistic_batch(X, y, [only_01, no_3], 1.0, 4, **TIGHT)
    logits = fit.decision_logits(X)
    proba = fit.predict_proba(X)
    assert logits.shape == (2, 300, 4) and np.isfinite(logits).all()
    assert (proba[0][:, 2:] == 0).all() and (proba[1][:, 3] == 0).all()
    np.testing.assert_allclose(logits[0][:, 2], logits[0][:, :2].min(1) - ABSENT_CLASS_LOGIT_GAP)
    np.testing.assert_array_equal(fit.present_, [[1, 1, 0, 0], [1, 1, 1, 0]])
    # The two-class subset follows sklearn's binary objective, the three-class one the multinomial one.
    assert np.abs(proba[0] - sklearn_proba(X[only_01], y[only_01], X, 1.0, 4)).max() < 1e-3
    assert np.abs(proba[1] - sklearn_proba(X[no_3], y[no_3], X, 1.0, 4)).max() < 1e-3


def test_engine_without_standardisation_matches_sklearn_on_raw_features():
    X, y = mixture(200, 10, 3, seed=6, offset=5.0)
    fit = fit_logistic_batch(X, y, [np.arange(200)], 0.3, 3, standardize=False, **TIGHT)
    model = LogisticRegression(C=0.3, **TIGHT).fit(X, y)
    assert np.abs(fit.predict_proba(X, 0) - model.predict_proba(X)).max() < 1e-3
    np.testing.assert_array_equal(fit.mean_, 0.0)
    np.testing.assert_array_equal(fit.scale_, 1.0)


def test_engine_unscaled_features_of_very_different_scales_and_warm_start(monkeypatch):
    X, y = mixture(150, 6, 3, seed=24)
    X = X * np.array([1e-3, 1.0, 50.0, 1.0, 1e2, 0.2]) + 40.0
    fit = fit_logistic_batch(X, y, [np.arange(150)], 2.0, 3, standardize=False, **TIGHT)
    model = LogisticRegression(C=2.0, **TIGHT).fit(X, y)
    assert np.abs(fit.predict_proba(X, 0) - model.predict_proba(X)).max() < 1e-3
    warm = fit_logistic_batch(
        X, y, [np.arange(150)], 2.0, 3, standardize=False, init=(fit.W_, fit.b_), tol=1e-8
    )
    assert warm.n_iter_[0] <= 3
    np.testing.assert_allclose(warm.predict_proba(X, 0), fit.predict_proba(X, 0), atol=1e-6)


def test_engine_torch_matmul_path_used_on_gpu_gives_the_same_fit(monkeypatch):
    import fmaudit.probes._logistic_loss as engine

    X, y = mixture(200, 10, 3, seed=25)
    subsets = [label_fraction_subsample(y, f, 1) for f in (0.2, 0.6)]
    numpy_path = fit_logistic_batch(X, y, subsets, 1.0, 3, tol=1e-8)
    monkeypatch.setattr(engine, "_matmul", lambda a, b: a @ b)
    torch_path = fit_logistic_batch(X, y, subsets, 1.0, 3, tol=1e-8)
    np.testing.assert_allclose(torch_path.predict_proba(X), numpy_path.predict_proba(X), atol=1e-6)


def test_engine_constant_feature_in_a_subset_gets_scale_one_like_standard_scaler():
    X, y = mixture(200, 5, 2, seed=7)
    X[:100, 2] = 0.25  # constant within the first half only
    fit = fit_logistic_batch(X, y, [np.arange(100), np.arange(200)], 1.0, 2, tol=1e-8)
    np.testing.assert_allclose(fit.scale_[0], StandardScaler().fit(X[:100]).scale_)
    assert fit.scale_[0, 2] == 1.0
    assert np.abs(fit.W_[0, 2]).max() < 1e-12  # a zero standardised column carries no weight
    expected = sklearn_proba(X[:100], y[:100], X, 1.0, 2)
    assert np.abs(fit.predict_proba(X, 0) - expected).max() < 1e-3


def test_engine_float32_agrees_with_float64_and_is_deterministic():
    X, y = mixture(300, 20, 3, seed=8)
    subsets = [label_fraction_subsample(y, f, 0) for f in (0.3, 1.0)]
    fit64 = fit_logistic_batch(X, y, subsets, 1.0, 3, tol=1e-8)
    fit32 = fit_logistic_batch(X.astype(np.float32), y, subsets, 1.0, 3, tol=1e-6, dtype=torch.float32)
    assert np.abs(fit64.predict_proba(X) - fit32.predict_proba(X)).max() < 1e-3
    again = fit_logistic_batch(X, y, subsets, 1.0, 3, tol=1e-8)
    np.testing.assert_array_equal(fit64.W_, again.W_)
    np.testing.assert_array_equal(fit64.n_iter_, again.n_iter_)


def test_engine_sklearn_default_tol_semantics_stop_at_similar_iterations():
    X, y = mixture(300, 20, 3, seed=9)
    fit = fit_logistic_batch(X, y, [np.arange(300)], 1.0, 3, tol=1e-4)
    model = LogisticRegression(C=1.0, tol=1e-4).fit(StandardScaler().fit_transform(X), y)
    assert fit.converged_.all()
    assert fit.n_iter_[0] <= 2 * model.n_iter_[0] + 5


def test_engine_warm_start_reaches_the_same_optimum():
    X, y = mixture(200, 10, 3, seed=10)
    cold = fit_logistic_batch(X, y, [np.arange(200)], 1.0, 3, **TIGHT)
    warm = fit_logistic_batch(X, y, [np.arange(200)], 1.0, 3, init=(cold.W_ * 0.5, cold.b_), **TIGHT)
    np.testing.assert_allclose(warm.predict_proba(X), cold.predict_proba(X), atol=1e-6)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda X, y, s: (np.where(np.arange(X.size).reshape(X.shape) == 7, np.nan, X), y, s), "NaN"),
        (lambda X, y, s: (X, y[:-1], s), "labels for"),
        (lambda X, y, s: (X, np.where(y == 0, 5, y), s), "out of range"),
        (lambda X, y, s: (X, y, [np.flatnonzero(y == 1)]), "only class 1"),
        (lambda X, y, s: (X, y, [np.array([], dtype=int)]), "empty subset"),
        (lambda X, y, s: (X, y, [np.array([0, 500])]), "out of range"),
        (lambda X, y, s: (X[:, :, None], y, s), "2-D"),
        (lambda X, y, s: (X, y.astype(float) + 0.5, s), "integer"),
    ],
)
def test_engine_rejects_bad_input(mutate, message):
    X, y = mixture(60, 4, 3, seed=11)
    X, y, subsets = mutate(X, y, [np.arange(60)])
    with pytest.raises(FmauditInputError, match=message):
        fit_logistic_batch(X, y, subsets, 1.0, 3)


def test_engine_rejects_bad_C_and_a_wrong_feature_count_at_predict_time():
    X, y = mixture(60, 4, 3, seed=12)
    with pytest.raises(FmauditInputError, match="positive"):
        fit_logistic_batch(X, y, [np.arange(60)], -1.0, 3)
    fit = fit_logistic_batch(X, y, [np.arange(60)], 1.0, 3)
    with pytest.raises(FmauditInputError, match="5 features"):
        fit.predict_proba(np.zeros((2, 5)))
