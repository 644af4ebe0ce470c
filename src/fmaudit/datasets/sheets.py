"""The sheets of a user's own data sets: CSV or TSV tables read as text, every problem named by file, line and column.

Conventions shared by every own-data kind (:mod:`fmaudit.datasets.own`, :mod:`fmaudit.cells.table`):

- A sheet is comma-separated (``.csv``) or tab-separated (``.tsv``, ``.tab``, ``.txt``), UTF-8 with or without
  the byte-order mark spreadsheet programs write. Every cell is text (ids such as ``007`` stay text); cells are
  stripped; an empty cell is a missing value. Column names are matched case-insensitively.
- Lines are the file's lines, the header being line 1, so ``line 14`` is what an editor shows.
- File paths in a sheet are relative to the sheet's folder (or absolute).
- Labels are class names; the entry lists the classes (``classes``) in label order. A label outside them, or an
  empty label where labels are required, is an error naming the line; no item silently becomes unlabelled.
- A ``split`` column, when present, gives every row's split (``train``, ``val`` or ``test``); otherwise the
  data set is split automatically (:func:`fmaudit.datasets.own.automatic_split`).

Every reader collects the problems of all rows and raises one :class:`~fmaudit.io.FmauditInputError` listing
them (the first :data:`MAX_PROBLEMS`, with the total), so a user fixes a sheet in one pass.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import unknown_name_error

__all__ = ["LINE_COLUMN", "MAX_PROBLEMS", "SheetProblems", "check_splits_per_group", "item_ids_from_paths",
           "labels_from_names", "read_sheet", "resolve_paths", "sheet_separator"]

#: Column added to every sheet read: the line of the file the row came from (header = line 1).
LINE_COLUMN = "sheet_line"
MAX_PROBLEMS = 10
SPLIT_VALUES = ("train", "val", "test")
_TAB_SUFFIXES = (".tsv", ".tab", ".txt")


class SheetProblems:
    """The problems found in one sheet; :meth:`raise_if_any` raises one error listing them.

    Parameters
    ----------
    sheet : str or Path
        The sheet's path, the head of the error message.
    what : str
        What the sheet is, in the message (e.g. ``image sheet``; default ``sheet``).
    """

    def __init__(self, sheet: PathLike, what: str = "sheet"):
        self.sheet = str(sheet)
        self.what = what
        self.lines: list[str] = []

    def add(self, line: int | None, message: str) -> None:
        """Record one problem, on a line of the sheet or of the sheet as a whole.

        Parameters
        ----------
        line : int or None
            The file line (header = 1); None for a problem of the whole sheet (a missing column, a group on two splits).
        message : str
            What is wrong, naming the column and the value.
        """
        self.lines.append(f"line {line}: {message}" if line is not None else message)

    def raise_if_any(self) -> None:
        """Raise one error listing the first :data:`MAX_PROBLEMS` problems and their total; nothing when there are none.

        Raises
        ------
        FmauditInputError
            When at least one problem was added.
        """
        if not self.lines:
            return
        shown = "\n".join(f"  - {p}" for p in self.lines[:MAX_PROBLEMS])
        more = len(self.lines) - MAX_PROBLEMS
        tail = f"\n  ... and {more} more" if more > 0 else ""
        raise FmauditInputError(f"{self.sheet}: {len(self.lines)} problem(s) in this {self.what}:\n{shown}{tail}")


def sheet_separator(path: PathLike) -> str:
    """``\\t`` for .tsv/.tab/.txt files, ``,`` otherwise.

    Parameters
    ----------
    path : str or Path
        The sheet's path; only its suffix is read (case-insensitive).

    Returns
    -------
    str
        The separator ``pandas.read_csv`` is given.
    """
    return "\t" if Path(path).suffix.lower() in _TAB_SUFFIXES else ","


def read_sheet(path: PathLike, required: Sequence[str], optional: Sequence[str] = (), *,
               non_empty: Sequence[str] = (), what: str = "sheet") -> pd.DataFrame:
    """The sheet's rows as text (``<NA>`` for empty cells), columns lower-cased, with :data:`LINE_COLUMN`.

    Unknown or missing columns, an empty sheet and an empty cell in a ``non_empty`` column are errors naming
    the file (and the line).

    Parameters
    ----------
    path : str or Path
        The .csv or .tsv/.tab/.txt sheet.
    required : sequence of str
        Lower-case column names the sheet must have.
    optional : sequence of str
        Lower-case column names it may have; any other column is an error.
    non_empty : sequence of str
        Columns in which an empty cell is an error (each line named).
    what : str
        What the sheet is, in error messages (e.g. ``image sheet``).

    Returns
    -------
    DataFrame
        One row per non-blank data line, the sheet's columns (lower-cased, string dtype, cells stripped, NA for empty)
        and :data:`LINE_COLUMN` (int64 file line); index reset.

    Raises
    ------
    FileNotFoundError
        When ``path`` is not a file.
    FmauditInputError
        When the file does not parse, has unknown or missing columns, no rows, or empty ``non_empty`` cells.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} not found (relative to {Path.cwd()})")
    try:
        raw = pd.read_csv(path, sep=sheet_separator(path), dtype=str, keep_default_na=False, encoding="utf-8-sig",
                          skip_blank_lines=True)
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        kind = "TSV" if sheet_separator(path) == "\t" else "CSV"
        raise FmauditInputError(f"{path}: cannot read this {what} as {kind} ({e})") from e
    raw.columns = [str(c).strip().lower() for c in raw.columns]
    known = list(required) + list(optional)
    unknown = [c for c in raw.columns if c not in known]
    if unknown:
        raise FmauditInputError(f"{path}: unknown column(s) {unknown}; a {what} has the columns "
                                f"{', '.join(required)} and optionally {', '.join(optional) or 'none'}")
    missing = [c for c in required if c not in raw.columns]
    if missing:
        found = ", ".join(raw.columns) or "none"
        raise FmauditInputError(f"{path}: missing column(s) {missing} (found: {found}); a {what} has the columns "
                                f"{', '.join(required)} and optionally {', '.join(optional) or 'none'}")
    if len(raw) == 0:
        raise FmauditInputError(f"{path}: the {what} has no rows")
    sheet = raw.apply(lambda col: col.str.strip()).replace("", pd.NA).astype("string")
    # pandas skips blank lines, so the file line of each row is counted from the raw text
    sheet[LINE_COLUMN] = _data_lines(path)[: len(sheet)]
    problems = SheetProblems(path, what)
    for col in non_empty:
        if col in sheet.columns:
            for line in sheet.loc[sheet[col].isna(), LINE_COLUMN]:
                problems.add(int(line), f"empty {col!r}")
    problems.raise_if_any()
    return sheet.reset_index(drop=True)


