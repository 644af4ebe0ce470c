"""Bootstrap confidence intervals, paired model comparisons, rank transfer and meta-analysis (METHODS 7).

Bootstraps are expressed as a (B, N) matrix of item multiplicities ("counts"): resample b takes item i
``counts[b, i]`` times. Every metric with a linear sufficient statistic (accuracy, macro-F1, balanced
accuracy, top-label ECE, NLL, Brier) is then one matrix product ``counts @ features``, evaluated for
all resamples and all models at once; AUROC uses a vectorised weighted Mann-Whitney statistic. Other
metrics of :mod:`fmaudit.metrics` fall back to a per-resample loop. Because all models are evaluated on one
counts matrix, model comparisons are paired.

Resampling follows seed 003: ``rng = np.random.default_rng(random_state)``; each resample draws
``rng.integers(0, n, n)`` items, or, with groups, ``rng.integers(0, G, G)`` groups (sorted group ids, as
``np.unique``) and takes every item of each drawn group as many times as the group was drawn.
Percentile intervals use ``np.nanpercentile`` (linear interpolation) at ``alpha/2`` and ``1 - alpha/2``;
resamples where a metric is undefined (e.g. AUROC with a class missing) are NaN and left out, and
``n_valid`` says how many remained.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from fmaudit import metrics
from fmaudit.io import FmauditInputError

logger = logging.getLogger(__name__)

# Rows of the counts matrix converted to float64 per block, to bound memory (~16 MB per block array).
_BLOCK_ELEMENTS = 2_000_000

__all__ = [
    "BOOTSTRAP_METRICS",
    "bootstrap_ci_table",
    "bootstrap_counts",
    "bootstrap_metric",
    "bootstrap_metric_models",
    "cluster_bootstrap_ci",
    "fisher_z_meta",
    "hierarchical_bootstrap_draws",
    "hierarchical_bootstrap_mean",
    "paired_bootstrap_diff",
    "paired_bootstrap_matrix",
    "percentile_interval",
    "rank_transfer",
    "two_way_cluster_bootstrap",
    "wilcoxon_win",
]


# --------------------------------------------------------------------------------------------------
# resampling
# --------------------------------------------------------------------------------------------------
def _group_codes(groups: Any, n_items: int) -> tuple[np.ndarray, int]:
    arr = np.asarray(groups)
    if arr.ndim != 1 or len(arr) != n_items:
        raise FmauditInputError(f"groups: expected one group id per item ({n_items}), got shape {arr.shape}")
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise FmauditInputError("groups: contains NaN (missing group ids)")
    if arr.dtype.kind == "O" and pd.isna(arr).any():
        raise FmauditInputError("groups: contains missing group ids")
    _, code = np.unique(arr, return_inverse=True)
    return code.reshape(-1), int(code.max()) + 1


def bootstrap_counts(
    n_items: int, groups: Any = None, n_boot: int = 2000, random_state: int = 0
) -> np.ndarray:
    """(n_boot, n_items) int32 multiplicity matrix of an item or cluster bootstrap.

    Without ``groups`` each row draws ``n_items`` items with replacement. With ``groups`` (one id per item)
    each row draws G groups with replacement and every item of a drawn group gets that group's
    multiplicity, so groups are kept whole and a resample's size varies. The draws equal seed 003's
    sequential ``rng.integers`` calls with ``np.random.default_rng(random_state)``.
    """
    if int(n_items) != n_items or n_items < 1:
        raise FmauditInputError(f"n_items: expected a positive integer, got {n_items!r}")
    if int(n_boot) != n_boot or n_boot < 1:
        raise FmauditInputError(f"n_boot: expected a positive integer, got {n_boot!r}")
    n_items, n_boot = int(n_items), int(n_boot)
    rng = np.random.default_rng(random_state)
    if groups is None:
        code, n_units = None, n_items
    else:
        code, n_units = _group_codes(groups, n_items)
    out = np.empty((n_boot, n_items), dtype=np.int32)
    block = max(1, _BLOCK_ELEMENTS // n_units)
    for start in range(0, n_boot, block):
        stop = min(n_boot, start + block)
        rows = stop - start
        # One (rows, n_units) draw consumes the generator exactly like `rows` sequential draws.
        drawn = rng.integers(0, n_units, size=(rows, n_units))
        flat = drawn + (np.arange(rows) * n_units)[:, None]
        unit_counts = np.bincount(flat.ravel(), minlength=rows * n_units).reshape(rows, n_units)
        out[start:stop] = unit_counts if code is None else unit_counts[:, code]
    return out


def _check_counts(counts: Any, n_items: int) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.ndim != 2 or arr.shape[1] != n_items:
        raise FmauditInputError(f"counts: expected shape (B, {n_items}), got {arr.shape}")
    if arr.dtype.kind not in "iu" or (arr < 0).any():
        raise FmauditInputError("counts: must hold non-negative integer multiplicities")
    if (arr.sum(axis=1) == 0).any():
        raise FmauditInputError("counts: a resample has no items")
    return arr


# --------------------------------------------------------------------------------------------------
# linear kernels: metric = finalize(counts @ features)
# --------------------------------------------------------------------------------------------------
def _onehot(index: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((len(index), n))
    out[np.arange(len(index)), index] = 1.0
    return out


def _features_accuracy(p, y, **_):
    return (p.argmax(1) == y).astype(np.float64)[:, None]


def _finalize_mean(s, total, **_):
    return s[:, 0] / total


def _features_nll(p, y, **_):
    with np.errstate(divide="ignore"):
        loss = -np.log(p[np.arange(len(y)), y])
    infinite = ~np.isfinite(loss)
    # inf * 0 is NaN in a matrix product, so infinite losses are counted in a separate column.
    return np.column_stack([np.where(infinite, 0.0, loss), infinite.astype(np.float64)])


def _finalize_nll(s, total, **_):
    return np.where(s[:, 1] > 0, np.inf, s[:, 0] / total)


def _features_brier(p, y, **_):
    return ((p**2).sum(1) - 2.0 * p[np.arange(len(y)), y] + 1.0)[:, None]


def _features_macro_f1(p, y, **_):
    k = p.shape[1]
    pred = p.argmax(1)
    pred_hot = _onehot(pred, k)
    return np.hstack([pred_hot, pred_hot * (pred == y)[:, None], _onehot(y, k)])


def _finalize_macro_f1(s, total, **_):
    k = s.shape[1] // 3
    n_pred, tp, n_true = s[:, :k], s[:, k : 2 * k], s[:, 2 * k :]
    denom = n_pred + n_true
    f1 = np.divide(2.0 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return f1.mean(1)


def _features_balanced_accuracy(p, y, **_):
    true_hot = _onehot(y, p.shape[1])
    return np.hstack([true_hot * (p.argmax(1) == y)[:, None], true_hot])


def _finalize_balanced_accuracy(s, total, **_):
    k = s.shape[1] // 2
    tp, n_true = s[:, :k], s[:, k:]
    present = n_true > 0
    recall = np.divide(tp, n_true, out=np.zeros_like(tp), where=present)
    return recall.sum(1) / present.sum(1)


def _features_ece(p, y, n_bins=metrics.DEFAULT_N_BINS, closure=metrics.CLOSURE_RIGHT):
    pred = p.argmax(1)
    conf = p[np.arange(len(y)), pred]
    hot = _onehot(metrics.bin_indices(conf, n_bins, closure), n_bins)
    return np.hstack([hot * conf[:, None], hot * (pred == y)[:, None]])


def _finalize_ece(s, total, **_):
    nb = s.shape[1] // 2
    return np.abs(s[:, nb:] - s[:, :nb]).sum(1) / total


_LINEAR_KERNELS: dict[str, tuple[Callable, Callable]] = {
    "accuracy": (_features_accuracy, _finalize_mean),
    "macro_f1": (_features_macro_f1, _finalize_macro_f1),
    "balanced_accuracy": (_features_balanced_accuracy, _finalize_balanced_accuracy),
    "ece": (_features_ece, _finalize_ece),
    "nll": (_features_nll, _finalize_nll),
    "brier": (_features_brier, _finalize_mean),
}

# Metrics resampled by a per-resample loop over fmaudit.metrics (slow but general).
_LOOP_METRICS: dict[str, Callable] = {
    "qwk": metrics.qwk,
    "aurc": metrics.aurc,
    "eaurc": metrics.eaurc,
    "mce": metrics.mce,
    "adaptive_ece": metrics.adaptive_ece,
    "classwise_ece": metrics.classwise_ece,
}

_POINT_FUNCTIONS: dict[str, Callable] = {
    "accuracy": metrics.accuracy,
    "macro_f1": metrics.macro_f1,
    "balanced_accuracy": metrics.balanced_accuracy,
    "ece": metrics.ece,
    "nll": metrics.nll,
    "brier": metrics.brier,
    "auroc": metrics.auroc,
    **_LOOP_METRICS,
}

_ALIASES = {
    "brier_sum": "brier",
    "auroc_ovr_macro": "auroc",
    "ece_top_15_lohi": "ece",
    "adaptive_ece_15_equalmass": "adaptive_ece",
    "classwise_ece_15": "classwise_ece",
    "mce_15": "mce",
}

#: Metric names accepted by the bootstrap functions (summary_metrics keys at 15 bins are aliases).
BOOTSTRAP_METRICS = tuple(sorted(set(_POINT_FUNCTIONS) | set(_ALIASES)))


def _resolve_metric(name: str, metric_kwargs: Mapping[str, Any] | None = None) -> str:
    resolved = _ALIASES.get(name, name)
    if resolved not in _POINT_FUNCTIONS:
        raise FmauditInputError(f"metric_name: unknown metric {name!r}; choose from {BOOTSTRAP_METRICS}")
    if metric_kwargs:
        accepted = set(inspect.signature(_POINT_FUNCTIONS[resolved]).parameters) - {"probs", "labels"}
        unknown = sorted(set(metric_kwargs) - accepted)
        if unknown:
            raise FmauditInputError(f"metric {name!r} takes no option(s) {unknown}; it accepts {sorted(accepted)}")
    return resolved


def _auroc_class_tables(scores: np.ndarray, positive: np.ndarray):
    """Index tables of one one-vs-rest problem: negatives sorted by score, positives, and for each positive
    the number of negatives scored strictly below it and below-or-equal to it."""
    neg = np.flatnonzero(~positive)
    neg = neg[np.argsort(scores[neg], kind="stable")]
    pos = np.flatnonzero(positive)
    neg_scores = scores[neg]
    below = np.searchsorted(neg_scores, scores[pos], side="left")
    below_or_tied = np.searchsorted(neg_scores, scores[pos], side="right")
    return neg, pos, below, below_or_tied


def _weighted_auc(counts: np.ndarray, neg, pos, below, below_or_tied) -> np.ndarray:
    """Weighted Mann-Whitney AUC per row of the multiplicity matrix; positive-negative ties count 1/2.

    ``U = sum_pos w_i (W_neg(s < s_i) + W_neg(s <= s_i)) / 2``, with the negative weights below each
    positive read off one cumulative sum per row.
    """
    cum_neg = np.zeros((counts.shape[0], len(neg) + 1), dtype=np.int64)
    np.cumsum(counts[:, neg], axis=1, out=cum_neg[:, 1:])
    w_pos = counts[:, pos].astype(np.float64)
    if np.array_equal(below, below_or_tied):
        u = (w_pos * cum_neg[:, below]).sum(1)
    else:
        u = 0.5 * (w_pos * (cum_neg[:, below] + cum_neg[:, below_or_tied])).sum(1)
    n_pos, n_neg = w_pos.sum(1), cum_neg[:, -1].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n_pos > 0) & (n_neg > 0), u / (n_pos * n_neg), np.nan)


def _bootstrap_auroc(p: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    k = p.shape[1]
    classes = [1] if k == 2 else range(k)
    tables = [_auroc_class_tables(p[:, c], y == c) for c in classes]
    out = np.empty(counts.shape[0])
    block = max(1, _BLOCK_ELEMENTS // counts.shape[1])
    for start in range(0, counts.shape[0], block):
        rows = counts[start : start + block]
        # NaN (class absent from the resample) propagates to the macro mean, as in metrics.auroc.
        out[start : start + block] = np.mean([_weighted_auc(rows, *t) for t in tables], axis=0)
    return out


def _validated_models(probs_by_model: Mapping[str, Any], labels: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
    if not probs_by_model:
        raise FmauditInputError("probs_by_model: no models given")
    validated: dict[str, np.ndarray] = {}
    y = None
    for name, probs in probs_by_model.items():
        try:
            p = metrics.validate_probs(probs, name=f"probs[{name!r}]")
            y_model = metrics.validate_labels(labels, p.shape[0], p.shape[1])
        except FmauditInputError as err:
            raise FmauditInputError(f"model {name!r}: {err}") from err
        if validated:
            first_name, first = next(iter(validated.items()))
            if p.shape != first.shape:
                raise FmauditInputError(
                    f"model {name!r}: probs of shape {p.shape}, but model {first_name!r} has {first.shape}"
                )
        validated[str(name)], y = p, y_model
    return validated, y


def bootstrap_metric_models(
    metric_name: str,
    probs_by_model: Mapping[str, Any],
    labels: Any,
    counts: np.ndarray,
    **metric_kwargs: Any,
) -> dict[str, np.ndarray]:
    """Per-resample metric values, (B,) per model, all models on the same resamples ``counts``.

    ``metric_kwargs`` are passed to the metric (``n_bins``, ``closure`` for ECE-type metrics).
    Linear metrics are computed for all models with one blocked matrix product.
    """
    name = _resolve_metric(metric_name, metric_kwargs)
    models, y = _validated_models(probs_by_model, labels)
    counts = _check_counts(counts, len(y))
    if name in _LINEAR_KERNELS:
        features_fn, finalize_fn = _LINEAR_KERNELS[name]
        feats = [features_fn(p, y, **metric_kwargs) for p in models.values()]
        widths = np.cumsum([0] + [f.shape[1] for f in feats])
        design = np.hstack(feats)
        out = {m: np.empty(counts.shape[0]) for m in models}
        block = max(1, _BLOCK_ELEMENTS // counts.shape[1])
        for start in range(0, counts.shape[0], block):
            w = counts[start : start + block].astype(np.float64)
            sums = w @ design
            total = w.sum(1)
            for j, m in enumerate(models):
                out[m][start : start + block] = finalize_fn(sums[:, widths[j] : widths[j + 1]], total)
        return out
    if name == "auroc":
        return {m: _bootstrap_auroc(p, y, counts) for m, p in models.items()}
    fn = _LOOP_METRICS[name]
    items = np.arange(len(y))
    out = {}
    for m, p in models.items():
        values = np.empty(counts.shape[0])
        for b, row in enumerate(counts):
            idx = np.repeat(items, row)
            values[b] = fn(p[idx], y[idx], **metric_kwargs)
        out[m] = values
    return out


def bootstrap_metric(metric_name: str, probs: Any, labels: Any, counts: np.ndarray, **metric_kwargs: Any) -> np.ndarray:
    """(B,) values of ``metric_name`` on the resamples given by the (B, N) multiplicity matrix ``counts``.

    Each value equals the metric recomputed on the items repeated by their multiplicities.
    """
    return bootstrap_metric_models(metric_name, {"model": probs}, labels, counts, **metric_kwargs)["model"]


def _point(name: str, probs: np.ndarray, labels: np.ndarray, metric_kwargs: Mapping[str, Any]) -> float:
    return float(_POINT_FUNCTIONS[name](probs, labels, **metric_kwargs))


def percentile_interval(draws: np.ndarray, alpha: float = 0.05) -> tuple[float, float, int]:
    """Percentile interval of the finite bootstrap draws and how many there were (NaN, NaN, 0 if none)."""
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
    n_boot: int = 2000,
    random_state: int = 0,
    alpha: float = 0.05,
    **metric_kwargs: Any,
) -> dict[str, Any]:
    """Point estimate and percentile bootstrap CI of one metric, resampling groups when given.

    Returns dict(point, ci_lo, ci_hi, n_boot, n_valid, unit) with unit "group" or "item".
    """
    name = _resolve_metric(metric_name, metric_kwargs)
    p, y = metrics.validate_probs_labels(probs, labels)
    counts = bootstrap_counts(len(y), groups, n_boot, random_state)
    draws = bootstrap_metric(name, p, y, counts, **metric_kwargs)
    lo, hi, n_valid = percentile_interval(draws, alpha)
    return {
        "point": _point(name, p, y, metric_kwargs),
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


def paired_bootstrap_diff(
    metric_name: str,
    probs_a: Any,
    probs_b: Any,
    labels: Any,
    n_boot: int = 2000,
    random_state: int = 0,
    groups: Any = None,
    alpha: float = 0.05,
    **metric_kwargs: Any,
) -> dict[str, Any]:
    """Paired bootstrap of ``metric(a) - metric(b)`` with one shared resample set for both models.

    Returns dict(diff, ci_lo, ci_hi, p_two_sided_share, point_a, point_b, n_boot, n_valid, unit);
    ``p_two_sided_share = min(1, 2 * min(share(diff* <= 0), share(diff* >= 0)))``.
    """
    name = _resolve_metric(metric_name, metric_kwargs)
    models, y = _validated_models({"a": probs_a, "b": probs_b}, labels)
    counts = bootstrap_counts(len(y), groups, n_boot, random_state)
    draws = bootstrap_metric_models(name, models, y, counts, **metric_kwargs)
    point_a = _point(name, models["a"], y, metric_kwargs)
    point_b = _point(name, models["b"], y, metric_kwargs)
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
    n_boot: int = 2000,
    random_state: int = 0,
    groups: Any = None,
    alpha: float = 0.05,
    counts: np.ndarray | None = None,
    **metric_kwargs: Any,
) -> pd.DataFrame:
    """Per-model point and percentile CI on one shared resample set.

    Columns: model, metric, point, ci_lo, ci_hi, n_boot, n_valid, unit. Pass ``counts`` (from
    :func:`bootstrap_counts`) to reuse resamples across calls; then n_boot/random_state/groups are unused.
    """
    name = _resolve_metric(metric_name, metric_kwargs)
    models, y = _validated_models(probs_by_model, labels)
    if counts is None:
        counts = bootstrap_counts(len(y), groups, n_boot, random_state)
    draws = bootstrap_metric_models(name, models, y, counts, **metric_kwargs)
    rows = []
    for m, p in models.items():
        lo, hi, n_valid = percentile_interval(draws[m], alpha)
        rows.append(
            {
                "model": m,
                "metric": metric_name,
                "point": _point(name, p, y, metric_kwargs),
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
    n_boot: int = 2000,
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
    """
    name = _resolve_metric(metric_name, metric_kwargs)
    models, y = _validated_models(probs_by_model, labels)
    if counts is None:
        counts = bootstrap_counts(len(y), groups, n_boot, random_state)
    draws = bootstrap_metric_models(name, models, y, counts, **metric_kwargs)
    points = {m: _point(name, p, y, metric_kwargs) for m, p in models.items()}
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
# rank transfer and meta-analysis
# --------------------------------------------------------------------------------------------------
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


