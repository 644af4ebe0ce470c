"""The probe suite's report section: leaderboards, the calibration ladder, transfer summaries and their figures,
formatted from :func:`fmaudit.analyses.probe_summary.summarize_probe_suite` (this module computes nothing)."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report import figures
from fmaudit.report.formatting import ece_columns, fmt_ci, settings_text
from fmaudit.report.section import ReportWriter, Section

ACCURACY, CALIBRATION, COMPOSITE, RANKS = "Accuracy under shift", "Calibration", "Composite reliability", "Rank transfer"
#: Tables of the section (name -> category of Snakemake's report), in the order they are written.
TABLES = {
    "leaderboard": ACCURACY,
    "calibration": CALIBRATION,
    "shift_summary": ACCURACY,
    "cross_domain_leaderboard": ACCURACY,
    "paired_differences": ACCURACY,
    "cri": COMPOSITE,
    "rank_transfer": RANKS,
    "decoupling_units": RANKS,
    "decoupling": RANKS,
    "ece_slopes": CALIBRATION,
    "ece_slope_by_auroc_bin": CALIBRATION,
}
FIGURES = {"reliability": CALIBRATION, "rank_transfer": RANKS, "ece_vs_fraction": CALIBRATION}
NOTE = "no probe runs were planned by this config"

__all__ = ["FIGURES", "SECTION", "TABLES", "calibration_markdown", "leaderboard_markdown"]


def leaderboard_markdown(board: pd.DataFrame) -> str:
    """One table per (task, head, source): encoders × (in-domain, each target) macro-F1 [95% CI]."""
    parts = []
    for (task, head, frac, source), cell in board.groupby(["task", "head", "fraction", "source_domain"], sort=True):
        targets = [source] + sorted(t for t in cell["target_domain"].unique() if t != source)
        wide = []
        for enc, er in cell.groupby("encoder"):
            row = {"encoder": enc}
            for t in targets:
                r = er[er["target_domain"] == t]
                label = f"{t} (in-domain)" if t == source else t
                row[label] = fmt_ci(*r[["macro_f1", "macro_f1_ci_lo", "macro_f1_ci_hi"]].iloc[0]) if len(r) else "n/a"
                if t == source and len(r):
                    row["_sort"] = float(r["macro_f1"].iloc[0])
            wide.append(row)
        table = pd.DataFrame(wide).sort_values("_sort", ascending=False).drop(columns="_sort")
        parts.append(f"### {task}: source {source}, {head} probe, label fraction {frac:g}\n\n"
                     f"Macro-F1, mean over seeds [95% CI].\n\n{dataframe_to_markdown(table)}\n")
    return "\n".join(parts)


def calibration_markdown(cal: pd.DataFrame) -> str:
    """One table per (task, head, fraction): top-label ECE by temperature stage (columns) per encoder and pair."""
    def stage_name(r) -> str:
        return f"kshot_ts (K={int(r.k)})" if r.stage == "kshot_ts" else r.stage

    parts = []
    for (task, head, frac), cell in cal.groupby(["task", "head", "fraction"]):
        ece_col = [c for c in ece_columns(cell) if cell[c].notna().any()][0]
        bins = ece_col.split("_")[2]
        cell = cell.assign(stage_label=[stage_name(r) for r in cell.itertuples()])
        wide = cell.pivot_table(index=["encoder", "source_domain", "target_domain"], columns="stage_label",
                                values=ece_col, sort=False).reset_index()
        order = ["encoder", "source_domain", "target_domain"] + [c for c in ["raw", "source_ts", "oracle_ts"] if c in wide]
        order += sorted((c for c in wide.columns if str(c).startswith("kshot")),
                        key=lambda c: int(str(c).split("K=")[1].rstrip(")")))
        parts.append(f"### {task}: {head} probe, label fraction {frac:g}\n\nTop-label ECE ({bins} bins, (lo,hi]) "
                     "by temperature stage; oracle_ts is fitted on the evaluated target (not deployable).\n\n"
                     f"{dataframe_to_markdown(wide[order])}\n")
    return "\n".join(parts)


def _write_empty(writer: ReportWriter) -> list[str]:
    for name in TABLES:
        writer.table(name, pd.DataFrame({"note": [NOTE]}))
    for name in FIGURES:
        writer.figure(name, lambda path: figures.note_figure("no probe runs were planned", path))
    return ["No probe runs were planned by this config.", ""]


def write_probe_section(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    """Write the section's tables and figures; return its lines of index.md."""
    if results is None:
        return _write_empty(writer)
    for name in TABLES:
        writer.table(name, results[name])
    groups = results["settings"]
    curves = results["ece_by_fraction"]
    # tasks of settings groups with other bin counts have their ECE in another column: one line per encoder
    curves = curves.assign(target_ece=curves[ece_columns(curves)].bfill(axis=1).iloc[:, 0])
    writer.figure("reliability", lambda path: figures.reliability_figure(results["reliability_curves"], path))
    writer.figure("rank_transfer", lambda path: figures.rank_transfer_heatmap(results["rank_transfer"], path))
    writer.figure("ece_vs_fraction", lambda path: figures.ece_vs_fraction_figure(
        curves, "target_ece", f"target ECE ({settings_text(groups, '{ece_bins} bins')})", path))
    t = results
    return [
        "Conventions: macro-F1 with `labels=range(K)`; top-label ECE with "
        f"{settings_text(groups, '{ece_bins} equal-width bins')} closed as (lo, hi]; "
        "Brier summed over classes (range [0, 2]); intervals are 95% percentile cluster-bootstrap intervals over "
        f"patients/slides ({settings_text(groups, 'B={n_boot}')}) of the mean over seeds.", "",
        "## In-domain vs off-domain", "", dataframe_to_markdown(t["shift_summary"]), "",
        "## Leaderboards", "", leaderboard_markdown(t["leaderboard"]), "",
        "## Calibration ladder", "", calibration_markdown(t["calibration"]), "",
        "## Paired differences to the in-domain best encoder", "",
        "Macro-F1 difference (encoder − reference), paired cluster bootstrap over patients/slides "
        f"({settings_text(groups, 'B={paired_n_boot}')}).", "",
        dataframe_to_markdown(t["paired_differences"].drop(columns=["resampling"], errors="ignore")), "",
        "## Cross-domain leaderboard (sorted by the most shifted target)", "",
        dataframe_to_markdown(t["cross_domain_leaderboard"]), "",
        "## CRI per label fraction", "",
        "CRI = AUROC_id × (1 − clip(ECE after source TS)) × OOD_Stability (PRISM, as corrected).", "",
        dataframe_to_markdown(t["cri"].drop(columns=["cri_convention"], errors="ignore")), "",
        "## Rank transfer", "", dataframe_to_markdown(t["rank_transfer"]), "",
        "## AUROC-rank vs ECE-rank decoupling (Fisher-z pooled per fraction)", "",
        dataframe_to_markdown(t["decoupling"]), "",
        "## Target ECE against label fraction, by transfer AUROC", "",
        dataframe_to_markdown(t["ece_slope_by_auroc_bin"]), "",
        "## Figures", "", "![reliability](figures/reliability.png)", "",
        "![rank transfer](figures/rank_transfer.png)", "", "![ECE vs fraction](figures/ece_vs_fraction.png)", "",
    ]


SECTION = Section("probe", TABLES, FIGURES, write_probe_section)
