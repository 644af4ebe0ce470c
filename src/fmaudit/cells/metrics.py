"""CellPath-Bench metrics: per-run scores, and the summaries the report tables and figures are made of.

Per run (one probe evaluated once on its test partition):
- ``macro_f1``: macro-F1 over the classes present in the test labels, in [0, 1]
  (``f1_score(y, pred, labels=present, average="macro", zero_division=0)``, from
  :func:`fmaudit.metrics.confusion_counts`). The project default (docs/methods.md#discrimination-metrics) averages over
  all K classes; cell units often lack a class (a section without one of the nine fine types), and a class that is
  neither true nor predicted would then score 0 for every encoder alike, so here it is left out.
- ``macro_auroc``: macro one-vs-rest AUROC of the softmax scores over the classes present in the test labels
  (:func:`fmaudit.metrics.auroc` when every class is present; the same Mann-Whitney statistic, ties 1/2,
  averaged over the present classes otherwise); NaN with fewer than two present classes.

Summaries (tables as frames, scores in percent / percentage points, every mean over *units*, never pooled
cells; a unit's value is first averaged over its valid seeds):
- :func:`cra_table`: CRA per section = macro-F1(Nuc) - macro-F1(Mean) in percentage points under IS;
  mean ± SD (ddof 1) over sections; ``nuc_beats_mean`` (paired Wilcoxon of Nuc vs Mean over sections);
  ``significant_wins`` against the other encoders (paired Wilcoxon of CRA over common sections, two-sided
  p < 0.05 and positive median difference: :func:`fmaudit.stats.wilcoxon_win`).
- :func:`protocol_table`: macro-F1 and macro-AUROC mean ± SD over a protocol's units, with wins.
- :func:`crt_table`: CRT, provisional (see :data:`CRT_DEFINITION`).
- :func:`taxonomy_rank_consistency`: Spearman rho between the fine and coarse encoder rankings per protocol.
- :func:`nested_section_subsets`, :func:`subset_table`: S10 ⊂ S15 ⊂ S20 ⊂ S25 and the CRA summary on each.
- :func:`magnification_retention`: 20x/40x and 10x/40x.
- :func:`win_matrix`: every ordered pair of encoders, Wilcoxon over common valid units.
- :func:`readout_table`: the seven representation modes side by side.
- :func:`cra_crt_landscape`: the CRA-CRT figure, point size = pretraining scale from the encoder registry.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError, PathLike
from fmaudit.metrics import auroc, confusion_counts
from fmaudit.stats import rank_transfer, wilcoxon_win

log = logging.getLogger(__name__)

F1_CONVENTION = ("macro-F1 over the classes present in the test labels "
                 "(f1_score(labels=present, average='macro', zero_division=0))")
AUROC_CONVENTION = "macro one-vs-rest AUROC of softmax scores over the classes present in the test labels, ties 1/2"
UNIT_KEYS = ["protocol", "encoder", "magnification", "taxonomy", "readout", "unit", "organ"]
CRT_PROTOCOLS = ("IOCD", "MOCV", "LOOO")
CRT_DEFINITION = (
    "CRT (provisional; the seed gives no formula): for each transfer protocol P in {IOCD, MOCV, LOOO} and each "
    "of its units u, the encoder's macro-F1 (Nuc readout, seed mean, %) minus the panel median macro-F1 at u "
    "(median over the encoders valid at u); averaged over P's units, then over the protocols with equal weight. "
    "In percentage points; 0 = the panel's typical encoder. Why: differences from the per-unit median remove "
    "unit difficulty (organs and folds differ far more than encoders do), the median is robust to one failing "
    "encoder, and equal protocol weights keep IOCD's many section units from outweighing the organ and fold "
    "levels the seed names alongside sections (sections, datasets, organs).")


# --------------------------------------------------------------------------------------------------------
# per run
# --------------------------------------------------------------------------------------------------------

def macro_f1_present(labels: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """Macro-F1 over the classes present in ``labels`` (module doc); in [0, 1]."""
    labels = np.asarray(labels, dtype=np.int64)
    cm = confusion_counts(labels, np.asarray(pred, dtype=np.int64), n_classes)
    present = cm.sum(axis=1) > 0
    if not present.any():
        return float("nan")
    tp = np.diag(cm).astype(np.float64)
    denom = cm.sum(axis=0) + cm.sum(axis=1)
    f1 = np.divide(2.0 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return float(f1[present].mean())


def macro_auroc_present(labels: np.ndarray, probs: np.ndarray) -> float:
    """Macro OvR AUROC over the classes present in ``labels`` (module doc); NaN below two classes."""
    from scipy.stats import rankdata

    labels = np.asarray(labels, dtype=np.int64)
    probs = np.asarray(probs)
    k = probs.shape[1]
    counts = np.bincount(labels, minlength=k)
    present = np.flatnonzero(counts > 0)
    if present.size < 2:
        return float("nan")
    if present.size == k:
        return float(auroc(probs.astype(np.float64), labels))
    aucs = []
    n = labels.size
    for c in present:
        positive = labels == c
        n_pos = int(counts[c])
        ranks = rankdata(probs[:, c], method="average")
        aucs.append((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * (n - n_pos)))
    return float(np.mean(aucs))


# --------------------------------------------------------------------------------------------------------
# unit values
# --------------------------------------------------------------------------------------------------------

def _valid(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    missing = [c for c in UNIT_KEYS + [metric, "seed"] if c not in runs.columns]
    if missing:
        raise FmauditInputError(f"cell run table: missing column(s) {missing}")
    ok = np.isfinite(pd.to_numeric(runs[metric], errors="coerce").to_numpy(dtype=float))
    if "status" in runs.columns:
        ok &= runs["status"].astype(str).to_numpy() == "ok"
    return runs.loc[ok]


def unit_means(runs: pd.DataFrame, metric: str = "macro_f1") -> pd.DataFrame:
    """Seed mean of ``metric`` per unit (protocol, encoder, magnification, taxonomy, readout, unit, organ),
    over the valid runs (status ok, finite metric); ``n_seeds`` says how many."""
    valid = _valid(runs, metric)
    keys = [k for k in UNIT_KEYS]
    frame = valid[keys + [metric]].copy()
    for k in keys:
        frame[k] = frame[k].astype(object) if k != "magnification" else frame[k].astype(float)
    out = frame.groupby(keys, sort=False, dropna=False)[metric].agg(["mean", "size"]).reset_index()
    return out.rename(columns={"mean": metric, "size": "n_seeds"})


def _select(frame: pd.DataFrame, **equal: Any) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for col, value in equal.items():
        if value is None:
            continue
        if col == "magnification":
            mask &= np.isclose(frame[col].astype(float).to_numpy(), float(value))
        else:
            mask &= frame[col].astype(str).to_numpy() == str(value)
    return frame.loc[mask]


def _pivot(values: pd.DataFrame, value: str) -> pd.DataFrame:
    """unit x encoder table of ``value`` (NaN where an encoder has no valid value at a unit)."""
    return values.pivot_table(index="unit", columns="encoder", values=value, aggfunc="mean", sort=False)


# --------------------------------------------------------------------------------------------------------
# wins
# --------------------------------------------------------------------------------------------------------

def win_matrix(values: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Every ordered pair (encoder, opponent) compared over their common valid units.

    ``values``: unit x encoder table (NaN = no valid value). Returns one row per ordered pair with ``p``,
    ``median_diff``, ``n_pairs``, ``n_nonzero`` and ``win`` (:func:`fmaudit.stats.wilcoxon_win`: two-sided
    p < alpha and a positive median difference). Pivot ``win`` for the matrix; sum it per encoder for
    ``significant_wins``.
    """
    encoders = list(values.columns)
    rows = []
    for a in encoders:
        for b in encoders:
            if a == b:
                continue
            res = wilcoxon_win(values[a].to_numpy(dtype=float), values[b].to_numpy(dtype=float), alpha=alpha)
            rows.append({"encoder": a, "opponent": b, **res})
    return pd.DataFrame(rows, columns=["encoder", "opponent", "p", "median_diff", "win", "n_nonzero", "n_pairs"])