def _data_lines(path: Path) -> np.ndarray:
    """1-based file line of every non-blank data row (quoted newlines inside a cell are rare in these sheets)."""
    text = path.read_text(encoding="utf-8-sig").splitlines()
    lines = [i + 1 for i, line in enumerate(text) if line.strip()]
    return np.asarray(lines[1:], dtype=np.int64)


def resolve_paths(sheet: PathLike, values: Iterable[str]) -> list[str]:
    """Paths of a sheet's cells, taken relative to the sheet's folder unless absolute (as text).

    Parameters
    ----------
    sheet : str or Path
        The sheet's path; relative cells are taken from its folder.
    values : iterable of str
        The cells.

    Returns
    -------
    list of str
        One path per cell, in order; absolute cells unchanged.
    """
    base = Path(sheet).parent
    return [str(p if Path(p).is_absolute() else base / p) for p in values]


def labels_from_names(sheet: pd.DataFrame, classes: Sequence[str], problems: SheetProblems, *,
                      column: str = "label", required: bool = True, dataset: str = "") -> pd.Series:
    """Integer labels (Int64, the position in ``classes``) of a sheet's class-name column; an empty cell is an
    error when ``required`` (else NA: an unlabelled item) and a name outside ``classes`` always is.

    Parameters
    ----------
    sheet : DataFrame
        A sheet from :func:`read_sheet` (with :data:`LINE_COLUMN`).
    classes : sequence of str
        The entry's class names, in label order.
    problems : SheetProblems
        Collector the problems are added to (raised later, all at once, by its ``raise_if_any``).
    column : str
        The column of class names (default ``label``).
    required : bool
        Whether an empty cell (or a missing column) is a problem (default true).
    dataset : str
        The data set's slug, named in the messages (empty: not named).

    Returns
    -------
    Series
        Int64 labels on the sheet's index, NA where the cell is empty or the class unknown.
    """
    index = {name: i for i, name in enumerate(classes)}
    of = f" of data set {dataset!r}" if dataset else ""
    out = pd.Series(pd.NA, index=sheet.index, dtype="Int64")
    if column not in sheet.columns:
        if required:
            problems.add(None, f"no {column!r} column, and labels are required (labels_required: false for "
                               "unlabelled data)")
        return out
    for i, (name, line) in enumerate(zip(sheet[column], sheet[LINE_COLUMN])):
        if pd.isna(name):
            if required:
                problems.add(int(line), f"empty {column!r}; every item needs a class{of} ({', '.join(classes)}), "
                                        "or set labels_required: false to keep unlabelled items")
            continue
        if name not in index:
            problems.add(int(line), str(unknown_name_error("class", str(name), list(classes), "").args[0]) + of)
            continue
        out.iloc[i] = index[name]
    return out


