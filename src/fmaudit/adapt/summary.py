"""Summaries of the prior-shift rows in the hema paper's shapes (hema paper; docs/methods.md#hierarchical-bootstrap).

Input everywhere: the per-draw x method rows of the prior-shift shards (``fmaudit.analyses.prior_shift``),
concatenated over encoders, with at least ``encoder``, ``target_domain``, ``prior``, ``seed``, ``draw``,
``method`` and the metric columns.

Definitions (the hema paper reports these without formulas; these are the project's):

- *scenario*: a target x prior; *cell*: an encoder x scenario ("29 of the 270 encoder x scenario cells":
  15 encoders x 3 targets x 6 priors). A cell's value is its mean over source seeds and draws; a cell is
  *negative* when that mean gain is below 0.
- *scenario mean*: the mean gain of a method over every encoder, seed and draw of a scenario ("positive in all
  18 target x prior scenario means").
- *hierarchical bootstrap* (docs/methods.md#hierarchical-bootstrap): encoders, then source seeds within each encoder,
  then draws within each seed, resampled with replacement; the statistic is the mean gain of the resampled rows. A draw
  unit holds every target x prior of that draw index, so each resample keeps the scenario design.
- *relative gap* = ``(F1_in - F1_target) / F1_in`` ("macro-F1 drops 34-72%"), with F1_in the in-domain
  (source hold-out) macro-F1 of the same encoder.
- *effective robustness* (Taori et al. 2020): the target macro-F1 above what the encoders' common trend
  predicts from the in-domain macro-F1: ``ER_m = F1_target,m - sigmoid(a * logit(F1_in,m) + b)`` with (a, b)
  the least-squares line through (logit F1_in, logit F1_target) of all encoders of the group (F1 clipped to
  [1e-4, 1 - 1e-4] before the logit). Needs at least 3 encoders; NaN otherwise.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.stats import hierarchical_bootstrap_mean

BOOTSTRAP_LEVELS = ("encoder", "seed", "draw")
CELL = ("encoder", "target_domain", "prior")


def _require(rows: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in rows.columns]
    if missing:
        raise FmauditInputError(f"{what}: column(s) {missing} missing from the prior-shift rows")
    if rows.empty:
        raise FmauditInputError(f"{what}: no rows")


def scenario_gains(rows: pd.DataFrame, value: str = "gain_macro_f1") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per prior, per target) for the hema paper's figure 3: bars = mean gain per method x prior over targets'
    scenario means, dots = each target's scenario mean. The per-prior table also counts positive scenarios.

    Parameters
    ----------
    rows : DataFrame
        Per-draw x method prior-shift rows, concatenated over encoders (module doc).
    value : str
        The gain column averaged (default ``gain_macro_f1``).

    Returns
    -------
    bars : DataFrame
        One row per method x prior: ``method``, ``prior``, ``mean_gain``, ``n_targets``, ``n_positive_targets``.
    dots : DataFrame
        One row per method x prior x target: ``method``, ``prior``, ``target_domain``, ``mean_gain``, ``n_rows``.

    Raises
    ------
    FmauditInputError
        No rows, or a column missing.
    """
    _require(rows, ["method", "prior", "target_domain", value], "scenario_gains")
    dots = rows.groupby(["method", "prior", "target_domain"], sort=False, observed=True)[value].agg(
        mean_gain="mean", n_rows="size").reset_index()
    bars = dots.groupby(["method", "prior"], sort=False, observed=True).agg(
        mean_gain=("mean_gain", "mean"), n_targets=("mean_gain", "size"),
        n_positive_targets=("mean_gain", lambda g: int((g > 0).sum()))).reset_index()
    return bars, dots


