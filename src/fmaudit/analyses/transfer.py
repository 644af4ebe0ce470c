"""Across-encoder summaries of the transfer grid: OOD_Stability, CRI, target-ECE slopes, rank transfer,
AUROC/ECE rank decoupling and paired encoder differences (METHODS.md 7 and 8).

All functions take the aggregated run rows (one per run × target × calibration stage, as written by the
probe shards) and average over seeds first, so every statistic is computed on seed means. ``ece_bins`` is the
calibration setting the rows were computed with: it names the ECE column (``ece_top_<bins>_lohi``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence

import numpy as np
import pandas as pd

from scipy.stats import ConstantInputWarning

from fmaudit.metrics import ece_column, ece_convention
from fmaudit.stats import fisher_z_meta, rank_transfer

log = logging.getLogger(__name__)

AUROC_BINS = (0.0, 0.55, 0.70, 0.85, 0.95, 1.0 + 1e-9)
AUROC_BIN_LABELS = ("<0.55", "0.55-0.70", "0.70-0.85", "0.85-0.95", ">0.95")
CELL = ["task", "head", "fraction", "encoder", "source_domain", "target_domain"]


def seed_means(runs: pd.DataFrame, ece_bins: int, stage: str = "raw",
               metrics: Sequence[str] = ("macro_f1", "auroc_ovr_macro")) -> pd.DataFrame:
    """Mean over seeds of ``metrics`` and the ECE at ``ece_bins`` bins at one calibration stage, per (task, head,
    fraction, encoder, s, t)."""
    part = runs[runs["stage"] == stage]
    out = part.groupby(CELL, sort=True)[[*metrics, ece_column(ece_bins)]].mean().reset_index()
    out["in_domain"] = out["source_domain"] == out["target_domain"]
    return out


def ood_stability(runs: pd.DataFrame, ece_bins: int) -> pd.DataFrame:
    """Per (task, head, encoder): mean over pairs s→t, s≠t, of min(AUROC(s→t) / AUROC_id(s), 1) at the
    largest label fraction (PRISM's definition as corrected in the rebuttal; METHODS 8).

    Pairs with AUROC_id ≤ 0 or a non-finite ratio are skipped; no pair -> NaN.
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


def cri_table(runs: pd.DataFrame, ece_bins: int) -> pd.DataFrame:
    """PRISM's composite reliability index per (task, head, encoder, fraction):
    CRI = AUROC_id × (1 − clip(ECE after source-validation temperature, 0, 1)) × OOD_Stability.

    AUROC_id and the post-temperature ECE are in-domain means over source domains at that fraction;
    OOD_Stability is taken at the largest fraction. Geometric and worst-axis aggregations are given beside it.
    """
    raw = seed_means(runs, ece_bins, "raw")
    ts = seed_means(runs, ece_bins, "source_ts")
    raw, ts = raw[raw["in_domain"]], ts[ts["in_domain"]]
    keys = ["task", "head", "encoder", "fraction"]
    auroc = raw.groupby(keys)["auroc_ovr_macro"].mean().rename("auroc_id")
    ece = ts.groupby(keys)[ece_column(ece_bins)].mean().rename("ece_after_source_ts")
    df = pd.concat([auroc, ece], axis=1).reset_index()
    df = df.merge(ood_stability(runs, ece_bins), on=["task", "head", "encoder"], how="left")
    calib = 1.0 - df["ece_after_source_ts"].clip(0, 1)
    df["cri"] = df["auroc_id"] * calib * df["ood_stability"]
    axes = np.stack([df["auroc_id"], calib, df["ood_stability"]], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        df["cri_geometric"] = np.exp(np.log(np.clip(axes, 1e-12, None)).mean(axis=1))
    df["cri_worst_axis"] = axes.min(axis=1)
    df["cri_convention"] = (f"AUROC_id x (1 - clip(ECE_{ece_bins} after source TS, 0, 1)) "
                            "x OOD_Stability(largest fraction)")
    return df


def ece_slopes(runs: pd.DataFrame, ece_bins: int) -> pd.DataFrame:
    """Per transfer pair (task, head, encoder, s→t): least-squares slope of target ECE (raw) against the label
    fraction, and the transfer AUROC at the largest fraction with its PRISM bin."""
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
    """Share of (encoder, pair) combinations whose target ECE rises with labels, per transfer-AUROC bin."""
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
    on each target, per (task, head, fraction, s→t); whether the in-domain best is dethroned."""
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


def decoupling_table(runs: pd.DataFrame, ece_bins: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """AUROC rank vs post-temperature ECE rank of encoders, per label fraction (PRISM decoupling).

    Per unit (task × source domain, in-domain) and fraction: Spearman ρ between AUROC and −ECE (ρ > 0: better
    discrimination goes with better calibration) and the mean absolute rank gap. Per fraction, units are
    pooled with DerSimonian–Laird Fisher-z (v = 1/(n−3)) with I². Returns (per unit, pooled per fraction).
    """
    from scipy.stats import spearmanr

    raw = seed_means(runs, ece_bins, "raw")
    ts = seed_means(runs, ece_bins, "source_ts")
    keys = ["task", "head", "fraction", "source_domain", "encoder"]
    ind = raw[raw["in_domain"]].set_index(keys)["auroc_ovr_macro"].to_frame().join(
        ts[ts["in_domain"]].set_index(keys)[ece_column(ece_bins)].rename("ece_after_source_ts")).reset_index()
    units = []
    for (task, head, frac, src), cell in ind.groupby(["task", "head", "fraction", "source_domain"]):
        n = len(cell)
        if n < 2:
            continue
        auroc_rank = cell["auroc_ovr_macro"].rank(ascending=False)
        ece_rank = cell["ece_after_source_ts"].rank(ascending=True)
        constant = cell["auroc_ovr_macro"].nunique() < 2 or cell["ece_after_source_ts"].nunique() < 2
        rho = np.nan if n <= 2 or constant else spearmanr(cell["auroc_ovr_macro"], -cell["ece_after_source_ts"]).statistic
        units.append({"task": task, "head": head, "fraction": frac, "source_domain": src, "n_encoders": n,
                      "spearman_auroc_vs_neg_ece": rho, "mean_abs_rank_gap": float(np.mean(np.abs(auroc_rank - ece_rank)))})
    per_unit = pd.DataFrame(units)
    if len(per_unit):
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
    return per_unit, pd.DataFrame(pooled)


def cross_dataset_leaderboard(board: pd.DataFrame) -> pd.DataFrame:
    """Seed 000's table: per (task, head, fraction, source), encoders with in-domain and per-target macro-F1,
    targets ordered by mean macro-F1 (most shifted first), sorted by the most shifted target, with its rank."""
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
