"""The abstention gate evaluated: one fitted gate on a list of sets, and the gate refitted on several
fit/validation divisions with cluster-bootstrap intervals (:mod:`fmaudit.ood.gate`;
docs/methods.md#the-abstention-gate)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit import metrics
from fmaudit.io import FmauditInputError
from fmaudit.ood.gate.estimator import AbstentionGate
from fmaudit.ood.scorers import check_embeddings
from fmaudit.stats import bootstrap_counts, percentile_interval

#: Column of the operating-point table holding each quantity's mean over the fit/validation divisions (the
#: paper's number is ``value``, the gate of division 0).
DIVISION_MEAN = "mean_over_divisions"

__all__ = ["DIVISION_MEAN", "GateSet", "evaluate_gate", "gate_operating_points"]


@dataclass
class GateSet:
    """A set the gate is applied to: the ID test split (``tier="id"``) or an OOD set.

    ``labels`` (class indices of the gate's label space) give accuracy quantities; OOD sets outside the
    label space have none. ``groups``: resampling units of the bootstrap (patients / slides), else items.

    Parameters
    ----------
    name : str
        The set's name in the tables (unique; not ``validation``).
    features : ndarray of shape (n_items, n_features)
        Embeddings of the set, same encoder and readout as the training split.
    labels : ndarray of shape (n_items,) or None
        Class indices of the gate's label space; None for a set outside it (no accuracy rows).
    groups : ndarray of shape (n_items,) or None
        Patient or slide of each item, the bootstrap's resampling unit; None resamples items.
    tier : str
        ``"id"`` for the test split, else the OOD tier (``near``, ``far``, ...).
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
    """Point quantities of one fitted gate on each set: columns set, tier, quantity, value, n_items.

    Parameters
    ----------
    gate : AbstentionGate
        A fitted gate.
    sets : sequence of GateSet
        Sets to apply it to.
    ordinal : bool
        Also give the quadratic-weighted kappa of all / novelty-passing / accepted items (keyword-only; for
        graded tasks).

    Returns
    -------
    DataFrame
        One row per set and quantity: ``coverage``, ``coverage_novelty_gate``, ``reject_novel``,
        ``reject_unconfident``, ``reject_any`` and, for labelled sets, ``accuracy_ungated``,
        ``accuracy_novelty_gate``, ``accuracy_accepted`` (and ``qwk_*``); ``n_items`` the set's size.
    """
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

    Parameters
    ----------
    X_train : array-like of shape (n_train, n_features)
        Embeddings of the training split.
    y_train : array-like of shape (n_train,)
        Class indices of the training split.
    groups_train : array-like of shape (n_train,) or None
        Patient or slide of each training item (the divisions are group-disjoint); None: items.
    sets : sequence of GateSet
        The test split and the OOD sets, names unique and not ``validation``.
    gate_params : mapping or None
        Keyword arguments of :class:`AbstentionGate`; its ``random_state`` is the seed of division 0.
    n_splits : int
        Fit/validation divisions, at least 1 (the schema's ``ood.gate.n_splits``).
    n_boot : int
        Cluster-bootstrap resamples per division and set, at least 1 (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int
        Seed of division 0's resamples (division i: ``bootstrap_seed + i``).
    ordinal : bool
        Add the ``qwk_*`` quantities (graded tasks).
    alpha : float
        Two-sided level of the percentile interval (0.05: 95%).
    unit : str
        Name of the resampling unit written to ``ci_unit`` when a set has groups (e.g. ``"patient"``).
    strata : array-like of shape (n_train,) or None
        What every division is stratified on (default ``y_train``).
    encoder, readout : str or None
        Recorded on every fitted gate (for its card).

    Returns
    -------
    table : DataFrame
        Columns as listed above, one row per (set, quantity), the ``validation`` rows first.
    gate : AbstentionGate
        The gate of division 0, the one to export.

    Raises
    ------
    FmauditInputError
        ``n_splits`` or ``n_boot`` below 1, duplicate or reserved set names, an unknown gate parameter, or
        invalid training data or sets.
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

