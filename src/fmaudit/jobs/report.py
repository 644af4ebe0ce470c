"""The report job: compute every section's results from the aggregated files, then format them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.io import read_table
from fmaudit.logs import setup_logging

__all__ = ["load_predictions", "report_job"]


def load_predictions(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The per-item predictions of every probe shard, in one table."""
    frames = [read_table(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def report_job(runs: str, predictions: Sequence[str], embeddings: Sequence[str], out_dir: str,
               calibration: Mapping[str, Mapping[str, Any]], bootstrap: Mapping[str, Mapping[str, Any]],
               log: str | None = None, cell_runs: str | None = None, cell_qc: Mapping[str, str] | None = None,
               cells: Mapping[str, Any] | None = None) -> None:
    """Write the report under ``out_dir``. ``calibration`` and ``bootstrap`` map each task to its config section
    (``calibration.ece_bins`` names the ECE columns; ``bootstrap.n_boot``, ``seed`` and ``paired_n_boot`` make
    the report's intervals). ``cell_runs``: the aggregated cell runs (None without a cell branch), ``cell_qc``
    section -> its QC overlay, ``cells``: the settings the cell section states
    (:func:`fmaudit.analyses.cell_summary.summarize_cell_runs`)."""
    from fmaudit.analyses.cell_summary import summarize_cell_runs
    from fmaudit.analyses.probe_summary import summarize_probe_suite
    from fmaudit.embed import embedding_inventory
    from fmaudit.report import write_report

    logger = setup_logging(log)
    run_rows = read_table(runs)
    results = {
        "probe": summarize_probe_suite(run_rows, load_predictions(predictions) if len(run_rows) else pd.DataFrame(),
                                       calibration, bootstrap),
        "embeddings": embedding_inventory(embeddings),
        "cells": summarize_cell_runs(read_table(cell_runs), cells or {}, cell_qc or {}) if cell_runs else None,
    }
    write_report(out_dir, results)
    logger.info("report written to %s", out_dir)
