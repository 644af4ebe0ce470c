"""Reading the small .xlsx tables some releases ship (SICAPv2's partitions and slide labels).

pandas reads .xlsx through openpyxl, which is not among fmaudit's pinned dependencies; when it is missing,
a reader written on the standard library (zipfile + ElementTree) handles the plain tables these releases
hold: first worksheet, first row as header, shared / inline strings, numbers and booleans. Formulas are
read as their cached values; dates are not converted (none of the tables read here has dates).
"""

from __future__ import annotations

import importlib.util
import re
import zipfile
from pathlib import Path, PurePosixPath
from xml.etree import ElementTree as ET

import pandas as pd

from fmaudit.io import FmauditInputError

_MAIN = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_PKG = "{http://schemas.openxmlformats.org/package/2006/relationships}"


def read_table_any(path: str | Path) -> pd.DataFrame:
    """A .csv or .xlsx table as a DataFrame (xlsx via openpyxl when installed, else the built-in reader)."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return pd.read_csv(path)
    if importlib.util.find_spec("openpyxl") is None:  # pandas reads xlsx through openpyxl only
        return read_xlsx_stdlib(path)
    return pd.read_excel(path)


def _col_index(ref: str) -> int:
    letters = re.match(r"[A-Z]+", ref).group(0)
    n = 0
    for ch in letters:
        n = n * 26 + (ord(ch) - 64)
    return n - 1


def _text(node) -> str:
    return "".join(t.text or "" for t in node.iter(f"{_MAIN}t"))


def _number(s: str):
    v = float(s)
    return int(v) if v.is_integer() and "e" not in s.lower() and "." not in s else v


def read_xlsx_stdlib(path: str | Path) -> pd.DataFrame:
    """First worksheet of an .xlsx file as a DataFrame, first row as header, using only the standard library."""
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise FmauditInputError(f"{path}: not a readable .xlsx file ({e})") from e
    with zf:
        names = set(zf.namelist())
        try:
            workbook = ET.fromstring(zf.read("xl/workbook.xml"))
            rels = ET.fromstring(zf.read("xl/_rels/workbook.xml.rels"))
        except KeyError as e:
            raise FmauditInputError(f"{path}: not a readable .xlsx file (missing {e})") from e
        first = workbook.find(f"{_MAIN}sheets/{_MAIN}sheet")
        if first is None:
            raise FmauditInputError(f"{path}: the workbook has no worksheet")
        rid = first.get(f"{_REL}id")
        target = next((r.get("Target") for r in rels.iter(f"{_PKG}Relationship") if r.get("Id") == rid), None)
        if target is None:
            raise FmauditInputError(f"{path}: cannot find the first worksheet")
        sheet_path = target.lstrip("/") if target.startswith("/") else str(PurePosixPath("xl") / target)
        shared: list[str] = []
        if "xl/sharedStrings.xml" in names:
            shared = [_text(si) for si in ET.fromstring(zf.read("xl/sharedStrings.xml")).iter(f"{_MAIN}si")]
        sheet = ET.fromstring(zf.read(sheet_path))

    rows: dict[int, dict[int, object]] = {}
    for r_i, row in enumerate(sheet.iter(f"{_MAIN}row")):
        r = int(row.get("r", r_i + 1)) - 1
        cells: dict[int, object] = {}
        for c_i, c in enumerate(row.iter(f"{_MAIN}c")):
            ref = c.get("r")
            col = _col_index(ref) if ref else c_i
            kind = c.get("t", "n")
            v = c.find(f"{_MAIN}v")
            if kind == "inlineStr":
                is_ = c.find(f"{_MAIN}is")
                value = _text(is_) if is_ is not None else ""
            elif v is None or v.text is None:
                continue
            elif kind == "s":
                value = shared[int(v.text)]
            elif kind == "b":
                value = v.text == "1"
            elif kind in ("str", "e"):
                value = v.text
            else:
                value = _number(v.text)
            cells[col] = value
        rows[r] = cells
    if not rows:
        return pd.DataFrame()
    header_row = min(rows)
    header = rows[header_row]
    n_cols = max((max(c) + 1 for c in rows.values() if c), default=0)
    columns = [str(header.get(j, f"Unnamed: {j}")) for j in range(n_cols)]
    body = [[rows[r].get(j) for j in range(n_cols)] for r in sorted(rows) if r != header_row and rows[r]]
    return pd.DataFrame(body, columns=columns)
