"""The OOD chapter of the report (audit paper): novelty detection by tier (categorical and grading tasks apart), the
abstention gate's operating points, selective prediction, blur curves, slide aggregation, the coarsening
controls and the sensitivity tables, with three figures (risk-coverage curves, ID-vs-OOD score histograms,
accuracy against blur sigma). Formatted from :func:`fmaudit.analyses.ood_summary.summarize_ood`; this module
computes nothing. Every interval is printed with its resampling unit and count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.ood.gate import DIVISION_MEAN
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.figures import note_figure, pyplot, save_figure
from fmaudit.report.formatting import fmt_ci, guarded

DETECTION, GATE, SELECTIVE, SLIDES, SENSITIVITY = ("OOD detection", "Abstention gate", "Selective prediction",
                                                   "Slides and grades", "OOD sensitivity")
#: Tables of the chapter (name -> category of Snakemake's report), in the order they are written.
TABLES = {
    "ood_detection": DETECTION,
    "ood_detection_by_tier": DETECTION,
    "ood_gate": GATE,
    "ood_gate_summary": GATE,
    "ood_selective": SELECTIVE,
    "ood_blur": SELECTIVE,
    "ood_slides": SLIDES,
    "ood_coarsening": SLIDES,
    "ood_probe_sensitivity": SENSITIVITY,
    "ood_scorer_sensitivity": SENSITIVITY,
}
FIGURES = {"ood_risk_coverage": SELECTIVE, "ood_score_histograms": DETECTION, "ood_blur_accuracy": SELECTIVE}
NOTE = "no OOD shard was planned by this config"
#: The most histogram panels drawn (rows of encoders are cut, and the figure says so).
MAX_HISTOGRAM_PANELS = 48

__all__ = ["FIGURES", "CHAPTER", "TABLES", "below_chance_remark", "detection_markdown", "gate_markdown"]


# --------------------------------------------------------------------------------------------------
# markdown
# --------------------------------------------------------------------------------------------------
def _units(df: pd.DataFrame) -> str:
    """``unit=patient, n=6, B=200`` for each distinct way the rows' intervals were drawn."""
    cols = [c for c in ("ci_unit", "ci_n_units", "n_boot") if c in df.columns]
    if len(cols) < 3 or len(df) == 0:
        return "no intervals"
    parts = []
    for unit, n, b in df[cols].drop_duplicates().itertuples(index=False):
        if isinstance(unit, str) and unit:
            parts.append(f"unit={unit}, n={int(n)}, B={int(b)}")
    return "; ".join(dict.fromkeys(parts)) or "no intervals"


def _ci(row: Mapping[str, Any], name: str) -> str:
    """``point [lo, hi]`` of ``name`` in a row (a dict of a table's columns)."""
    point = float(row.get(name, np.nan))
    lo, hi = float(row.get(f"{name}_ci_lo", np.nan)), float(row.get(f"{name}_ci_hi", np.nan))
    if not np.isfinite(lo):
        return "n/a" if not np.isfinite(point) else f"{point:.3f}"
    return fmt_ci(point, lo, hi)


def detection_markdown(by_tier: pd.DataFrame, detection: pd.DataFrame) -> str:
    """Per task kind: encoders x (tier, scorer) mean detection AUROC over the tier's conditions.

    Parameters
    ----------
    by_tier : DataFrame
        Mean AUROC per (task kind, encoder, tier, scorer): ``task_kind``, ``encoder``, ``tier``, ``scorer`` and
        ``mean_auroc``.
    detection : DataFrame
        The per-condition detection table (``task_kind``, ``task`` and the interval columns ``ci_unit``,
        ``ci_n_units``, ``n_boot``), read for the task names and the intervals' units.

    Returns
    -------
    str
        One Markdown section per task kind (heading, caption, table, and :func:`below_chance_remark`); an unrun
        (tier, scorer) cell reads ``n/a (not run)``.
    """
    parts = []
    for kind, part in by_tier.groupby("task_kind", sort=True):
        part = part.assign(column=part["tier"] + ": " + part["scorer"])
        wide = part.pivot_table(index="encoder", columns="column", values="mean_auroc", sort=False).reset_index()
        wide.columns.name = None
        det = detection[detection["task_kind"] == kind]
        parts.append(f"### {kind.capitalize()} tasks ({', '.join(sorted(det['task'].unique()))})\n\n"
                     "Mean detection AUROC (OOD positive) over the tier's conditions; each condition's own AUROC "
                     f"with its 95% cluster-bootstrap interval ({_units(det)}) is in `tables/ood_detection.csv`.\n\n"
                     f"{dataframe_to_markdown(wide.astype(object).where(wide.notna(), 'n/a (not run)'))}\n"
                     f"{below_chance_remark(part)}")
    return "\n".join(parts)


