"""What ``fmaudit grid`` prints: runs and jobs by analysis and protocol, and whether each is planned yet."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.grid.analyses import ANALYSES, count_runs, jobs
from fmaudit.grid.cells import CELL_PROTOCOLS
from fmaudit.grid.ood import SPLIT_PARTS
from fmaudit.grid.probe import shards

__all__ = ["JOBS_NOTE", "summarize"]

#: Why ``fmaudit grid``'s job count is not ``snakemake -n``'s.
JOBS_NOTE = ("jobs: the jobs that run the analyses' runs (embeddings, shards, cell features). snakemake -n plans "
             "more: the workflow's own steps that run none (per-section preparation, merges of feature folders, "
             "split and data checks, aggregation, the report).")

#: Analyses whose rows :func:`summarize` itemises (by protocol, fits and evaluations ...); any other analysis of
#: the table gets one row of its runs and jobs.
ITEMISED = frozenset({"embed", "probe", "head_sweep", "cross_dataset", "ood", "ood_gate", "ood_blur",
                      "ood_image_artefact", "prior_shift", "scratch_reference", "cell_features", "cells"})


def summarize(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None,
              totals: bool = False) -> pd.DataFrame:
    """Runs and jobs by analysis and protocol.

    Each row counts one kind of unit, so ``runs`` do not add up across rows (fits and their evaluations are
    separate rows); ``jobs`` do: a job is counted on one row of its analysis and 0 elsewhere. ``planned`` says
    whether the workflow has rules for it yet (:data:`fmaudit.grid.ANALYSES`); declared analyses are counted
    all the same.

    ``totals`` (what ``fmaudit grid`` prints): each analysis with rows ends with a ``total`` row (its runs: the
    rows that count runs of its own kind, i.e. fits, detections, protocol runs and feature jobs' pairs are not
    added to evaluations or to the cell feature fields; its jobs: all of them), and the table ends with
    ``all / total (config)``: the sum of the analyses' totals (CellPath preset: 304,920 runs). Without
    ``totals`` every job is on one row only, so the ``jobs`` column adds up.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the tasks' domains.
    totals : bool
        Add the ``total`` row of each analysis and the final ``all / total (config)`` row.

    Returns
    -------
    DataFrame
        Columns ``analysis``, ``protocol`` (what the row counts), ``runs``, ``jobs`` and ``planned`` (bool).

    Raises
    ------
    FmauditInputError
        When a block of the config fails the grid's checks (it names the key).
    """
    # Every table but the cell probes' (~300,000 rows on the CellPath preset), which are counted, not built.
    tables = {name: a.enumerate(config, dataset_registry) for name, a in ANALYSES.items() if a.count is None}
    rows: list[dict[str, Any]] = []

    counted: list[bool] = []

    def add(analysis: str, protocol: str, runs: int, n_jobs: int, in_total: bool = True) -> None:
        rows.append({"analysis": analysis, "protocol": protocol, "runs": int(runs), "jobs": int(n_jobs),
                     "planned": ANALYSES[analysis].ruled})
        counted.append(in_total)

    def add_table(analysis: str, protocol: str, table: str, in_total: bool = True) -> None:
        """One row for a table of runs that its own analysis batches into jobs (nothing when it is empty)."""
        if len(tables[table]):
            add(analysis, protocol, len(tables[table]), len(jobs(tables[table], table)), in_total=in_total)

    n_embed = len(tables["embed"])
    add("embed", "encoder x dataset", n_embed, n_embed)
    probe = tables["probe"]
    single = probe["n_targets"] == 1
    add("probe", "fits (in-domain)", len(probe), len(shards(config)))
    add("probe", "evaluations (source x target)", probe["n_targets"].sum(), 0, in_total=False)
    add("probe", "evaluations: single-domain tasks", probe.loc[single, "n_targets"].sum(), 0, in_total=False)
    add("probe", "evaluations: transfer tasks (source x target)", probe.loc[~single, "n_targets"].sum(), 0,
        in_total=False)

    sweep = tables["head_sweep"]
    if len(sweep):
        add("head_sweep", "fits (in-domain)", len(sweep), len(jobs(sweep, "head_sweep")))
        add("head_sweep", "evaluations (source x target)", sweep["n_targets"].sum(), 0, in_total=False)
    add_table("cross_dataset", "evaluations (source task -> target task)", "cross_dataset")
    ood, gate = tables["ood"], tables["ood_gate"]
    if len(ood) or len(gate):
        ood_jobs = pd.concat([jobs(ood, "ood"), jobs(gate, "ood_gate")]).drop_duplicates()
        add("ood", "detection (condition x scorer)", len(ood), len(ood_jobs))
        if len(gate):
            add("ood", "abstention gate (task setting)", len(gate), 0)
    add_table("ood", "blurred test embeddings (task x sigma)", "ood_blur")
    add_table("ood", "artefact test embeddings (task x artefact)", "ood_image_artefact")
    splits = tables["ood_splits"]
    parts = [p for p in SPLIT_PARTS if len(splits) and p in set(splits["part"])]
    for part in parts:
        sub = splits[splits["part"] == part]
        first = part == parts[0]  # the jobs are counted once, on the first part's row
        add("ood", f"further splits: {part.replace('_', ' ')} (task x split seed)", len(sub),
            len(jobs(splits, "ood_splits")) if first else 0)
    add_table("prior_shift", "source seed x target x prior x draw", "prior_shift")
    add_table("scratch_reference", "ResNet-18 from scratch (source x seed)", "scratch_reference")
    add_table("cells", "features (section x magnification; a job per section)", "cell_features", in_total=False)
    cells = count_runs(config, dataset_registry, "cells", by=("protocol",))
    for protocol in CELL_PROTOCOLS:
        sub = cells[cells["protocol"] == protocol]
        if len(sub):
            add("cells", protocol, sub["runs"].sum(), len(sub))
    for analysis in ANALYSES:  # an analysis without rows of its own above: its runs and jobs on one row
        if analysis not in ITEMISED:
            if analysis in tables:  # built above
                add_table(analysis, "runs", analysis)
                continue
            counts = count_runs(config, dataset_registry, analysis)
            if len(counts):
                add(analysis, "runs", counts["runs"].sum(), len(counts))
    if not totals:
        return pd.DataFrame(rows, columns=["analysis", "protocol", "runs", "jobs", "planned"])
    return _with_totals(rows, counted)


def _with_totals(rows: list[dict[str, Any]], counted: list[bool]) -> pd.DataFrame:
    columns = ["analysis", "protocol", "runs", "jobs", "planned"]
    out: list[dict[str, Any]] = []
    grand_runs = grand_jobs = 0
    for analysis in dict.fromkeys(r["analysis"] for r in rows):
        mine = [(r, c) for r, c in zip(rows, counted) if r["analysis"] == analysis]
        runs = sum(r["runs"] for r, c in mine if c)
        n_jobs = sum(r["jobs"] for r, _ in mine)
        out += [r for r, _ in mine]
        out.append({"analysis": analysis, "protocol": "total", "runs": runs, "jobs": n_jobs,
                    "planned": mine[0][0]["planned"]})
        grand_runs += runs
        grand_jobs += n_jobs
    out.append({"analysis": "all", "protocol": "total (config)", "runs": grand_runs, "jobs": grand_jobs,
                "planned": all(r["planned"] for r in rows) if rows else True})
    return pd.DataFrame(out, columns=columns)