def _wins(values: pd.DataFrame, alpha: float) -> pd.Series:
    if values.shape[1] < 2:
        return pd.Series(0, index=values.columns, dtype=int)
    matrix = win_matrix(values, alpha)
    return matrix.groupby("encoder", sort=False)["win"].sum().reindex(values.columns).astype(int)


# --------------------------------------------------------------------------------------------------------
# CRA
# --------------------------------------------------------------------------------------------------------

def cra_per_section(runs: pd.DataFrame, magnification: float | None = None) -> pd.DataFrame:
    """CRA of every (encoder, taxonomy, magnification, section) under IS: macro-F1(Nuc) - macro-F1(Mean), pp.

    Sections where either readout has no valid run are left out."""
    means = _select(unit_means(runs), protocol="IS", magnification=magnification)
    keys = ["encoder", "magnification", "taxonomy", "unit", "organ"]
    nuc = _select(means, readout="nuc")[keys + ["macro_f1"]].rename(columns={"macro_f1": "f1_nuc"})
    mean = _select(means, readout="mean")[keys + ["macro_f1"]].rename(columns={"macro_f1": "f1_mean"})
    both = nuc.merge(mean, on=keys, how="inner")
    both["f1_nuc_pct"] = 100.0 * both.pop("f1_nuc")
    both["f1_mean_pct"] = 100.0 * both.pop("f1_mean")
    both["cra_pp"] = both["f1_nuc_pct"] - both["f1_mean_pct"]
    return both.rename(columns={"unit": "section"}).reset_index(drop=True)


