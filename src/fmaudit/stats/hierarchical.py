"""Structured bootstraps: the two-way (models x hospitals) cluster bootstrap of PRISM's transfer grid and the
nested (hierarchical) bootstrap of the hema paper, level by level (docs/methods.md#hierarchical-bootstrap)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.stats.intervals import percentile_interval

__all__ = ["hierarchical_bootstrap_draws", "hierarchical_bootstrap_mean", "two_way_cluster_bootstrap"]


def two_way_cluster_bootstrap(
    table: pd.DataFrame,
    stat_fn: Callable[[pd.DataFrame], float],
    model_col: str = "model",
    source_col: str = "source",
    target_col: str = "target",
    *,
    n_boot: int,
    random_state: int = 0,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Two-way (models x hospitals) cluster bootstrap of a transfer-grid statistic
    (docs/methods.md#two-way-cluster-bootstrap, PRISM).

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

    Parameters
    ----------
    table : DataFrame
        One or more rows per (model, source hospital, target hospital) cell, with the columns ``stat_fn`` reads
        besides the three below.
    stat_fn : callable
        ``stat_fn(rows) -> float``: the statistic of a (resampled) set of rows, given the ``*_slot`` columns.
    model_col, source_col, target_col : str, default "model", "source", "target"
        Columns naming the model, the source hospital (where the model was fitted) and the target hospital (where it
        was evaluated).
    n_boot : int
        Number of resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of ``np.random.default_rng``.
    alpha : float, default 0.05
        The interval is the percentile ``(alpha/2, 1 - alpha/2)`` interval of the finite draws.

    Returns
    -------
    dict
        ``point`` (``stat_fn`` on the original off-diagonal rows), ``ci_lo``, ``ci_hi``, ``n_boot``, ``n_valid``
        (finite draws), ``n_models``, ``n_hospitals`` and ``unit`` = ``"model x hospital"``.

    Raises
    ------
    FmauditInputError
        When one of the three columns is missing, or the table has no model or fewer than two hospitals.
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
    *,
    n_boot: int,
    random_state: int = 0,
) -> np.ndarray:
    """(n_boot,) resampled means of ``value`` under the nested bootstrap of
    :func:`hierarchical_bootstrap_mean`.

    Parameters
    ----------
    df : DataFrame
        One row per observation, with the ``levels`` columns and ``value``.
    levels : sequence of str
        Cluster columns from the outermost inwards, e.g. ``["encoder", "source_seed", "draw"]``; non-empty.
    value : str
        Numeric column whose mean is resampled; every value must be finite.
    n_boot : int
        Number of resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of ``np.random.default_rng``.

    Returns
    -------
    ndarray of shape (n_boot,)
        The mean of ``value`` over each resample's rows, with multiplicity.

    Raises
    ------
    FmauditInputError
        When ``levels`` is empty, a column is missing, the table is empty, ``value`` has NaN/inf, or a level
        column has missing values.
    """
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
    *,
    n_boot: int,
    random_state: int = 0,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Nested bootstrap of the mean of ``value``, resampling level by level (docs/methods.md#hierarchical-bootstrap,
    the hema paper).

    ``levels`` run from the outermost cluster inwards, e.g. ["encoder", "source_seed", "draw"]: each resample
    draws the units of ``levels[0]`` with replacement (``default_rng(random_state)``), then, within each
    drawn unit, as many of its ``levels[1]`` units with replacement as it has, and so on. Rows sharing all
    ``levels`` stay together. The statistic is the mean of ``value`` over the resampled rows (with
    multiplicity); the point estimate is the plain mean. Returns dict(point, ci_lo, ci_hi, n_boot, n_valid,
    levels); :func:`hierarchical_bootstrap_draws` gives the resampled means themselves.

    Parameters
    ----------
    df : DataFrame
        One row per observation, with the ``levels`` columns and ``value``.
    levels : sequence of str
        Cluster columns from the outermost inwards; non-empty.
    value : str
        Numeric column whose mean is estimated; every value must be finite.
    n_boot : int
        Number of resamples (keyword-only, no default: the schema's ``bootstrap.n_boot``).
    random_state : int, default 0
        Seed of ``np.random.default_rng``.
    alpha : float, default 0.05
        The interval is the percentile ``(alpha/2, 1 - alpha/2)`` interval of the draws.

    Returns
    -------
    dict
        ``point`` (plain mean), ``ci_lo``, ``ci_hi``, ``n_boot``, ``n_valid`` (finite draws) and ``levels`` (the
        resampling units, outermost first).

    Raises
    ------
    FmauditInputError
        As :func:`hierarchical_bootstrap_draws`.
    """
    draws = hierarchical_bootstrap_draws(df, levels, value, n_boot=n_boot, random_state=random_state)
    lo, hi, n_valid = percentile_interval(draws, alpha)
    return {
        "point": float(df[value].to_numpy(dtype=np.float64).mean()),
        "ci_lo": lo,
        "ci_hi": hi,
        "n_boot": int(n_boot),
        "n_valid": n_valid,
        "levels": list(levels),
    }
