"""Resample counts and the vectorised metric kernels against naive recomputation on the resampled items."""

from __future__ import annotations

import numpy as np
import pytest

from fmaudit import metrics, stats
from fmaudit.io import FmauditInputError


def _model(n: int, k: int, seed: int, skill: float = 1.0, labels: np.ndarray | None = None):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n) if labels is None else labels
    z = rng.normal(size=(n, k)) * 1.5
    z[np.arange(n), y] += skill
    return metrics.softmax(z), y


@pytest.fixture(scope="module")
def data():
    p, y = _model(300, 4, seed=0)
    groups = np.repeat(np.arange(30), 10)
    return p, y, groups


# ------------------------------------------------------------------------------------------- counts
def test_counts_match_the_audit_papers_sequential_draws():
    counts = stats.bootstrap_counts(50, n_boot=7, random_state=3)
    assert counts.shape == (7, 50) and counts.dtype == np.int32
    rng = np.random.default_rng(3)
    expected = np.stack([np.bincount(rng.integers(0, 50, 50), minlength=50) for _ in range(7)])
    np.testing.assert_array_equal(counts, expected)
    assert (counts.sum(1) == 50).all()
    np.testing.assert_array_equal(counts, stats.bootstrap_counts(50, n_boot=7, random_state=3))


def test_grouped_counts_keep_groups_whole():
    groups = np.array(["s3", "s1", "s1", "s2", "s3", "s3", "s4", "s1"])
    counts = stats.bootstrap_counts(len(groups), groups=groups, n_boot=20, random_state=1)
    for g in np.unique(groups):
        members = counts[:, groups == g]
        assert (members == members[:, :1]).all()
    # the audit paper: G groups drawn per resample (sorted ids), every member taken per draw
    rng = np.random.default_rng(1)
    uniq, code = np.unique(groups, return_inverse=True)
    for row in counts:
        drawn = rng.integers(0, len(uniq), len(uniq))
        np.testing.assert_array_equal(row, np.bincount(drawn, minlength=len(uniq))[code])
    assert (counts.sum(1) != counts.sum(1)[0]).any()  # resample size varies with the groups drawn


def test_counts_bad_input():
    with pytest.raises(FmauditInputError, match="groups"):
        stats.bootstrap_counts(5, groups=[0, 1, 2], n_boot=2000)
    with pytest.raises(FmauditInputError, match="n_boot"):
        stats.bootstrap_counts(5, n_boot=0)
    with pytest.raises(FmauditInputError, match="groups"):
        stats.bootstrap_counts(2, groups=np.array([0.0, np.nan]), n_boot=2000)


# ------------------------------------------------------------------------------------------ kernels
NAIVE = {
    "accuracy": metrics.accuracy,
    "macro_f1": metrics.macro_f1,
    "balanced_accuracy": metrics.balanced_accuracy,
    "ece": metrics.ece,
    "nll": metrics.nll,
    "brier": metrics.brier,
    "auroc": metrics.auroc,
    "qwk": metrics.qwk,
    "aurc": metrics.aurc,
}


@pytest.mark.parametrize("metric_name", sorted(NAIVE))
@pytest.mark.parametrize("grouped", [False, True])
def test_weighted_kernels_equal_naive_recomputation(data, metric_name, grouped):
    p, y, groups = data
    counts = stats.bootstrap_counts(len(y), groups=groups if grouped else None, n_boot=4, random_state=2)
    values = stats.bootstrap_metric(metric_name, p, y, counts)
    for b in range(4):
        idx = np.repeat(np.arange(len(y)), counts[b])
        assert values[b] == pytest.approx(NAIVE[metric_name](p[idx], y[idx]), rel=1e-12, abs=1e-14)


