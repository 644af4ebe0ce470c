"""Confidence intervals from bootstrap draws: percentile intervals, cluster-bootstrap CIs of one metric, paired
model differences, per-model tables on one shared resample set, and the seed-mean bootstrap of a prediction
cell that the report's leaderboards and paired tables use (docs/methods.md#confidence-intervals).

Percentile intervals use ``np.percentile`` (linear interpolation) of the finite draws at ``alpha/2`` and
``1 - alpha/2``; resamples where a metric is undefined (e.g. AUROC with a class missing) are NaN and left
out, and ``n_valid`` says how many remained. Every result names its resampling unit (``item`` or
``group``) and its count.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit import metrics
from fmaudit.io import FmauditInputError
from fmaudit.stats.bootstrap import (
    bootstrap_counts,
    bootstrap_metric,
    bootstrap_metric_models,
    point_metric,
    resolve_metric,
    validated_models,
)

__all__ = [
    "bootstrap_ci_table",
    "cell_resample_counts",
    "cluster_bootstrap_ci",
    "paired_bootstrap_diff",
    "paired_bootstrap_matrix",
    "percentile_interval",
    "seed_mean_bootstrap",
]


def percentile_interval(draws: np.ndarray, alpha: float = 0.05) -> tuple[float, float, int]:
    """Percentile interval of the finite bootstrap draws and how many there were (NaN, NaN, 0 if none).

    Parameters
    ----------
    draws : array-like of shape (n_boot,)
        Bootstrap draws of a statistic; NaN draws (resamples where it is undefined) are left out.
    alpha : float, default 0.05
        Two-sided level: the ``100 * alpha/2`` and ``100 * (1 - alpha/2)`` percentiles (linear interpolation).

    Returns
    -------
    tuple of (float, float, int)
        ``(ci_lo, ci_hi, n_valid)``: the interval's bounds and the number of non-NaN draws.

    Raises
    ------
    FmauditInputError
        When ``alpha`` is not in (0, 1).
    """
    if not 0.0 < alpha < 1.0:
        raise FmauditInputError(f"alpha: must lie in (0, 1), got {alpha!r}")
    draws = np.asarray(draws, dtype=np.float64)
    valid = draws[~np.isnan(draws)]
    if valid.size == 0:
        return float("nan"), float("nan"), 0
    lo, hi = np.percentile(valid, [100.0 * alpha / 2.0, 100.0 * (1.0 - alpha / 2.0)])
    return float(lo), float(hi), int(valid.size)


def cluster_bootstrap_ci(
    metric_name: str,
    probs: Any,
    labels: Any,
    groups: Any = None,
    *,
    n_boot: int,
    random_state: int = 0,
    alpha: float = 0.05,
    **metric_kwargs: Any,
) -> dict[str, Any]:
    """Point estimate and percentile bootstrap CI of one metric, resampling groups when given.

    Returns dict(point, ci_lo, ci_hi, n_boot, n_valid, unit) with unit "group" or "item".

    Parameters
    ----------
    metric_name : str
        Metric or binned summary column, as :func:`fmaudit.stats.bootstrap.resolve_metric` accepts.
    probs : array-like of shape (n_items, n_classes)
        Predicted class probabilities (rows summing to 1).
    labels : array-like of shape (n_items,)
        Integer class index of each item.
    groups : array-like of shape (n_items,), optional
        Cluster id of each item (e.g. patient); ``None``: an item bootstrap.
    n_boot : int
        Number of resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of the resampling.
    alpha : float, default 0.05
        Two-sided level of the percentile interval.
    **metric_kwargs
        Options of the metric (``n_bins``, ``closure``).

    Returns
    -------
    dict
        ``point``, ``ci_lo``, ``ci_hi``, ``n_boot``, ``n_valid`` (finite draws) and ``unit`` (``"group"`` or
        ``"item"``).

    Raises
    ------
    FmauditInputError
        For an unknown metric or option, invalid probabilities, labels or groups, or ``alpha`` outside (0, 1).
    """
    name, metric_kwargs = resolve_metric(metric_name, metric_kwargs)
    p, y = metrics.validate_probs_labels(probs, labels)
    counts = bootstrap_counts(len(y), groups, n_boot=n_boot, random_state=random_state)
    draws = bootstrap_metric(name, p, y, counts, **metric_kwargs)
    lo, hi, n_valid = percentile_interval(draws, alpha)
    return {
        "point": point_metric(name, p, y, metric_kwargs),
        "ci_lo": lo,
        "ci_hi": hi,
        "n_boot": int(n_boot),
        "n_valid": n_valid,
        "unit": "item" if groups is None else "group",
    }


def _paired_summary(diff_point: float, diffs: np.ndarray, alpha: float) -> dict[str, Any]:
    lo, hi, n_valid = percentile_interval(diffs, alpha)
    valid = diffs[~np.isnan(diffs)]
    if valid.size:
        # Two-sided bootstrap p: twice the smaller share of resampled differences on either side of 0.
        p_share = float(min(1.0, 2.0 * min((valid <= 0).mean(), (valid >= 0).mean())))
    else:
        p_share = float("nan")
    return {"diff": diff_point, "ci_lo": lo, "ci_hi": hi, "p_two_sided_share": p_share, "n_valid": n_valid}


def _shared_draws(metric_name: str, probs_by_model: Mapping[str, Any], labels: Any, n_boot: int, random_state: int,
                  groups: Any, counts: np.ndarray | None, metric_kwargs: Mapping[str, Any]):
    """(metric, its kwargs, validated models, labels, counts, draws per model): every model on one resample set."""
    name, metric_kwargs = resolve_metric(metric_name, metric_kwargs)
    models, y = validated_models(probs_by_model, labels)
    if counts is None:
        counts = bootstrap_counts(len(y), groups, n_boot=n_boot, random_state=random_state)
    return name, metric_kwargs, models, y, counts, bootstrap_metric_models(name, models, y, counts, **metric_kwargs)


def paired_bootstrap_diff(
    metric_name: str,
    probs_a: Any,
    probs_b: Any,
    labels: Any,
    *,
    n_boot: int,
    random_state: int = 0,
    groups: Any = None,
    alpha: float = 0.05,
    **metric_kwargs: Any,
) -> dict[str, Any]:
    """Paired bootstrap of ``metric(a) - metric(b)`` with one shared resample set for both models.

    Returns dict(diff, ci_lo, ci_hi, p_two_sided_share, point_a, point_b, n_boot, n_valid, unit);
    ``p_two_sided_share = min(1, 2 * min(share(diff* <= 0), share(diff* >= 0)))``.

    Parameters
    ----------
    metric_name : str
        Metric or binned summary column, as :func:`fmaudit.stats.bootstrap.resolve_metric` accepts.
    probs_a, probs_b : array-like of shape (n_items, n_classes)
        The two models' class probabilities on the same items in the same order.
    labels : array-like of shape (n_items,)
        Integer class index of each item.
    n_boot : int
        Number of resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of the resampling.
    groups : array-like of shape (n_items,), optional
        Cluster id of each item; ``None``: an item bootstrap.
    alpha : float, default 0.05
        Two-sided level of the percentile interval.
    **metric_kwargs
        Options of the metric (``n_bins``, ``closure``).

    Returns
    -------
    dict
        ``diff`` (``point_a - point_b``), ``ci_lo``, ``ci_hi``, ``p_two_sided_share``, ``point_a``, ``point_b``,
        ``n_boot``, ``n_valid`` and ``unit`` (``"group"`` or ``"item"``).

    Raises
    ------
    FmauditInputError
        For an unknown metric or option, invalid or mismatched probabilities, labels or groups.
    """
    name, metric_kwargs, models, y, counts, draws = _shared_draws(
        metric_name, {"a": probs_a, "b": probs_b}, labels, n_boot, random_state, groups, None, metric_kwargs)
    point_a = point_metric(name, models["a"], y, metric_kwargs)
    point_b = point_metric(name, models["b"], y, metric_kwargs)
    out = _paired_summary(point_a - point_b, draws["a"] - draws["b"], alpha)
    out.update(
        point_a=point_a,
        point_b=point_b,
        n_boot=int(n_boot),
        unit="item" if groups is None else "group",
    )
    return out


def bootstrap_ci_table(
    metric_name: str,
    probs_by_model: Mapping[str, Any],
    labels: Any,
    *,
    n_boot: int,
    random_state: int = 0,
    groups: Any = None,
    alpha: float = 0.05,
    counts: np.ndarray | None = None,
    **metric_kwargs: Any,
) -> pd.DataFrame:
    """Per-model point and percentile CI on one shared resample set.

    Columns: model, metric, point, ci_lo, ci_hi, n_boot, n_valid, unit. Pass ``counts`` (from
    :func:`bootstrap_counts`) to reuse resamples across calls; then n_boot/random_state/groups are unused.

    Parameters
    ----------
    metric_name : str
        Metric or binned summary column, as :func:`fmaudit.stats.bootstrap.resolve_metric` accepts.
    probs_by_model : mapping of str to array-like of shape (n_items, n_classes)
        Class probabilities per model, all on the same items in the same order.
    labels : array-like of shape (n_items,)
        Integer class index of each item.
    n_boot : int
        Number of resamples when ``counts`` is not given (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of the resampling when ``counts`` is not given.
    groups : array-like of shape (n_items,), optional
        Cluster id of each item; ``None``: an item bootstrap. Also sets the ``unit`` column.
    alpha : float, default 0.05
        Two-sided level of the percentile intervals.
    counts : ndarray of shape (B, n_items), optional
        Resample multiplicities to reuse (:func:`~fmaudit.stats.bootstrap.bootstrap_counts`).
    **metric_kwargs
        Options of the metric (``n_bins``, ``closure``).

    Returns
    -------
    DataFrame
        One row per model, columns ``model``, ``metric``, ``point``, ``ci_lo``, ``ci_hi``, ``n_boot`` (rows of the
        resample matrix), ``n_valid`` and ``unit``.

    Raises
    ------
    FmauditInputError
        For an unknown metric or option, invalid or mismatched probabilities, labels, groups or ``counts``.
    """
    name, metric_kwargs, models, y, counts, draws = _shared_draws(
        metric_name, probs_by_model, labels, n_boot, random_state, groups, counts, metric_kwargs)
    rows = []
    for m, p in models.items():
        lo, hi, n_valid = percentile_interval(draws[m], alpha)
        rows.append(
            {
                "model": m,
                "metric": metric_name,
                "point": point_metric(name, p, y, metric_kwargs),
                "ci_lo": lo,
                "ci_hi": hi,
                "n_boot": int(counts.shape[0]),
                "n_valid": n_valid,
                "unit": "item" if groups is None else "group",
            }
        )
    return pd.DataFrame(rows)


def paired_bootstrap_matrix(
    metric_name: str,
    probs_by_model: Mapping[str, Any],
    labels: Any,
    *,
    n_boot: int,
    random_state: int = 0,
    groups: Any = None,
    alpha: float = 0.05,
    counts: np.ndarray | None = None,
    **metric_kwargs: Any,
) -> pd.DataFrame:
    """Paired bootstrap differences between every pair of models, resampling once for all of them.

    One row per unordered pair (model_a before model_b in the mapping's order), with columns model_a,
    model_b, metric, point_a, point_b, diff (= point_a - point_b), ci_lo, ci_hi, p_two_sided_share, n_boot,
    n_valid, unit. Pass ``counts`` to reuse resamples (e.g. from :func:`bootstrap_ci_table`).

    Parameters
    ----------
    metric_name : str
        Metric or binned summary column, as :func:`fmaudit.stats.bootstrap.resolve_metric` accepts.
    probs_by_model : mapping of str to array-like of shape (n_items, n_classes)
        Class probabilities per model, all on the same items in the same order.
    labels : array-like of shape (n_items,)
        Integer class index of each item.
    n_boot : int
        Number of resamples when ``counts`` is not given (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of the resampling when ``counts`` is not given.
    groups : array-like of shape (n_items,), optional
        Cluster id of each item; ``None``: an item bootstrap. Also sets the ``unit`` column.
    alpha : float, default 0.05
        Two-sided level of the percentile intervals.
    counts : ndarray of shape (B, n_items), optional
        Resample multiplicities to reuse (:func:`~fmaudit.stats.bootstrap.bootstrap_counts`).
    **metric_kwargs
        Options of the metric (``n_bins``, ``closure``).

    Returns
    -------
    DataFrame
        One row per unordered pair of models; columns as listed above (empty with those columns for one model).

    Raises
    ------
    FmauditInputError
        For an unknown metric or option, invalid or mismatched probabilities, labels, groups or ``counts``.
    """
    name, metric_kwargs, models, y, counts, draws = _shared_draws(
        metric_name, probs_by_model, labels, n_boot, random_state, groups, counts, metric_kwargs)
    points = {m: point_metric(name, p, y, metric_kwargs) for m, p in models.items()}
    names = list(models)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            row = {"model_a": a, "model_b": b, "metric": metric_name, "point_a": points[a], "point_b": points[b]}
            row.update(_paired_summary(points[a] - points[b], draws[a] - draws[b], alpha))
            row.update(n_boot=int(counts.shape[0]), unit="item" if groups is None else "group")
            rows.append(row)
    columns = [
        "model_a", "model_b", "metric", "point_a", "point_b", "diff", "ci_lo", "ci_hi",
        "p_two_sided_share", "n_boot", "n_valid", "unit",
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------------------------------
# prediction cells: the seed mean of a metric, resampled (the report's leaderboards and paired tables)
# --------------------------------------------------------------------------------------------------
def cell_resample_counts(preds: pd.DataFrame, n_boot: int,
                         random_state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item order, labels, (n_boot, N) group-cluster resample counts) of one cell's test items.

    ``preds`` holds one row per (run, item) with ``item_id``, ``group`` and ``label``; every run of a cell is
    evaluated on the same items, so one resample matrix serves every seed (and, for paired comparisons, every
    encoder) of the cell.

    Parameters
    ----------
    preds : DataFrame
        The cell's predictions, one row per (run, item), with ``item_id``, ``group`` (cluster id, e.g. patient) and
        ``label`` (integer class).
    n_boot : int
        Number of resamples (the schema's ``bootstrap.n_boot``).
    random_state : int
        Seed of the resampling (the schema's ``bootstrap.seed``).

    Returns
    -------
    tuple of (ndarray, ndarray, ndarray)
        The item ids in first-appearance order (N,), their labels as int (N,), and the group-cluster multiplicity
        matrix of shape (n_boot, N) in that order.
    """
    items = preds.drop_duplicates("item_id").set_index("item_id")
    counts = bootstrap_counts(len(items), groups=items["group"].to_numpy(), n_boot=n_boot, random_state=random_state)
    return items.index.to_numpy(), items["label"].to_numpy().astype(int), counts


def seed_mean_bootstrap(preds: pd.DataFrame, metric: str, counts: np.ndarray, order: np.ndarray,
                        labels: np.ndarray, temperature_col: str | None = None,
                        **metric_kwargs: Any) -> tuple[float, np.ndarray]:
    """(mean over seeds of ``metric``, its (B,) resampled values) for one cell, items in ``order``.

    ``preds`` holds the cell's rows of one encoder (``seed``, ``item_id``, ``logits`` and, when given,
    ``temperature_col``); each seed's softmax probabilities are evaluated on the same resamples ``counts``
    (from :func:`cell_resample_counts`) and the draws averaged over seeds, NaN draws left out.

    Parameters
    ----------
    preds : DataFrame
        One encoder's rows of the cell: ``seed``, ``item_id``, ``logits`` (one vector per row) and, when given,
        ``temperature_col``.
    metric : str
        Metric or binned summary column, as :func:`fmaudit.stats.bootstrap.resolve_metric` accepts.
    counts : ndarray of shape (B, N)
        Resample multiplicities of the cell's items (:func:`cell_resample_counts`).
    order : ndarray of shape (N,)
        Item ids in the column order of ``counts``; every seed must have each of them.
    labels : ndarray of shape (N,)
        Integer class of each item, in ``order``.
    temperature_col : str, optional
        Column holding the temperature each seed's logits are divided by before the softmax; ``None``: 1.
    **metric_kwargs
        Options of the metric (``n_bins``, ``closure``).

    Returns
    -------
    tuple of (float, ndarray of shape (B,))
        The mean over seeds of the metric on all items, and the per-resample seed means (NaN draws of a seed left
        out of that resample's mean).
    """
    points, boots = [], []
    full = np.ones((1, len(order)), dtype=np.int32)
    for _, one in preds.groupby("seed"):
        one = one.set_index("item_id").loc[order]
        temp = float(one[temperature_col].iloc[0]) if temperature_col else 1.0
        probs = metrics.softmax(np.stack(one["logits"].to_numpy()).astype(np.float64), temperature=temp)
        points.append(float(bootstrap_metric(metric, probs, labels, full, **metric_kwargs)[0]))
        boots.append(bootstrap_metric(metric, probs, labels, counts, **metric_kwargs))
    return float(np.mean(points)), np.nanmean(np.stack(boots), axis=0)
