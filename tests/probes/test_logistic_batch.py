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


def scaled_gradient_max_abs(X, y, W, b, C, n_classes):
    """max |gradient| of mean CE + ||W||^2 / (2 C n) at (W, b) on the rows X (scikit-learn's lbfgs stopping
    measure for a multinomial problem with every class present), in float64."""
    Z = X @ W + b
    P = np.exp(Z - Z.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    G = (P - np.eye(n_classes)[y]) / X.shape[0]
    return max(np.abs(X.T @ G + W / (C * X.shape[0])).max(), np.abs(G.sum(0)).max())


@pytest.mark.parametrize("layout", ["shared", "grouped"])
def test_engine_unscaled_features_of_very_different_scales_and_warm_start(layout):
    X, y = mixture(150, 6, 3, seed=24)
    X = X * np.array([1e-3, 1.0, 50.0, 1.0, 1e2, 0.2]) + 40.0
    fit = fit_logistic_batch(X, y, [np.arange(150)], 2.0, 3, standardize=False, layout=layout, **TIGHT)
    model = LogisticRegression(C=2.0, **TIGHT).fit(X, y)
    assert np.abs(fit.predict_proba(X, 0) - model.predict_proba(X)).max() < 1e-3
    # A warm start at a point meeting tol (by a factor 10, in float64) stops at once and returns it unchanged,
    # on any CPU: it is checked in float64, not with float32 products whose rounding exceeds that gradient.
    at_start = scaled_gradient_max_abs(X, y, fit.W_[0], fit.b_[0], 2.0, 3)
    warm = fit_logistic_batch(X, y, [np.arange(150)], 2.0, 3, standardize=False, init=(fit.W_, fit.b_),
                              tol=10 * at_start, layout=layout)
    assert warm.converged_[0]
    np.testing.assert_allclose(warm.W_, fit.W_, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(warm.b_, fit.b_, rtol=1e-12, atol=1e-15)
    # With a tol below that gradient it may go on, in float64, towards the optimum, not wander off it: the
    # probabilities stay within the cold fit's own distance from the optimum (~1e-5 on the CPUs checked).
    warm = fit_logistic_batch(X, y, [np.arange(150)], 2.0, 3, standardize=False, init=(fit.W_, fit.b_), tol=1e-8,
                              layout=layout)
    assert warm.converged_[0]
    np.testing.assert_allclose(warm.predict_proba(X, 0), fit.predict_proba(X, 0), atol=1e-4)
    assert np.abs(warm.predict_proba(X, 0) - model.predict_proba(X)).max() < 1e-3


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


@pytest.mark.parametrize("layout", ["shared", "grouped"])
def test_engine_sklearn_default_tol_semantics(layout):
    # tol means scikit-learn's lbfgs stop: at the returned point the max-abs gradient of the scaled objective
    # (on the standardised rows) is at most tol, up to the rounding of the float32 row store the float64
    # confirmation reads (~1e-8 here; 1e-6 allowed)
    X, y = mixture(300, 20, 3, seed=9)
    Xs = StandardScaler().fit_transform(X)
    fit = fit_logistic_batch(X, y, [np.arange(300)], 1.0, 3, tol=1e-4, layout=layout)
    assert fit.converged_.all()
    assert scaled_gradient_max_abs(Xs, y, fit.W_[0], fit.b_[0], 1.0, 3) <= 1e-4 + 1e-6
    # and it is about as far from the optimum as scikit-learn at the same tol
    optimum = sklearn_proba(X, y, X, 1.0, 3)
    model = LogisticRegression(C=1.0, tol=1e-4).fit(Xs, y)
    engine_error = np.abs(fit.predict_proba(X, 0) - optimum).max()
    assert engine_error <= max(3 * np.abs(model.predict_proba(Xs) - optimum).max(), 1e-3)


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


def test_shared_and_grouped_layouts_fit_the_same_problems_to_the_same_optimum():
    # nested, repeated and masked subsets, a C grid per subset, a binary subset, a subset missing a class, a
    # feature constant within one subset, and subsets with fewer rows than features (the row-space form)
    X, y = mixture(220, 30, 4, seed=31)
    X[:60, 5] = 1.5
    rng = np.random.default_rng(1)
    small = rng.choice(220, 20, replace=False)  # 20 rows < 30 features
    subsets = [np.arange(60), np.arange(150), np.r_[np.arange(40), np.arange(10)], small, small,
               np.flatnonzero(y < 2), np.flatnonzero(y != 3)]
    Cs = [0.1, 1.0, 0.5, 0.01, 10.0, 1.0, 0.3]
    shared = fit_logistic_batch(X, y, subsets, Cs, 4, layout="shared", **TIGHT)
    grouped = fit_logistic_batch(X, y, subsets, Cs, 4, layout="grouped", **TIGHT)
    assert shared.converged_.all() and grouped.converged_.all()
    # both stop on scikit-learn's relative-decrease test (64 float64 epsilons) before tol 1e-10: ~1e-6 apart
    np.testing.assert_allclose(grouped.predict_proba(X), shared.predict_proba(X), atol=1e-5)
    np.testing.assert_allclose(grouped.mean_, shared.mean_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grouped.scale_, shared.scale_, rtol=1e-9)
    np.testing.assert_array_equal(grouped.present_, shared.present_)
    assert grouped.W_[0, 5].max() == 0.0 and grouped.W_[0, 5].min() == 0.0  # constant within subset 0
    for layout in ("shared", "grouped"):
        raw = fit_logistic_batch(X, y, subsets, Cs, 4, standardize=False, layout=layout, **TIGHT)
        for r in (1, 3):
            idx = subsets[r]
            model = LogisticRegression(C=Cs[r], **TIGHT).fit(X[idx], y[idx])
            assert np.abs(raw.predict_proba(X, r)[:, model.classes_] - model.predict_proba(X)).max() < 1e-3


def test_row_space_form_is_used_where_rows_are_fewer_than_features_and_keeps_sklearn_semantics():
    from fmaudit.probes._row_store import build_groups

    X, y = mixture(300, 120, 3, seed=32)
    subsets = [np.arange(40), np.arange(40), np.arange(40, 90)]
    Cs = [0.05, 1.0, 1.0]
    groups, _, _ = build_groups(X, y, subsets, 3, True, torch.float32, torch.device("cpu"))
    assert [g.row_space for g in groups] == [True, True]
    fit = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=["row_space"], tol=1e-6)
    for r, idx in enumerate(subsets):
        expected = sklearn_proba(X[idx], y[idx], X, Cs[r], 3)
        assert np.abs(fit.predict_proba(X, r) - expected).max() < 1e-3
        # the stopping measure is scikit-learn's: the gradient in W's (standardised) coordinates meets tol
        Xs = (X[idx] - fit.mean_[r]) / fit.scale_[r]
        assert scaled_gradient_max_abs(Xs, y[idx], fit.W_[r], fit.b_[r], Cs[r], 3) <= 1e-6 + 1e-8
    # a warm start is carried into the rows' span and reaches the same optimum
    cold = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=["row_space"], **TIGHT)
    warm = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=["row_space"],
                              init=(cold.W_ * 0.5, cold.b_), **TIGHT)
    np.testing.assert_allclose(warm.predict_proba(X), cold.predict_proba(X), atol=1e-6)


