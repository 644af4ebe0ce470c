"""Novelty detection (docs/methods.md#novelty-scorers): how well a score separates an OOD set from an
in-distribution set. OOD is the positive class and a higher score means more out-of-distribution."""

from __future__ import annotations

from typing import Any

import numpy as np

from fmaudit.io import FmauditInputError
from fmaudit.metrics.discrimination import _binary_auc
from fmaudit.metrics.validation import float_array


def _novelty_scores(values: Any, name: str) -> np.ndarray:
    arr = float_array(values, name, 1, "array of novelty scores")
    if arr.size == 0:
        raise FmauditInputError(f"{name}: no scores (an empty set cannot be scored)")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise FmauditInputError(f"{name}: {int(bad.sum())} non-finite score(s), "
                                f"first at position {int(np.argmax(bad))}")
    return arr


def detection_auroc(scores_id: Any, scores_ood: Any) -> float:
    """AUROC of a novelty score separating an OOD set (positive) from an in-distribution set (negative).

    Equals ``roc_auc_score(r_[[0]*n_id + [1]*n_ood], r_[scores_id, scores_ood])``: the Mann-Whitney
    probability that an OOD item scores above an ID item, ties counted 1/2. 0.5 is chance, 1 perfect.

    Parameters
    ----------
    scores_id : array-like of shape (n_id,)
        Novelty scores of the in-distribution items (negatives); finite, at least one.
    scores_ood : array-like of shape (n_ood,)
        Novelty scores of the out-of-distribution items (positives); higher means more OOD.

    Returns
    -------
    float
        AUROC in [0, 1].

    Raises
    ------
    FmauditInputError
        When either set is empty, not 1-D or holds a non-finite score.
    """
    s_id = _novelty_scores(scores_id, "scores_id")
    s_ood = _novelty_scores(scores_ood, "scores_ood")
    positive = np.r_[np.zeros(s_id.size, dtype=bool), np.ones(s_ood.size, dtype=bool)]
    return _binary_auc(np.r_[s_id, s_ood], positive)


def fpr_at_tpr(scores_id: Any, scores_ood: Any, tpr: float = 0.95) -> float:
    """False-positive rate on the ID set at the highest threshold that flags at least ``tpr`` of the OOD set.

    Convention: an item is flagged OOD when its score is >= the threshold t; the candidate thresholds are the
    distinct observed scores, as in ``sklearn.metrics.roc_curve(..., drop_intermediate=False)``, so items
    tied at t are flagged together (a tie block is never split). The result is the FPR of the first ROC point,
    going from the highest threshold down, whose TPR (share of OOD items flagged) is >= ``tpr``. With
    ``drop_intermediate=True`` scikit-learn may drop that very point (collinear ROC points), which gives a
    larger FPR. OOD positive, higher score = more OOD.

    Parameters
    ----------
    scores_id : array-like of shape (n_id,)
        Novelty scores of the in-distribution items (negatives); finite, at least one.
    scores_ood : array-like of shape (n_ood,)
        Novelty scores of the out-of-distribution items (positives); higher means more OOD.
    tpr : float, default 0.95
        Share of OOD items that must be flagged, in (0, 1].

    Returns
    -------
    float
        Share of ID items flagged at that threshold, in [0, 1].

    Raises
    ------
    FmauditInputError
        When ``tpr`` lies outside (0, 1], or a score set is empty, not 1-D or holds a non-finite score.
    """
    if not 0.0 < float(tpr) <= 1.0:
        raise FmauditInputError(f"tpr: must lie in (0, 1], got {tpr!r}")
    s_id = _novelty_scores(scores_id, "scores_id")
    s_ood = _novelty_scores(scores_ood, "scores_ood")
    thresholds = np.unique(np.r_[s_id, s_ood])[::-1]  # descending distinct scores
    # items with score >= t, for every candidate t (searchsorted on the ascending sorted scores)
    ood_sorted, id_sorted = np.sort(s_ood), np.sort(s_id)
    tp = s_ood.size - np.searchsorted(ood_sorted, thresholds, side="left")
    fp = s_id.size - np.searchsorted(id_sorted, thresholds, side="left")
    reached = np.flatnonzero(tp / s_ood.size >= float(tpr))
    return float(fp[reached[0]] / s_id.size)
