"""The standard-library xlsx reader against files with inline and shared strings."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pandas as pd
import pytest

from fmaudit.datasets.public import (
    read_xlsx_stdlib,
)
from fmaudit.io import FmauditInputError


def _cell(ref: str, value, shared: list | None) -> str:
    if isinstance(value, str):
        if shared is not None:
            shared.append(value)
            return f'<c r="{ref}" t="s"><v>{len(shared) - 1}</v></c>'
        return f'<c r="{ref}" t="inlineStr"><is><t>{value}</t></is></c>'
    return f'<c r="{ref}"><v>{value}</v></c>'


def write_xlsx(path: Path, df: pd.DataFrame, shared_strings: bool = False) -> Path:
    """A minimal, valid .xlsx (one worksheet) written with the standard library."""
    main = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    shared: list | None = [] if shared_strings else None
    rows = []
    for r, values in enumerate([list(df.columns)] + df.values.tolist(), start=1):
        cells = "".join(_cell(f"{chr(65 + c)}{r}", v, shared) for c, v in enumerate(values))
        rows.append(f'<row r="{r}">{cells}</row>')
    sheet = (f'<?xml version="1.0" encoding="UTF-8"?><worksheet xmlns="{main}">'
             f'<sheetData>{"".join(rows)}</sheetData></worksheet>')
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>')
        z.writestr("xl/workbook.xml",
                   f'<?xml version="1.0"?><workbook xmlns="{main}" '
                   'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
                   '<sheets><sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>')
        z.writestr("xl/_rels/workbook.xml.rels",
                   '<?xml version="1.0"?>'
                   '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   '<Relationship Id="rId1" '
                   'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" '
                   'Target="worksheets/sheet1.xml"/></Relationships>')
        z.writestr("xl/worksheets/sheet1.xml", sheet)
        if shared is not None:
            sis = "".join(f"<si><t>{s}</t></si>" for s in shared)
            z.writestr("xl/sharedStrings.xml", f'<?xml version="1.0"?><sst xmlns="{main}">{sis}</sst>')
    return path


@pytest.mark.parametrize("shared", [False, True])
def test_read_xlsx_stdlib_round_trip(tmp_path, shared):
    df = pd.DataFrame({"image_name": ["a.jpg", "b.jpg"], "NC": [1, 0], "G3": [0, 1], "score": [0.5, 2.25]})
    out = read_xlsx_stdlib(write_xlsx(tmp_path / "t.xlsx", df, shared_strings=shared))
    assert out.to_dict("list") == df.to_dict("list")
    (tmp_path / "bad.xlsx").write_bytes(b"nope")
    with pytest.raises(FmauditInputError, match="not a readable .xlsx"):
        read_xlsx_stdlib(tmp_path / "bad.xlsx")
