"""The abstention gate's estimator: the fit/validation division of the training split and
:class:`AbstentionGate` (the steps: :mod:`fmaudit.ood.gate`; docs/methods.md#the-abstention-gate)."""

from __future__ import annotations

import hashlib
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit import metrics
from fmaudit.io import FmauditInputError
from fmaudit.ood.scorers import check_embeddings, make_feature_scorer, max_softmax

DECISIONS = ("accept", "reject_novel", "reject_unconfident")
DEFAULT_CS = tuple(float(c) for c in np.logspace(-6, 0, 7))

__all__ = ["DECISIONS", "DEFAULT_CS", "AbstentionGate", "fit_validation_split"]


def fit_validation_split(labels: Any, groups: Any = None, validation_fraction: float = 0.2,
                         random_state: int = 0, strata: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(fit_idx, validation_idx), sorted, group-disjoint when ``groups`` are given (step 1 of :mod:`fmaudit.ood.gate`).

    ``strata`` (default: the labels) stratifies the division, e.g. class and data provider jointly.

    Parameters
    ----------
    labels : array-like of shape (n_items,)
        Class of each training item.
    groups : array-like of shape (n_items,) or None
        Patient or slide of each item; a group lies wholly on one side. None: items are divided one by one.
    validation_fraction : float
        Share of the items (or groups) in the validation part, in (0, 1). ``1/k`` for an integer k takes the
        first of k stratified folds; any other value goes to :func:`fmaudit.probes.split_train_val`.
    random_state : int
        Seed of the fold shuffle (division i of an evaluation uses ``seed + i``).
    strata : array-like of shape (n_items,) or None
        What the folds are stratified on (default ``labels``); a group is stratified by its most frequent stratum.

    Returns
    -------
    fit_idx : ndarray of int
        Sorted row indices of the fit part.
    validation_idx : ndarray of int
        Sorted row indices of the validation part.

    Raises
    ------
    FmauditInputError
        Labels not a non-empty 1-D array, a fraction outside (0, 1), ``strata`` or ``groups`` not one per item, a
        missing group id, or fewer items (groups) than folds.
    """
    from sklearn.model_selection import KFold, StratifiedKFold

    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise FmauditInputError(f"labels: expected a non-empty 1-D array, got shape {y.shape}")
    fraction = float(validation_fraction)
    if not 0.0 < fraction < 1.0:
        raise FmauditInputError(f"validation_fraction={validation_fraction!r}: must lie in (0, 1)")
    strata = y if strata is None else np.asarray(strata)
    if strata.shape != y.shape:
        raise FmauditInputError(f"strata: {strata.shape} for {y.size} labels")
    k = 1.0 / fraction
    if abs(k - round(k)) > 1e-9:
        # imported here: torch and scikit-learn load only when this runs
        from fmaudit.probes import split_train_val

        return split_train_val(y, groups=groups, val_fraction=fraction, random_state=random_state)
    k = int(round(k))
    folds = StratifiedKFold(k, shuffle=True, random_state=random_state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "least populated class has fewer members than n_splits"
        if groups is None:
            if y.size < k:
                raise FmauditInputError(f"{y.size} training items cannot fill {k} folds "
                                        f"(validation_fraction {fraction})")
            _, val = next(folds.split(np.zeros(y.size), strata))
            return np.setdiff1d(np.arange(y.size), val), np.sort(val)
        g = np.asarray(groups)
        if g.shape != y.shape:
            raise FmauditInputError(f"groups: {g.shape} for {y.size} labels (one group per item)")
        if g.dtype.kind == "f" and not np.isfinite(g).all():
            raise FmauditInputError("groups: missing (NaN) group id")
        ids, group_idx = np.unique(g, return_inverse=True)
        if ids.size < k:
            raise FmauditInputError(f"{ids.size} groups cannot fill {k} group-disjoint folds "
                                    f"(validation_fraction {fraction}); give more groups or a larger fraction")
        values, strata_idx = np.unique(strata, return_inverse=True)
        counts = np.zeros((ids.size, values.size), dtype=int)
        np.add.at(counts, (group_idx.reshape(-1), strata_idx.reshape(-1)), 1)
        group_strata = counts.argmax(axis=1)
        if np.unique(group_strata, return_counts=True)[1].max() < k:
            # every class's items sit in fewer groups than folds (small data: three patients per class), where
            # StratifiedKFold refuses to split: the groups are dealt to folds unstratified, still group-disjoint
            folds = KFold(k, shuffle=True, random_state=random_state)
        _, val_groups = next(folds.split(np.zeros(ids.size), group_strata))
    in_val = np.isin(group_idx.reshape(-1), val_groups)
    return np.flatnonzero(~in_val), np.flatnonzero(in_val)


def _training_hash(X: np.ndarray, y: np.ndarray, groups: Any) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(X, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    if groups is not None:
        h.update("\x1f".join(map(str, np.asarray(groups).tolist())).encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------
# the gate
# --------------------------------------------------------------------------------------------------
class AbstentionGate:
    """The audit paper's two-threshold abstention gate (the steps: :mod:`fmaudit.ood.gate`).

    Parameters
    ----------
    id_reject : float
        Nominal in-distribution reject rate of the novelty threshold, in (0, 1): the threshold is the
        ``1 - id_reject`` quantile of the validation novelty scores (default 0.05).
    retain : float
        Share of the novelty-passing validation items the confidence threshold keeps, in (0, 1] (default 0.8).
    validation_fraction : float
        Share of the training items (or groups) held out to set both thresholds (default 0.2: 1 fold of 5).
    random_state : int
        Seed of the fit/validation division and of the probe's CV folds.
    C : float or None
        Inverse L2 strength of the probe; None chooses it among ``Cs`` by ``cv_folds``-fold (grouped) CV on
        log-loss.
    Cs : sequence of float
        Candidate C values (default ``logspace(-6, 0, 7)``, the audit paper's).
    cv_folds : int
        Folds of the C selection (default 3).
    scorer : {"maha", "relative_maha", "knn"}
        Novelty scorer of :mod:`fmaudit.ood.scorers` (default Mahalanobis).
    scorer_params : mapping or None
        Constructor parameters of the scorer (default: its own, Ledoit-Wolf covariance for ``maha``).
    n_classes : int or None
        Size of the label space 0..K-1 (default: largest training label + 1).
    probe_backend : str
        Engine of the logistic probe (``"auto"``, as :class:`fmaudit.probes.LogisticProbe`).
    probe_device : str or None
        Torch device of the probe engine (None: its default).
    max_iter : int
        Iteration cap of the probe's solver.
    tol : float
        Stopping tolerance of the probe's solver.

    Attributes
    ----------
    fit_index_, validation_index_ : ndarray of int
        Training rows of the fit and the validation part.
    probe_ : LogisticProbe or LogisticCVProbe
        The probe fitted on the fit part; ``C_`` its C (NaN when unknown).
    scorer_ : object
        The novelty scorer fitted on the fit part.
    novelty_threshold_, confidence_threshold_ : float
        The two thresholds set on the validation part.
    validation_point_ : dict
        The validation operating point: ``n_fit``, ``n_validation``, ``n_fit_groups``, ``n_validation_groups``,
        ``reject_novel``, ``retain_confident``, ``coverage``, ``accuracy_ungated``, ``accuracy_accepted``.
    n_features_in_, n_classes_ : int
        Feature dimension and label-space size.
    training_data_hash_ : str
        16 hex digits of the sha256 of the training features, labels and groups.
    encoder_, readout_ : str or None
        Given to ``fit`` or read from a card; features of another readout are refused.
    """

    def __init__(self, id_reject: float = 0.05, retain: float = 0.8, validation_fraction: float = 0.2,
                 random_state: int = 0, C: float | None = None, Cs: Sequence[float] = DEFAULT_CS,
                 cv_folds: int = 3, scorer: str = "maha", scorer_params: Mapping[str, Any] | None = None,
                 n_classes: int | None = None, probe_backend: str = "auto", probe_device: str | None = None,
                 max_iter: int = 10000, tol: float = 1e-6):
        self.id_reject = id_reject
        self.retain = retain
        self.validation_fraction = validation_fraction
        self.random_state = random_state
        self.C = C
        self.Cs = Cs
        self.cv_folds = cv_folds
        self.scorer = scorer
        self.scorer_params = scorer_params
        self.n_classes = n_classes
        self.probe_backend = probe_backend
        self.probe_device = probe_device
        self.max_iter = max_iter
        self.tol = tol

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters as JSON-ready values (the card's ``settings``).

        Returns
        -------
        dict
            One key per constructor parameter; ``Cs`` a list of float, ``scorer_params`` a dict.
        """
        out = {k: v for k, v in vars(self).items() if not k.endswith("_")}
        out["Cs"] = [float(c) for c in np.asarray(self.Cs, dtype=float).ravel()]
        out["scorer_params"] = dict(self.scorer_params or {})
        return out

    def _check_params(self) -> None:
        if not 0.0 < float(self.id_reject) < 1.0:
            raise FmauditInputError(f"id_reject={self.id_reject!r}: must lie in (0, 1)")
        if not 0.0 < float(self.retain) <= 1.0:
            raise FmauditInputError(f"retain={self.retain!r}: must lie in (0, 1]")
        if self.C is not None and not float(self.C) > 0:
            raise FmauditInputError(f"C={self.C!r}: must be > 0")

    def _make_probe(self, n_classes: int):
        # imported here: torch and scikit-learn load only when this runs
        from fmaudit.probes import LogisticCVProbe, LogisticProbe

        if self.C is not None:
            return LogisticProbe(C=float(self.C), max_iter=self.max_iter, tol=self.tol, backend=self.probe_backend,
                                 device=self.probe_device, n_classes=n_classes)
        return LogisticCVProbe(Cs=np.asarray(self.Cs, dtype=float), n_folds=self.cv_folds, max_iter=self.max_iter,
                               tol=self.tol, random_state=self.random_state, backend=self.probe_backend,
                               device=self.probe_device, n_classes=n_classes)

    def fit(self, X: Any, y: Any, groups: Any = None, *, strata: Any = None, encoder: str | None = None,
            readout: str | None = None) -> "AbstentionGate":
        """Fit on the training split ``X`` (N, D), labels ``y`` (class indices 0..K-1) and optional groups
        (patients / slides: the division and the probe's CV folds keep each on one side). ``encoder`` and
        ``readout`` are recorded for the card and checked by :meth:`decide`.

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Training embeddings (finite).
        y : array-like of shape (n_items,)
            Class indices 0..K-1 (at least two classes, in the fit part too).
        groups : array-like of shape (n_items,) or None
            Patient or slide of each item; None divides items one by one.
        strata : array-like of shape (n_items,) or None
            What the division is stratified on (keyword-only; default ``y``), e.g. grade and data provider.
        encoder : str or None
            Encoder name recorded for the card.
        readout : str or None
            Readout recorded for the card; later features of another readout are refused.

        Returns
        -------
        AbstentionGate
            ``self``, fitted.

        Raises
        ------
        FmauditInputError
            Invalid settings (``id_reject``, ``retain``, ``C``), labels that are not class indices, one per row,
            a single class, groups not one per item, or a division that leaves a side empty.
        """
        self._check_params()
        X = check_embeddings(X, "X")
        k = self.n_classes if self.n_classes is not None else None
        y_arr = np.asarray(y)
        if y_arr.ndim != 1 or y_arr.shape[0] != X.shape[0]:
            raise FmauditInputError(f"y: {y_arr.shape} labels for {X.shape[0]} feature rows")
        if k is None:
            if y_arr.dtype.kind not in "iub" and not (y_arr.dtype.kind == "f" and np.isfinite(y_arr).all()):
                raise FmauditInputError(f"y: labels must be class indices 0..K-1, got dtype {y_arr.dtype}")
            k = int(np.max(y_arr)) + 1
        y = metrics.validate_labels(y_arr, X.shape[0], int(k), "y")
        if np.unique(y).size < 2:
            raise FmauditInputError(f"y: the training split holds a single class ({int(y[0])}); the gate's probe "
                                    "needs at least two")
        if groups is not None:
            groups = np.asarray(groups)
            if groups.shape != y.shape:
                raise FmauditInputError(f"groups: {groups.shape} for {y.size} training items (one per item)")
        fit_idx, val_idx = fit_validation_split(y, groups, self.validation_fraction, self.random_state, strata)
        if val_idx.size == 0 or fit_idx.size == 0:
            raise FmauditInputError(f"the fit/validation division left an empty side ({fit_idx.size} fit, "
                                    f"{val_idx.size} validation items)")
        if np.unique(y[fit_idx]).size < 2:
            raise FmauditInputError("the fit part of the training split holds a single class; give more items")
        probe = self._make_probe(int(k))
        g_fit = None if groups is None else groups[fit_idx]
        if self.C is None:
            probe.fit(X[fit_idx], y[fit_idx], groups=g_fit)
        else:
            probe.fit(X[fit_idx], y[fit_idx])
        scorer = make_feature_scorer(self.scorer, **dict(self.scorer_params or {}))
        scorer.fit(X[fit_idx], y[fit_idx])
        self.fit_index_, self.validation_index_ = fit_idx, val_idx
        self.probe_, self.scorer_ = probe, scorer
        self.C_ = float(getattr(probe, "C_", self.C if self.C is not None else np.nan))
        self.n_features_in_ = X.shape[1]
        self.n_classes_ = int(k)
        novelty = scorer.score(X[val_idx])
        self.novelty_threshold_ = float(np.quantile(novelty, 1.0 - float(self.id_reject)))
        passed = novelty <= self.novelty_threshold_
        confidence = max_softmax(probe.decision_logits(X[val_idx]))
        self.confidence_threshold_ = float(np.quantile(confidence[passed], 1.0 - float(self.retain)))
        out = self._decide_arrays(X[val_idx])
        accepted = out["decision"] == 0
        correct = out["prediction"] == y[val_idx]
        self.validation_point_ = {
            "n_fit": int(fit_idx.size), "n_validation": int(val_idx.size),
            "n_fit_groups": None if groups is None else int(np.unique(groups[fit_idx]).size),
            "n_validation_groups": None if groups is None else int(np.unique(groups[val_idx]).size),
            "reject_novel": float(1.0 - passed.mean()),
            "retain_confident": float((confidence[passed] >= self.confidence_threshold_).mean()),
            "coverage": float(accepted.mean()),
            "accuracy_ungated": float(correct.mean()),
            "accuracy_accepted": float(correct[accepted].mean()) if accepted.any() else float("nan"),
        }
        self.training_data_hash_ = _training_hash(X, y, groups)
        self.grouped_ = groups is not None
        self.encoder_, self.readout_ = encoder, readout
        return self

    # applying ----------------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "novelty_threshold_"):
            raise FmauditInputError("AbstentionGate is not fitted yet: call fit (or load_gate) first")

    def _check_input(self, X: Any, readout: str | None) -> np.ndarray:
        self._check_fitted()
        if readout is not None and self.readout_ is not None and str(readout) != str(self.readout_):
            raise FmauditInputError(
                f"the gate was fitted on readout {self.readout_!r} (encoder {self.encoder_!r}); refusing features "
                f"of readout {readout!r}: novelty and confidence thresholds do not transfer across readouts")
        where = f"the gate (encoder {self.encoder_!r}, readout {self.readout_!r})"
        return check_embeddings(X, "features", self.n_features_in_, where)

    def logits(self, X: Any, readout: str | None = None) -> np.ndarray:
        """(N, K) probe logits (binary probes: the (-d/2, d/2) pair).

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Embeddings of the gate's encoder and readout.
        readout : str or None
            The caller's readout; a gate fitted on another readout refuses (None: not checked).

        Returns
        -------
        ndarray of shape (n_items, n_classes)
            Logits of the standardised features.
        """
        return self.probe_.decision_logits(self._check_input(X, readout))

    def novelty(self, X: Any, readout: str | None = None) -> np.ndarray:
        """(N,) novelty scores of the gate's scorer.

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Embeddings of the gate's encoder and readout.
        readout : str or None
            The caller's readout; a gate fitted on another readout refuses (None: not checked).

        Returns
        -------
        ndarray of shape (n_items,)
            Novelty score per item; above ``novelty_threshold_`` is rejected as novel.
        """
        return self.scorer_.score(self._check_input(X, readout))

    def _decide_arrays(self, X: np.ndarray) -> dict[str, np.ndarray]:
        novelty = self.scorer_.score(X)
        logits = self.probe_.decision_logits(X)
        confidence = max_softmax(logits)
        prediction = logits.argmax(axis=1)
        decision = np.where(novelty > self.novelty_threshold_, 1,
                            np.where(confidence >= self.confidence_threshold_, 0, 2))
        return {"decision": decision, "novelty": novelty, "confidence": confidence, "prediction": prediction}

    def decide_arrays(self, X: Any, readout: str | None = None) -> dict[str, np.ndarray]:
        """Arrays decision (0 accept, 1 reject_novel, 2 reject_unconfident), novelty, confidence, prediction.

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Embeddings of the gate's encoder and readout.
        readout : str or None
            The caller's readout; a gate fitted on another readout refuses (None: not checked).

        Returns
        -------
        dict of str to ndarray of shape (n_items,)
            ``decision`` (int: index into ``DECISIONS``; novelty is checked first), ``novelty``, ``confidence``
            (max softmax) and ``prediction`` (class index).

        Raises
        ------
        FmauditInputError
            The gate is not fitted, the readout differs from the gate's, or ``X`` has the wrong width or NaN.
        """
        return self._decide_arrays(self._check_input(X, readout))

    def decide(self, X: Any, readout: str | None = None) -> pd.DataFrame:
        """One row per item: decision (accept / reject_novel / reject_unconfident), novelty, confidence,
        prediction. ``readout``: the caller's readout; a gate fitted on another readout refuses.

        Parameters
        ----------
        X : array-like of shape (n_items, n_features)
            Embeddings of the gate's encoder and readout.
        readout : str or None
            The caller's readout (None: not checked).

        Returns
        -------
        DataFrame
            One row per item in input order, columns ``decision`` (str), ``novelty``, ``confidence`` (float)
            and ``prediction`` (int64 class index).
        """
        out = self.decide_arrays(X, readout)
        return pd.DataFrame({"decision": np.asarray(DECISIONS, dtype=object)[out["decision"]],
                             "novelty": out["novelty"], "confidence": out["confidence"],
                             "prediction": out["prediction"].astype(np.int64)})

