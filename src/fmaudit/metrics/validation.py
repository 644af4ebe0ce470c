"""Checks of the arrays every metric takes: probabilities, logits, labels, each error naming the argument and
the row at fault."""

from __future__ import annotations

from typing import Any

import numpy as np

from fmaudit.io import FmauditInputError

PROB_SUM_TOLERANCE = 1e-4


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
