"""The audit paper's two-threshold abstention gate (docs/methods.md#the-abstention-gate), its evaluation and export.

Fitting (:class:`AbstentionGate`):

1. The training split is divided into a fit part and a validation part (:func:`fit_validation_split`): with
   ``validation_fraction = 1/k`` for an integer k (0.2 -> 5) the validation part is the first fold of
   ``StratifiedKFold(k, shuffle=True, random_state)`` over the items, or over the groups (patients / slides,
   each stratified by its most frequent class) when groups are given: the audit paper's ``split_indices``; where every
   class's items sit in fewer groups than folds (small data) the groups are dealt by ``KFold`` instead. Other
   fractions use :func:`fmaudit.probes.split_train_val` (group-disjoint when groups are given).
2. The probe (standardised features, multinomial logistic; C chosen by grouped 3-fold CV on log-loss over
   ``logspace(-6, 0, 7)``, the audit paper's, docs/methods.md#heads, or a given C) and the novelty scorer
   (Mahalanobis with a Ledoit-Wolf pooled covariance by default) are fitted on the fit part.
3. Novelty threshold: the ``1 - id_reject`` quantile (numpy linear interpolation) of the validation novelty
   scores; an item is rejected as novel when its score *exceeds* it.
4. Confidence threshold: the ``1 - retain`` quantile of the probe confidence (max softmax) of the validation
   items that pass the novelty threshold; an item is kept when its confidence is *at least* it.
5. Both thresholds are applied unchanged to any later set: ``decide(X)`` gives per item ``decision``
   (accept / reject_novel / reject_unconfident; novelty is checked first), ``novelty``, ``confidence`` and
   ``prediction`` (class index).

Evaluation (:func:`gate_operating_points`): the gate is fitted on ``n_splits`` fit/validation divisions
(seeds ``random_state + i``), each stratified like the test split (``strata``: PANDA's grade and data provider
jointly), and applied to the test split and every OOD set. Per set: coverage, rejection rates and, where labels
exist, the accuracy (and QWK for ordinal tasks) of all / novelty-passing / accepted items. ``value`` is the
paper's number: the gate of division 0 (the audit paper evaluates one division, seed 0), the exported gate, which
applying it reproduces exactly. Beside it, ``mean_over_divisions`` with the percentile interval of the
bootstrap draws pooled over the divisions (per division ``n_boot`` cluster-bootstrap resamples of the
evaluated set: groups = patients or slides, else items; ``fmaudit.stats.bootstrap_counts`` with seed
``bootstrap_seed + i``) says how much the operating point moves with the division.

Export (:func:`save_gate` / :func:`load_gate`): ``gate.safetensors`` holds the scaler, probe and scorer
arrays; ``gate.json`` (the card) holds the encoder, readout, training-data hash, feature dimension, classes,
thresholds, settings, the validation operating point, the fmaudit version and the sha256 of the arrays.
Nothing is pickled. The card is written last, so a gate folder without a matching card is refused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit import metrics
from fmaudit.io import FmauditInputError, PathLike, atomic_path, provenance, sha256_file, write_json
from fmaudit.ood.scorers import check_embeddings, make_feature_scorer, max_softmax, scorer_from_state
from fmaudit.stats import bootstrap_counts, percentile_interval

DECISIONS = ("accept", "reject_novel", "reject_unconfident")
GATE_FORMAT = "fmaudit-abstention-gate"
GATE_FORMAT_VERSION = 1
ARRAYS_FILE = "gate.safetensors"
CARD_FILE = "gate.json"
DEFAULT_CS = tuple(float(c) for c in np.logspace(-6, 0, 7))
#: Column of the operating-point table holding each quantity's mean over the fit/validation divisions (the
#: paper's number is ``value``, the gate of division 0).
DIVISION_MEAN = "mean_over_divisions"

__all__ = [
    "DECISIONS",
    "DIVISION_MEAN",
    "AbstentionGate",
    "GateSet",
    "evaluate_gate",
    "fit_validation_split",
    "gate_operating_points",
    "load_gate",
    "save_gate",
]


# --------------------------------------------------------------------------------------------------
# fit / validation division
# --------------------------------------------------------------------------------------------------
def fit_validation_split(labels: Any, groups: Any = None, validation_fraction: float = 0.2,
                         random_state: int = 0, strata: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(fit_idx, validation_idx), sorted, group-disjoint when ``groups`` are given (see the module doc).

    ``strata`` (default: the labels) stratifies the division, e.g. class and data provider jointly.
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
    """The audit paper's two-threshold abstention gate (module doc).

    Parameters: ``id_reject`` (nominal ID reject rate of the novelty threshold), ``retain`` (share of the
    novelty-passing validation items kept by the confidence threshold), ``validation_fraction``,
    ``random_state`` (fit/validation division and CV folds), ``C`` (None: chosen among ``Cs`` by ``cv_folds``-
    fold grouped CV on log-loss), ``scorer`` / ``scorer_params`` (a feature scorer of
    :mod:`fmaudit.ood.scorers`; default Mahalanobis, Ledoit-Wolf), ``n_classes`` (label space 0..K-1; default
    max label + 1), ``probe_backend`` / ``probe_device`` (the probe engine's), ``max_iter``, ``tol``.

    Fitted: ``fit_index_``, ``validation_index_``, ``probe_``, ``C_``, ``scorer_``, ``novelty_threshold_``,
    ``confidence_threshold_``, ``validation_point_`` (dict), ``n_features_in_``, ``n_classes_``,
    ``training_data_hash_``, ``encoder_``, ``readout_`` (None unless given to ``fit`` or read from a card).
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
        ``readout`` are recorded for the card and checked by :meth:`decide`."""
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
        """(N, K) probe logits (binary probes: the (-d/2, d/2) pair)."""
        return self.probe_.decision_logits(self._check_input(X, readout))

    def novelty(self, X: Any, readout: str | None = None) -> np.ndarray:
        """(N,) novelty scores of the gate's scorer."""
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
        """Arrays decision (0 accept, 1 reject_novel, 2 reject_unconfident), novelty, confidence, prediction."""
        return self._decide_arrays(self._check_input(X, readout))

    def decide(self, X: Any, readout: str | None = None) -> pd.DataFrame:
        """One row per item: decision (accept / reject_novel / reject_unconfident), novelty, confidence,
        prediction. ``readout``: the caller's readout; a gate fitted on another readout refuses."""
        out = self.decide_arrays(X, readout)
        return pd.DataFrame({"decision": np.asarray(DECISIONS, dtype=object)[out["decision"]],
                             "novelty": out["novelty"], "confidence": out["confidence"],
                             "prediction": out["prediction"].astype(np.int64)})


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------
@dataclass
class GateSet:
    """A set the gate is applied to: the ID test split (``tier="id"``) or an OOD set.

    ``labels`` (class indices of the gate's label space) give accuracy quantities; OOD sets outside the
    label space have none. ``groups``: resampling units of the bootstrap (patients / slides), else items.
    """

    name: str
    features: np.ndarray
    labels: np.ndarray | None = None
    groups: np.ndarray | None = None
    tier: str = "id"


def _qwk_rows(confusion: np.ndarray, k: int) -> np.ndarray:
    """QWK of each row of a (B, K*K) confusion table (rows true, columns predicted); NaN where undefined."""
    cm = confusion.reshape(-1, k, k).astype(np.float64)
    total = cm.sum(axis=(1, 2))
    w = (np.arange(k)[:, None] - np.arange(k)[None, :]) ** 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.einsum("bi,bj->bij", cm.sum(axis=2), cm.sum(axis=1)) / total[:, None, None]
        denom = np.einsum("ij,bij->b", w, expected)
        out = 1.0 - np.einsum("ij,bij->b", w, cm) / denom
    out[~(denom > 0)] = np.nan
    return out


def _set_quantities(weights: np.ndarray, decided: Mapping[str, np.ndarray], labels: np.ndarray | None,
                    k: int, ordinal: bool) -> dict[str, np.ndarray]:
    """Each quantity for every row of ``weights`` (B, N) of item multiplicities (one row of ones = the set)."""
    decision = decided["decision"]
    accept = (decision == 0).astype(np.float64)
    novel = (decision == 1).astype(np.float64)
    passed = 1.0 - novel
    total = weights.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {
            "coverage": weights @ accept / total,
            "coverage_novelty_gate": weights @ passed / total,
            "reject_novel": weights @ novel / total,
            "reject_unconfident": weights @ (decision == 2).astype(np.float64) / total,
            "reject_any": 1.0 - weights @ accept / total,
        }
        if labels is not None:
            pred = decided["prediction"]
            correct = (pred == labels).astype(np.float64)
            out["accuracy_ungated"] = weights @ correct / total
            out["accuracy_novelty_gate"] = weights @ (correct * passed) / (weights @ passed)
            out["accuracy_accepted"] = weights @ (correct * accept) / (weights @ accept)
            if ordinal:
                flat = labels * k + pred
                onehot = np.zeros((labels.size, k * k))
                onehot[np.arange(labels.size), flat] = 1.0
                for name, mask in (("ungated", np.ones_like(accept)), ("novelty_gate", passed), ("accepted", accept)):
                    out[f"qwk_{name}"] = _qwk_rows((weights * mask) @ onehot, k)
    return out


def _check_set(gate: AbstentionGate, s: GateSet) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    X = check_embeddings(s.features, f"set {s.name!r}", gate.n_features_in_, "the gate")
    labels = None
    if s.labels is not None:
        labels = metrics.validate_labels(np.asarray(s.labels), X.shape[0], gate.n_classes_, f"labels of set {s.name!r}")
    groups = None
    if s.groups is not None:
        groups = np.asarray(s.groups)
        if groups.shape != (X.shape[0],):
            raise FmauditInputError(f"set {s.name!r}: {groups.shape} groups for {X.shape[0]} items")
    return X, labels, groups


def evaluate_gate(gate: AbstentionGate, sets: Sequence[GateSet], *, ordinal: bool = False) -> pd.DataFrame:
    """Point quantities of one fitted gate on each set: columns set, tier, quantity, value, n_items."""
    rows = []
    for s in sets:
        X, labels, _ = _check_set(gate, s)
        decided = gate.decide_arrays(X)
        for q, v in _set_quantities(np.ones((1, X.shape[0])), decided, labels, gate.n_classes_, ordinal).items():
            rows.append({"set": s.name, "tier": s.tier, "quantity": q, "value": float(v[0]), "n_items": X.shape[0]})
    return pd.DataFrame(rows, columns=["set", "tier", "quantity", "value", "n_items"])


def _validation_rows(gate: AbstentionGate) -> dict[str, float]:
    vp = gate.validation_point_
    return {"tau_novelty": gate.novelty_threshold_, "tau_confidence": gate.confidence_threshold_,
            "C": gate.C_, "n_fit": vp["n_fit"], "n_validation": vp["n_validation"],
            "reject_novel": vp["reject_novel"], "retain_confident": vp["retain_confident"],
            "coverage": vp["coverage"], "accuracy_ungated": vp["accuracy_ungated"],
            "accuracy_accepted": vp["accuracy_accepted"]}


def gate_operating_points(X_train: Any, y_train: Any, groups_train: Any, sets: Sequence[GateSet], *,
                          gate_params: Mapping[str, Any] | None = None, n_splits: int = 5, n_boot: int,
                          bootstrap_seed: int = 0, ordinal: bool = False, alpha: float = 0.05,
                          unit: str = "group", strata: Any = None, encoder: str | None = None,
                          readout: str | None = None) -> tuple[pd.DataFrame, AbstentionGate]:
    """Fit the gate on ``n_splits`` fit/validation divisions of the training split and evaluate every set.

    Returns (table, gate of division 0 = the one to export). Table columns: set, tier, quantity, value (the
    gate of division 0: the paper's single division and the exported gate), mean_over_divisions,
    mean_over_divisions_ci_lo, mean_over_divisions_ci_hi (percentile interval of the bootstrap draws pooled over
    the divisions; NaN for the validation rows), n_valid, n_splits, n_boot (per division), ci_unit, ci_n_units,
    n_items (a set whose items come from a single group is resampled by item, ``ci_unit`` item). Set
    ``validation`` rows hold the thresholds (tau_novelty, tau_confidence), the selected C and the validation
    operating point. ``strata`` (one per training item; default the labels) stratifies every division, as the
    test split was (audit paper: "stratified in the same way as the test split").
    """
    params = dict(gate_params or {})
    base_seed = int(params.pop("random_state", 0))
    if int(n_splits) < 1:
        raise FmauditInputError(f"n_splits={n_splits!r}: need at least one fit/validation division")
    if int(n_boot) < 1:
        raise FmauditInputError(f"n_boot={n_boot!r}: need at least one bootstrap resample")
    names = [s.name for s in sets]
    if len(set(names)) != len(names) or "validation" in names:
        raise FmauditInputError(f"set names must be unique and not 'validation', got {names}")
    gates = []
    values: dict[tuple[str, str], list[float]] = {}
    draws: dict[tuple[str, str], list[np.ndarray]] = {}
    meta: dict[str, tuple[str, int, int, str]] = {}
    unknown = sorted(set(params) - set(inspect.signature(AbstentionGate).parameters))
    if unknown:
        raise FmauditInputError(f"gate_params: unknown parameter(s) {unknown} of AbstentionGate")
    for i in range(int(n_splits)):
        gate = AbstentionGate(random_state=base_seed + i, **params).fit(
            X_train, y_train, groups_train, strata=strata, encoder=encoder, readout=readout)
        gates.append(gate)
        for q, v in _validation_rows(gate).items():
            values.setdefault(("validation", q), []).append(float(v))
        for s in sets:
            X, labels, groups = _check_set(gate, s)
            if groups is not None and np.unique(groups).size < 2:
                # one patient/slide (a far donor slide): no cluster to resample; its items are, and say so
                groups = None
            decided = gate.decide_arrays(X)
            point = _set_quantities(np.ones((1, X.shape[0])), decided, labels, gate.n_classes_, ordinal)
            counts = bootstrap_counts(X.shape[0], groups, n_boot=int(n_boot), random_state=int(bootstrap_seed) + i)
            boot = _set_quantities(counts.astype(np.float64), decided, labels, gate.n_classes_, ordinal)
            for q in point:
                values.setdefault((s.name, q), []).append(float(point[q][0]))
                draws.setdefault((s.name, q), []).append(boot[q])
            meta[s.name] = (s.tier, X.shape[0], int(np.unique(groups).size) if groups is not None else X.shape[0],
                            unit if groups is not None else "item")
    rows = []
    for (name, q), vals in values.items():
        row = {"set": name, "quantity": q, "value": vals[0],
               "mean_over_divisions": float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan"),
               "n_splits": int(n_splits)}
        if name == "validation":
            row.update(tier="validation", mean_over_divisions_ci_lo=np.nan, mean_over_divisions_ci_hi=np.nan,
                       n_valid=0, n_boot=0, ci_unit="", ci_n_units=0,
                       n_items=gates[0].validation_point_["n_validation"])
        else:
            tier, n_items, n_units, ci_unit = meta[name]
            lo, hi, n_valid = percentile_interval(np.concatenate(draws[(name, q)]), alpha)
            row.update(tier=tier, mean_over_divisions_ci_lo=lo, mean_over_divisions_ci_hi=hi, n_valid=n_valid,
                       n_boot=int(n_boot), ci_unit=ci_unit, ci_n_units=n_units, n_items=n_items)
        rows.append(row)
    cols = ["set", "tier", "quantity", "value", "mean_over_divisions", "mean_over_divisions_ci_lo",
            "mean_over_divisions_ci_hi", "n_valid", "n_splits", "n_boot", "ci_unit", "ci_n_units", "n_items"]
    return pd.DataFrame(rows)[cols], gates[0]


# --------------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------------
def save_gate(gate: AbstentionGate, directory: PathLike, *, encoder: str | None = None, readout: str | None = None,
              data_hash: str | None = None, class_names: Sequence[str] | None = None,
              extra: Mapping[str, Any] | None = None) -> Path:
    """Write a fitted gate to ``directory`` (``gate.safetensors`` + ``gate.json``); returns the card's path.

    ``encoder`` / ``readout`` default to those given to ``fit``; ``data_hash`` to the gate's training-data
    hash (pass the manifest/embedding hash of a workflow run instead). Arrays go first and the card last, each
    atomically; the card records the arrays' sha256.
    """
    from safetensors.numpy import save_file

    gate._check_fitted()
    probe = gate.probe_
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        "scaler.mean": probe.mean_, "scaler.scale": probe.scale_,
        "probe.coef": probe.coef_, "probe.intercept": probe.intercept_,
        "probe.present": probe.present_.astype(np.uint8),
    }
    tensors.update({f"scorer.{k}": v for k, v in gate.scorer_.state_arrays().items()})
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    arrays_path = directory / ARRAYS_FILE
    with atomic_path(arrays_path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": GATE_FORMAT})
    encoder = encoder if encoder is not None else gate.encoder_
    readout = readout if readout is not None else gate.readout_
    k = gate.n_classes_
    names = [str(c) for c in class_names] if class_names is not None else [f"class_{i}" for i in range(k)]
    if len(names) != k:
        raise FmauditInputError(f"class_names: {len(names)} names for a gate with {k} classes")
    card = {
        "format": GATE_FORMAT, "format_version": GATE_FORMAT_VERSION,
        **provenance(),
        "encoder": encoder, "readout": readout,
        "data_hash": data_hash if data_hash is not None else gate.training_data_hash_,
        "training_data_hash": gate.training_data_hash_,
        "n_features": int(gate.n_features_in_), "n_classes": int(k), "class_names": names,
        "probe": {"kind": "logistic", "standardized": True, "C": gate.C_,
                  "selection": "fixed C" if gate.C is not None else
                  f"{gate.cv_folds}-fold {'grouped ' if getattr(gate, 'grouped_', False) else ''}CV on log-loss "
                  f"over {len(np.ravel(gate.Cs))} values"},
        "scorer": {"name": gate.scorer_.name, "params": gate.scorer_.params()},
        "thresholds": {"novelty": gate.novelty_threshold_, "confidence": gate.confidence_threshold_},
        "rules": {"reject_novel": "novelty > thresholds.novelty",
                  "reject_unconfident": "not novel and confidence < thresholds.confidence",
                  "confidence": "max softmax of the probe logits"},
        "settings": gate.get_params(),
        "validation_operating_point": gate.validation_point_,
        "arrays": ARRAYS_FILE, "arrays_sha256": sha256_file(arrays_path),
        **({"extra": dict(extra)} if extra else {}),
    }
    write_json(directory / CARD_FILE, card)
    return directory / CARD_FILE


def load_gate(directory: PathLike) -> AbstentionGate:
    """A fitted :class:`AbstentionGate` from a folder written by :func:`save_gate` (no pickle)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.probes import LogisticProbe

    directory = Path(directory)
    card_path, arrays_path = directory / CARD_FILE, directory / ARRAYS_FILE
    if not card_path.exists():
        raise FmauditInputError(f"{directory}: no {CARD_FILE}; not an exported fmaudit gate (or an unfinished one)")
    try:
        card = json.loads(card_path.read_text())
    except json.JSONDecodeError as err:
        raise FmauditInputError(f"{card_path}: not valid JSON ({err})") from err
    if card.get("format") != GATE_FORMAT:
        raise FmauditInputError(f"{card_path}: format {card.get('format')!r} is not {GATE_FORMAT!r}")
    if int(card.get("format_version", -1)) > GATE_FORMAT_VERSION:
        raise FmauditInputError(f"{card_path}: gate format version {card.get('format_version')} is newer than this "
                                f"fmaudit reads ({GATE_FORMAT_VERSION}); upgrade fmaudit")
    if not arrays_path.exists():
        raise FmauditInputError(f"{directory}: {ARRAYS_FILE} is missing")
    if sha256_file(arrays_path) != card.get("arrays_sha256"):
        raise FmauditInputError(f"{arrays_path}: contents do not match the card's sha256 (a partial or mixed export)")
    try:
        arrays = load_file(str(arrays_path))
    except (SafetensorError, OSError, ValueError) as err:
        raise FmauditInputError(f"{arrays_path}: unreadable safetensors file ({err})") from err
    need = ["scaler.mean", "scaler.scale", "probe.coef", "probe.intercept", "probe.present"]
    missing = [n for n in need if n not in arrays]
    if missing:
        raise FmauditInputError(f"{arrays_path}: missing array(s) {missing}")
    known = set(inspect.signature(AbstentionGate).parameters)
    settings = {k: v for k, v in dict(card.get("settings") or {}).items() if k in known}
    gate = AbstentionGate(**settings)
    k, d = int(card["n_classes"]), int(card["n_features"])
    probe = LogisticProbe(standardize=True, n_classes=k)
    probe.classes_ = np.arange(k)
    probe.present_ = arrays["probe.present"].astype(bool)
    probe.n_features_in_ = d
    probe.mean_, probe.scale_ = arrays["scaler.mean"], arrays["scaler.scale"]
    probe.coef_, probe.intercept_ = arrays["probe.coef"], arrays["probe.intercept"]
    if probe.coef_.shape != (k, d) or probe.mean_.shape != (d,) or probe.present_.shape != (k,):
        raise FmauditInputError(f"{arrays_path}: array shapes do not match the card ({k} classes, {d} features)")
    scorer_state = {n[len("scorer."):]: v for n, v in arrays.items() if n.startswith("scorer.")}
    gate.probe_ = probe
    gate.scorer_ = scorer_from_state(card["scorer"]["name"], card["scorer"]["params"], scorer_state)
    gate.C_ = float(card["probe"]["C"]) if card["probe"].get("C") is not None else float("nan")
    gate.novelty_threshold_ = float(card["thresholds"]["novelty"])
    gate.confidence_threshold_ = float(card["thresholds"]["confidence"])
    gate.n_features_in_, gate.n_classes_ = d, k
    gate.validation_point_ = dict(card.get("validation_operating_point") or {})
    gate.training_data_hash_ = card.get("training_data_hash")
    gate.encoder_, gate.readout_ = card.get("encoder"), card.get("readout")
    gate.grouped_ = "grouped" in str(card["probe"].get("selection", ""))
    gate.card_ = card
    return gate
