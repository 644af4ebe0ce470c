"""The report job: each chapter's results from the inputs it declares, then every chapter formatted.

A report chapter (:class:`fmaudit.report.chapter.Chapter`) declares the inputs it reads and the settings it states;
:data:`SUMMARIES` holds, for each chapter, the function that turns those into the results its ``write``
formats. :func:`report_job` loops over them in the order of :data:`SUMMARIES` (a chapter may use the results of
one before it: the exposure audit is shown beside every table that ranks encoders), then writes the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from fmaudit.adapt.summary import BOOTSTRAP_LEVELS, gain_intervals
from fmaudit.analyses.advice import ECE_MARGIN
from fmaudit.analyses.cards import build_cards, card_encoders, front_page
from fmaudit.analyses.cell_summary import summarize_cell_runs
from fmaudit.analyses.ood_summary import summarize_ood
from fmaudit.analyses.prior_shift_summary import summarize_prior_shift
from fmaudit.analyses.probe_summary import summarize_probe_suite
from fmaudit.analyses.variants import split_variant_runs, variant_pairs
from fmaudit.claims import load_claims
from fmaudit.costs import cost_by, embedding_devices, job_costs
from fmaudit.embed import embedding_inventory
from fmaudit.exposure import EXPOSURE_COLUMNS, exposure_audit
from fmaudit.io import read_table
from fmaudit.logs import setup_logging
from fmaudit.report import CHAPTERS, write_report
from fmaudit.report.chapter import Chapter
from fmaudit.report.lint import lint_report

__all__ = ["ReportInputs", "SUMMARIES", "encoder_gains", "exposure_table", "load_ood_tables", "report_job"]


class ReportInputs:
    """The files of each report input (name -> paths); each table is read once, however many chapters read it
    (views made by :meth:`only` share the tables read).

    Parameters
    ----------
    paths : Mapping of str to sequence of str or Path
        Report input name (:data:`fmaudit.report.REPORT_INPUTS`) -> its files; a name the config plans nothing
        for is absent or has no file.
    _tables : dict, optional
        The cache of tables already read, shared by the views :meth:`only` makes; not for callers.
    """

    def __init__(self, paths: Mapping[str, Sequence[str | Path]], _tables: dict[str, Any] | None = None):
        self.paths = {name: [str(p) for p in files] for name, files in paths.items()}
        self._tables: dict[str, pd.DataFrame | None] = {} if _tables is None else _tables

    def only(self, names: Sequence[str]) -> "ReportInputs":
        """The inputs ``names`` and no other (a chapter sees what it declares and nothing else: the workflow would
        not rerun the report when something undeclared changed).

        Parameters
        ----------
        names : sequence of str
            The input names a chapter declares (:attr:`fmaudit.report.chapter.Chapter.reads`).

        Returns
        -------
        ReportInputs
            A view with those names only, sharing this one's cache of tables read.
        """
        return ReportInputs({name: self.files(name) for name in names}, self._tables)

    def files(self, name: str) -> list[str]:
        """The files of input ``name`` (an empty list when the config planned none or it is not among these inputs).

        Parameters
        ----------
        name : str
            A report input name.

        Returns
        -------
        list of str
            The file paths as given.
        """
        return self.paths.get(name, [])

    def table(self, name: str) -> pd.DataFrame | None:
        """Every file of ``name`` read and concatenated (None when the config planned none).

        Parameters
        ----------
        name : str
            A report input name whose files are tables (``.parquet``, ``.csv`` ...).

        Returns
        -------
        DataFrame or None
            The rows of every file in file order, with a fresh index; read at the first call and cached.
        """
        if name not in self._tables:
            files = self.files(name)
            self._tables[name] = pd.concat([read_table(p) for p in files], ignore_index=True) if files else None
        return self._tables[name]


def load_ood_tables(paths: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """The aggregated OOD tables by name, from their files ``.../ood_<name>.parquet``.

    Parameters
    ----------
    paths : sequence of str or Path
        The aggregated OOD table files (``ood_detection.parquet``, ``ood_gate.parquet`` ...).

    Returns
    -------
    dict of str to DataFrame
        Table name without the ``ood_`` prefix (``detection``, ``gate`` ...) -> the table.
    """
    out = {}
    for p in paths:
        stem = Path(p).name.removesuffix(".parquet")
        out[stem.removeprefix("ood_")] = read_table(p)
    return out


def exposure_table(exposure: Mapping[str, Any] | None) -> pd.DataFrame | None:
    """The exposure audit (:func:`fmaudit.exposure.exposure_audit`) of every (encoder, data set) pair the config
    evaluates. ``exposure``: ``encoders`` (slug -> registry entry), ``datasets`` (slug -> registry entry) and
    ``pairs`` ([encoder, data set] lists); None or no pairs: None.

    Parameters
    ----------
    exposure : Mapping or None
        The report's ``exposure`` setting: ``encoders``, ``datasets`` and ``pairs``.

    Returns
    -------
    DataFrame or None
        One row per pair, in ``pairs`` order: ``encoder``, ``dataset``, ``exposure`` (yes / no / unknown) and
        ``evidence``; None when there are no pairs.

    Raises
    ------
    FmauditInputError
        When a pair names an encoder or data set missing from the registries given.
    """
    if not exposure or not exposure.get("pairs"):
        return None
    parts = [exposure_audit([enc], [ds], exposure["encoders"], exposure["datasets"]) for enc, ds in exposure["pairs"]]
    return pd.concat(parts, ignore_index=True)[EXPOSURE_COLUMNS]


Summary = Callable[[ReportInputs, Mapping[str, Any], Mapping[str, Any]], Any]


def _exposure(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    return exposure_table(settings.get("exposure"))


def _ranked_runs(inputs: ReportInputs, settings: Mapping[str, Any]) -> tuple[pd.DataFrame, ...]:
    """(ranked runs, ranked predictions, variant runs, variant predictions): declared variants leave every
    ranking for the variant pairing."""
    runs = inputs.table("probe_runs")
    runs = runs if runs is not None else pd.DataFrame()
    preds = inputs.table("probe_predictions") if len(runs) else None
    preds = preds if preds is not None else pd.DataFrame()
    variants = dict(settings.get("variants") or {})
    return (*split_variant_runs(runs, variants), *split_variant_runs(preds, variants))


def _probe(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    runs, _, preds, _ = _ranked_runs(inputs, settings)
    probe = summarize_probe_suite(runs, preds, settings["calibration"], settings["bootstrap"])
    if probe is not None:
        probe["exposure"] = earlier.get("exposure")
    return probe


def _variants(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    variants = dict(settings.get("variants") or {})
    _, paired_runs, _, paired_preds = _ranked_runs(inputs, settings)
    if not variants or not len(paired_runs):
        return None
    bootstrap = settings["bootstrap"]
    return pd.concat([
        variant_pairs(part, paired_preds[paired_preds["task"] == task], variants,
                      n_boot=int(bootstrap[task]["paired_n_boot"]), seed=int(bootstrap[task]["seed"]))
        for task, part in paired_runs.groupby("task", sort=False)], ignore_index=True)


def _ood(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    files = inputs.files("ood_tables")
    return summarize_ood(load_ood_tables(files), settings.get("ood") or {}) if files else None


def _prior_shift(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    rows = inputs.table("prior_shift_runs")
    if rows is None:
        return None
    bootstrap = settings["bootstrap"]
    selection = {task: list(part["model_selection"]) for task, part in (settings.get("prior_shift") or {}).items()}
    assumed = {task: list(part.get("assumed_priors") or [])
               for task, part in (settings.get("prior_shift") or {}).items()}
    summary = summarize_prior_shift(rows, inputs.table("prior_shift_pool"), inputs.table("scratch_reference"),
                                    bootstrap, selection, assumed)
    if summary is not None:
        summary["exposure"] = earlier.get("exposure")
        summary["bootstrap"] = {task: dict(bootstrap[task]) for task in selection if task in bootstrap}
    return summary


def _cells(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    runs = inputs.table("cell_runs")
    if runs is None:
        return None
    qc = {Path(p).stem: p for p in inputs.files("cell_qc")}
    return summarize_cell_runs(runs, settings.get("cells") or {}, qc, subset_scores=inputs.table("cell_subset_scores"))


def _embeddings(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    return embedding_inventory(inputs.files("embeddings"))


def _cost(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    files = inputs.files("benchmarks")
    if not files:
        return None
    inventory = earlier.get("embeddings")
    if inventory is None and inputs.files("embeddings"):
        inventory = embedding_inventory(inputs.files("embeddings"))
    jobs = job_costs(files, (settings.get("cost") or {}).get("gpu_plan"), embedding_devices(inventory))
    return {"jobs": jobs, "by_rule": cost_by(jobs, "rule"), "by_encoder": cost_by(jobs, "encoder")}


def encoder_gains(rows: pd.DataFrame | None, bootstrap: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame | None:
    """Per encoder, task, source, method and prior: the mean macro-F1 gain over no adaptation with its
    hierarchical-bootstrap interval over the encoder's source seeds and draws (the prior-shift chapter pools
    encoders; a card needs one encoder's).

    Parameters
    ----------
    rows : DataFrame or None
        The aggregated prior-shift run rows (one per run x method, with ``gain_macro_f1``, ``seed``, ``draw``,
        ``target_domain``, ``prior``).
    bootstrap : Mapping of str to Mapping
        Task -> its ``bootstrap`` block (``n_boot``, ``seed``); a task missing from it gets 200 resamples, seed 0.

    Returns
    -------
    DataFrame or None
        One row per (task, encoder, source domain, method, prior): ``mean``, ``ci_lo``, ``ci_hi`` (NaN for
        ``none``, the reference), ``n_scenarios``, ``n_positive_scenarios``, ``n_boot``, ``n_valid``, ``n_units``
        (source seeds), ``unit`` (``seed``) and ``unit_text`` (the interval's resampling in words); None without rows.
    """
    if rows is None or not len(rows):
        return None
    levels = [lv for lv in BOOTSTRAP_LEVELS if lv != "encoder"]
    parts = []
    for (task, enc, source), part in rows.groupby(["task", "encoder", "source_domain"], sort=False):
        b = bootstrap.get(str(task)) or {"n_boot": 200, "seed": 0}
        g = gain_intervals(part, by=["method", "prior"], levels=levels, n_boot=int(b["n_boot"]),
                           random_state=int(b["seed"]))
        n_units = int(part[levels[0]].nunique())
        parts.append(g.assign(task=str(task), encoder=str(enc), source_domain=str(source), n_units=n_units,
                              unit_text=f"{' > '.join(levels)} hierarchical bootstrap, {n_units} {levels[0]}s, "
                                        f"B={int(b['n_boot'])}"))
    out = pd.concat(parts, ignore_index=True)
    out["unit"] = levels[0]
    return out


def _cards(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    declared = settings.get("cards") or {}
    ps = settings.get("prior_shift") or {}
    results = {"probe": earlier.get("probe"), "ood": earlier.get("ood"), "cells": earlier.get("cells"),
               "exposure": earlier.get("exposure"), "cost": earlier.get("cost"),
               "embeddings": earlier.get("embeddings"),
               "prior_shift_gains": encoder_gains(inputs.table("prior_shift_runs"), settings.get("bootstrap") or {}),
               "priors": {task: dict(block.get("priors") or {}) for task, block in ps.items()}}
    encoders = list(declared.get("encoders") or card_encoders(results))
    cards = build_cards(results, str(declared.get("study", "")), encoders)
    probe, ood = earlier.get("probe") or {}, earlier.get("ood") or {}
    return {"cards": cards, "front": front_page(cards), "encoders": encoders, "margin": ECE_MARGIN,
            "has_cells": bool(earlier.get("cells") and len(earlier["cells"].get("cra", []))),
            "figures": {"leaderboard": probe.get("leaderboard"), "rank_transfer": probe.get("rank_transfer"),
                        "calibration": probe.get("calibration"), "curves": ood.get("curves"),
                        "gate_summary": ood.get("gate_summary")}}


def _paper_check(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:
    """The config's claims files; the chapter checks them against the tables the other chapters wrote."""
    return [load_claims(p) for p in inputs.files("claims")] or None


#: Chapter name -> the function that turns the chapter's declared inputs and settings into what it formats
#: (``summary(inputs, settings, earlier results by chapter name)``), in the order they are computed.
SUMMARIES: dict[str, Summary] = {
    "exposure": _exposure,
    "probe": _probe,
    "variants": _variants,
    "ood": _ood,
    "prior_shift": _prior_shift,
    "cells": _cells,
    "embeddings": _embeddings,
    "cost": _cost,
    "cards": _cards,
    "paper_check": _paper_check,
}


def report_job(inputs: Mapping[str, Sequence[str]], settings: Mapping[str, Any], out_dir: str,
               log: str | None = None, chapters: Sequence[Chapter] = CHAPTERS,
               summaries: Mapping[str, Summary] = SUMMARIES) -> None:
    """Write the report under ``out_dir``. ``inputs``: report input name -> its files (the ``report`` rule's
    inputs, :data:`fmaudit.report.REPORT_INPUTS`); ``settings``: report setting name -> value (its params,
    :data:`fmaudit.report.REPORT_SETTINGS`). Each chapter gets only what it declares.

    Parameters
    ----------
    inputs : Mapping of str to sequence of str
        Report input name -> its files (the ``report`` rule's inputs, :data:`fmaudit.report.REPORT_INPUTS`).
    settings : Mapping
        Report setting name -> value (the rule's params, :data:`fmaudit.report.REPORT_SETTINGS`).
    out_dir : str
        The report folder (``index.md``, ``tables/``, ``figures/``).
    log : str, optional
        Log file; None logs to stderr.
    chapters : sequence of Chapter
        The chapters to write, in report order (default: :data:`fmaudit.report.CHAPTERS`).
    summaries : Mapping of str to callable
        Chapter name -> its summary function, in the order they run (default: :data:`SUMMARIES`).

    Raises
    ------
    ValueError
        When a chapter has no summary function (a programming error, not bad input).
    """
    logger = setup_logging(log)
    missing = [s.name for s in chapters if s.name not in summaries]
    if missing:
        raise ValueError(f"report chapters {missing} have no summary in fmaudit.jobs.report.SUMMARIES")
    shared = ReportInputs(inputs)
    by_name = {s.name: s for s in chapters}
    results: dict[str, Any] = {}
    for name, summarize in summaries.items():
        if name not in by_name:
            continue
        chapter = by_name[name]
        declared = {key: settings[key] for key in chapter.settings if key in settings}
        results[name] = summarize(shared.only(chapter.reads), declared, results)
        logger.info("report chapter %s: %s", name, "summarised" if results[name] is not None else "nothing planned")
    findings = write_report(out_dir, results, chapters, lint=lint_report)
    for r in findings.itertuples(index=False):
        logger.warning("report lint: %s (%s): %s", r.check, r.where, r.detail)
    logger.info("report written to %s (%d lint findings: tables/report_lint.csv)", out_dir, len(findings))
