"""Probe heads: one output convention (K aligned logit columns), each against its scikit-learn counterpart."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import NearestCentroid
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from fmaudit.io import FmauditInputError
from fmaudit.probes import (
    HEADS,
    CosineCentroidProbe,
    KNNProbe,
    LinearSVMProbe,
    LogisticCVProbe,
    LogisticProbe,
    NearestCentroidProbe,
    make_head,
)


def mixture(n, dim, n_classes, separation=1.0, seed=0, offset=3.0):
    """Overlapping Gaussian classes with unequal feature scales and a non-zero mean."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((n_classes, dim)) * separation
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    scales = np.exp(0.5 * rng.standard_normal(dim))
    X = means[y] + rng.standard_normal((n, dim)) * scales * 1.5 + offset
    return X, y


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


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_head_is_a_scikit_learn_classifier(name):
    from sklearn.base import clone, is_classifier
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    X, y = mixture(120, 6, 3, separation=2.0, seed=21)
    head = make_head(name, standardize=False)
    assert is_classifier(head)
    twin = clone(head)
    assert twin is not head and twin.get_params().keys() == head.get_params().keys()
    assert all(np.array_equal(v, head.get_params()[k]) for k, v in twin.get_params().items())
    assert "standardize" in head.get_params() and head.set_params(standardize=True) is head and head.standardize
    pipe = make_pipeline(FunctionTransformer(lambda a: a * 2.0), clone(twin)).fit(X, y)
    np.testing.assert_array_equal(pipe.predict(X), make_head(name, standardize=False).fit(X * 2.0, y).predict(X * 2.0))
    assert 0.6 < pipe.score(X, y) <= 1.0
    grid_params = {"standardize": [True, False]}
    search = GridSearchCV(make_head(name), grid_params, cv=3).fit(X, y)
    assert search.best_params_["standardize"] in (True, False)
    assert search.best_estimator_.predict(X).shape == (120,)


def test_decision_function_follows_scikit_learn_and_decision_logits_keeps_k_columns():
    X, y = mixture(100, 5, 2, separation=2.0, seed=22)
    head = LogisticProbe(tol=1e-10, max_iter=10_000).fit(X, y)
    logits = head.decision_logits(X)
    assert logits.shape == (100, 2) and head.decision_function(X).shape == (100,)
    np.testing.assert_allclose(head.decision_function(X), logits[:, 1] - logits[:, 0])
    # the binary decision value is scikit-learn's own on the same standardised features
    Xs = StandardScaler().fit_transform(X)
    sk = LogisticRegression(tol=1e-10, max_iter=10_000).fit(Xs, y)
    np.testing.assert_allclose(head.decision_function(X), sk.decision_function(Xs), atol=1e-4)
    X3, y3 = mixture(90, 5, 3, separation=2.0, seed=23)
    three = LogisticProbe().fit(X3, y3)
    np.testing.assert_array_equal(three.decision_function(X3), three.decision_logits(X3))
