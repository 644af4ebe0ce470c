"""The class-prior-shift chapter of the report (the hema paper's shapes): the mean gain of each label-free method with
its hierarchical-bootstrap interval, the gain per prior with per-target dots (figure), the negative-cell counts
("29/270"), the regret of label-free encoder selection, calibration under adaptation, per-class recall, and the
transfer table with its non-frozen reference row (ResNet-18 from scratch), relative gap and effective
robustness. Formatted from :func:`fmaudit.analyses.prior_shift_summary.summarize_prior_shift`; computes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.exposure import with_exposure
from fmaudit.report.figures import note_figure, pyplot, save_figure
from fmaudit.report.formatting import fmt_ci

PRIOR_SHIFT = "Class-prior shift"
#: Tables of the chapter (name -> category of Snakemake's report), in the order they are written.
TABLES = {
    "prior_shift_summary": PRIOR_SHIFT,
    "prior_shift_gains": PRIOR_SHIFT,
    "prior_shift_scenarios": PRIOR_SHIFT,
    "prior_shift_negative_cells": PRIOR_SHIFT,
    "prior_shift_negative_cells_by_prior": PRIOR_SHIFT,
    "prior_shift_regret": PRIOR_SHIFT,
    "prior_shift_calibration": PRIOR_SHIFT,
    "prior_shift_recall": PRIOR_SHIFT,
    "transfer_reference": "Accuracy under shift",
}
FIGURES = {"prior_shift_gains": PRIOR_SHIFT}
#: Tables that rank encoders: they carry the exposure column.
RANKING = {"prior_shift_negative_cells": "encoder", "transfer_reference": "model"}
NOTE = "no prior-shift runs were planned by this config (config block `prior_shift`)"

__all__ = ["FIGURES", "CHAPTER", "TABLES", "gains_figure"]


def gains_figure(gains: pd.DataFrame, scenarios: pd.DataFrame, path: Path) -> None:
    """The hema paper's figure 3: per (task, source) panel, the mean macro-F1 gain over no adaptation of each method
    (bars, hierarchical-bootstrap interval as whiskers) at each prior, and each target's scenario mean (dots).

    Parameters
    ----------
    gains : DataFrame
        Gain per prior: ``task``, ``source_domain``, ``method`` (``none`` rows are skipped), ``prior``, ``mean_gain``
        (macro-F1 gain over no adaptation) and its ``ci_lo``/``ci_hi``.
    scenarios : DataFrame
        Per-target scenario means: ``task``, ``source_domain``, ``method``, ``prior`` and ``mean_gain``.
    path : Path
        Where the PNG is saved (atomically).
    """
    panels = list(gains[gains["method"] != "none"].groupby(["task", "source_domain"], sort=False))
    fig, axes = pyplot().subplots(len(panels), 1,
                                  figsize=(max(6.0, 1.6 * gains["prior"].nunique() + 2), 3.8 * len(panels)),
                                  squeeze=False)
    for ax, ((task, source), cell) in zip(axes[:, 0], panels):
        priors = list(dict.fromkeys(cell["prior"]))
        methods = list(dict.fromkeys(cell["method"]))
        width = 0.8 / len(methods)
        dots = scenarios[(scenarios["task"] == task) & (scenarios["source_domain"] == source)]
        for j, method in enumerate(methods):
            part = cell[cell["method"] == method].set_index("prior").reindex(priors)
            x = np.arange(len(priors)) + (j - (len(methods) - 1) / 2) * width
            err = np.vstack([part["mean_gain"] - part["ci_lo"], part["ci_hi"] - part["mean_gain"]])
            ax.bar(x, part["mean_gain"], width, label=method, yerr=np.where(np.isfinite(err), err, 0), capsize=2,
                   alpha=0.85)
            sub = dots[dots["method"] == method]
            for i, prior in enumerate(priors):
                vals = sub.loc[sub["prior"] == prior, "mean_gain"].to_numpy()
                ax.scatter(np.full(vals.size, x[i]), vals, s=10, color="black", zorder=3)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(np.arange(len(priors)), priors, rotation=20, ha="right")
        ax.set_ylabel("macro-F1 gain over none")
        ax.set_title(f"{task}: source {source} (bars: mean over targets, whiskers: 95% interval, dots: targets)",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    save_figure(fig, path, tight_layout=True, bbox_inches="tight")


def _panels(table: pd.DataFrame):
    return table.groupby(["task", "source_domain"], sort=False)


def _panel_markdown(task: str, source: str, caption: str, table: pd.DataFrame) -> str:
    return f"#### {task}: source {source}\n\n{caption}\n\n{dataframe_to_markdown(table)}\n"


def _wide(cell: pd.DataFrame, index: str, columns: str, values: str) -> pd.DataFrame:
    """``cell`` pivoted to ``index`` x ``columns``, rows and columns in their order of first appearance."""
    wide = cell.pivot(index=index, columns=columns, values=values)
    return wide.reindex(index=list(dict.fromkeys(cell[index])), columns=list(dict.fromkeys(cell[columns])))


def _summary_markdown(summary: pd.DataFrame) -> str:
    parts = []
    for (task, source), cell in _panels(summary):
        rows = [{"method": r.method + ("" if r.deployable else " (not deployable)"),
                 "mean gain [95% CI]": fmt_ci(r.mean, r.ci_lo, r.ci_hi),
                 "positive scenario means": f"{r.n_positive_scenarios}/{r.n_scenarios}",
                 "negative cells": r.negative_cells, "worst cell": f"{r.worst_gain:+.3f} ({r.worst_cell})",
                 "share of oracle gain": r.share_of_oracle_gain}
                for r in cell.itertuples(index=False) if r.method != "none"]
        first = cell.iloc[0]
        parts.append(_panel_markdown(
            task, source, f"Macro-F1 gain over no adaptation, mean over every encoder, source seed, target, prior and "
            f"draw; 95% percentile interval of a hierarchical bootstrap (unit: {first['unit']}; "
            f"B={int(first['n_boot'])}; n = {int(first['n_encoders'])} encoders, {int(first['n_seeds'])} seeds, "
            f"{int(first['n_draws'])} draws). A scenario is a target x prior, a cell an encoder x scenario.",
            pd.DataFrame(rows)))
    return "\n".join(parts)


def _gains_markdown(gains: pd.DataFrame) -> str:
    parts = []
    for (task, source), cell in _panels(gains):
        cell = cell[cell["method"] != "none"].assign(
            value=[f"{fmt_ci(r.mean_gain, r.ci_lo, r.ci_hi)} ({r.n_positive_targets}/{r.n_targets})"
                   for r in cell[cell["method"] != "none"].itertuples(index=False)])
        parts.append(_panel_markdown(task, source, "Mean gain per prior [95% hierarchical-bootstrap interval] "
                                     "(targets with a positive scenario mean / targets).",
                                     _wide(cell, "method", "prior", "value").reset_index()))
    return "\n".join(parts)


def _cells_markdown(cells: pd.DataFrame) -> str:
    parts = []
    for (task, source), cell in _panels(cells):
        cell = cell[cell["method"] != "none"]
        wide = _wide(cell, "encoder", "method", "negative_cells")
        if "exposure" in cell.columns:
            wide.insert(0, "exposure", cell.drop_duplicates("encoder").set_index("encoder")["exposure"])
        parts.append(_panel_markdown(task, source, "Negative cells (target x prior with a negative mean gain) / "
                                     "cells, per encoder and method.", wide.reset_index()))
    return "\n".join(parts)


def _regret_markdown(regret: pd.DataFrame, headline: Mapping[str, str]) -> str:
    parts = []
    for (task, source), cell in _panels(regret):
        rule = headline.get(task, "")
        keep = cell[(cell["method"] == "none") | (cell["rule"] == rule)].assign(
            value=lambda d: [f"{m:.3f} (max {x:.3f})" for m, x in zip(d["mean_regret"], d["max_regret"])])
        wide = keep.pivot_table(index=["rule", "method"], columns="prior", values="value", aggfunc="first", sort=False)
        wide = wide.reindex(columns=list(dict.fromkeys(cell["prior"])))
        n_enc = int(cell["n_encoders"].iloc[0])
        parts.append(_panel_markdown(
            task, source, f"Mean selection regret (macro-F1 of the oracle's encoder minus that of the encoder the "
            f"rule picks, unit: {cell['unit'].iloc[0]}, n = {int(cell['n_problems'].iloc[0])} problems per cell, "
            f"{n_enc} candidate encoders); every rule on the unadapted pipeline, the headline rule `{rule}` on every "
            f"method (all rows in the CSV).", wide.reset_index()))
    return "\n".join(parts)


def _calibration_markdown(cal: pd.DataFrame) -> str:
    parts = []
    for (task, source), cell in _panels(cal):
        cell = cell.assign(value=[f"{a:.3f} / {b:.3f}" for a, b in zip(cell["ece_raw"], cell["ece_source_t"])])
        conv = cell["ece_convention"].iloc[0] if "ece_convention" in cell else "top-label ECE"
        parts.append(_panel_markdown(task, source, f"ECE without / with the source temperature, mean over encoders, "
                                     f"seeds, targets and draws ({conv}).",
                                     _wide(cell, "method", "prior", "value").reset_index()))
    return "\n".join(parts)


def _recall_markdown(recall: pd.DataFrame) -> str:
    parts = []
    for (task, source), cell in _panels(recall):
        wide = cell.pivot_table(index=["method", "prior"], columns="class", values="recall", sort=False)
        wide = wide.reindex(columns=list(dict.fromkeys(cell["class"])))
        parts.append(_panel_markdown(task, source, "Per-class recall, mean over the draws that hold the class.",
                                     wide.reset_index()))
    return "\n".join(parts)


def _reference_markdown(ref: pd.DataFrame) -> str:
    if ref is None or len(ref) == 0:
        return "No transfer rows.\n"
    cols = [c for c in ("task", "source_domain", "target_domain", "model", "exposure", "frozen", "n_seeds",
                        "in_domain_macro_f1", "macro_f1", "rank_on_target", "relative_gap", "effective_robustness")
            if c in ref.columns]
    has_reference = "frozen" in ref.columns and (~ref["frozen"].astype(bool)).any()
    reference = ("with the ResNet-18 trained from scratch on the same source pool as a non-frozen reference row (not "
                 "ranked; its effective robustness is read off the frozen encoders' logit-linear fit)" if has_reference
                 else "frozen encoders only: no scratch reference was trained in this study "
                      "(prior_shift.scratch_reference.enabled)")
    shown = ref[cols].astype(object).where(ref[cols].notna(), "n/a (not ranked: the reference)")
    return (f"Unadapted source probe on the whole target pool (means over source seeds; no intervals), {reference}."
            f"\n\n{dataframe_to_markdown(shown)}\n")


def _label_assumed_priors(df: pd.DataFrame, assumed: Mapping[str, Any]) -> pd.DataFrame:
    """``df`` with each assumed prior shown as ``<prior> (shares assumed)`` (a copy; the CSVs keep the names and
    say it in ``prior_shares``)."""
    if not len(df) or "prior" not in df.columns or "task" not in df.columns or not assumed:
        return df
    out = df.copy()
    out["prior"] = [f"{p} (shares assumed)" if str(p) in (assumed.get(str(t)) or []) else p
                    for t, p in zip(out["task"], out["prior"])]
    return out


def _write_empty(writer: ReportWriter) -> list[str]:
    for name in TABLES:
        writer.table(name, pd.DataFrame({"note": [NOTE]}))
    for name in FIGURES:
        writer.figure(name, lambda path: note_figure("no prior-shift runs were planned", path))
    return []


def write_prior_shift_chapter(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    """Write the chapter's tables and figure; return its lines of index.md.

    Parameters
    ----------
    results : mapping or None
        The summary of :func:`fmaudit.analyses.prior_shift_summary.summarize_prior_shift`: one DataFrame per name of
        :data:`TABLES`, with ``exposure`` (the exposure audit), ``assumed_priors`` (task -> priors whose shares are
        assumptions) and ``headline_rules``. ``None``: no prior-shift run was planned; every output says so.
    writer : ReportWriter
        Where the tables and the ``prior_shift_gains`` figure go.

    Returns
    -------
    list of str
        The chapter's heading, conventions and one section per table; empty when nothing was planned.
    """
    if results is None:
        return _write_empty(writer)
    audit = results.get("exposure")
    tables = {name: results[name] for name in TABLES}
    if len(tables["transfer_reference"]):
        ref = with_exposure(tables["transfer_reference"], audit, column="model")
        if "exposure" in ref.columns:
            ref.loc[~ref["frozen"].astype(bool), "exposure"] = "no pretraining (trained on the source)"
        tables["transfer_reference"] = ref
    else:
        tables["transfer_reference"] = pd.DataFrame({"note": ["no transfer rows"]})
    tables["prior_shift_negative_cells"] = with_exposure(tables["prior_shift_negative_cells"], audit)
    for name, df in tables.items():
        writer.table(name, df)
    # priors whose shares are assumptions are named so wherever a prior is shown
    assumed = results.get("assumed_priors") or {}
    tables = {name: _label_assumed_priors(df, assumed) for name, df in tables.items()}
    writer.figure("prior_shift_gains", lambda path: gains_figure(tables["prior_shift_gains"],
                                                                 tables["prior_shift_scenarios"], path))
    named = sorted({p for ps in assumed.values() for p in ps})
    return [
        "## Class-prior shift and label-free adaptation", "",
        "Each target resampled to each class prior (fixed size, largest-remainder counts, seeded draws); every "
        "label-free method adapts the source probe on each draw, scored against no adaptation on the same draw. "
        "`oracle_restandardization` reads the target labels and is a reference, not a method; `cbr_mean_only` and "
        "`cbr_then_bbse` are ablations of CBR (its class-balanced mean with the global std; its probabilities "
        "reweighted by BBSE)." + (f" The shares of {', '.join(named)} are assumptions (config "
                                  "`prior_shift.assumed_priors`), marked `(shares assumed)`." if named else ""), "",
        "### Mean gain by method", "", _summary_markdown(tables["prior_shift_summary"]),
        "### Gain per prior", "", _gains_markdown(tables["prior_shift_gains"]),
        "![gain per prior](figures/prior_shift_gains.png)", "",
        "### Negative cells per encoder", "", _cells_markdown(tables["prior_shift_negative_cells"]),
        "### Label-free encoder selection", "", _regret_markdown(tables["prior_shift_regret"],
                                                                 results.get("headline_rules", {})),
        "### Calibration under adaptation", "", _calibration_markdown(tables["prior_shift_calibration"]),
        "### Per-class recall", "", _recall_markdown(tables["prior_shift_recall"]),
        "### Transfer with the non-frozen reference", "", _reference_markdown(tables["transfer_reference"]),
    ]


CHAPTER = Chapter("prior_shift", TABLES, FIGURES, write_prior_shift_chapter,
                  reads=("prior_shift_runs", "prior_shift_pool", "scratch_reference"),
                  settings=("bootstrap", "prior_shift", "exposure"))