def fisher_z_meta(rhos: Sequence[float], ns: Sequence[int], z_crit: float = 1.96) -> dict[str, float]:
    """DerSimonian-Laird random-effects pooling of correlations on the Fisher-z scale (METHODS 7).

    ``z_i = arctanh(clip(rho_i, -0.999, 0.999))``, ``v_i = 1/(n_i - 3)``. Returns pooled_rho
    (``tanh(mu_RE)``), ci_lo/ci_hi (``tanh(mu_RE -/+ z_crit * SE)``), Q, df, tau2, I2
    (``max(0, (Q - df)/Q)``, 0 when Q = 0), mu_fixed and mu_random (both on the z scale), se_random,
    pooled_rho_fixed (``tanh(mu_fixed)``) and n_studies.
    """
    r = np.asarray(rhos, dtype=np.float64)
    n = np.asarray(ns, dtype=np.float64)
    if r.ndim != 1 or r.shape != n.shape or r.size == 0:
        raise FmauditInputError(
            f"fisher_z_meta: rhos and ns must be 1-D of equal, non-zero length ({r.shape}, {n.shape})"
        )
    if not (np.isfinite(r).all() and np.isfinite(n).all()):
        raise FmauditInputError("fisher_z_meta: non-finite rho or n")
    if (np.abs(r) > 1).any():
        raise FmauditInputError("fisher_z_meta: a correlation lies outside [-1, 1]")
    if (n <= 3).any():
        raise FmauditInputError("fisher_z_meta: every n must exceed 3 (v = 1/(n - 3))")
    z = np.arctanh(np.clip(r, -0.999, 0.999))
    v = 1.0 / (n - 3.0)
    w = 1.0 / v
    mu_fixed = float((w * z).sum() / w.sum())
    q = float((w * (z - mu_fixed) ** 2).sum())
    df = int(r.size - 1)
    c = float(w.sum() - (w**2).sum() / w.sum())
    tau2 = max(0.0, (q - df) / c) if df > 0 and c > 0 else 0.0
    w_re = 1.0 / (v + tau2)
    mu_re = float((w_re * z).sum() / w_re.sum())
    se = float(np.sqrt(1.0 / w_re.sum()))
    i2 = max(0.0, (q - df) / q) if q > 0 else 0.0
    return {
        "pooled_rho": float(np.tanh(mu_re)),
        "ci_lo": float(np.tanh(mu_re - z_crit * se)),
        "ci_hi": float(np.tanh(mu_re + z_crit * se)),
        "Q": q,
        "df": df,
        "tau2": float(tau2),
        "I2": float(i2),
        "mu_fixed": mu_fixed,
        "mu_random": mu_re,
        "se_random": se,
        "pooled_rho_fixed": float(np.tanh(mu_fixed)),
        "n_studies": int(r.size),
    }