def correlated(n, dim, n_classes, seed=0, rank=6):
    """Classes in a few latent directions seen through strongly correlated features (ill-conditioned)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    latent = rng.standard_normal((n_classes, rank))[y] + 0.7 * rng.standard_normal((n, rank))
    mix = rng.standard_normal((rank, dim))
    X = latent @ mix + 0.05 * rng.standard_normal((n, dim)) + 2.0
    return X, y


@pytest.mark.parametrize("n, dim", [(300, 40), (40, 90)])
def test_whitened_form_reaches_the_dense_forms_optimum_and_sklearns(n, dim):
    from fmaudit.probes._row_store import build_groups

    X, y = correlated(n + 100, dim, 3, seed=n)
    X[:, 7] = 1.5  # constant: its weight stays exactly 0
    subsets = [np.arange(n), np.arange(n), np.arange(20, n)]
    Cs = [0.01, 1.0, 1.0]
    groups, _, _ = build_groups(X, y, subsets, 3, True, torch.float32, torch.device("cpu"), choose_form=True,
                                forms=("whitened",))
    assert [g.form for g in groups] == ["whitened", "whitened"]
    # the rank of the rows' span: one direction fewer than the rows where n < D (their centring)
    assert groups[0].width == (min(n - 1, dim - 1))
    whitened = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=["whitened"], **TIGHT)
    dense = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=["dense"], **TIGHT)
    assert whitened.converged_.all() and dense.converged_.all()
    # both stop at tol 1e-10 or on scikit-learn's relative-decrease test: the same optimum to ~1e-6
    np.testing.assert_allclose(whitened.predict_proba(X), dense.predict_proba(X), atol=1e-5)
    assert np.all(whitened.W_[:, 7] == 0.0)
    for r, idx in enumerate(subsets):
        assert np.abs(whitened.predict_proba(X, r) - sklearn_proba(X[idx], y[idx], X, Cs[r], 3)).max() < 1e-3
    # its stopping measure is scikit-learn's: the gradient in W's (standardised) coordinates meets tol
    fit = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=["whitened"], tol=1e-6)
    for r, idx in enumerate(subsets):
        Xs = (X[idx] - fit.mean_[r]) / fit.scale_[r]
        assert scaled_gradient_max_abs(Xs, y[idx], fit.W_[r], fit.b_[r], Cs[r], 3) <= 1e-6 * (1 + 1e-6)
    # a warm start is carried into the whitened coordinates and comes back to the same optimum
    warm = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=["whitened"],
                              init=(dense.W_ * 0.5, dense.b_), **TIGHT)
    np.testing.assert_allclose(warm.predict_proba(X), dense.predict_proba(X), atol=1e-5)


def test_whitened_form_needs_fewer_iterations_on_correlated_features():
    X, y = correlated(900, 60, 4, seed=3)
    subsets = [np.arange(0, 600), np.arange(300, 900)]
    Cs = [1.0, 10.0]
    kw = dict(layout="grouped", tol=1e-7, max_iter=20_000)
    whitened = fit_logistic_batch(X, y, subsets, Cs, 4, forms=["whitened"], **kw)
    dense = fit_logistic_batch(X, y, subsets, Cs, 4, forms=["dense"], **kw)
    assert whitened.converged_.all() and dense.converged_.all()
    # a preconditioner, not a different problem: the same probabilities at this tol's accuracy ...
    assert np.abs(whitened.predict_proba(X) - dense.predict_proba(X)).max() < 1e-3
    # ... in clearly fewer iterations (measured here 166 against 328; asserted with a wide margin)
    assert whitened.n_iter_.sum() < 0.8 * dense.n_iter_.sum()


@pytest.mark.parametrize("n, dim, classes", [(764, 384, 9), (2000, 384, 9), (764, 1536, 9), (2000, 1536, 9),
                                             (2000, 3072, 9)])
def test_cost_model_picks_the_whitened_form_for_cell_units(n, dim, classes):
    """The shapes of CellPath IS and LOOO units (a subset's 4 C values, 9 fine classes) at the preset's
    widths: whitened was the faster form on every one (benchmarks/bench_cell_shard.py's engine calls forced
    to one form; at 2,000 x 1,536 dense took 2.2x as long), so the model must not choose dense there."""
    from fmaudit.probes._row_store import group_form

    assert group_form(n, dim, 4, classes, standardize=True) == "whitened"
    # raw features are solved dense (no per-subset standardisation to whiten)
    assert group_form(n, dim, 4, classes, standardize=False) == "dense"


def test_whitened_forms_are_reused_inside_reuse_whitened_only():
    from fmaudit.probes import _row_store
    from fmaudit.probes._row_store import reuse_whitened

    X, y = correlated(400, 30, 3, seed=5)
    coarse = (y > 0).astype(np.int64)
    subsets = [np.arange(300), np.arange(100, 400)]
    kw = dict(layout="grouped", forms=["whitened"], tol=1e-8)
    fresh = fit_logistic_batch(X, coarse, subsets, [0.1, 1.0], 2, **kw)
    assert not _row_store._whiten_cache  # outside the context nothing is kept
    with reuse_whitened():
        fit_logistic_batch(X, y, subsets, [0.1, 1.0], 3, **kw)
        assert len(_row_store._whiten_cache) == 2  # one per distinct subset
        again = fit_logistic_batch(X, coarse, subsets, [0.1, 1.0], 2, **kw)
        assert len(_row_store._whiten_cache) == 2  # the same rows: reused, nothing new made
    assert not _row_store._whiten_cache
    np.testing.assert_allclose(again.predict_proba(X), fresh.predict_proba(X), atol=1e-12)


def test_forms_are_checked():
    X, y = mixture(60, 5, 2)
    with pytest.raises(FmauditInputError, match="forms"):
        fit_logistic_batch(X, y, [np.arange(60)], 1.0, 2, forms=["diagonal"])


def _objective_alone(group, stretch, W, b, l2, present):
    """Loss and gradient of one problem on its group's rows, written out directly (float64)."""
    X = group.features_in(torch.float64)
    a = torch.ones(X.shape[1], dtype=torch.float64) if stretch is None else stretch
    logits = X @ (a[:, None] * W) + b
    logits = logits.masked_fill(~present, float("-inf"))
    lse = torch.logsumexp(logits, dim=1)
    w = group.weight
    loss = (w * (lse - logits[torch.arange(X.shape[0]), group.y])).sum() + 0.5 * l2 * ((a[:, None] * W) ** 2).sum()
    resid = torch.softmax(logits, dim=1)
    resid[torch.arange(X.shape[0]), group.y] -= 1.0
    resid *= w[:, None]
    grad_W = a[:, None] * (X.T @ resid) + l2 * a[:, None] ** 2 * W
    if group.row_space:  # kept orthogonal to the direction the original problem lacks
        q = group.constant_direction
        grad_W -= q[:, None] * (q @ grad_W)[None, :]
    return loss, grad_W, resid.sum(dim=0)


@pytest.mark.parametrize("form, n_threads", [("dense", 1), ("whitened", 1), ("row_space", 1), ("dense", 2)])
def test_grouped_objective_evaluates_groups_together_as_each_problem_alone(form, n_threads):
    # groups of very different sizes (evaluated in separate padded plans), a class missing from one subset,
    # and problems asked for in any subset and order (padding slots, ranks within a group)
    from fmaudit.probes._logistic_loss import GroupedObjective
    from fmaudit.probes._row_store import build_groups

    X, y = mixture(600, 60 if form == "row_space" else 9, 3, seed=11)
    rng = np.random.default_rng(5)
    no_class_2 = np.flatnonzero(y != 2)
    bases = [rng.choice(600, 30), rng.choice(600, 33), rng.choice(no_class_2, 40, replace=False),
             rng.choice(600, 55 if form == "row_space" else 500)]
    index_sets = [base for base in bases for _ in range(3)]
    l2 = torch.tensor([1.0 / (C * idx.size) for idx in bases for C in (0.01, 1.0, 100.0)], dtype=torch.float64)
    present = torch.tensor(np.array([np.isin(np.arange(3), y[idx]) for idx in index_sets]))
    groups, _, _ = build_groups(X, y, index_sets, 3, True, torch.float64, torch.device("cpu"), choose_form=True,
                                forms=[form])
    assert {g.form for g in groups} == {form}
    width = max(g.width for g in groups)
    objective = GroupedObjective(groups, present, l2, width, 3, n_threads)
    try:
        theta = torch.zeros((len(index_sets), width + 1, 3), dtype=torch.float64)
        for g in groups:
            theta[g.problems, : g.width] = torch.as_tensor(rng.normal(size=(len(g.problems), g.width, 3)) * 0.3)
            theta[g.problems, width] = torch.as_tensor(rng.normal(size=(len(g.problems), 3)))
        theta.masked_fill_(~present[:, None, :], 0.0)
        for ids in (np.arange(len(index_sets)), np.array([11, 0, 7, 5, 2]), np.array([9])):
            values, grads = objective(theta[ids].reshape(ids.size, -1).clone(), ids, torch.float64)
            grads = grads.view(ids.size, width + 1, 3)
            for i, u in enumerate(ids):
                group = groups[objective.group_of[u]]
                p = group.width
                stretch = objective.stretch[u, :p] if objective.stretch is not None else None
                loss, grad_W, grad_b = _objective_alone(group, stretch, theta[u, :p], theta[u, width], l2[u],
                                                        present[u])
                assert abs(float(values[i]) - float(loss)) <= 1e-12 * max(1.0, abs(float(loss)))
                present_u = present[u]
                np.testing.assert_allclose(grads[i, :p][:, present_u], grad_W[:, present_u], atol=1e-12)
                np.testing.assert_allclose(grads[i, width][present_u], grad_b[present_u], atol=1e-12)
                assert not bool(grads[i, p:width].any())  # padding coordinates stay exactly 0
            # float32 products: the same up to float32 rounding
            values32, _ = objective(theta[ids].reshape(ids.size, -1).clone(), ids, torch.float32)
            np.testing.assert_allclose(values32.numpy(), values.numpy(), rtol=1e-5)
    finally:
        objective.close()


def patch_rows(n_cells=420, n_patches=90, dim=24, n_classes=3, seed=41):
    """Cells that share their patch's features (a Mean or CLS readout): each patch's row repeated, with its
    cells' own labels (most patches hold cells of two or three classes)."""
    rng = np.random.default_rng(seed)
    patch_means = rng.standard_normal((n_patches, dim)) * np.exp(0.5 * rng.standard_normal(dim)) + 2.0
    patch = rng.integers(0, n_patches, n_cells)
    signal = (patch_means[:, 0] > 2.0).astype(int) + (patch_means[:, 1] > 2.5)
    y = (signal[patch] + (rng.uniform(size=n_cells) < 0.35) * rng.integers(1, n_classes, n_cells)) % n_classes
    return patch_means[patch], y


def test_build_groups_merges_rows_of_identical_features_with_their_class_weights():
    from fmaudit.probes._row_store import build_groups

    X, y = patch_rows()
    subset = np.r_[np.arange(300), np.arange(20)]  # 20 rows twice
    groups, _, _ = build_groups(X, y, [subset], 3, True, torch.float32, torch.device("cpu"))
    (group,) = groups
    distinct = np.unique(X[subset], axis=0).shape[0]
    assert group.y.shape[0] == group.features.shape[0] == distinct < np.unique(subset).size
    assert group.targets is not None and group.targets.shape == (distinct, 3)
    # each merged row's weight is its copies' (repeats counted), split by their labels
    np.testing.assert_allclose(group.targets.sum(1).numpy(), group.weight.numpy(), rtol=1e-12)
    assert abs(float(group.weight.sum()) - 1.0) < 1e-12
    expected = np.zeros(3)
    np.add.at(expected, y[subset], 1.0 / subset.size)
    np.testing.assert_allclose(group.targets.sum(0).numpy(), expected, rtol=1e-12)
    # copies that share one label are merged without class weights; distinct rows are left as they are
    same = np.flatnonzero(y == 0)[:40]
    (one_label,), _, _ = build_groups(X, y, [same], 3, True, torch.float32, torch.device("cpu"))
    assert one_label.targets is None and one_label.y.shape[0] == np.unique(X[same], axis=0).shape[0]
    (unmerged,), _, _ = build_groups(X + np.arange(X.shape[0])[:, None] * 1e-3, y, [subset], 3, True,
                                     torch.float32, torch.device("cpu"))
    assert unmerged.targets is None and unmerged.y.shape[0] == np.unique(subset).size


@pytest.mark.parametrize("form", ["dense", "whitened", "row_space"])
def test_merged_identical_rows_reach_the_optimum_of_their_copies(form, monkeypatch):
    from fmaudit.probes import _row_store

    X, y = patch_rows()
    # a C grid on two subsets, one with repeats; the row-space form needs fewer distinct rows than features
    subsets = [np.arange(300)] * 2 + [np.r_[np.arange(100, 420), np.arange(100, 130)]] * 2
    if form == "row_space":
        X, y = patch_rows(n_cells=120, n_patches=20, dim=40)
        subsets = [np.arange(100)] * 2 + [np.arange(20, 120)] * 2
    Cs = [0.05, 2.0, 0.05, 2.0]
    merged = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=[form], **TIGHT)
    monkeypatch.setattr(_row_store, "merge_identical_rows",
                        lambda rows, counts, labels, n_classes, Xr: (rows, counts, labels, None, Xr))
    copies = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=[form], **TIGHT)
    assert merged.converged_.all() and copies.converged_.all()
    # the same problem: both stop at tol 1e-10 or on scikit-learn's relative-decrease test, ~1e-6 apart
    np.testing.assert_allclose(merged.predict_proba(X), copies.predict_proba(X), atol=1e-5)
    np.testing.assert_allclose(merged.mean_, copies.mean_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(merged.scale_, copies.scale_, rtol=1e-9)
    for r, idx in enumerate(subsets):
        assert np.abs(merged.predict_proba(X, r) - sklearn_proba(X[idx], y[idx], X, Cs[r], 3)).max() < 1e-3
    # its stopping measure is scikit-learn's on the copies: the gradient in W's coordinates meets tol
    fit = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=[form], tol=1e-6)
    monkeypatch.undo()
    fit_merged = fit_logistic_batch(X, y, subsets, Cs, 3, layout="grouped", forms=[form], tol=1e-6)
    for model in (fit, fit_merged):
        for r, idx in enumerate(subsets):
            Xs = (X[idx] - model.mean_[r]) / model.scale_[r]
            assert scaled_gradient_max_abs(Xs, y[idx], model.W_[r], model.b_[r], Cs[r], 3) <= 1e-6 * (1 + 1e-6)
