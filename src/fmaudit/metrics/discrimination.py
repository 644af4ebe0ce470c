"""Metrics of the argmax prediction (docs/methods.md#discrimination-metrics): confusion counts, accuracy, macro
F1, balanced accuracy, QWK, one-vs-rest AUROC, and the collapse of every prediction onto one class."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fmaudit.metrics.validation import validate_probs, validate_probs_labels

logger = logging.getLogger(__name__)

COLLAPSE_THRESHOLD = 0.99


# --------------------------------------------------------------------------------------------------
# discrimination
# --------------------------------------------------------------------------------------------------
def confusion_counts(labels: np.ndarray, pred: np.ndarray, n_classes: int) -> np.ndarray:
    """(K, K) confusion matrix, rows = true class, columns = predicted class.

    Parameters
    ----------
    labels : ndarray of shape (N,)
        True class indices in 0..n_classes-1 (not validated here).
    pred : ndarray of shape (N,)
        Predicted class indices in 0..n_classes-1.
    n_classes : int
        K, the number of classes (rows and columns of the result).

    Returns
    -------
    ndarray of int64, shape (K, K)
        ``cm[i, j]`` is the number of items of true class i predicted as j.
    """
    flat = np.asarray(labels, dtype=np.int64) * n_classes + np.asarray(pred, dtype=np.int64)
    return np.bincount(flat, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def accuracy(probs: Any, labels: Any) -> float:
    """Share of argmax predictions equal to the label.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        Share of items whose argmax equals the label, in [0, 1].

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    return float((p.argmax(axis=1) == y).mean())


def macro_f1(probs: Any, labels: Any) -> float:
    """Macro F1 of the argmax over all K classes (sklearn ``f1_score(average="macro", labels=range(K),
    zero_division=0)``): a class never true and never predicted scores 0.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        Unweighted mean F1 over all K classes, in [0, 1] (a class never true nor predicted scores 0).

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    return _macro_f1_from_confusion(confusion_counts(y, p.argmax(axis=1), p.shape[1]))


def _macro_f1_from_confusion(cm: np.ndarray) -> float:
    tp = np.diag(cm).astype(np.float64)
    denom = cm.sum(axis=0) + cm.sum(axis=1)
    f1 = np.divide(2.0 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return float(f1.mean())


def balanced_accuracy(probs: Any, labels: Any) -> float:
    """Mean per-class recall over the classes present in ``labels`` (sklearn ``balanced_accuracy_score``).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        Mean recall over the classes present, in [0, 1].

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    return _balanced_accuracy_from_confusion(confusion_counts(y, p.argmax(axis=1), p.shape[1]))


def _balanced_accuracy_from_confusion(cm: np.ndarray) -> float:
    true = cm.sum(axis=1)
    present = true > 0
    return float((np.diag(cm)[present] / true[present]).mean())


def qwk(probs: Any, labels: Any) -> float:
    """Quadratic weighted kappa of the argmax over the ordinal labels 0..K-1 (sklearn
    ``cohen_kappa_score(weights="quadratic", labels=range(K))``); NaN when undefined (expected
    disagreement 0, e.g. both vectors hold a single class).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        Kappa in [-1, 1], or NaN when undefined.

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    return _qwk_from_confusion(confusion_counts(y, p.argmax(axis=1), p.shape[1]))


def _qwk_from_confusion(cm: np.ndarray) -> float:
    k = cm.shape[0]
    cm = cm.astype(np.float64)
    expected = np.outer(cm.sum(axis=1), cm.sum(axis=0)) / cm.sum()
    weights = (np.arange(k)[:, None] - np.arange(k)[None, :]) ** 2
    denom = float((weights * expected).sum())
    if denom == 0.0:
        return float("nan")
    return float(1.0 - (weights * cm).sum() / denom)


def _binary_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Mann-Whitney AUC with ties counted 1/2 (midranks)."""
    from scipy.stats import rankdata

    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    ranks = rankdata(scores, method="average")
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def auroc(probs: Any, labels: Any) -> float:
    """Macro one-vs-rest AUROC (sklearn ``roc_auc_score(multi_class="ovr", average="macro")``).

    Binary tasks use ``probs[:, 1]``. NaN, with a logged warning, if any class is absent from ``labels``.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        Macro AUROC in [0, 1] (0.5 is chance), or NaN when a class is absent.

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    return _auroc(p, y)


def _auroc(p: np.ndarray, y: np.ndarray) -> float:
    k = p.shape[1]
    present = np.bincount(y, minlength=k) > 0
    if not present.all():
        missing = np.flatnonzero(~present).tolist()
        logger.warning("AUROC undefined: class(es) %s absent from labels (N = %d); returning NaN", missing, len(y))
        return float("nan")
    if k == 2:
        return _binary_auc(p[:, 1], y == 1)
    return float(np.mean([_binary_auc(p[:, c], y == c) for c in range(k)]))


# --------------------------------------------------------------------------------------------------
# collapse
# --------------------------------------------------------------------------------------------------
def degeneracy_share(probs: Any) -> float:
    """Largest share of items predicted as one class: ``max_k count(pred == k) / N``.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, rows summing to 1.

    Returns
    -------
    float
        In [1/K, 1]; 1 means every item gets the same argmax class.

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows.
    """
    p = validate_probs(probs)
    return float(np.bincount(p.argmax(axis=1), minlength=p.shape[1]).max() / p.shape[0])


def is_collapsed(probs: Any, threshold: float = COLLAPSE_THRESHOLD) -> bool:
    """True when the degeneracy share exceeds ``threshold`` (PRISM: 0.99).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, rows summing to 1.
    threshold : float, default 0.99
        Degeneracy share above which the predictions count as collapsed (:data:`COLLAPSE_THRESHOLD`).

    Returns
    -------
    bool
    """
    return degeneracy_share(probs) > threshold
