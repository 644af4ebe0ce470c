"""Selective prediction (docs/methods.md#selective-prediction): the risk-coverage curve's area (AURC), its excess
over the optimum (E-AURC) and the accuracy at a coverage, tied confidences averaged."""

from __future__ import annotations

from typing import Any

import numpy as np

from fmaudit.io import FmauditInputError
from fmaudit.metrics.calibration_metrics import _top_label
from fmaudit.metrics.validation import validate_probs_labels


# --------------------------------------------------------------------------------------------------
# selective prediction
# --------------------------------------------------------------------------------------------------
def _ranked_correct(conf: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Correctness ordered from most to least confident; tied confidences share their mean correctness."""
    order = np.argsort(-conf, kind="stable")
    ranked = correct[order].astype(np.float64)
    _, tie = np.unique(conf[order], return_inverse=True)
    return (np.bincount(tie, weights=ranked) / np.bincount(tie))[tie]


def _aurc_from_ranked(ranked: np.ndarray) -> float:
    k = np.arange(1, len(ranked) + 1)
    return float((1.0 - np.cumsum(ranked) / k).mean())


def aurc(probs: Any, labels: Any) -> float:
    """Area under the risk-coverage curve with uncertainty ``1 - conf``: the mean, over k = 1..N, of the
    error rate among the k most confident predictions (ties averaged).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        AURC in [0, 1], raw (not x1000); lower is better (docs/methods.md#selective-prediction).

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    conf, _, correct = _top_label(p, y)
    return _aurc_from_ranked(_ranked_correct(conf, correct))


def _eaurc_from_top_label(conf: np.ndarray, correct: np.ndarray) -> float:
    optimum = _aurc_from_ranked(np.sort(correct.astype(np.float64))[::-1])
    return _aurc_from_ranked(_ranked_correct(conf, correct)) - optimum


def eaurc(probs: Any, labels: Any) -> float:
    """Excess AURC: AURC minus the discrete optimum AURC* (all correct predictions ranked first).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        E-AURC, >= 0; 0 means confidence ranks every correct prediction first.

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    conf, _, correct = _top_label(p, y)
    return _eaurc_from_top_label(conf, correct)


def selective_accuracy(probs: Any, labels: Any, coverage: float) -> float:
    """Accuracy over the ``max(1, round(coverage * N))`` most confident predictions (ties averaged).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    coverage : float
        Share of items kept, in (0, 1]; the most confident are kept.

    Returns
    -------
    float
        Accuracy of the retained predictions, in [0, 1].

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it, or when
        ``coverage`` lies outside (0, 1].
    """
    if not 0.0 < coverage <= 1.0:
        raise FmauditInputError(f"coverage: must lie in (0, 1], got {coverage!r}")
    p, y = validate_probs_labels(probs, labels)
    conf, _, correct = _top_label(p, y)
    ranked = _ranked_correct(conf, correct)
    k = max(1, int(round(coverage * len(ranked))))
    return float(ranked[:k].mean())
