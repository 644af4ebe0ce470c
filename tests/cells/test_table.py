"""``cell_table``: cells on the user's own slides as sections of the cell branch, coordinates in px or µm."""

from __future__ import annotations

import pandas as pd
import pytest

from fmaudit.cells.prepare import CELL_MANIFEST_COLUMNS
from fmaudit.cells.table import cell_table_sections, check_cell_table, read_cell_table, table_section
from fmaudit.io import FmauditInputError
from fmaudit.registry import load_dataset_registries
from own_data_utils import CELL_CLASSES, write_cell_study


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("cells")
    slides, cells = write_cell_study(root, per_class=6)
    return slides, cells


def _params(slides, cells, **extra):
    params = {"slides": str(slides), "cells": str(cells), "units": "um", "classes": list(CELL_CLASSES),
              "coarse": {"tumour cell": "epithelial", "lymphocyte": "immune", "fibroblast": "stromal"},
              "min_cells_per_class": 3, **extra}
    return load_dataset_registries(entries={"c": {"kind": "cell_table", "params": params}})["c"]["params"]


def test_a_slide_of_a_cell_table_is_a_section_in_level0_pixels(study):
    slides, cells = study
    params = _params(slides, cells)
    assert cell_table_sections(params) == {"lung-0": "lung", "lung-1": "lung", "colon-0": "colon", "colon-1": "colon"}
    result = table_section("lung-0", "lung", "c", params)
    man = result.manifest
    assert list(man.columns) == list(CELL_MANIFEST_COLUMNS) and result.eligible
    table = pd.read_csv(cells)
    mine = table[table["slide"] == "lung-0"]
    # µm -> level-0 px of this 0.5 µm/px slide
    assert man["he_x"].tolist() == pytest.approx((mine["x"] / 0.5).tolist())
    assert man["item_id"].tolist() == [f"lung-0/{c}" for c in mine["cell_id"]]
    assert set(man["label_coarse_name"]) == {"epithelial", "immune", "stromal"} and (man["mpp"] == 0.5).all()
    px = table_section("lung-0", "lung", "c", _params(slides, cells, units="px"))  # the same numbers as pixels
    assert px.manifest["he_x"].tolist() == pytest.approx(mine["x"].tolist())


def test_bad_cells_are_named_by_line(study, tmp_path):
    slides, cells = study
    table = pd.read_csv(cells, dtype=str)
    table.loc[3, "label"] = "lymphocytes"
    table.loc[5, "slide"] = "lung-9"
    table.loc[7, "x"] = "12,5"
    bad = tmp_path / "cells.csv"
    table.to_csv(bad, index=False)
    with pytest.raises(FmauditInputError) as e:
        read_cell_table("c", _params(slides, bad))
    msg = str(e.value)
    assert "cells.csv: 3 problem(s)" in msg and "line 5: unknown class 'lymphocytes'; did you mean 'lymphocyte'?" in msg
    assert "line 7: slide sheet" in msg and "unknown slide 'lung-9'" in msg
    assert "line 9: x '12,5' is not a number" in msg
    with pytest.raises(FmauditInputError, match=r"coarse: give a coarse class for every fine class; missing: "
                                                r"\['fibroblast'\]"):
        check_cell_table("c", _params(slides, cells, coarse={"tumour cell": "e", "lymphocyte": "i"}))
    with pytest.raises(FmauditInputError, match="section 'lung-0' is under organ 'colon'"):
        check_cell_table("c", _params(slides, cells), organ_of={"lung-0": "colon"})
    far = pd.read_csv(cells)
    far.loc[0, "x"] = 10_000.0
    far.to_csv(tmp_path / "far.csv", index=False)
    with pytest.raises(FmauditInputError, match=r"far.csv: 1 cell\(s\) of slide 'lung-0' lie outside its 512x512-px "
                                                r"level 0 \(lines 2; units: um, 0.5 µm/px\)"):
        table_section("lung-0", "lung", "c", _params(slides, tmp_path / "far.csv"))
