"""Probe heads, label-fraction subsampling and the batched logistic engine, checked against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import NearestCentroid
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from fmaudit.io import FmauditInputError
from fmaudit.probes import (
    ABSENT_CLASS_LOGIT_GAP,
    HEADS,
    CosineCentroidProbe,
    KNNProbe,
    LinearSVMProbe,
    LogisticCVProbe,
    LogisticProbe,
    NearestCentroidProbe,
    fit_logistic_batch,
    make_head,
    split_train_val,
    stratified_subsample,
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


# ---------------------------------------------------------------------------------------------- the engine


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
    nested_small = stratified_subsample(y, 0.25, random_state=3)
    nested_large = stratified_subsample(y, 0.5, random_state=3)
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
    import fmaudit.probes.logistic_batch as engine

    X, y = mixture(200, 10, 3, seed=25)
    subsets = [stratified_subsample(y, f, 1) for f in (0.2, 0.6)]
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
    subsets = [stratified_subsample(y, f, 0) for f in (0.3, 1.0)]
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


# ---------------------------------------------------------------------------------------------- the heads


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_head_outputs_aligned_k_columns_even_with_missing_classes(name):
    X, y = mixture(240, 12, 4, separation=2.0, seed=13)
    train = y != 2  # class 2 never seen
    head = make_head(name, n_classes=5).fit(X[train], y[train])
    logits, proba, pred = head.decision_logits(X), head.predict_proba(X), head.predict(X)
    assert logits.shape == proba.shape == (240, 5)
    assert np.isfinite(logits).all()
    np.testing.assert_allclose(proba.sum(1), 1.0)
    np.testing.assert_array_equal(head.classes_, np.arange(5))
    np.testing.assert_array_equal(pred, logits.argmax(1))
    assert not np.isin(pred, [2, 4]).any()
    assert (pred == y)[train].mean() > 0.6
    assert head.probabilistic == name.startswith("logistic")
    if head.probabilistic:
        assert (proba[:, [2, 4]] == 0).all()


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_head_without_n_classes_uses_the_labels_seen(name):
    X, y = mixture(90, 6, 3, separation=2.0, seed=14)
    labels = np.array(["lymph", "mono", "neut"])[y]
    head = make_head(name).fit(X, labels)
    np.testing.assert_array_equal(head.classes_, ["lymph", "mono", "neut"])
    assert head.decision_logits(X).shape == (90, 3)
    assert set(head.predict(X)) <= set(labels)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_logistic_probe_backends_agree_and_binary_logits_are_half_decision(n_classes):
    X, y = mixture(150, 10, n_classes, seed=15)
    torch_head = LogisticProbe(backend="torch", tol=1e-10, max_iter=100_000).fit(X, y)
    sk_head = LogisticProbe(backend="sklearn", tol=1e-10, max_iter=100_000).fit(X, y)
    assert np.abs(torch_head.predict_proba(X) - sk_head.predict_proba(X)).max() < 1e-3
    np.testing.assert_allclose(torch_head.mean_, StandardScaler().fit(X).mean_)
    model = LogisticRegression(tol=1e-10, max_iter=100_000).fit(StandardScaler().fit_transform(X), y)
    Xs = StandardScaler().fit(X).transform(X)
    np.testing.assert_allclose(sk_head.predict_proba(X), model.predict_proba(Xs), atol=1e-10)
    if n_classes == 2:
        logits = sk_head.decision_logits(X)
        np.testing.assert_allclose(logits[:, 1], -logits[:, 0])
        np.testing.assert_allclose(logits[:, 1] - logits[:, 0], model.decision_function(Xs), atol=1e-10)


def test_logistic_probe_rejects_a_single_class_training_set():
    X, y = mixture(30, 4, 2, seed=16)
    for head in (LogisticProbe(), LogisticCVProbe(), LinearSVMProbe()):
        with pytest.raises(FmauditInputError, match="single class"):
            head.fit(X, np.zeros(30, dtype=int), n_classes=3)


def test_logistic_cv_probe_backends_pick_the_same_C_with_group_disjoint_folds():
    X, y = mixture(180, 8, 3, separation=0.6, seed=17)
    groups = np.repeat(np.arange(18), 10)
    Cs = np.logspace(-4, 1, 6)
    torch_head = LogisticCVProbe(Cs=Cs, backend="torch").fit(X, y, groups=groups)
    sk_head = LogisticCVProbe(Cs=Cs, backend="sklearn").fit(X, y, groups=groups)
    assert torch_head.C_ == sk_head.C_
    assert torch_head.C_ in Cs
    np.testing.assert_allclose(torch_head.cv_scores_, sk_head.cv_scores_, atol=1e-4)
    assert np.abs(torch_head.predict_proba(X) - sk_head.predict_proba(X)).max() < 1e-3
    assert torch_head.cv_scores_.shape == (3, 6)
    folds = torch_head._folds(X, y, groups)
    for train, test in folds:
        assert not set(groups[train]) & set(groups[test])
    with pytest.raises(FmauditInputError, match="distinct groups"):
        LogisticCVProbe().fit(X, y, groups=np.arange(180) % 2)


def test_linear_svm_probe_logits_are_linear_svc_decisions():
    X, y = mixture(120, 8, 3, seed=18)
    Xs = StandardScaler().fit_transform(X)
    head = LinearSVMProbe(C=0.5).fit(X, y)
    svc = LinearSVC(C=0.5, random_state=0).fit(Xs, y)
    np.testing.assert_allclose(head.decision_logits(X), svc.decision_function(Xs))
    binary = y < 2
    head2 = LinearSVMProbe(C=0.5).fit(X[binary], y[binary])
    d = LinearSVC(C=0.5, random_state=0).fit(StandardScaler().fit_transform(X[binary]), y[binary])
    d = d.decision_function(StandardScaler().fit(X[binary]).transform(X))
    np.testing.assert_allclose(head2.decision_logits(X), np.stack([-d / 2, d / 2], 1))


def test_nearest_centroid_probe_matches_sklearn_and_uses_minus_squared_distance():
    X, y = mixture(150, 7, 3, seed=19)
    Xs = StandardScaler().fit_transform(X)
    head = NearestCentroidProbe().fit(X, y)
    np.testing.assert_array_equal(head.predict(X), NearestCentroid().fit(Xs, y).predict(Xs))
    centroids = np.stack([Xs[y == k].mean(0) for k in range(3)])
    expected = -((Xs[:, None, :] - centroids[None]) ** 2).sum(-1)
    np.testing.assert_allclose(head.decision_logits(X), expected, atol=1e-9)
    raw = NearestCentroidProbe(standardize=False).fit(X, y)
    np.testing.assert_array_equal(raw.predict(X), NearestCentroid().fit(X, y).predict(X))


def test_cosine_centroid_probe_is_cosine_to_class_means_of_unit_vectors():
    X, y = mixture(150, 7, 3, seed=20)
    head = CosineCentroidProbe(standardize=False).fit(X, y)
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    means = np.stack([unit[y == k].mean(0) for k in range(3)])
    cosine = unit @ means.T / np.linalg.norm(means, axis=1)
    np.testing.assert_allclose(head.decision_logits(X), cosine, atol=1e-12)


def test_knn_probe_breaks_distance_ties_by_bank_order_and_votes_by_share():
    bank = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    labels = np.array([2, 0, 1, 1])  # rows 0 and 1 are the same direction (cosine tie), labels 2 then 0
    head = KNNProbe(k=1, standardize=False).fit(bank, labels, n_classes=3)
    query = np.array([[5.0, 0.0], [0.0, 1.0]])
    np.testing.assert_array_equal(head.neighbours(query)[:, 0], [0, 2])
    np.testing.assert_array_equal(head.predict(query), [2, 1])
    np.testing.assert_array_equal(head.decision_logits(query), [[0, 0, 1], [0, 1, 0]])
    head3 = KNNProbe(k=3, standardize=False).fit(bank, labels, n_classes=3)
    np.testing.assert_allclose(head3.decision_logits(np.array([[1.0, 0.1]])), [[1 / 3, 1 / 3, 1 / 3]])
    assert head3.predict(np.array([[1.0, 0.1]]))[0] == 0  # three-way vote tie -> lowest class
    euclid = KNNProbe(k=1, metric="euclidean", standardize=False).fit(bank, labels)
    np.testing.assert_array_equal(euclid.neighbours(np.array([[1.9, 0.0]]))[:, 0], [1])


def test_knn_probe_agrees_with_brute_force_stable_sort():
    X, y = mixture(200, 5, 3, seed=21)
    X[50] = X[10]  # an exact duplicate: a guaranteed distance tie
    head = KNNProbe(k=5, metric="cosine").fit(X, y)
    Xs = (X - head.mean_) / head.scale_
    unit = Xs / np.linalg.norm(Xs, axis=1, keepdims=True)
    dist = 1 - unit[:40] @ unit.T
    expected = np.argsort(np.round(dist, 12), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(head.neighbours(X[:40]), expected)


def test_make_head_names_and_errors():
    assert isinstance(make_head("1nn"), KNNProbe) and make_head("1nn").k == 1
    assert make_head("knn", k=7).k == 7
    assert make_head("logistic", C=3.0).C == 3.0
    with pytest.raises(FmauditInputError, match="known heads: 1nn, cosine_centroid, knn, linear_svm"):
        make_head("random_forest")
    with pytest.raises(FmauditInputError, match="logistic"):
        make_head("logistic", gamma=1.0)
    with pytest.raises(FmauditInputError, match="k=1"):
        make_head("1nn", k=3)


@pytest.mark.parametrize("name", ["logistic", "nearest_centroid", "knn", "linear_svm"])
def test_heads_reject_bad_input(name):
    X, y = mixture(40, 5, 2, seed=22)
    head = make_head(name)
    with pytest.raises(FmauditInputError, match="not fitted"):
        head.predict(X)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(FmauditInputError, match="NaN"):
        head.fit(bad, y)
    with pytest.raises(FmauditInputError, match="labels for 40"):
        head.fit(X, y[:-1])
    with pytest.raises(FmauditInputError, match="out of range for n_classes=2"):
        head.fit(X, y + 1, n_classes=2)
    head.fit(X, y)
    with pytest.raises(FmauditInputError, match="4 features"):
        head.predict(X[:, :4])
    with pytest.raises(FmauditInputError, match="NaN"):
        head.predict(bad)


def test_heads_are_deterministic():
    X, y = mixture(100, 6, 3, seed=23)
    for name in HEADS:
        a = make_head(name).fit(X, y).decision_logits(X)
        b = make_head(name).fit(X, y).decision_logits(X)
        np.testing.assert_array_equal(a, b, err_msg=name)


# --------------------------------------------------------------------------------------------- subsampling


def test_stratified_subsample_counts_sorting_determinism_and_nesting():
    y = np.repeat([0, 1, 2, 3], [500, 120, 7, 1])
    np.random.default_rng(0).shuffle(y)
    for fraction in (0.01, 0.05, 0.1, 0.25, 0.5):
        idx = stratified_subsample(y, fraction, random_state=3)
        counts = np.bincount(y[idx], minlength=4)
        np.testing.assert_array_equal(counts, [max(1, int(n * fraction)) for n in (500, 120, 7, 1)])
        assert (np.diff(idx) > 0).all()
        np.testing.assert_array_equal(idx, stratified_subsample(y, fraction, random_state=3))
    assert not np.array_equal(stratified_subsample(y, 0.1, 0), stratified_subsample(y, 0.1, 1))
    small, large = stratified_subsample(y, 0.1, 5), stratified_subsample(y, 0.5, 5)
    assert set(small) <= set(large)
    np.testing.assert_array_equal(stratified_subsample(y, 1.0, 0), np.arange(y.size))


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_stratified_subsample_rejects_bad_fractions(fraction):
    with pytest.raises(FmauditInputError, match="fraction"):
        stratified_subsample(np.array([0, 1, 1]), fraction)


def test_stratified_subsample_rejects_missing_labels():
    with pytest.raises(FmauditInputError, match="NaN label at row 1"):
        stratified_subsample(np.array([0.0, np.nan, 1.0]), 0.5)


def test_split_train_val_without_groups_is_stratified_and_complete():
    y = np.repeat([0, 1, 2], [100, 40, 1])
    train, val = split_train_val(y, val_fraction=0.25, random_state=0)
    assert not set(train) & set(val)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.arange(y.size))
    np.testing.assert_array_equal(np.bincount(y[val], minlength=3), [25, 10, 0])  # a singleton stays in train
    again = split_train_val(y, val_fraction=0.25, random_state=0)
    np.testing.assert_array_equal(val, again[1])


def test_split_train_val_with_groups_is_group_disjoint_and_keeps_every_class_in_train():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(30), 8)
    y = rng.integers(0, 4, groups.size)
    y[groups == 7] = 3  # class 3 lives mostly in a few groups
    train, val = split_train_val(y, groups=groups, val_fraction=0.2, random_state=2)
    assert not set(groups[train]) & set(groups[val])
    assert set(y[train]) == set(y)
    assert 0.1 < val.size / y.size < 0.35
    np.testing.assert_array_equal(val, split_train_val(y, groups=groups, val_fraction=0.2, random_state=2)[1])
    with pytest.raises(FmauditInputError, match="at least 2 groups"):
        split_train_val(y, groups=np.zeros_like(groups))
    with pytest.raises(FmauditInputError, match="groups"):
        split_train_val(y, groups=groups[:-1])
