"""Calibration metrics, as docs/methods.md#calibration groups them: the equal-width bins and their closure, the
top-label ECE and its variants (adaptive, classwise, PRISM's), MCE, the reliability-diagram table, NLL and Brier."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.metrics.validation import validate_probs_labels

CLOSURE_RIGHT = "(lo,hi]"
CLOSURE_LEFT = "[lo,hi)"
CLOSURES = (CLOSURE_RIGHT, CLOSURE_LEFT)
DEFAULT_N_BINS = 15


def _check_closure(closure: str) -> str:
    if closure not in CLOSURES:
        raise FmauditInputError(f"closure: expected one of {CLOSURES}, got {closure!r}")
    return closure


def _check_n_bins(n_bins: int) -> int:
    if int(n_bins) != n_bins or n_bins < 1:
        raise FmauditInputError(f"n_bins: expected a positive integer, got {n_bins!r}")
    return int(n_bins)


# --------------------------------------------------------------------------------------------------
# binning
# --------------------------------------------------------------------------------------------------
def bin_indices(values: np.ndarray, n_bins: int = DEFAULT_N_BINS, closure: str = CLOSURE_RIGHT) -> np.ndarray:
    """Equal-width bin index in 0..n_bins-1 of each value in [0, 1].

    ``(lo,hi]``: a value equal to an inner edge goes to the bin below it, and 0 goes to bin 0.
    ``[lo,hi)``: a value equal to an inner edge goes to the bin above it, and 1 goes to the last bin.
    Edges are ``np.linspace(0, 1, n_bins + 1)``.

    Parameters
    ----------
    values : ndarray of shape (N,)
        Scores in [0, 1] (confidences or class probabilities); values outside are clipped to the end bins.
    n_bins : int, default 15
        Number of equal-width confidence bins on [0, 1] (a positive integer).
    closure : {"(lo,hi]", "[lo,hi)"}, default "(lo,hi]"
        Which side of a bin is closed (:data:`CLOSURE_RIGHT`, the project's, or :data:`CLOSURE_LEFT`); see
        :func:`bin_indices`.

    Returns
    -------
    ndarray of int64, shape (N,)
        The bin of each value, 0..n_bins-1.

    Raises
    ------
    FmauditInputError
        When ``n_bins`` is not a positive integer or ``closure`` is not one of :data:`CLOSURES`.
    """
    n_bins = _check_n_bins(n_bins)
    _check_closure(closure)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    values = np.asarray(values, dtype=np.float64)
    side = "left" if closure == CLOSURE_RIGHT else "right"
    idx = np.searchsorted(edges, values, side=side) - 1
    return np.clip(idx, 0, n_bins - 1)


def _bin_sums(
    scores: np.ndarray, outcomes: np.ndarray, n_bins: int, closure: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin: item count, sum of scores, sum of outcomes."""
    idx = bin_indices(scores, n_bins, closure)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    sum_score = np.bincount(idx, weights=scores, minlength=n_bins)
    sum_outcome = np.bincount(idx, weights=outcomes.astype(np.float64), minlength=n_bins)
    return count, sum_score, sum_outcome


def _ece_from_scores(scores: np.ndarray, outcomes: np.ndarray, n_bins: int, closure: str) -> float:
    # sum_b (n_b/N)|acc_b - conf_b| == sum_b |sum outcome_b - sum score_b| / N
    count, sum_score, sum_outcome = _bin_sums(scores, outcomes, n_bins, closure)
    return float(np.abs(sum_outcome - sum_score).sum() / len(scores))


def _top_label(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pred = probs.argmax(axis=1)
    conf = probs[np.arange(len(pred)), pred]
    return conf, pred, pred == labels


# --------------------------------------------------------------------------------------------------
# calibration
# --------------------------------------------------------------------------------------------------
def ece(probs: Any, labels: Any, n_bins: int = DEFAULT_N_BINS, closure: str = CLOSURE_RIGHT) -> float:
    """Top-label expected calibration error with ``n_bins`` equal-width bins; denominator N.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    n_bins : int, default 15
        Number of equal-width confidence bins on [0, 1] (a positive integer).
    closure : {"(lo,hi]", "[lo,hi)"}, default "(lo,hi]"
        Which side of a bin is closed (:data:`CLOSURE_RIGHT`, the project's, or :data:`CLOSURE_LEFT`); see
        :func:`bin_indices`.

    Returns
    -------
    float
        ECE in [0, 1] (docs/methods.md#top-label-ece).

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows, ``labels`` do not match it,
        ``n_bins`` is not a positive integer or ``closure`` is not one of :data:`CLOSURES`.
    """
    p, y = validate_probs_labels(probs, labels)
    conf, _, correct = _top_label(p, y)
    return _ece_from_scores(conf, correct, _check_n_bins(n_bins), _check_closure(closure))


def prism_ece(probs: Any, labels: Any, n_bins: int = DEFAULT_N_BINS) -> float:
    """PRISM's fixed-width ECE (``prism_bench.metrics.compute_ece(..., binning="fixed")``), for comparing with
    PRISM's published numbers; not the project's ECE.

    Bins are ``np.linspace(0, 1, n_bins + 1)`` closed on the left, ``conf >= lo & conf < hi``, so a confidence
    of exactly 1.0 falls in no bin but still counts in the denominator N. For two columns the "confidence" is
    p(class 1) and the "accuracy" is ``label == 1`` (PRISM's binary form, not top-label); for more, top-label
    confidence against argmax correctness.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    n_bins : int, default 15
        Number of equal-width confidence bins on [0, 1] (a positive integer).

    Returns
    -------
    float
        ECE in [0, 1] under PRISM's convention (docs/methods.md#prisms-ece).

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows, ``labels`` do not match it, or
        ``n_bins`` is not a positive integer.
    """
    p, y = validate_probs_labels(probs, labels)
    return _prism_ece(p, y, _check_n_bins(n_bins))


def _prism_ece(p: np.ndarray, y: np.ndarray, n_bins: int) -> float:
    if p.shape[1] == 2:
        conf, outcome = p[:, 1], (y == 1)
    else:
        conf, _, outcome = _top_label(p, y)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.searchsorted(edges, conf, side="right") - 1  # edges[i] <= conf < edges[i + 1]
    kept = idx < n_bins  # conf == 1.0 is in no bin
    sum_conf = np.bincount(idx[kept], weights=conf[kept], minlength=n_bins)
    sum_outcome = np.bincount(idx[kept], weights=outcome[kept].astype(np.float64), minlength=n_bins)
    return float(np.abs(sum_outcome - sum_conf).sum() / len(conf))


def mce(probs: Any, labels: Any, n_bins: int = DEFAULT_N_BINS, closure: str = CLOSURE_RIGHT) -> float:
    """Maximum calibration error: the largest |accuracy - confidence| over non-empty equal-width bins.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    n_bins : int, default 15
        Number of equal-width confidence bins on [0, 1] (a positive integer).
    closure : {"(lo,hi]", "[lo,hi)"}, default "(lo,hi]"
        Which side of a bin is closed (:data:`CLOSURE_RIGHT`, the project's, or :data:`CLOSURE_LEFT`); see
        :func:`bin_indices`.

    Returns
    -------
    float
        MCE in [0, 1].

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows, ``labels`` do not match it,
        ``n_bins`` is not a positive integer or ``closure`` is not one of :data:`CLOSURES`.
    """
    p, y = validate_probs_labels(probs, labels)
    conf, _, correct = _top_label(p, y)
    return _mce_from_top_label(conf, correct, _check_n_bins(n_bins), _check_closure(closure))


def _mce_from_top_label(conf: np.ndarray, correct: np.ndarray, n_bins: int, closure: str) -> float:
    count, sum_conf, sum_correct = _bin_sums(conf, correct, n_bins, closure)
    nonempty = count > 0
    return float(np.max(np.abs(sum_correct[nonempty] - sum_conf[nonempty]) / count[nonempty]))


def adaptive_ece(probs: Any, labels: Any, n_bins: int = DEFAULT_N_BINS) -> float:
    """Equal-mass top-label ECE (docs/methods.md#adaptive-ece).

    Confidences are sorted (stable sort, so tied items keep their input order) and split into ``n_bins``
    near-equal-count parts with ``np.array_split``; each part is weighted by its share of N.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    n_bins : int, default 15
        Number of equal-count bins (a positive integer).

    Returns
    -------
    float
        Adaptive ECE in [0, 1].

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows, ``labels`` do not match it, or
        ``n_bins`` is not a positive integer.
    """
    p, y = validate_probs_labels(probs, labels)
    conf, _, correct = _top_label(p, y)
    return _adaptive_ece_from_top_label(conf, correct, _check_n_bins(n_bins))


def _adaptive_ece_from_top_label(conf: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for part in np.array_split(order, n_bins):
        if part.size:
            total += abs(correct[part].sum() - conf[part].sum())
    return float(total / len(conf))


def classwise_ece(
    probs: Any, labels: Any, n_bins: int = DEFAULT_N_BINS, closure: str = CLOSURE_RIGHT
) -> float:
    """Classwise ECE (Kull 2019): mean over the K classes of the binned ECE of ``probs[:, k]`` against
    ``labels == k``, with equal-width bins.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    n_bins : int, default 15
        Number of equal-width confidence bins on [0, 1] (a positive integer).
    closure : {"(lo,hi]", "[lo,hi)"}, default "(lo,hi]"
        Which side of a bin is closed (:data:`CLOSURE_RIGHT`, the project's, or :data:`CLOSURE_LEFT`); see
        :func:`bin_indices`.

    Returns
    -------
    float
        Classwise ECE in [0, 1] (docs/methods.md#classwise-ece).

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows, ``labels`` do not match it,
        ``n_bins`` is not a positive integer or ``closure`` is not one of :data:`CLOSURES`.
    """
    p, y = validate_probs_labels(probs, labels)
    return _classwise_ece(p, y, _check_n_bins(n_bins), _check_closure(closure))


def _classwise_ece(p: np.ndarray, y: np.ndarray, n_bins: int, closure: str) -> float:
    k = p.shape[1]
    return float(np.mean([_ece_from_scores(p[:, c], y == c, n_bins, closure) for c in range(k)]))


def reliability_bins(
    probs: Any, labels: Any, n_bins: int = DEFAULT_N_BINS, closure: str = CLOSURE_RIGHT
) -> pd.DataFrame:
    """Reliability-diagram table, one row per equal-width bin.

    Columns: bin, lo, hi, count, accuracy, confidence (mean top-label confidence); accuracy and confidence
    are NaN for empty bins.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    n_bins : int, default 15
        Number of equal-width confidence bins on [0, 1] (a positive integer).
    closure : {"(lo,hi]", "[lo,hi)"}, default "(lo,hi]"
        Which side of a bin is closed (:data:`CLOSURE_RIGHT`, the project's, or :data:`CLOSURE_LEFT`); see
        :func:`bin_indices`.

    Returns
    -------
    DataFrame
        ``n_bins`` rows: ``bin`` (0..n_bins-1), ``lo``, ``hi`` (bin edges), ``count`` (items in the bin),
        ``accuracy`` (share correct) and ``confidence`` (mean top-label confidence).

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows, ``labels`` do not match it,
        ``n_bins`` is not a positive integer or ``closure`` is not one of :data:`CLOSURES`.
    """
    p, y = validate_probs_labels(probs, labels)
    n_bins, closure = _check_n_bins(n_bins), _check_closure(closure)
    conf, _, correct = _top_label(p, y)
    count, sum_conf, sum_correct = _bin_sums(conf, correct, n_bins, closure)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(count > 0, sum_correct / count, np.nan)
        mean_conf = np.where(count > 0, sum_conf / count, np.nan)
    return pd.DataFrame(
        {
            "bin": np.arange(n_bins),
            "lo": edges[:-1],
            "hi": edges[1:],
            "count": count.astype(np.int64),
            "accuracy": acc,
            "confidence": mean_conf,
        }
    )


# --------------------------------------------------------------------------------------------------
# proper scores
# --------------------------------------------------------------------------------------------------
def nll(probs: Any, labels: Any) -> float:
    """Mean negative log-probability of the true class, natural log, no clipping (0 gives inf).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        Mean NLL in nats, in [0, inf] (docs/methods.md#nll-and-brier-score).

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    return _nll(p, y)


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    with np.errstate(divide="ignore"):
        return float(-np.log(p[np.arange(len(y)), y]).mean())


def brier(probs: Any, labels: Any) -> float:
    """Multiclass Brier score, sum form: ``mean_i sum_k (p_ik - 1[y_i = k])^2``, range [0, 2].

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).

    Returns
    -------
    float
        Brier score in [0, 2].

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    return _brier(p, y)


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    sq = (p**2).sum(axis=1) - 2.0 * p[np.arange(len(y)), y] + 1.0
    return float(sq.mean())
