"""Bootstrap resampling as a matrix of multiplicities, and metric kernels evaluated on all resamples at once.

Bootstraps are expressed as a (B, N) matrix of item multiplicities ("counts"): resample b takes item i
``counts[b, i]`` times. Every metric with a linear sufficient statistic (accuracy, macro-F1, balanced
accuracy, top-label ECE, NLL, Brier) is then one matrix product ``counts @ features``, evaluated for
all resamples and all models at once; AUROC uses a vectorised weighted Mann-Whitney statistic. Other
metrics of :mod:`fmaudit.metrics` fall back to a per-resample loop. Because all models are evaluated on one
counts matrix, model comparisons are paired.

Resampling follows the audit paper: ``rng = np.random.default_rng(random_state)``; each resample draws
``rng.integers(0, n, n)`` items, or, with groups, ``rng.integers(0, G, G)`` groups (sorted group ids, as
``np.unique``) and takes every item of each drawn group as many times as the group was drawn.

Metric names are those of :mod:`fmaudit.metrics` (``macro_f1``, ``ece`` ...) or the result columns of
:func:`fmaudit.metrics.summary_metrics`; a binned column such as ``ece_top_10_lohi`` means ``ece`` at 10 bins.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from fmaudit import metrics
from fmaudit.io import FmauditInputError

# Rows of the counts matrix converted to float64 per block, to bound memory (~16 MB per block array).
_BLOCK_ELEMENTS = 2_000_000

__all__ = [
    "BOOTSTRAP_METRICS",
    "bootstrap_counts",
    "bootstrap_metric",
    "bootstrap_metric_models",
    "point_metric",
    "resolve_metric",
    "validated_models",
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
    n_items: int, groups: Any = None, *, n_boot: int, random_state: int = 0
) -> np.ndarray:
    """(n_boot, n_items) int32 multiplicity matrix of an item or cluster bootstrap.

    Without ``groups`` each row draws ``n_items`` items with replacement. With ``groups`` (one id per item)
    each row draws G groups with replacement and every item of a drawn group gets that group's
    multiplicity, so groups are kept whole and a resample's size varies. The draws equal the audit paper's
    sequential ``rng.integers`` calls with ``np.random.default_rng(random_state)``
    (``docs/methods.md#confidence-intervals``).

    Parameters
    ----------
    n_items : int
        Number of items (rows of the predictions the matrix will resample); a positive integer.
    groups : array-like of shape (n_items,), optional
        Cluster id of each item (patient, slide, tissue section...); any sortable dtype, no missing ids. ``None``
        (the default): an item bootstrap.
    n_boot : int
        Number of resamples, the matrix's rows (keyword-only, no default: the schema's ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of ``np.random.default_rng``; the same seed gives the same matrix.

    Returns
    -------
    ndarray of shape (n_boot, n_items), dtype int32
        ``counts[b, i]``: how many times resample ``b`` takes item ``i``. Rows sum to ``n_items`` without
        groups; with groups a row's sum is the total size of its drawn groups.

    Raises
    ------
    FmauditInputError
        When ``n_items`` or ``n_boot`` is not a positive integer, or ``groups`` is not one id per item or holds
        missing ids.
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

# Linear kernels whose designs hold only 0 and 1 (exact in float32 products with integer multiplicities).
_ZERO_ONE_KERNELS = frozenset({"accuracy", "macro_f1", "balanced_accuracy"})

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

_ALIASES = {"brier_sum": "brier", "auroc_ovr_macro": "auroc"}
# summary_metrics columns of the binned metrics carry their bin count (fmaudit.metrics.binned_metric_columns):
# the column names at a sentinel count, with the count turned into a capturing group
_SENTINEL_BINS = 987654321
_BINNED_COLUMNS = {re.compile(re.escape(column).replace(str(_SENTINEL_BINS), r"(\d+)")): metric
                   for metric, column in metrics.binned_metric_columns(_SENTINEL_BINS).items()}

#: Metric names accepted by the bootstrap functions, besides the binned summary columns (``ece_top_<b>_lohi``,
#: ``adaptive_ece_<b>_equalmass``, ``classwise_ece_<b>``, ``mce_<b>``).
BOOTSTRAP_METRICS = tuple(sorted(set(_POINT_FUNCTIONS) | set(_ALIASES)))


def resolve_metric(name: str, metric_kwargs: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(metric of :mod:`fmaudit.metrics`, its keyword arguments) for a metric or summary-column name; a binned
    column (``ece_top_10_lohi``) sets ``n_bins``. Unknown names and options raise, naming them.

    Parameters
    ----------
    name : str
        A metric of :data:`BOOTSTRAP_METRICS` (``macro_f1``, ``ece``, an alias such as ``brier_sum``) or a binned
        summary column of :func:`fmaudit.metrics.summary_metrics` (``ece_top_15_lohi``, ``mce_10`` ...).
    metric_kwargs : mapping, optional
        Options of the metric (``n_bins``, ``closure`` for the ECE family); must agree with a binned column's
        bin count.

    Returns
    -------
    tuple of (str, dict)
        The :mod:`fmaudit.metrics` function name (``ece`` for ``ece_top_15_lohi``) and its keyword arguments,
        ``n_bins`` filled in from a binned column.

    Raises
    ------
    FmauditInputError
        For an unknown metric name, an option the metric does not take, or ``n_bins`` that contradicts the
        column's bin count.
    """
    kwargs = dict(metric_kwargs or {})
    resolved = _ALIASES.get(name, name)
    for pattern, metric in _BINNED_COLUMNS.items():
        match = pattern.fullmatch(name)
        if match:
            resolved, n_bins = metric, int(match.group(1))
            if kwargs.setdefault("n_bins", n_bins) != n_bins:
                raise FmauditInputError(f"metric {name!r} is at {n_bins} bins, but n_bins={kwargs['n_bins']} was given")
    if resolved not in _POINT_FUNCTIONS:
        raise FmauditInputError(f"metric_name: unknown metric {name!r}; choose from {BOOTSTRAP_METRICS} "
                                "or a binned summary column such as 'ece_top_15_lohi'")
    accepted = set(inspect.signature(_POINT_FUNCTIONS[resolved]).parameters) - {"probs", "labels"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise FmauditInputError(f"metric {name!r} takes no option(s) {unknown}; it accepts {sorted(accepted)}")
    return resolved, kwargs


def _auroc_tables(p: np.ndarray, y: np.ndarray):
    """Index tables of the one-vs-rest problems (class 1 only for a binary task), computed once: items in score
    order per class (C, N), a negative mask in that order, and, only where scores tie, each position's first
    and last position of its tie group (ties between a positive and a negative count 1/2)."""
    classes = np.array([1] if p.shape[1] == 2 else range(p.shape[1]))
    cols = p[:, classes]
    order = np.ascontiguousarray(np.argsort(cols, axis=0, kind="stable").T)
    negative = y[order] != classes[:, None]
    scores = np.take_along_axis(cols.T, order, axis=1)
    tied = scores[:, 1:] == scores[:, :-1]
    if not tied.any():
        return order, negative, None, None
    n = y.size
    position = np.arange(n)
    starts = np.c_[np.ones((len(classes), 1), bool), ~tied]
    first = np.maximum.accumulate(np.where(starts, position, 0), axis=1)
    ends = np.c_[~tied, np.ones((len(classes), 1), bool)]
    last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, position, n), 1), axis=1), 1)
    return order, negative, first, last


def _bootstrap_auroc(p: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Macro one-vs-rest AUROC per resample: the weighted Mann-Whitney statistic
    ``U = sum_pos w_i (W_neg(s < s_i) + W_neg(s = s_i) / 2)``, read off one cumulative sum of the negatives'
    weights in score order per class. One resample at a time (its (C, N) arrays stay in cache): measured
    faster than a blocked gather over many resamples (benchmarks/bench_bootstrap.py)."""
    order, negative, first, last = _auroc_tables(p, y)
    out = np.empty(counts.shape[0])
    for b, w in enumerate(counts):
        ws = w[order]
        w_neg = ws * negative
        w_pos = ws - w_neg
        neg_upto = np.cumsum(w_neg, axis=1)  # negatives at or before each position in score order
        if first is None:  # no ties: a positive adds no negative weight, "at or before" is "strictly below"
            u = (w_pos * neg_upto).sum(1).astype(np.float64)
        else:  # negatives below the item's tie group plus half of those inside it
            below = np.take_along_axis(neg_upto - w_neg, first, axis=1)
            inside = np.take_along_axis(neg_upto, last, axis=1) - below
            u = (w_pos * below).sum(1) + 0.5 * (w_pos * inside).sum(1)
        n_pos, n_neg = w_pos.sum(1), neg_upto[:, -1]
        with np.errstate(invalid="ignore", divide="ignore"):
            # NaN (a class absent from the resample) propagates to the macro mean, as in metrics.auroc
            out[b] = np.mean(np.where((n_pos > 0) & (n_neg > 0), u / (n_pos * n_neg), np.nan))
    return out


def validated_models(probs_by_model: Mapping[str, Any], labels: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every model's probabilities checked against the one label vector, all of the same shape.

    Parameters
    ----------
    probs_by_model : mapping of str to array-like of shape (n_items, n_classes)
        Predicted class probabilities per model (rows summing to 1), all on the same items in the same order.
    labels : array-like of shape (n_items,)
        Integer class index of each item, in ``[0, n_classes)``.

    Returns
    -------
    tuple of (dict of str to ndarray, ndarray)
        The validated probabilities by model name (``str`` keys, float arrays of shape (n_items, n_classes))
        and the labels as an integer array of shape (n_items,).

    Raises
    ------
    FmauditInputError
        When no model is given, a model's probabilities or the labels are invalid (the message names the
        model), or two models' probabilities differ in shape.
    """
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
    Linear metrics are computed for all models with one blocked matrix product. Because every model uses the same
    rows of ``counts``, differences between models are paired (``docs/methods.md#paired-differences``).

    Parameters
    ----------
    metric_name : str
        Metric or binned summary column, as :func:`resolve_metric` accepts.
    probs_by_model : mapping of str to array-like of shape (n_items, n_classes)
        Predicted class probabilities per model (rows summing to 1), on the same items in the same order.
    labels : array-like of shape (n_items,)
        Integer class index of each item.
    counts : ndarray of shape (n_boot, n_items)
        Non-negative integer multiplicities, one row per resample (:func:`bootstrap_counts`); no row may be all
        zero.
    **metric_kwargs
        Options of the metric (``n_bins``, ``closure``).

    Returns
    -------
    dict of str to ndarray of shape (n_boot,)
        The metric on each resample, by model name. AUROC is NaN on a resample that lacks a class.

    Raises
    ------
    FmauditInputError
        For an unknown metric or option, invalid probabilities or labels, or a ``counts`` matrix of the wrong
        shape, with negative or non-integer entries, or with an empty resample.
    """
    name, metric_kwargs = resolve_metric(metric_name, metric_kwargs)
    models, y = validated_models(probs_by_model, labels)
    counts = _check_counts(counts, len(y))
    if name in _LINEAR_KERNELS:
        features_fn, finalize_fn = _LINEAR_KERNELS[name]
        feats = [features_fn(p, y, **metric_kwargs) for p in models.values()]
        widths = np.cumsum([0] + [f.shape[1] for f in feats])
        design = np.hstack(feats)
        # Designs of 0/1 entries (accuracy, macro-F1, balanced accuracy) times integer multiplicities sum to
        # integers below 2**24, which float32 holds exactly: those products run in float32 (half the work of
        # float64, same numbers); the others in float64. Measured against a sparse product and a per-resample
        # weighted bincount in benchmarks/bench_bootstrap.py (the dense product was fastest).
        exact32 = name in _ZERO_ONE_KERNELS and float(counts.sum(1).max(initial=0)) < 2.0**24
        dtype = np.float32 if exact32 else np.float64
        design = design.astype(dtype, copy=False)
        out = {m: np.empty(counts.shape[0]) for m in models}
        block = max(1, _BLOCK_ELEMENTS // counts.shape[1])
        for start in range(0, counts.shape[0], block):
            w = counts[start : start + block].astype(dtype)
            sums = (w @ design).astype(np.float64)
            total = w.sum(1, dtype=np.float64)
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

    Parameters
    ----------
    metric_name : str
        Metric or binned summary column, as :func:`resolve_metric` accepts.
    probs : array-like of shape (n_items, n_classes)
        Predicted class probabilities (rows summing to 1).
    labels : array-like of shape (n_items,)
        Integer class index of each item.
    counts : ndarray of shape (n_boot, n_items)
        Non-negative integer multiplicities, one row per resample (:func:`bootstrap_counts`).
    **metric_kwargs
        Options of the metric (``n_bins``, ``closure``).

    Returns
    -------
    ndarray of shape (n_boot,)
        The metric on each resample.

    Raises
    ------
    FmauditInputError
        As :func:`bootstrap_metric_models`.
    """
    return bootstrap_metric_models(metric_name, {"model": probs}, labels, counts, **metric_kwargs)["model"]


def point_metric(name: str, probs: np.ndarray, labels: np.ndarray, metric_kwargs: Mapping[str, Any]) -> float:
    """The metric on all items (no resampling); ``name`` and ``metric_kwargs`` as :func:`resolve_metric` returns.

    Parameters
    ----------
    name : str
        A resolved metric name (the first element :func:`resolve_metric` returns, not a summary column).
    probs : ndarray of shape (n_items, n_classes)
        Predicted class probabilities (rows summing to 1).
    labels : ndarray of shape (n_items,)
        Integer class index of each item.
    metric_kwargs : mapping
        The metric's keyword arguments (the second element :func:`resolve_metric` returns).

    Returns
    -------
    float
        The metric's point estimate on all items.
    """
    return float(_POINT_FUNCTIONS[name](probs, labels, **metric_kwargs))
