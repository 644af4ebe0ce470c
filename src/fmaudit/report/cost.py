"""What the study cost: CPU-hours, GPU-hours, peak memory and wall time per rule and per encoder, with totals, from
the Snakemake benchmark files (:mod:`fmaudit.costs` reads them; this module formats)."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.chapter import Chapter, ReportWriter

COST = "What it cost"
TABLES = {"cost_by_rule": COST, "cost_by_encoder": COST, "cost_jobs": COST}
NOTE = "no benchmark files: no heavy job of this study has run yet"
GPU_CONVENTION = (
    "GPU-hours are each job's wall time times the GPUs the workflow requests for it (its `gpu` "
    "resource: an encoder entry's `gpu` for embed and cell_features, "
    "`prior_shift.scratch_reference.gpu` for scratch_reference; every other rule requests none), which "
    "is what a cluster charges; CPU-hours are the jobs' CPU time (user + system, Snakemake's cpu_time); "
    "wall hours are summed over jobs (compute, not elapsed time)."
)

__all__ = ["CHAPTER", "GPU_CONVENTION", "TABLES", "cost_markdown"]


def cost_markdown(table: pd.DataFrame) -> str:
    """A cost summary (:func:`fmaudit.costs.cost_by`) with hours to four significant digits.

    Parameters
    ----------
    table : DataFrame
        A cost summary with ``cpu_hours``, ``gpu_hours``, ``wall_hours``, ``longest_job_s`` and ``peak_rss_mb``
        (missing values: a job too short to measure, or memory not sampled).

    Returns
    -------
    str
        The table as Markdown, each missing value saying why.
    """
    shown = table.copy()
    for col in ("cpu_hours", "gpu_hours", "wall_hours"):
        shown[col] = [f"{v:.4g}" if pd.notna(v) else "n/a (a job too short to measure)" for v in shown[col]]
    shown["longest_job_s"] = [f"{v:.1f}" for v in shown["longest_job_s"]]
    shown["peak_rss_mb"] = [f"{v:.0f}" if pd.notna(v) else "n/a (not sampled)" for v in shown["peak_rss_mb"]]
    return dataframe_to_markdown(shown)


def write_cost_chapter(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    """Write the cost tables (per rule, per encoder, per job); return the chapter's lines of ``index.md``.

    Parameters
    ----------
    results : mapping or None
        ``jobs`` (one row per benchmarked job, :func:`fmaudit.costs.job_costs`), ``by_rule`` and ``by_encoder``
        (:func:`fmaudit.costs.cost_by`, the last row of ``by_rule`` being the total). ``None`` or no job: every table
        says that no heavy job has run.
    writer : ReportWriter
        Where the tables ``cost_by_rule``, ``cost_by_encoder`` and ``cost_jobs`` go.

    Returns
    -------
    list of str
        Markdown lines: the totals, the GPU-hours convention and the two summaries.
    """
    lines = ["## What it cost", ""]
    if not results or not len(results["jobs"]):
        for name in TABLES:
            writer.table(name, pd.DataFrame({"note": [NOTE]}))
        return lines + [NOTE[0].upper() + NOTE[1:] + ".", ""]
    writer.table("cost_by_rule", results["by_rule"])
    writer.table("cost_by_encoder", results["by_encoder"])
    writer.table("cost_jobs", results["jobs"].drop(columns=["file"], errors="ignore"))
    total = results["by_rule"].iloc[-1]
    return lines + [
        f"{int(total['jobs'])} benchmarked jobs: {total['cpu_hours']:.4g} CPU-hours, "
        f"{total['gpu_hours']:.4g} GPU-hours, "
        f"peak memory {total['peak_rss_mb']:.0f} MB. {GPU_CONVENTION} Jobs without a benchmark file (the cheap local "
        "rules: aggregation, validation, this report) are not counted. The same numbers: `fmaudit cost --results "
        "<results folder>`.",
        "",
        "### Per rule",
        "",
        cost_markdown(results["by_rule"]),
        "",
        "### Per encoder",
        "",
        "Jobs of no single encoder (data preparation, scratch references) are under `(no encoder)`.",
        "",
        cost_markdown(results["by_encoder"]),
        "",
    ]


CHAPTER = Chapter("cost", TABLES, {}, write_cost_chapter, reads=("benchmarks", "embeddings"), settings=("cost",))
