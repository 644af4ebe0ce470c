"""The source probe of the prior-shift audit (hema paper) and what the label-free methods may know about the
source (docs/methods.md#adaptation-methods, docs/methods.md#linear-probes).

The *source probe* is the project's default probe: a StandardScaler fitted on the source training split (ddof 0)
and an L2 multinomial logistic regression with C = 1 on the standardised features
(:func:`fmaudit.probes.fit_logistic_batch`). A group-disjoint (or stratified, without groups) hold-out of the
source, ``val_fraction`` of it drawn with ``split_train_val(random_state=seed)``, gives what the label-free
methods may know about the source: the source temperature (:class:`fmaudit.calibration.TemperatureScaler` on the
hold-out logits), the BBSE joint confusion, and the in-domain macro-F1. The source label prior is the training
split's class shares. :mod:`fmaudit.adapt.evaluate` scores every adaptation method with it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fmaudit import metrics
from fmaudit.adapt import methods as m
from fmaudit.calibration import TemperatureScaler
from fmaudit.io import FmauditInputError
from fmaudit.metrics.discrimination import _macro_f1_from_confusion  # on labels validated above
from fmaudit.probes import ABSENT_CLASS_LOGIT_GAP, fit_logistic_batch, split_train_val
from fmaudit.probes.logistic_batch import check_features, check_labels

__all__ = ["SourceProbe", "fit_source_probes"]


def _mask_absent(logits: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Absent training classes get a logit ``ABSENT_CLASS_LOGIT_GAP`` below the row's lowest present one
    (the batched engine's convention: probability 0, finite logits)."""
    if present.all():
        return logits
    floor = np.where(present, logits, np.inf).min(axis=-1, keepdims=True) - ABSENT_CLASS_LOGIT_GAP
    return np.where(present, logits, floor)


class SourceProbe:
    """The default probe of the prior-shift audit, with what label-free methods know about the source.

    Parameters
    ----------
    C : float
        Inverse L2 strength of the logistic regression (default 1.0, the hema paper's).
    val_fraction : float
        Share of the source items (or groups) in the hold-out (default 0.2).
    random_state : int
        Seed of the source train / hold-out split: one source seed.
    device : str or None
        Torch device of the batched logistic engine (None: its default).
    tol : float
        Stopping tolerance of the logistic solver.

    Attributes
    ----------
    train_index_, val_index_ : ndarray of int
        Rows of the source arrays in the training split and the hold-out.
    mean_, scale_ : ndarray of shape (n_features,)
        The source scaler (ddof 0).
    W_ : ndarray of shape (n_features, n_classes)
        Weights on standardised features; ``b_`` (n_classes,) the intercepts.
    present_ : ndarray of shape (n_classes,), bool
        Classes seen in training; absent ones get probability 0.
    source_prior_ : ndarray of shape (n_classes,)
        Class shares of the training split.
    temperature_ : float
        Source temperature fitted on the hold-out logits; ``temperature_at_bound_`` says it hit a search bound.
    confusion_ : ndarray of shape (n_classes, n_classes)
        Hold-out joint ``P(pred = i, y = j)`` (BBSE's).
    val_macro_f1_ : float
        In-domain macro-F1 on the hold-out.
    n_classes_ : int
        Size of the label space.
    """

    def __init__(self, C: float = 1.0, val_fraction: float = 0.2, random_state: int = 0, device: Any = None,
                 tol: float = 1e-6):
        self.C = C
        self.val_fraction = val_fraction
        self.random_state = random_state
        self.device = device
        self.tol = tol

    def fit(self, X: Any, y: Any, n_classes: int | None = None, groups: Any = None) -> "SourceProbe":
        """Split the source, fit the probe on the training split and measure the hold-out.

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Source embeddings (every labelled source item the probe may learn from).
        y : array-like of shape (n_items,)
            Source class indices 0..K-1, at least two classes.
        n_classes : int or None
            Size of the label space (default: largest label + 1).
        groups : array-like of shape (n_items,) or None
            Patient or slide of each item: the hold-out is group-disjoint; None: stratified by class.

        Returns
        -------
        SourceProbe
            ``self``, fitted.

        Raises
        ------
        FmauditInputError
            No items, a single class (overall or in the training split), or an empty hold-out.
        """
        _fit_probes([self], X, y, n_classes, groups)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "W_"):
            raise FmauditInputError("SourceProbe: call fit first")

    def standardize(self, X: Any) -> np.ndarray:
        """Source-standardised features ``(X - mean_) / scale_``.

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Raw embeddings of the probe's encoder.

        Returns
        -------
        ndarray of shape (n_items, n_features), float64
            The standardised features.

        Raises
        ------
        FmauditInputError
            The probe is not fitted, or ``X`` has another width or invalid values.
        """
        self._check_fitted()
        X = check_features(X)
        if X.shape[1] != self.W_.shape[0]:
            raise FmauditInputError(f"X has {X.shape[1]} features but the source probe was fitted on "
                                    f"{self.W_.shape[0]}")
        return (X - self.mean_) / self.scale_

    def logits_standardized(self, Z: np.ndarray) -> np.ndarray:
        """Logits of already source-standardised features (absent classes pushed below the present ones).

        Parameters
        ----------
        Z : ndarray of shape (..., n_features)
            Features in the source-standardised space (any leading axes, e.g. (R, n, D) draws).

        Returns
        -------
        ndarray of shape (..., n_classes)
            ``Z @ W_ + b_``, each absent class ``ABSENT_CLASS_LOGIT_GAP`` below the row's lowest present one.
        """
        return _mask_absent(Z @ self.W_ + self.b_, self.present_)

    def decision_logits(self, X: Any) -> np.ndarray:
        """Logits (N, K) of the unadapted pipeline (source scaler, source probe).

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Raw embeddings.

        Returns
        -------
        ndarray of shape (n_items, n_classes)
            The logits of method ``none``.
        """
        return self.logits_standardized(self.standardize(X))


