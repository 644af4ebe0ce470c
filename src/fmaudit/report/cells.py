"""The cell branch's report chapter (CellPath-Bench, seed 002): CRA and CRT tables, the win matrix, the CRA-CRT
landscape, magnification retention, readouts side by side, and the QC overlay thumbnails, formatted from
:func:`fmaudit.analyses.cell_summary.summarize_cell_runs` (this module computes nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report import figures
from fmaudit.report.chapter import ReportWriter, Chapter

CELLS = "Cells (CellPath-Bench)"
TABLES = {
    "cell_cra": CELLS,
    "cell_crt": CELLS,
    "cell_win_matrix": CELLS,
    "cell_magnification_retention": CELLS,
    "cell_readouts": CELLS,
    "cell_run_status": CELLS,
}
FIGURES = {"cell_cra_crt_landscape": CELLS, "cell_qc_overlays": CELLS}
NOTE = "no cell-level runs were planned by this config"

__all__ = ["FIGURES", "CHAPTER", "TABLES", "qc_montage", "wilcoxon_readable"]


def qc_montage(qc: Mapping[str, str], path: Path, columns: int = 4) -> None:
    """Thumbnails of every section's QC overlay (cell centres on H&E crops), one panel per section."""
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


def _landscape(results: Mapping[str, Any], path: Path, taxonomy: str) -> None:
    from fmaudit.cells.metrics import cra_crt_landscape

    main = results["main_magnification"]
    crt = results["crt"]
    crt = crt[crt["magnification"].astype(float) == float(main)] if len(crt) else crt
    if not len(results["cra"]) or not len(crt):
        figures.note_figure(NOTE if not results["n_runs"] else "no CRA or CRT to plot", path)
        return
    # written atomically by cra_crt_landscape itself
    cra_crt_landscape(results["cra"], crt, results["scale"], path, taxonomy=taxonomy, magnification=main,
                      draw_unscaled=True)


def wilcoxon_readable(cra: pd.DataFrame, smallest_p: pd.Series | None,
                      alpha: float = 0.05) -> tuple[pd.DataFrame, list[tuple[int, float]]]:
    """The CRA table for reading: where the sections are too few for a two-sided Wilcoxon test to reach ``alpha``
    at all (``smallest_p``: the smallest p it can give, per row), ``nuc_beats_mean`` and ``significant_wins`` say
    so instead of False and 0; with the (section count, smallest p) pairs that are undecidable."""
    out = cra.astype({"nuc_beats_mean": object, "significant_wins": object}).copy()
    if smallest_p is None:
        return out, []
    undecidable = {}
    for i in out.index:
        p = float(smallest_p.loc[i])
        if p >= alpha:
            n = int(out.loc[i, "n_sections"])
            undecidable[n] = p
            out.loc[i, "nuc_beats_mean"] = f"n/a ({n} sections: p >= {p:.3g})"
            out.loc[i, "significant_wins"] = "n/a (too few sections)"
    return out, sorted(undecidable.items())


def _or_note(df: pd.DataFrame, note: str) -> pd.DataFrame:
    return df if len(df) else pd.DataFrame({"note": [note]})


def write_cells_chapter(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    lines = ["## Cells (CellPath-Bench)", ""]
    if results is None:
        for name in TABLES:
            writer.table(name, pd.DataFrame({"note": [NOTE]}))
        for name in FIGURES:
            writer.figure(name, lambda p: figures.note_figure(NOTE, p))
        return lines + [NOTE + ".", ""]
    empty = "no valid cell run"
    cra = _or_note(results["cra"], empty)
    writer.table("cell_cra", cra)
    writer.table("cell_crt", _or_note(results["crt"], empty))
    writer.table("cell_win_matrix", _or_note(results["win_matrix"], "fewer than two encoders: no pairwise wins"))
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
    lines += [f"{results['n_ok']} of {results['n_runs']} cell runs have metrics (see `cell_run_status`).", ""]
    if "cra_mean_pp" in cra.columns:
        show = cra[["encoder", "taxonomy", "magnification", "f1_nuc_mean_pct", "f1_mean_mean_pct", "cra_mean_pp",
                    "cra_sd_pp", "n_sections", "nuc_beats_mean", "significant_wins"]]
        smallest = cra["wilcoxon_smallest_p"] if "wilcoxon_smallest_p" in cra.columns else None
        show, undecidable = wilcoxon_readable(show, smallest)
        note = (f" With {', '.join(str(n) for n, _ in undecidable)} sections a two-sided Wilcoxon test cannot reach "
                f"p < 0.05 (the smallest possible p is {max(p for _, p in undecidable):.3g}): those rows say `n/a`, "
                "undecided rather than False, and a positive `cra_mean_pp` there is not evidence that Nuc beats "
                "Mean." if undecidable else "")
        lines += ["### CRA: Nuc minus Mean macro-F1 (pp), intra-section (IS)", "",
                  "Mean ± SD (ddof 1) over sections (unit = section, n = `n_sections`), each section first averaged "
                  "over its seeds; `nuc_beats_mean`: paired Wilcoxon over sections, two-sided p < 0.05 and a "
                  f"positive median difference; `significant_wins`: the same test against each other encoder.{note}",
                  "", dataframe_to_markdown(show), ""]
    lines += ["### CRT", "", results["crt_definition"], ""]
    if len(results["crt"]):
        cols = [c for c in results["crt"].columns if c.startswith("crt_") or c in ("encoder", "taxonomy", "magnification", "n_units")]
        lines += [dataframe_to_markdown(results["crt"][cols]), ""]
    return lines


CHAPTER = Chapter("cells", TABLES, FIGURES, write_cells_chapter,
                  reads=("cell_runs", "cell_qc", "cell_manifests"), settings=("cells",))
