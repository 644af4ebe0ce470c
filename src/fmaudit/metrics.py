"""Classification, calibration and selective-prediction metrics on predicted probabilities.

Every public metric takes ``probs`` of shape (N, K) (rows are probability vectors) and integer ``labels``
of shape (N,) with values in 0..K-1, validates them and returns a float. The conventions follow
docs/methods.md (docs/methods.md#calibration, docs/methods.md#discrimination-metrics,
docs/methods.md#selective-prediction, docs/methods.md#composite-indices-cri-cra-and-crt); :data:`CONVENTIONS`
states them in words for report captions.

Notation: ``conf = probs.max(1)``; ``pred = probs.argmax(1)`` (ties go to the lowest class index, as numpy);
``correct = pred == labels``.

Project defaults, and where other implementations differ:

- ECE uses equal-width bins on [0, 1] closed on the right, ``(lo, hi]`` (Guo 2017, gpleiss
  ``_ECELoss``, the audit paper); torchmetrics, netcal and PRISM use ``[lo, hi)``. The two agree unless a
  confidence falls exactly on a bin edge. With ``(lo, hi]`` a value of exactly 0 goes to the first bin,
  with ``[lo, hi)`` a value of exactly 1 goes to the last bin, so no item is ever left out. The
  denominator is always N and empty bins contribute 0.
- ECE is top-label for binary tasks too (confidence ``max(p, 1-p)``), unlike torchmetrics
  ``BinaryCalibrationError`` and netcal, which use p(class 1).
- Adaptive ECE is equal-mass: the confidences are sorted (stable) and split into ``n_bins`` near-equal
  parts with ``np.array_split`` (docs/methods.md#adaptive-ece).
- NLL is not clipped: a zero probability on the true class gives ``inf``. sklearn ``log_loss`` clips.
- Brier is the multiclass sum form, range [0, 2]; for binary tasks it is twice sklearn's binary Brier.
- AUROC is the macro mean of one-vs-rest AUCs with ties counted 1/2; binary tasks use ``probs[:, 1]``.
  It is NaN (with a logged warning) when a class is absent from ``labels``.
- AURC averages the correctness of tied confidences (expected value over a random order within a tie);
  E-AURC subtracts the discrete optimum (every correct prediction ranked first).
- Novelty detection (``detection_auroc``, ``fpr_at_tpr``) takes two 1-D score arrays, ID and OOD; OOD is the
  positive class and a higher score means more out-of-distribution (docs/methods.md#novelty-scorers).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError

logger = logging.getLogger(__name__)

CLOSURE_RIGHT = "(lo,hi]"
CLOSURE_LEFT = "[lo,hi)"
CLOSURES = (CLOSURE_RIGHT, CLOSURE_LEFT)
DEFAULT_N_BINS = 15
PROB_SUM_TOLERANCE = 1e-4
COLLAPSE_THRESHOLD = 0.99

__all__ = [
    "CONVENTIONS",
    "CLOSURES",
    "accuracy",
    "adaptive_ece",
    "aurc",
    "auroc",
    "balanced_accuracy",
    "binary_logits_from_decision",
    "bin_indices",
    "binned_metric_columns",
    "brier",
    "classwise_ece",
    "confusion_counts",
    "degeneracy_share",
    "detection_auroc",
    "ece",
    "eaurc",
    "ece_column",
    "ece_convention",
    "float_array",
    "fpr_at_tpr",
    "is_collapsed",
    "log_softmax",
    "macro_f1",
    "mce",
    "metric_conventions",
    "nll",
    "nll_from_logits",
    "prism_ece",
    "prism_ece_column",
    "qwk",
    "reject_missing_labels",
    "reliability_bins",
    "selective_accuracy",
    "softmax",
    "summary_metric_keys",
    "summary_metrics",
    "validate_labels",
    "validate_logits",
    "validate_probs",
    "validate_probs_labels",
]


# --------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------
def float_array(values: Any, name: str, ndim: int, what: str) -> np.ndarray:
    """``values`` as a float64 array of ``ndim`` dimensions; the error names ``name`` and says ``what`` was
    expected (e.g. ``"array (N, K)"``). Finite values and sizes are the caller's to check.

    Parameters
    ----------
    values : array-like
        Anything ``np.asarray(..., dtype=float64)`` accepts.
    name : str
        The argument's name, quoted in the error message.
    ndim : int
        The number of dimensions required.
    what : str
        What was expected, in words, for the error message (e.g. ``"array (N, K)"``).

    Returns
    -------
    ndarray of float64
        ``values`` converted, with ``ndim`` dimensions.

    Raises
    ------
    FmauditInputError
        When ``values`` cannot be converted to floats or has another number of dimensions.
    """
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise FmauditInputError(f"{name}: cannot convert to a float array ({err})") from err
    if arr.ndim != ndim:
        raise FmauditInputError(f"{name}: expected a {ndim}-D {what}, got shape {arr.shape}")
    return arr


def reject_missing_labels(labels: np.ndarray, name: str) -> None:
    """Raise FmauditInputError naming the first missing label (NaN in a float array, None in an object array).

    Parameters
    ----------
    labels : ndarray of shape (N,)
        Labels as read from a table: any dtype; NaN (float) and None (object) mean missing.
    name : str
        The column or argument name quoted in the error.

    Raises
    ------
    FmauditInputError
        When a label is missing; the message gives the first such row.
    """
    if labels.dtype.kind == "f" and not np.isfinite(labels).all():
        raise FmauditInputError(f"{name}: NaN label at row {int(np.flatnonzero(~np.isfinite(labels))[0])} (missing)")
    if labels.dtype == object and any(v is None for v in labels):
        raise FmauditInputError(f"{name}: None label at row {[v is None for v in labels].index(True)} (missing)")


def _as_2d_float(values: Any, name: str) -> np.ndarray:
    arr = float_array(values, name, 2, "array (N, K)")
    if arr.shape[0] == 0:
        raise FmauditInputError(f"{name}: no rows (N = 0)")
    if arr.shape[1] < 2:
        raise FmauditInputError(f"{name}: need at least 2 classes (columns), got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        row = int(np.argwhere(bad)[0, 0])
        raise FmauditInputError(f"{name}: {int(bad.sum())} non-finite value(s) (NaN/inf), first at row {row}")
    return arr


def validate_probs(probs: Any, name: str = "probs", sum_tolerance: float = PROB_SUM_TOLERANCE) -> np.ndarray:
    """Return ``probs`` as a float64 (N, K) array after checking it holds probability vectors.

    Raises FmauditInputError on a wrong shape, non-finite or negative values, or rows that do not sum to 1
    within ``sum_tolerance``.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Candidate probabilities, N >= 1 items and K >= 2 classes.
    name : str, default "probs"
        The argument's name, quoted in error messages.
    sum_tolerance : float, default 1e-4
        Largest allowed ``|row sum - 1|``.

    Returns
    -------
    ndarray of float64, shape (N, K)
        ``probs`` converted (a copy only when conversion needs one).
    """
    arr = _as_2d_float(probs, name)
    if (arr < 0).any():
        row = int(np.argwhere(arr < 0)[0, 0])
        raise FmauditInputError(f"{name}: negative probability at row {row}")
    sums = arr.sum(axis=1)
    off = np.abs(sums - 1.0) > sum_tolerance
    if off.any():
        row = int(np.flatnonzero(off)[0])
        raise FmauditInputError(
            f"{name}: {int(off.sum())} row(s) do not sum to 1 within {sum_tolerance:g} "
            f"(row {row} sums to {sums[row]:.6g}); pass probabilities, not logits"
        )
    return arr


def validate_logits(logits: Any, name: str = "logits") -> np.ndarray:
    """Return ``logits`` as a float64 (N, K) array; raises on a wrong shape or non-finite values.

    Parameters
    ----------
    logits : array-like of shape (N, K)
        Unnormalised class scores, N >= 1 items and K >= 2 classes, all finite.
    name : str, default "logits"
        The argument's name, quoted in error messages.

    Returns
    -------
    ndarray of float64, shape (N, K)

    Raises
    ------
    FmauditInputError
        On a wrong shape, no rows, fewer than 2 columns or a NaN/inf value (the message gives its row).
    """
    return _as_2d_float(logits, name)


def validate_labels(labels: Any, n_items: int, n_classes: int, name: str = "labels") -> np.ndarray:
    """Return ``labels`` as an int64 (N,) array of class indices in 0..n_classes-1.

    Parameters
    ----------
    labels : array-like of shape (N,)
        Class indices: integers, bools, or floats holding whole numbers.
    n_items : int
        Number of rows of the scores the labels go with; ``labels`` must have this length.
    n_classes : int
        K, the number of score columns; every label must lie in 0..K-1.
    name : str, default "labels"
        The argument's name, quoted in error messages.

    Returns
    -------
    ndarray of int64, shape (N,)

    Raises
    ------
    FmauditInputError
        On a wrong shape or length, a missing or non-integer value, a non-numeric dtype (class names must be
        mapped to indices first) or a value outside 0..K-1.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise FmauditInputError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    if arr.shape[0] != n_items:
        raise FmauditInputError(f"{name}: length {arr.shape[0]} does not match the {n_items} rows of the scores")
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise FmauditInputError(f"{name}: contains NaN/inf (missing labels?)")
        if (arr != np.round(arr)).any():
            raise FmauditInputError(f"{name}: non-integer values; labels must be class indices 0..K-1")
        arr = arr.astype(np.int64)
    elif arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)
    else:
        raise FmauditInputError(
            f"{name}: dtype {arr.dtype} is not integer; map class names to indices 0..K-1 first"
        )
    if arr.size and (arr.min() < 0 or arr.max() >= n_classes):
        bad = int(arr[(arr < 0) | (arr >= n_classes)][0])
        raise FmauditInputError(f"{name}: value {bad} outside 0..{n_classes - 1} (K = {n_classes} columns)")
    return arr