def wilcoxon_win(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """CellPath "significant win" of a over b on paired units (METHODS 7).

    Pairs where either value is NaN are dropped. ``scipy.stats.wilcoxon(a, b)`` with its defaults
    (two-sided, zero_method="wilcox": zero differences are dropped). win = p < alpha and median(a - b) > 0.
    With no non-zero difference p is NaN and win is False. Returns dict(p, median_diff, win, n_nonzero,
    n_pairs).
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
    p = float(sps.wilcoxon(x, y).pvalue) if n_nonzero > 0 else float("nan")
    return {
        "p": p,
        "median_diff": median_diff,
        "win": bool(n_nonzero > 0 and p < alpha and median_diff > 0),
        "n_nonzero": n_nonzero,
        "n_pairs": int(d.size),
    }


# --------------------------------------------------------------------------------------------------
# structured bootstraps
# --------------------------------------------------------------------------------------------------
def two_way_cluster_bootstrap(
    table: pd.DataFrame,
    stat_fn: Callable[[pd.DataFrame], float],
    model_col: str = "model",
    source_col: str = "source",
    target_col: str = "target",
    n_boot: int = 2000,
    random_state: int = 0,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Two-way (models x hospitals) cluster bootstrap of a transfer-grid statistic (METHODS 7, PRISM).

    ``table`` has one or more rows per (model, source hospital, target hospital) cell. Each resample draws
    the models and the hospitals (the union of sources and targets) independently with replacement
    (``default_rng(random_state)``; models first, then hospitals, per resample), and keeps every row of
    every cell (m, s -> t) with m a drawn model and s, t drawn hospitals with s != t; a cell appears once
    per combination of draws, so multiplicities multiply. Rows with source == target are never used.

    ``stat_fn`` receives the resampled rows (a DataFrame with the table's columns plus the integer columns
    ``model_slot``, ``source_slot`` and ``target_slot``, which tell apart repeated draws of the same model
    or hospital) and returns a float. The point estimate applies ``stat_fn`` to the off-diagonal rows of
    the original table, with slots equal to the model/hospital positions in sorted order.

    Returns dict(point, ci_lo, ci_hi, n_boot, n_valid, n_models, n_hospitals, unit="model x hospital").
    """
    for col in (model_col, source_col, target_col):
        if col not in table.columns:
            raise FmauditInputError(f"two_way_cluster_bootstrap: column {col!r} missing from the table")
    models = np.array(sorted(table[model_col].unique(), key=str), dtype=object)
    hospitals = np.array(sorted(set(table[source_col]) | set(table[target_col]), key=str), dtype=object)
    n_m, n_h = len(models), len(hospitals)
    if n_m < 1 or n_h < 2:
        raise FmauditInputError("two_way_cluster_bootstrap: need at least one model and two hospitals")
    m_index = {m: i for i, m in enumerate(models)}
    h_index = {h: i for i, h in enumerate(hospitals)}
    mi = table[model_col].map(m_index).to_numpy()
    si = table[source_col].map(h_index).to_numpy()
    ti = table[target_col].map(h_index).to_numpy()
    cell = (mi * n_h + si) * n_h + ti
    # CSR lookup from cell id to the table rows of that cell.
    row_order = np.argsort(cell, kind="stable")
    cell_start = np.searchsorted(cell[row_order], np.arange(n_m * n_h * n_h + 1))

    def resampled(model_slots: np.ndarray, hospital_slots: np.ndarray) -> pd.DataFrame:
        ms, hs_a, hs_b = np.meshgrid(
            np.arange(len(model_slots)), np.arange(len(hospital_slots)), np.arange(len(hospital_slots)),
            indexing="ij",
        )
        ms, hs_a, hs_b = ms.ravel(), hs_a.ravel(), hs_b.ravel()
        src, tgt = hospital_slots[hs_a], hospital_slots[hs_b]
        keep = src != tgt
        ms, hs_a, hs_b = ms[keep], hs_a[keep], hs_b[keep]
        cells = (model_slots[ms] * n_h + src[keep]) * n_h + tgt[keep]
        sizes = cell_start[cells + 1] - cell_start[cells]
        slot_of_row = np.repeat(np.arange(len(cells)), sizes)
        within = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        rows = row_order[cell_start[cells][slot_of_row] + within]
        out = table.iloc[rows].reset_index(drop=True)
        out["model_slot"] = ms[slot_of_row]
        out["source_slot"] = hs_a[slot_of_row]
        out["target_slot"] = hs_b[slot_of_row]
        return out

    point = float(stat_fn(resampled(np.arange(n_m), np.arange(n_h))))
    rng = np.random.default_rng(random_state)
    draws = np.empty(int(n_boot))
    for b in range(int(n_boot)):
        model_slots = rng.integers(0, n_m, n_m)
        hospital_slots = rng.integers(0, n_h, n_h)
        draws[b] = float(stat_fn(resampled(model_slots, hospital_slots)))
    lo, hi, n_valid = percentile_interval(draws, alpha)
    return {
        "point": point,
        "ci_lo": lo,
        "ci_hi": hi,
        "n_boot": int(n_boot),
        "n_valid": n_valid,
        "n_models": n_m,
        "n_hospitals": n_h,
        "unit": "model x hospital",
    }


def hierarchical_bootstrap_draws(
    df: pd.DataFrame,
    levels: Sequence[str],
    value: str,
    n_boot: int = 2000,
    random_state: int = 0,
) -> np.ndarray:
    """(n_boot,) resampled means of ``value`` under the nested bootstrap of
    :func:`hierarchical_bootstrap_mean`."""
    levels = list(levels)
    if not levels:
        raise FmauditInputError("hierarchical_bootstrap_mean: levels is empty")
    missing = [c for c in [*levels, value] if c not in df.columns]
    if missing:
        raise FmauditInputError(f"hierarchical_bootstrap_mean: column(s) {missing} missing")
    if df.empty:
        raise FmauditInputError("hierarchical_bootstrap_mean: empty table")
    values = df[value].to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        raise FmauditInputError(f"hierarchical_bootstrap_mean: column {value!r} has NaN/inf")
    if df[levels].isna().any().any():
        raise FmauditInputError(f"hierarchical_bootstrap_mean: missing values in level columns {levels}")

    # Node ids per level in lexicographic order, so the children of a node are contiguous.
    node_ids = [df.groupby(levels[: depth + 1], sort=True).ngroup().to_numpy() for depth in range(len(levels))]
    n_children: list[np.ndarray] = []
    first_child: list[np.ndarray] = []
    for depth in range(len(levels) - 1):
        parent, child = node_ids[depth], node_ids[depth + 1]
        pairs = np.unique(np.column_stack([parent, child]), axis=0)
        n_children.append(np.bincount(pairs[:, 0], minlength=parent.max() + 1))
        first = np.full(parent.max() + 1, np.iinfo(np.int64).max)
        np.minimum.at(first, pairs[:, 0], pairs[:, 1])
        first_child.append(first)
    leaf = node_ids[-1]
    leaf_sum = np.bincount(leaf, weights=values)
    leaf_count = np.bincount(leaf).astype(np.float64)
    n_root = int(node_ids[0].max()) + 1

    rng = np.random.default_rng(random_state)
    draws = np.empty(int(n_boot))
    for b in range(int(n_boot)):
        slots = rng.integers(0, n_root, n_root)
        for depth in range(len(levels) - 1):
            sizes = n_children[depth][slots]
            parent_of = np.repeat(slots, sizes)
            slots = first_child[depth][parent_of] + rng.integers(0, np.repeat(sizes, sizes))
        draws[b] = leaf_sum[slots].sum() / leaf_count[slots].sum()
    return draws


def hierarchical_bootstrap_mean(
    df: pd.DataFrame,
    levels: Sequence[str],
    value: str,
    n_boot: int = 2000,
    random_state: int = 0,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Nested bootstrap of the mean of ``value``, resampling level by level (METHODS 7, seed 000).

    ``levels`` run from the outermost cluster inwards, e.g. ["encoder", "source_seed", "draw"]: each resample
    draws the units of ``levels[0]`` with replacement (``default_rng(random_state)``), then, within each
    drawn unit, as many of its ``levels[1]`` units with replacement as it has, and so on. Rows sharing all
    ``levels`` stay together. The statistic is the mean of ``value`` over the resampled rows (with
    multiplicity); the point estimate is the plain mean. Returns dict(point, ci_lo, ci_hi, n_boot, n_valid,
    levels); :func:`hierarchical_bootstrap_draws` gives the resampled means themselves.
    """
    draws = hierarchical_bootstrap_draws(df, levels, value, n_boot, random_state)
    lo, hi, n_valid = percentile_interval(draws, alpha)
    return {
        "point": float(df[value].to_numpy(dtype=np.float64).mean()),
        "ci_lo": lo,
        "ci_hi": hi,
        "n_boot": int(n_boot),
        "n_valid": n_valid,
        "levels": list(levels),
    }
