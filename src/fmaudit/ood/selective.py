"""Selective prediction (docs/methods.md#selective-prediction): risk-coverage curves, AURC / E-AURC, selective
accuracy, QWK, and accuracy against blur strength.

Conventions (those of :mod:`fmaudit.metrics`): uncertainty ``u = 1 - confidence``; predictions are ranked
from the most to the least confident and tied confidences share their mean correctness (the expectation over
a random order within the tie); after keeping the k most confident predictions, coverage is k/N and risk is
their error rate. Selective accuracy at coverage c keeps ``max(1, round(c * N))`` predictions. E-AURC
subtracts the discrete optimum (all correct predictions first); ``eaurc_random`` is the expected E-AURC of a
ranking independent of correctness (error rate minus the optimum AURC, the audit paper). QWK is
``cohen_kappa_score(weights="quadratic", labels=range(K))``, NaN when undefined.

Intervals: cluster bootstrap (``fmaudit.stats.bootstrap_counts``: groups drawn with replacement, every item of
a drawn group taken as often as the group was drawn), percentile 95% by default; each row names its unit and
how many units there were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from fmaudit import metrics
from fmaudit.io import FmauditInputError

# helpers of the metrics' own modules, on arrays this module has validated already
from fmaudit.metrics.calibration_metrics import _ece_from_scores, _top_label
from fmaudit.metrics.discrimination import _qwk_from_confusion
from fmaudit.metrics.risk_coverage import _aurc_from_ranked, _ranked_correct
from fmaudit.stats import bootstrap_counts, percentile_interval

DEFAULT_COVERAGES = (0.5, 0.8, 0.9, 0.95)

__all__ = [
    "DEFAULT_COVERAGES",
    "PredictionDraws",
    "blur_accuracy_curve",
    "pooled_summary",
    "prediction_draws",
    "prediction_summary",
    "risk_coverage_curve",
    "selective_summary",
]


def _check_coverages(coverages: Sequence[float]) -> list[float]:
    out = [float(c) for c in coverages]
    bad = [c for c in out if not 0.0 < c <= 1.0]
    if bad:
        raise FmauditInputError(f"coverages: each must lie in (0, 1], got {bad}")
    return out


def _check_predictions(labels: Any, predictions: Any, confidence: Any, n_classes: int | None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    y = np.asarray(labels)
    pred = np.asarray(predictions)
    conf = np.asarray(confidence, dtype=np.float64)
    if y.ndim != 1 or y.size == 0:
        raise FmauditInputError(f"labels: expected a non-empty 1-D array, got shape {y.shape}")
    if pred.shape != y.shape or conf.shape != y.shape:
        raise FmauditInputError(
            f"labels {y.shape}, predictions {pred.shape} and confidence {conf.shape} must have one entry per item")
    if not np.isfinite(conf).all():
        raise FmauditInputError("confidence: contains NaN/inf")
    k = int(n_classes) if n_classes is not None else int(max(y.max(), pred.max())) + 1
    y = metrics.validate_labels(y, y.size, k, "labels")
    pred = metrics.validate_labels(pred, pred.size, k, "predictions")
    return y, pred, conf, k


def _ranked(conf: np.ndarray, correct: np.ndarray) -> np.ndarray:
    return _ranked_correct(conf, correct)


def risk_coverage_curve(probs: Any = None, labels: Any = None, coverages: Sequence[float] | None = None, *,
                        confidence: Any = None, correct: Any = None) -> pd.DataFrame:
    """Risk against coverage, abstaining on the least confident first.

    Give ``probs`` (N, K) and ``labels``, or ``confidence`` and ``correct`` (N,) directly (slide-level votes).
    Without ``coverages`` one row per k = 1..N; with them one row per coverage c at k = max(1, round(c N)).
    Columns: k, coverage (k/N), risk, selective_accuracy (1 - risk), confidence_threshold (the k-th largest
    confidence: keeping items with confidence >= it keeps at least k).

    Parameters
    ----------
    probs : array-like of shape (n_items, n_classes) or None
        Class probabilities per item, rows summing to 1; confidence = max, correct = argmax equals the label.
    labels : array-like of shape (n_items,) or None
        True class indices, with ``probs``.
    coverages : sequence of float or None
        Coverages in (0, 1] to report; None gives every k.
    confidence : array-like of shape (n_items,) or None
        Confidence per item, instead of ``probs`` (keyword-only).
    correct : array-like of shape (n_items,) or None
        Whether each item's prediction is right, with ``confidence`` (keyword-only).

    Returns
    -------
    DataFrame
        One row per k (or per coverage), columns ``k``, ``coverage``, ``risk``, ``selective_accuracy``,
        ``confidence_threshold``.

    Raises
    ------
    FmauditInputError
        Neither ``probs`` and ``labels`` nor ``confidence`` and ``correct``, arrays of unequal length or empty,
        NaN/inf confidence, or a coverage outside (0, 1].
    """
    if probs is not None:
        p, y = metrics.validate_probs_labels(probs, labels)
        conf, _, corr = _top_label(p, y)
    else:
        if confidence is None or correct is None:
            raise FmauditInputError("risk_coverage_curve: give probs and labels, or confidence and correct")
        conf = np.asarray(confidence, dtype=np.float64)
        corr = np.asarray(correct, dtype=bool)
        if conf.ndim != 1 or conf.shape != corr.shape or conf.size == 0:
            raise FmauditInputError(f"confidence {conf.shape} and correct {corr.shape}: "
                                    "need equal non-empty 1-D arrays")
        if not np.isfinite(conf).all():
            raise FmauditInputError("confidence: contains NaN/inf")
    n = conf.size
    ranked = _ranked(conf, corr)
    ks = np.arange(1, n + 1)
    if coverages is not None:
        ks = np.array([max(1, int(round(c * n))) for c in _check_coverages(coverages)])
    cum = np.cumsum(ranked)
    sorted_conf = np.sort(conf)[::-1]
    acc = cum[ks - 1] / ks
    return pd.DataFrame({"k": ks, "coverage": ks / n, "risk": 1.0 - acc, "selective_accuracy": acc,
                         "confidence_threshold": sorted_conf[ks - 1]})


def _summary_values(y: np.ndarray, pred: np.ndarray, conf: np.ndarray, k: int, ordinal: bool,
                    coverages: Sequence[float], n_bins: int) -> dict[str, float]:
    correct = pred == y
    ranked = _ranked(conf, correct)
    aurc = _aurc_from_ranked(ranked)
    optimum = _aurc_from_ranked(np.sort(correct.astype(np.float64))[::-1])
    out = {
        "accuracy": float(correct.mean()),
        "error_rate": float(1.0 - correct.mean()),
        "mean_confidence": float(conf.mean()),
        f"ece_top_{n_bins}_lohi": _ece_from_scores(conf, correct, n_bins, metrics.CLOSURE_RIGHT),
        "aurc": aurc,
        "eaurc": aurc - optimum,
        "eaurc_random": float(1.0 - correct.mean()) - optimum,
    }
    for c in coverages:
        m = max(1, int(round(c * ranked.size)))
        out[f"selective_accuracy_c{c:g}"] = float(ranked[:m].mean())
    if ordinal:
        out["qwk"] = _qwk_from_confusion(metrics.confusion_counts(y, pred, k))
    return out


@dataclass
class PredictionDraws:
    """The selective-prediction metrics of one set of predictions and their bootstrap draws (one split).

    Parameters
    ----------
    point : dict of str to float
        Metric -> value on the set (keys of :func:`prediction_summary` less ``n``).
    draws : dict of str to ndarray of shape (n_boot,)
        Metric -> its values over the resamples; empty without a bootstrap.
    n : int
        Number of items.
    unit : str
        What was resampled (the caller's unit name, or ``"item"``).
    n_units : int
        How many units there were.
    n_boot : int
        Number of resamples (0: none).
    """

    point: dict[str, float]
    draws: dict[str, np.ndarray]
    n: int
    unit: str
    n_units: int
    n_boot: int


def prediction_draws(labels: Any, predictions: Any, confidence: Any, n_classes: int | None = None, *,
                     ordinal: bool = False, coverages: Sequence[float] = DEFAULT_COVERAGES,
                     n_bins: int = metrics.DEFAULT_N_BINS, groups: Any = None, n_boot: int,
                     random_state: int = 0, unit: str = "group") -> PredictionDraws:
    """The metrics of :func:`prediction_summary` and, with ``n_boot > 0``, their draws over ``n_boot``
    (cluster, when ``groups`` are given) bootstrap resamples seeded by ``random_state``.

    Parameters
    ----------
    labels : array-like of shape (n_items,)
        True class indices 0..K-1.
    predictions : array-like of shape (n_items,)
        Predicted class indices 0..K-1.
    confidence : array-like of shape (n_items,)
        Confidence of each prediction (e.g. max probability, a slide vote's share); finite.
    n_classes : int or None
        Size of the label space K (default: largest label or prediction + 1).
    ordinal : bool
        Add the quadratic-weighted kappa ``qwk`` (graded tasks; keyword-only).
    coverages : sequence of float
        Coverages in (0, 1] of the ``selective_accuracy_c<c>`` metrics (default 0.5, 0.8, 0.9, 0.95).
    n_bins : int
        Equal-width bins of the top-label ECE, (lo, hi] closure (default 15).
    groups : array-like of shape (n_items,) or None
        Patient or slide of each item, the bootstrap's resampling unit; None resamples items.
    n_boot : int
        Bootstrap resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``); 0 gives no interval.
    random_state : int
        Seed of the resamples (``fmaudit.stats.bootstrap_counts``).
    unit : str
        Name written to ``ci_unit`` when ``groups`` are given (e.g. ``"patient"``); ``"item"`` otherwise.

    Returns
    -------
    PredictionDraws
        The point values, the draws (empty when ``n_boot`` is 0) and how they were drawn.

    Raises
    ------
    FmauditInputError
        Arrays not one entry per item, labels or predictions outside 0..K-1, NaN/inf confidence, or a coverage
        outside (0, 1].
    """
    y, pred, conf, k = _check_predictions(labels, predictions, confidence, n_classes)
    coverages = _check_coverages(coverages)
    point = _summary_values(y, pred, conf, k, ordinal, coverages, int(n_bins))
    draws: dict[str, np.ndarray] = {}
    if n_boot and int(n_boot) > 0:
        counts = bootstrap_counts(y.size, groups, n_boot=int(n_boot), random_state=random_state)
        draws = {key: np.empty(counts.shape[0]) for key in point}
        for b, row in enumerate(counts):
            idx = np.repeat(np.arange(y.size), row)
            values = _summary_values(y[idx], pred[idx], conf[idx], k, ordinal, coverages, int(n_bins))
            for key, v in values.items():
                draws[key][b] = v
    n_units = int(np.unique(np.asarray(groups)).size) if groups is not None else int(y.size)
    return PredictionDraws(point, draws, int(y.size), unit if groups is not None else "item", n_units,
                           int(n_boot) if n_boot else 0)


def prediction_summary(labels: Any, predictions: Any, confidence: Any, n_classes: int | None = None, *,
                       ordinal: bool = False, coverages: Sequence[float] = DEFAULT_COVERAGES,
                       n_bins: int = metrics.DEFAULT_N_BINS, groups: Any = None, n_boot: int,
                       random_state: int = 0, alpha: float = 0.05, unit: str = "group") -> dict[str, Any]:
    """Selective-prediction summary of predictions with a confidence each (tile probes or slide aggregators).

    Keys: n, accuracy, error_rate, mean_confidence, ece_top_<b>_lohi, aurc, eaurc, eaurc_random,
    selective_accuracy_c<c> per coverage, qwk (ordinal only). With ``n_boot > 0`` each metric gets
    ``<metric>_ci_lo`` / ``_ci_hi`` from a (cluster, when ``groups`` are given) bootstrap, and ``ci_unit``,
    ``ci_n_units``, ``n_boot`` say how it was drawn.

    Parameters
    ----------
    labels : array-like of shape (n_items,)
        True class indices 0..K-1.
    predictions : array-like of shape (n_items,)
        Predicted class indices 0..K-1.
    confidence : array-like of shape (n_items,)
        Confidence of each prediction (e.g. max probability, a slide vote's share); finite.
    n_classes : int or None
        Size of the label space K (default: largest label or prediction + 1).
    ordinal : bool
        Add the quadratic-weighted kappa ``qwk`` (graded tasks; keyword-only).
    coverages : sequence of float
        Coverages in (0, 1] of the ``selective_accuracy_c<c>`` metrics (default 0.5, 0.8, 0.9, 0.95).
    n_bins : int
        Equal-width bins of the top-label ECE, (lo, hi] closure (default 15).
    groups : array-like of shape (n_items,) or None
        Patient or slide of each item, the bootstrap's resampling unit; None resamples items.
    n_boot : int
        Bootstrap resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``); 0 gives no interval.
    random_state : int
        Seed of the resamples (``fmaudit.stats.bootstrap_counts``).
    alpha : float
        Two-sided level of the percentile intervals (0.05: 95%).
    unit : str
        Name written to ``ci_unit`` when ``groups`` are given (e.g. ``"patient"``); ``"item"`` otherwise.

    Returns
    -------
    dict
        The keys listed above; floats except ``n``, ``ci_n_units``, ``n_boot`` (int) and ``ci_unit`` (str).

    Raises
    ------
    FmauditInputError
        Arrays not one entry per item, labels or predictions outside 0..K-1, NaN/inf confidence, or a coverage
        outside (0, 1].
    """
    res = prediction_draws(labels, predictions, confidence, n_classes, ordinal=ordinal, coverages=coverages,
                           n_bins=n_bins, groups=groups, n_boot=n_boot, random_state=random_state, unit=unit)
    out: dict[str, Any] = {"n": res.n, **res.point}
    if res.n_boot > 0:
        for key in res.point:
            lo, hi, _ = percentile_interval(res.draws[key], alpha)
            out[f"{key}_ci_lo"], out[f"{key}_ci_hi"] = lo, hi
        out["ci_unit"], out["ci_n_units"], out["n_boot"] = res.unit, res.n_units, res.n_boot
    return out


def pooled_summary(parts: Sequence[PredictionDraws], alpha: float = 0.05) -> dict[str, Any]:
    """The audit paper's summary over several train/test splits: each metric's mean over the splits (``n`` the mean
    number of test items), and, where the splits were resampled, the percentile interval of the bootstrap draws
    pooled over them (``n_boot`` per split, ``n_boot_pooled`` in all; ``ci_n_units`` the mean number of
    resampled units per split); ``<metric>_sd_over_splits`` (ddof 1) is the spread of the split means.

    Parameters
    ----------
    parts : sequence of PredictionDraws
        One per train/test split, same metrics.
    alpha : float
        Two-sided level of the percentile intervals (0.05: 95%).

    Returns
    -------
    dict
        ``n``, ``n_splits``, each metric and its ``_sd_over_splits``; with resampled splits also ``_ci_lo`` /
        ``_ci_hi`` per metric, ``ci_unit`` (the splits' units joined by ``+``), ``ci_n_units``, ``n_boot``,
        ``n_boot_pooled``.

    Raises
    ------
    FmauditInputError
        No splits.
    """
    if not parts:
        raise FmauditInputError("pooled_summary: no splits")
    keys = list(parts[0].point)
    out: dict[str, Any] = {"n": float(np.mean([p.n for p in parts])), "n_splits": len(parts)}
    for key in keys:
        values = np.array([p.point.get(key, np.nan) for p in parts], dtype=np.float64)
        out[key] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
        finite = values[np.isfinite(values)]
        out[f"{key}_sd_over_splits"] = float(finite.std(ddof=1)) if finite.size > 1 else float("nan")
    if all(p.n_boot > 0 for p in parts):
        for key in keys:
            lo, hi, _ = percentile_interval(np.concatenate([p.draws[key] for p in parts]), alpha)
            out[f"{key}_ci_lo"], out[f"{key}_ci_hi"] = lo, hi
        out["ci_unit"] = "+".join(dict.fromkeys(p.unit for p in parts))
        out["ci_n_units"] = float(np.mean([p.n_units for p in parts]))
        out["n_boot"] = int(parts[0].n_boot)
        out["n_boot_pooled"] = int(sum(p.n_boot for p in parts))
    return out


def selective_summary(probs: Any, labels: Any, *, ordinal: bool = False,
                      coverages: Sequence[float] = DEFAULT_COVERAGES, n_bins: int = metrics.DEFAULT_N_BINS,
                      groups: Any = None, n_boot: int, random_state: int = 0, alpha: float = 0.05,
                      unit: str = "group") -> dict[str, Any]:
    """:func:`prediction_summary` of a probe's probabilities: prediction = argmax (ties to the lowest class),
    confidence = max probability.

    Parameters
    ----------
    probs : array-like of shape (n_items, n_classes)
        Class probabilities per item, rows summing to 1.
    labels : array-like of shape (n_items,)
        True class indices 0..K-1.
    ordinal : bool
        Add the quadratic-weighted kappa ``qwk`` (graded tasks; keyword-only).
    coverages : sequence of float
        Coverages in (0, 1] of the ``selective_accuracy_c<c>`` metrics (default 0.5, 0.8, 0.9, 0.95).
    n_bins : int
        Equal-width bins of the top-label ECE, (lo, hi] closure (default 15).
    groups : array-like of shape (n_items,) or None
        Patient or slide of each item, the bootstrap's resampling unit; None resamples items.
    n_boot : int
        Bootstrap resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``); 0 gives no interval.
    random_state : int
        Seed of the resamples (``fmaudit.stats.bootstrap_counts``).
    alpha : float
        Two-sided level of the percentile intervals (0.05: 95%).
    unit : str
        Name written to ``ci_unit`` when ``groups`` are given (e.g. ``"patient"``); ``"item"`` otherwise.

    Returns
    -------
    dict
        The summary of :func:`prediction_summary`.
    """
    p, y = metrics.validate_probs_labels(probs, labels)
    return prediction_summary(y, p.argmax(axis=1), p.max(axis=1), p.shape[1], ordinal=ordinal,
                              coverages=coverages, n_bins=n_bins, groups=groups, n_boot=n_boot,
                              random_state=random_state, alpha=alpha, unit=unit)


def blur_accuracy_curve(predictions: pd.DataFrame, n_classes: int | None = None, *, ordinal: bool = False,
                        n_boot: int, random_state: int = 0, alpha: float = 0.05,
                        unit: str = "group") -> pd.DataFrame:
    """Accuracy (and QWK for ordinal tasks) of one probe against blur strength.

    ``predictions``: one row per (sigma, item) with columns ``sigma`` (0 = unblurred), ``item_id`` (the
    unblurred item's id, the same at every sigma), ``label``, ``prediction`` and optionally ``group``.
    Returns one row per sigma, ascending: sigma, n, accuracy, accuracy_change (minus sigma 0; NaN without a
    sigma-0 row), and qwk / qwk_change when ``ordinal``. With ``n_boot > 0`` the intervals of accuracy and of
    its change are paired: one resample of items (of groups, with a ``group`` column) is shared by all sigmas.

    Parameters
    ----------
    predictions : DataFrame
        The per-(sigma, item) predictions described above.
    n_classes : int or None
        Size of the label space K (default: largest label or prediction + 1).
    ordinal : bool
        Add ``qwk`` and ``qwk_change`` (keyword-only).
    n_boot : int
        Bootstrap resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``); 0 gives no interval.
    random_state : int
        Seed of the resamples.
    alpha : float
        Two-sided level of the percentile intervals (0.05: 95%).
    unit : str
        Name written to ``ci_unit`` when ``predictions`` has a ``group`` column; ``"item"`` otherwise.

    Returns
    -------
    DataFrame
        One row per sigma as described; with a bootstrap also ``accuracy_ci_lo`` / ``_hi``,
        ``accuracy_change_ci_lo`` / ``_hi`` (NaN at sigma 0), ``ci_unit``, ``ci_n_units``, ``n_boot``.

    Raises
    ------
    FmauditInputError
        Missing columns, no rows, a negative or missing sigma, an item twice at one sigma, or labels or
        predictions outside 0..K-1.
    """
    need = {"sigma", "item_id", "label", "prediction"}
    missing = sorted(need - set(predictions.columns))
    if missing:
        raise FmauditInputError(f"blur predictions: missing column(s) {missing}")
    if len(predictions) == 0:
        raise FmauditInputError("blur predictions: no rows")
    df = predictions.copy()
    df["sigma"] = df["sigma"].astype(float)
    if (df["sigma"] < 0).any() or df["sigma"].isna().any():
        raise FmauditInputError("blur predictions: sigma must be >= 0 (0 = unblurred)")
    dup = df.duplicated(["sigma", "item_id"])
    if dup.any():
        row = df[dup].iloc[0]
        raise FmauditInputError(f"blur predictions: item {row['item_id']!r} occurs twice at sigma {row['sigma']:g}")
    k = int(n_classes) if n_classes is not None else int(max(df["label"].max(), df["prediction"].max())) + 1
    items = pd.Index(pd.unique(df["item_id"].astype(str)))
    sigmas = sorted(df["sigma"].unique())
    counts = None
    if n_boot and int(n_boot) > 0:
        groups = None
        if "group" in df.columns:
            first = df.drop_duplicates("item_id").set_index(df.drop_duplicates("item_id")["item_id"].astype(str))
            groups = first.loc[items, "group"].astype(str).to_numpy()
        counts = bootstrap_counts(len(items), groups, n_boot=int(n_boot), random_state=random_state)
        n_units = len(np.unique(groups)) if groups is not None else len(items)
    rows, acc_draws = [], {}
    for s in sigmas:
        part = df[df["sigma"] == s]
        y = metrics.validate_labels(part["label"].to_numpy(), len(part), k, f"labels at sigma {s:g}")
        pred = metrics.validate_labels(part["prediction"].to_numpy(), len(part), k, f"predictions at sigma {s:g}")
        correct = (pred == y).astype(np.float64)
        row: dict[str, Any] = {"sigma": float(s), "n": int(len(part)), "accuracy": float(correct.mean())}
        if ordinal:
            row["qwk"] = _qwk_from_confusion(metrics.confusion_counts(y, pred, k))
        if counts is not None:
            pos = items.get_indexer(part["item_id"].astype(str))
            w = counts[:, pos].astype(np.float64)
            acc_draws[s] = (w @ correct) / np.maximum(w.sum(axis=1), 1e-300)
            acc_draws[s][w.sum(axis=1) == 0] = np.nan
            row["accuracy_ci_lo"], row["accuracy_ci_hi"], _ = percentile_interval(acc_draws[s], alpha)
        rows.append(row)
    out = pd.DataFrame(rows)
    base = out.loc[out["sigma"] == 0.0]
    out["accuracy_change"] = out["accuracy"] - (float(base["accuracy"].iloc[0]) if len(base) else np.nan)
    if ordinal:
        out["qwk_change"] = out["qwk"] - (float(base["qwk"].iloc[0]) if len(base) else np.nan)
    if counts is not None:
        lo, hi = [], []
        for s in sigmas:
            if 0.0 in acc_draws and s != 0.0:  # sigma 0 is the reference: its change is 0 by definition
                a, b, _ = percentile_interval(acc_draws[s] - acc_draws[0.0], alpha)
            else:
                a, b = np.nan, np.nan
            lo.append(a)
            hi.append(b)
        out["accuracy_change_ci_lo"], out["accuracy_change_ci_hi"] = lo, hi
        out["ci_unit"] = unit if "group" in df.columns else "item"
        out["ci_n_units"] = n_units
        out["n_boot"] = int(n_boot)
    return out
