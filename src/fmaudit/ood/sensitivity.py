"""Sensitivity tables (the audit paper's ``probe_sensitivity`` and ``scorer_sensitivity``).

- :func:`probe_sensitivity`: the probe with C fixed at each value of a grid, and C selected by cross-
  validation under each protocol (folds grouped by patient/slide or stratified by class only) x (criterion:
  held-out log-loss or accuracy). The scaler is fitted once on the whole training split, outside the folds
  (audit paper); folds are ``StratifiedGroupKFold`` / ``StratifiedKFold(n_folds, shuffle=True,
  random_state)``; the mean held-out score over folds picks C, ties to the first C of the grid (as
  scikit-learn). Log-loss clips probabilities at float64 eps (``sklearn.metrics.log_loss``).
- :func:`scorer_sensitivity`: detection AUROC and FPR@95%TPR of the feature-space scorers under alternative
  settings: L2 normalisation on/off (Mahalanobis, kNN at k = 50), k of kNN, covariance estimator of
  Mahalanobis (Ledoit-Wolf vs empirical). The readout is an input: call once per readout with that
  readout's arrays and concatenate (the ``readout`` column keeps them apart).
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.metrics import DEFAULT_N_BINS, detection_auroc, fpr_at_tpr
from fmaudit.ood.scorers import KNNDistance, Mahalanobis
from fmaudit.ood.selective import DEFAULT_COVERAGES, prediction_summary

DEFAULT_CS = tuple(float(c) for c in np.logspace(-6, 0, 7))
PROTOCOLS = (("grouped", "log_loss"), ("grouped", "accuracy"), ("ungrouped", "log_loss"), ("ungrouped", "accuracy"))
DEFAULT_KNN_KS = (1, 10, 50, 200)

__all__ = ["DEFAULT_KNN_KS", "PROTOCOLS", "probe_sensitivity", "scorer_settings", "scorer_sensitivity",
           "select_C_by_cv"]


def _folds(y: np.ndarray, groups: np.ndarray | None, n_folds: int,
           random_state: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if groups is None:
            return list(StratifiedKFold(n_folds, shuffle=True, random_state=random_state).split(np.zeros(y.size), y))
        if np.unique(groups).size < n_folds:
            raise FmauditInputError(f"{np.unique(groups).size} groups cannot fill {n_folds} group-disjoint folds")
        return list(StratifiedGroupKFold(n_folds, shuffle=True, random_state=random_state)
                    .split(np.zeros(y.size), y, groups))


def select_C_by_cv(X: Any, y: Any, groups: Any = None, *, Cs: Sequence[float] = DEFAULT_CS, criterion: str = "log_loss",
                   n_classes: int | None = None, n_folds: int = 3, random_state: int = 0, max_iter: int = 10000,
                   tol: float = 1e-6, device: str | None = None) -> tuple[float, np.ndarray]:
    """(selected C, (n_folds, n_Cs) held-out scores, higher = better) of an L2 logistic probe on
    standardised features; ``groups=None`` gives class-stratified folds (module doc).

    Parameters
    ----------
    X : array-like of shape (n_items, n_features)
        Training embeddings; standardised once on all of them, outside the folds.
    y : array-like of shape (n_items,)
        Class indices 0..K-1.
    groups : array-like of shape (n_items,) or None
        Patient or slide of each item: ``StratifiedGroupKFold``; None: ``StratifiedKFold``.
    Cs : sequence of float
        Candidate C values, positive (keyword-only; default ``logspace(-6, 0, 7)``).
    criterion : {"log_loss", "accuracy"}
        Held-out score that picks C: mean log-likelihood (minus the log-loss) or accuracy.
    n_classes : int or None
        Size of the label space (default: largest label + 1).
    n_folds : int
        Cross-validation folds.
    random_state : int
        Seed of the fold shuffle.
    max_iter : int
        Iteration cap of the logistic solver.
    tol : float
        Stopping tolerance of the logistic solver.
    device : str or None
        Torch device of the batched logistic engine (None: its default).

    Returns
    -------
    C : float
        The C of the best mean held-out score (ties: the first in ``Cs``).
    scores : ndarray of shape (n_folds, n_Cs)
        Held-out score per fold and C, higher = better.

    Raises
    ------
    FmauditInputError
        Unknown criterion, invalid features or labels, a non-positive or empty ``Cs``, or fewer groups than folds.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.probes import fit_logistic_batch, subset_scaler
    from fmaudit.probes.logistic_batch import check_features, check_labels

    if criterion not in ("log_loss", "accuracy"):
        raise FmauditInputError(f"criterion={criterion!r}: expected 'log_loss' or 'accuracy'")
    X = check_features(X)
    y = check_labels(y, X.shape[0], n_classes)
    k = int(n_classes) if n_classes is not None else int(y.max()) + 1
    Cs = np.asarray(Cs, dtype=np.float64).ravel()
    if Cs.size == 0 or not (Cs > 0).all():
        raise FmauditInputError(f"Cs: need positive values, got {Cs.tolist()}")
    mean, scale = subset_scaler(X)
    Xs = (X - mean) / scale
    folds = _folds(y, None if groups is None else np.asarray(groups), int(n_folds), random_state)
    subsets = [train for train, _ in folds for _ in Cs]
    fits = fit_logistic_batch(Xs, y, subsets, np.tile(Cs, len(folds)), k, standardize=False, device=device,
                              max_iter=max_iter, tol=tol)
    eps = np.finfo(np.float64).eps
    scores = np.empty((len(folds), Cs.size))
    for f, (_, test) in enumerate(folds):
        for c in range(Cs.size):
            P = fits.predict_proba(Xs[test], f * Cs.size + c)
            if criterion == "log_loss":
                scores[f, c] = float(np.mean(np.log(np.clip(P[np.arange(test.size), y[test]], eps, 1 - eps))))
            else:
                scores[f, c] = float((P.argmax(axis=1) == y[test]).mean())
    return float(Cs[int(np.argmax(scores.mean(axis=0)))]), scores


