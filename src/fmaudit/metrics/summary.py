"""Every headline metric at once, the result-column names of the binned ones (the bin count is part of the name)
and each convention in words for table captions."""

from __future__ import annotations

from typing import Any

import numpy as np

from fmaudit.metrics.calibration_metrics import (
    CLOSURE_RIGHT,
    DEFAULT_N_BINS,
    _adaptive_ece_from_top_label,
    _brier,
    _check_n_bins,
    _classwise_ece,
    _ece_from_scores,
    _mce_from_top_label,
    _nll,
    _prism_ece,
    _top_label,
)
from fmaudit.metrics.discrimination import (
    COLLAPSE_THRESHOLD,
    _auroc,
    _balanced_accuracy_from_confusion,
    _macro_f1_from_confusion,
    confusion_counts,
)
from fmaudit.metrics.risk_coverage import _aurc_from_ranked, _eaurc_from_top_label, _ranked_correct
from fmaudit.metrics.validation import validate_probs_labels


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
