"""Rankings of models across domains: rank transfer (Spearman, Kendall, dethroning), Spearman ρ of many
resampled score pairs at once (for bootstrap intervals of ρ), and the paired Wilcoxon "significant win" of
CellPath-Bench (docs/methods.md#significant-wins).

scipy.stats is imported in the functions that use it, not with the module: the workflow's planning imports the
report's chapter declarations, which reach this module, and scipy.stats took 0.5-0.7 s of every `snakemake`
call's start-up."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

from fmaudit.io import FmauditInputError

logger = logging.getLogger(__name__)

__all__ = ["rank_transfer", "spearman_rows", "wilcoxon_smallest_p", "wilcoxon_win"]


def rank_transfer(
    scores_source: Mapping[str, float],
    scores_target: Mapping[str, float],
    higher_is_better: bool = True,
) -> dict[str, Any]:
    """How well a source-domain ranking of models carries over to a target domain.

    Uses the models present in both mappings (others are logged and dropped). Spearman rho (average ranks
    for ties) and Kendall tau-b with their scipy p-values; ``source_best`` is the best model on the source
    (first in source order on a tie), ``target_rank_of_source_best`` its competition rank on the target
    (1 = best; models tied with it share its rank), ``dethroned`` whether that rank is worse than 1.

    Parameters
    ----------
    scores_source : mapping of str to float
        Each model's score on the source domain (e.g. macro-F1); its order breaks ties for ``source_best``.
    scores_target : mapping of str to float
        Each model's score on the target domain.
    higher_is_better : bool, default True
        False for scores where lower is better (ECE, NLL): the ranks are reversed.

    Returns
    -------
    dict
        ``spearman_rho``, ``spearman_p``, ``kendall_tau_b``, ``kendall_p``, ``n_models`` (models in both),
        ``source_best``, ``target_rank_of_source_best`` and ``dethroned`` (bool).

    Raises
    ------
    FmauditInputError
        When fewer than two models are scored in both domains, or a score is not finite.
    """
    common = [m for m in scores_source if m in scores_target]
    dropped = sorted(set(scores_source) ^ set(scores_target), key=str)
    if dropped:
        logger.warning("rank_transfer: models missing from one domain were dropped: %s", dropped)
    if len(common) < 2:
        raise FmauditInputError(f"rank_transfer: need at least 2 models scored in both domains, got {common}")
    src = np.array([scores_source[m] for m in common], dtype=np.float64)
    tgt = np.array([scores_target[m] for m in common], dtype=np.float64)
    for label, arr in (("scores_source", src), ("scores_target", tgt)):
        if not np.isfinite(arr).all():
            bad = [m for m, v in zip(common, arr) if not np.isfinite(v)]
            raise FmauditInputError(f"{label}: non-finite score for model(s) {bad}")
    sign = 1.0 if higher_is_better else -1.0
    from scipy import stats as sps  # (module doc)

    rho, rho_p = sps.spearmanr(src, tgt)
    tau, tau_p = sps.kendalltau(src, tgt, variant="b")
    best = int(np.argmax(sign * src))
    rank = 1 + int((sign * tgt > sign * tgt[best]).sum())
    return {
        "spearman_rho": float(rho),
        "spearman_p": float(rho_p),
        "kendall_tau_b": float(tau),
        "kendall_p": float(tau_p),
        "n_models": len(common),
        "source_best": common[best],
        "target_rank_of_source_best": rank,
        "dethroned": rank > 1,
    }



def spearman_rows(x: Any, y: Any) -> np.ndarray:
    """Spearman ρ of each row pair: ``x`` and ``y`` are (B, M) scores of M models in B resamples; returns (B,).

    Average ranks for ties within a row (as ``scipy.stats.spearmanr``); a row in which either side is
    constant has no ranking, and its ρ is NaN. NaN scores are not allowed.

    Parameters
    ----------
    x : array-like of shape (B, M)
        Scores of M models (columns) in B resamples (rows), e.g. on the source domain; finite.
    y : array-like of shape (B, M)
        The same models' scores in the same resamples on the other domain; finite.

    Returns
    -------
    ndarray of shape (B,)
        Spearman ρ of each row pair, clipped to [-1, 1]; NaN where a row is constant.

    Raises
    ------
    FmauditInputError
        When ``x`` and ``y`` are not 2-D of one shape, have fewer than 2 columns, or hold non-finite scores.
    """
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise FmauditInputError(f"spearman_rows: x and y must be 2-D of one shape, got {a.shape} and {b.shape}")
    if a.shape[1] < 2:
        raise FmauditInputError(f"spearman_rows: need at least 2 models per row, got {a.shape[1]}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise FmauditInputError("spearman_rows: scores must be finite")
    from scipy import stats as sps  # (module doc)

    ra = sps.rankdata(a, axis=1) - (a.shape[1] + 1) / 2
    rb = sps.rankdata(b, axis=1) - (a.shape[1] + 1) / 2
    denom = np.sqrt((ra * ra).sum(axis=1) * (rb * rb).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (ra * rb).sum(axis=1) / denom
    rho[denom == 0] = np.nan
    return np.clip(rho, -1.0, 1.0)


def wilcoxon_win(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """CellPath "significant win" of a over b on paired units (docs/methods.md#significant-wins).

    Pairs where either value is NaN are dropped. ``scipy.stats.wilcoxon(a, b)`` with its defaults
    (two-sided, zero_method="wilcox": zero differences are dropped). win = p < alpha and median(a - b) > 0.
    With no non-zero difference p is NaN and win is False. Returns dict(p, median_diff, win, n_nonzero,
    n_pairs).

    Parameters
    ----------
    a : sequence of float
        Scores of the first model on the paired units (e.g. one per fold or data set).
    b : sequence of float
        Scores of the second model on the same units, in the same order.
    alpha : float, default 0.05
        Significance level of the win.

    Returns
    -------
    dict
        ``p`` (NaN without a non-zero difference), ``median_diff`` (median of ``a - b`` over the kept pairs),
        ``win`` (bool), ``n_nonzero`` and ``n_pairs`` (pairs without NaN).

    Raises
    ------
    FmauditInputError
        When ``a`` and ``b`` are not 1-D of equal length.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise FmauditInputError(f"wilcoxon_win: a and b must be 1-D of equal length ({x.shape}, {y.shape})")
    valid = ~(np.isnan(x) | np.isnan(y))
    x, y = x[valid], y[valid]
    d = x - y
    n_nonzero = int((d != 0).sum())
    median_diff = float(np.median(d)) if d.size else float("nan")
    from scipy import stats as sps  # (module doc)

    p = float(sps.wilcoxon(x, y).pvalue) if n_nonzero > 0 else float("nan")
    return {
        "p": p,
        "median_diff": median_diff,
        "win": bool(n_nonzero > 0 and p < alpha and median_diff > 0),
        "n_nonzero": n_nonzero,
        "n_pairs": int(d.size),
    }


def wilcoxon_smallest_p(n_pairs: int) -> float:
    """The smallest two-sided p-value the exact Wilcoxon signed-rank test can give on ``n_pairs`` pairs without ties
    or zero differences (every difference of one sign): 2 / 2**n. Below 6 pairs it is at least 0.0625, so a
    significant win at 0.05 is impossible there, whatever the data.

    Parameters
    ----------
    n_pairs : int
        Number of paired units.

    Returns
    -------
    float
        ``2 / 2**n_pairs``; 1.0 when ``n_pairs`` is 0 or less.
    """
    return 2.0 / 2 ** int(n_pairs) if n_pairs > 0 else 1.0