def probe_sensitivity(X_train: Any, y_train: Any, groups_train: Any, X_test: Any, y_test: Any, *, n_classes: int,
                      groups_test: Any = None, Cs: Sequence[float] = DEFAULT_CS,
                      protocols: Sequence[tuple[str, str]] = PROTOCOLS, n_folds: int = 3, random_state: int = 0,
                      ordinal: bool = False, coverages: Sequence[float] = DEFAULT_COVERAGES,
                      device: str | None = None, n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """Test-split metrics of the probe at each fixed C and under each selection protocol.

    Rows: ``analysis`` "fixed_C" (column C) or "selection" (columns folds, criterion, selected_C); metrics of
    :func:`fmaudit.ood.selective.prediction_summary` (accuracy, QWK for ordinal tasks, ECE, mean confidence,
    AURC, E-AURC, selective accuracy).

    Parameters
    ----------
    X_train : array-like of shape (n_train, n_features)
        Training embeddings.
    y_train : array-like of shape (n_train,)
        Training class indices.
    groups_train : array-like of shape (n_train,) or None
        Patient or slide of each training item; needed by the ``grouped`` protocols.
    X_test : array-like of shape (n_test, n_features)
        Test embeddings.
    y_test : array-like of shape (n_test,)
        Test class indices.
    n_classes : int
        Size of the label space (keyword-only).
    groups_test : array-like or None
        Not read: the table's metrics carry no interval (``n_boot=0``), so test groups change nothing.
    Cs : sequence of float
        C grid, both for the fixed-C rows and for the selection.
    protocols : sequence of (str, str)
        (folds, criterion) pairs: folds ``grouped`` or ``ungrouped``, criterion ``log_loss`` or ``accuracy``.
    n_folds : int
        Cross-validation folds of the selection.
    random_state : int
        Seed of the folds.
    ordinal : bool
        Add QWK (graded tasks).
    coverages : sequence of float
        Coverages of the selective-accuracy columns.
    device : str or None
        Torch device of the logistic engine.
    n_bins : int
        Equal-width bins of the top-label ECE.

    Returns
    -------
    DataFrame
        One row per fixed C, then one per protocol; columns ``analysis``, ``C``, ``folds``, ``criterion``,
        ``selected_C``, the summary metrics, ``n_train``, ``n_test``.

    Raises
    ------
    FmauditInputError
        An unknown protocol, or a grouped protocol without ``groups_train``.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.probes import LogisticProbe, fit_logistic_batch

    Xtr, Xte = np.asarray(X_train, np.float64), np.asarray(X_test, np.float64)
    ytr, yte = np.asarray(y_train), np.asarray(y_test)
    k = int(n_classes)
    Cs = np.asarray(Cs, dtype=np.float64).ravel()
    rows = []
    fixed = fit_logistic_batch(Xtr, ytr, [np.arange(ytr.size)] * Cs.size, Cs, k, standardize=True, device=device,
                               max_iter=10000, tol=1e-6)
    for c, C in enumerate(Cs):
        P = fixed.predict_proba(Xte, c)
        rows.append({"analysis": "fixed_C", "C": float(C), "folds": "", "criterion": "", "selected_C": np.nan,
                     **prediction_summary(yte, P.argmax(1), P.max(1), k, ordinal=ordinal, coverages=coverages,
                                         n_bins=n_bins, n_boot=0)})
    for folds, criterion in protocols:
        if folds not in ("grouped", "ungrouped"):
            raise FmauditInputError(f"protocol folds={folds!r}: expected 'grouped' or 'ungrouped'")
        if folds == "grouped" and groups_train is None:
            raise FmauditInputError("a grouped protocol needs groups_train (patients or slides)")
        C, _ = select_C_by_cv(Xtr, ytr, groups_train if folds == "grouped" else None, Cs=Cs, criterion=criterion,
                              n_classes=k, n_folds=n_folds, random_state=random_state, device=device)
        P = LogisticProbe(C=C, max_iter=10000, tol=1e-6, n_classes=k, device=device).fit(Xtr, ytr).predict_proba(Xte)
        rows.append({"analysis": "selection", "C": np.nan, "folds": folds, "criterion": criterion, "selected_C": C,
                     **prediction_summary(yte, P.argmax(1), P.max(1), k, ordinal=ordinal, coverages=coverages,
                                         n_bins=n_bins, n_boot=0)})
    out = pd.DataFrame(rows)
    out["n_train"], out["n_test"] = ytr.size, yte.size
    return out


def scorer_settings(knn_ks: Sequence[int] = DEFAULT_KNN_KS,
                    covariances: Sequence[str] = ("ledoit_wolf", "empirical"),
                    normalize: Sequence[bool] = (False, True)) -> list[tuple[str, str, Any]]:
    """(scorer, setting, unfitted scorer) triples of the scorer sensitivity analysis (the audit paper's sections).

    Parameters
    ----------
    knn_ks : sequence of int
        k values of kNN (default 1, 10, 50, 200).
    covariances : sequence of str
        Covariance estimators of Mahalanobis (``COVARIANCES`` of :mod:`fmaudit.ood.scorers`).
    normalize : sequence of bool
        L2-normalisation settings tried for Mahalanobis and for kNN at k = 50.

    Returns
    -------
    list of (str, str, object)
        Scorer name (``maha`` / ``knn``), setting label (e.g. ``"k=10"``, ``"normalize=True"``) and the unfitted
        scorer, in table order.
    """
    out = []
    for flag in normalize:
        out.append(("maha", f"normalize={flag}", Mahalanobis(normalize=flag)))
    for flag in normalize:
        out.append(("knn", f"normalize={flag}", KNNDistance(k=50, normalize=flag)))
    out += [("knn", f"k={int(k)}", KNNDistance(k=int(k))) for k in knn_ks]
    out += [("maha", f"covariance={c}", Mahalanobis(covariance=c)) for c in covariances]
    return out


def _setting_key(scorer: Any) -> tuple:
    return (type(scorer).__name__, tuple(sorted(scorer.params().items())))


def scorer_sensitivity(X_train: Any, y_train: Any, X_id: Any, ood_sets: Mapping[str, tuple[str, Any]], *,
                       readout: str = "default", knn_ks: Sequence[int] = DEFAULT_KNN_KS,
                       covariances: Sequence[str] = ("ledoit_wolf", "empirical"),
                       normalize: Sequence[bool] = (False, True), tpr: float = 0.95) -> pd.DataFrame:
    """Detection metrics of the feature scorers under each setting of :func:`scorer_settings`.

    ``ood_sets``: condition name -> (tier, OOD features); the ID set is ``X_id`` (the test split); scorers
    are fitted on the training split. Identical settings (e.g. ``normalize=False`` and
    ``covariance=ledoit_wolf`` of Mahalanobis) are fitted once. Columns: readout, tier, condition, scorer,
    setting, auroc, fpr_at_95tpr, n_id, n_ood.

    Parameters
    ----------
    X_train : array-like of shape (n_train, n_features)
        Training embeddings the scorers are fitted on.
    y_train : array-like of shape (n_train,)
        Training classes (for the Mahalanobis class means).
    X_id : array-like of shape (n_id, n_features)
        In-distribution embeddings (the test split), the negatives of the detection metrics.
    ood_sets : mapping of str to (str, array-like)
        Condition name -> (tier, OOD embeddings), the positives.
    readout : str
        Readout the arrays come from, written to the ``readout`` column (keyword-only).
    knn_ks, covariances, normalize
        The settings, as in :func:`scorer_settings`.
    tpr : float
        True-positive rate of the false-positive-rate column (0.95 names it ``fpr_at_95tpr``).

    Returns
    -------
    DataFrame
        One row per (setting, condition), columns as listed above.

    Raises
    ------
    FmauditInputError
        No OOD sets, or invalid embeddings.
    """
    if not ood_sets:
        raise FmauditInputError("scorer_sensitivity: no OOD sets")
    fitted: dict[tuple, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    rows = []
    for name, setting, scorer in scorer_settings(knn_ks, covariances, normalize):
        key = _setting_key(scorer)
        if key not in fitted:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # k above a small bank: capped, and said in the table
                scorer.fit(X_train, y_train)
            fitted[key] = (scorer.score(X_id), {c: scorer.score(x) for c, (_, x) in ood_sets.items()})
        s_id, s_ood = fitted[key]
        for cond, (tier, _) in ood_sets.items():
            rows.append({"readout": readout, "tier": tier, "condition": cond, "scorer": name, "setting": setting,
                         "auroc": detection_auroc(s_id, s_ood[cond]),
                         f"fpr_at_{round(100 * tpr)}tpr": fpr_at_tpr(s_id, s_ood[cond], tpr),
                         "n_id": int(s_id.size), "n_ood": int(s_ood[cond].size)})
    return pd.DataFrame(rows)
