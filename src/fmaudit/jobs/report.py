"""The report job: compute every section's results from the aggregated files, then format them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.claims import load_claims
from fmaudit.io import read_table
from fmaudit.logs import setup_logging

__all__ = ["load_ood_tables", "load_predictions", "report_job"]


def load_predictions(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The per-item predictions of every probe shard, in one table."""
    frames = [read_table(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_ood_tables(paths: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """The aggregated OOD tables by name, from their files ``.../ood_<name>.parquet``."""
    out = {}
    for p in paths:
        stem = Path(p).name.removesuffix(".parquet")
        out[stem.removeprefix("ood_")] = read_table(p)
    return out


def exposure_table(exposure: Mapping[str, Any] | None) -> pd.DataFrame | None:
    """The exposure audit (:func:`fmaudit.exposure.exposure_audit`) of every (encoder, data set) pair the config
    evaluates. ``exposure``: ``encoders`` (slug -> registry entry), ``datasets`` (slug -> registry entry) and
    ``pairs`` ([encoder, data set] lists); None or no pairs: None."""
    from fmaudit.exposure import EXPOSURE_COLUMNS, exposure_audit

    if not exposure or not exposure.get("pairs"):
        return None
    parts = [exposure_audit([enc], [ds], exposure["encoders"], exposure["datasets"]) for enc, ds in exposure["pairs"]]
    return pd.concat(parts, ignore_index=True)[EXPOSURE_COLUMNS]


def report_job(runs: str, predictions: Sequence[str], embeddings: Sequence[str], out_dir: str,
               calibration: Mapping[str, Mapping[str, Any]], bootstrap: Mapping[str, Mapping[str, Any]],
               ood: Sequence[str] = (), ood_settings: Mapping[str, Mapping[str, Any]] | None = None,
               log: str | None = None, prior_shift_runs: str | None = None, prior_shift_pool: str | None = None,
               scratch: str | None = None, prior_shift: Mapping[str, Mapping[str, Any]] | None = None,
               variants: Mapping[str, str] | None = None, exposure: Mapping[str, Any] | None = None,
               cell_runs: str | None = None, cell_qc: Mapping[str, str] | None = None,
               cells: Mapping[str, Any] | None = None, cell_subset_scores: str | None = None,
               claims: Sequence[str] = ()) -> None:
    """Write the report under ``out_dir``. ``calibration`` and ``bootstrap`` map each task to its config section
    (``calibration.ece_bins`` names the ECE columns; ``bootstrap.n_boot``, ``seed`` and ``paired_n_boot`` make
    the report's intervals). ``ood``: the aggregated OOD tables (``aggregate/ood_<table>.parquet``; none when
    the config plans no OOD shard), ``ood_settings`` their settings by task.

    Prior shift: ``prior_shift_runs``, ``prior_shift_pool`` and ``scratch`` are the aggregated tables of the
    prior-shift rules; ``prior_shift`` maps each prior-shift task to its section (``model_selection``).
    ``variants``: declared variant slug -> base slug; their probe rows leave every ranking table for the
    variant pairing. ``exposure``: what :func:`exposure_table` audits, shown beside every table that ranks
    encoders. ``cell_runs``: the aggregated cell runs (None without a cell branch), ``cell_qc`` section -> its QC
    overlay, ``cells``: the settings the cell section states
    (:func:`fmaudit.analyses.cell_summary.summarize_cell_runs`), ``cell_subset_scores`` the table of
    ``cells.subsets.scores`` (section, score) when the config names one. ``claims``: the config's claims files,
    checked last against the report's own tables (the Paper check section, :mod:`fmaudit.claims`)."""
    from fmaudit.analyses.cell_summary import summarize_cell_runs
    from fmaudit.analyses.ood_summary import summarize_ood
    from fmaudit.analyses.prior_shift_summary import summarize_prior_shift
    from fmaudit.analyses.probe_summary import summarize_probe_suite
    from fmaudit.analyses.variants import split_variant_runs, variant_pairs
    from fmaudit.embed import embedding_inventory
    from fmaudit.report import write_report

    logger = setup_logging(log)
    variants = dict(variants or {})
    run_rows = read_table(runs)
    preds = load_predictions(predictions) if len(run_rows) else pd.DataFrame()
    ranked_runs, paired_runs = split_variant_runs(run_rows, variants)
    ranked_preds, paired_preds = split_variant_runs(preds, variants)
    audit = exposure_table(exposure)
    probe = summarize_probe_suite(ranked_runs, ranked_preds, calibration, bootstrap)
    if probe is not None:
        probe["exposure"] = audit
    results: dict[str, Any] = {
        "probe": probe,
        "embeddings": embedding_inventory(embeddings),
        "exposure": audit,
        "cells": summarize_cell_runs(read_table(cell_runs), cells or {}, cell_qc or {},
                                     subset_scores=read_table(cell_subset_scores) if cell_subset_scores else None)
        if cell_runs else None,
    }
    if ood:
        results["ood"] = summarize_ood(load_ood_tables(ood), ood_settings or {})
    if variants and len(paired_runs):
        results["variants"] = pd.concat([
            variant_pairs(part, paired_preds[paired_preds["task"] == task], variants,
                          n_boot=int(bootstrap[task]["paired_n_boot"]), seed=int(bootstrap[task]["seed"]))
            for task, part in paired_runs.groupby("task", sort=False)], ignore_index=True)
    if prior_shift_runs:
        rows = read_table(prior_shift_runs)
        pool = read_table(prior_shift_pool) if prior_shift_pool else None
        ref = read_table(scratch) if scratch else None
        selection = {task: list(section["model_selection"]) for task, section in (prior_shift or {}).items()}
        assumed = {task: list(section.get("assumed_priors") or []) for task, section in (prior_shift or {}).items()}
        summary = summarize_prior_shift(rows, pool, ref, bootstrap, selection, assumed)
        if summary is not None:
            summary["exposure"] = audit
            summary["bootstrap"] = {task: dict(bootstrap[task]) for task in selection if task in bootstrap}
        results["prior_shift"] = summary
        logger.info("prior shift: %d run x method rows of %d encoders", len(rows),
                    rows["encoder"].nunique() if len(rows) else 0)
    results["paper_check"] = [load_claims(p) for p in claims] or None
    write_report(out_dir, results)
    logger.info("report written to %s", out_dir)
