"""The report job: compute every section's results from the aggregated files, then format them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

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


def report_job(runs: str, predictions: Sequence[str], embeddings: Sequence[str], out_dir: str,
               calibration: Mapping[str, Mapping[str, Any]], bootstrap: Mapping[str, Mapping[str, Any]],
               ood: Sequence[str] = (), ood_settings: Mapping[str, Mapping[str, Any]] | None = None,
               log: str | None = None) -> None:
    """Write the report under ``out_dir``. ``calibration`` and ``bootstrap`` map each task to its config section
    (``calibration.ece_bins`` names the ECE columns; ``bootstrap.n_boot``, ``seed`` and ``paired_n_boot`` make
    the report's intervals). ``ood``: the aggregated OOD tables (``aggregate/ood_<table>.parquet``; none when
    the config plans no OOD shard), ``ood_settings`` their settings by task."""
    from fmaudit.analyses.ood_summary import summarize_ood
    from fmaudit.analyses.probe_summary import summarize_probe_suite
    from fmaudit.embed import embedding_inventory
    from fmaudit.report import write_report

    logger = setup_logging(log)
    run_rows = read_table(runs)
    results = {
        "probe": summarize_probe_suite(run_rows, load_predictions(predictions) if len(run_rows) else pd.DataFrame(),
                                       calibration, bootstrap),
        "embeddings": embedding_inventory(embeddings),
    }
    if ood:
        results["ood"] = summarize_ood(load_ood_tables(ood), ood_settings or {})
    write_report(out_dir, results)
    logger.info("report written to %s", out_dir)
