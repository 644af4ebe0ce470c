"""Leaderboards of the probe suite from the aggregated runs and the shard predictions: macro-F1 and ECE per
encoder and target with cluster-bootstrap intervals, paired differences to the in-domain best encoder, the
calibration ladder, the in-domain vs off-domain summary, and the data of the report's figures.

Intervals are percentile cluster-bootstrap intervals over the manifest's groups (patients or slides) of the
seed-averaged metric, so that they describe the test-set sampling of the reported mean
(:func:`fmaudit.stats.seed_mean_bootstrap`). Every function takes its settings explicitly: ``ece_bins``
(``calibration.ece_bins``), ``n_boot`` and ``seed`` (``bootstrap``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fmaudit.analyses.transfer import seed_means
from fmaudit.metrics import binned_metric_columns, ece_column, ece_convention, reliability_bins, softmax
from fmaudit.stats import cell_resample_counts, percentile_interval, seed_mean_bootstrap

RUN_KEYS = ["task", "head", "fraction", "encoder", "source_domain", "target_domain"]
RESAMPLING = "patient/slide cluster bootstrap"

__all__ = [
    "RUN_KEYS",
    "calibration_table",
    "ece_by_fraction",
    "leaderboard",
    "paired_differences",
    "reliability_curves",
    "shift_summary",
]


def ci_convention(n_boot: int, alpha: float = 0.05) -> str:
    """How the intervals of a table were made, in words."""
    return f"{100 * (1 - alpha):g}% percentile, {RESAMPLING}, B={n_boot}, over the seed mean"


def leaderboard(runs: pd.DataFrame, preds: pd.DataFrame, *, n_boot: int, seed: int, ece_bins: int,
                alpha: float = 0.05) -> pd.DataFrame:
    """In-domain and per-target macro-F1 (and ECE at ``ece_bins`` bins) at the largest label fraction, mean over
    seeds, with cluster-bootstrap CIs (one resample of the cell's groups for both metrics)."""
    raw = runs[runs["stage"] == "raw"]
    top = raw.groupby("task")["fraction"].transform("max")
    raw = raw[raw["fraction"] == top]
    cells = dict(tuple(preds.groupby(RUN_KEYS)))
    ece_col = ece_column(ece_bins)
    rows = []
    for key, cell in raw.groupby(RUN_KEYS, sort=True):
        sel = cells[key]
        order, labels, counts = cell_resample_counts(sel, n_boot, seed)
        f1, f1_boot = seed_mean_bootstrap(sel, "macro_f1", counts, order, labels)
        ece, ece_boot = seed_mean_bootstrap(sel, "ece", counts, order, labels, n_bins=ece_bins)
        f1_lo, f1_hi, _ = percentile_interval(f1_boot, alpha)
        ece_lo, ece_hi, _ = percentile_interval(ece_boot, alpha)
        rows.append({
            **dict(zip(RUN_KEYS, key)), "in_domain": bool(cell["in_domain"].iloc[0]), "n_seeds": cell["seed"].nunique(),
            "n_test": int(cell["n_test"].iloc[0]), "n_test_groups": int(cell["n_test_groups"].iloc[0]),
            "macro_f1": f1, "macro_f1_ci_lo": f1_lo, "macro_f1_ci_hi": f1_hi,
            "balanced_accuracy": cell["balanced_accuracy"].mean(), "auroc_ovr_macro": cell["auroc_ovr_macro"].mean(),
            ece_col: ece, "ece_ci_lo": ece_lo, "ece_ci_hi": ece_hi,
        })
    df = pd.DataFrame(rows)
    if len(df):
        df["rank_macro_f1"] = df.groupby(["task", "head", "fraction", "source_domain", "target_domain"])[
            "macro_f1"].rank(ascending=False, method="min").astype(int)
        df["ci_convention"] = ci_convention(n_boot, alpha)
    return df


def paired_differences(board: pd.DataFrame, preds: pd.DataFrame, *, n_boot: int, seed: int,
                       metric: str = "macro_f1", alpha: float = 0.05) -> pd.DataFrame:
    """Paired cluster bootstrap of each encoder's ``metric`` minus the in-domain best encoder's, per target.

    One resample of groups is shared by every encoder and seed of a (task, head, fraction, s→t) cell."""
    rows = []
    keys = ["task", "head", "fraction", "source_domain"]
    cells = dict(tuple(preds.groupby(keys + ["target_domain"])))
    for key, cell in board.groupby(keys):
        ind = cell[cell["in_domain"]]
        if ind["encoder"].nunique() < 2:
            continue
        reference = ind.sort_values(["macro_f1", "encoder"], ascending=[False, True])["encoder"].iloc[0]
        for target in cell["target_domain"].unique():
            sel = cells[(*key, target)]
            order, labels, counts = cell_resample_counts(sel, n_boot, seed)
            res = {enc: seed_mean_bootstrap(p, metric, counts, order, labels) for enc, p in sel.groupby("encoder")}
            ref_point, ref_boot = res[reference]
            for enc, (point, boot) in res.items():
                if enc == reference:
                    continue
                lo, hi, _ = percentile_interval(boot - ref_boot, alpha)
                rows.append({**dict(zip(keys, key)), "target_domain": target, "in_domain": target == key[3],
                             "encoder": enc, "reference": reference, "metric": metric,
                             "difference": point - ref_point, "ci_lo": lo, "ci_hi": hi,
                             "ci_excludes_zero": bool(lo > 0 or hi < 0), "n_boot": n_boot,
                             "resampling": "paired, patient/slide clusters, shared across encoders and seeds"})
    return pd.DataFrame(rows)


def calibration_table(runs: pd.DataFrame, *, ece_bins: int) -> pd.DataFrame:
    """The calibration ladder at the largest label fraction, mean over seeds."""
    top = runs.groupby("task")["fraction"].transform("max")
    cal = runs[runs["fraction"] == top].copy()
    cal["k"] = cal["k"].fillna(-1)
    binned = binned_metric_columns(ece_bins)
    metrics = [binned["ece"], binned["adaptive_ece"], binned["classwise_ece"], "nll", "brier_sum", "temperature"]
    metrics = [m for m in metrics if m in cal.columns]
    out = (cal.groupby(RUN_KEYS + ["in_domain", "stage", "k", "deployable"], sort=True)[metrics].mean()
           .reset_index())
    out["k"] = out["k"].where(out["k"] >= 0)
    out["ece_convention"] = f"{ece_convention(ece_bins)}; Brier summed over classes"
    return out


def shift_summary(board: pd.DataFrame, *, ece_bins: int) -> pd.DataFrame:
    """Per task, head and encoder: in-domain vs mean off-domain macro-F1 and ECE."""
    ece_col = ece_column(ece_bins)
    rows = []
    for (task, head, enc), cell in board.groupby(["task", "head", "encoder"]):
        ind, off = cell[cell["in_domain"]], cell[~cell["in_domain"]]
        rows.append({"task": task, "head": head, "encoder": enc,
                     "macro_f1_in_domain": ind["macro_f1"].mean(), "macro_f1_off_domain": off["macro_f1"].mean(),
                     "ece_in_domain": ind[ece_col].mean(), "ece_off_domain": off[ece_col].mean()})
    out = pd.DataFrame(rows)
    out["ece_convention"] = ece_convention(ece_bins)
    return out


def reliability_curves(preds: pd.DataFrame, *, n_bins: int) -> pd.DataFrame:
    """Reliability-diagram data of each encoder (first head, first seed, largest fraction), in-domain and
    off-domain, raw and after the source temperature: one row per (encoder, part, calibration, bin) with
    ``confidence``, ``accuracy`` and ``count`` (:func:`fmaudit.metrics.reliability_bins`) and ``n_items``."""
    top = preds["fraction"].max()
    sel = preds[(preds["fraction"] == top) & (preds["seed"] == preds["seed"].min())]
    sel = sel[sel["head"] == sel["head"].iloc[0]]
    frames = []
    for enc in sorted(sel["encoder"].unique()):
        e = sel[sel["encoder"] == enc]
        for part_name, part in (("in-domain", e[e["source_domain"] == e["target_domain"]]),
                                ("off-domain", e[e["source_domain"] != e["target_domain"]])):
            if len(part) == 0:
                frames.append(pd.DataFrame({"encoder": [enc], "part": [part_name], "n_items": [0]}))
                continue
            logits = np.stack(part["logits"].to_numpy())
            labels = part["label"].to_numpy().astype(int)
            for name, temp in (("raw", np.ones(len(part))), ("source TS", part["temperature_source"].to_numpy())):
                bins = reliability_bins(softmax(logits / temp[:, None]), labels, n_bins=n_bins)
                frames.append(bins.assign(encoder=enc, part=part_name, calibration=name, n_items=len(part)))
    return pd.concat(frames, ignore_index=True)


def ece_by_fraction(runs: pd.DataFrame, *, ece_bins: int) -> pd.DataFrame:
    """Target ECE (raw, seed mean) per label fraction on each transfer pair (in-domain when there is none)."""
    means = seed_means(runs, ece_bins)
    off = means[~means["in_domain"]]
    return (off if len(off) else means).reset_index(drop=True)