def gain_intervals(rows: pd.DataFrame, by: Sequence[str] = ("method",), value: str = "gain_macro_f1",
                   levels: Sequence[str] = BOOTSTRAP_LEVELS, *, n_boot: int, random_state: int = 0,
                   alpha: float = 0.05) -> pd.DataFrame:
    """Mean ``value`` per ``by`` group with a hierarchical-bootstrap percentile interval
    (:func:`fmaudit.stats.hierarchical_bootstrap_mean`, levels ``levels``, outermost first).

    Also: the number of scenarios and of positive scenario means in the group, and the resampling unit named
    in words (``unit``).

    Parameters
    ----------
    rows : DataFrame
        Per-draw x method prior-shift rows, concatenated over encoders (module doc).
    by : sequence of str
        Grouping columns (default ``method``).
    value : str
        The column averaged (default ``gain_macro_f1``).
    levels : sequence of str
        Resampling levels, outermost first (default encoder, seed, draw).
    n_boot : int
        Bootstrap resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``).
    random_state : int
        Seed of the resamples.
    alpha : float
        Two-sided level of the percentile interval (0.05: 95%).

    Returns
    -------
    DataFrame
        One row per group: the ``by`` columns, ``mean``, ``ci_lo``, ``ci_hi`` (NaN for method ``none``, 0 by
        definition), ``n_scenarios``, ``n_positive_scenarios``, ``n_encoders``, ``n_boot``, ``n_valid``, ``unit``.

    Raises
    ------
    FmauditInputError
        No rows, or a column missing.
    """
    by = list(by)
    _require(rows, [*by, *levels, value, "target_domain", "prior"], "gain_intervals")
    out = []
    unit = " > ".join(levels) + " (hierarchical bootstrap; a draw unit carries every target x prior of its index)"
    for key, group in rows.groupby(by, sort=False, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        res = hierarchical_bootstrap_mean(group, list(levels), value, n_boot=n_boot, random_state=random_state,
                                          alpha=alpha)
        scen = group.groupby(["target_domain", "prior"], observed=True)[value].mean()
        if dict(zip(by, key)).get("method") == "none":  # the reference against itself: 0 by definition, no interval
            res = {**res, "ci_lo": np.nan, "ci_hi": np.nan}
        out.append({**dict(zip(by, key)), "mean": res["point"], "ci_lo": res["ci_lo"], "ci_hi": res["ci_hi"],
                    "n_scenarios": int(scen.size), "n_positive_scenarios": int((scen > 0).sum()),
                    "n_encoders": int(group["encoder"].nunique()), "n_boot": res["n_boot"],
                    "n_valid": res["n_valid"], "unit": unit})
    return pd.DataFrame(out)


def negative_cells(rows: pd.DataFrame, value: str = "gain_macro_f1",
                   cell: Sequence[str] = CELL) -> pd.DataFrame:
    """One row per method x cell (encoder x target x prior): mean ``value`` over seeds and draws, and whether
    it is negative.

    Parameters
    ----------
    rows : DataFrame
        Per-draw x method prior-shift rows, concatenated over encoders (module doc).
    value : str
        The gain column averaged (default ``gain_macro_f1``).
    cell : sequence of str
        Columns that make a cell (default encoder, target_domain, prior).

    Returns
    -------
    DataFrame
        Columns ``method``, the cell columns, ``mean_gain``, ``n_rows``, ``negative`` (bool: mean gain < 0).

    Raises
    ------
    FmauditInputError
        No rows, or a column missing.
    """
    cell = list(cell)
    _require(rows, ["method", *cell, value], "negative_cells")
    cells = rows.groupby(["method", *cell], sort=False, observed=True)[value].agg(
        mean_gain="mean", n_rows="size").reset_index()
    cells["negative"] = cells["mean_gain"] < 0
    return cells


def negative_cell_counts(cells: pd.DataFrame, by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """The hema paper's "29/270" table: per ``by`` group, negative cells over all cells, the worst cell's gain and
    which cell it is (by=("method", "encoder") or ("method", "prior") break the count down).

    Parameters
    ----------
    cells : DataFrame
        Rows of :func:`negative_cells`.
    by : sequence of str
        Grouping columns (default ``method``).

    Returns
    -------
    DataFrame
        One row per group: the ``by`` columns, ``n_negative``, ``n_cells``, ``negative_cells`` (``"29/270"``),
        ``worst_gain``, ``worst_cell`` (e.g. ``"encoder=x, target_domain=y, prior=z"``).
    """
    by = list(by)
    out = []
    for key, group in cells.groupby(by, sort=False, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        worst = group.loc[group["mean_gain"].idxmin()]
        where = ", ".join(f"{c}={worst[c]}" for c in CELL if c in group.columns and c not in by)
        n_neg, n = int(group["negative"].sum()), int(len(group))
        out.append({**dict(zip(by, key)), "n_negative": n_neg, "n_cells": n, "negative_cells": f"{n_neg}/{n}",
                    "worst_gain": float(worst["mean_gain"]), "worst_cell": where})
    return pd.DataFrame(out)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def robustness_table(rows: pd.DataFrame, by: Sequence[str] = ("method", "target_domain", "prior"),
                     in_domain: str = "in_domain_macro_f1", target: str = "macro_f1",
                     reference_rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per ``by`` group and encoder: in-domain and target macro-F1 (means over seeds and draws), the relative
    gap and the effective robustness (definitions: module doc).

    ``reference_rows`` (same columns, e.g. a model trained from scratch) are scored against each group's line
    without entering its fit, and come after the group's encoders; ``frozen`` is kept when the rows have it.

    Parameters
    ----------
    rows : DataFrame
        Per-draw x method prior-shift rows, concatenated over encoders (module doc).
    by : sequence of str
        Groups, each with its own trend line (default method, target_domain, prior).
    in_domain : str
        Column of the in-domain macro-F1 (default ``in_domain_macro_f1``).
    target : str
        Column of the target macro-F1 (default ``macro_f1``).
    reference_rows : DataFrame or None
        Rows of models scored against the line without fitting it (e.g. the scratch ResNet-18).

    Returns
    -------
    DataFrame
        One row per group and encoder: the ``by`` columns, ``encoder``, the two macro-F1 columns, ``frozen``
        where present, ``relative_gap``, ``effective_robustness`` (NaN with fewer than 3 encoders or no spread
        in-domain) and ``effective_robustness_fit`` (how the line was fitted).

    Raises
    ------
    FmauditInputError
        No rows, or a column missing (in ``rows`` or ``reference_rows``).
    """
    by = list(by)
    _require(rows, [*by, "encoder", in_domain, target], "robustness_table")
    extra = [c for c in ("frozen",) if c in rows.columns]
    per = rows.groupby([*by, "encoder"], sort=False, observed=True)[[in_domain, target]].mean().reset_index()
    per["_reference"] = False
    if reference_rows is not None and len(reference_rows):
        _require(reference_rows, [*by, "encoder", in_domain, target], "robustness_table reference rows")
        ref = reference_rows.groupby([*by, "encoder"], sort=False, observed=True)[[in_domain, target]].mean()
        per = pd.concat([per, ref.reset_index().assign(_reference=True)], ignore_index=True)
    if extra:
        flags = pd.concat([rows[[*by, "encoder", *extra]]]
                          + ([reference_rows[[*by, "encoder", *extra]]] if reference_rows is not None
                             and set(extra) <= set(reference_rows.columns) else []))
        per = per.merge(flags.drop_duplicates([*by, "encoder"]), on=[*by, "encoder"], how="left")
    per["relative_gap"] = (per[in_domain] - per[target]) / per[in_domain]
    per["effective_robustness"] = np.nan
    for _, group in per.groupby(by, sort=False, observed=True):
        fit = group[~group["_reference"]]
        if len(fit) < 3:
            continue
        x, yv = _logit(fit[in_domain].to_numpy()), _logit(fit[target].to_numpy())
        if np.ptp(x) == 0:
            continue
        a, b = np.polyfit(x, yv, 1)
        xg = _logit(group[in_domain].to_numpy())
        per.loc[group.index, "effective_robustness"] = group[target] - 1.0 / (1.0 + np.exp(-(a * xg + b)))
    per["effective_robustness_fit"] = "logit-linear fit across encoders (Taori et al. 2020)"
    return per.drop(columns="_reference")


def per_class_recall(rows: pd.DataFrame, by: Sequence[str] = ("method", "prior")) -> pd.DataFrame:
    """Long table: per ``by`` group and class, the mean recall over draws where the class is present.

    Parameters
    ----------
    rows : DataFrame
        Per-draw x method prior-shift rows, concatenated over encoders (module doc).
    by : sequence of str
        Grouping columns (default method, prior).

    Returns
    -------
    DataFrame
        One row per group and class: the ``by`` columns, ``class`` (name without ``recall_``), ``recall``.

    Raises
    ------
    FmauditInputError
        No ``recall_<class>`` column, no rows, or a grouping column missing.
    """
    by = list(by)
    cols = [c for c in rows.columns if c.startswith("recall_")]
    if not cols:
        raise FmauditInputError("per_class_recall: no recall_<class> columns in the prior-shift rows")
    _require(rows, by, "per_class_recall")
    wide = rows.groupby(by, sort=False, observed=True)[cols].mean().reset_index()
    long = wide.melt(id_vars=by, value_vars=cols, var_name="class", value_name="recall")
    long["class"] = long["class"].str.removeprefix("recall_")
    return long


def calibration_under_adaptation(rows: pd.DataFrame, by: Sequence[str] = ("method", "prior")) -> pd.DataFrame:
    """Per ``by`` group: mean ECE without and with the source temperature, and their change against the
    unadapted pipeline on the same draws (negative = better calibrated).

    Parameters
    ----------
    rows : DataFrame
        Per-draw x method prior-shift rows, concatenated over encoders (module doc).
    by : sequence of str
        Grouping columns (default method, prior).

    Returns
    -------
    DataFrame
        One row per group: the ``by`` columns, ``ece_raw``, ``ece_source_t``, ``delta_ece_raw``,
        ``delta_ece_source_t`` and ``ece_convention`` where the rows have it.

    Raises
    ------
    FmauditInputError
        No rows, or a column missing.
    """
    by = list(by)
    cols = ["ece_raw", "ece_source_t", "delta_ece_raw", "delta_ece_source_t"]
    _require(rows, [*by, *cols], "calibration_under_adaptation")
    out = rows.groupby(by, sort=False, observed=True)[cols].mean().reset_index()
    if "ece_convention" in rows.columns:
        out["ece_convention"] = rows["ece_convention"].iloc[0]
    return out
