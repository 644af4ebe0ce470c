"""Slide sheets (validated against their schema, errors naming the row and key) and the slide_tiles preparer on the
real slide."""

from __future__ import annotations

import numpy as np
import pytest

from fmaudit.io import FmauditInputError
from fmaudit.slides import (
    tile_coordinates,
)

SHEET_HEADER = "slide_id\tpath\tgroup\tdomain\tlabel\tlabel_name\n"


def _write_sheet(path, rows, header=SHEET_HEADER):
    path.write_text(header + "".join("\t".join(r) + "\n" for r in rows))
    return path


def test_registry_entry_tiles_the_real_slide(monkeypatch):
    import yaml

    from fmaudit.datasets import prepare_dataset
    from fmaudit.datasets.manifest import validate_manifest
    from slide_utils import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)  # sheet and slide paths are relative to the working directory
    entry = yaml.safe_load((REPO_ROOT / "resources" / "datasets.yaml").read_text())["cmu-small-region"]
    manifest = prepare_dataset("cmu-small-region", entry["preparer"], "unused", entry["params"])
    validate_manifest(manifest)
    p = entry["params"]
    expected = tile_coordinates(
        "resources/data/CMU-1-Small-Region.svs", p["target_mpp"], p["tile_size"],
        p["min_tissue_fraction"], p["max_tiles_per_slide"], p["seed"],
    )
    assert len(manifest) == p["max_tiles_per_slide"] == len(expected)
    np.testing.assert_array_equal(manifest["x"].to_numpy(int), expected["x"])
    np.testing.assert_array_equal(manifest["y"].to_numpy(int), expected["y"])
    assert manifest["item_id"].iloc[0] == f"cmu1-small-region_x{expected['x'][0]}_y{expected['y'][0]}"
    assert (manifest["source"] == "resources/data/CMU-1-Small-Region.svs").all()
    assert (manifest["group"] == "cmu1").all() and (manifest["domain"] == "aperio-cmu").all()
    assert manifest["label"].isna().all() and (manifest["split"] == "unassigned").all()
    assert (manifest["size"] == 128).all() and (manifest["tissue_fraction"] >= 0.5).all()


def test_sheet_with_labels_and_mpp_override(tmp_path, monkeypatch, make_pyramid, blob_slide):
    from fmaudit.datasets import prepare_dataset
    from slide_utils import TISSUE_RGB

    img = np.empty((256, 256, 3), dtype=np.uint8)
    img[:] = TISSUE_RGB
    make_pyramid("nores.tif", img, n_levels=2, mpp=None)
    monkeypatch.chdir(tmp_path)
    sheet = tmp_path / "sheet.tsv"
    sheet.write_text(
        SHEET_HEADER.rstrip("\n") + "\tmpp\n"
        "blob\tblob.tif\tpatient-1\tsite-a\t1\ttumour\t\n"
        f"solid\t{tmp_path / 'nores.tif'}\tpatient-2\tsite-b\t0\tnormal\t0.5\n"
    )
    manifest = prepare_dataset(
        "toy", "slide_tiles", tmp_path, {"slides": "sheet.tsv", "target_mpp": 1.0, "tile_size": 16}
    )
    blob = manifest[manifest["source"] == "blob.tif"]
    solid = manifest[manifest["source"] == str(tmp_path / "nores.tif")]
    assert len(blob) == 40 and len(solid) == 64  # 8×5 blob tiles; the whole 128-px level 1 at 16 px
    assert (blob["label"] == 1).all() and (blob["label_name"] == "tumour").all()
    assert (solid["label"] == 0).all() and (solid["group"] == "patient-2").all()
    assert (solid["domain"] == "site-b").all() and (solid["level"] == 1).all()
    assert blob["item_id"].str.match(r"^blob_x\d+_y\d+$").all()


@pytest.mark.parametrize(
    "rows, header, match",
    [
        ([["s1", "a.svs", "", "d", "", ""]], SHEET_HEADER, r"row 0 \(slide 's1'\).*'group'"),
        ([["bad id", "a.svs", "g", "d", "", ""]], SHEET_HEADER, r"row 0.*'slide_id'"),
        ([["s1", "a.svs", "g", "d", "", ""], ["s1", "b.svs", "g", "d", "", ""]], SHEET_HEADER, "more than once"),
        ([["s1", "a.svs", "g", "d", "one", ""]], SHEET_HEADER, r"label 'one' is not an integer"),
        ([["s1", "a.svs", "g", "d", "-1", "x"]], SHEET_HEADER, r"row 0.*'label'"),
        ([["s1", "a.svs", "g", "d", "", "tumour"]], SHEET_HEADER, "label_name but no label"),
        ([["s1", "a.svs", "g", "d", "x"]], "slide_id\tpath\tgroup\tdomain\tstain\n", r"unknown column.*stain"),
        ([], SHEET_HEADER, "no rows"),
        ([["s1", "a.svs", "g", "d", "", "", "0"]], SHEET_HEADER.rstrip("\n") + "\tmpp\n", r"'mpp'"),
    ],
)
def test_bad_slide_sheets(tmp_path, rows, header, match):
    from fmaudit.datasets.slide_tiles import read_slide_sheet

    sheet = _write_sheet(tmp_path / "bad.tsv", rows, header)
    with pytest.raises(FmauditInputError, match=match) as err:
        read_slide_sheet(sheet)
    assert "bad.tsv" in str(err.value)


def test_preparer_parameters(tmp_path):
    from fmaudit.datasets import prepare_dataset

    with pytest.raises(FmauditInputError, match="'slides'"):
        prepare_dataset("toy", "slide_tiles", tmp_path, {"target_mpp": 1.0})
    with pytest.raises(FmauditInputError, match=r"unknown.*tile_px"):
        prepare_dataset("toy", "slide_tiles", tmp_path, {"slides": "x.tsv", "tile_px": 64})
    with pytest.raises(FileNotFoundError, match="x.tsv"):
        prepare_dataset("toy", "slide_tiles", tmp_path, {"slides": str(tmp_path / "x.tsv")})


def test_sheet_schema_works_with_snakemake_validate(tmp_path):
    import pandas as pd
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from fmaudit.datasets.slide_tiles import SLIDE_SHEET_SCHEMA, read_slide_sheet
    from slide_utils import REPO_ROOT

    assert SLIDE_SHEET_SCHEMA == REPO_ROOT / "resources" / "schemas" / "slides.schema.yaml"
    validate(read_slide_sheet(REPO_ROOT / "resources" / "data" / "slides.tsv"), str(SLIDE_SHEET_SCHEMA))
    bad = pd.DataFrame({"slide_id": ["s1"], "path": ["a.svs"], "domain": ["d"]})  # no group
    with pytest.raises(WorkflowError):
        validate(bad, str(SLIDE_SHEET_SCHEMA))