def below_chance_remark(by_tier: pd.DataFrame) -> str:
    """A sentence naming every (tier, scorer) whose mean detection AUROC is below 0.5, or ``""``: such a scorer ranks
    that OOD set as *more* familiar than the in-distribution test set, which a reader must not take for a weak
    detector.

    Parameters
    ----------
    by_tier : DataFrame
        Mean AUROC per (encoder, tier, scorer) of one task kind: ``tier``, ``scorer`` and ``mean_auroc``.

    Returns
    -------
    str
        A bold Markdown paragraph with each (tier, scorer)'s AUROC range and encoder count, or ``""``.
    """
    low = by_tier[by_tier["mean_auroc"] < 0.5]
    if not len(low):
        return ""
    items = [f"{tier} / {scorer}: {g['mean_auroc'].min():.2f}-{g['mean_auroc'].max():.2f} ({len(g)} encoders)"
             for (tier, scorer), g in low.groupby(["tier", "scorer"], sort=False)]
    return ("\n**Below chance (AUROC < 0.5):** " + "; ".join(items) + ". There the scorer ranks the OOD images as more "
            "familiar than the in-distribution test images, worse than a coin: it is not a detector of that shift "
            "(invert it only with a reason, and never on the test set). The reliability cards name each case.\n")


def _value(row: Mapping[str, Any], name: str) -> str:
    value = float(row.get(name, np.nan))
    return f"{value:.3f}" if np.isfinite(value) else "n/a"


def gate_markdown(summary: pd.DataFrame) -> str:
    """One table per (task setting): per encoder and set, coverage, rejection and accuracy of accepted items of
    the gate of one fit/validation division (the paper's; the exported gate), then each as the mean over the
    divisions with its pooled-bootstrap interval.

    Parameters
    ----------
    summary : DataFrame
        The gate summary: ``setting``, ``encoder``, ``set``, ``tier``, ``coverage``, ``reject_any``,
        ``accuracy_accepted`` (NaN for unlabelled sets), the same with the division-mean suffix and their
        ``_ci_lo``/``_ci_hi``, ``tau_novelty``, ``tau_confidence``, ``n_splits``, optionally ``division_strata``, and
        the interval columns ``ci_unit``, ``ci_n_units``, ``n_boot``.

    Returns
    -------
    str
        One Markdown section per setting: its heading, the convention and the table.
    """
    parts = []
    for setting, part in summary.groupby("setting", sort=False):
        rows = []
        for r in part.to_dict("records"):
            labelled = np.isfinite(float(r.get("accuracy_accepted", np.nan)))
            row = {"encoder": r["encoder"], "set": r["set"], "tier": r["tier"], "coverage": _value(r, "coverage"),
                   "reject_any": _value(r, "reject_any"),
                   "accuracy_accepted": _value(r, "accuracy_accepted") if labelled else "n/a (no labels)"}
            for name in ("coverage", "reject_any", "accuracy_accepted"):
                mean = f"{name}_{DIVISION_MEAN}"
                row[f"{name} (mean over divisions)"] = _ci(r, mean) if name != "accuracy_accepted" or labelled \
                    else "n/a (no labels)"
            row.update(tau_novelty=r.get("tau_novelty", np.nan), tau_confidence=r.get("tau_confidence", np.nan))
            rows.append(row)
        strata = part["division_strata"].iloc[0] if "division_strata" in part.columns else "label"
        n_splits = int(part["n_splits"].iloc[0])
        parts.append(f"### Setting {setting}\n\nThe gate of one fit/validation division (division 0, stratified by "
                     f"{strata}, as the test split; the paper's single division and the exported gate), and each "
                     f"quantity's mean over {n_splits} divisions [95% interval of the bootstrap draws pooled over "
                     f"them; {_units(part)}]; thresholds of division 0.\n\n"
                     f"{dataframe_to_markdown(pd.DataFrame(rows))}\n")
    return "\n".join(parts)


