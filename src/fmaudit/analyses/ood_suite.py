"""The OOD shard of one (encoder, task): novelty detection, selective prediction, blur curve and the gate.

Arrays in, frames out. The training split is every item of ``data`` whose split is ``train`` or ``val``
(the audit paper fits on its whole training split), the in-distribution set is the ``test`` split; all domains of
the task are pooled. Conditions (:class:`OODCondition`), in the audit paper's tiers:

- ``far``: another data set's items (features from the same encoder and readout); nothing refitted.
- ``blur`` and ``image_artefact``: perturbed copies of the test items (derived manifests re-embedded), row i
  being the copy of test item i; nothing refitted; the copies share their originals' patients/slides.
- ``near`` (one class) and ``artefact`` (several classes jointly): held out from the task; probe and feature
  scorers are refitted on the remaining training items; ID = remaining test items, OOD = held-out test items.

Probe (:class:`ProbeSettings`): the audit paper's (standardised multinomial logistic, C by grouped 3-fold CV on
log-loss over ``logspace(-6, 0, 7)``) or a fixed C. Intervals are cluster-bootstrap percentile intervals over the
task's groups (patients / slides): detection AUROC resamples the union of ID and OOD units, the selective
metrics and the blur curve resample the test units, the gate pools ``n_boot`` resamples over
``gate_splits`` fit/validation divisions (audit paper). Every row names its unit and how many there were.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.analyses.task_data import TaskData
from fmaudit.io import FmauditInputError
from fmaudit.metrics import DEFAULT_N_BINS, detection_auroc, fpr_at_tpr, softmax
from fmaudit.ood.conditions import hold_out_classes
from fmaudit.ood.gate import DEFAULT_CS, AbstentionGate, GateSet, gate_operating_points
from fmaudit.ood.scorers import FEATURE_SCORERS, LOGIT_SCORERS, energy_score, make_feature_scorer, msp_score
from fmaudit.ood.selective import DEFAULT_COVERAGES, blur_accuracy_curve, risk_coverage_curve, selective_summary
from fmaudit.probes import LogisticCVProbe, LogisticProbe
from fmaudit.stats import bootstrap_counts, percentile_interval

log = logging.getLogger(__name__)

TIERS = ("far", "blur", "near", "artefact", "image_artefact")
PAIRED_TIERS = ("blur", "image_artefact")
CLASS_TIERS = ("near", "artefact")
CURVE_COVERAGES = tuple(np.round(np.linspace(0.01, 1.0, 100), 2))
FPR_COLUMN = "fpr_at_95tpr"

__all__ = ["OODCondition", "OODSuiteResult", "ProbeSettings", "TIERS", "bootstrap_detection_auroc", "run_ood_suite"]


@dataclass
class OODCondition:
    """One OOD condition of a task (grid name in ``name``: far_<donor>, blur_s<sigma>, holdout_<class>,
    artefact, or a perturbation tag). ``features``: the OOD embeddings (far: the donor's test items; blur /
    image_artefact: aligned to the ID test items). ``groups``: the donor's patients/slides (far only).
    ``held_out``: class names (near / artefact). ``sigma``: blur strength (blur only).

    Attributes
    ----------
    tier : str
        One of :data:`TIERS`.
    name : str
        The condition's grid name, unique within the task.
    features : ndarray of shape (n_ood, n_features) or None
        The OOD embeddings, from the task's encoder and readout; for ``blur`` and ``image_artefact`` row i is
        the copy of test item i. None for ``near`` and ``artefact``, whose OOD items come from the task.
    groups : ndarray of shape (n_ood,) or None
        The donor's patients/slides of a ``far`` condition (its items are their own units without them).
    held_out : tuple of str
        Class names held out of the task (``near``: one, ``artefact``: several).
    sigma : float or None
        Gaussian blur strength of a ``blur`` condition, > 0.
    """

    tier: str
    name: str
    features: np.ndarray | None = None
    groups: np.ndarray | None = None
    held_out: tuple[str, ...] = ()
    sigma: float | None = None

    def check(self, n_test: int, n_features: int) -> None:
        """Check the condition against its task before anything is fitted.

        Parameters
        ----------
        n_test : int
            The task's test items (a paired condition needs one copy each).
        n_features : int
            The task's feature dimension.

        Raises
        ------
        FmauditInputError
            An unknown tier; a class tier without held-out classes; features missing, empty, non-finite or of
            another dimension; a paired condition not aligned with the test items; a blur without ``sigma``
            > 0; groups that do not match the features' rows.
        """
        if self.tier not in TIERS:
            raise FmauditInputError(f"condition {self.name!r}: unknown tier {self.tier!r}; known: {TIERS}")
        if self.tier in CLASS_TIERS:
            if not self.held_out:
                raise FmauditInputError(f"condition {self.name!r} ({self.tier}): no held-out classes")
            return
        if self.features is None:
            raise FmauditInputError(f"condition {self.name!r} ({self.tier}): no OOD features")
        X = np.asarray(self.features)
        if X.ndim != 2 or X.shape[1] != n_features:
            raise FmauditInputError(f"condition {self.name!r}: features of shape {X.shape}; the task's have "
                                    f"{n_features} dimensions (same encoder and readout?)")
        if X.shape[0] == 0:
            raise FmauditInputError(f"condition {self.name!r}: no OOD items")
        if not np.isfinite(X).all():
            row = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
            raise FmauditInputError(f"condition {self.name!r}: NaN/inf features in row {row}")
        if self.tier in PAIRED_TIERS and X.shape[0] != n_test:
            raise FmauditInputError(f"condition {self.name!r}: {X.shape[0]} perturbed items for {n_test} test items; "
                                    "align them with fmaudit.ood.conditions.align_perturbed")
        if self.tier == "blur" and (self.sigma is None or not self.sigma > 0):
            raise FmauditInputError(f"condition {self.name!r}: a blur condition needs sigma > 0")
        if self.groups is not None and len(self.groups) != X.shape[0]:
            raise FmauditInputError(f"condition {self.name!r}: {len(self.groups)} groups for {X.shape[0]} items")


@dataclass
class OODSuiteResult:
    """Frames of one (encoder, task) OOD shard, and the gate to export (None when the gate is off).

    Attributes
    ----------
    detection, selective, curves, blur, gate, histograms : DataFrame
        The shard's tables, as :func:`run_ood_suite` lists their columns (``blur`` and ``gate`` empty when the
        task has no blur condition or the gate is off).
    gate_model : AbstentionGate or None
        The gate fitted on the task's whole training split, to export; None when the gate is off.
    probe_C : float
        The probe's C (chosen by CV or fixed); NaN when neither is known.
    notes : list of str
        Remarks on the shard; empty (nothing in the library fills it yet).
    """

    detection: pd.DataFrame
    selective: pd.DataFrame
    curves: pd.DataFrame
    blur: pd.DataFrame
    gate: pd.DataFrame
    histograms: pd.DataFrame
    gate_model: AbstentionGate | None = None
    probe_C: float = float("nan")
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# detection AUROC under a bootstrap
# --------------------------------------------------------------------------------------------------
def bootstrap_detection_auroc(scores_id: np.ndarray, scores_ood: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(B,) detection AUROC (OOD positive, ties 1/2) for each row of ``counts`` (B, n_id + n_ood) of item
    multiplicities, the ID items first: the weighted Mann-Whitney statistic, vectorised over resamples
    (equals ``roc_auc_score(..., sample_weight=counts[b])``). NaN where a resample lacks ID or OOD items.

    Parameters
    ----------
    scores_id : ndarray of shape (n_id,)
        Novelty scores of the in-distribution items (higher: more novel).
    scores_ood : ndarray of shape (n_ood,)
        Novelty scores of the OOD items.
    counts : ndarray of shape (n_boot, n_id + n_ood)
        How often each item is drawn in each resample (:func:`fmaudit.stats.bootstrap_counts` over their units).

    Returns
    -------
    ndarray of shape (n_boot,)
        The detection AUROC of each resample, float64.
    """
    s = np.r_[np.asarray(scores_id, np.float64), np.asarray(scores_ood, np.float64)]
    positive = np.r_[np.zeros(len(scores_id), bool), np.ones(len(scores_ood), bool)]
    order = np.argsort(s, kind="stable")
    s_sorted = s[order]
    starts = np.r_[0, np.flatnonzero(np.diff(s_sorted) > 0) + 1]  # first item of each block of tied scores
    W = np.asarray(counts, dtype=np.float64)[:, order]
    pos_sorted = positive[order]
    neg = np.add.reduceat(W * ~pos_sorted, starts, axis=1)  # (B, U) ID weight at each distinct score
    pos = np.add.reduceat(W * pos_sorted, starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (pos * (below + 0.5 * neg)).sum(axis=1) / (pos.sum(axis=1) * neg.sum(axis=1))
    return auc


def _detection_row(s_id: np.ndarray, s_ood: np.ndarray, g_id: np.ndarray, g_ood: np.ndarray, n_boot: int,
                   seed: int, alpha: float, unit: str) -> dict[str, Any]:
    row: dict[str, Any] = {"auroc": detection_auroc(s_id, s_ood), FPR_COLUMN: fpr_at_tpr(s_id, s_ood, 0.95),
                           "n_id": int(s_id.size), "n_ood": int(s_ood.size)}
    if n_boot > 0:
        units = np.r_[g_id, g_ood]
        draws = bootstrap_detection_auroc(s_id, s_ood,
                                          bootstrap_counts(units.size, units, n_boot=n_boot, random_state=seed))
        row["auroc_ci_lo"], row["auroc_ci_hi"], row["n_valid"] = percentile_interval(draws, alpha)
        row["ci_unit"], row["ci_n_units"], row["n_boot"] = unit, int(np.unique(units).size), int(n_boot)
    return row


def _histogram_rows(s_id: np.ndarray, s_ood: np.ndarray, bins: int) -> list[dict[str, Any]]:
    both = np.r_[s_id, s_ood]
    lo, hi = float(both.min()), float(both.max())
    if hi <= lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    rows = []
    for name, s in (("id", s_id), ("ood", s_ood)):
        counts, _ = np.histogram(s, bins=edges)
        for b in range(bins):
            rows.append({"set": name, "bin": b, "lo": edges[b], "hi": edges[b + 1], "count": int(counts[b]),
                         "share": float(counts[b] / s.size)})
    return rows


# --------------------------------------------------------------------------------------------------
# fitting the probe and the scorers
# --------------------------------------------------------------------------------------------------
@dataclass
class _Detectors:
    probe: Any
    feature_scorers: dict[str, Any]

    def scores(self, X: np.ndarray, scorers: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        logits = self.probe.decision_logits(X)
        out = {}
        for name in scorers:
            if name == "energy":
                out[name] = energy_score(logits)
            elif name == "msp":
                out[name] = msp_score(logits)
            else:
                out[name] = self.feature_scorers[name].score(X)
        return out, logits


@dataclass(frozen=True)
class ProbeSettings:
    """The shard's probe (the audit paper's by default): fixed ``C``, or C among ``Cs`` by grouped ``cv_folds``-fold CV
    on held-out log-loss, every fold x C fitted in one batch (:class:`fmaudit.probes.LogisticCVProbe`).

    Attributes
    ----------
    C : float or None
        Fixed inverse L2 strength; None chooses it by CV among ``Cs``.
    Cs : tuple of float
        The CV grid; default the audit paper's ``logspace(-6, 0, 7)``.
    cv_folds : int
        Folds of the grouped CV; default 3.
    tol : float
        Convergence tolerance of the solver; default 1e-6.
    max_iter : int
        Iteration cap of the solver; default 10000.
    """

    C: float | None = None
    Cs: tuple[float, ...] = DEFAULT_CS
    cv_folds: int = 3
    tol: float = 1e-6
    max_iter: int = 10000

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None, n_classes: int, random_state: int = 0):
        """The probe fitted on (X, y): fixed C, or C chosen by CV with folds grouped by ``groups``.

        Parameters
        ----------
        X : ndarray of shape (n_items, n_features)
            Training features.
        y : ndarray of shape (n_items,)
            Class indices 0..n_classes-1.
        groups : ndarray of shape (n_items,) or None
            Patients/slides the CV folds keep together; None: items are their own groups.
        n_classes : int
            Classes of the task (a class absent from ``y`` still gets a logit).
        random_state : int
            Seed of the CV folds; default 0.

        Returns
        -------
        LogisticProbe or LogisticCVProbe
            The fitted probe (``C_`` holds the chosen C of a CV probe).

        Raises
        ------
        FmauditInputError
            ``y`` holds a single class.
        """
        if np.unique(y).size < 2:
            raise FmauditInputError("the training split holds a single class; the probe needs at least two")
        if self.C is not None:
            return LogisticProbe(C=float(self.C), max_iter=self.max_iter, tol=self.tol, n_classes=n_classes).fit(X, y)
        probe = LogisticCVProbe(Cs=np.asarray(self.Cs, dtype=float), n_folds=self.cv_folds, max_iter=self.max_iter,
                                tol=self.tol, random_state=random_state, n_classes=n_classes)
        return probe.fit(X, y, groups=groups)

    def gate_params(self) -> dict[str, Any]:
        """The same probe as :class:`fmaudit.ood.gate.AbstentionGate` parameters.

        Returns
        -------
        dict
            ``C``, ``Cs`` (list of float), ``cv_folds``, ``tol`` and ``max_iter``.
        """
        return {"C": self.C, "Cs": [float(c) for c in self.Cs], "cv_folds": int(self.cv_folds), "tol": float(self.tol),
                "max_iter": int(self.max_iter)}


def _fit_detectors(X: np.ndarray, y: np.ndarray, groups: np.ndarray, n_classes: int, scorers: Sequence[str],
                   settings: ProbeSettings, knn_k: int, covariance: str, random_state: int) -> _Detectors:
    probe = settings.fit(X, y, groups, n_classes, random_state)
    params = {"maha": {"covariance": covariance}, "relative_maha": {}, "knn": {"k": knn_k}}
    feature = {}
    for name in scorers:
        if name in FEATURE_SCORERS:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                feature[name] = make_feature_scorer(name, **params[name]).fit(X, y)
            for w in caught:
                log.warning("%s", w.message)
    return _Detectors(probe, feature)


def _check_scorers(scorers: Sequence[str]) -> list[str]:
    scorers = list(scorers)
    unknown = [s for s in scorers if s not in FEATURE_SCORERS + LOGIT_SCORERS]
    if unknown:
        hint = " (ViM is not implemented)" if "vim" in unknown else ""
        raise FmauditInputError(f"unknown OOD scorer(s) {unknown}{hint}; "
                                f"known: {list(FEATURE_SCORERS + LOGIT_SCORERS)}")
    if not scorers:
        raise FmauditInputError("no OOD scorers")
    return scorers


# --------------------------------------------------------------------------------------------------
# the shard
# --------------------------------------------------------------------------------------------------
def run_ood_suite(data: TaskData, conditions: Sequence[OODCondition], *, encoder: str, task: str,
                  readout: str = "default", scorers: Sequence[str] = ("maha", "knn", "energy", "msp"),
                  ordinal: bool = False, probe_C: float | None = None, knn_k: int = 50,
                  covariance: str = "ledoit_wolf", coverages: Sequence[float] = DEFAULT_COVERAGES,
                  n_boot: int, bootstrap_seed: int = 0, alpha: float = 0.05,
                  gate_params: Mapping[str, Any] | None = None, gate_splits: int = 5, gate_near: bool = False,
                  hist_bins: int = 30, random_state: int = 0, probe: ProbeSettings | None = None,
                  ece_bins: int = DEFAULT_N_BINS, strata: Any = None, strata_name: str = "label"
                  ) -> OODSuiteResult:
    """Every OOD analysis of one (encoder, task); see the module doc.

    ``ece_bins``: equal-width bins of the selective table's top-label ECE. ``probe``: the probe of the shard and
    of the gate (:class:`ProbeSettings`; ``probe_C`` is shorthand for
    ``ProbeSettings(C=probe_C)``). ``gate_params``: keyword arguments of :class:`fmaudit.ood.gate.AbstentionGate`
    (id_reject, retain, validation_fraction, random_state = the config's ``gate.seed``, scorer,
    scorer_params ...); None skips the gate. ``strata`` (one per item of ``data``; default the labels) stratify
    the gate's fit/validation divisions as the task's test split was (PANDA: grade x data provider,
    :func:`fmaudit.analyses.task_data.item_strata`); ``strata_name`` describes them in the gate table's
    ``division_strata`` column. The gate is evaluated on the task's own split (setting
    ``<task>``) with the far, blur and image-artefact sets, and, for each ``artefact`` condition (and each
    ``near`` condition with ``gate_near``), on the task without those classes (setting ``<task>:<condition>``)
    with the held-out classes' test items as the OOD set.

    Frames (all start with encoder, task, readout):

    - detection: tier, condition, scorer, auroc, auroc_ci_lo, auroc_ci_hi, fpr_at_95tpr, n_id, n_ood, n_valid,
      ci_unit, ci_n_units, n_boot; one row per condition x scorer (``fmaudit.grid.ood_runs``).
    - selective: set (test), n, accuracy, error_rate, mean_confidence, ece_top_15_lohi, aurc, eaurc,
      eaurc_random, selective_accuracy_c<c>, qwk (ordinal), their _ci_lo/_ci_hi, ci_unit, ci_n_units, n_boot,
      probe_C.
    - curves: set, k, coverage, risk, selective_accuracy, confidence_threshold (risk-coverage, 100 coverages).
    - blur: sigma (0 = unblurred), n, accuracy (+ CI), accuracy_change (+ paired CI), qwk (ordinal).
    - gate: setting, set, tier, quantity, value (division 0, the paper's), mean_over_divisions and its
      interval, ..., division_strata (:func:`gate_operating_points`).
    - histograms: tier, condition, scorer, set (id/ood), bin, lo, hi, count, share.

    Parameters
    ----------
    data : TaskData
        The task's items; ``train`` and ``val`` items are the training split, ``test`` the in-distribution set.
    conditions : sequence of OODCondition
        The task's OOD conditions, names unique.
    encoder, task : str
        Names written in every row.
    readout : str
        The readout of the embeddings file the features come from, written in every row.
    scorers : sequence of str
        Novelty scorers: feature scorers (``maha``, ``relative_maha``, ``knn``) and logit scorers (``energy``,
        ``msp``).
    ordinal : bool
        The task's classes are ordered grades: the selective, blur and gate tables add quadratic-weighted kappa.
    probe_C : float or None
        Shorthand for ``probe=ProbeSettings(C=probe_C)``; not both.
    knn_k : int
        Neighbours of the ``knn`` scorer.
    covariance : str
        Covariance estimate of the Mahalanobis scorer: ``ledoit_wolf`` or ``empirical``.
    coverages : sequence of float
        Coverages in (0, 1] of the selective table's ``selective_accuracy_c<c>`` columns.
    n_boot : int
        Bootstrap resamples of every interval (keyword-only, no default: the schema's ``bootstrap.n_boot``); 0
        leaves the detection rows without intervals.
    bootstrap_seed : int
        Seed of the resampling (``bootstrap.seed``); condition i's detection intervals use ``bootstrap_seed + i``.
    alpha : float
        One minus the intervals' coverage; default 0.05.
    gate_params : mapping or None
        Keyword arguments of :class:`fmaudit.ood.gate.AbstentionGate` (over the probe's own); None skips the gate.
    gate_splits : int
        Fit/validation divisions the gate's operating points are pooled over.
    gate_near : bool
        Evaluate the gate on each ``near`` condition too (``artefact`` conditions always are).
    hist_bins : int
        Bins of the score histograms.
    random_state : int
        Seed of the probe's CV folds.
    probe : ProbeSettings or None
        The probe of the shard and of the gate; None: ``ProbeSettings(C=probe_C)``.
    ece_bins : int
        Equal-width bins of the selective table's top-label ECE.
    strata : array-like of shape (n_items,) or None
        Stratum of each item of ``data`` for the gate's divisions; None: the labels.
    strata_name : str
        What the strata are, in words (the gate table's ``division_strata``).

    Returns
    -------
    OODSuiteResult
        The frames listed above, the gate fitted on the whole training split and the probe's C.

    Raises
    ------
    FmauditInputError
        Unknown or no scorers, ``probe`` and ``probe_C`` both given, an unknown covariance, non-finite
        features, no training or test items, repeated condition names, a condition that fails
        :meth:`OODCondition.check`, or strata of the wrong length.
    """
    scorers = _check_scorers(scorers)
    if probe is None:
        probe = ProbeSettings(C=probe_C)
    elif probe_C is not None:
        raise FmauditInputError("give the probe's C in probe=ProbeSettings(C=...) or probe_C, not both")
    if covariance not in ("ledoit_wolf", "empirical"):
        raise FmauditInputError(f"covariance={covariance!r}: expected 'ledoit_wolf' or 'empirical'")
    X = np.asarray(data.features, dtype=np.float64)
    if not np.isfinite(X).all():
        raise FmauditInputError(f"task {task}: NaN/inf features in row "
                                f"{int(np.flatnonzero(~np.isfinite(X).all(1))[0])}")
    train = np.flatnonzero(np.isin(data.splits, ["train", "val"]))
    test = np.flatnonzero(data.splits == "test")
    if train.size == 0 or test.size == 0:
        raise FmauditInputError(f"task {task}: need training (train/val) and test items, "
                                f"got {train.size} and {test.size}")
    names = [c.name for c in conditions]
    if len(set(names)) != len(names):
        raise FmauditInputError(f"task {task}: condition names repeat: {names}")
    for c in conditions:
        c.check(test.size, X.shape[1])
    k = data.n_classes
    y, groups = np.asarray(data.labels), np.asarray(data.groups).astype(str)
    strata = y.astype(str) if strata is None else np.asarray(strata).astype(str)
    if strata.shape != y.shape:
        raise FmauditInputError(f"task {task}: {strata.shape} strata for {y.size} items")
    meta = {"encoder": encoder, "task": task, "readout": readout}
    unit = data.group_unit(test)  # what the test items' groups are: patient, slide, ... or item

    det = _fit_detectors(X[train], y[train], groups[train], k, scorers, probe, knn_k, covariance, random_state)
    probe_C_value = float(getattr(det.probe, "C_", probe.C if probe.C is not None else np.nan))
    s_test, logits_test = det.scores(X[test], scorers)
    detection, hist = [], []
    for i, cond in enumerate(conditions):
        boot_seed = int(bootstrap_seed) + i
        if cond.tier in CLASS_TIERS:
            held = hold_out_classes(y, data.class_names, cond.held_out, condition=cond.name)
            tr, te_id, te_ood = train[held.keep[train]], test[held.keep[test]], test[held.held_out[test]]
            if te_ood.size == 0 or te_id.size == 0:
                raise FmauditInputError(f"task {task}, condition {cond.name!r}: the test split has {te_id.size} ID and "
                                        f"{te_ood.size} held-out items; both sets must be non-empty")
            sub = _fit_detectors(X[tr], held.labels[tr], groups[tr], len(held.class_names), scorers, probe,
                                 knn_k, covariance, random_state)
            s_id, _ = sub.scores(X[te_id], scorers)
            s_ood, _ = sub.scores(X[te_ood], scorers)
            g_id, g_ood = groups[te_id], groups[te_ood]
        else:
            s_id = s_test
            s_ood, _ = det.scores(np.asarray(cond.features, np.float64), scorers)
            g_id = groups[test]
            if cond.tier in PAIRED_TIERS:
                g_ood = g_id  # a perturbed copy belongs to its original's patient/slide
            else:
                donor = cond.groups if cond.groups is not None else np.arange(len(cond.features))
                g_id = np.char.add("id:", g_id.astype(str))
                g_ood = np.char.add(f"{cond.name}:", np.asarray(donor).astype(str))
        for name in scorers:
            far = cond.tier not in CLASS_TIERS and cond.tier not in PAIRED_TIERS
            row_unit = f"{unit}+donor {'group' if cond.groups is not None else 'item'}" if far else unit
            row = _detection_row(s_id[name], s_ood[name], g_id, g_ood, int(n_boot), boot_seed, alpha, row_unit)
            detection.append({**meta, "tier": cond.tier, "condition": cond.name, "scorer": name, **row})
            hist += [{**meta, "tier": cond.tier, "condition": cond.name, "scorer": name, **h}
                     for h in _histogram_rows(s_id[name], s_ood[name], int(hist_bins))]

    probs_test = softmax(logits_test)
    summary = selective_summary(probs_test, y[test], ordinal=ordinal, coverages=coverages, n_bins=int(ece_bins),
                                groups=groups[test],
                                n_boot=int(n_boot), random_state=int(bootstrap_seed), alpha=alpha, unit=unit)
    selective = pd.DataFrame([{**meta, "set": "test", **summary, "probe_C": probe_C_value}])
    curves = risk_coverage_curve(probs_test, y[test], coverages=CURVE_COVERAGES)
    curves.insert(0, "set", "test")
    for key, value in reversed(list(meta.items())):
        curves.insert(0, key, value)

    blur_conds = [c for c in conditions if c.tier == "blur"]
    blur = pd.DataFrame()
    if blur_conds:
        parts = [pd.DataFrame({"sigma": 0.0, "item_id": data.item_ids[test], "label": y[test],
                               "prediction": logits_test.argmax(axis=1), "group": groups[test]})]
        for c in blur_conds:
            pred = det.probe.decision_logits(np.asarray(c.features, np.float64)).argmax(axis=1)
            parts.append(pd.DataFrame({"sigma": float(c.sigma), "item_id": data.item_ids[test], "label": y[test],
                                       "prediction": pred, "group": groups[test]}))
        blur = blur_accuracy_curve(pd.concat(parts, ignore_index=True), k, ordinal=ordinal, n_boot=int(n_boot),
                                   random_state=int(bootstrap_seed), alpha=alpha, unit=unit)
        for key, value in reversed(list(meta.items())):
            blur.insert(0, key, value)

    gate_table, gate_model = pd.DataFrame(), None
    if gate_params is not None:
        gate_table, gate_model = _run_gates(data, X, y, groups, strata, train, test, conditions, task, readout,
                                            encoder, gate_params, gate_splits, n_boot, bootstrap_seed, ordinal,
                                            alpha, probe, gate_near)
        gate_table["division_strata"] = strata_name
        for key, value in reversed(list(meta.items())):
            gate_table.insert(0, key, value)
    return OODSuiteResult(detection=pd.DataFrame(detection), selective=selective, curves=curves, blur=blur,
                          gate=gate_table, histograms=pd.DataFrame(hist), gate_model=gate_model,
                          probe_C=probe_C_value)


def _run_gates(data: TaskData, X: np.ndarray, y: np.ndarray, groups: np.ndarray, strata: np.ndarray,
               train: np.ndarray, test: np.ndarray, conditions: Sequence[OODCondition], task: str, readout: str,
               encoder: str,
               gate_params: Mapping[str, Any], gate_splits: int, n_boot: int, bootstrap_seed: int, ordinal: bool,
               alpha: float, probe: ProbeSettings, near: bool) -> tuple[pd.DataFrame, AbstentionGate]:
    params = {**probe.gate_params(), **dict(gate_params)}
    params.setdefault("n_classes", data.n_classes)
    sets = [GateSet("test", X[test], y[test], groups[test], "id")]
    for c in conditions:
        if c.tier == "far":
            donor = c.groups if c.groups is not None else None
            sets.append(GateSet(c.name, np.asarray(c.features, np.float64), None, donor, c.tier))
        elif c.tier in PAIRED_TIERS:
            sets.append(GateSet(c.name, np.asarray(c.features, np.float64), y[test], groups[test], c.tier))
    table, gate = gate_operating_points(X[train], y[train], groups[train], sets, gate_params=params,
                                        n_splits=gate_splits, n_boot=n_boot, bootstrap_seed=bootstrap_seed,
                                        ordinal=ordinal, alpha=alpha, unit=data.group_unit(test), strata=strata[train],
                                        encoder=encoder, readout=readout)
    table.insert(0, "setting", task)
    frames = [table]
    for c in conditions:
        if c.tier != "artefact" and not (near and c.tier == "near"):
            continue
        held = hold_out_classes(y, data.class_names, c.held_out, condition=c.name)
        tr, te_id, te_ood = train[held.keep[train]], test[held.keep[test]], test[held.held_out[test]]
        reduced_params = dict(params, n_classes=len(held.class_names))
        sub, _ = gate_operating_points(
            X[tr], held.labels[tr], groups[tr],
            [GateSet("test", X[te_id], held.labels[te_id], groups[te_id], "id"),
             GateSet(c.name, X[te_ood], None, groups[te_ood], c.tier)],
            gate_params=reduced_params, n_splits=gate_splits, n_boot=n_boot, bootstrap_seed=bootstrap_seed,
            ordinal=False, alpha=alpha, unit=data.group_unit(test), strata=strata[tr], encoder=encoder,
            readout=readout)
        sub.insert(0, "setting", f"{task}:{c.name}")
        frames.append(sub)
    return pd.concat(frames, ignore_index=True), gate
