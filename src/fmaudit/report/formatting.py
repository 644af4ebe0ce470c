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
#: Resampling units (test patients, slides ...) below which a row's intervals are flagged: the same threshold as
#: the validation log's warning (:data:`fmaudit.preflight.MIN_TEST_GROUPS`). Below 2 a row has no interval.
FEW_UNITS = 5
#: The column that says why a row's interval is missing or weak.
CI_NOTE = "ci_note"

#: Intervals from fewer resampling units than this carry a warning (the report lint flags them too).
MIN_UNITS = FEW_UNITS

__all__ = ["CI_NOTE", "FEW_UNITS", "MIN_UNITS", "TABLE_FORMATS", "ece_columns", "fill_missing", "fmt_ci",
           "guard_intervals", "guarded", "integer_columns", "settings_text", "table_or_note", "write_all_formats"]


def _interval_columns(columns: Iterable[str]) -> list[str]:
    cols = list(columns)
    return [c for c in cols if (c.endswith("ci_lo") and c[:-2] + "hi" in cols) or
            (c.endswith("ci_hi") and c[:-2] + "lo" in cols)]


def guard_intervals(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """A report table with no interval where its resampling unit has a single cluster, and a :data:`CI_NOTE` saying
    why, or saying that an interval over fewer than :data:`FEW_UNITS` clusters is weak; returns it with one line per
    flagged kind of row for the report's index. Tables whose rows name their clusters (``ci_n_units``, with
    ``ci_unit``) are guarded; rows with 0 clusters have no interval by design (e.g. a gate's thresholds) and are
    left as they are. A cluster bootstrap over one patient resamples that patient only: its "interval" is the
    point itself, which reads as certainty.

    Parameters
    ----------
    df : DataFrame
        A report table; guarded when it has ``ci_n_units`` (resampling clusters per row) and optionally
        ``ci_unit`` (their name; ``group`` when absent). Interval columns are pairs ``<x>ci_lo``/``<x>ci_hi``.

    Returns
    -------
    tuple of (DataFrame, list of str)
        The table (``df`` itself when nothing is flagged, else a copy with single-cluster intervals set to NaN and a
        :data:`CI_NOTE` column), and the index lines, one per flagged kind of row.
    """
    if "ci_n_units" not in df.columns or not len(df):
        return df, []
    n = pd.to_numeric(df["ci_n_units"], errors="coerce")
    unit = df["ci_unit"].astype(str) if "ci_unit" in df.columns else pd.Series("group", index=df.index)
    single = (n == 1).to_numpy()
    few = ((n >= 2) & (n < FEW_UNITS)).to_numpy()
    if not single.any() and not few.any():
        return df, []
    out = df.copy()
    note = pd.Series(pd.NA, index=out.index, dtype="string")
    note[single] = [f"no interval: 1 {u} (a cluster bootstrap needs at least 2)" for u in unit[single]]
    note[few] = [f"only {int(k)} {u}s: the interval is wide and its width uncertain (fewer than {FEW_UNITS})"
                 for k, u in zip(n[few], unit[few])]
    for col in _interval_columns(out.columns):
        out[col] = out[col].astype("float64")
        out.loc[single, col] = np.nan
    out[CI_NOTE] = out[CI_NOTE].fillna(note) if CI_NOTE in out.columns else note
    lines = []
    if single.any():
        lines.append(f"{int(single.sum())} row(s) without an interval (a single test {unit[single].iloc[0]})")
    if few.any():
        lows = sorted({int(k) for k in n[few]})
        lines.append(f"{int(few.sum())} row(s) with intervals over {', '.join(map(str, lows))} "
                     f"{unit[few].iloc[0]}s only (fewer than {FEW_UNITS})")
    return out, lines


def fmt_ci(point: float, lo: float, hi: float) -> str:
    """``0.812 [0.790, 0.833]``; ``n/a`` for an undefined point; ``1.000 [no interval]`` for a point without one.

    Parameters
    ----------
    point : float
        The point estimate.
    lo, hi : float
        The interval's bounds; NaN (or inf) when there is none.

    Returns
    -------
    str
        The text, three decimals.
    """
    if not np.isfinite(point):
        return "n/a"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{point:.3f} [no interval]"
    return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def guarded(results: Mapping[str, Any]) -> dict[str, Any]:
    """Every table of a section's results through :func:`guard_intervals`, so that its index lines and its table
    files agree (no interval over a single test patient).

    Parameters
    ----------
    results : mapping
        A chapter's results: DataFrames and other values (lists, numbers, text) by name.

    Returns
    -------
    dict
        The same keys; every DataFrame replaced by its guarded table, other values unchanged.
    """
    return {k: guard_intervals(v)[0] if isinstance(v, pd.DataFrame) else v for k, v in results.items()}


def write_all_formats(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Write ``df`` as ``stem.csv``, ``stem.md`` and ``stem.tex`` (each atomically); returns the paths.

    Parameters
    ----------
    df : DataFrame
        The table; the LaTeX version prints floats with three decimals and escapes special characters.
    stem : Path
        The path without suffix, e.g. ``<report>/tables/leaderboard``.

    Returns
    -------
    list of Path
        The CSV, Markdown and LaTeX paths, in :data:`TABLE_FORMATS` order.
    """
    paths = [stem.with_suffix(ext) for ext in TABLE_FORMATS]
    write_table(paths[0], df)
    write_table(paths[1], df)
    write_text(paths[2], df.to_latex(index=False, float_format="%.3f", escape=True))
    return paths


def ece_columns(df: pd.DataFrame) -> list[str]:
    """The top-label ECE columns of a table (``ece_top_<bins>_lohi``), by bin count.

    Parameters
    ----------
    df : DataFrame
        A table of calibration results.

    Returns
    -------
    list of str
        The matching column names, fewest bins first (empty when there are none).
    """
    return sorted((c for c in df.columns if _ECE_COLUMN.match(str(c))),
                  key=lambda c: int(_ECE_COLUMN.match(c).group(1)))


def _tasks(tasks: Sequence[str]) -> str:
    return ("task " if len(tasks) == 1 else "tasks ") + ", ".join(tasks)


def settings_text(groups: Iterable[tuple[Mapping[str, Any], Sequence[str]]],
                  template: str = "{ece_bins} equal-width bins, B={n_boot}") -> str:
    """The settings a table was made with, in words: ``template`` filled with a group's settings, prefixed by
    its tasks when the groups differ (``tasks a, b: 15 equal-width bins, B=1000; task c: ...``).

    Parameters
    ----------
    groups : iterable of (mapping, sequence of str)
        Pairs of (settings, the tasks that used them), one per distinct set of settings.
    template : str, default "{ece_bins} equal-width bins, B={n_boot}"
        ``str.format`` template filled with a group's settings mapping.

    Returns
    -------
    str
        The filled template alone for one group; else one ``task(s) ...: <filled>`` clause per group, joined by
        ``"; "``.
    """
    groups = list(groups)
    if len(groups) == 1:
        return template.format(**groups[0][0])
    return "; ".join(f"{_tasks(tasks)}: {template.format(**s)}" for s, tasks in groups)


def fill_missing(df: pd.DataFrame, reasons: Mapping[str, str] | None = None, default: str = "n/a") -> pd.DataFrame:
    """A copy of ``df`` for printing in which every missing cell says why: ``reasons[column]`` where given, else
    ``default`` (the Markdown writer would leave it blank).

    Parameters
    ----------
    df : DataFrame
        The table to print.
    reasons : mapping of str to str, optional
        Column -> the text its missing cells show (e.g. ``{"rho": "fewer than 3 encoders"}``). A missing
        :data:`CI_NOTE` reads ``none`` unless given here.
    default : str, default "n/a"
        The text of missing cells of other columns.

    Returns
    -------
    DataFrame
        A copy of object dtype with no missing cell.
    """
    out = df.astype(object).copy()
    reasons = {CI_NOTE: "none", **(reasons or {})}  # a row without a note on its interval
    for col in out.columns:
        missing = df[col].isna()
        if missing.any():
            out.loc[missing, col] = reasons.get(str(col), default)
    return out


def integer_columns(df: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """``df`` with ``columns`` (ranks, counts) printed as whole numbers (``2``, not ``2.000``), missing ones kept.

    Parameters
    ----------
    df : DataFrame
        The table to print.
    columns : iterable of str
        Columns to print as integers; those absent from ``df`` are skipped.

    Returns
    -------
    DataFrame
        A copy whose ``columns`` hold Python ints (object dtype), missing values left missing.
    """
    out = df.copy()
    for col in columns:
        if col in out.columns:
            out[col] = [int(v) if pd.notna(v) else v for v in out[col]]
            out[col] = out[col].astype(object)
    return out


def table_or_note(df: pd.DataFrame | None, why: str) -> str:
    """``df`` as Markdown, or the sentence ``why`` when it has no rows or columns (never an empty ``|  |``).

    Parameters
    ----------
    df : DataFrame or None
        The table to print.
    why : str
        Why the table would be empty, as a sentence (capitalised and closed with a full stop here).

    Returns
    -------
    str
        A Markdown table, or the sentence.
    """
    if df is None or len(df) == 0 or len(df.columns) == 0:
        return why[0].upper() + why[1:] + ("" if why.endswith(".") else ".")
    return dataframe_to_markdown(df)