def validate_probs_labels(
    probs: Any, labels: Any, sum_tolerance: float = PROB_SUM_TOLERANCE
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (probs, labels) pair; returns (float64 (N, K), int64 (N,)).

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    sum_tolerance : float, default 1e-4
        Largest allowed ``|row sum - 1|`` of ``probs``.

    Returns
    -------
    probs : ndarray of float64, shape (N, K)
    labels : ndarray of int64, shape (N,)

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p = validate_probs(probs, sum_tolerance=sum_tolerance)
    y = validate_labels(labels, p.shape[0], p.shape[1])
    return p, y


def _check_closure(closure: str) -> str:
    if closure not in CLOSURES:
        raise FmauditInputError(f"closure: expected one of {CLOSURES}, got {closure!r}")
    return closure


def _check_n_bins(n_bins: int) -> int:
    if int(n_bins) != n_bins or n_bins < 1:
        raise FmauditInputError(f"n_bins: expected a positive integer, got {n_bins!r}")
    return int(n_bins)


# --------------------------------------------------------------------------------------------------
# logits
# --------------------------------------------------------------------------------------------------
def log_softmax(logits: Any, temperature: float = 1.0) -> np.ndarray:
    """Row-wise ``log softmax(logits / temperature)``, computed stably (no clipping).

    Parameters
    ----------
    logits : array-like of shape (N, K)
        Finite unnormalised class scores (validated as by :func:`validate_logits`).
    temperature : float, default 1.0
        Divisor of the logits, > 0; above 1 flattens the distribution (docs/methods.md#temperature-scaling).

    Returns
    -------
    ndarray of float64, shape (N, K)
        Log-probabilities; ``exp`` of each row sums to 1.

    Raises
    ------
    FmauditInputError
        When ``temperature`` is not > 0 or the logits are not a finite (N, K) array.
    """
    if not temperature > 0:
        raise FmauditInputError(f"temperature: must be > 0, got {temperature!r}")
    z = validate_logits(logits) / temperature
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def softmax(logits: Any, temperature: float = 1.0) -> np.ndarray:
    """Row-wise ``softmax(logits / temperature)`` as float64 (N, K).

    Parameters
    ----------
    logits : array-like of shape (N, K)
        Finite unnormalised class scores.
    temperature : float, default 1.0
        Divisor of the logits, > 0 (docs/methods.md#temperature-scaling).

    Returns
    -------
    ndarray of float64, shape (N, K)
        Probabilities, rows summing to 1.

    Raises
    ------
    FmauditInputError
        When ``temperature`` is not > 0 or the logits are not a finite (N, K) array.
    """
    return np.exp(log_softmax(logits, temperature))


def softmax_last_axis(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Softmax of ``logits / temperature`` over the last axis: a probe's ``predict_proba``.

    Parameters
    ----------
    logits : ndarray of shape (..., K)
        (N, K), (R, N, K) or more; ``-inf`` marks a class that gets probability 0.
    temperature : float, default 1.0

    Returns
    -------
    ndarray of the same shape, in the logits' float dtype
        Probabilities summing to 1 over the last axis. (:func:`softmax` is the validated float64 (N, K) form,
        for calibration; this one checks nothing, for the batched paths.)
    """
    if not temperature > 0:
        raise FmauditInputError(f"temperature: must be > 0, got {temperature!r}")
    z = np.asarray(logits)
    if z.dtype.kind != "f":
        z = z.astype(np.float64)
    if temperature != 1.0:
        z = z / temperature
    z = z - z.max(axis=-1, keepdims=True)  # a new array: the exponent and the division below work in place
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def binary_logits_from_decision(decision: Any) -> np.ndarray:
    """Two-class logits ``(-d/2, d/2)`` from a binary decision value d (docs/methods.md#binary-logits, the audit paper
    convention).

    ``softmax`` of the result equals ``sigmoid(d)``, i.e. sklearn ``predict_proba``, so a fitted temperature
    is that of ``sigmoid(d / T)``. PRISM's ``(-d, d)`` would double it.

    Parameters
    ----------
    decision : array-like of shape (N,) or (N, 1)
        Finite binary decision values (e.g. ``decision_function`` of a binary classifier; positive favours
        class 1).

    Returns
    -------
    ndarray of float64, shape (N, 2)
        Column 0 is ``-d/2``, column 1 is ``d/2``.

    Raises
    ------
    FmauditInputError
        On another shape or a NaN/inf value.
    """
    d = np.asarray(decision, dtype=np.float64)
    if d.ndim == 2 and d.shape[1] == 1:
        d = d[:, 0]
    if d.ndim != 1:
        raise FmauditInputError(f"decision: expected shape (N,) or (N, 1), got {d.shape}")
    if not np.isfinite(d).all():
        raise FmauditInputError("decision: contains NaN/inf")
    return np.column_stack([-d / 2.0, d / 2.0])


def nll_from_logits(logits: Any, labels: Any, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of ``softmax(logits / temperature)`` via log-softmax (no clipping).

    Equals ``torch.nn.functional.cross_entropy(logits / T, labels)``.

    Parameters
    ----------
    logits : array-like of shape (N, K)
        Finite unnormalised class scores.
    labels : array-like of shape (N,)
        True class indices in 0..K-1.
    temperature : float, default 1.0
        Divisor of the logits, > 0.

    Returns
    -------
    float
        Mean NLL in nats.

    Raises
    ------
    FmauditInputError
        On invalid logits, labels or temperature.
    """
    z = validate_logits(logits)
    y = validate_labels(labels, z.shape[0], z.shape[1])
    logp = log_softmax(z, temperature)
    return float(-logp[np.arange(len(y)), y].mean())


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
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
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
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
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
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
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
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
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
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
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
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
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


# --------------------------------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------------------------------
def binned_metric_columns(n_bins: int) -> dict[str, str]:
    """Result-column name of each binned metric at ``n_bins`` bins (the bin count is part of the name, so a
    table says which ECE it holds): ``{"ece": "ece_top_15_lohi", "adaptive_ece": ..., "classwise_ece": ...,
    "mce": ...}``.

    Parameters
    ----------
    n_bins : int
        Number of bins of the binned metrics (a positive integer).

    Returns
    -------
    dict of str to str
        Metric name (``ece``, ``adaptive_ece``, ``classwise_ece``, ``mce``) to its column name.
    """
    b = _check_n_bins(n_bins)
    return {"ece": f"ece_top_{b}_lohi", "adaptive_ece": f"adaptive_ece_{b}_equalmass",
            "classwise_ece": f"classwise_ece_{b}", "mce": f"mce_{b}"}


def ece_column(n_bins: int) -> str:
    """Column of the top-label ECE at ``n_bins`` equal-width bins, e.g. ``ece_top_15_lohi``.

    Parameters
    ----------
    n_bins : int
        Number of equal-width bins.

    Returns
    -------
    str
    """
    return binned_metric_columns(n_bins)["ece"]


def prism_ece_column(n_bins: int) -> str:
    """Column of PRISM's fixed-width ECE (:func:`prism_ece`) at ``n_bins`` bins, e.g. ``ece_prism_15_fixed``.

    Parameters
    ----------
    n_bins : int
        Number of fixed-width bins of PRISM's ECE.

    Returns
    -------
    str
    """
    return f"ece_prism_{_check_n_bins(n_bins)}_fixed"


def ece_convention(n_bins: int) -> str:
    """The ECE convention in words, for the ``ece_convention`` column of every table that depends on it.

    Parameters
    ----------
    n_bins : int
        Number of equal-width bins of the ECE the table holds.

    Returns
    -------
    str
        E.g. ``"top-label, 15 equal-width bins, (lo,hi]"``.
    """
    return f"top-label, {_check_n_bins(n_bins)} equal-width bins, (lo,hi]"


def summary_metric_keys(n_bins: int = DEFAULT_N_BINS, prism_ece: bool = False) -> list[str]:
    """The keys of :func:`summary_metrics`, in order (with PRISM's ECE last when ``prism_ece``).

    Parameters
    ----------
    n_bins : int, default 15
        Number of bins of the binned metrics (in their column names).
    prism_ece : bool, default False
        Whether PRISM's ECE column is included (last).

    Returns
    -------
    list of str
        14 keys (15 with ``prism_ece``): accuracy, macro_f1, balanced_accuracy, auroc_ovr_macro, nll, brier_sum,
        the four binned columns, aurc, eaurc, degeneracy_share, collapsed.
    """
    binned = binned_metric_columns(n_bins)
    return [
        "accuracy",
        "macro_f1",
        "balanced_accuracy",
        "auroc_ovr_macro",
        "nll",
        "brier_sum",
        binned["ece"],
        binned["adaptive_ece"],
        binned["classwise_ece"],
        binned["mce"],
        "aurc",
        "eaurc",
        "degeneracy_share",
        "collapsed",
    ] + ([prism_ece_column(n_bins)] if prism_ece else [])


def metric_conventions(n_bins: int = DEFAULT_N_BINS, prism_ece: bool = False) -> dict[str, str]:
    """The convention behind each :func:`summary_metrics` key, in words, for table captions.

    Parameters
    ----------
    n_bins : int, default 15
        Number of bins named in the binned metrics' keys and descriptions.
    prism_ece : bool, default False
        Whether PRISM's ECE is described too.

    Returns
    -------
    dict of str to str
        The keys of :func:`summary_metric_keys` to a one-line description of each convention.
    """
    b = _check_n_bins(n_bins)
    return {
        "accuracy": "share of argmax predictions equal to the label; argmax ties go to the lowest class index",
        "macro_f1": "unweighted mean of per-class F1 of the argmax over all K classes (labels=range(K), "
        "zero_division=0: a class never true nor predicted scores 0)",
        "balanced_accuracy": "mean per-class recall over the classes present in the labels",
        "auroc_ovr_macro": "macro mean of one-vs-rest AUROCs, ties count 1/2; binary uses P[:,1]; "
        "NaN if a class is absent from the labels",
        "nll": "mean negative natural-log probability of the true class, unclipped",
        "brier_sum": "multiclass Brier, sum over classes of squared error, averaged over items; range [0, 2] "
        "(binary: twice sklearn's binary Brier)",
        f"ece_top_{b}_lohi": f"top-label ECE, {b} equal-width bins closed on the right (lo,hi], "
        "weights |B|/N, empty bins add 0",
        f"adaptive_ece_{b}_equalmass": f"top-label ECE over {b} equal-count bins of the sorted confidences "
        "(np.array_split), weights |B|/N",
        f"classwise_ece_{b}": f"mean over classes of the ECE of P[:,k] vs 1[y=k], {b} equal-width bins (lo,hi]",
        f"mce_{b}": f"largest |accuracy - confidence| over non-empty top-label bins, {b} equal-width bins (lo,hi]",
        "aurc": "area under the risk-coverage curve (uncertainty 1 - max prob, mean risk over k = 1..N, "
        "tied confidences averaged), raw (not x1000)",
        "eaurc": "AURC minus the discrete optimal AURC (all correct predictions ranked first)",
        "degeneracy_share": "largest share of items predicted as a single class",
        "collapsed": f"1 if degeneracy_share > {COLLAPSE_THRESHOLD} else 0",
        **({f"ece_prism_{b}_fixed": f"PRISM's ECE, {b} equal-width bins closed on the left [lo,hi) with confidence "
            "1.0 in no bin (still counted in N); binary: p(class 1) against label == 1, else top-label"}
           if prism_ece else {}),
    }


CONVENTIONS: dict[str, str] = metric_conventions(DEFAULT_N_BINS)


def summary_metrics(probs: Any, labels: Any, n_bins: int = DEFAULT_N_BINS, prism_ece: bool = False) -> dict[str, float]:
    """All headline metrics at once, keyed as :func:`summary_metric_keys` (conventions in :data:`CONVENTIONS`).

    ECE-type metrics use ``n_bins`` bins with the ``(lo,hi]`` closure; ``prism_ece`` adds PRISM's ECE
    (:func:`prism_ece`) for comparisons with PRISM.

    Parameters
    ----------
    probs : array-like of shape (N, K)
        Predicted probabilities, one row per item summing to 1 (within 1e-4), K >= 2 classes.
    labels : array-like of shape (N,)
        True class index of each item, integers in 0..K-1 (bool and integral floats are accepted).
    n_bins : int, default 15
        Number of equal-width confidence bins on [0, 1] (a positive integer).
    prism_ece : bool, default False
        Also compute PRISM's ECE (:func:`prism_ece`) under :func:`prism_ece_column`.

    Returns
    -------
    dict of str to float
        Keyed and ordered as ``summary_metric_keys(n_bins, prism_ece)``; ``collapsed`` is 0.0 or 1.0.

    Raises
    ------
    FmauditInputError
        When ``probs`` is not an (N, K) array of finite probability rows or ``labels`` do not match it.
    """
    p, y = validate_probs_labels(probs, labels)
    b = _check_n_bins(n_bins)
    conf, pred, correct = _top_label(p, y)
    cm = confusion_counts(y, pred, p.shape[1])
    share = float(np.bincount(pred, minlength=p.shape[1]).max() / len(y))
    return {
        "accuracy": float(correct.mean()),
        "macro_f1": _macro_f1_from_confusion(cm),
        "balanced_accuracy": _balanced_accuracy_from_confusion(cm),
        "auroc_ovr_macro": _auroc(p, y),
        "nll": _nll(p, y),
        "brier_sum": _brier(p, y),
        f"ece_top_{b}_lohi": _ece_from_scores(conf, correct, b, CLOSURE_RIGHT),
        f"adaptive_ece_{b}_equalmass": _adaptive_ece_from_top_label(conf, correct, b),
        f"classwise_ece_{b}": _classwise_ece(p, y, b, CLOSURE_RIGHT),
        f"mce_{b}": _mce_from_top_label(conf, correct, b, CLOSURE_RIGHT),
        "aurc": _aurc_from_ranked(_ranked_correct(conf, correct)),
        "eaurc": _eaurc_from_top_label(conf, correct),
        "degeneracy_share": share,
        "collapsed": float(share > COLLAPSE_THRESHOLD),
        **({prism_ece_column(b): _prism_ece(p, y, b)} if prism_ece else {}),
    }


# --------------------------------------------------------------------------------------------------
# novelty detection (docs/methods.md#novelty-scorers): OOD is the positive class, a higher score means more
# out-of-distribution --------------------------------------------------------------------------------------------------
def _novelty_scores(values: Any, name: str) -> np.ndarray:
    arr = float_array(values, name, 1, "array of novelty scores")
    if arr.size == 0:
        raise FmauditInputError(f"{name}: no scores (an empty set cannot be scored)")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise FmauditInputError(f"{name}: {int(bad.sum())} non-finite score(s), "
                                f"first at position {int(np.argmax(bad))}")
    return arr


def detection_auroc(scores_id: Any, scores_ood: Any) -> float:
    """AUROC of a novelty score separating an OOD set (positive) from an in-distribution set (negative).

    Equals ``roc_auc_score(r_[[0]*n_id + [1]*n_ood], r_[scores_id, scores_ood])``: the Mann-Whitney
    probability that an OOD item scores above an ID item, ties counted 1/2. 0.5 is chance, 1 perfect.

    Parameters
    ----------
    scores_id : array-like of shape (n_id,)
        Novelty scores of the in-distribution items (negatives); finite, at least one.
    scores_ood : array-like of shape (n_ood,)
        Novelty scores of the out-of-distribution items (positives); higher means more OOD.

    Returns
    -------
    float
        AUROC in [0, 1].

    Raises
    ------
    FmauditInputError
        When either set is empty, not 1-D or holds a non-finite score.
    """
    s_id = _novelty_scores(scores_id, "scores_id")
    s_ood = _novelty_scores(scores_ood, "scores_ood")
    positive = np.r_[np.zeros(s_id.size, dtype=bool), np.ones(s_ood.size, dtype=bool)]
    return _binary_auc(np.r_[s_id, s_ood], positive)


def fpr_at_tpr(scores_id: Any, scores_ood: Any, tpr: float = 0.95) -> float:
    """False-positive rate on the ID set at the highest threshold that flags at least ``tpr`` of the OOD set.

    Convention: an item is flagged OOD when its score is >= the threshold t; the candidate thresholds are the
    distinct observed scores, as in ``sklearn.metrics.roc_curve(..., drop_intermediate=False)``, so items
    tied at t are flagged together (a tie block is never split). The result is the FPR of the first ROC point,
    going from the highest threshold down, whose TPR (share of OOD items flagged) is >= ``tpr``. With
    ``drop_intermediate=True`` scikit-learn may drop that very point (collinear ROC points), which gives a
    larger FPR. OOD positive, higher score = more OOD.

    Parameters
    ----------
    scores_id : array-like of shape (n_id,)
        Novelty scores of the in-distribution items (negatives); finite, at least one.
    scores_ood : array-like of shape (n_ood,)
        Novelty scores of the out-of-distribution items (positives); higher means more OOD.
    tpr : float, default 0.95
        Share of OOD items that must be flagged, in (0, 1].

    Returns
    -------
    float
        Share of ID items flagged at that threshold, in [0, 1].

    Raises
    ------
    FmauditInputError
        When ``tpr`` lies outside (0, 1], or a score set is empty, not 1-D or holds a non-finite score.
    """
    if not 0.0 < float(tpr) <= 1.0:
        raise FmauditInputError(f"tpr: must lie in (0, 1], got {tpr!r}")
    s_id = _novelty_scores(scores_id, "scores_id")
    s_ood = _novelty_scores(scores_ood, "scores_ood")
    thresholds = np.unique(np.r_[s_id, s_ood])[::-1]  # descending distinct scores
    # items with score >= t, for every candidate t (searchsorted on the ascending sorted scores)
    ood_sorted, id_sorted = np.sort(s_ood), np.sort(s_id)
    tp = s_ood.size - np.searchsorted(ood_sorted, thresholds, side="left")
    fp = s_id.size - np.searchsorted(id_sorted, thresholds, side="left")
    reached = np.flatnonzero(tp / s_ood.size >= float(tpr))
    return float(fp[reached[0]] / s_id.size)
