"""Logits to probabilities: the stable (log-)softmax, a probe's batched softmax, two-class logits from a binary
decision value (docs/methods.md#binary-logits) and the NLL of logits (docs/methods.md#temperature-scaling)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fmaudit.io import FmauditInputError
from fmaudit.metrics.validation import validate_labels, validate_logits


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