def cra_table(runs: pd.DataFrame, magnification: float | None = 20, alpha: float = 0.05) -> pd.DataFrame:
    """CRA summary per (encoder, taxonomy, magnification): mean ± SD over sections, Nuc-vs-Mean test, wins."""
    per = cra_per_section(runs, magnification)
    rows = []
    for (mag, tax), group in per.groupby(["magnification", "taxonomy"], sort=False):
        table = _pivot(group.rename(columns={"section": "unit"}), "cra_pp")
        wins = _wins(table, alpha)
        for enc, sub in group.groupby("encoder", sort=False):
            nuc_vs_mean = wilcoxon_win(sub["f1_nuc_pct"].to_numpy(), sub["f1_mean_pct"].to_numpy(), alpha=alpha)
            cra = sub["cra_pp"].to_numpy(dtype=float)
            rows.append({
                "encoder": enc, "taxonomy": tax, "magnification": mag,
                "cra_mean_pp": float(cra.mean()), "cra_sd_pp": float(cra.std(ddof=1)) if cra.size > 1 else np.nan,
                "f1_nuc_mean_pct": float(sub["f1_nuc_pct"].mean()), "f1_mean_mean_pct": float(sub["f1_mean_pct"].mean()),
                "n_sections": int(cra.size), "nuc_vs_mean_p": nuc_vs_mean["p"], "nuc_beats_mean": nuc_vs_mean["win"],
                "significant_wins": int(wins.get(enc, 0)), "n_opponents": int(table.shape[1] - 1),
            })
    out = pd.DataFrame(rows)
    if len(out):
        out["rank"] = out.groupby(["magnification", "taxonomy"])["cra_mean_pp"].rank(ascending=False, method="min").astype(int)
        out["unit"] = "section (IS), mean over seeds first; SD ddof=1"
        out = out.sort_values(["magnification", "taxonomy", "rank"], kind="stable").reset_index(drop=True)
    return out


