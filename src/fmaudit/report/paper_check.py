"""The report's "Paper check" chapter: every claim of the config's claims files (``claims``) checked against the
tables the other chapters of this report wrote (:mod:`fmaudit.claims`): the published value, this run's value with
its interval where the table has one, and reproduced / not reproduced / not computable with why.

The chapter is written last and reads the report's own ``tables/*.csv``, the same files ``fmaudit check-claims
--results`` reads, so both give the same verdicts. Its results are the loaded claims files (None without any).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from fmaudit.claims import NOT_COMPUTABLE, NOT_REPRODUCED, REPRODUCED, ClaimsFile, ResultTables, check_claims
from fmaudit.io import dataframe_to_markdown
from fmaudit.report.chapter import Chapter, ReportWriter

PAPER_CHECK = "Paper check"
TABLES = {"paper_check": PAPER_CHECK}
FIGURES: dict[str, str] = {}
NOTE = "no claims file in the config (config claims)"

__all__ = ["CHAPTER", "FIGURES", "TABLES", "paper_check_markdown"]


def _number(value: Any) -> str:
    v = float(value)
    if not np.isfinite(v):
        return "—"
    return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"


def paper_check_markdown(table: pd.DataFrame) -> str:
    """One row per claim: the quote, published value, this run's value [interval], the criterion and verdict.

    Parameters
    ----------
    table : DataFrame
        The verdicts of :func:`fmaudit.claims.check_claims`: ``paper``, ``claim``, ``quote``, ``published``,
        ``value``, ``value_interval_lo``/``value_interval_hi``, ``criterion``, ``status`` and ``why``.

    Returns
    -------
    str
        The Markdown table; numbers three decimals (one from 100 on), missing ones ``—``.
    """
    rows = []
    for r in table.to_dict("records"):
        value = _number(r["value"])
        if np.isfinite(float(r["value_interval_lo"])):
            value += f" [{_number(r['value_interval_lo'])}, {_number(r['value_interval_hi'])}]"
        verdict = r["status"] if r["status"] != NOT_COMPUTABLE else f"{r['status']}: {r['why']}"
        rows.append({"paper": r["paper"], "claim": r["claim"], "the paper says": r["quote"],
                     "published": _number(r["published"]), "this run": value, "reproduced if": r["criterion"],
                     "verdict": verdict})
    return dataframe_to_markdown(pd.DataFrame(rows))


def write_paper_check_chapter(results: Sequence[ClaimsFile] | None, writer: ReportWriter) -> list[str]:
    """Check every claim against the tables the chapters before it wrote under the writer's folder; write
    ``paper_check``.

    Parameters
    ----------
    results : sequence of ClaimsFile or None
        The loaded claims files of the config (``claims``); ``None`` or empty: a note, and no index lines.
    writer : ReportWriter
        The writer the earlier chapters wrote through; its ``tables/`` are the values checked.

    Returns
    -------
    list of str
        The chapter's heading, the count of each verdict and the claims table; empty without claims.
    """
    if not results:
        writer.table("paper_check", pd.DataFrame({"note": [NOTE]}))
        return []
    table = check_claims(list(results), ResultTables(writer.out_dir / "tables"))
    writer.table("paper_check", table)
    counts = table["status"].value_counts()
    summary = ", ".join(f"{int(counts.get(s, 0))} {s}" for s in (REPRODUCED, NOT_REPRODUCED, NOT_COMPUTABLE))
    papers = ", ".join(f"{f.paper} ({f.title})" if f.title else f.paper for f in results)
    return ["## Paper check", "",
            f"The headline claims of {papers}, each checked against this run's tables (the quantity and the rows it "
            f"reads are in `tables/paper_check.csv`, column why): {summary}. A value's interval is the table's "
            "own where the claim reads a single row.", "", paper_check_markdown(table), ""]


CHAPTER = Chapter("paper_check", TABLES, FIGURES, write_paper_check_chapter, reads=("claims",))
