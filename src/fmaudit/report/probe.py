"""The probe suite's report chapter: leaderboards, the calibration ladder, transfer summaries and their figures,
formatted from :func:`fmaudit.analyses.probe_summary.summarize_probe_suite` (this module computes nothing)."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report import figures
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.exposure import with_exposure
from fmaudit.report.formatting import (
    MIN_UNITS,
    ece_columns,
    fill_missing,
    fmt_ci,
    guarded,
    integer_columns,
    settings_text,
    table_or_note,
)

ACCURACY, CALIBRATION, COMPOSITE, RANKS = ("Accuracy under shift", "Calibration", "Composite reliability",
                                           "Rank transfer")
#: Tables of the chapter (name -> category of Snakemake's report), in the order they are written.
TABLES = {
    "leaderboard": ACCURACY,
    "calibration": CALIBRATION,
    "shift_summary": ACCURACY,
    "cross_domain_leaderboard": ACCURACY,
    "paired_differences": ACCURACY,
    "cri": COMPOSITE,
    "cri_by_split": COMPOSITE,
    "rank_transfer": RANKS,
    "decoupling_units": RANKS,
    "decoupling": RANKS,
    "ece_slopes": CALIBRATION,
    "ece_slope_by_auroc_bin": CALIBRATION,
}
FIGURES = {"reliability": CALIBRATION, "rank_transfer": RANKS, "ece_vs_fraction": CALIBRATION}
#: Tables that rank encoders: each carries the exposure audit's column beside the encoder (results["exposure"]).
RANKING = ("leaderboard", "shift_summary", "cross_domain_leaderboard", "paired_differences", "cri")
NOTE = "no probe runs were planned by this config"

__all__ = ["FIGURES", "CHAPTER", "TABLES", "calibration_markdown", "cri_by_split_markdown", "figure_captions",
           "interval_units_text", "leaderboard_markdown", "rank_transfer_markdown"]


LEAKY = "leaky"


def _split_flag(cell: pd.DataFrame) -> str:
    """`` Split: patch (leaky, as published): ...`` for a task whose split leaks, else ``""``."""
    split = str(cell["task_split"].iloc[0]) if "task_split" in cell.columns else "manifest"
    if LEAKY not in split:
        return ""
    return (f" **Split: {split}**: the test items share patients with the training items, so in-domain numbers "
            "are inflated.")


def leaderboard_markdown(board: pd.DataFrame) -> str:
    """One table per (task, head, source): encoders × (in-domain, each target) macro-F1 [95% CI]; each target's
    column names the unit its intervals resample and how many (``unit=patient, n=6``).

    Parameters
    ----------
    board : DataFrame
        The leaderboard (:mod:`fmaudit.analyses.leaderboard`): one row per (task, head, fraction, source, target,
        encoder) with ``macro_f1`` and ``macro_f1_ci_lo``/``_ci_hi`` (mean over seeds), optionally ``ci_resampling``
        (the unit and count), ``exposure``, ``calibration_mode`` and ``task_split``.

    Returns
    -------
    str
        Markdown sections, one per (task, head, fraction, source), encoders sorted by in-domain macro-F1 (best first);
        a leaky split is flagged in bold.
    """
    parts = []
    for (task, head, frac, source), cell in board.groupby(["task", "head", "fraction", "source_domain"], sort=True):
        targets = [source] + sorted(t for t in cell["target_domain"].unique() if t != source)
        labels = {}
        for t in targets:
            r = cell[cell["target_domain"] == t]
            unit = f"; {r['ci_resampling'].iloc[0]}" if "ci_resampling" in r.columns and len(r) else ""
            labels[t] = f"{t} (in-domain{unit})" if t == source else (f"{t} ({unit[2:]})" if unit else t)
        wide = []
        for enc, er in cell.groupby("encoder"):
            row = {"encoder": enc}
            for t in targets:
                r = er[er["target_domain"] == t]
                row[labels[t]] = (fmt_ci(*r[["macro_f1", "macro_f1_ci_lo", "macro_f1_ci_hi"]].iloc[0]) if len(r)
                                  else "n/a")
                if t == source and len(r):
                    row["_sort"] = float(r["macro_f1"].iloc[0])
            if "exposure" in er.columns:
                row["exposure"] = er["exposure"].iloc[0]
            wide.append(row)
        table = pd.DataFrame(wide).sort_values("_sort", ascending=False).drop(columns="_sort")
        mode = (f" Calibration: {cell['calibration_mode'].iloc[0]}." if "calibration_mode" in cell.columns else "")
        parts.append(f"### {task}: source {source}, {head} probe, label fraction {frac:g}\n\n"
                     "Macro-F1, mean over seeds [95% CI; cluster bootstrap of the unit in the column header]."
                     f"{mode}{_split_flag(cell)}\n\n{dataframe_to_markdown(table)}\n")
    return "\n".join(parts)


def interval_units_text(board: pd.DataFrame) -> str:
    """Per task, what its intervals resample: ``task demo: unit=patient, n=2-3 per test set``; item-level tasks
    say that their data set has no patient ids.

    Parameters
    ----------
    board : DataFrame
        The leaderboard with ``task``, ``ci_unit`` (``+``-joined when a row pools units) and ``ci_n_units``.

    Returns
    -------
    str
        One clause per task joined by ``"; "``; without ``ci_unit`` a sentence pointing at the ``ci_resampling``
        column.
    """
    if "ci_unit" not in board.columns or len(board) == 0:
        return "each interval's unit and count are in its table's ci_resampling column"
    parts = []
    for task, cell in board.groupby("task", sort=True):
        unit = "+".join(sorted(set("+".join(cell["ci_unit"].astype(str)).split("+"))))
        lo, hi = int(cell["ci_n_units"].min()), int(cell["ci_n_units"].max())
        n = f"n={lo}" if lo == hi else f"n={lo}-{hi}"
        note = " (no patient ids: item-level)" if unit == "item" else ""
        parts.append(f"task {task}: unit={unit}, {n} per test set{note}")
    return "; ".join(parts)


def cri_by_split_markdown(table: pd.DataFrame) -> str:
    """OOD_Stability and CRI of each encoder under every split of the same data sets, side by side (largest
    label fraction); the leaky split is named as such in its column.

    Parameters
    ----------
    table : DataFrame
        The CRI table over splits: ``datasets``, ``head``, ``fraction``, ``task``, ``task_split``, ``encoder``,
        ``ood_stability`` and ``cri``.

    Returns
    -------
    str
        Markdown sections, one per (data sets, head), a column per (metric, split); a sentence when no task is run
        under two splits.
    """
    if len(table) == 0 or "task_split" not in table.columns:
        return "No task is run under two splits of the same data sets."
    parts = ["The same data sets under each task split: a leaky split (items of one patient in train and test) "
             "inflates in-domain AUROC, the denominator of OOD_Stability.\n"]
    for (datasets, head), cell in table.groupby(["datasets", "head"], sort=True):
        cell = cell[cell["fraction"] == cell["fraction"].max()]
        cell = cell.assign(column=cell["task_split"].astype(str) + " [" + cell["task"].astype(str) + "]")
        wide = cell.pivot_table(index="encoder", columns="column", values=["ood_stability", "cri"], sort=True)
        wide.columns = [f"{metric}: {split}" for metric, split in wide.columns]
        parts.append(f"### {datasets}: {head} probe, label fraction {cell['fraction'].iloc[0]:g}\n\n"
                     f"{dataframe_to_markdown(wide.reset_index())}\n")
    return "\n".join(parts)


def calibration_markdown(cal: pd.DataFrame) -> str:
    """One table per (task, head, fraction): top-label ECE by temperature stage (columns) per encoder and pair.

    Parameters
    ----------
    cal : DataFrame
        The calibration ladder: ``task``, ``head``, ``fraction``, ``encoder``, ``source_domain``, ``target_domain``,
        ``stage`` (``raw``, ``source_ts``, ``oracle_ts``, ``kshot_ts``), ``k``, the ``ece_top_<bins>_lohi`` columns
        and optionally ``n_at_bound``, ``n_temperatures``, ``bound_temperatures`` and ``calibration_mode``.

    Returns
    -------
    str
        Markdown sections, one per (task, head, fraction); a missing cell reads ``bound`` (every temperature at a
        search bound) or ``n/a`` (no run).
    """
    def stage_name(r) -> str:
        return f"kshot_ts (K={int(r.k)})" if r.stage == "kshot_ts" else r.stage

    parts = []
    for (task, head, frac), cell in cal.groupby(["task", "head", "fraction"]):
        ece_col = [c for c in ece_columns(cell) if cell[c].notna().any()][0]
        bins = ece_col.split("_")[2]
        cell = cell.assign(stage_label=[stage_name(r) for r in cell.itertuples()])
        wide = cell.pivot_table(index=["encoder", "source_domain", "target_domain"], columns="stage_label",
                                values=ece_col, sort=False).reset_index()
        order = ["encoder", "source_domain", "target_domain"] + [
            c for c in ["raw", "source_ts", "oracle_ts"] if c in wide]
        order += sorted((c for c in wide.columns if str(c).startswith("kshot")),
                        key=lambda c: int(str(c).split("K=")[1].rstrip(")")))
        counts = ""
        if "n_at_bound" in cell.columns and "bound_temperatures" in cell.columns:
            fitted = cell[cell["stage"] != "raw"]
            counts = (f" {int(fitted['n_at_bound'].sum())} of {int(fitted['n_temperatures'].sum())} fitted temperatures"
                      f" sit at a search bound; {cell['bound_temperatures'].iloc[0]}.")
        mode = f" Source temperature: {cell['calibration_mode'].iloc[0]}." if "calibration_mode" in cell.columns else ""
        shown = _mark_bound_cells(wide[order], cell)
        parts.append(f"### {task}: {head} probe, label fraction {frac:g}\n\nTop-label ECE ({bins} bins, (lo,hi]) "
                     "by temperature stage; oracle_ts is fitted on the evaluated target (not deployable)."
                     f"{mode}{counts} A cell marked `bound` had every temperature of its mean at a search bound (left "
                     f"out); `n/a` has no run.\n\n{dataframe_to_markdown(shown)}\n")
    return "\n".join(parts)


def _mark_bound_cells(wide: pd.DataFrame, cell: pd.DataFrame) -> pd.DataFrame:
    """The ladder with each missing cell saying why: ``bound`` where the stage's temperatures all sat at a search
    bound (left out of the mean), ``n/a`` where there is no run."""
    out = wide.astype(object).copy()
    if "n_at_bound" not in cell.columns:
        return fill_missing(wide)
    keys = ["encoder", "source_domain", "target_domain"]
    bound = cell[cell["n_at_bound"].fillna(0) > 0]
    bound = bound.assign(stage_label=[f"kshot_ts (K={int(k)})" if st == "kshot_ts" else st
                                      for st, k in zip(bound["stage"], bound["k"])])
    at_bound = {(*r[:3], r[3]) for r in bound[keys + ["stage_label"]].itertuples(index=False, name=None)}
    for col in out.columns[3:]:
        for i in out.index[wide[col].isna()]:
            key = tuple(wide.loc[i, keys]) + (col,)
            out.loc[i, col] = "bound" if key in at_bound else "n/a"
    return out


def shift_summary_markdown(summary: pd.DataFrame, board: pd.DataFrame) -> str:
    """The in-domain vs off-domain summary with what each mean averages (the leaderboards give each value with its
    interval).

    Parameters
    ----------
    summary : DataFrame
        Per encoder (and task, head): ``macro_f1_in_domain``, ``macro_f1_off_domain`` and the same for ECE.
    board : DataFrame
        The leaderboard, read to count the source domains and the source → target pairs each mean averages.

    Returns
    -------
    str
        A paragraph on what each mean averages, then the Markdown table; a sentence when ``summary`` is empty.
    """
    if len(summary) == 0:
        return "No encoder was scored in-domain and off-domain."
    n_src = board.groupby(["task", "head"])["source_domain"].nunique().max() if len(board) else 0
    n_pairs = (board[~board["in_domain"]].groupby(["task", "head", "encoder"]).size().max()
               if len(board) and "in_domain" in board else 0)
    return ("Per encoder, at the largest label fraction and as means over seeds: `macro_f1_in_domain` is the mean of "
            f"its in-domain macro-F1 over the task's {n_src} source domain(s) (each source's own leaderboard below), "
            f"`macro_f1_off_domain` the mean over its {n_pairs} source → target pair(s), likewise for ECE. These are "
            "means of the leaderboards' values, without intervals; the leaderboards give each value with its "
            f"interval.\n\n{dataframe_to_markdown(fill_missing(summary))}")


def cross_domain_markdown(table: pd.DataFrame) -> str:
    """The cross-domain leaderboard, one table per (task, head, fraction, source) with only its own targets' columns
    and ranks as whole numbers.

    Parameters
    ----------
    table : DataFrame
        The cross-domain leaderboard: ``task``, ``head``, ``fraction``, ``source_domain``, one column per target
        metric and ``rank_*`` columns.

    Returns
    -------
    str
        Markdown sections, one per (task, head, fraction, source); a sentence when ``table`` is empty.
    """
    if len(table) == 0:
        return "No encoder was scored on another domain than its source."
    parts = []
    for (task, head, frac, source), cell in table.groupby(["task", "head", "fraction", "source_domain"], sort=False):
        cell = cell.dropna(axis=1, how="all").drop(columns=["task", "head", "fraction", "source_domain"])
        ranks = [c for c in cell.columns if str(c).startswith("rank_")]
        parts.append(f"### {task}: source {source}, {head} probe, label fraction {frac:g}\n\n"
                     f"{dataframe_to_markdown(fill_missing(integer_columns(cell, ranks)))}\n")
    return "\n".join(parts)


def rank_transfer_markdown(rank: pd.DataFrame) -> str:
    """Rank transfer, one row per (task, head, fraction, s→t): ρ with its interval, τ-b, the in-domain best and
    its rank on the target.

    Parameters
    ----------
    rank : DataFrame
        The rank-transfer table (:func:`fmaudit.stats.ranking.rank_transfer` per pair): ``task``, ``head``,
        ``fraction``, ``source_domain``, ``target_domain``, ``spearman_rho`` with optional ``_ci_lo``/``_ci_hi``,
        ``kendall_tau_b``, ``source_best``, ``target_rank_of_source_best``, ``dethroned`` and ``n_models``.

    Returns
    -------
    str
        The Markdown table with a ``reading`` column (informative or not, transfer or reversal); a sentence when
        ``rank`` is empty.
    """
    if len(rank) == 0:
        return "Rank transfer needs at least two encoders scored on two domains."
    lo = rank["spearman_rho_ci_lo"] if "spearman_rho_ci_lo" in rank else pd.Series(float("nan"), index=rank.index)
    hi = rank["spearman_rho_ci_hi"] if "spearman_rho_ci_hi" in rank else pd.Series(float("nan"), index=rank.index)
    table = pd.DataFrame({
        "task": rank["task"], "head": rank["head"], "fraction": rank["fraction"],
        "source → target": rank["source_domain"] + " → " + rank["target_domain"],
        "Spearman ρ [95% CI]": [fmt_ci(r, a, b) if pd.notna(a) else ("n/a (ties)" if pd.isna(r) else f"{r:.3f}")
                                for r, a, b in zip(rank["spearman_rho"], lo, hi)],
        "Kendall τ-b": rank["kendall_tau_b"].map(lambda v: "n/a" if pd.isna(v) else f"{v:.3f}"),
        "in-domain best": rank["source_best"], "its rank on target": rank["target_rank_of_source_best"],
        "dethroned": rank["dethroned"], "reading": [_rho_reading(r) for r in rank.to_dict("records")],
    })
    return dataframe_to_markdown(fill_missing(integer_columns(table, ["its rank on target"])))


def _rho_reading(r: Mapping[str, Any]) -> str:
    """Whether a rank-transfer ρ says anything: over fewer than 5 encoders, or with an interval that includes 0,
    it does not."""
    n = r.get("n_models")
    lo, hi = r.get("spearman_rho_ci_lo"), r.get("spearman_rho_ci_hi")
    if pd.isna(r.get("spearman_rho")):
        return "no ranking (ties)"
    if pd.notna(n) and int(n) < MIN_UNITS:
        return f"uninformative: {int(n)} encoders (ρ takes few values; at least {MIN_UNITS} are needed)"
    if pd.isna(lo) or pd.isna(hi):
        return "no interval"
    if lo <= 0 <= hi:
        return "uninformative: the interval includes 0"
    return "rankings transfer" if lo > 0 else "rankings reverse"


def figure_captions(groups: list) -> dict[str, str]:
    """Captions of the chapter's figures in index.md, with the settings they were made with (the HTML report's
    come from ``resources/report/figures/<name>.rst``).

    Parameters
    ----------
    groups : list of (mapping, sequence of str)
        The report's settings groups, (settings with ``ece_bins`` and ``n_boot``, the tasks that use them), as
        :func:`~fmaudit.report.formatting.settings_text` takes them.

    Returns
    -------
    dict of str to str
        Figure name (``reliability``, ``rank_transfer``, ``ece_vs_fraction``) -> its caption.
    """
    bins = settings_text(groups, "{ece_bins} equal-width bins")
    boot = settings_text(groups, "B={n_boot}")
    return {
        "reliability": (
            "Reliability diagrams of each encoder's probe (rows), in-domain and off-domain, raw and after "
            "source-validation temperature scaling (columns); first head and first seed at the largest label "
            "fraction, pooling every source domain's test items in-domain and every source → target pair off-domain "
            "(hence n is the sum over sources). Pooled bins can disagree with the calibration ladder, which is per "
            "source → target pair and averages seeds: a temperature that helps on the pooled items can hurt on one "
            "pair, so read the ladder for a deployment decision. "
            f"Bars: accuracy per confidence bin ({bins}, (lo, hi]); hatched red: the gap to the bin's mean "
            "confidence (above a bar: overconfident, inside it: underconfident); dashed: perfect calibration; lower "
            "panels: items per bin; corner: the ECE of those bins."),
        "rank_transfer": (
            "Spearman ρ between the in-domain ranking of encoders by macro-F1 (rows: source) and their ranking on "
            "each target (columns), per task, head and label fraction, with its 95% percentile bootstrap interval. "
            "Resampling unit: the test groups (each task's unit, as the interval units above say), source and target "
            f"resampled independently, one draw shared by every encoder and seed ({boot}); encoders are the fixed "
            "set compared, not resampled."),
        "ece_vs_fraction": (
            f"Target top-label ECE (raw, {bins}, mean over seeds) against the label fraction of the source training "
            "split (log scale), one line per encoder, one panel per transfer pair; bands: 95% percentile "
            f"cluster-bootstrap intervals over the target's test groups (each task's unit) at each fraction ({boot})."),
    }


def _write_empty(writer: ReportWriter) -> list[str]:
    for name in TABLES:
        writer.table(name, pd.DataFrame({"note": [NOTE]}))
    for name in FIGURES:
        writer.figure(name, lambda path: figures.note_figure("no probe runs were planned", path))
    return ["No probe runs were planned by this config.", ""]


def write_probe_chapter(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    """Write the chapter's tables and figures; return its lines of index.md.

    Parameters
    ----------
    results : mapping or None
        The probe summary: one DataFrame per name of :data:`TABLES`, with ``reliability_curves``,
        ``ece_by_fraction``, ``exposure`` (the exposure audit, added to the :data:`RANKING` tables) and ``settings``
        (the settings groups, each with ``ece_bins``, ``n_boot``, ``paired_n_boot`` and
        ``include_bound_temperatures``). ``None``: no probe run was planned; every output says so.
    writer : ReportWriter
        Where the tables and the figures ``reliability``, ``rank_transfer`` and ``ece_vs_fraction`` go.

    Returns
    -------
    list of str
        The conventions paragraph and one section per table, then the figures with their captions.
    """
    if results is None:
        return _write_empty(writer)
    results = {**results, **{name: with_exposure(results[name], results.get("exposure")) for name in RANKING}}
    results = guarded(results)  # no interval over a single test patient, in the tables and the lines below alike
    for name in TABLES:
        writer.table(name, results[name])
    groups = results["settings"]
    curves = results["ece_by_fraction"]
    # tasks of settings groups with other bin counts have their ECE in another column: one line per encoder
    curves = curves.assign(target_ece=curves[ece_columns(curves)].bfill(axis=1).iloc[:, 0])
    writer.figure("reliability", lambda path: figures.reliability_figure(results["reliability_curves"], path))
    writer.figure("rank_transfer", lambda path: figures.rank_transfer_heatmap(results["rank_transfer"], path))
    writer.figure("ece_vs_fraction", lambda path: figures.ece_vs_fraction_figure(
        curves, "target_ece", f"target top-label ECE, raw ({settings_text(groups, '{ece_bins} bins')})", path))
    t = results
    bound = settings_text([({**g, "bound": "included" if g["include_bound_temperatures"] else "left out and counted"},
                            tasks) for g, tasks in groups], "{bound}")
    modes = ", ".join(sorted(set(t["leaderboard"]["calibration_mode"].astype(str)))) if (
        "calibration_mode" in t["leaderboard"].columns) else "full validation split (published)"
    return [
        "Conventions: macro-F1 with `labels=range(K)`; top-label ECE with "
        f"{settings_text(groups, '{ece_bins} equal-width bins')} closed as (lo, hi]; "
        "Brier summed over classes (range [0, 2]); intervals are 95% percentile cluster-bootstrap intervals "
        f"({settings_text(groups, 'B={n_boot}')}) of the mean over seeds, each naming the unit it resamples and "
        f"how many ({interval_units_text(t['leaderboard'])}). Source temperatures: {modes}; temperatures at a "
        f"search bound in post-temperature means: {bound}.", "",
        "## In-domain vs off-domain", "", shift_summary_markdown(t["shift_summary"], t["leaderboard"]), "",
        "## Leaderboards", "", leaderboard_markdown(t["leaderboard"]), "",
        "## Calibration ladder", "", calibration_markdown(t["calibration"]), "",
        "## Paired differences to the reference encoder", "",
        "Macro-F1 difference (encoder − reference), paired cluster bootstrap of the unit in `ci_resampling` "
        f"({settings_text(groups, 'B={paired_n_boot}')}); the reference is the best encoder on the source "
        "validation split (`reference_chosen_on`), not on the test set the intervals describe.", "",
        table_or_note(fill_missing(t["paired_differences"].drop(columns=["resampling"], errors="ignore")),
                      "no paired difference: fewer than two encoders, or no reference encoder"), "",
        "## Cross-domain leaderboard (sorted by the most shifted target)", "",
        cross_domain_markdown(t["cross_domain_leaderboard"]), "",
        "## CRI per label fraction", "",
        "CRI = AUROC_id × (1 − clip(ECE after source TS)) × OOD_Stability (PRISM, as corrected).", "",
        table_or_note(fill_missing(t["cri"].drop(columns=["cri_convention"], errors="ignore")),
                      "no CRI: no task is scored both in-domain and off-domain"), "",
        "## OOD_Stability and CRI by split", "",
        cri_by_split_markdown(t["cri_by_split"]), "",
        "## Rank transfer", "",
        "Spearman ρ of the in-domain and target rankings of encoders (macro-F1), with a 95% percentile bootstrap "
        "interval over the test groups (each task's unit, above), source and target resampled independently "
        f"({settings_text(groups, 'B={n_boot}')}).", "",
        rank_transfer_markdown(t["rank_transfer"]), "",
        "## AUROC-rank vs ECE-rank decoupling (Fisher-z pooled per fraction)", "",
        table_or_note(fill_missing(t["decoupling"], default="n/a (undefined: too few encoders or units)"),
                      "no decoupling: fewer than three encoders"), "",
        "## Target ECE against label fraction, by transfer AUROC", "",
        table_or_note(fill_missing(t["ece_slope_by_auroc_bin"], default="n/a (no pair in this bin)"),
                      "no slope: a single label fraction"), "",
        "## Figures", "",
    ] + _figure_lines(figure_captions(groups))


def _figure_lines(captions: Mapping[str, str]) -> list[str]:
    lines = []
    for name, caption in captions.items():
        lines += [f"![{name.replace('_', ' ')}](figures/{name}.png)", "", f"*{caption}*", ""]
    return lines


CHAPTER = Chapter("probe", TABLES, FIGURES, write_probe_chapter,
                  reads=("probe_runs", "probe_predictions"),
                  settings=("calibration", "bootstrap", "units", "variants", "exposure"))