# --------------------------------------------------------------------------------------------------------
# protocol tables and CRT
# --------------------------------------------------------------------------------------------------------

def protocol_table(runs: pd.DataFrame, protocol: str, magnification: float | None = 20, readout: str = "nuc",
                   alpha: float = 0.05) -> pd.DataFrame:
    """Per (encoder, taxonomy): macro-F1 and macro-AUROC mean ± SD (%) over the protocol's units, and the
    significant wins on macro-F1 over common units."""
    f1 = _select(unit_means(runs, "macro_f1"), protocol=protocol, magnification=magnification, readout=readout)
    au = _select(unit_means(runs, "macro_auroc"), protocol=protocol, magnification=magnification, readout=readout)
    rows = []
    for tax, group in f1.groupby("taxonomy", sort=False):
        table = _pivot(group, "macro_f1")
        wins = _wins(table, alpha)
        au_tax = au[au["taxonomy"].astype(str) == str(tax)]
        for enc, sub in group.groupby("encoder", sort=False):
            a = au_tax.loc[au_tax["encoder"].astype(str) == str(enc), "macro_auroc"].to_numpy(dtype=float)
            v = sub["macro_f1"].to_numpy(dtype=float)
            rows.append({
                "protocol": protocol, "encoder": enc, "taxonomy": tax, "magnification": magnification, "readout": readout,
                "macro_f1_mean_pct": 100 * v.mean(), "macro_f1_sd_pct": 100 * v.std(ddof=1) if v.size > 1 else np.nan,
                "macro_auroc_mean_pct": 100 * a.mean() if a.size else np.nan,
                "macro_auroc_sd_pct": 100 * a.std(ddof=1) if a.size > 1 else np.nan,
                "n_units": int(v.size), "significant_wins": int(wins.get(enc, 0)), "n_opponents": int(table.shape[1] - 1),
            })
    out = pd.DataFrame(rows)
    if len(out):
        out["unit"] = {"IS": "section", "IOCD": "held-out section", "MOCV": "fold", "LOOO": "organ"}.get(protocol, "unit")
    return out


def crt_table(runs: pd.DataFrame, magnification: float | None = 20, readout: str = "nuc",
              protocols: Sequence[str] = CRT_PROTOCOLS) -> pd.DataFrame:
    """CRT per (encoder, taxonomy) as :data:`CRT_DEFINITION` states (provisional), with its parts."""
    means = _select(unit_means(runs, "macro_f1"), magnification=magnification, readout=readout)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for (tax, protocol), group in means.groupby(["taxonomy", "protocol"], sort=False):
        if str(protocol) not in protocols:
            continue
        table = 100.0 * _pivot(group, "macro_f1")
        relative = table.sub(table.median(axis=1, skipna=True), axis=0)
        for enc in table.columns:
            row = rows.setdefault((str(enc), str(tax)), {"encoder": enc, "taxonomy": tax, "magnification": magnification,
                                                         "readout": readout, "n_units": 0})
            col = relative[enc].dropna()
            row[f"crt_{protocol}_pp"] = float(col.mean()) if col.size else np.nan
            row["n_units"] += int(col.size)
    out = pd.DataFrame(list(rows.values()))
    if not len(out):
        return out
    parts = [f"crt_{p}_pp" for p in protocols if f"crt_{p}_pp" in out.columns]
    out["crt_pp"] = out[parts].mean(axis=1, skipna=True)
    out["protocols"] = ",".join(p for p in protocols if f"crt_{p}_pp" in out.columns)
    out["provisional"] = True
    out["definition"] = CRT_DEFINITION
    out["rank"] = out.groupby("taxonomy")["crt_pp"].rank(ascending=False, method="min")
    return out.sort_values(["taxonomy", "rank"], kind="stable").reset_index(drop=True)


