"""Formatting shared by the report's chapters: point estimates with intervals, the settings in words, and one
table written in every format (CSV, Markdown, LaTeX)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import dataframe_to_markdown, write_table, write_text

#: Formats every report table is written in, the first one carrying the caption in Snakemake's report.
TABLE_FORMATS = (".csv", ".md", ".tex")
_ECE_COLUMN = re.compile(r"^ece_top_(\d+)_lohi$")

#: Intervals from fewer resampling units than this get a warning beside them (and a report-lint finding).
MIN_UNITS = 5

__all__ = ["MIN_UNITS", "TABLE_FORMATS", "ece_columns", "few_units_warning", "fill_missing", "fmt_ci",
           "integer_columns", "settings_text", "table_or_note", "write_all_formats"]


def fmt_ci(point: float, lo: float, hi: float) -> str:
    """``0.812 [0.790, 0.833]``; ``n/a`` for an undefined point."""
    if not np.isfinite(point):
        return "n/a"
    return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def write_all_formats(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Write ``df`` as ``stem.csv``, ``stem.md`` and ``stem.tex`` (each atomically); returns the paths."""
    paths = [stem.with_suffix(ext) for ext in TABLE_FORMATS]
    write_table(paths[0], df)
    write_table(paths[1], df)
    write_text(paths[2], df.to_latex(index=False, float_format="%.3f", escape=True))
    return paths


def ece_columns(df: pd.DataFrame) -> list[str]:
    """The top-label ECE columns of a table (``ece_top_<bins>_lohi``), by bin count."""
    return sorted((c for c in df.columns if _ECE_COLUMN.match(str(c))),
                  key=lambda c: int(_ECE_COLUMN.match(c).group(1)))


def _tasks(tasks: Sequence[str]) -> str:
    return ("task " if len(tasks) == 1 else "tasks ") + ", ".join(tasks)


def settings_text(groups: Iterable[tuple[Mapping[str, Any], Sequence[str]]],
                  template: str = "{ece_bins} equal-width bins, B={n_boot}") -> str:
    """The settings a table was made with, in words: ``template`` filled with a group's settings, prefixed by
    its tasks when the groups differ (``tasks a, b: 15 equal-width bins, B=1000; task c: ...``)."""
    groups = list(groups)
    if len(groups) == 1:
        return template.format(**groups[0][0])
    return "; ".join(f"{_tasks(tasks)}: {template.format(**s)}" for s, tasks in groups)


def fill_missing(df: pd.DataFrame, reasons: Mapping[str, str] | None = None, default: str = "n/a") -> pd.DataFrame:
    """A copy of ``df`` for printing in which every missing cell says why: ``reasons[column]`` where given, else
    ``default`` (the Markdown writer would leave it blank)."""
    out = df.astype(object).copy()
    for col in out.columns:
        missing = df[col].isna()
        if missing.any():
            out.loc[missing, col] = (reasons or {}).get(str(col), default)
    return out


def integer_columns(df: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """``df`` with ``columns`` (ranks, counts) printed as whole numbers (``2``, not ``2.000``), missing ones kept."""
    out = df.copy()
    for col in columns:
        if col in out.columns:
            out[col] = [int(v) if pd.notna(v) else v for v in out[col]]
            out[col] = out[col].astype(object)
    return out


def table_or_note(df: pd.DataFrame | None, why: str) -> str:
    """``df`` as Markdown, or the sentence ``why`` when it has no rows or columns (never an empty ``|  |``)."""
    if df is None or len(df) == 0 or len(df.columns) == 0:
        return why[0].upper() + why[1:] + ("" if why.endswith(".") else ".")
    return dataframe_to_markdown(df)


def few_units_warning(n_units: Iterable[Any], unit: str = "unit") -> str:
    """A warning sentence when some interval rests on fewer than :data:`MIN_UNITS` resampling units, else ``""``."""
    small = sorted({int(n) for n in n_units if pd.notna(n) and int(n) < MIN_UNITS})
    if not small:
        return ""
    return (f" **Warning: some intervals rest on {', '.join(map(str, small))} {unit}(s), fewer than {MIN_UNITS}: "
            "such an interval says almost nothing (with one unit, every resample is the same and the interval "
            "collapses onto the point).**")
