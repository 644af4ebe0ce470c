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

- *Organ-balanced* (CellPath-Bench's headline: "protocol summaries balance anatomical or cross-validation units
  rather than pooling all cells"): the units of each organ are averaged first, then the mean ± SD (ddof 1) is
  taken across organs; MOCV, whose folds mix organs, is balanced over its folds. :data:`BALANCES`.
- *Significant wins* (:func:`run_level_wins`): a paired Wilcoxon test against every other encoder over every
  common valid run-level unit, (unit, seed): CellPath-Bench's "paired Wilcoxon signed-rank tests over common valid
  evaluation units", whose MOCV wins (up to 27 with 5 folds x 3 seeds) need more than the 5 seed-averaged folds
  (the smallest two-sided p of 5 pairs is 0.0625); two-sided p < 0.05 and a positive median difference
  (:func:`fmaudit.stats.wilcoxon_win`).
- :func:`cra_table`: CRA = macro-F1(Nuc) - macro-F1(Mean) in percentage points under IS, organ-balanced (or per
  section, ``balance="unit"``), with ``nuc_beats_mean`` and ``significant_wins`` over (section, seed).
- :func:`protocol_table`: macro-F1 and macro-AUROC, organ-balanced (or per unit), with wins over (unit, seed).
- :func:`crt_table`: CRT = the mean of an encoder's significant-win counts on macro-F1 over IOCD, MOCV and LOOO
  (:data:`CRT_DEFINITION`), with the mean relative macro-F1 (pp from the panel median) as a second column.
- :func:`taxonomy_rank_consistency`: Spearman rho between the fine and coarse encoder rankings per protocol.
- :func:`nested_section_subsets`, :func:`subset_table`: S10 ⊂ S15 ⊂ S20 ⊂ S25 and the CRA summary on each.
- :func:`magnification_retention`: 20x/40x and 10x/40x.
- :func:`win_matrix`: every ordered pair of encoders, Wilcoxon over common valid units.
- :func:`readout_table`: the seven representation modes side by side.
The CRA-CRT landscape figure is drawn by :mod:`fmaudit.report.cells` from these tables.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.metrics import auroc, confusion_counts
from fmaudit.stats import rank_transfer, wilcoxon_win

log = logging.getLogger(__name__)

F1_CONVENTION = ("macro-F1 over the classes present in the test labels "
                 "(f1_score(labels=present, average='macro', zero_division=0))")
AUROC_CONVENTION = "macro one-vs-rest AUROC of softmax scores over the classes present in the test labels, ties 1/2"
UNIT_KEYS = ["protocol", "encoder", "magnification", "taxonomy", "readout", "unit", "organ"]
CRT_PROTOCOLS = ("IOCD", "MOCV", "LOOO")
#: How a protocol's unit values are summarised: ``organ`` (CellPath-Bench's: organs first, then across organs; MOCV
#: across its folds) or ``unit`` (every unit alike: sections, held-out sections, folds, organs).
BALANCES = ("organ", "unit")
UNIT_NAMES = {"IS": "section", "IOCD": "held-out section", "MOCV": "fold", "LOOO": "organ"}
WIN_UNITS = "(unit, seed): every common valid run"
CRT_DEFINITION = (
    "CRT: the mean of the encoder's significant-win counts on Nuc macro-F1 over the transfer protocols IOCD, MOCV "
    "and LOOO (each win a paired two-sided Wilcoxon test against one other encoder over their common valid (unit, "
    "seed) runs, p < 0.05 and a positive median difference); CellPath-Bench publishes no formula, but its top "
    "encoder's 27, 27 and 25 wins under IOCD, MOCV and LOOO and the paper's CRT agree with this mean (26.33). "
    "crt_relative_pp is a second, magnitude-bearing view: the encoder's macro-F1 minus the panel median at each "
    "unit (seed mean, pp), averaged over units, then over the protocols with equal weight; it separates encoders "
    "whose win counts tie (a count saturates at n_opponents) and says by how much an encoder leads.")
# --------------------------------------------------------------------------------------------------------
# per run
# --------------------------------------------------------------------------------------------------------

def macro_f1_present(labels: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """Macro-F1 over the classes present in ``labels`` (module doc); in [0, 1].

    Parameters
    ----------
    labels : ndarray of shape (n_cells,)
        True class indices, 0..n_classes-1.
    pred : ndarray of shape (n_cells,)
        Predicted class indices, 0..n_classes-1.
    n_classes : int
        Number of classes K of the taxonomy (the confusion matrix is K x K).

    Returns
    -------
    float
        The mean F1 over the classes with at least one true cell (absent classes are left out of the mean; a cell
        predicted as an absent class still lowers its true class's recall); NaN for no cell.
    """
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
    """Macro OvR AUROC over the classes present in ``labels`` (module doc); NaN below two classes.

    Parameters
    ----------
    labels : ndarray of shape (n_cells,)
        True class indices, 0..K-1.
    probs : ndarray of shape (n_cells, K)
        Softmax probabilities per row (K = the taxonomy's classes, the columns' order the class indices).

    Returns
    -------
    float
        Mean over the present classes of the one-vs-rest AUROC (Mann-Whitney, ties count 1/2); NaN with fewer than two
        present classes.
    """
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


def run_values(runs: pd.DataFrame, metric: str = "macro_f1") -> pd.DataFrame:
    """The valid runs (status ok, finite metric) with their unit keys, seed and ``metric``: the run-level units
    of the significant wins.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    metric : str, default "macro_f1"
        The metric column to keep.

    Returns
    -------
    DataFrame
        One row per valid run, columns :data:`UNIT_KEYS`, ``seed`` and ``metric`` (``magnification`` as float, the
        other keys as objects), a fresh index.

    Raises
    ------
    FmauditInputError
        When ``runs`` lacks a unit key, ``seed`` or the metric column.
    """
    valid = _valid(runs, metric)
    frame = valid[UNIT_KEYS + ["seed", metric]].copy()
    for k in UNIT_KEYS:
        frame[k] = frame[k].astype(object) if k != "magnification" else frame[k].astype(float)
    return frame.reset_index(drop=True)


def unit_means(runs: pd.DataFrame, metric: str = "macro_f1") -> pd.DataFrame:
    """Seed mean of ``metric`` per unit (protocol, encoder, magnification, taxonomy, readout, unit, organ),
    over the valid runs (status ok, finite metric); ``n_seeds`` says how many.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    metric : str, default "macro_f1"
        The metric column to average.

    Returns
    -------
    DataFrame
        One row per unit: columns :data:`UNIT_KEYS`, ``metric`` (its mean over the unit's valid seeds) and ``n_seeds``.

    Raises
    ------
    FmauditInputError
        When ``runs`` lacks a unit key, ``seed`` or the metric column.
    """
    frame = run_values(runs, metric)
    out = frame.groupby(UNIT_KEYS, sort=False, dropna=False)[metric].agg(["mean", "size"]).reset_index()
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


def balanced_summary(values: pd.Series | np.ndarray, organs: Any, protocol: str,
                     balance: str = "organ") -> tuple[float, float, int]:
    """(mean, SD ddof 1, n) of unit values: with ``balance="organ"`` the units of each organ are averaged first
    and the mean and SD are taken across organs (n = organs; a protocol whose units carry no organ, MOCV's
    folds, is balanced over its units); with ``balance="unit"`` over the units (n = units).

    Parameters
    ----------
    values : Series or ndarray of shape (n_units,)
        One value per unit (a seed mean), in the caller's unit (percent, pp).
    organs : array-like of shape (n_units,) or None
        Each unit's organ; None or an empty organ anywhere means the units are summarised as they are.
    protocol : str
        The protocol (``IS``, ``IOCD``, ``MOCV``, ``LOOO``); ``MOCV`` is never organ-balanced (its folds mix organs).
    balance : {"organ", "unit"}, default "organ"
        Organs first, then across organs; or every unit alike.

    Returns
    -------
    mean : float
        Mean over the balanced values; NaN for none.
    sd : float
        Their standard deviation (ddof 1); NaN below two values.
    n : int
        Number of balanced values (organs or units).

    Raises
    ------
    FmauditInputError
        When ``balance`` is not one of :data:`BALANCES`.
    """
    if balance not in BALANCES:
        raise FmauditInputError(f"balance {balance!r}: expected one of {BALANCES}")
    v = np.asarray(values, dtype=np.float64)
    org = np.asarray(organs).astype(str) if organs is not None else np.full(v.size, "")
    if balance == "organ" and protocol != "MOCV" and (org != "").all():
        v = pd.Series(v).groupby(org, sort=False).mean().to_numpy()
    if v.size == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan"), int(v.size)


def balance_unit(protocol: str, balance: str) -> str:
    """What the mean ± SD of a protocol's summary runs over (``organ``, ``fold``, ``section`` ...).

    Parameters
    ----------
    protocol : str
        The protocol (``IS``, ``IOCD``, ``MOCV``, ``LOOO``).
    balance : {"organ", "unit"}
        The summary's balance (:func:`balanced_summary`).

    Returns
    -------
    str
        ``organ`` (``fold`` for MOCV) when organ-balanced, else the protocol's unit name (:data:`UNIT_NAMES`).
    """
    if balance == "organ":
        return "fold" if protocol == "MOCV" else "organ"
    return UNIT_NAMES.get(protocol, "unit")


# --------------------------------------------------------------------------------------------------------
# wins
# --------------------------------------------------------------------------------------------------------

def win_matrix(values: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Every ordered pair (encoder, opponent) compared over their common valid units.

    Pivot ``win`` for the matrix; sum it per encoder for ``significant_wins`` (docs/methods.md#significant-wins).

    Parameters
    ----------
    values : DataFrame
        Unit x encoder table of one value (rows the paired units, columns the encoders; NaN = no valid value,
        that unit then dropped from the encoder's pairs).
    alpha : float, default 0.05
        Significance level of the two-sided Wilcoxon tests.

    Returns
    -------
    DataFrame
        One row per ordered pair, columns ``encoder``, ``opponent``, ``p`` (two-sided Wilcoxon), ``median_diff``
        (encoder minus opponent), ``win`` (:func:`fmaudit.stats.wilcoxon_win`: p < alpha and a positive median
        difference), ``n_nonzero`` and ``n_pairs``.
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


def run_level_table(values: pd.DataFrame, value: str) -> pd.DataFrame:
    """(unit, seed) x encoder table of ``value``: the run-level units the wins are tested over.

    Parameters
    ----------
    values : DataFrame
        Run-level rows with ``unit``, ``seed``, ``encoder`` and ``value`` (:func:`run_values`, or the CRA per run).
    value : str
        The column to tabulate.

    Returns
    -------
    DataFrame
        Index (``unit``, ``seed``), one column per encoder; NaN where an encoder has no valid run.
    """
    return values.pivot_table(index=["unit", "seed"], columns="encoder", values=value, aggfunc="mean", sort=False)


def run_level_wins(values: pd.DataFrame, value: str, alpha: float = 0.05) -> pd.Series:
    """Significant wins of each encoder over every other, paired over their common valid (unit, seed) runs.

    Parameters
    ----------
    values : DataFrame
        Run-level rows with ``unit``, ``seed``, ``encoder`` and ``value``, all of one (protocol, taxonomy,
        magnification, readout).
    value : str
        The column compared (``macro_f1``, ``cra_pp`` ...).
    alpha : float, default 0.05
        Significance level of the two-sided Wilcoxon tests.

    Returns
    -------
    Series of int
        Indexed by encoder: the number of opponents it significantly beats (0 with fewer than two encoders).
    """
    table = run_level_table(values, value)
    if table.shape[1] < 2:
        return pd.Series(0, index=table.columns, dtype=int)
    matrix = win_matrix(table, alpha)
    return matrix.groupby("encoder", sort=False)["win"].sum().reindex(table.columns).astype(int)


# --------------------------------------------------------------------------------------------------------
# CRA
# --------------------------------------------------------------------------------------------------------

def cra_per_run(runs: pd.DataFrame, magnification: float | None = None) -> pd.DataFrame:
    """CRA of every (encoder, taxonomy, magnification, section, seed) under IS where both readouts ran.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    magnification : float or None, default None
        Keep one magnification; None keeps all.

    Returns
    -------
    DataFrame
        Columns ``encoder``, ``magnification``, ``taxonomy``, ``unit`` (the section), ``organ``, ``seed``,
        ``f1_nuc_pct``, ``f1_mean_pct`` (macro-F1 in percent) and ``cra_pp`` (their difference, pp).
    """
    values = _select(run_values(runs), protocol="IS", magnification=magnification)
    keys = ["encoder", "magnification", "taxonomy", "unit", "organ", "seed"]
    nuc = _select(values, readout="nuc")[keys + ["macro_f1"]].rename(columns={"macro_f1": "f1_nuc"})
    mean = _select(values, readout="mean")[keys + ["macro_f1"]].rename(columns={"macro_f1": "f1_mean"})
    both = nuc.merge(mean, on=keys, how="inner")
    both["f1_nuc_pct"] = 100.0 * both.pop("f1_nuc")
    both["f1_mean_pct"] = 100.0 * both.pop("f1_mean")
    both["cra_pp"] = both["f1_nuc_pct"] - both["f1_mean_pct"]
    return both.reset_index(drop=True)


def cra_per_section(runs: pd.DataFrame, magnification: float | None = None) -> pd.DataFrame:
    """CRA of every (encoder, taxonomy, magnification, section) under IS: macro-F1(Nuc) - macro-F1(Mean), pp,
    each readout first averaged over its valid seeds. Sections where either readout has no valid run are left
    out.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    magnification : float or None, default None
        Keep one magnification; None keeps all.

    Returns
    -------
    DataFrame
        Columns ``encoder``, ``magnification``, ``taxonomy``, ``section``, ``organ``, ``f1_nuc_pct``,
        ``f1_mean_pct`` (seed-mean macro-F1, percent) and ``cra_pp``.
    """
    means = _select(unit_means(runs), protocol="IS", magnification=magnification)
    keys = ["encoder", "magnification", "taxonomy", "unit", "organ"]
    nuc = _select(means, readout="nuc")[keys + ["macro_f1"]].rename(columns={"macro_f1": "f1_nuc"})
    mean = _select(means, readout="mean")[keys + ["macro_f1"]].rename(columns={"macro_f1": "f1_mean"})
    both = nuc.merge(mean, on=keys, how="inner")
    both["f1_nuc_pct"] = 100.0 * both.pop("f1_nuc")
    both["f1_mean_pct"] = 100.0 * both.pop("f1_mean")
    both["cra_pp"] = both["f1_nuc_pct"] - both["f1_mean_pct"]
    return both.rename(columns={"unit": "section"}).reset_index(drop=True)


def cra_table(runs: pd.DataFrame, magnification: float | None = 20, alpha: float = 0.05,
              balance: str = "organ") -> pd.DataFrame:
    """CRA summary per (encoder, taxonomy, magnification): mean ± SD (ddof 1) across organs of the organs'
    mean section CRA (``balance="organ"``, CellPath-Bench's organ-balanced form) or across sections (``"unit"``),
    each section first averaged over its seeds; Nuc against Mean (``nuc_vs_mean_p``, ``nuc_beats_mean``) and
    ``significant_wins`` of CRA against every other encoder, each a paired Wilcoxon test over the common valid
    (section, seed) runs (``n_win_units``). CRA is defined in docs/methods.md#composite-indices-cri-cra-and-crt.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    magnification : float or None, default 20
        The magnification to summarise (compared with a tolerance); None keeps every magnification.
    alpha : float, default 0.05
        Significance level of the two-sided Wilcoxon tests.
    balance : {"organ", "unit"}, default "organ"
        How unit values are summarised (:data:`BALANCES`, :func:`balanced_summary`).

    Returns
    -------
    DataFrame
        One row per (encoder, taxonomy, magnification), sorted by magnification, taxonomy and ``rank``: columns
        ``encoder``, ``taxonomy``, ``magnification``, ``balance`` (what the SD runs over), ``cra_mean_pp``,
        ``cra_sd_pp``, ``f1_nuc_mean_pct``, ``f1_mean_mean_pct``, ``n_balanced``, ``n_sections``,
        ``nuc_vs_mean_p``, ``nuc_beats_mean``, ``significant_wins``, ``n_opponents``, ``n_win_units``, ``rank``
        (1 = highest CRA) and ``unit`` (the interval's wording); empty without IS runs of both readouts.
    """
    per = cra_per_section(runs, magnification)
    per_run = cra_per_run(runs, magnification)
    rows = []
    for (mag, tax), group in per.groupby(["magnification", "taxonomy"], sort=False):
        runs_here = _select(per_run, magnification=mag, taxonomy=tax)
        wins = run_level_wins(runs_here, "cra_pp", alpha)
        for enc, sub in group.groupby("encoder", sort=False):
            mine = _select(runs_here, encoder=enc)
            nuc_vs_mean = wilcoxon_win(mine["f1_nuc_pct"].to_numpy(), mine["f1_mean_pct"].to_numpy(), alpha=alpha)
            cra, sd, n = balanced_summary(sub["cra_pp"], sub["organ"], "IS", balance)
            f1_nuc, _, _ = balanced_summary(sub["f1_nuc_pct"], sub["organ"], "IS", balance)
            f1_mean, _, _ = balanced_summary(sub["f1_mean_pct"], sub["organ"], "IS", balance)
            rows.append({
                "encoder": enc, "taxonomy": tax, "magnification": mag, "balance": balance_unit("IS", balance),
                "cra_mean_pp": cra, "cra_sd_pp": sd, "f1_nuc_mean_pct": f1_nuc, "f1_mean_mean_pct": f1_mean,
                "n_balanced": n, "n_sections": int(len(sub)), "nuc_vs_mean_p": nuc_vs_mean["p"],
                "nuc_beats_mean": nuc_vs_mean["win"], "significant_wins": int(wins.get(enc, 0)),
                "n_opponents": int(group["encoder"].nunique() - 1), "n_win_units": int(len(mine)),
            })
    out = pd.DataFrame(rows)
    if len(out):
        out["rank"] = out.groupby(["magnification", "taxonomy"])["cra_mean_pp"].rank(
            ascending=False, method="min").astype(int)
        out["unit"] = [f"mean ± SD over {b}s (n_balanced), sections first averaged over seeds; wins over {WIN_UNITS}"
                       for b in out["balance"]]
        out = out.sort_values(["magnification", "taxonomy", "rank"], kind="stable").reset_index(drop=True)
    return out


# --------------------------------------------------------------------------------------------------------
# protocol tables and CRT
# --------------------------------------------------------------------------------------------------------

def protocol_table(runs: pd.DataFrame, protocol: str, magnification: float | None = 20, readout: str = "nuc",
                   alpha: float = 0.05, balance: str = "organ") -> pd.DataFrame:
    """Per (encoder, taxonomy): macro-F1 and macro-AUROC mean ± SD (%) of the protocol's unit values
    (organ-balanced by default, :func:`balanced_summary`), and the significant wins on macro-F1 against every
    other encoder over their common valid (unit, seed) runs.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    protocol : str
        The protocol to summarise (``IS``, ``IOCD``, ``MOCV`` or ``LOOO``).
    magnification : float or None, default 20
        The magnification to summarise (compared with a tolerance); None keeps every magnification.
    readout : str, default "nuc"
        The cell readout to summarise.
    alpha : float, default 0.05
        Significance level of the two-sided Wilcoxon tests.
    balance : {"organ", "unit"}, default "organ"
        How unit values are summarised (:data:`BALANCES`, :func:`balanced_summary`).

    Returns
    -------
    DataFrame
        One row per (encoder, taxonomy): columns ``protocol``, ``encoder``, ``taxonomy``, ``magnification``,
        ``readout``, ``balance``, ``macro_f1_mean_pct``, ``macro_f1_sd_pct``, ``macro_auroc_mean_pct``,
        ``macro_auroc_sd_pct``, ``n_balanced``, ``n_units``, ``significant_wins``, ``n_opponents``, ``n_win_units``
        and ``unit`` (the protocol's unit name); empty when the protocol has no valid run.
    """
    f1 = _select(unit_means(runs, "macro_f1"), protocol=protocol, magnification=magnification, readout=readout)
    au = _select(unit_means(runs, "macro_auroc"), protocol=protocol, magnification=magnification, readout=readout)
    f1_runs = _select(run_values(runs, "macro_f1"), protocol=protocol, magnification=magnification, readout=readout)
    rows = []
    for tax, group in f1.groupby("taxonomy", sort=False):
        runs_here = _select(f1_runs, taxonomy=tax)
        wins = run_level_wins(runs_here, "macro_f1", alpha)
        au_tax = au[au["taxonomy"].astype(str) == str(tax)]
        for enc, sub in group.groupby("encoder", sort=False):
            a = au_tax.loc[au_tax["encoder"].astype(str) == str(enc)]
            f1_mean, f1_sd, n = balanced_summary(100 * sub["macro_f1"], sub["organ"], protocol, balance)
            au_mean, au_sd, _ = balanced_summary(100 * a["macro_auroc"], a["organ"], protocol, balance)
            rows.append({
                "protocol": protocol, "encoder": enc, "taxonomy": tax, "magnification": magnification,
                "readout": readout,
                "balance": balance_unit(protocol, balance), "macro_f1_mean_pct": f1_mean, "macro_f1_sd_pct": f1_sd,
                "macro_auroc_mean_pct": au_mean, "macro_auroc_sd_pct": au_sd, "n_balanced": n,
                "n_units": int(len(sub)), "significant_wins": int(wins.get(enc, 0)),
                "n_opponents": int(group["encoder"].nunique() - 1),
                "n_win_units": int(len(_select(runs_here, encoder=enc))),
            })
    out = pd.DataFrame(rows)
    if len(out):
        out["unit"] = UNIT_NAMES.get(protocol, "unit")
    return out


def crt_table(runs: pd.DataFrame, magnification: float | None = 20, readout: str = "nuc",
              protocols: Sequence[str] = CRT_PROTOCOLS, alpha: float = 0.05) -> pd.DataFrame:
    """CRT per (encoder, taxonomy) as :data:`CRT_DEFINITION` states: ``wins_<P>`` of each transfer protocol,
    ``crt`` their mean over the protocols the config runs, and the secondary ``crt_relative_pp`` with its parts
    ``relative_<P>_pp`` (docs/methods.md#composite-indices-cri-cra-and-crt).

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    magnification : float or None, default 20
        The magnification to summarise (compared with a tolerance); None keeps every magnification.
    readout : str, default "nuc"
        The cell readout whose macro-F1 is compared.
    protocols : sequence of str, default CRT_PROTOCOLS
        The transfer protocols CRT averages over (those without runs are left out of the mean).
    alpha : float, default 0.05
        Significance level of the two-sided Wilcoxon tests.

    Returns
    -------
    DataFrame
        One row per (encoder, taxonomy), sorted by taxonomy and ``rank``: columns ``encoder``, ``taxonomy``,
        ``magnification``, ``readout``, ``n_units``, ``n_opponents``, ``wins_<P>`` and ``relative_<P>_pp`` for each
        protocol run, ``crt``, ``crt_relative_pp``, ``protocols`` (comma-joined), ``definition`` and ``rank``
        (1 = highest CRT, tied encoders share the best rank); empty without runs of those protocols.
    """
    means = _select(unit_means(runs, "macro_f1"), magnification=magnification, readout=readout)
    values = _select(run_values(runs, "macro_f1"), magnification=magnification, readout=readout)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    ran: list[str] = []
    for (tax, protocol), group in means.groupby(["taxonomy", "protocol"], sort=False):
        if str(protocol) not in protocols:
            continue
        ran.append(str(protocol))
        table = 100.0 * _pivot(group, "macro_f1")
        relative = table.sub(table.median(axis=1, skipna=True), axis=0)
        wins = run_level_wins(_select(values, taxonomy=tax, protocol=protocol), "macro_f1", alpha)
        for enc in table.columns:
            row = rows.setdefault((str(enc), str(tax)), {"encoder": enc, "taxonomy": tax,
                                                         "magnification": magnification, "readout": readout,
                                                         "n_units": 0})
            col = relative[enc].dropna()
            row[f"wins_{protocol}"] = int(wins.get(enc, 0))
            row[f"relative_{protocol}_pp"] = float(col.mean()) if col.size else np.nan
            row["n_units"] += int(col.size)
            row["n_opponents"] = int(table.shape[1] - 1)
    out = pd.DataFrame(list(rows.values()))
    if not len(out):
        return out
    present = [p for p in protocols if p in ran]
    out["crt"] = out[[f"wins_{p}" for p in present]].mean(axis=1, skipna=True)
    out["crt_relative_pp"] = out[[f"relative_{p}_pp" for p in present]].mean(axis=1, skipna=True)
    out["protocols"] = ",".join(present)
    out["definition"] = CRT_DEFINITION
    out["rank"] = out.groupby("taxonomy")["crt"].rank(ascending=False, method="min")
    return out.sort_values(["taxonomy", "rank"], kind="stable").reset_index(drop=True)


#: Encoders below which a rank correlation takes too few values to say anything (as the probe chapter's rank
#: transfer says).
RHO_MIN_ENCODERS = 5


def taxonomy_rank_consistency(runs: pd.DataFrame, magnification: float | None = 20, readout: str = "nuc",
                              fine: str = "fine", coarse: str = "coarse") -> pd.DataFrame:
    """Per protocol: Spearman rho (and Kendall tau-b) between the encoders' mean macro-F1 rankings under the
    fine and the coarse taxonomy (means over units). Undefined (NaN, with the reason) below 3 encoders; ``note``
    says over how many encoders, and that below :data:`RHO_MIN_ENCODERS` the value is uninformative.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    magnification : float or None, default 20
        The magnification to summarise (compared with a tolerance); None keeps every magnification.
    readout : str, default "nuc"
        The cell readout compared.
    fine, coarse : str, default "fine", "coarse"
        The ``taxonomy`` values of the two taxonomies.

    Returns
    -------
    DataFrame
        One row per protocol: columns ``protocol``, ``magnification``, ``readout``, ``n_encoders`` (scored under
        both taxonomies), ``spearman_rho``, ``spearman_p``, ``kendall_tau_b`` and ``note``.
    """
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
            row.update(spearman_rho=res["spearman_rho"], spearman_p=res["spearman_p"],
                       kendall_tau_b=res["kendall_tau_b"])
            row["note"] = (f"over {len(common)} encoders: uninformative (rho takes few values; at least "
                           f"{RHO_MIN_ENCODERS} are needed)" if len(common) < RHO_MIN_ENCODERS
                           else f"over {len(common)} encoders")
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------------
# nested subsets, magnification retention, readouts
# --------------------------------------------------------------------------------------------------------

def nested_section_subsets(section_scores: Mapping[str, float] | pd.Series,
                           sizes: Sequence[int] = (10, 15, 20, 25)) -> dict[str, list[str]]:
    """``S<n>``: the n sections with the highest score (ties by section name), nested by construction.

    Parameters
    ----------
    section_scores : mapping of str to float, or Series
        A per-section ranking score (e.g. the morphology-annotation concordance CellPath-Bench ranks sections by);
        higher first.
    sizes : sequence of int, default (10, 15, 20, 25)
        Subset sizes; none may exceed the number of scored sections.

    Returns
    -------
    dict of str to list of str
        ``"S<n>"`` -> the n top sections, in score order, for each size (ascending).

    Raises
    ------
    FmauditInputError
        When a section has no score, or a size exceeds the number of sections.
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
    """Raise unless the subsets, by size, are nested (an explicit config list must be S10 ⊂ S15 ⊂ ...).

    Parameters
    ----------
    subsets : mapping of str to sequence of str
        Subset name -> its sections.

    Raises
    ------
    FmauditInputError
        When a smaller subset holds a section that the next larger one does not.
    """
    items = sorted(subsets.items(), key=lambda kv: len(kv[1]))
    for (small, a), (big, b) in zip(items, items[1:]):
        extra = set(a) - set(b)
        if extra:
            raise FmauditInputError(f"section subsets: {small} is not inside {big} ({sorted(extra)[:3]} are not)")


def subset_table(runs: pd.DataFrame, subsets: Mapping[str, Sequence[str]], magnification: float | None = 20,
                 alpha: float = 0.05) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The CRA summary recomputed on each section subset, and how its encoder ranking agrees with the largest
    subset's (Spearman per taxonomy). Only section-unit results (IS) are re-summarised: MOCV and LOOO pool
    sections inside their units and would need their own runs on a smaller panel.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    subsets : mapping of str to sequence of str
        Subset name (``S10`` ...) -> its sections; must be nested (:func:`check_nested`).
    magnification : float or None, default 20
        The magnification to summarise (compared with a tolerance); None keeps every magnification.
    alpha : float, default 0.05
        Significance level of the two-sided Wilcoxon tests.

    Returns
    -------
    summary : DataFrame
        :func:`cra_table`'s columns for each subset, with ``subset`` and ``subset_size`` first.
    agreement : DataFrame
        One row per (subset, taxonomy): columns ``subset``, ``reference`` (the largest subset), ``taxonomy``,
        ``n_encoders`` and ``spearman_rho_cra`` (NaN below 3 common encoders).

    Raises
    ------
    FmauditInputError
        When the subsets are not nested.
    """
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
    taxonomy averages the encoders' retentions.

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    protocol : str, default "IS"
        The protocol whose units are compared.
    readout : str, default "nuc"
        The cell readout compared.
    reference : float, default 40
        The magnification the others are divided by.

    Returns
    -------
    DataFrame
        One row per (encoder, taxonomy), then the ``panel mean`` rows: columns ``encoder``, ``taxonomy``,
        ``protocol``, ``readout``, ``n_units``, ``f1_<m>x_pct`` for each magnification (highest first) and
        ``retention_<m>x_over_<reference>x_pct`` for each other one (the panel rows carry only the retentions).

    Raises
    ------
    FmauditInputError
        When no run is at the ``reference`` magnification.
    """
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
    same units (pp).

    Parameters
    ----------
    runs : DataFrame
        The cell run table, one row per (protocol, encoder, magnification, taxonomy, readout, unit, seed) probe run:
        columns ``protocol``, ``encoder``, ``magnification``, ``taxonomy``, ``readout``, ``unit``, ``organ``,
        ``seed``, the metric (``macro_f1`` / ``macro_auroc``, in [0, 1]) and optionally ``status`` (only ``ok`` runs
        count).
    protocol : str, default "IS"
        The protocol summarised.
    magnification : float or None, default 20
        The magnification to summarise (compared with a tolerance); None keeps every magnification.

    Returns
    -------
    DataFrame
        One row per (encoder, taxonomy, readout): columns ``encoder``, ``taxonomy``, ``protocol``,
        ``magnification``, ``readout``, ``macro_f1_mean_pct``, ``macro_f1_sd_pct`` (ddof 1), ``n_units`` and
        ``minus_nuc_pp`` (mean over units of the readout minus Nuc; NaN without Nuc).
    """
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
# pretraining scale (the landscape figure's point size)
# --------------------------------------------------------------------------------------------------------

def pretraining_scale(registry: Mapping[str, Mapping[str, Any]], encoders: Sequence[str]) -> pd.Series:
    """WSI-equivalent pretraining count of each encoder from its registry entry (``pretraining_wsis``;
    CellPath-Bench's convention counts 1,000 tiles or image-text pairs as one WSI); NaN where the entry has none.

    Parameters
    ----------
    registry : mapping of str to mapping
        Encoder slug -> its registry entry.
    encoders : sequence of str
        The encoders to look up (one missing from ``registry`` gets NaN).

    Returns
    -------
    Series of float
        Indexed by encoder, named ``pretraining_wsis``.
    """
    values = {}
    for enc in encoders:
        entry = registry.get(enc) or {}
        v = entry.get("pretraining_wsis")
        values[enc] = float(v) if v is not None else np.nan
    return pd.Series(values, dtype=float, name="pretraining_wsis")
