"""Temperature scaling and the calibration ladder (docs/methods.md#temperature-scaling).

``p = softmax(z / T)``; T minimises the mean NLL on a fitting split, found by a bounded scalar search on
``log T`` within ``bounds`` (default [0.05, 20]). Accuracy, F1 and AUROC do not change for T > 0, so the
ladder's rows differ only in the probability-quality metrics (and, for K-shot rows, in which items are
evaluated).

The ladder (hema paper):

- ``raw``: T = 1 on the whole target set.
- ``source_ts``: T fitted on a held-out source validation split, applied to the target (deployable).
- ``oracle_ts``: T fitted on the whole labelled target set and evaluated on the same set (an upper bound,
  not deployable).
- ``kshot_ts``: T fitted on K labelled target items and evaluated on the remaining ones; repeated over
  ``draws`` random draws and averaged. The items of draw d for K = k are drawn by
  ``np.random.default_rng([random_state, k, d])``, so a draw does not depend on which other K are run.

A temperature at a bound of the search interval is the search stopping, not an optimum (e.g. K items all
confidently correct push T to the lower bound). Every row says so (``temperature_at_bound``, for K-shot
``n_draws_at_bound``); unless ``include_bound_temperatures``, the K-shot mean leaves such draws out (NaN
when every draw is at a bound), and the aggregated tables leave such runs out of their post-temperature
means (``fmaudit.analyses``).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from fmaudit.io import FmauditInputError
from fmaudit.metrics import (
    DEFAULT_N_BINS,
    log_softmax,
    softmax,
    summary_metric_keys,
    summary_metrics,
    validate_labels,
    validate_logits,
)

logger = logging.getLogger(__name__)

DEFAULT_TEMPERATURE_BOUNDS = (0.05, 20.0)
# A fitted log T this close to a bound is reported as "at the bound" (0.1 % in T).
AT_BOUND_LOG_TOLERANCE = 1e-3
CALIBRATED_TOLERANCE = 1e-3
LADDER_STAGES = ("raw", "source_ts", "oracle_ts", "kshot_ts")

__all__ = [
    "TemperatureScaler",
    "calibration_ladder",
    "fit_temperature",
    "kshot_temperature_draws",
]


def _check_bounds(bounds: Sequence[float]) -> tuple[float, float]:
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError) as err:
        raise FmauditInputError(f"bounds: expected (low, high), got {bounds!r}") from err
    if not (0.0 < lo < hi and np.isfinite(hi)):
        raise FmauditInputError(f"bounds: need 0 < low < high < inf, got {bounds!r}")
    return lo, hi


def _mean_nll(z: np.ndarray, y: np.ndarray, temperature: float) -> float:
    logp = log_softmax(z, temperature)
    return float(-logp[np.arange(len(y)), y].mean())


class TemperatureScaler:
    """Fit one temperature T for ``softmax(logits / T)`` by bounded NLL minimisation on ``log T``.

    Parameters
    ----------
    bounds : (float, float), default (0.05, 20.0)
        Search interval (low, high) for T, 0 < low < high; the optimum is reported with ``at_bound_`` when it
        sits on an end (e.g. K-shot draws that are all confidently correct push T to the lower bound).

    Attributes
    ----------
    temperature_ : float
    at_bound_ : bool
        True if ``log T`` is within 1e-3 of ``log low`` or ``log high``.
    confidence_ : str
        "overconfident" (T > 1), "underconfident" (T < 1) or "calibrated" (|T - 1| <= 1e-3).
    n_fit_ : int
        Number of items the temperature was fitted on.
    nll_before_, nll_after_ : float
        Mean NLL on the fitting items at T = 1 and at the fitted T.
    """

    def __init__(self, bounds: tuple[float, float] = DEFAULT_TEMPERATURE_BOUNDS):
        self.bounds = bounds

    def fit(self, logits: Any, labels: Any) -> "TemperatureScaler":
        """Fit the temperature on labelled logits.

        Parameters
        ----------
        logits : array-like of shape (N, K)
            Finite logits of the fitting items.
        labels : array-like of shape (N,)
            Their true class indices in 0..K-1.

        Returns
        -------
        TemperatureScaler
            ``self``, with the fitted attributes set.

        Raises
        ------
        FmauditInputError
            On invalid bounds, logits or labels.
        """
        lo, hi = _check_bounds(self.bounds)
        z = validate_logits(logits)
        y = validate_labels(labels, z.shape[0], z.shape[1])
        log_lo, log_hi = np.log(lo), np.log(hi)

        def objective(log_t: float) -> float:
            return _mean_nll(z, y, float(np.exp(log_t)))

        result = minimize_scalar(objective, bounds=(log_lo, log_hi), method="bounded", options={"xatol": 1e-7})
        log_t, best = float(result.x), float(result.fun)
        # Bounded Brent never evaluates the end points; snap to an end when it is at least as good.
        for end in (log_lo, log_hi):
            value = objective(end)
            if value <= best:
                log_t, best = end, value
        temperature = float(np.exp(log_t))
        self.temperature_ = temperature
        self.at_bound_ = bool(min(abs(log_t - log_lo), abs(log_t - log_hi)) < AT_BOUND_LOG_TOLERANCE)
        if abs(temperature - 1.0) <= CALIBRATED_TOLERANCE:
            self.confidence_ = "calibrated"
        elif temperature > 1.0:
            self.confidence_ = "overconfident"
        else:
            self.confidence_ = "underconfident"
        self.n_fit_ = int(len(y))
        self.nll_before_ = _mean_nll(z, y, 1.0)
        self.nll_after_ = best
        return self

    def transform(self, logits: Any) -> np.ndarray:
        """Calibrated probabilities ``softmax(logits / temperature_)``.

        Parameters
        ----------
        logits : array-like of shape (N, K)
            Finite logits with the fitted K columns.

        Returns
        -------
        ndarray of float64, shape (N, K)

        Raises
        ------
        FmauditInputError
            When called before :meth:`fit`.
        """
        if not hasattr(self, "temperature_"):
            raise FmauditInputError("TemperatureScaler: call fit before transform")
        return softmax(logits, self.temperature_)

    def fit_transform(self, logits: Any, labels: Any) -> np.ndarray:
        """Fit on ``logits`` and ``labels``, then return the calibrated probabilities of the same logits.

        Parameters
        ----------
        logits : array-like of shape (N, K)
            Finite logits.
        labels : array-like of shape (N,)
            True class indices in 0..K-1.

        Returns
        -------
        ndarray of float64, shape (N, K)
        """
        return self.fit(logits, labels).transform(logits)


def fit_temperature(
    logits: Any, labels: Any, bounds: tuple[float, float] = DEFAULT_TEMPERATURE_BOUNDS
) -> float:
    """The NLL-optimal temperature of ``softmax(logits / T)`` within ``bounds``.

    Parameters
    ----------
    logits : array-like of shape (N, K)
        Finite logits of the fitting items.
    labels : array-like of shape (N,)
        Their true class indices.
    bounds : (float, float), default (0.05, 20.0)
        Search interval for T, 0 < low < high.

    Returns
    -------
    float
        The fitted T (it may sit at a bound: use :class:`TemperatureScaler` to know).
    """
    return TemperatureScaler(bounds=bounds).fit(logits, labels).temperature_


# --------------------------------------------------------------------------------------------------
# ladder
# --------------------------------------------------------------------------------------------------
def _draw_fit_indices(labels: np.ndarray, k: int, rng: np.random.Generator, stratified: bool) -> np.ndarray:
    """K item indices without replacement: uniform, or stratified proportionally to the class counts
    (largest-remainder rounding, ties to the lower class index)."""
    n = len(labels)
    if not stratified:
        return np.sort(rng.choice(n, size=k, replace=False))
    classes, counts = np.unique(labels, return_counts=True)
    quota = k * counts / n
    alloc = np.floor(quota).astype(np.int64)
    remainder = k - int(alloc.sum())
    if remainder:
        order = np.argsort(-(quota - alloc), kind="stable")
        alloc[order[:remainder]] += 1
    chosen = [
        rng.choice(np.flatnonzero(labels == c), size=int(a), replace=False)
        for c, a in zip(classes, alloc)
        if a > 0
    ]
    return np.sort(np.concatenate(chosen))


def kshot_temperature_draws(
    target_logits: Any,
    target_labels: Any,
    k: int,
    *,
    draws: int,
    random_state: int = 0,
    n_bins: int = DEFAULT_N_BINS,
    stratified: bool = False,
    bounds: tuple[float, float] = DEFAULT_TEMPERATURE_BOUNDS,
    prism_ece: bool = False,
) -> pd.DataFrame:
    """Per-draw K-shot target temperature scaling: one row per draw.

    Draw d fits T on K target items drawn by ``default_rng([random_state, k, d])`` (uniform without
    replacement, or stratified by class when ``stratified``) and evaluates ``summary_metrics`` on the
    remaining items. Columns: k, draw, draw_seed, sampling, n_fit, n_eval, temperature, temperature_at_bound,
    then the summary-metric columns. Raises if ``k`` is not below the number of target items.

    Parameters
    ----------
    target_logits : array-like of shape (N, K)
        Finite logits of the target set.
    target_labels : array-like of shape (N,)
        Its true class indices.
    k : int
        Labelled target items T is fitted on, 1 <= k < N.
    draws : int
        Number of random draws (keyword-only, no default: the schema's ``calibration.kshot_draws``).
    random_state : int, default 0
        First entry of every draw's seed ``[random_state, k, d]``.
    n_bins : int, default 15
        Bins of the binned metrics.
    stratified : bool, default False
        Draw the K items proportionally to the class counts (largest remainder) instead of uniformly.
    bounds : (float, float), default (0.05, 20.0)
        Search interval for T.
    prism_ece : bool, default False
        Add PRISM's ECE to the metric columns.

    Returns
    -------
    DataFrame
        ``draws`` rows with the columns above; the metrics are those of the K-shot-calibrated probabilities on
        the N - K held-out items.

    Raises
    ------
    FmauditInputError
        On invalid logits or labels, ``k`` not a positive integer below N, or ``draws`` not a positive integer.
    """
    z = validate_logits(target_logits, "target_logits")
    y = validate_labels(target_labels, z.shape[0], z.shape[1], "target_labels")
    n = len(y)
    if int(k) != k or k < 1:
        raise FmauditInputError(f"k: expected a positive integer, got {k!r}")
    if k >= n:
        raise FmauditInputError(f"k = {k}: needs more than {k} target items, got {n}")
    if int(draws) != draws or draws < 1:
        raise FmauditInputError(f"draws: expected a positive integer, got {draws!r}")
    rows = []
    for d in range(int(draws)):
        rng = np.random.default_rng([int(random_state), int(k), d])
        fit_idx = _draw_fit_indices(y, int(k), rng, stratified)
        eval_mask = np.ones(n, dtype=bool)
        eval_mask[fit_idx] = False
        scaler = TemperatureScaler(bounds=bounds).fit(z[fit_idx], y[fit_idx])
        metrics = summary_metrics(scaler.transform(z[eval_mask]), y[eval_mask], n_bins=n_bins, prism_ece=prism_ece)
        rows.append(
            {
                "k": int(k),
                "draw": d,
                "draw_seed": f"[{int(random_state)}, {int(k)}, {d}]",
                "sampling": "stratified" if stratified else "uniform",
                "n_fit": int(len(fit_idx)),
                "n_eval": int(eval_mask.sum()),
                "temperature": scaler.temperature_,
                "temperature_at_bound": scaler.at_bound_,
                **metrics,
            }
        )
    return pd.DataFrame(rows)


def calibration_ladder(
    source_val_logits: Any | None,
    source_val_labels: Any | None,
    target_logits: Any,
    target_labels: Any,
    *,
    ks: Sequence[int],
    draws: int,
    random_state: int = 0,
    n_bins: int = DEFAULT_N_BINS,
    stratified: bool = False,
    bounds: tuple[float, float] = DEFAULT_TEMPERATURE_BOUNDS,
    include_bound_temperatures: bool = False,
    prism_ece: bool = False,
) -> pd.DataFrame:
    """Raw, source-TS, oracle-TS and K-shot-TS calibration of one model on one target set.

    Returns one row per stage (and per K for ``kshot_ts``) with columns: stage, k (NaN except kshot),
    n_draws, n_draws_at_bound, n_eval (items evaluated; for kshot the target size minus K), temperature
    (kshot: mean over the draws averaged; raw: 1), temperature_at_bound (this row's T sits at a bound; kshot:
    every draw does), temperature_at_bound_share (NaN for raw), temperature_note, deployable (False for
    oracle_ts), sampling, random_state, then the :func:`fmaudit.metrics.summary_metrics` columns (kshot: mean
    over draws, leaving out draws whose T is at a bound unless ``include_bound_temperatures``).
    ``source_val_logits=None`` omits the source_ts row; source validation logits with no rows (a label budget
    that left no validation item) give a source_ts row with NaN temperature and metrics, said so in
    temperature_note. K values not below the number of target items are skipped with a logged warning.

    Parameters
    ----------
    source_val_logits : array-like of shape (n_val, K) or None
        Logits of the source validation split (T of ``source_ts`` is fitted on them); None omits that row.
    source_val_labels : array-like of shape (n_val,) or None
        Their true class indices; required when ``source_val_logits`` is given.
    target_logits : array-like of shape (N, K)
        Logits of the target set (every stage is evaluated on it).
    target_labels : array-like of shape (N,)
        Its true class indices.
    ks : sequence of int
        The K values of the ``kshot_ts`` rows (keyword-only, no default: the schema's ``calibration.kshot_k``).
    draws : int
        Draws per K (keyword-only, no default: the schema's ``calibration.kshot_draws``).
    random_state : int, default 0
        Seed of the K-shot draws (see the module doc).
    n_bins : int, default 15
        Bins of the binned metrics.
    stratified : bool, default False
        Draw the K-shot items stratified by class.
    bounds : (float, float), default (0.05, 20.0)
        Search interval for T.
    include_bound_temperatures : bool, default False
        Keep K-shot draws whose T sits at a bound in the means.
    prism_ece : bool, default False
        Add PRISM's ECE to the metric columns.

    Returns
    -------
    DataFrame
        The rows and columns described above, in the order raw, source_ts, oracle_ts, then kshot_ts by K.

    Raises
    ------
    FmauditInputError
        On invalid logits or labels, ``source_val_labels`` missing, or source and target with different K.
    """
    z_t = validate_logits(target_logits, "target_logits")
    y_t = validate_labels(target_labels, z_t.shape[0], z_t.shape[1], "target_labels")
    keys = summary_metric_keys(n_bins, prism_ece=prism_ece)
    sampling = "stratified" if stratified else "uniform"
    rows: list[dict[str, Any]] = []

    def stage_row(stage: str, probs: np.ndarray | None, temperature: float, scaler: TemperatureScaler | None,
                  deployable: bool, note: str) -> dict:
        at_bound = bool(scaler.at_bound_) if scaler is not None else False
        return {
            "stage": stage,
            "k": np.nan,
            "n_draws": 1,
            "n_draws_at_bound": int(at_bound),
            "n_eval": int(len(y_t)),
            "temperature": temperature,
            "temperature_at_bound": at_bound,
            "temperature_at_bound_share": float(at_bound) if scaler is not None else np.nan,
            "temperature_note": _bound_note(scaler, bounds) if scaler is not None else note,
            "deployable": deployable,
            "sampling": None,
            "random_state": int(random_state),
            **(summary_metrics(probs, y_t, n_bins=n_bins, prism_ece=prism_ece) if probs is not None
               else dict.fromkeys(keys, np.nan)),
        }

    rows.append(stage_row("raw", softmax(z_t), 1.0, None, True, "T = 1 (no scaling)"))

    if source_val_logits is not None:
        if source_val_labels is None:
            raise FmauditInputError("source_val_labels: required when source_val_logits is given")
        if np.asarray(source_val_logits).size == 0:
            rows.append(stage_row("source_ts", None, np.nan, None, True, "not fitted: no validation labels"))
        else:
            z_s = validate_logits(source_val_logits, "source_val_logits")
            if z_s.shape[1] != z_t.shape[1]:
                raise FmauditInputError(
                    f"source_val_logits: {z_s.shape[1]} classes but target_logits has {z_t.shape[1]}"
                )
            y_s = validate_labels(source_val_labels, z_s.shape[0], z_s.shape[1], "source_val_labels")
            source = TemperatureScaler(bounds=bounds).fit(z_s, y_s)
            rows.append(stage_row("source_ts", source.transform(z_t), source.temperature_, source, True, ""))

    oracle = TemperatureScaler(bounds=bounds).fit(z_t, y_t)
    rows.append(stage_row("oracle_ts", oracle.transform(z_t), oracle.temperature_, oracle, False, ""))

    for k in ks:
        if k >= len(y_t):
            logger.warning("calibration_ladder: skipping K = %d, the target has only %d items", k, len(y_t))
            continue
        per_draw = kshot_temperature_draws(z_t, y_t, k, draws=draws, random_state=random_state, n_bins=n_bins,
                                           stratified=stratified, bounds=bounds, prism_ece=prism_ece)
        at_bound = per_draw["temperature_at_bound"].to_numpy(dtype=bool)
        kept = per_draw if include_bound_temperatures else per_draw[~at_bound]
        n_bound = int(at_bound.sum())
        note = (f"{n_bound} of {int(draws)} draws at a bound" + ("" if include_bound_temperatures or not n_bound
                                                              else ", left out of the mean"))
        rows.append(
            {
                "stage": "kshot_ts",
                "k": float(k),
                "n_draws": int(draws),
                "n_draws_at_bound": n_bound,
                "n_eval": int(len(y_t) - k),
                "temperature": float(kept["temperature"].mean()) if len(kept) else np.nan,
                "temperature_at_bound": bool(at_bound.all()),
                "temperature_at_bound_share": float(at_bound.mean()),
                "temperature_note": note,
                "deployable": True,
                "sampling": sampling,
                "random_state": int(random_state),
                **{key: float(kept[key].mean()) if len(kept) else np.nan for key in keys},
            }
        )
    return pd.DataFrame(rows)


def _bound_note(scaler: TemperatureScaler, bounds: tuple[float, float]) -> str:
    """Where a fitted temperature sits: ``at the lower bound 0.05``, ``at the upper bound 20`` or ``fitted``."""
    if not scaler.at_bound_:
        return "fitted"
    lo, hi = _check_bounds(bounds)
    side, value = (("lower", lo) if abs(np.log(scaler.temperature_) - np.log(lo)) < AT_BOUND_LOG_TOLERANCE
                   else ("upper", hi))
    return f"at the {side} bound {value:g}"