def fit_source_probes(X: Any, y: Any, n_classes: int | None, seeds: Sequence[int], groups: Any = None,
                      C: float = 1.0, val_fraction: float = 0.2, device: Any = None,
                      tol: float = 1e-6) -> list[SourceProbe]:
    """One fitted :class:`SourceProbe` per source seed, all logistic fits in one batched engine call.

    Parameters
    ----------
    X : array-like of shape (n_items, n_features)
        Source embeddings.
    y : array-like of shape (n_items,)
        Source class indices 0..K-1.
    n_classes : int or None
        Size of the label space (default: largest label + 1).
    seeds : sequence of int
        Source seeds, one probe (and one train / hold-out split) each; at least one.
    groups : array-like of shape (n_items,) or None
        Patient or slide of each item (group-disjoint hold-outs).
    C, val_fraction, device, tol
        As in :class:`SourceProbe`, shared by every probe.

    Returns
    -------
    list of SourceProbe
        Fitted probes, in the order of ``seeds``.

    Raises
    ------
    FmauditInputError
        No seeds, or source data a probe cannot be fitted on (see :meth:`SourceProbe.fit`).
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise FmauditInputError("source seeds: none given")
    return _fit_probes([SourceProbe(C, val_fraction, s, device, tol) for s in seeds], X, y, n_classes, groups)


def _fit_probes(probes: list[SourceProbe], X: Any, y: Any, n_classes: int | None, groups: Any) -> list[SourceProbe]:
    """Fit ``probes`` (same C, val_fraction, device and tol; one random_state each) in one engine call."""
    X = check_features(X, "source features")
    y = check_labels(y, X.shape[0], n_classes, "source labels")
    if y.size == 0:
        raise FmauditInputError("source: no labelled items")
    k = int(n_classes) if n_classes is not None else int(y.max()) + 1
    if np.unique(y).size < 2:
        raise FmauditInputError(f"source labels: a single class ({int(y[0])}); the probe needs at least two")
    first = probes[0]
    splits = []
    for probe in probes:
        seed = int(probe.random_state)
        train, val = split_train_val(y, groups=groups, val_fraction=first.val_fraction, random_state=seed)
        if val.size == 0:
            raise FmauditInputError(f"source seed {seed}: the hold-out split is empty (val_fraction="
                                    f"{first.val_fraction}, {y.size} items); the source temperature and BBSE need one")
        if np.unique(y[train]).size < 2:
            raise FmauditInputError(f"source seed {seed}: the training split holds a single class")
        splits.append((train, val))
    batch = fit_logistic_batch(X, y, [tr for tr, _ in splits], float(first.C), n_classes=k, standardize=True,
                               device=first.device, tol=first.tol)
    for r, (probe, (train, val)) in enumerate(zip(probes, splits)):
        probe.train_index_, probe.val_index_ = train, val
        probe.n_classes_ = k
        probe.mean_, probe.scale_ = batch.mean_[r], batch.scale_[r]
        probe.W_, probe.b_ = batch.W_[r], batch.b_[r]
        probe.present_ = batch.present_[r]
        probe.converged_ = bool(batch.converged_[r])
        probe.source_prior_ = np.bincount(y[train], minlength=k) / train.size
        val_logits = batch.decision_logits(X[val], r)
        scaler = TemperatureScaler().fit(val_logits, y[val])
        probe.temperature_, probe.temperature_at_bound_ = scaler.temperature_, scaler.at_bound_
        pred = val_logits.argmax(axis=1)
        probe.confusion_ = m.bbse_confusion(y[val], pred, k)
        probe.val_macro_f1_ = _macro_f1_from_confusion(metrics.confusion_counts(y[val], pred, k))
    return probes