def taxonomy_rank_consistency(runs: pd.DataFrame, magnification: float | None = 20, readout: str = "nuc",
                              fine: str = "fine", coarse: str = "coarse") -> pd.DataFrame:
    """Per protocol: Spearman rho (and Kendall tau-b) between the encoders' mean macro-F1 rankings under the
    fine and the coarse taxonomy (means over units). Undefined (NaN, with the reason) below 3 encoders."""
    means = _select(unit_means(runs, "macro_f1"), magnification=magnification, readout=readout)
    rows = []
    for protocol, group in means.groupby("protocol", sort=False):
        scores = {t: group[group["taxonomy"].astype(str) == t].groupby("encoder")["macro_f1"].mean().to_dict()
                  for t in (fine, coarse)}
        common = sorted(set(scores[fine]) & set(scores[coarse]))
        row = {"protocol": protocol, "magnification": magnification, "readout": readout, "n_encoders": len(common),
               "spearman_rho": np.nan, "spearman_p": np.nan, "kendall_tau_b": np.nan, "note": ""}
        if len(common) < 3:
            row["note"] = f"undefined: {len(common)} encoder(s) scored under both taxonomies (need 3)"
        else:
            res = rank_transfer({e: scores[fine][e] for e in common}, {e: scores[coarse][e] for e in common})
            row.update(spearman_rho=res["spearman_rho"], spearman_p=res["spearman_p"], kendall_tau_b=res["kendall_tau_b"])
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------------
# nested subsets, magnification retention, readouts
# --------------------------------------------------------------------------------------------------------

def nested_section_subsets(section_scores: Mapping[str, float] | pd.Series,
                           sizes: Sequence[int] = (10, 15, 20, 25)) -> dict[str, list[str]]:
    """``S<n>``: the n sections with the highest score (ties by section name), nested by construction.

    ``section_scores``: a per-section ranking score (e.g. the morphology-annotation concordance the seed ranks
    sections by). Sizes must not exceed the number of scored sections.
    """
    scores = pd.Series(section_scores, dtype=float)
    if scores.isna().any():
        raise FmauditInputError(f"section scores: no score for {list(scores[scores.isna()].index[:5])}")
    sizes = sorted(int(s) for s in sizes)
    if sizes and sizes[-1] > len(scores):
        raise FmauditInputError(f"nested subsets: S{sizes[-1]} needs {sizes[-1]} scored sections, got {len(scores)}")
    order = sorted(scores.index, key=lambda s: (-scores[s], str(s)))
    return {f"S{n}": list(order[:n]) for n in sizes}


def check_nested(subsets: Mapping[str, Sequence[str]]) -> None:
    """Raise unless the subsets, by size, are nested (an explicit config list must be S10 ⊂ S15 ⊂ ...)."""
    items = sorted(subsets.items(), key=lambda kv: len(kv[1]))
    for (small, a), (big, b) in zip(items, items[1:]):
        extra = set(a) - set(b)
        if extra:
            raise FmauditInputError(f"section subsets: {small} is not inside {big} ({sorted(extra)[:3]} are not)")