def test_kernels_with_ties_and_other_closure():
    rng = np.random.default_rng(3)
    p = rng.choice([0.2, 0.4, 0.6, 0.8], size=(120, 1))
    p = np.hstack([1 - p, p])  # binary, confidences on 4-bin edges, heavy AUROC ties
    y = rng.integers(0, 2, 120)
    counts = stats.bootstrap_counts(120, n_boot=5, random_state=0)
    auc = stats.bootstrap_metric("auroc", p, y, counts)
    ece_left = stats.bootstrap_metric("ece", p, y, counts, n_bins=5, closure="[lo,hi)")
    for b in range(5):
        idx = np.repeat(np.arange(120), counts[b])
        assert auc[b] == pytest.approx(metrics.auroc(p[idx], y[idx]), abs=1e-14)
        assert ece_left[b] == pytest.approx(metrics.ece(p[idx], y[idx], n_bins=5, closure="[lo,hi)"), abs=1e-14)
    p3, y3 = _model(150, 3, seed=4)
    p3 = np.round(p3, 1) + 1e-3  # heavy ties in every one-vs-rest problem
    p3 = p3 / p3.sum(1, keepdims=True)
    counts3 = stats.bootstrap_counts(150, n_boot=3, random_state=5)
    auc3 = stats.bootstrap_metric("auroc", p3, y3, counts3)
    for b in range(3):
        idx = np.repeat(np.arange(150), counts3[b])
        assert auc3[b] == pytest.approx(metrics.auroc(p3[idx], y3[idx]), abs=1e-14)


def test_nll_kernel_infinite_only_when_resampled():
    p = np.array([[1.0, 0.0], [0.7, 0.3], [0.4, 0.6]])
    y = np.array([1, 0, 1])  # item 0 has probability 0 on its label
    counts = np.array([[1, 1, 1], [0, 2, 1]], dtype=np.int32)
    values = stats.bootstrap_metric("nll", p, y, counts)
    assert values[0] == np.inf
    assert values[1] == pytest.approx(metrics.nll(p[[1, 1, 2]], y[[1, 1, 2]]))


def test_auroc_resample_missing_a_class_is_nan(data):
    p, y, _ = data
    counts = np.ones((2, len(y)), dtype=np.int32)
    counts[1, y == 2] = 0
    values = stats.bootstrap_metric("auroc", p, y, counts)
    assert values[0] == pytest.approx(metrics.auroc(p, y), abs=1e-14) and np.isnan(values[1])


def test_bootstrap_metric_bad_input(data):
    p, y, _ = data
    counts = stats.bootstrap_counts(len(y), n_boot=2)
    with pytest.raises(FmauditInputError, match="unknown metric"):
        stats.bootstrap_metric("f2", p, y, counts)
    with pytest.raises(FmauditInputError, match="counts"):
        stats.bootstrap_metric("accuracy", p, y, counts[:, 1:])
    with pytest.raises(FmauditInputError, match="n_bins"):
        stats.bootstrap_metric("accuracy", p, y, counts, n_bins=10)
    with pytest.raises(FmauditInputError, match="no items"):
        stats.bootstrap_metric("accuracy", p, y, np.zeros((1, len(y)), dtype=np.int32))
    bad = p.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FmauditInputError, match="non-finite"):
        stats.bootstrap_metric("accuracy", bad, y, counts)


def test_binned_summary_columns_resolve_to_their_bins(data):
    p, y, _ = data
    counts = stats.bootstrap_counts(len(y), n_boot=5, random_state=0)
    by_column = stats.bootstrap_metric("ece_top_10_lohi", p, y, counts)
    np.testing.assert_allclose(by_column, stats.bootstrap_metric("ece", p, y, counts, n_bins=10))
    assert stats.resolve_metric("classwise_ece_7") == ("classwise_ece", {"n_bins": 7})
    with pytest.raises(FmauditInputError, match="at 10 bins"):
        stats.bootstrap_metric("ece_top_10_lohi", p, y, counts, n_bins=15)
    with pytest.raises(FmauditInputError, match="unknown metric 'ece_top_lohi'"):
        stats.bootstrap_metric("ece_top_lohi", p, y, counts)