def check_splits_per_group(sheet: pd.DataFrame, group_col: str, problems: SheetProblems) -> None:
    """A sheet's ``split`` column: every value train/val/test, and one split per group (a group on two splits
    is leakage), each problem naming its lines.

    Parameters
    ----------
    sheet : DataFrame
        A sheet from :func:`read_sheet`; nothing is checked when it has no ``split`` column.
    group_col : str
        The column that names the group (the entry's ``group_by``: ``patient`` or ``slide``).
    problems : SheetProblems
        Collector the problems are added to (raised later, all at once, by its ``raise_if_any``).
    """
    if "split" not in sheet.columns:
        return
    for value, line in zip(sheet["split"], sheet[LINE_COLUMN]):
        if pd.isna(value):
            problems.add(int(line), "empty 'split'; give every row a split (train, val, test) or drop the column "
                                    "for an automatic split")
        elif value not in SPLIT_VALUES:
            problems.add(int(line), f"split {value!r} is not one of {', '.join(SPLIT_VALUES)}")
    named = sheet.dropna(subset=["split", group_col])
    per_group = named.groupby(group_col)["split"].nunique()
    for group in per_group[per_group > 1].index:
        rows = named[named[group_col] == group]
        shown = ", ".join(f"line {int(line)}: {s}" for line, s in zip(rows[LINE_COLUMN], rows["split"]))
        problems.add(None, f"{group_col} {group!r} is on several splits ({shown}); its items must share one split")


def item_ids_from_paths(sheet: pd.DataFrame, column: str, problems: SheetProblems) -> pd.Series:
    """Filename-safe, unique item ids from a path column (``scanner1/tile 01.png`` -> ``scanner1__tile_01.png``);
    two rows with the same id (the same file twice) are an error naming both lines.

    Parameters
    ----------
    sheet : DataFrame
        A sheet from :func:`read_sheet`.
    column : str
        The path (or id) column the ids are made from.
    problems : SheetProblems
        Collector the problems are added to (raised later, all at once, by its ``raise_if_any``).

    Returns
    -------
    Series
        String ids on the sheet's index: separators become ``__``, other unsafe characters ``_``, and an id that would
        not start with a letter or digit gets a leading ``i``.
    """
    ids = sheet[column].astype(str).map(_safe_id)
    seen: dict[str, int] = {}
    for item, line in zip(ids, sheet[LINE_COLUMN]):
        if item in seen:
            problems.add(int(line), f"{column} gives item id {item!r}, as line {seen[item]} does: one row per file")
        else:
            seen[item] = int(line)
    return ids.astype("string")


def _safe_id(path: str) -> str:
    text = re.sub(r"^[./\\]+", "", path.replace("\\", "/")).replace("/", "__")
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", text)
    return text if re.match(r"^[A-Za-z0-9]", text) else f"i{text}"