def _splits(r: Mapping[str, Any]) -> str:
    """``stored`` or ``further (5: 0,1,2,3,4)``: which train/test split(s) a row summarises."""
    if str(r.get("splits", "stored")) != "further":
        return "stored"
    return f"further ({int(r['n_splits'])}: {r.get('split_seeds', '')})"


def selective_markdown(selective: pd.DataFrame) -> str:
    """Per task, encoder and split form: accuracy, AURC and E-AURC, selective accuracy at each coverage and, for
    ordinal grades, QWK, each with its interval.

    Parameters
    ----------
    selective : DataFrame
        The selective-prediction table: ``task``, ``encoder``, ``splits`` (``stored`` or ``further`` with
        ``n_splits`` and ``split_seeds``), ``n``, ``accuracy``, ``aurc``, ``eaurc``, ``selective_accuracy_c<cov>``
        columns and optionally ``qwk``, each with ``_ci_lo``/``_ci_hi``.

    Returns
    -------
    str
        The Markdown table, one row per input row.
    """
    cov = [c for c in selective.columns if c.startswith("selective_accuracy_c")
           and not c.endswith(("_lo", "_hi", "_sd_over_splits"))]
    rows = []
    for r in selective.to_dict("records"):
        row = {"task": r["task"], "encoder": r["encoder"], "splits": _splits(r), "n": f"{float(r['n']):.0f}",
               "accuracy": _ci(r, "accuracy"), "AURC": _ci(r, "aurc"), "E-AURC": _ci(r, "eaurc")}
        for c in cov:
            row[c.replace("selective_accuracy_c", "sel. acc. @")] = _ci(r, c)
        if np.isfinite(float(r.get("qwk", np.nan))):
            row["QWK"] = _ci(r, "qwk")
        rows.append(row)
    return dataframe_to_markdown(pd.DataFrame(rows))


def slides_markdown(slides: pd.DataFrame) -> str:
    """Per task, encoder and split form: QWK (ordinal grades) or accuracy of each aggregator, with its interval.

    Parameters
    ----------
    slides : DataFrame
        The slide-aggregation table: ``task``, ``encoder``, optionally ``splits``, ``aggregator``, and ``qwk`` or
        ``accuracy`` with ``_ci_lo``/``_ci_hi``.

    Returns
    -------
    str
        A sentence naming the metric, then the Markdown table with one column per aggregator.
    """
    metric = "qwk" if "qwk" in slides.columns and np.isfinite(slides["qwk"].astype(float)).any() else "accuracy"
    rows = []
    keys = [c for c in ("task", "encoder", "splits") if c in slides.columns]
    for _, part in slides.groupby(keys, sort=False):
        r0 = part.iloc[0].to_dict()
        row = {"task": r0["task"], "encoder": r0["encoder"], "splits": _splits(r0)}
        for r in part.to_dict("records"):
            row[str(r["aggregator"])] = _ci(r, metric)
        rows.append(row)
    return f"{'QWK' if metric == 'qwk' else 'Accuracy'} of each aggregator (tile_level: the tile probe on the " \
           f"test tiles, unit tile).\n\n{dataframe_to_markdown(pd.DataFrame(rows))}"


def coarsening_markdown(coarsening: pd.DataFrame) -> str:
    """Per task, encoder, split form and arm: QWK (ordinal grades) or accuracy, and AURC, with intervals.

    Parameters
    ----------
    coarsening : DataFrame
        The coarsening-control table: ``task``, ``encoder``, ``splits``, ``arm``, ``evaluation``, optionally
        ``level``, ``qwk`` or ``accuracy``, and ``aurc``, each with ``_ci_lo``/``_ci_hi``.

    Returns
    -------
    str
        The Markdown table, one row per input row.
    """
    ordinal = "qwk" in coarsening.columns and np.isfinite(coarsening["qwk"].astype(float)).any()
    metric = "qwk" if ordinal else "accuracy"
    rows = []
    for r in coarsening.to_dict("records"):
        rows.append({"task": r["task"], "encoder": r["encoder"], "splits": _splits(r), "arm": r["arm"],
                     "evaluation": r["evaluation"], "level": r.get("level", ""),
                     "QWK" if ordinal else "accuracy": _ci(r, metric), "AURC": _ci(r, "aurc")})
    return dataframe_to_markdown(pd.DataFrame(rows))


