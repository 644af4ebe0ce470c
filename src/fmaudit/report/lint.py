"""The report lint: what a reader must not miss, flagged after the report is written and before its index.

It reads what the user reads: the report's tables (``tables/*.csv``), the index's Markdown (each table with the
text above it, its caption) and the captions of the HTML report (``resources/report/tables/<name>.rst``). It
flags

- ``few resampling units``: an interval drawn from fewer than :data:`MIN_UNITS` resampling units (a
  ``ci_n_units`` / ``n_units`` count, or the top level of a hierarchical bootstrap over encoders);
- ``caption names what the table lacks``: a caption that names a row (``... ResNet-18 ... row``) or a column
  (```name``` beside the word column) that its table does not have;
- ``detection AUROC below 0.5``: a novelty scorer that ranks an OOD set as more familiar than the
  in-distribution test set (the chapter must say so; the lint makes sure the reader sees it);
- ``blank cell``: an empty cell of an index table, or one that prints a missing value as ``None`` / ``nan`` (a
  missing value must say why: ``n/a``, a bound mark ...);
- ``empty table``: an index table without rows or columns (a sentence must say why instead).

It warns and does not fail the report job: a finding is about how the numbers read, not whether they are
right, and a failed report would hide every table of a run that may have cost GPU-days. The findings go to
``tables/report_lint.csv``, to the job's log as warnings, to one line at the top of ``index.md`` and a list at
its end (:func:`fmaudit.report.write_report`), so that a user sees them where they read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from fmaudit.io import read_table

__all__ = [
    "CAPTIONS",
    "CHECKS",
    "MIN_UNITS",
    "lint_captions",
    "lint_markdown",
    "lint_report",
    "lint_tables",
    "markdown_tables",
]

#: Intervals from fewer resampling units than this are flagged.
MIN_UNITS = 5
CHECKS = (
    "few resampling units",
    "caption names what the table lacks",
    "detection AUROC below 0.5",
    "blank cell",
    "empty table",
)
#: The HTML report's table captions (one per table name).
CAPTIONS = Path(__file__).resolve().parents[3] / "resources" / "report" / "tables"
_COUNT_COLUMNS = ("ci_n_units", "n_units")
#: Cell texts that are a missing value printed as is (a blank, Python's None, a float NaN).
BLANK = ("", "None", "nan", "NaN", "<NA>")
_AUROC_COLUMNS = ("auroc", "mean_auroc")
_NAME = re.compile(r"\b([A-Z][A-Za-z]*-?\d+[A-Za-z0-9-]*)\b")  # model-like names: ResNet-18, ViT-B16, UNI2
_TICKED = re.compile(r"`{1,2}([A-Za-z_][A-Za-z0-9_]*)`{1,2}")


def _finding(check: str, where: str, detail: str) -> dict[str, str]:
    return {"check": check, "where": where, "detail": detail}


def _interval_pairs(columns: Iterable[str]) -> list[tuple[str, str]]:
    cols = list(columns)
    return [(c, c[:-2] + "hi") for c in cols if str(c).endswith("ci_lo") and c[:-2] + "hi" in cols]


def _counts(table: pd.DataFrame) -> tuple[pd.Series, pd.Series] | None:
    """(units per row, unit name per row) for a table whose intervals name their count."""
    for col in _COUNT_COLUMNS:
        if col in table.columns:
            unit = (
                table["ci_unit"]
                if "ci_unit" in table.columns
                else (
                    table["resampling_unit"]
                    if "resampling_unit" in table.columns
                    else pd.Series("unit", index=table.index)
                )
            )
            return pd.to_numeric(table[col], errors="coerce"), unit.astype(str)
    if "unit" in table.columns and "n_encoders" in table.columns:
        hier = table["unit"].astype(str).str.startswith("encoder >")
        counts = pd.to_numeric(table["n_encoders"], errors="coerce").where(hier)
        return counts, pd.Series("encoder (top level of the hierarchical bootstrap)", index=table.index)
    return None


def lint_tables(tables: dict[str, pd.DataFrame]) -> list[dict[str, str]]:
    """Interval counts and detection AUROCs of the report's tables (name -> table).

    Parameters
    ----------
    tables : dict of str to DataFrame
        Table name (the stem of ``tables/<name>.csv``) -> the table as written; note-only tables are skipped.

    Returns
    -------
    list of dict of str to str
        One finding per flagged table and check: ``check`` (``few resampling units`` or ``detection AUROC below
        0.5``), ``where`` (``tables/<name>.csv``) and ``detail``.
    """
    out = []
    for name, table in sorted(tables.items()):
        if "note" in table.columns and len(table.columns) <= 2:
            continue
        pairs = _interval_pairs(table.columns)
        counted = _counts(table)
        if pairs and counted is not None:
            n, unit = counted
            defined = np.zeros(len(table), dtype=bool)
            for lo, hi in pairs:
                defined |= (table[lo].notna() & table[hi].notna()).to_numpy()
            few = defined & (n < MIN_UNITS).fillna(False).to_numpy()
            if few.any():
                sub = pd.DataFrame({"n": n[few], "unit": unit[few]})
                spread = "; ".join(
                    f"{u}: n={int(k)} ({c} rows)" for (u, k), c in sub.groupby(["unit", "n"]).size().items()
                )
                out.append(
                    _finding(
                        "few resampling units",
                        f"tables/{name}.csv",
                        f"{int(few.sum())} of {len(table)} rows have an interval from fewer than "
                        f"{MIN_UNITS} resampling units ({spread}): such an interval says little and "
                        "its bounds can sit on the point.",
                    )
                )
        for col in _AUROC_COLUMNS:
            if col not in table.columns:
                continue
            low = table[pd.to_numeric(table[col], errors="coerce") < 0.5]
            if len(low):
                keys = [c for c in ("scorer", "tier", "condition") if c in low.columns]
                groups = low.groupby(keys[:2], sort=True)[col].agg(["min", "max", "size"]) if keys else None
                detail = (
                    "; ".join(
                        f"{' / '.join(map(str, k if isinstance(k, tuple) else (k,)))}: "
                        f"{r['min']:.2f}-{r['max']:.2f} ({int(r['size'])} rows)"
                        for k, r in groups.iterrows()
                    )
                    if groups is not None
                    else f"{len(low)} rows"
                )
                out.append(
                    _finding(
                        "detection AUROC below 0.5",
                        f"tables/{name}.csv",
                        f"{len(low)} rows with {col} below 0.5 ({detail}): worse than chance, the scorer "
                        "ranks those OOD images as more familiar than the in-distribution ones.",
                    )
                )
                break
    return out


def markdown_tables(text: str) -> list[dict[str, Any]]:
    """Every pipe table of a Markdown text: ``heading`` (the last heading above it), ``caption`` (the text between
    that heading, or the previous table, and the table), ``header`` and ``rows`` (lists of cell texts).

    Parameters
    ----------
    text : str
        Markdown, e.g. the report's ``index.md``.

    Returns
    -------
    list of dict
        One dict per table in the order of the text, with the keys above; a table without columns has an empty
        ``header`` and ``rows``.
    """
    lines = text.splitlines()
    out, heading, caption = [], "(top)", []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("#"):
            heading, caption = line.lstrip("#").strip(), []
            i += 1
            continue
        if re.match(r"^\|\s*\|$", line):  # a table without columns (what an empty frame renders as)
            out.append({"heading": heading, "caption": " ".join(caption), "header": [], "rows": []})
            caption = []
            while i < len(lines) and re.match(r"^\|\s*\|$", lines[i].strip()):
                i += 1
            continue
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|(\s*-{3,}\s*\|)*\s*$", lines[i + 1].strip()):
            header = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append({"heading": heading, "caption": " ".join(caption), "header": header, "rows": rows})
            caption = []
            continue
        if line:
            caption.append(line)
        i += 1
    return out


def _cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def _named(caption: str) -> tuple[set[str], set[str]]:
    """(row names, column names) a caption says its table has: model-like names in a sentence about a row, and
    ticked identifiers in a sentence about a column."""
    rows, cols = set(), set()
    for sentence in re.split(r"(?<=[.;:])\s+", caption):
        low = sentence.lower()
        if re.search(r"\brows?\b", low):
            rows |= set(_NAME.findall(sentence))
        if re.search(r"\bcolumns?\b", low):
            cols |= {t for t in _TICKED.findall(sentence) if "_" in t}
    return rows, cols


def _lacks(caption: str, header: Iterable[str], cells: Iterable[str]) -> list[str]:
    rows, cols = _named(caption)
    header = [str(h) for h in header]
    text = " ".join(header + [str(c) for c in cells]).lower()
    missing = [f"row {r!r}" for r in sorted(rows) if r.lower() not in text]
    missing += [f"column {c!r}" for c in sorted(cols) if c not in header and c.lower() not in text]
    return missing


def lint_markdown(text: str, where: str = "index.md") -> list[dict[str, str]]:
    """Blank cells, empty tables and captions that name what their table lacks, in a Markdown text.

    Parameters
    ----------
    text : str
        The Markdown to check (the report's ``index.md`` before it is written).
    where : str, default "index.md"
        The file named in the findings.

    Returns
    -------
    list of dict of str to str
        Findings ``check`` (``empty table``, ``blank cell`` or ``caption names what the table lacks``), ``where``
        (the file and the heading above the table) and ``detail``.
    """
    out = []
    for t in markdown_tables(text):
        place = f'{where}, under "{t["heading"]}"'
        if not any(h for h in t["header"]) or not t["rows"]:
            out.append(
                _finding(
                    "empty table",
                    place,
                    "a table without "
                    + ("columns" if not any(t["header"]) else "rows")
                    + "; print a sentence saying why instead.",
                )
            )
            continue
        blank = sorted(
            {
                t["header"][j] if j < len(t["header"]) else f"column {j + 1}"
                for r in t["rows"]
                for j, c in enumerate(r)
                if c in BLANK
            }
        )
        if blank:
            n = sum(c in BLANK for r in t["rows"] for c in r)
            out.append(
                _finding(
                    "blank cell",
                    place,
                    f"{n} blank cells (columns {', '.join(blank)}): a missing value must "
                    "say why (n/a with a reason, a bound mark).",
                )
            )
        missing = _lacks(t["caption"], t["header"], [c for r in t["rows"] for c in r])
        if missing:
            out.append(
                _finding(
                    "caption names what the table lacks",
                    place,
                    f"the text above the table names {', '.join(missing)}, which the table does not have.",
                )
            )
    return out


def lint_captions(tables: dict[str, pd.DataFrame], captions: Path = CAPTIONS) -> list[dict[str, str]]:
    """The HTML report's caption of each table (its template text) against the table.

    Parameters
    ----------
    tables : dict of str to DataFrame
        Table name -> the table as written.
    captions : Path, default CAPTIONS
        Folder of the caption templates ``<name>.rst``; tables without one are skipped. Template tags and the text
        inside ``{% if %}`` blocks are not judged.

    Returns
    -------
    list of dict of str to str
        Findings ``check`` = ``caption names what the table lacks``, ``where`` (the template) and ``detail``.
    """
    out = []
    for name, table in sorted(tables.items()):
        path = Path(captions) / f"{name}.rst"
        if not path.exists() or ("note" in table.columns and len(table.columns) <= 2):
            continue
        # text inside a template conditional depends on the params, so it is not judged; template output is no name
        text = re.sub(r"\{%\s*if\b.*?\{%\s*endif\s*%\}", " ", path.read_text(), flags=re.S)
        text = re.sub(r"\{%.*?%\}|\{\{.*?\}\}", " ", text)
        cells = [str(v) for v in table.astype(str).to_numpy().ravel()]
        missing = _lacks(text, table.columns, cells)
        if missing:
            out.append(
                _finding(
                    "caption names what the table lacks",
                    f"resources/report/tables/{name}.rst",
                    f"names {', '.join(missing)}, which tables/{name}.csv does not have.",
                )
            )
    return out


def lint_report(index_markdown: str, out_dir: str | Path, captions: Path = CAPTIONS) -> pd.DataFrame:
    """Every finding of the lint on a written report (module doc): columns ``check``, ``where``, ``detail``.

    Parameters
    ----------
    index_markdown : str
        The index's Markdown as the chapters returned it.
    out_dir : str or Path
        The report folder whose ``tables/*.csv`` are read (``report_lint`` itself aside).
    captions : Path, default CAPTIONS
        Folder of the HTML report's caption templates.

    Returns
    -------
    DataFrame
        One row per finding, columns ``check`` (one of :data:`CHECKS`), ``where`` and ``detail``; no rows when
        nothing is flagged.
    """
    out_dir = Path(out_dir)
    tables, empty = {}, []
    for path in sorted((out_dir / "tables").glob("*.csv")):
        if path.stem == "report_lint":
            continue
        try:
            tables[path.stem] = read_table(path)
        except pd.errors.EmptyDataError:  # written from a frame without columns
            empty.append(_finding("empty table", f"tables/{path.name}", "a table file without columns; write a "
                                  "note row saying why instead."))
    findings = empty + lint_tables(tables) + lint_markdown(index_markdown) + lint_captions(tables, captions)
    return pd.DataFrame(findings, columns=["check", "where", "detail"])
