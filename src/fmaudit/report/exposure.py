"""The exposure audit in the report: its own table (every evaluated encoder x data set with the evidence), and
the ``exposure`` column every table that ranks encoders carries beside the encoder (hema paper: report exposure
status rather than assume its effect). Formatting only: the audit comes from :mod:`fmaudit.exposure`."""

from __future__ import annotations

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.chapter import Chapter, ReportWriter

__all__ = ["CHAPTER", "exposure_labels", "with_exposure"]

NOT_AUDITED = "not audited"
ORDER = ("yes", "unknown", "no")


def exposure_labels(audit: pd.DataFrame | None) -> dict[str, str]:
    """encoder -> its statuses in words, e.g. ``yes: mll23-wbc5, raabin-wbc; no: bloodmnist-wbc5``.

    Parameters
    ----------
    audit : DataFrame or None
        The exposure audit (:mod:`fmaudit.exposure`): one row per (encoder, data set) with ``encoder``, ``dataset``
        and ``exposure`` (``yes``, ``unknown`` or ``no``).

    Returns
    -------
    dict of str to str
        Encoder -> its statuses, ``yes`` first, each with its data sets; empty without an audit.
    """
    if audit is None or len(audit) == 0:
        return {}
    out = {}
    for enc, rows in audit.groupby("encoder", sort=False):
        parts = [f"{status}: {', '.join(rows.loc[rows['exposure'] == status, 'dataset'])}"
                 for status in ORDER if (rows["exposure"] == status).any()]
        out[str(enc)] = "; ".join(parts)
    return out


def with_exposure(table: pd.DataFrame, audit: pd.DataFrame | None, column: str = "encoder") -> pd.DataFrame:
    """``table`` with an ``exposure`` column right after ``column`` (pretraining exposure of that encoder to the
    evaluated data sets); unchanged without an audit or without that column.

    Parameters
    ----------
    table : DataFrame
        A table that ranks encoders.
    audit : DataFrame or None
        The exposure audit, as :func:`exposure_labels` takes it.
    column : str, default "encoder"
        The column naming the encoder; encoders missing from the audit read ``not audited``.

    Returns
    -------
    DataFrame
        A copy with the ``exposure`` column inserted, or ``table`` itself.
    """
    if audit is None or table is None or column not in getattr(table, "columns", ()):
        return table
    labels = exposure_labels(audit)
    out = table.copy()
    out.insert(out.columns.get_loc(column) + 1, "exposure",
               [labels.get(str(v), NOT_AUDITED) for v in out[column]])
    return out


def write_exposure_chapter(audit: pd.DataFrame | None, writer: ReportWriter) -> list[str]:
    """Write the ``exposure_audit`` table; return the chapter's lines of ``index.md``.

    Parameters
    ----------
    audit : DataFrame or None
        The exposure audit (:mod:`fmaudit.exposure`), one row per evaluated (encoder, data set) pair with its
        evidence; ``None`` or empty: a note that no pair was evaluated.
    writer : ReportWriter
        Where the table goes.

    Returns
    -------
    list of str
        The chapter's heading, how the statuses were decided, and the table as Markdown.
    """
    if audit is None or len(audit) == 0:
        audit = pd.DataFrame({"note": ["no (encoder, data set) pair was evaluated"]})
    writer.table("exposure_audit", audit)
    return ["## Pretraining exposure", "",
            "Whether each encoder's pretraining data include each evaluated data set (fmaudit.exposure: the registry's "
            "declared facts, then its pretraining corpora matched against the data sets' names and aliases; a corpus "
            "that does not name a data set is `unknown`, never `no`). Tables that rank encoders carry the same status "
            "in their `exposure` column.", "", dataframe_to_markdown(audit), ""]


CHAPTER = Chapter("exposure", {"exposure_audit": "Exposure"}, {}, write_exposure_chapter,
                  reads=(), settings=("exposure",))