def blur_markdown(blur: pd.DataFrame) -> str:
    """Per task, encoder and blur sigma: accuracy and its paired change from the unblurred images, with intervals.

    Parameters
    ----------
    blur : DataFrame
        The blur table: ``task``, ``encoder``, ``sigma`` (0 = unblurred), ``accuracy`` and ``accuracy_change`` with
        their ``_ci_lo``/``_ci_hi``.

    Returns
    -------
    str
        The Markdown table; the change reads ``—`` at sigma 0.
    """
    rows = []
    for r in blur.to_dict("records"):
        change = _ci(r, "accuracy_change") if r["sigma"] > 0 else "—"
        rows.append({"task": r["task"], "encoder": r["encoder"], "sigma": f"{r['sigma']:g}",
                     "accuracy": _ci(r, "accuracy"), "change": change})
    return dataframe_to_markdown(pd.DataFrame(rows))


# --------------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------------
def _task_panels(frame: pd.DataFrame):
    """A figure with one panel per task of ``frame`` (in order of appearance): (fig, [(ax, task), ...])."""
    tasks = list(pd.unique(frame["task"]))
    fig, axes = pyplot().subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    return fig, list(zip(axes[0], tasks))


def risk_coverage_figure(curves: pd.DataFrame, path: Path) -> None:
    """Risk (error rate of the kept items) against coverage, one line per encoder, one panel per task.

    Parameters
    ----------
    curves : DataFrame
        Risk-coverage points: ``task``, ``encoder``, ``coverage`` (0-1) and ``risk``.
    path : Path
        Where the PNG is saved (atomically).
    """
    fig, panels = _task_panels(curves)
    for ax, task in panels:
        for enc, part in curves[curves["task"] == task].groupby("encoder", sort=True):
            part = part.sort_values("coverage")
            ax.plot(part["coverage"], part["risk"], label=enc)
        ax.set_xlabel("coverage (most confident first)")
        ax.set_ylabel("risk (error rate of kept items)")
        ax.set_xlim(0, 1)
        ax.set_title(f"{task}: test split", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, path, tight_layout=True)