def subset_table(runs: pd.DataFrame, subsets: Mapping[str, Sequence[str]], magnification: float | None = 20,
                 alpha: float = 0.05) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The CRA summary recomputed on each section subset, and how its encoder ranking agrees with the largest
    subset's (Spearman per taxonomy). Only section-unit results (IS) are re-summarised: MOCV and LOOO pool
    sections inside their units and would need their own runs on a smaller panel."""
    check_nested(subsets)
    tables = []
    for name, sections in subsets.items():
        keep = runs[(runs["protocol"].astype(str) != "IS") | runs["unit"].astype(str).isin(list(sections))]
        table = cra_table(keep, magnification, alpha)
        table.insert(0, "subset", name)
        table.insert(1, "subset_size", len(sections))
        tables.append(table)
    out = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    rows = []
    if len(out):
        largest = max(subsets, key=lambda k: len(subsets[k]))
        for (name, tax), group in out.groupby(["subset", "taxonomy"], sort=False):
            ref = out[(out["subset"] == largest) & (out["taxonomy"] == tax)].set_index("encoder")["cra_mean_pp"]
            cur = group.set_index("encoder")["cra_mean_pp"]
            common = [e for e in cur.index if e in ref.index]
            row = {"subset": name, "reference": largest, "taxonomy": tax, "n_encoders": len(common),
                   "spearman_rho_cra": np.nan}
            if len(common) >= 3:
                row["spearman_rho_cra"] = rank_transfer(cur[common].to_dict(), ref[common].to_dict())["spearman_rho"]
            rows.append(row)
    return out, pd.DataFrame(rows)


def magnification_retention(runs: pd.DataFrame, protocol: str = "IS", readout: str = "nuc",
                            reference: float = 40) -> pd.DataFrame:
    """Per (encoder, taxonomy): mean macro-F1 (%) over the units valid at every magnification, and the
    retention ``100 * F1(m) / F1(reference)`` of each other magnification; a last ``panel mean`` row per
    taxonomy averages the encoders' retentions."""
    means = _select(unit_means(runs, "macro_f1"), protocol=protocol, readout=readout)
    mags = sorted(means["magnification"].astype(float).unique(), reverse=True)
    if not any(np.isclose(m, reference) for m in mags):
        raise FmauditInputError(f"magnification retention: no runs at the reference {reference:g}x (have {mags})")
    rows = []
    for (enc, tax), group in means.groupby(["encoder", "taxonomy"], sort=False):
        table = group.pivot_table(index="unit", columns="magnification", values="macro_f1", aggfunc="mean").dropna()
        row: dict[str, Any] = {"encoder": enc, "taxonomy": tax, "protocol": protocol, "readout": readout,
                               "n_units": int(len(table))}
        ref_value = table[[c for c in table.columns if np.isclose(c, reference)][0]].mean() if len(table) else np.nan
        for m in mags:
            col = [c for c in table.columns if np.isclose(c, m)]
            value = table[col[0]].mean() if col and len(table) else np.nan
            row[f"f1_{m:g}x_pct"] = 100 * value
            if not np.isclose(m, reference):
                row[f"retention_{m:g}x_over_{reference:g}x_pct"] = 100 * value / ref_value if ref_value else np.nan
        rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        ratio_cols = [c for c in out.columns if c.startswith("retention_")]
        panel = out.groupby("taxonomy", sort=False)[ratio_cols].mean().reset_index()
        panel["encoder"] = "panel mean"
        panel["protocol"], panel["readout"] = protocol, readout
        out = pd.concat([out, panel], ignore_index=True)
    return out


def readout_table(runs: pd.DataFrame, protocol: str = "IS", magnification: float | None = 20) -> pd.DataFrame:
    """Per (encoder, taxonomy, readout): macro-F1 mean ± SD (%) over units, and its difference to Nuc on the
    same units (pp)."""
    means = _select(unit_means(runs, "macro_f1"), protocol=protocol, magnification=magnification)
    rows = []
    for (enc, tax), group in means.groupby(["encoder", "taxonomy"], sort=False):
        table = 100 * group.pivot_table(index="unit", columns="readout", values="macro_f1", aggfunc="mean")
        for r in table.columns:
            v = table[r].dropna()
            diff = (table[r] - table["nuc"]).dropna() if "nuc" in table.columns else pd.Series(dtype=float)
            rows.append({"encoder": enc, "taxonomy": tax, "protocol": protocol, "magnification": magnification,
                         "readout": r, "macro_f1_mean_pct": v.mean(), "macro_f1_sd_pct": v.std(ddof=1),
                         "n_units": int(v.size), "minus_nuc_pp": float(diff.mean()) if diff.size else np.nan})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------------
