"""Selective prediction: risk-coverage, AURC / E-AURC, selective accuracy, QWK, blur curve."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from fmaudit import metrics
from fmaudit.io import FmauditInputError
from fmaudit.ood.selective import blur_accuracy_curve, prediction_summary, risk_coverage_curve, selective_summary


def random_probs(seed, n=60, k=4):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(n, k))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.where(rng.random(n) < 0.7, p.argmax(1), rng.integers(0, k, n))
    return p, y


def plain_risks(conf, correct):
    """Reference without ties: sort by confidence, cumulative error rate."""
    order = np.argsort(-conf)
    c = correct[order].astype(float)
    k = np.arange(1, c.size + 1)
    return 1 - np.cumsum(c) / k


def test_risk_coverage_curve_without_ties_matches_a_plain_sort():
    p, y = random_probs(0)
    conf, correct = p.max(1), p.argmax(1) == y
    curve = risk_coverage_curve(p, y)
    np.testing.assert_allclose(curve["risk"], plain_risks(conf, correct))
    np.testing.assert_allclose(curve["coverage"], np.arange(1, 61) / 60)
    assert curve["risk"].mean() == pytest.approx(metrics.aurc(p, y))
    assert (np.diff(curve["confidence_threshold"]) <= 0).all()


def test_tied_confidences_average_over_every_order_within_the_tie():
    conf = np.array([0.9, 0.7, 0.7, 0.7, 0.5, 0.5])
    correct = np.array([1, 0, 1, 1, 0, 1], bool)
    risks = []
    blocks = [[0], [1, 2, 3], [4, 5]]
    for perm_a in itertools.permutations(blocks[1]):
        for perm_b in itertools.permutations(blocks[2]):
            order = [0, *perm_a, *perm_b]
            c = correct[order].astype(float)
            risks.append(1 - np.cumsum(c) / np.arange(1, 7))
    expected = np.mean(risks, axis=0)
    curve = risk_coverage_curve(confidence=conf, correct=correct)
    np.testing.assert_allclose(curve["risk"], expected)


def test_summary_matches_library_metrics_and_sklearn_qwk():
    p, y = random_probs(1)
    s = selective_summary(p, y, ordinal=True, coverages=(0.5, 0.9), n_boot=0)
    assert s["aurc"] == pytest.approx(metrics.aurc(p, y))
    assert s["eaurc"] == pytest.approx(metrics.eaurc(p, y))
    assert s["selective_accuracy_c0.5"] == pytest.approx(metrics.selective_accuracy(p, y, 0.5))
    assert s["selective_accuracy_c0.9"] == pytest.approx(metrics.selective_accuracy(p, y, 0.9))
    assert s["qwk"] == pytest.approx(cohen_kappa_score(y, p.argmax(1), weights="quadratic", labels=range(4)))
    assert s["ece_top_15_lohi"] == pytest.approx(metrics.ece(p, y))
    # expected E-AURC of a correctness-independent ranking: error rate minus the optimal AURC
    correct = (p.argmax(1) == y).astype(float)
    oracle = plain_risks(-np.arange(60.0), np.sort(correct)[::-1]).mean()
    assert s["eaurc_random"] == pytest.approx(1 - correct.mean() - oracle)
    assert "qwk" not in selective_summary(p, y, n_boot=0)


def test_summary_bootstrap_names_its_unit_and_brackets_the_point():
    p, y = random_probs(2)
    groups = np.repeat(np.arange(12), 5)
    s = selective_summary(p, y, groups=groups, n_boot=200, random_state=0, unit="patient")
    assert s["ci_unit"] == "patient" and s["ci_n_units"] == 12 and s["n_boot"] == 200
    for key in ("accuracy", "aurc", "eaurc"):
        assert s[f"{key}_ci_lo"] <= s[key] <= s[f"{key}_ci_hi"]
    item = selective_summary(p, y, n_boot=50)
    assert item["ci_unit"] == "item" and item["ci_n_units"] == 60


def test_degenerate_predictions():
    y = np.array([0, 1, 0, 1])
    s = prediction_summary(y, y, [0.9, 0.8, 0.7, 0.6], 2, n_boot=0)
    assert s["aurc"] == 0 and s["eaurc"] == 0
    s = prediction_summary(y, 1 - y, [0.9, 0.8, 0.7, 0.6], 2, n_boot=0)
    assert s["aurc"] == 1 and s["eaurc"] == 0


def test_selective_input_errors():
    p, y = random_probs(3)
    with pytest.raises(FmauditInputError, match="coverages"):
        selective_summary(p, y, coverages=(0.0,), n_boot=0)
    with pytest.raises(FmauditInputError, match="one entry per item"):
        prediction_summary(y, y[:-1], p.max(1), n_boot=0)
    with pytest.raises(FmauditInputError, match="NaN"):
        prediction_summary(y, y, np.full(y.size, np.nan), n_boot=0)
    with pytest.raises(FmauditInputError, match="confidence and correct"):
        risk_coverage_curve()


def blur_table():
    rng = np.random.default_rng(4)
    n = 40
    y = rng.integers(0, 3, n)
    rows = []
    for sigma, flip in ((0.0, 0.1), (1.0, 0.3), (2.0, 0.6)):
        pred = np.where(rng.random(n) < flip, (y + 1) % 3, y)
        rows.append(pd.DataFrame({"sigma": sigma, "item_id": [f"i{j}" for j in range(n)], "label": y,
                                  "prediction": pred, "group": [f"p{j // 4}" for j in range(n)]}))
    return pd.concat(rows, ignore_index=True)


def test_blur_accuracy_curve():
    table = blur_table()
    out = blur_accuracy_curve(table, 3, ordinal=True, n_boot=100)
    assert out["sigma"].tolist() == [0.0, 1.0, 2.0]
    for _, row in out.iterrows():
        part = table[table["sigma"] == row["sigma"]]
        assert row["accuracy"] == pytest.approx((part["label"] == part["prediction"]).mean())
        assert row["qwk"] == pytest.approx(cohen_kappa_score(part["label"], part["prediction"], weights="quadratic",
                                                             labels=range(3)))
        assert row["accuracy_ci_lo"] <= row["accuracy"] <= row["accuracy_ci_hi"]
    assert out["accuracy_change"].iloc[0] == 0
    assert out["accuracy_change"].iloc[2] == pytest.approx(out["accuracy"].iloc[2] - out["accuracy"].iloc[0])
    # sigma 0 is the reference: its change is 0 by definition and gets no interval
    assert np.isnan(out["accuracy_change_ci_lo"].iloc[0]) and np.isnan(out["accuracy_change_ci_hi"].iloc[0])
    assert out["ci_unit"].iloc[0] == "group" and out["ci_n_units"].iloc[0] == 10


def test_blur_accuracy_curve_errors():
    table = blur_table()
    with pytest.raises(FmauditInputError, match="missing column"):
        blur_accuracy_curve(table.drop(columns="prediction"), n_boot=0)
    with pytest.raises(FmauditInputError, match="occurs twice at sigma 1"):
        blur_accuracy_curve(pd.concat([table, table[table["sigma"] == 1.0].head(1)]), n_boot=0)
    with pytest.raises(FmauditInputError, match="sigma must be >= 0"):
        blur_accuracy_curve(table.assign(sigma=-1.0), n_boot=0)