def histogram_figure(histograms: pd.DataFrame, scorer: str, path: Path) -> None:
    """ID (grey) vs OOD (colour) novelty-score histograms of ``scorer``: rows (task, encoder), columns conditions.

    Parameters
    ----------
    histograms : DataFrame
        Binned novelty scores: ``scorer``, ``task``, ``encoder``, ``condition``, ``set`` (``id`` or ``ood``),
        ``bin``, its ``lo``/``hi`` edges and ``share`` (of the set's items). At most :data:`MAX_HISTOGRAM_PANELS`
        panels are drawn.
    scorer : str
        The novelty scorer whose histograms are drawn.
    path : Path
        Where the PNG is saved (atomically).
    """
    h = histograms[histograms["scorer"] == scorer]
    rows = list(h[["task", "encoder"]].drop_duplicates().itertuples(index=False, name=None))
    conditions = {task: list(pd.unique(h.loc[h["task"] == task, "condition"])) for task, _ in rows}
    ncol = max(len(c) for c in conditions.values())
    shown = rows[:max(1, MAX_HISTOGRAM_PANELS // ncol)]
    fig, axes = pyplot().subplots(len(shown), ncol, figsize=(2.6 * ncol, 2.0 * len(shown)), squeeze=False)
    for i, (task, enc) in enumerate(shown):
        for j in range(ncol):
            ax = axes[i, j]
            if j >= len(conditions[task]):
                ax.axis("off")
                continue
            cond = conditions[task][j]
            cell = h[(h["task"] == task) & (h["encoder"] == enc) & (h["condition"] == cond)]
            for name, color in (("id", "0.55"), ("ood", "tab:red")):
                part = cell[cell["set"] == name].sort_values("bin")
                if len(part):
                    ax.stairs(part["share"].to_numpy(), np.r_[part["lo"].to_numpy(), part["hi"].iloc[-1]],
                              color=color, fill=name == "id", alpha=0.6 if name == "id" else 1.0, label=name.upper())
            ax.set_title(f"{enc}\n{task}: {cond}", fontsize=7)
            ax.tick_params(labelsize=6)
            if i == 0 and j == 0:
                ax.legend(fontsize=6)
    if len(shown) < len(rows):
        fig.suptitle(f"{scorer} scores; first {len(shown)} of {len(rows)} (task, encoder) rows", fontsize=9)
    else:
        fig.suptitle(f"{scorer} novelty scores (higher = more OOD), share of items per bin", fontsize=9)
    save_figure(fig, path, tight_layout=True)


def blur_figure(blur: pd.DataFrame, path: Path) -> None:
    """Accuracy against blur sigma (0 = unblurred) with its interval band, one line per encoder per task.

    Parameters
    ----------
    blur : DataFrame
        The blur table: ``task``, ``encoder``, ``sigma``, ``accuracy``, optionally ``accuracy_ci_lo``/``_hi``, and
        the interval columns ``ci_unit``, ``ci_n_units``, ``n_boot`` (named in the titles).
    path : Path
        Where the PNG is saved (atomically).
    """
    fig, panels = _task_panels(blur)
    for ax, task in panels:
        part = blur[blur["task"] == task]
        for enc, e in part.groupby("encoder", sort=True):
            e = e.sort_values("sigma")
            line = ax.plot(e["sigma"], e["accuracy"], marker="o", label=enc)[0]
            if "accuracy_ci_lo" in e.columns:
                ax.fill_between(e["sigma"], e["accuracy_ci_lo"], e["accuracy_ci_hi"], color=line.get_color(),
                                alpha=0.15)
        ax.set_xlabel("Gaussian blur sigma (px of a 224 px input)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{task}: test split ({_units(part)})", fontsize=8)
        ax.legend(fontsize=7)
    save_figure(fig, path, tight_layout=True)


# --------------------------------------------------------------------------------------------------
# the chapter
# --------------------------------------------------------------------------------------------------
def _table(writer: ReportWriter, name: str, df: pd.DataFrame, note: str) -> None:
    writer.table(name, df if len(df) else pd.DataFrame({"note": [note]}))


def write_ood_chapter(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    """Write the chapter's tables and figures; return its lines of index.md.

    Parameters
    ----------
    results : mapping or None
        The OOD summary: the tables ``detection``, ``detection_by_tier``, ``gate``, ``gate_summary``, ``selective``,
        ``blur``, ``slides``, ``coarsening``, ``probe_sensitivity``, ``scorer_sensitivity``, ``curves`` and
        ``histograms``, and ``scorer_for_figures`` (the scorer whose histograms are drawn). ``None``: no OOD shard
        was planned; every output says so.
    writer : ReportWriter
        Where the ``ood_*`` tables and figures go; tables are guarded first
        (:func:`~fmaudit.report.formatting.guarded`).

    Returns
    -------
    list of str
        The chapter's heading, its conventions and a section per non-empty table.
    """
    if results is None:
        for name in TABLES:
            writer.table(name, pd.DataFrame({"note": [NOTE]}))
        for name in FIGURES:
            writer.figure(name, lambda path: note_figure("no OOD shard was planned", path))
        return ["## OOD detection and abstention", "", "No OOD shard was planned by this config.", ""]
    r = guarded(results)  # no interval over a single test patient, in the tables and the lines below alike
    _table(writer, "ood_detection", r["detection"], "no OOD conditions")
    _table(writer, "ood_detection_by_tier", r["detection_by_tier"], "no OOD conditions")
    _table(writer, "ood_gate", r["gate"], "no task is gated (config ood.gate)")
    _table(writer, "ood_gate_summary", r["gate_summary"], "no task is gated (config ood.gate)")
    _table(writer, "ood_selective", r["selective"], "no OOD shard")
    _table(writer, "ood_blur", r["blur"], "no blur tier (config ood.blur)")
    _table(writer, "ood_slides", r["slides"], "no slide aggregation (config ood.slides)")
    _table(writer, "ood_coarsening", r["coarsening"], "no coarsening control (config ood.coarsening)")
    _table(writer, "ood_probe_sensitivity", r["probe_sensitivity"], "no sensitivity tables (config ood.sensitivity)")
    _table(writer, "ood_scorer_sensitivity", r["scorer_sensitivity"], "no sensitivity tables (config ood.sensitivity)")
    curves, hist, blur = r["curves"], r["histograms"], r["blur"]
    writer.figure("ood_risk_coverage", (lambda path: risk_coverage_figure(curves, path)) if len(curves)
                  else (lambda path: note_figure("no OOD shard", path)))
    scorer = r["scorer_for_figures"]
    writer.figure("ood_score_histograms", (lambda path: histogram_figure(hist, scorer, path)) if len(hist)
                  else (lambda path: note_figure("no OOD conditions", path)))
    writer.figure("ood_blur_accuracy", (lambda path: blur_figure(blur, path)) if len(blur)
                  else (lambda path: note_figure("no blur tier", path)))
    lines = ["## OOD detection and abstention", "",
             "Novelty scores, higher = more out-of-distribution; detection AUROC with the OOD set as the positive "
             "class (ties 1/2) and FPR at 95% TPR; intervals are 95% percentile cluster-bootstrap intervals, each "
             "table naming its resampling unit and count (unit, n, B). Near and artefact conditions refit the probe "
             "and scorers without the held-out classes.", ""]
    if len(r["detection"]):
        lines += ["### Detection by tier", "", detection_markdown(r["detection_by_tier"], r["detection"]), ""]
    if len(r["gate_summary"]):
        lines += ["### Abstention gate operating points", "",
                  "The audit paper's two-threshold gate: novelty above the validation quantile rejects as novel, then "
                  "confidence below the threshold that keeps the chosen share of the novelty-passing validation "
                  "items rejects as unconfident. The exported gate of each (encoder, task) is in "
                  "`ood/gates/<task>/<encoder>/` (`fmaudit gate apply`).", "", gate_markdown(r["gate_summary"]), ""]
    if len(r["selective"]):
        lines += ["### Selective prediction on the test split", "",
                  f"Intervals: {_units(r['selective'])}; rows `stored` are the stored split (that of detection, blur "
                  "and the gate), rows `further (n: seeds)` the audit paper's probe metrics: the mean over the further "
                  "train/test splits with the percentile interval of the bootstrap draws pooled over them.", "",
                  selective_markdown(r["selective"]), ""]
    if len(blur):
        lines += ["### Accuracy against blur", "",
                  f"Paired intervals (one resample shared by every sigma; {_units(blur)}).", "",
                  blur_markdown(blur), ""]
    further = "; rows `further (n: seeds)` are the audit paper's: the mean over the further train/test splits, the " \
              "interval the percentiles of the bootstrap draws pooled over them"
    if len(r["slides"]):
        lines += ["### Slide aggregation", "", f"Intervals: {_units(r['slides'])}{further}; every metric in "
                  "`tables/ood_slides.csv`.", "", slides_markdown(r["slides"]), ""]
    if len(r["coarsening"]):
        lines += ["### Label coarsening and removed classes", "", f"Intervals: {_units(r['coarsening'])}{further}; "
                  "every metric in `tables/ood_coarsening.csv`.", "", coarsening_markdown(r["coarsening"]), ""]
    if len(r["probe_sensitivity"]) or len(r["scorer_sensitivity"]):
        lines += ["### Sensitivity", "",
                  "Probe regularisation and selection protocol: `tables/ood_probe_sensitivity.csv`; "
                  "scorer settings (normalisation, k, covariance estimator): `tables/ood_scorer_sensitivity.csv` "
                  "(point estimates, no intervals).", ""]
    return lines


CHAPTER = Chapter("ood", TABLES, FIGURES, write_ood_chapter,
                  reads=("ood_tables",), settings=("ood",))
