"""Across-encoder summaries of the transfer grid: OOD_Stability, CRI, target-ECE slopes, rank transfer,
AUROC/ECE rank decoupling and paired encoder differences (docs/methods.md#statistics,
docs/methods.md#composite-indices-cri-cra-and-crt).

All functions take the aggregated run rows (one per run × target × calibration stage, as written by the
probe shards) and average over seeds first, so every statistic is computed on seed means. ``ece_bins`` is the
calibration setting the rows were computed with: it names the ECE column (``ece_top_<bins>_lohi``).
``include_bound_temperatures`` (``calibration``) says whether post-temperature means keep runs whose source
temperature sits at a search bound; by default they are left out and counted.

A task whose split leaks (``split: patch (leaky, as published)``: PRISM's Camelyon17 patch split) has inflated
in-domain AUROC, the denominator of OOD_Stability; :func:`cri_by_split` puts its OOD_Stability and CRI beside
those of the tasks on the same data sets with another split.
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import ConstantInputWarning

from fmaudit.metrics import ece_column, ece_convention
from fmaudit.stats import (
    cell_resample_counts,
    fisher_z_meta,
    percentile_interval,
    rank_transfer,
    seed_mean_bootstrap,
    spearman_rows,
)

log = logging.getLogger(__name__)

AUROC_BINS = (0.0, 0.55, 0.70, 0.85, 0.95, 1.0 + 1e-9)
AUROC_BIN_LABELS = ("<0.55", "0.55-0.70", "0.70-0.85", "0.85-0.95", ">0.95")
CELL = ["task", "head", "fraction", "encoder", "source_domain", "target_domain"]
#: The resampling unit of the rank-transfer interval, in words (see :func:`rank_transfer_intervals`).
RHO_RESAMPLING = ("test groups (the task's unit), source and target resampled independently, shared by every encoder "
                  "and seed")


def seed_means(runs: pd.DataFrame, ece_bins: int, stage: str = "raw",
               metrics: Sequence[str] = ("macro_f1", "auroc_ovr_macro"),
               include_bound_temperatures: bool = False) -> pd.DataFrame:
    """Mean over seeds of ``metrics`` and the ECE at ``ece_bins`` bins at one calibration stage, per (task, head,
    fraction, encoder, s, t). At a temperature-scaled stage, runs whose temperature sits at a search bound are
    left out of the means unless ``include_bound_temperatures``; ``n_runs`` and ``n_at_bound`` count them.

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows: :data:`CELL`, ``seed``, ``stage``, ``metrics``, ``ece_top_<bins>_lohi`` and
        optionally ``temperature_at_bound``.
    ece_bins : int
        Bins of the ECE column to average (the calibration setting the rows were computed with).
    stage : str
        The ladder stage to average: ``raw`` (default), ``source_ts``, ``oracle_ts`` or ``kshot_ts``.
    metrics : sequence of str
        Further metric columns to average; default macro-F1 and one-vs-rest macro AUROC.
    include_bound_temperatures : bool
        Keep runs whose temperature sits at a search bound (``calibration.include_bound_temperatures``); the raw
        stage keeps every run.

    Returns
    -------
    DataFrame
        One row per :data:`CELL`: ``n_runs``, ``n_at_bound``, the seed means of ``metrics`` and
        ``ece_top_<bins>_lohi`` (NaN where every run was left out) and ``in_domain``.
    """
    part = runs[runs["stage"] == stage]
    at_bound = (part["temperature_at_bound"].fillna(False).astype(bool) if "temperature_at_bound" in part.columns
                else pd.Series(False, index=part.index))
    part = part.assign(_at_bound=at_bound.astype(int), _one=1)
    kept = part if include_bound_temperatures or stage == "raw" else part[~at_bound]
    out = kept.groupby(CELL, sort=True)[[*metrics, ece_column(ece_bins)]].mean()
    counts = part.groupby(CELL, sort=True)[["_one", "_at_bound"]].sum().rename(
        columns={"_one": "n_runs", "_at_bound": "n_at_bound"})
    out = counts.join(out, how="left").reset_index()
    out["in_domain"] = out["source_domain"] == out["target_domain"]
    return out


def ood_stability(runs: pd.DataFrame, ece_bins: int) -> pd.DataFrame:
    """Per (task, head, encoder): mean over pairs s→t, s≠t, of min(AUROC(s→t) / AUROC_id(s), 1) at the
    largest label fraction (PRISM's definition as corrected in the rebuttal;
    docs/methods.md#composite-indices-cri-cra-and-crt).

    Pairs with AUROC_id ≤ 0 or a non-finite ratio are skipped; no pair -> NaN.

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows (the raw stage is read).
    ece_bins : int
        Bins of the rows' ECE column (:func:`seed_means` reads it).

    Returns
    -------
    DataFrame
        One row per task, head and encoder: ``n_pairs`` (off-domain pairs averaged) and ``ood_stability``.
    """
    means = seed_means(runs, ece_bins)
    top = means.groupby("task")["fraction"].transform("max")
    means = means[means["fraction"] == top]
    rows = []
    for (task, head, enc), cell in means.groupby(["task", "head", "encoder"]):
        ind = cell[cell["in_domain"]].set_index("source_domain")["auroc_ovr_macro"]
        ratios = []
        for r in cell[~cell["in_domain"]].itertuples(index=False):
            a_id = ind.get(r.source_domain, np.nan)
            ratio = r.auroc_ovr_macro / a_id if a_id > 0 else np.nan
            if np.isfinite(ratio):
                ratios.append(min(ratio, 1.0))
        rows.append({"task": task, "head": head, "encoder": enc, "n_pairs": len(ratios),
                     "ood_stability": float(np.mean(ratios)) if ratios else np.nan})
    return pd.DataFrame(rows)


def _task_facts(runs: pd.DataFrame) -> pd.DataFrame:
    """Per task: its split, data sets and calibration mode as the rows say (absent columns are left out)."""
    cols = [c for c in ("task_split", "datasets", "calibration_mode") if c in runs.columns]
    return runs.groupby("task")[cols].first().reset_index() if cols else runs[["task"]].drop_duplicates()


def cri_table(runs: pd.DataFrame, ece_bins: int, include_bound_temperatures: bool = False) -> pd.DataFrame:
    """PRISM's composite reliability index per (task, head, encoder, fraction):
    CRI = AUROC_id × (1 − clip(ECE after source-validation temperature, 0, 1)) × OOD_Stability.

    AUROC_id and the post-temperature ECE are in-domain means over source domains at that fraction (runs whose
    source temperature sits at a bound left out unless ``include_bound_temperatures``; ``n_source_ts_runs``
    and ``n_source_ts_at_bound`` count them); OOD_Stability is taken at the largest fraction. Geometric and
    worst-axis aggregations are given beside it; ``task_split`` says which split the task used and
    ``n_test_groups_in_source_train`` (in-domain, mean over sources) whether its test groups leak into training.

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows (raw and source_ts stages).
    ece_bins : int
        Bins of the ECE the index uses.
    include_bound_temperatures : bool
        Keep source temperatures at a search bound in the ECE mean; default False.

    Returns
    -------
    DataFrame
        One row per task, head, encoder and fraction: ``auroc_id``, ``ece_after_source_ts``,
        ``n_source_ts_runs``, ``n_source_ts_at_bound``, ``n_test_groups_in_source_train`` (where the rows have
        it), ``n_pairs``, ``ood_stability``, ``cri``, ``cri_geometric`` (geometric mean of the three axes),
        ``cri_worst_axis``, the task's ``task_split``, ``datasets`` and ``calibration_mode`` where the rows
        have them, and ``cri_convention``.
    """
    raw = seed_means(runs, ece_bins, "raw")
    ts = seed_means(runs, ece_bins, "source_ts", include_bound_temperatures=include_bound_temperatures)
    raw, ts = raw[raw["in_domain"]], ts[ts["in_domain"]]
    keys = ["task", "head", "encoder", "fraction"]
    auroc = raw.groupby(keys)["auroc_ovr_macro"].mean().rename("auroc_id")
    ece = ts.groupby(keys)[ece_column(ece_bins)].mean().rename("ece_after_source_ts")
    counts = ts.groupby(keys)[["n_runs", "n_at_bound"]].sum().rename(
        columns={"n_runs": "n_source_ts_runs", "n_at_bound": "n_source_ts_at_bound"})
    df = pd.concat([auroc, ece, counts], axis=1).reset_index()
    if "n_test_groups_in_source_train" in runs.columns:
        ind = runs[(runs["stage"] == "raw") & (runs["source_domain"] == runs["target_domain"])]
        leak = ind.groupby(keys)["n_test_groups_in_source_train"].mean().rename("n_test_groups_in_source_train")
        df = df.merge(leak.reset_index(), on=keys, how="left")
    df = df.merge(ood_stability(runs, ece_bins), on=["task", "head", "encoder"], how="left")
    calib = 1.0 - df["ece_after_source_ts"].clip(0, 1)
    df["cri"] = df["auroc_id"] * calib * df["ood_stability"]
    axes = np.stack([df["auroc_id"], calib, df["ood_stability"]], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        df["cri_geometric"] = np.exp(np.log(np.clip(axes, 1e-12, None)).mean(axis=1))
    df["cri_worst_axis"] = axes.min(axis=1)
    df = df.merge(_task_facts(runs), on="task", how="left")
    df["cri_convention"] = (f"AUROC_id x (1 - clip(ECE_{ece_bins} after source TS, 0, 1)) "
                            "x OOD_Stability(largest fraction); "
                            + ("bound temperatures included" if include_bound_temperatures
                               else "source TS at a bound left out of the ECE mean"))
    return df


#: Columns of :func:`cri_by_split`, after its keys.
CRI_BY_SPLIT_VALUES = ("auroc_id", "ece_after_source_ts", "ood_stability", "cri", "n_pairs",
                       "n_test_groups_in_source_train")


def cri_by_split(cri: pd.DataFrame) -> pd.DataFrame:
    """OOD_Stability and CRI of the same data sets under different task splits, side by side (long form).

    Tasks are paired when their ``datasets`` agree and their ``task_split`` differs (e.g. PRISM's Camelyon17
    task with its leaky patch split and the patient-disjoint one); one row per (data sets, head, encoder,
    fraction, task) with the task's split. Empty when no such pair exists.

    Parameters
    ----------
    cri : DataFrame
        The :func:`cri_table`.

    Returns
    -------
    DataFrame
        Columns ``datasets``, ``head``, ``encoder``, ``fraction``, ``task``, ``task_split`` and
        :data:`CRI_BY_SPLIT_VALUES`, sorted by data sets, head, encoder, fraction and split.
    """
    need = {"datasets", "task_split"}
    columns = ["datasets", "head", "encoder", "fraction", "task", "task_split", *CRI_BY_SPLIT_VALUES]
    if len(cri) == 0 or not need <= set(cri.columns):
        return pd.DataFrame(columns=columns)
    splits = cri.groupby("datasets")["task_split"].nunique()
    paired = cri[cri["datasets"].isin(splits[splits > 1].index)]
    out = paired[[c for c in columns if c in paired.columns]].sort_values(
        ["datasets", "head", "encoder", "fraction", "task_split", "task"]).reset_index(drop=True)
    return out.reindex(columns=columns)


def ece_slopes(runs: pd.DataFrame, ece_bins: int) -> pd.DataFrame:
    """Per transfer pair (task, head, encoder, s→t): least-squares slope of target ECE (raw) against the label
    fraction, and the transfer AUROC at the largest fraction with its PRISM bin.

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows (the raw stage is read).
    ece_bins : int
        Bins of the target ECE.

    Returns
    -------
    DataFrame
        One row per off-domain pair: ``task``, ``head``, ``encoder``, ``source_domain``, ``target_domain``,
        ``n_fractions``, ``ece_slope_per_unit_fraction`` (NaN with fewer than two fractions),
        ``ece_rises_with_labels``, ``transfer_auroc``, ``transfer_auroc_bin`` (:data:`AUROC_BIN_LABELS`) and
        ``ece_convention``. Empty without off-domain pairs.
    """
    means = seed_means(runs, ece_bins)
    ece_col = ece_column(ece_bins)
    off = means[~means["in_domain"]]
    rows = []
    for key, cell in off.groupby(["task", "head", "encoder", "source_domain", "target_domain"]):
        cell = cell.sort_values("fraction")
        slope = np.polyfit(cell["fraction"], cell[ece_col], 1)[0] if cell["fraction"].nunique() >= 2 else np.nan
        auroc = float(cell["auroc_ovr_macro"].iloc[-1])
        rows.append({**dict(zip(["task", "head", "encoder", "source_domain", "target_domain"], key)),
                     "n_fractions": cell["fraction"].nunique(), "ece_slope_per_unit_fraction": slope,
                     "ece_rises_with_labels": bool(slope > 0) if np.isfinite(slope) else None,
                     "transfer_auroc": auroc})
    df = pd.DataFrame(rows)
    if len(df):
        df["transfer_auroc_bin"] = pd.cut(df["transfer_auroc"], AUROC_BINS, labels=AUROC_BIN_LABELS, right=False)
        df["ece_convention"] = ece_convention(ece_bins)
    return df


def ece_slope_by_auroc_bin(slopes: pd.DataFrame) -> pd.DataFrame:
    """Share of (encoder, pair) combinations whose target ECE rises with labels, per transfer-AUROC bin.

    Parameters
    ----------
    slopes : DataFrame
        The :func:`ece_slopes`; rows without a slope are left out.

    Returns
    -------
    DataFrame
        One row per bin of :data:`AUROC_BIN_LABELS` (empty bins included): ``transfer_auroc_bin``,
        ``n_combinations``, ``share_ece_rises``, ``mean_slope`` and ``ece_convention``.
    """
    if len(slopes) == 0:
        return pd.DataFrame(columns=["transfer_auroc_bin", "n_combinations", "share_ece_rises"])
    ok = slopes.dropna(subset=["ece_slope_per_unit_fraction"])
    out = ok.groupby("transfer_auroc_bin", observed=False).agg(
        n_combinations=("ece_slope_per_unit_fraction", "size"),
        share_ece_rises=("ece_rises_with_labels", lambda s: float(np.mean(s.astype(bool))) if len(s) else np.nan),
        mean_slope=("ece_slope_per_unit_fraction", "mean"),
    ).reset_index()
    out["transfer_auroc_bin"] = out["transfer_auroc_bin"].astype(str)
    if "ece_convention" in slopes:
        out["ece_convention"] = slopes["ece_convention"].iloc[0]
    return out


def rank_transfer_table(runs: pd.DataFrame, ece_bins: int, metric: str = "macro_f1") -> pd.DataFrame:
    """Spearman ρ and Kendall τ-b between the in-domain ranking of encoders (on the source) and their ranking
    on each target, per (task, head, fraction, s→t); whether the in-domain best is dethroned.

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows (the raw stage is read).
    ece_bins : int
        Bins of the rows' ECE column (:func:`seed_means` reads it).
    metric : str
        The seed-mean metric the encoders are ranked by; default ``macro_f1``.

    Returns
    -------
    DataFrame
        One row per (task, head, fraction, source, target) with at least two encoders on both sides:
        ``metric``, the keys of :func:`fmaudit.stats.rank_transfer` (``spearman_rho``, ``spearman_p``,
        ``kendall_tau_b``, ``kendall_p``, ``n_models``, ``source_best``, ``target_rank_of_source_best``,
        ``dethroned``) and ``ranking_defined`` (False when either side's scores all tie).
    """
    means = seed_means(runs, ece_bins)
    rows = []
    for (task, head, frac, src), cell in means.groupby(["task", "head", "fraction", "source_domain"]):
        ind = cell[cell["in_domain"]].set_index("encoder")[metric]
        for tgt, tc in cell[~cell["in_domain"]].groupby("target_domain"):
            tgt_scores = tc.set_index("encoder")[metric]
            common = sorted(set(ind.index) & set(tgt_scores.index))
            if len(common) < 2:
                continue
            with warnings.catch_warnings():  # all encoders tied: ρ is NaN, and said so in ranking_defined
                warnings.simplefilter("ignore", ConstantInputWarning)
                res = rank_transfer({e: float(ind[e]) for e in common}, {e: float(tgt_scores[e]) for e in common})
            rows.append({"task": task, "head": head, "fraction": frac, "source_domain": src, "target_domain": tgt,
                         "metric": metric, **res,
                         "ranking_defined": bool(ind[common].nunique() > 1 and tgt_scores[common].nunique() > 1)})
    return pd.DataFrame(rows)


def rank_transfer_intervals(preds: pd.DataFrame, *, n_boot: int, seed: int, metric: str = "macro_f1",
                            alpha: float = 0.05) -> pd.DataFrame:
    """Percentile bootstrap interval of the rank-transfer Spearman ρ, per (task, head, fraction, s→t).

    Resampling unit: the test patients (or slides). What would change if the audit were rerun on other
    patients is the two test sets the encoders are scored on; the encoders themselves are the fixed set being
    compared (and four or so of them are too few to resample: most encoder resamples would tie). So each draw
    resamples the source domain's test groups and, independently, the target's (they are other people), and
    applies the same draw to every encoder and seed: ``metric`` (mean over seeds) of every encoder on both
    sides, then ρ of the two rankings (:func:`fmaudit.stats.spearman_rows`). Draws in which either ranking is
    constant have no ρ and are left out (``rho_n_valid`` counts the rest). Intervals need the same encoders on
    both sides; cells with fewer than two are skipped.

    Parameters
    ----------
    preds : DataFrame
        The probe suite's predictions: ``task``, ``head``, ``fraction``, ``source_domain``, ``target_domain``,
        ``encoder``, ``seed``, ``group``, ``label``, ``logits``.
    n_boot : int
        Bootstrap resamples (keyword-only: ``bootstrap.n_boot``).
    seed : int
        Seed of the source's resampling (``bootstrap.seed``); the target's uses the stream ``[seed, 1]``.
    metric : str
        The metric ranked, per seed mean; default ``macro_f1``.
    alpha : float
        One minus the interval's coverage; default 0.05.

    Returns
    -------
    DataFrame
        One row per (task, head, fraction, source, target): ``spearman_rho_ci_lo``, ``spearman_rho_ci_hi``,
        ``rho_n_valid``, ``n_boot``, ``n_source_test_groups``, ``n_target_test_groups`` and
        ``rho_ci_convention``.
    """
    keys = ["task", "head", "fraction", "source_domain"]
    rows = []
    for key, block in preds.groupby(keys, sort=True):
        in_domain = (block["target_domain"] == key[3]).to_numpy()
        source_cell = block[in_domain]
        if len(source_cell) == 0:
            continue
        src_order, src_labels, src_counts = cell_resample_counts(source_cell, n_boot, seed)
        src_draws = {enc: seed_mean_bootstrap(p, metric, src_counts, src_order, src_labels)[1]
                     for enc, p in source_cell.groupby("encoder", sort=True)}
        for target, cell in block[~in_domain].groupby("target_domain", sort=True):
            # an independent draw for the target's patients: another stream than the source's
            tgt_order, tgt_labels, tgt_counts = cell_resample_counts(cell, n_boot, [seed, 1])
            tgt_draws = {enc: seed_mean_bootstrap(p, metric, tgt_counts, tgt_order, tgt_labels)[1]
                         for enc, p in cell.groupby("encoder", sort=True)}
            common = sorted(set(src_draws) & set(tgt_draws))
            if len(common) < 2:
                continue
            x = np.stack([src_draws[e] for e in common], axis=1)
            y = np.stack([tgt_draws[e] for e in common], axis=1)
            finite = np.isfinite(x).all(axis=1) & np.isfinite(y).all(axis=1)
            rho = np.full(n_boot, np.nan)
            if finite.any():
                rho[finite] = spearman_rows(x[finite], y[finite])
            lo, hi, n_valid = percentile_interval(rho, alpha)
            rows.append({**dict(zip(keys, key)), "target_domain": target, "spearman_rho_ci_lo": lo,
                         "spearman_rho_ci_hi": hi, "rho_n_valid": n_valid, "n_boot": n_boot,
                         "n_source_test_groups": int(source_cell["group"].nunique()),
                         "n_target_test_groups": int(cell["group"].nunique()),
                         "rho_ci_convention": f"{100 * (1 - alpha):g}% percentile bootstrap, unit: {RHO_RESAMPLING}, "
                                              f"B={n_boot}"})
    return pd.DataFrame(rows)


def decoupling_table(runs: pd.DataFrame, ece_bins: int,
                     include_bound_temperatures: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """AUROC rank vs post-temperature ECE rank of encoders, per label fraction (PRISM decoupling).

    Per unit (task × source domain, in-domain) and fraction: Spearman ρ between AUROC and −ECE (ρ > 0: better
    discrimination goes with better calibration) and the mean absolute rank gap. Per fraction, units are
    pooled with DerSimonian–Laird Fisher-z (v = 1/(n−3)) with I². Returns (per unit, pooled per fraction).

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows (raw and source_ts stages).
    ece_bins : int
        Bins of the post-temperature ECE.
    include_bound_temperatures : bool
        Keep source temperatures at a search bound in the ECE means; default False.

    Returns
    -------
    per_unit : DataFrame
        One row per task, head, fraction and source with at least two encoders: ``n_encoders``,
        ``spearman_auroc_vs_neg_ece`` (NaN with two encoders or constant scores), ``mean_abs_rank_gap`` and
        ``ece_convention``.
    pooled : DataFrame
        One row per head and fraction: ``n_units`` (units with more than three encoders, the ones pooled),
        ``mean_abs_rank_gap``, ``pooled_rho``, ``ci_lo``, ``ci_hi``, ``Q``, ``I2``, ``tau2`` and
        ``ece_convention``.
    """
    from scipy.stats import spearmanr

    raw = seed_means(runs, ece_bins, "raw")
    ts = seed_means(runs, ece_bins, "source_ts", include_bound_temperatures=include_bound_temperatures)
    keys = ["task", "head", "fraction", "source_domain", "encoder"]
    ind = raw[raw["in_domain"]].set_index(keys)["auroc_ovr_macro"].to_frame().join(
        ts[ts["in_domain"]].set_index(keys)[ece_column(ece_bins)].rename("ece_after_source_ts")).reset_index()
    units = []
    for (task, head, frac, src), cell in ind.groupby(["task", "head", "fraction", "source_domain"]):
        cell = cell.dropna(subset=["ece_after_source_ts"])  # every run of an encoder at a bound: no ECE to rank
        n = len(cell)
        if n < 2:
            continue
        auroc_rank = cell["auroc_ovr_macro"].rank(ascending=False)
        ece_rank = cell["ece_after_source_ts"].rank(ascending=True)
        constant = cell["auroc_ovr_macro"].nunique() < 2 or cell["ece_after_source_ts"].nunique() < 2
        rho = (np.nan if n <= 2 or constant
               else spearmanr(cell["auroc_ovr_macro"], -cell["ece_after_source_ts"]).statistic)
        units.append({"task": task, "head": head, "fraction": frac, "source_domain": src, "n_encoders": n,
                      "spearman_auroc_vs_neg_ece": rho,
                      "mean_abs_rank_gap": float(np.mean(np.abs(auroc_rank - ece_rank)))})
    per_unit = pd.DataFrame(units, columns=["task", "head", "fraction", "source_domain", "n_encoders",
                                            "spearman_auroc_vs_neg_ece", "mean_abs_rank_gap"])
    per_unit["ece_convention"] = ece_convention(ece_bins)
    pooled = []
    for (head, frac), cell in per_unit.groupby(["head", "fraction"]) if len(per_unit) else []:
        ok = cell.dropna(subset=["spearman_auroc_vs_neg_ece"])
        ok = ok[ok["n_encoders"] > 3]  # v = 1/(n-3) needs more than three encoders
        meta = fisher_z_meta(ok["spearman_auroc_vs_neg_ece"].to_numpy(), ok["n_encoders"].to_numpy()) if len(ok) else {}
        pooled.append({"head": head, "fraction": frac, "n_units": len(ok),
                       "mean_abs_rank_gap": cell["mean_abs_rank_gap"].mean(),
                       **{k: meta.get(k, np.nan) for k in ("pooled_rho", "ci_lo", "ci_hi", "Q", "I2", "tau2")},
                       "ece_convention": ece_convention(ece_bins)})
    columns = ["head", "fraction", "n_units", "mean_abs_rank_gap", "pooled_rho", "ci_lo", "ci_hi", "Q", "I2", "tau2",
               "ece_convention"]
    return per_unit, pd.DataFrame(pooled, columns=columns)


def cross_dataset_leaderboard(board: pd.DataFrame) -> pd.DataFrame:
    """The hema paper's table: per (task, head, fraction, source), encoders with in-domain and per-target macro-F1,
    targets ordered by mean macro-F1 (most shifted first), sorted by the most shifted target, with its rank.

    Parameters
    ----------
    board : DataFrame
        The probe leaderboard (:func:`fmaudit.analyses.leaderboard.leaderboard`).

    Returns
    -------
    DataFrame
        Wide: one row per (task, head, fraction, source, encoder) with ``in_domain``, ``rank_in_domain``, a
        macro-F1 column per target domain (named by it) and ``rank_on_<most shifted target>``. Empty when no
        source has a target.
    """
    parts = []
    for (task, head, frac, src), cell in board.groupby(["task", "head", "fraction", "source_domain"]):
        off = cell[~cell["in_domain"]]
        if len(off) == 0:
            continue
        order = off.groupby("target_domain")["macro_f1"].mean().sort_values().index.tolist()
        wide = cell.pivot_table(index="encoder", columns="target_domain", values="macro_f1").reset_index()
        wide = wide.rename(columns={src: "in_domain"})
        most = order[0]
        wide[f"rank_on_{most}"] = wide[most].rank(ascending=False, method="min").astype(int)
        wide["rank_in_domain"] = wide["in_domain"].rank(ascending=False, method="min").astype(int)
        wide = wide.sort_values(most, ascending=False)
        wide.insert(0, "source_domain", src)
        wide.insert(0, "fraction", frac)
        wide.insert(0, "head", head)
        wide.insert(0, "task", task)
        parts.append(wide[["task", "head", "fraction", "source_domain", "encoder", "in_domain", "rank_in_domain"]
                          + order + [f"rank_on_{most}"]])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
