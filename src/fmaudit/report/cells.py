"""The cell branch's report chapter (CellPath-Bench): the organ-balanced decodability and CRA tables with
their unit-level forms, CRT, the win matrix, fine-vs-coarse rank consistency, the nested section subsets, the
CRA-CRT landscape, magnification retention, readouts side by side and the QC overlay thumbnails, formatted from
:func:`fmaudit.analyses.cell_summary.summarize_cell_runs` (this module computes nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report import figures
from fmaudit.report.chapter import Chapter, ReportWriter

CELLS = "Cells (CellPath-Bench)"
TABLES = {
    "cell_decodability": CELLS,
    "cell_decodability_units": CELLS,
    "cell_cra": CELLS,
    "cell_cra_sections": CELLS,
    "cell_crt": CELLS,
    "cell_win_matrix": CELLS,
    "cell_taxonomy_consistency": CELLS,
    "cell_subsets": CELLS,
    "cell_subset_ranks": CELLS,
    "cell_magnification_retention": CELLS,
    "cell_readouts": CELLS,
    "cell_run_status": CELLS,
}
FIGURES = {"cell_cra_crt_landscape": CELLS, "cell_qc_overlays": CELLS}
NOTE = "no cell-level runs were planned by this config"

__all__ = ["CHAPTER", "FIGURES", "TABLES", "cra_crt_landscape", "qc_montage"]


def qc_montage(qc: Mapping[str, str], path: Path, columns: int = 4) -> None:
    """Thumbnails of every section's QC overlay (cell centres on H&E crops), one panel per section.

    Parameters
    ----------
    qc : mapping of str to str
        Tissue section name -> path of its QC overlay PNG (cell centres drawn on an H&E crop), in panel order.
    path : Path
        Where the montage PNG is saved (atomically).
    columns : int, default 4
        Panels per row.
    """
    plt = figures.pyplot()
    sections = list(qc)
    rows = max(1, -(-len(sections) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.0 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, section in zip(axes.ravel(), sections):
        ax.imshow(plt.imread(qc[section]))
        ax.set_title(section, fontsize=8)
    fig.tight_layout()
    figures.save_figure(fig, path)


def cra_crt_landscape(cra: pd.DataFrame, crt: pd.DataFrame, scale: Mapping[str, float] | pd.Series, path: Path,
                      taxonomy: str = "fine", magnification: float | None = 20,
                      draw_unscaled: bool = False) -> dict[str, Any]:
    """Scatter of encoders: x = organ-balanced mean CRA (pp, IS), y = CRT (mean significant-win count over the
    transfer protocols), point area growing with log10 of the WSI-equivalent pretraining count. Encoders
    without a pretraining scale are omitted and listed under the plot (CellPath-Bench omits them), or, with
    ``draw_unscaled``, drawn as hollow points of the smallest size (and listed as such); returns
    ``{"plotted": [...], "omitted_no_scale": [...], "omitted_no_value": [...], "unscaled_hollow": [...]}``.

    Parameters
    ----------
    cra : DataFrame
        The organ-balanced CRA table: ``encoder``, ``taxonomy``, ``magnification`` and ``cra_mean_pp`` (CRA in
        percentage points, intra-section).
    crt : DataFrame
        The CRT table: ``encoder``, ``taxonomy`` and ``crt`` (mean significant-win count).
    scale : mapping of str to float or Series
        Encoder -> WSI-equivalent pretraining count from the registry; missing, non-finite or non-positive: no scale.
    path : Path
        Where the PNG is saved (atomically).
    taxonomy : str, default "fine"
        The cell taxonomy whose rows are drawn.
    magnification : float or None, default 20
        The magnification (x) of the CRA rows drawn; ``None``: every magnification's rows.
    draw_unscaled : bool, default False
        Draw encoders without a pretraining scale as hollow points instead of omitting them.

    Returns
    -------
    dict of str to list of str
        Encoder names under ``plotted``, ``omitted_no_scale`` (empty with ``draw_unscaled``), ``omitted_no_value``
        (no finite CRA or CRT) and ``unscaled_hollow``.
    """
    plt = figures.pyplot()
    scale = pd.Series(scale, dtype=float)
    at = cra[cra["taxonomy"].astype(str) == taxonomy]
    if magnification is not None:
        at = at[np.isclose(at["magnification"].astype(float), float(magnification))]
    a = at.set_index("encoder")["cra_mean_pp"]
    b = crt[crt["taxonomy"].astype(str) == taxonomy].set_index("encoder")["crt"]
    encoders = list(dict.fromkeys(list(a.index) + list(b.index)))
    no_value = [e for e in encoders if not (e in a.index and e in b.index and np.isfinite(a[e]) and np.isfinite(b[e]))]
    no_scale = [e for e in encoders
                if e not in no_value and not (e in scale.index and np.isfinite(scale[e]) and scale[e] > 0)]
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
    ax.set_xlabel(f"CRA (pp, IS, {magnification:g}x, organ-balanced)" if magnification else "CRA (pp, IS)")
    ax.set_ylabel("CRT (mean significant wins over IOCD, MOCV, LOOO)")
    ax.set_title(f"CRA-CRT landscape ({taxonomy} taxonomy); area ~ log10 WSI-equivalent pretraining", fontsize=9)
    notes = []
    if no_scale:
        notes.append(("hollow" if draw_unscaled else "omitted") + ", no pretraining scale in the registry: "
                     + ", ".join(no_scale))
    if no_value:
        notes.append("omitted, no CRA or CRT: " + ", ".join(no_value))
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=6, va="bottom", wrap=True)
        fig.subplots_adjust(bottom=0.12 + 0.03 * len(notes))
    figures.save_figure(fig, Path(path))
    return {"plotted": plotted, "omitted_no_scale": [] if draw_unscaled else no_scale, "omitted_no_value": no_value,
            "unscaled_hollow": hollow}


def _landscape(results: Mapping[str, Any], path: Path, taxonomy: str) -> None:
    main = results["main_magnification"]
    crt = results["crt"]
    crt = crt[crt["magnification"].astype(float) == float(main)] if len(crt) else crt
    if not len(results["cra"]) or not len(crt):
        figures.note_figure(NOTE if not results["n_runs"] else "no CRA or CRT to plot", path)
        return
    cra_crt_landscape(results["cra"], crt, results["scale"], path, taxonomy=taxonomy, magnification=main,
                      draw_unscaled=True)


def _or_note(df: pd.DataFrame, note: str) -> pd.DataFrame:
    return df if len(df) else pd.DataFrame({"note": [note]})


def _mean_sd(mean: Any, sd: Any) -> str:
    mean, sd = float(mean), float(sd)
    if not np.isfinite(mean):
        return "n/a"
    return f"{mean:.2f} ± {sd:.2f}" if np.isfinite(sd) else f"{mean:.2f}"


def _decodability_markdown(table: pd.DataFrame) -> str:
    rows = []
    for r in table.to_dict("records"):
        rows.append({"protocol": r["protocol"], "taxonomy": r["taxonomy"], "magnification": f"{r['magnification']:g}",
                     "readout": r["readout"], "encoder": r["encoder"],
                     "macro-F1 (%)": _mean_sd(r["macro_f1_mean_pct"], r["macro_f1_sd_pct"]),
                     "macro-AUROC (%)": _mean_sd(r["macro_auroc_mean_pct"], r["macro_auroc_sd_pct"]),
                     "over": f"{r['n_balanced']} {r['balance']}s",
                     "wins": f"{r['significant_wins']}/{r['n_opponents']}"})
    return dataframe_to_markdown(pd.DataFrame(rows))


def _cra_markdown(cra: pd.DataFrame, alpha: float = 0.05) -> str:
    """The CRA table; where the (section, seed) runs are too few for a two-sided Wilcoxon test to reach ``alpha``
    at all (``wilcoxon_smallest_p``), Nuc-beats-Mean and the wins say so instead of False and 0."""
    rows, undecidable = [], {}
    for r in cra.to_dict("records"):
        smallest = r.get("wilcoxon_smallest_p")
        decided = smallest is None or pd.isna(smallest) or smallest < alpha
        n = int(r.get("n_win_units", r["n_sections"]))
        if not decided:
            undecidable[n] = smallest
        rows.append({"encoder": r["encoder"], "taxonomy": r["taxonomy"], "magnification": f"{r['magnification']:g}",
                     "F1 Nuc (%)": f"{r['f1_nuc_mean_pct']:.2f}", "F1 Mean (%)": f"{r['f1_mean_mean_pct']:.2f}",
                     "CRA (pp)": _mean_sd(r["cra_mean_pp"], r["cra_sd_pp"]),
                     "over": f"{r['n_balanced']} {r['balance']}s",
                     "Nuc beats Mean": r["nuc_beats_mean"] if decided else f"n/a ({n} runs: p >= {smallest:.3g})",
                     "wins": f"{r['significant_wins']}/{r['n_opponents']}" if decided else "n/a (too few runs)"})
    note = ""
    if undecidable:
        note = (f"With {', '.join(map(str, sorted(undecidable)))} (section, seed) runs a two-sided Wilcoxon test "
                "cannot "
                f"reach p < {alpha:g} (the smallest possible p is {max(undecidable.values()):.3g}): those rows say "
                "`n/a`, undecided rather than False, and a positive CRA there is not evidence that Nuc beats Mean.\n\n")
    return note + dataframe_to_markdown(pd.DataFrame(rows))


def write_cells_chapter(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    """Write the cell chapter's tables and figures; return its lines of ``index.md``.

    Parameters
    ----------
    results : mapping or None
        The summary of :func:`fmaudit.analyses.cell_summary.summarize_cell_runs`: the tables ``decodability``,
        ``decodability_units``, ``cra``, ``cra_sections``, ``crt``, ``win_matrix``, ``taxonomy_consistency``,
        ``subsets``, ``subset_ranks``, ``retention``, ``readouts`` and ``status``, and ``taxonomies``, ``qc``
        (section -> overlay PNG), ``scale``, ``main_magnification``, ``crt_definition``, ``n_ok`` and ``n_runs``.
        ``None``: the config planned no cell run; every table and figure then says so.
    writer : ReportWriter
        Where the tables ``cell_*`` and the figures ``cell_cra_crt_landscape`` and ``cell_qc_overlays`` go.

    Returns
    -------
    list of str
        Markdown lines: the chapter's heading, its conventions, and the decodability, CRA, CRT, taxonomy and subset
        sections that have rows.
    """
    lines = ["## Cells (CellPath-Bench)", ""]
    if results is None:
        for name in TABLES:
            writer.table(name, pd.DataFrame({"note": [NOTE]}))
        for name in FIGURES:
            writer.figure(name, lambda p: figures.note_figure(NOTE, p))
        return lines + [NOTE + ".", ""]
    empty = "no valid cell run"
    writer.table("cell_decodability", _or_note(results["decodability"], empty))
    writer.table("cell_decodability_units", _or_note(results["decodability_units"], empty))
    cra = _or_note(results["cra"], empty)
    writer.table("cell_cra", cra)
    writer.table("cell_cra_sections", _or_note(results["cra_sections"], empty))
    writer.table("cell_crt", _or_note(results["crt"], empty))
    writer.table("cell_win_matrix", _or_note(results["win_matrix"], "fewer than two encoders: no pairwise wins"))
    writer.table("cell_taxonomy_consistency",
                 _or_note(results["taxonomy_consistency"], "fewer than two taxonomies: no fine-vs-coarse ranking"))
    writer.table("cell_subsets", results["subsets"])
    writer.table("cell_subset_ranks", results["subset_ranks"])
    writer.table("cell_magnification_retention", results["retention"])
    writer.table("cell_readouts", _or_note(results["readouts"], empty))
    writer.table("cell_run_status", _or_note(results["status"], empty))
    taxonomies = results["taxonomies"]
    taxonomy = "fine" if "fine" in taxonomies or not taxonomies else taxonomies[0]
    writer.figure("cell_cra_crt_landscape", lambda p: _landscape(results, p, taxonomy))
    if results["qc"]:
        writer.figure("cell_qc_overlays", lambda p: qc_montage(results["qc"], p))
    else:
        writer.figure("cell_qc_overlays", lambda p: figures.note_figure("no sections", p))
    lines += [f"{results['n_ok']} of {results['n_runs']} cell runs have metrics (see `cell_run_status`). Summaries "
              "are organ-balanced (the units of an organ averaged first, mean ± SD across organs; MOCV across its "
              "folds), each unit first averaged over its seeds; the unit-level forms are in "
              "`cell_decodability_units` and `cell_cra_sections`. Significant wins: paired two-sided Wilcoxon tests "
              "against every other encoder over their common valid (unit, seed) runs, p < 0.05 and a positive "
              "median difference.", ""]
    if len(results["decodability"]):
        lines += ["### Decodability per protocol (organ-balanced)", "",
                  _decodability_markdown(results["decodability"]), ""]
    if "cra_mean_pp" in cra.columns:
        lines += ["### CRA: Nuc minus Mean macro-F1 (pp), intra-section (IS), organ-balanced", "",
                  _cra_markdown(cra), ""]
    lines += ["### CRT", "", results["crt_definition"], ""]
    if len(results["crt"]):
        cols = [c for c in results["crt"].columns
                if c.startswith(("wins_", "crt")) or c in ("encoder", "taxonomy", "magnification", "n_opponents")]
        lines += [dataframe_to_markdown(results["crt"][cols]), ""]
    if len(results["taxonomy_consistency"]):
        cols = [c for c in ("protocol", "magnification", "n_encoders", "spearman_rho", "kendall_tau_b", "note")
                if c in results["taxonomy_consistency"].columns]
        lines += ["### Fine vs coarse taxonomy: rank consistency", "",
                  "Spearman rho between the encoders' rankings under the two taxonomies (Nuc macro-F1), per protocol.",
                  "", dataframe_to_markdown(results["taxonomy_consistency"][cols]), ""]
    if "note" not in results["subsets"].columns:
        lines += ["### Nested section subsets", "", "The organ-balanced CRA re-summarised on each nested subset of the "
                  "panel (`cell_subsets`); `cell_subset_ranks`: Spearman rho of each subset's CRA ranking with the "
                  "largest subset's.", "", dataframe_to_markdown(results["subset_ranks"]), ""]
    else:
        lines += ["### Nested section subsets", "", f"Not computed: {results['subsets']['note'].iloc[0]}.", ""]
    return lines


CHAPTER = Chapter("cells", TABLES, FIGURES, write_cells_chapter,
                  reads=("cell_runs", "cell_qc", "cell_manifests", "cell_subset_scores"), settings=("cells",))
