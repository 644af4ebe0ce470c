"""fmaudit.metrics against sklearn, torchmetrics and hand-computed values (METHODS 1-4, 8)."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
from scipy.special import expit
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    brier_score_loss,
    cohen_kappa_score,
    f1_score,
    log_loss,
    roc_auc_score,
)

from fmaudit import metrics
from fmaudit.io import FmauditInputError


def _random_probs(n: int, k: int, seed: int, scale: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) * scale
    logits[np.arange(n), labels] += 1.0
    return metrics.softmax(logits), labels


@pytest.fixture
def multiclass():
    return _random_probs(400, 5, seed=1)


@pytest.fixture
def binary():
    return _random_probs(300, 2, seed=2)


# ---------------------------------------------------------------------------------------- sklearn
def test_discrimination_matches_sklearn(multiclass):
    p, y = multiclass
    pred = p.argmax(1)
    labels = list(range(p.shape[1]))
    assert metrics.accuracy(p, y) == pytest.approx(accuracy_score(y, pred), abs=1e-15)
    assert metrics.macro_f1(p, y) == pytest.approx(
        f1_score(y, pred, average="macro", labels=labels, zero_division=0), abs=1e-12
    )
    assert metrics.balanced_accuracy(p, y) == pytest.approx(balanced_accuracy_score(y, pred), abs=1e-12)
    assert metrics.qwk(p, y) == pytest.approx(
        cohen_kappa_score(y, pred, weights="quadratic", labels=labels), abs=1e-12
    )
    assert metrics.auroc(p, y) == pytest.approx(roc_auc_score(y, p, multi_class="ovr", average="macro"), abs=1e-12)


def test_proper_scores_match_sklearn(multiclass):
    p, y = multiclass
    labels = list(range(p.shape[1]))
    assert metrics.nll(p, y) == pytest.approx(log_loss(y, p, labels=labels), rel=1e-10)
    assert metrics.brier(p, y) == pytest.approx(brier_score_loss(y, p, labels=labels), rel=1e-12)


def test_binary_conventions(binary):
    p, y = binary
    assert metrics.auroc(p, y) == pytest.approx(roc_auc_score(y, p[:, 1]), abs=1e-12)
    # Sum-form Brier is twice sklearn's binary Brier on p(class 1).
    assert metrics.brier(p, y) == pytest.approx(2 * brier_score_loss(y, p[:, 1]), rel=1e-12)


def test_macro_f1_counts_never_predicted_class_as_zero():
    p = np.array([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1]])
    y = np.array([0, 0, 1, 2])  # class 2 is never predicted
    expected = f1_score(y, p.argmax(1), average="macro", labels=[0, 1, 2], zero_division=0)
    assert metrics.macro_f1(p, y) == pytest.approx(expected)
    assert metrics.macro_f1(p, y) == pytest.approx((0.8 + 1.0 + 0.0) / 3)


def test_balanced_accuracy_ignores_classes_absent_from_labels():
    p = np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.1, 0.0, 0.9]])
    y = np.array([0, 1, 1])  # class 2 predicted once but never true
    with pytest.warns(UserWarning):
        expected = balanced_accuracy_score(y, p.argmax(1))
    assert metrics.balanced_accuracy(p, y) == pytest.approx(expected) == pytest.approx(0.75)


def test_auroc_with_ties_matches_sklearn():
    p, y = _random_probs(200, 3, seed=3)
    p = np.round(p, 1)
    p = p / p.sum(1, keepdims=True)
    assert metrics.auroc(p, y) == pytest.approx(roc_auc_score(y, p, multi_class="ovr"), abs=1e-12)


def test_auroc_absent_class_is_nan_and_logged(multiclass, caplog):
    p, y = multiclass
    keep = y != 3
    with caplog.at_level(logging.WARNING, logger="fmaudit.metrics"):
        value = metrics.auroc(p[keep], y[keep])
    assert np.isnan(value)
    assert "absent" in caplog.text and "[3]" in caplog.text


def test_qwk_undefined_is_nan():
    p = np.array([[0.1, 0.9, 0.0], [0.2, 0.8, 0.0]])
    y = np.array([1, 1])
    assert np.isnan(metrics.qwk(p, y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns that kappa is undefined here
        assert np.isnan(cohen_kappa_score(y, p.argmax(1), weights="quadratic", labels=[0, 1, 2]))


# ----------------------------------------------------------------------------------- torchmetrics
def test_ece_and_auroc_match_torchmetrics_without_edge_ties(multiclass):
    torch = pytest.importorskip("torch")
    tmf = pytest.importorskip("torchmetrics.functional.classification")
    p, y = multiclass
    edges = np.linspace(0, 1, 16)
    assert not np.isin(p.max(1).astype(np.float32), edges.astype(np.float32)).any()
    ref = float(tmf.multiclass_calibration_error(torch.tensor(p), torch.tensor(y), num_classes=5, n_bins=15))
    assert metrics.ece(p, y) == pytest.approx(ref, abs=1e-6)
    assert metrics.ece(p, y, closure="[lo,hi)") == pytest.approx(ref, abs=1e-6)
    ref_max = float(
        tmf.multiclass_calibration_error(torch.tensor(p), torch.tensor(y), num_classes=5, n_bins=15, norm="max")
    )
    assert metrics.mce(p, y) == pytest.approx(ref_max, abs=1e-6)
    ref_auc = float(tmf.multiclass_auroc(torch.tensor(p, dtype=torch.float32), torch.tensor(y), num_classes=5))
    assert metrics.auroc(p, y) == pytest.approx(ref_auc, abs=1e-5)


def test_binary_ece_is_top_label_not_torchmetrics_binary(binary):
    torch = pytest.importorskip("torch")
    tmf = pytest.importorskip("torchmetrics.functional.classification")
    p, y = binary
    top_label = float(tmf.multiclass_calibration_error(torch.tensor(p), torch.tensor(y), num_classes=2))
    positive_class = float(tmf.binary_calibration_error(torch.tensor(p[:, 1]), torch.tensor(y)))
    assert metrics.ece(p, y) == pytest.approx(top_label, abs=1e-6)
    assert abs(metrics.ece(p, y) - positive_class) > 1e-3  # the binary trap: a different metric


# ------------------------------------------------------------------------------------ bin closure
def test_bin_edge_ties_hand_computed():
    # conf 0.5 (correct) sits on an edge of 4 bins; conf 0.6 (wrong) does not.
    p = np.array([[0.5, 0.5], [0.6, 0.4]])
    y = np.array([0, 1])
    # (lo,hi]: 0.5 alone in (0.25, 0.5] -> |1 - 0.5|; 0.6 alone in (0.5, 0.75] -> |0 - 0.6|
    assert metrics.ece(p, y, n_bins=4, closure="(lo,hi]") == pytest.approx((0.5 + 0.6) / 2)
    # [lo,hi): both in [0.5, 0.75) -> accuracy 0.5, confidence 0.55
    assert metrics.ece(p, y, n_bins=4, closure="[lo,hi)") == pytest.approx(0.05)
    assert metrics.mce(p, y, n_bins=4) == pytest.approx(0.6)


def test_bin_edge_ties_torchmetrics_uses_left_closure():
    torch = pytest.importorskip("torch")
    tmf = pytest.importorskip("torchmetrics.functional.classification")
    p = np.array([[0.5, 0.5], [0.6, 0.4], [0.75, 0.25], [0.0, 1.0]])
    y = np.array([0, 1, 0, 1])
    ref = float(tmf.multiclass_calibration_error(torch.tensor(p), torch.tensor(y), num_classes=2, n_bins=4))
    assert metrics.ece(p, y, n_bins=4, closure="[lo,hi)") == pytest.approx(ref, abs=1e-7)
    assert abs(metrics.ece(p, y, n_bins=4, closure="(lo,hi]") - ref) > 0.1


def test_edge_values_and_extremes_land_in_documented_bins():
    edges = np.linspace(0, 1, 16)
    values = np.array([0.0, edges[8], 1.0])
    assert metrics.bin_indices(values, 15, "(lo,hi]").tolist() == [0, 7, 14]
    assert metrics.bin_indices(values, 15, "[lo,hi)").tolist() == [0, 8, 14]


def test_reliability_bins(multiclass):
    p, y = multiclass
    table = metrics.reliability_bins(p, y)
    assert list(table.columns) == ["bin", "lo", "hi", "count", "accuracy", "confidence"]
    assert len(table) == 15 and table["count"].sum() == len(y)
    empty = table["count"] == 0
    assert table.loc[empty, ["accuracy", "confidence"]].isna().all().all()
    full = table[~empty]
    assert ((full["confidence"] > full["lo"]) & (full["confidence"] <= full["hi"])).all()
    ece_from_table = (full["count"] / len(y) * (full["accuracy"] - full["confidence"]).abs()).sum()
    assert metrics.ece(p, y) == pytest.approx(ece_from_table, abs=1e-12)
    assert metrics.mce(p, y) == pytest.approx((full["accuracy"] - full["confidence"]).abs().max(), abs=1e-12)


def test_adaptive_ece_equal_mass_hand_computed():
    conf = np.array([0.9, 0.6, 0.8, 0.7, 0.95])
    p = np.column_stack([conf, 1 - conf])
    y = np.array([0, 1, 0, 0, 1])  # correct: 0.9, 0.8, 0.7
    # sorted conf: 0.6(w) 0.7(c) | 0.8(c) 0.9(c) | 0.95(w)  with 3 equal-mass bins (2, 2, 1)
    expected = (abs(1 - 1.3) + abs(2 - 1.7) + abs(0 - 0.95)) / 5
    assert metrics.adaptive_ece(p, y, n_bins=3) == pytest.approx(expected)


def test_classwise_ece_hand_computed():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    y = np.array([0, 1, 0])
    per_class = []
    for k in range(3):
        s, o = p[:, k], (y == k).astype(float)
        bins = np.clip(np.ceil(s * 2) - 1, 0, 1)  # 2 bins (lo,hi], 0 to the first
        per_class.append(sum(abs(o[bins == b].sum() - s[bins == b].sum()) for b in (0, 1)) / 3)
    assert metrics.classwise_ece(p, y, n_bins=2) == pytest.approx(np.mean(per_class))


# ------------------------------------------------------------------------------------- NLL, logits
def test_nll_from_logits_matches_cross_entropy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    z = rng.normal(size=(50, 4)) * 30  # extreme logits: log-softmax must not overflow
    y = rng.integers(0, 4, 50)
    ref = float(torch.nn.functional.cross_entropy(torch.tensor(z), torch.tensor(y)))
    assert metrics.nll_from_logits(z, y) == pytest.approx(ref, rel=1e-12)
    ref_t = float(torch.nn.functional.cross_entropy(torch.tensor(z / 2.5), torch.tensor(y)))
    assert metrics.nll_from_logits(z, y, temperature=2.5) == pytest.approx(ref_t, rel=1e-12)


def test_nll_is_not_clipped():
    p = np.array([[1.0, 0.0], [0.5, 0.5]])
    assert metrics.nll(p, np.array([1, 0])) == np.inf


def test_binary_logits_from_decision_reproduce_sigmoid():
    d = np.array([-3.0, -0.2, 0.0, 1.5, 7.0])
    logits = metrics.binary_logits_from_decision(d)
    np.testing.assert_allclose(logits, np.column_stack([-d / 2, d / 2]))
    np.testing.assert_allclose(metrics.softmax(logits)[:, 1], expit(d), rtol=1e-12)
    np.testing.assert_allclose(metrics.softmax(logits, temperature=3)[:, 1], expit(d / 3), rtol=1e-12)
    assert metrics.binary_logits_from_decision(d[:, None]).shape == (5, 2)


def test_softmax_rows_sum_to_one_and_temperature_flattens():
    z = np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]])
    p = metrics.softmax(z)
    np.testing.assert_allclose(p.sum(1), 1.0)
    assert metrics.softmax(z, temperature=10).max(1)[0] < p.max(1)[0]


def test_softmax_last_axis_is_the_validated_softmax_over_any_batch_in_the_logits_dtype():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(2, 30, 5)) * 40  # extreme logits: the max is subtracted before exp
    for temperature in (1.0, 2.5):
        p = metrics.softmax_last_axis(z, temperature)
        assert p.shape == z.shape and p.dtype == np.float64
        for r in range(z.shape[0]):
            np.testing.assert_allclose(p[r], metrics.softmax(z[r], temperature), rtol=1e-12, atol=1e-300)
    p32 = metrics.softmax_last_axis(z.astype(np.float32))
    assert p32.dtype == np.float32  # the batched float32 paths stay float32
    np.testing.assert_allclose(p32, metrics.softmax_last_axis(z), rtol=1e-5, atol=1e-6)
    masked = metrics.softmax_last_axis(np.where([True, False, True, True, False], z[0], -np.inf))
    assert (masked[:, [1, 4]] == 0).all()  # -inf: a class that gets probability 0
    np.testing.assert_allclose(masked.sum(-1), 1.0, rtol=1e-12)
    assert metrics.softmax_last_axis(np.array([[1, 2, 3]])).dtype == np.float64  # integer logits
    assert not np.shares_memory(z, metrics.softmax_last_axis(z))  # the caller's logits are not overwritten
    with pytest.raises(FmauditInputError, match="temperature"):
        metrics.softmax_last_axis(z, temperature=0.0)


# ----------------------------------------------------------------------------- selective prediction
def test_aurc_hand_computed_without_ties():
    conf = np.array([0.9, 0.8, 0.7])
    p = np.column_stack([conf, 1 - conf])
    y = np.array([0, 1, 0])  # correct, wrong, correct by confidence order
    assert metrics.aurc(p, y) == pytest.approx((0 + 1 / 2 + 1 / 3) / 3)
    assert metrics.eaurc(p, y) == pytest.approx((0 + 1 / 2 + 1 / 3) / 3 - (0 + 0 + 1 / 3) / 3)


def test_aurc_averages_ties():
    p = np.array([[0.7, 0.3], [0.7, 0.3]])
    y = np.array([0, 1])  # same confidence, one right one wrong
    assert metrics.aurc(p, y) == pytest.approx(0.5)
    assert metrics.eaurc(p, y) == pytest.approx(0.5 - 0.25)
    assert metrics.selective_accuracy(p, y, coverage=0.5) == pytest.approx(0.5)


def test_aurc_degenerate_cases():
    p, y = _random_probs(60, 3, seed=5)
    right = p.argmax(1)
    assert metrics.aurc(p, right) == 0.0 and metrics.eaurc(p, right) == 0.0
    wrong = (right + 1) % 3
    assert metrics.aurc(p, wrong) == pytest.approx(1.0)
    assert metrics.eaurc(p, wrong) == pytest.approx(0.0)


def test_selective_accuracy():
    conf = np.array([0.95, 0.9, 0.8, 0.6])
    p = np.column_stack([conf, 1 - conf])
    y = np.array([0, 1, 0, 1])  # correct, wrong, correct, wrong
    assert metrics.selective_accuracy(p, y, 1.0) == pytest.approx(metrics.accuracy(p, y))
    assert metrics.selective_accuracy(p, y, 0.25) == 1.0
    assert metrics.selective_accuracy(p, y, 0.5) == 0.5
    assert metrics.selective_accuracy(p, y, 0.01) == 1.0  # at least one item is kept


# ----------------------------------------------------------------------------------------- collapse
def test_degeneracy_and_collapse():
    p = np.tile([0.6, 0.4], (200, 1))
    assert metrics.degeneracy_share(p) == 1.0 and metrics.is_collapsed(p)
    p[:3] = [0.1, 0.9]
    assert metrics.degeneracy_share(p) == pytest.approx(197 / 200)
    assert not metrics.is_collapsed(p)
    assert metrics.is_collapsed(p, threshold=0.98)


# ------------------------------------------------------------------------------------------ summary
def test_summary_metrics_keys_and_values(multiclass):
    p, y = multiclass
    summary = metrics.summary_metrics(p, y)
    assert list(summary) == [
        "accuracy", "macro_f1", "balanced_accuracy", "auroc_ovr_macro", "nll", "brier_sum",
        "ece_top_15_lohi", "adaptive_ece_15_equalmass", "classwise_ece_15", "mce_15", "aurc", "eaurc",
        "degeneracy_share", "collapsed",
    ]  # fmt: skip
    assert set(metrics.CONVENTIONS) == set(summary)
    assert all(isinstance(v, float) for v in summary.values())
    assert summary["ece_top_15_lohi"] == metrics.ece(p, y)
    assert summary["auroc_ovr_macro"] == metrics.auroc(p, y)
    assert summary["adaptive_ece_15_equalmass"] == metrics.adaptive_ece(p, y)
    assert summary["classwise_ece_15"] == metrics.classwise_ece(p, y)
    assert summary["eaurc"] == metrics.eaurc(p, y)
    assert summary["collapsed"] == 0.0


def test_summary_metrics_key_names_follow_n_bins(multiclass):
    p, y = multiclass
    summary = metrics.summary_metrics(p, y, n_bins=10)
    assert {"ece_top_10_lohi", "adaptive_ece_10_equalmass", "classwise_ece_10", "mce_10"} <= set(summary)
    assert summary["ece_top_10_lohi"] == metrics.ece(p, y, n_bins=10)
    assert set(metrics.metric_conventions(10)) == set(summary)


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "probs, labels, match",
    [
        (np.array([[0.5, np.nan], [0.5, 0.5]]), [0, 1], "non-finite"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0, 1, 1], "length 3"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0, 2], "outside 0..1"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [-1, 0], "outside 0..1"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0.0, 0.5], "non-integer"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0, np.nan], "NaN"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), ["a", "b"], "not integer"),
        (np.array([[0.6, 0.5], [0.5, 0.5]]), [0, 1], "sum to 1"),
        (np.array([[2.0, -1.0], [0.5, 0.5]]), [0, 1], "negative"),
        (np.array([0.5, 0.5]), [0], "2-D"),
        (np.ones((2, 1)), [0, 0], "at least 2 classes"),
    ],
)
def test_bad_input_raises(probs, labels, match):
    with pytest.raises(FmauditInputError, match=match):
        metrics.ece(probs, labels)
    with pytest.raises(FmauditInputError):
        metrics.summary_metrics(probs, labels)


def test_probability_sum_tolerance_is_1e_4():
    p = np.array([[0.5 + 5e-5, 0.5], [0.5, 0.5]])
    metrics.accuracy(p, [0, 1])  # within tolerance
    with pytest.raises(FmauditInputError, match="sum to 1"):
        metrics.accuracy(np.array([[0.5 + 5e-4, 0.5], [0.5, 0.5]]), [0, 1])


def test_bad_options_raise(multiclass):
    p, y = multiclass
    with pytest.raises(FmauditInputError, match="closure"):
        metrics.ece(p, y, closure="[lo,hi]")
    with pytest.raises(FmauditInputError, match="n_bins"):
        metrics.ece(p, y, n_bins=0)
    with pytest.raises(FmauditInputError, match="coverage"):
        metrics.selective_accuracy(p, y, coverage=0.0)
    with pytest.raises(FmauditInputError, match="temperature"):
        metrics.softmax(np.zeros((2, 2)), temperature=0.0)
    with pytest.raises(FmauditInputError, match="non-finite"):
        metrics.nll_from_logits(np.array([[np.inf, 0.0]]), [0])