# the CRA-CRT landscape
# --------------------------------------------------------------------------------------------------------

def pretraining_scale(registry: Mapping[str, Mapping[str, Any]], encoders: Sequence[str]) -> pd.Series:
    """WSI-equivalent pretraining count of each encoder from its registry entry (``pretraining_wsis``; the
    seed's convention counts 1,000 tiles or image-text pairs as one WSI); NaN where the entry has none."""
    values = {}
    for enc in encoders:
        entry = registry.get(enc) or {}
        v = entry.get("pretraining_wsis")
        values[enc] = float(v) if v is not None else np.nan
    return pd.Series(values, dtype=float, name="pretraining_wsis")


def cra_crt_landscape(cra: pd.DataFrame, crt: pd.DataFrame, scale: Mapping[str, float] | pd.Series,
                      path: PathLike, taxonomy: str = "fine", magnification: float | None = 20,
                      draw_unscaled: bool = False) -> dict[str, Any]:
    """Scatter of encoders: x = mean CRA (pp, IS), y = CRT (pp, provisional), point area growing with
    log10 of the WSI-equivalent pretraining count. Encoders without a pretraining scale are omitted and listed
    under the plot, or, with ``draw_unscaled``, drawn as hollow points of the smallest size (and listed as
    such); returns ``{"plotted": [...], "omitted_no_scale": [...], "omitted_no_value": [...],
    "unscaled_hollow": [...]}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fmaudit.io import atomic_path

    scale = pd.Series(scale, dtype=float)
    a = _select(cra, taxonomy=taxonomy, magnification=magnification).set_index("encoder")["cra_mean_pp"]
    b = crt[crt["taxonomy"].astype(str) == taxonomy].set_index("encoder")["crt_pp"]
    encoders = list(dict.fromkeys(list(a.index) + list(b.index)))
    no_value = [e for e in encoders if not (e in a.index and e in b.index and np.isfinite(a[e]) and np.isfinite(b[e]))]
    no_scale = [e for e in encoders if e not in no_value and not (e in scale.index and np.isfinite(scale[e]) and scale[e] > 0)]
    plotted = [e for e in encoders if e not in no_value and e not in no_scale]
    fig, ax = plt.subplots(figsize=(6.4, 5.0))
    if plotted:
        logs = np.log10(scale[plotted].to_numpy(dtype=float))
        sizes = 30 + 220 * (logs - logs.min()) / (np.ptp(logs) or 1.0)
        ax.scatter(a[plotted], b[plotted], s=sizes, alpha=0.6, edgecolor="black", linewidth=0.5)
        for e in plotted:
            ax.annotate(e, (a[e], b[e]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    hollow = no_scale if draw_unscaled else []
    if hollow:
        ax.scatter(a[hollow], b[hollow], s=30, facecolors="none", edgecolor="black", linewidth=0.8)
        for e in hollow:
            ax.annotate(e, (a[e], b[e]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel(f"CRA (pp, IS, {magnification:g}x, mean over sections)" if magnification else "CRA (pp, IS)")
    ax.set_ylabel("CRT (pp vs panel median, provisional)")
    ax.set_title(f"CRA-CRT landscape ({taxonomy} taxonomy); area ~ log10 WSI-equivalent pretraining",
                 fontsize=9)
    notes = []
    if no_scale:
        notes.append(("hollow" if draw_unscaled else "omitted") + ", no pretraining scale in the registry: "
                     + ", ".join(no_scale))
    if no_value:
        notes.append("omitted, no CRA or CRT: " + ", ".join(no_value))
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=6, va="bottom", wrap=True)
        fig.subplots_adjust(bottom=0.12 + 0.03 * len(notes))
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=150)
    plt.close(fig)
    return {"plotted": plotted, "omitted_no_scale": [] if draw_unscaled else no_scale, "omitted_no_value": no_value,
            "unscaled_hollow": hollow}
