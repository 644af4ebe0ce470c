"""The report: tables (CSV, Markdown, LaTeX), figures and ``index.md``, formatted from results the analyses
computed. The report computes nothing (statistics live in :mod:`fmaudit.stats`, analyses in
:mod:`fmaudit.analyses`); it writes what it is given, every number with its convention and the settings it
was made with.

Chapters: each analysis contributes one module with a :class:`~fmaudit.report.chapter.Chapter`: the report inputs
and settings it reads, its tables and figures (each with a category) and a ``write`` function. A new analysis
adds its chapter as a new module and one line in :data:`CHAPTERS`, and its summary in
``fmaudit.jobs.report.SUMMARIES``; the workflow's ``report`` rule is built from the chapters alone: its inputs
(:func:`report_reads`), its params (:func:`report_settings`) and its outputs (:func:`report_outputs`), with the
captions ``resources/report/tables|figures/<name>.rst``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from fmaudit.io import write_text
from fmaudit.report import cards, cells, cost, embeddings, exposure, ood, paper_check, prior_shift, probe, variants
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.formatting import TABLE_FORMATS
from fmaudit.report.html import markdown_to_html, page

#: The report's chapters, in the order index.md shows them: one line per analysis. The cards come first (the
#: front page), although they are computed last (from every other chapter's results).
CHAPTERS: tuple[Chapter, ...] = (
    cards.CHAPTER,
    probe.CHAPTER,
    ood.CHAPTER,
    variants.CHAPTER,
    prior_shift.CHAPTER,
    exposure.CHAPTER,
    cells.CHAPTER,
    embeddings.CHAPTER,
    cost.CHAPTER,
    paper_check.CHAPTER,  # last: it checks the claims against the tables the chapters above wrote
)

#: Every input a chapter may read: name -> what the workflow gives under it (a list of files, empty when the
#: config plans none of it). A branch of the workflow that produces one registers its files under this name.
REPORT_INPUTS: dict[str, str] = {
    "probe_runs": "the aggregated run table of every probe shard (aggregate/probe_runs.parquet)",
    "probe_predictions": "the per-item predictions of every probe shard",
    "embeddings": "every embedding file the study uses (their provenance)",
    "ood_tables": "the aggregated OOD tables (aggregate/ood_<table>.parquet)",
    "prior_shift_runs": "the aggregated prior-shift rows (aggregate/prior_shift_runs.parquet)",
    "prior_shift_pool": "the prior-shift target pools (aggregate/prior_shift_pool.parquet)",
    "scratch_reference": "the scratch-trained reference rows (aggregate/scratch_reference.parquet)",
    "cell_runs": "the aggregated cell runs (aggregate/cell_runs.parquet)",
    "cell_qc": "each cell section's QC overlay (PNG)",
    "cell_manifests": "each cell section's manifest",
    "cell_subset_scores": "the table ranking the cell sections for the nested subsets (cells.subsets.scores)",
    "claims": "the claims files of the Paper check (config claims)",
    "benchmarks": "the Snakemake benchmark file of every planned job that writes one (benchmarks/<rule>/...tsv)",
}
#: Every setting a chapter may state: name -> what it holds (the report rule's params; captions read them).
REPORT_SETTINGS: dict[str, str] = {
    "calibration": "task -> its calibration settings",
    "bootstrap": "task -> its bootstrap settings",
    "units": "task -> the unit its intervals resample",
    "ood": "task -> its OOD shard's reported settings",
    "prior_shift": "prior-shift task -> its selection rules, priors, draws, sample size and seeds",
    "variants": "declared encoder variant -> its base encoder",
    "exposure": "the encoders' pretraining facts, the data sets' aliases and the evaluated pairs",
    "cells": "the cell branch's magnifications, protocols, taxonomies, readouts and pretraining scale",
    "cost": "the GPUs each GPU-capable job requests (fmaudit.costs.gpu_plan), for GPU-hours",
    "cards": "the study's name and the encoders that get a reliability card",
}

__all__ = ["LINT_TABLE", "REPORT_INPUTS", "REPORT_SETTINGS", "CHAPTERS", "Chapter", "report_files", "report_outputs",
           "report_reads", "report_settings", "write_report"]


def _declared(chapters: Sequence[Chapter], attribute: str, known: Mapping[str, str]) -> list[str]:
    names = list(dict.fromkeys(name for s in chapters for name in getattr(s, attribute)))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"report chapters {attribute} {unknown}, which fmaudit.report does not list "
                         f"(known: {', '.join(known)})")
    return names


def report_reads(chapters: Sequence[Chapter] = CHAPTERS) -> list[str]:
    """Names of every report input some chapter reads (:data:`REPORT_INPUTS`): the ``report`` rule's inputs.

    Parameters
    ----------
    chapters : sequence of Chapter, default CHAPTERS
        The report's chapters.

    Returns
    -------
    list of str
        The names in the chapters' order, each once.

    Raises
    ------
    ValueError
        When a chapter reads a name :data:`REPORT_INPUTS` does not list.
    """
    return _declared(chapters, "reads", REPORT_INPUTS)


def report_settings(chapters: Sequence[Chapter] = CHAPTERS) -> list[str]:
    """Names of every report setting some chapter states (:data:`REPORT_SETTINGS`): the ``report`` rule's params.

    Parameters
    ----------
    chapters : sequence of Chapter, default CHAPTERS
        The report's chapters.

    Returns
    -------
    list of str
        The names in the chapters' order, each once.

    Raises
    ------
    ValueError
        When a chapter states a name :data:`REPORT_SETTINGS` does not list.
    """
    return _declared(chapters, "settings", REPORT_SETTINGS)


def report_outputs(chapters: Sequence[Chapter] = CHAPTERS) -> dict[str, dict[str, str]]:
    """``{"tables": {name: category}, "figures": {name: category}}`` of every chapter: what the report writes
    (each table in every format of :data:`fmaudit.report.formatting.TABLE_FORMATS`), besides ``index.md``.

    Parameters
    ----------
    chapters : sequence of Chapter, default CHAPTERS
        The report's chapters.

    Returns
    -------
    dict of str to dict of str to str
        ``tables`` (the lint's table first, then every chapter's) and ``figures``, each output name -> its category
        in Snakemake's HTML report.

    Raises
    ------
    ValueError
        When two chapters declare the same table or figure.
    """
    out: dict[str, dict[str, str]] = {"tables": dict(LINT_TABLE), "figures": {}}
    for s in chapters:
        for kind, names in (("tables", s.tables), ("figures", s.figures)):
            clash = set(names) & set(out[kind])
            if clash:
                raise ValueError(f"report chapter {s.name!r}: {kind} {sorted(clash)} already belong to another chapter")
            out[kind].update(names)
    return out


def report_files(encoders: Sequence[str], chapters: Sequence[Chapter] = CHAPTERS) -> set[str]:
    """Every file the report writes for a study whose cards are ``encoders``, relative to the report folder: each
    table in every format, each figure, the cards and the front page, the lint's table, ``index.md`` and
    ``index.html`` (what the workflow's ``report`` rule declares).

    Parameters
    ----------
    encoders : sequence of str
        The encoders that get a reliability card.
    chapters : sequence of Chapter, default CHAPTERS
        The report's chapters; the cards are counted only when the cards chapter is among them.

    Returns
    -------
    set of str
        Paths relative to the report folder.
    """
    outputs = report_outputs(chapters)
    files = {f"tables/{t}{ext}" for t in outputs["tables"] for ext in TABLE_FORMATS}
    files |= {f"figures/{f}.png" for f in outputs["figures"]}
    files |= set(cards.card_files(encoders)) if cards.CHAPTER in chapters else set()
    return files | {"index.md", "index.html"}


#: The report lint's table (:mod:`fmaudit.report.lint`), written by :func:`write_report` beside the chapters'.
LINT_TABLE = {"report_lint": "Report lint"}


def write_report(out_dir: str | Path, results: Mapping[str, Any], chapters: Sequence[Chapter] = CHAPTERS,
                 lint: Callable[[str, Path], pd.DataFrame] | None = None) -> pd.DataFrame:
    """Write every chapter's tables and figures under ``out_dir``, then ``index.html`` and ``index.md`` (last, so
    that a complete index means a complete report). ``results[chapter.name]`` is what the chapter formats; a
    missing entry means the config planned nothing of it.

    ``lint(index_markdown, out_dir) -> findings`` (:func:`fmaudit.report.lint.lint_report`) runs once the
    chapters are written: its findings go to ``tables/report_lint`` (a sentence when there are none), one line at
    the top of the index and a list at its end. Returns the findings.

    Parameters
    ----------
    out_dir : str or Path
        The report folder.
    results : mapping
        Chapter name -> what the chapter formats (``fmaudit.jobs.report.SUMMARIES`` builds them); a chapter absent
        from it writes its "nothing planned" outputs.
    chapters : sequence of Chapter, default CHAPTERS
        The chapters, in the order ``index.md`` shows them.
    lint : callable, optional
        ``lint(index_markdown, out_dir) -> DataFrame`` of findings with columns ``check``, ``where`` and
        ``detail``; ``None``: no lint (its table says so).

    Returns
    -------
    DataFrame
        The lint's findings (empty without a lint or when it found nothing).

    Raises
    ------
    RuntimeError
        When the files the chapters wrote differ from those they declare.
    """
    out_dir = Path(out_dir)
    writer = ReportWriter(out_dir)
    body: list[str] = []
    for chapter in chapters:
        body += chapter.write(results.get(chapter.name), writer)
    body += ["Tables are also in `tables/` as CSV, Markdown and LaTeX.", ""]
    findings = lint("\n".join(body), out_dir) if lint is not None else pd.DataFrame()
    writer.table("report_lint", findings if len(findings) else pd.DataFrame(
        {"note": ["the report lint found nothing" if lint is not None else "no lint was run"]}))
    declared = {p for s in chapters for p in s.outputs(results.get(s.name))}
    declared |= {f"tables/report_lint{ext}" for ext in TABLE_FORMATS}
    if writer.written != declared:  # a chapter wrote something it does not declare, or skipped an output
        raise RuntimeError(f"report chapters wrote {sorted(writer.written ^ declared)} against their declaration")
    head = ["# fmaudit report", ""]
    if writer.warnings:  # small test sets: said once at the top, and in each row's ci_note
        head += ["## Warning: small test sets", "",
                 "Some intervals rest on fewer than 5 test patients (or slides); with a single one there is no "
                 "interval at all. Each such row says so in its `ci_note` column:", ""]
        head += [f"- `{name}`: {'; '.join(flagged)}" for name, flagged in sorted(writer.warnings.items())] + [""]
    if len(findings):
        head += [f"**Report lint: {len(findings)} finding{'s' if len(findings) != 1 else ''}** (listed at the end of "
                 "this page and in `tables/report_lint.csv`): read them before the numbers they point at.", ""]
        body += ["## Report lint", "", "What the report lint flags (fmaudit.report.lint); each line names the table "
                 "and the row or column.", ""] + [f"- **{r.check}** ({r.where}): {r.detail}"
                                                 for r in findings.itertuples(index=False)] + [""]
    text = "\n".join(head + body)
    # the home page links the cards' HTML pages where index.md links their Markdown
    home = re.sub(r"\(cards/([^)\s]+)\.md\)", r"(cards/\1.html)", text)
    write_text(out_dir / "index.html", page("fmaudit report", markdown_to_html(home)))
    write_text(out_dir / "index.md", text)
    return findings
