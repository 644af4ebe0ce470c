"""Novelty scorers and detection metrics against independent scikit-learn / scipy computations."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp, softmax
from sklearn.covariance import EmpiricalCovariance, LedoitWolf
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import normalize

from fmaudit.io import FmauditInputError
from fmaudit.metrics import detection_auroc, fpr_at_tpr
from fmaudit.ood.scorers import (
    KNNDistance,
    Mahalanobis,
    RelativeMahalanobis,
    energy_score,
    make_feature_scorer,
    max_softmax,
    msp_score,
    scorer_from_state,
)


@pytest.fixture
def blobs():
    """Three anisotropic classes in 12 dimensions (60 training rows: the covariance is estimated from few
    rows, where Ledoit-Wolf shrinkage matters) and a shifted query set."""
    rng = np.random.default_rng(7)
    d = 12
    mixing = rng.normal(size=(d, d))
    means = rng.normal(scale=3.0, size=(3, d))
    y = np.repeat([0, 1, 2], 20)
    Z = means[y] + rng.normal(size=(y.size, d)) @ mixing
    Q = rng.normal(size=(40, d)) @ mixing + 1.5
    return Z, y, Q


def reference_mahalanobis(Z, y, Q, estimator):
    """Few-line reference: class means, class-centred residuals, sklearn covariance, numpy pinv, min over k."""
    classes = np.unique(y)
    means = np.stack([Z[y == c].mean(0) for c in classes])
    centred = Z - means[np.searchsorted(classes, y)]
    cov = estimator().fit(centred).covariance_
    P = np.linalg.pinv(cov)
    return np.stack([((Q - m) @ P * (Q - m)).sum(1) for m in means], axis=1)


@pytest.mark.parametrize("name, estimator", [("ledoit_wolf", LedoitWolf), ("empirical", EmpiricalCovariance)])
def test_mahalanobis_matches_sklearn_covariance_and_pinv(blobs, name, estimator):
    Z, y, Q = blobs
    ref = reference_mahalanobis(Z, y, Q, estimator)
    m = Mahalanobis(covariance=name).fit(Z, y)
    np.testing.assert_allclose(m.class_distances(Q), ref, rtol=1e-9)
    np.testing.assert_allclose(m.score(Q), ref.min(1), rtol=1e-9)
    np.testing.assert_allclose(m.covariance_, estimator().fit(Z - m.means_[y]).covariance_, rtol=1e-12)


def test_empirical_is_lee_et_al_and_differs_from_ledoit_wolf(blobs):
    Z, y, Q = blobs
    lw = Mahalanobis("ledoit_wolf").fit(Z, y).score(Q)
    emp = Mahalanobis("empirical").fit(Z, y).score(Q)
    # Lee et al. (deep_Mahalanobis_detector): EmpiricalCovariance of class-centred features, score = -max_k(-d_k)
    means = np.stack([Z[y == c].mean(0) for c in range(3)])
    precision = EmpiricalCovariance().fit(Z - means[y]).precision_
    lee = -np.max(np.stack([-(((Q - m) @ precision) * (Q - m)).sum(1) for m in means], 1), axis=1)
    np.testing.assert_allclose(emp, lee, rtol=1e-8)
    # the estimators give noticeably different scores (METHODS 5): shrinkage pulls distances together
    rel = np.abs(lw - emp) / emp
    assert np.median(rel) > 0.3


def test_singular_covariance_uses_the_pseudo_inverse():
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(10, 30))  # D > N: the empirical covariance is singular
    y = np.repeat([0, 1], 5)
    Q = rng.normal(size=(4, 30))
    m = Mahalanobis("empirical").fit(Z, y)
    ref = reference_mahalanobis(Z, y, Q, EmpiricalCovariance)
    np.testing.assert_allclose(m.score(Q), ref.min(1), rtol=1e-6)
    np.testing.assert_allclose(m.precision_, np.linalg.pinv(m.covariance_), rtol=1e-6, atol=1e-8)
    assert np.isfinite(Mahalanobis("ledoit_wolf").fit(Z, y).score(Q)).all()


def test_single_sample_class_has_a_mean_and_zero_residual():
    Z = np.array([[0.0, 0.0], [1.0, 0.5], [2.0, 1.0], [10.0, 10.0]])
    y = np.array([0, 0, 0, 1])
    m = Mahalanobis().fit(Z, y)
    np.testing.assert_allclose(m.means_[1], [10.0, 10.0])
    assert m.score(np.array([[10.0, 10.0]]))[0] == pytest.approx(0.0, abs=1e-9)


def test_relative_mahalanobis_matches_ren_et_al(blobs):
    Z, y, Q = blobs
    for name, estimator in (("empirical", EmpiricalCovariance), ("ledoit_wolf", LedoitWolf)):
        rmd = RelativeMahalanobis(covariance=name).fit(Z, y)
        md_k = reference_mahalanobis(Z, y, Q, estimator)
        mu0 = Z.mean(0)
        P0 = np.linalg.pinv(estimator().fit(Z - mu0).covariance_)
        md_0 = ((Q - mu0) @ P0 * (Q - mu0)).sum(1)
        np.testing.assert_allclose(rmd.score(Q), (md_k - md_0[:, None]).min(1), rtol=1e-8, atol=1e-8)
    assert RelativeMahalanobis().covariance == "empirical"


@pytest.mark.parametrize("k", [1, 5, 50])
def test_knn_distance_matches_sklearn_nearest_neighbors(blobs, k):
    Z, _, Q = blobs
    ref = NearestNeighbors(n_neighbors=k).fit(normalize(Z)).kneighbors(normalize(Q))[0][:, k - 1]
    np.testing.assert_allclose(KNNDistance(k=k).fit(Z).score(Q), ref, rtol=1e-7, atol=1e-7)
    raw = NearestNeighbors(n_neighbors=k).fit(Z).kneighbors(Q)[0][:, k - 1]
    np.testing.assert_allclose(KNNDistance(k=k, normalize=False, block_size=7).fit(Z).score(Q), raw, rtol=1e-7)


def test_knn_k_above_the_bank_is_capped_with_a_warning(blobs):
    Z, _, Q = blobs
    with pytest.warns(UserWarning, match="exceeds the bank of 60"):
        knn = KNNDistance(k=500).fit(Z)
    assert knn.k_ == 60
    farthest = NearestNeighbors(n_neighbors=60).fit(normalize(Z)).kneighbors(normalize(Q))[0][:, -1]
    np.testing.assert_allclose(knn.score(Q), farthest, rtol=1e-7, atol=1e-7)


def test_energy_and_msp_match_scipy():
    rng = np.random.default_rng(3)
    logits = rng.normal(scale=3, size=(25, 4))
    np.testing.assert_allclose(energy_score(logits), -logsumexp(logits, axis=1), rtol=1e-12)
    np.testing.assert_allclose(energy_score(logits, T=2.5), -2.5 * logsumexp(logits / 2.5, axis=1), rtol=1e-12)
    np.testing.assert_allclose(msp_score(logits), 1 - softmax(logits, axis=1).max(1), rtol=1e-12, atol=1e-15)
    # a binary decision value d is the logit pair (-d/2, d/2): softmax = sigmoid(d)
    d = rng.normal(scale=4, size=30)
    pair = np.c_[-d / 2, d / 2]
    np.testing.assert_allclose(energy_score(d), -logsumexp(pair, axis=1), rtol=1e-12)
    np.testing.assert_allclose(max_softmax(d), 1 / (1 + np.exp(-np.abs(d))), rtol=1e-12)


def test_scorer_state_round_trip(blobs):
    Z, y, Q = blobs
    for name, params in (("maha", {"covariance": "empirical"}), ("relative_maha", {}), ("knn", {"k": 7})):
        fitted = make_feature_scorer(name, **params).fit(Z, y)
        rebuilt = scorer_from_state(name, fitted.params(), fitted.state_arrays())
        np.testing.assert_array_equal(rebuilt.score(Q), fitted.score(Q))


def test_scorer_input_errors(blobs):
    Z, y, Q = blobs
    m = Mahalanobis().fit(Z, y)
    with pytest.raises(FmauditInputError, match="5 features, but Mahalanobis was fitted on 12"):
        m.score(Q[:, :5])
    bad = Q.copy()
    bad[3, 2] = np.nan
    with pytest.raises(FmauditInputError, match=r"NaN/inf features \(first rows \[3\]\)"):
        m.score(bad)
    with pytest.raises(FmauditInputError, match="NaN"):
        Mahalanobis().fit(np.where(np.arange(Z.size).reshape(Z.shape) == 5, np.nan, Z), y)
    with pytest.raises(FmauditInputError, match="covariance"):
        Mahalanobis(covariance="oas").fit(Z, y)
    with pytest.raises(FmauditInputError, match="labels"):
        Mahalanobis().fit(Z, y[:-1])
    with pytest.raises(FmauditInputError, match="not fitted"):
        KNNDistance().score(Q)
    with pytest.raises(FmauditInputError, match="positive integer"):
        KNNDistance(k=0).fit(Z)
    with pytest.raises(FmauditInputError, match="at least 2"):
        Mahalanobis().fit(Z[:1], y[:1])
    with pytest.raises(FmauditInputError, match="non-finite|NaN"):
        energy_score(np.array([[0.0, np.nan]]))
    with pytest.raises(FmauditInputError, match="unknown feature scorer 'energy'.*logit"):
        make_feature_scorer("energy")


# ----------------------------------------------------------------------------------------- detection metrics
def tied_scores(seed, n_id=37, n_ood=23):
    rng = np.random.default_rng(seed)
    return np.round(rng.normal(size=n_id), 1), np.round(rng.normal(0.8, 1.0, size=n_ood), 1)


@pytest.mark.parametrize("seed", range(5))
def test_detection_auroc_matches_roc_auc_score_with_ties(seed):
    s_id, s_ood = tied_scores(seed)
    ref = roc_auc_score(np.r_[[0] * s_id.size, [1] * s_ood.size], np.r_[s_id, s_ood])
    assert detection_auroc(s_id, s_ood) == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("tpr", [0.5, 0.9, 0.95, 1.0])
def test_fpr_at_tpr_matches_roc_curve_without_dropped_points(seed, tpr):
    s_id, s_ood = tied_scores(seed, n_id=41, n_ood=20)
    fpr, tprs, _ = roc_curve(np.r_[[0] * s_id.size, [1] * s_ood.size], np.r_[s_id, s_ood], drop_intermediate=False)
    assert fpr_at_tpr(s_id, s_ood, tpr) == pytest.approx(fpr[np.flatnonzero(tprs >= tpr)[0]], abs=1e-15)


def test_fpr_at_tpr_convention_on_a_hand_made_case():
    # OOD scores 4, 3, 2, 1 (n = 4); ID scores 3.5, 2, 0 (n = 3). TPR >= 0.75 first at threshold 2, where the
    # ID item tied at 2 is flagged too: FPR = 2/3. drop_intermediate=True drops that ROC point here.
    s_id, s_ood = np.array([3.5, 2.0, 0.0]), np.array([4.0, 3.0, 2.0, 1.0])
    assert fpr_at_tpr(s_id, s_ood, 0.75) == pytest.approx(2 / 3)
    assert fpr_at_tpr(s_id, s_ood, 0.5) == pytest.approx(1 / 3)
    assert fpr_at_tpr(s_id, s_ood, 1.0) == pytest.approx(2 / 3)
    assert fpr_at_tpr([0.0, 0.1], [5.0, 6.0]) == 0.0
    assert detection_auroc([0.0, 0.1], [5.0, 6.0]) == 1.0


def test_detection_metric_errors():
    with pytest.raises(FmauditInputError, match="scores_ood: no scores"):
        detection_auroc([1.0, 2.0], [])
    with pytest.raises(FmauditInputError, match="scores_id: 1 non-finite"):
        fpr_at_tpr([1.0, np.nan], [2.0])
    with pytest.raises(FmauditInputError, match="tpr"):
        fpr_at_tpr([1.0], [2.0], tpr=0.0)
    with pytest.raises(FmauditInputError, match="1-D"):
        detection_auroc(np.zeros((2, 2)), [1.0])


def test_package_exports_resolve():
    import fmaudit.ood

    for name in fmaudit.ood.__all__:
        assert getattr(fmaudit.ood, name) is not None
    with pytest.raises(AttributeError):
        fmaudit.ood.no_such_name  # noqa: B018
