"""The preparer: one cell manifest per section with exactly the agreed columns, provenance, eligibility, the
registry preparer xenium_cells, and the errors of a section that does not fit together."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pandas as pd
import pytest

from fmaudit.cells.prepare import (
    CELL_MANIFEST_COLUMNS,
    SectionSource,
    prepare_section,
    register_section_step,
    resolve_section,
    write_cell_manifest,
)
from fmaudit.datasets import prepare_dataset
from fmaudit.io import FmauditInputError, read_provenance, read_table, sha256_file
from xenium_utils import affine, make_section

LABELS = ["Fibroblast", "CD8+ T cell", "Invasive_Tumor", "Unassigned", "Mystery cell"]


def _source(sec, section="s1", organ="breast", **kw):
    return SectionSource(section=section, organ=organ, bundle=sec.bundle, he_image=sec.he_image,
                         alignment=sec.alignment, cell_types=sec.cell_types, **kw)


def test_cell_manifest_columns_values_and_provenance(tmp_path, caplog):
    # a section partly outside its H&E image: the image covers only its left part
    sec = make_section(tmp_path, n=40, labels=LABELS)
    img_path = sec.he_image
    import tifffile

    from xenium_utils import write_ome_tiff

    full = tifffile.imread(img_path, level=0)
    write_ome_tiff(img_path, np.ascontiguousarray(full[:, :300]), 0.5)
    with caplog.at_level(logging.WARNING):
        result = prepare_section(_source(sec), min_cells_per_class=2, qc_png=tmp_path / "qc.png")
    man = result.manifest
    assert list(man.columns) == list(CELL_MANIFEST_COLUMNS)
    assert {c: str(t) for c, t in man.dtypes.items()} == {c: str(pd.Series(dtype=t).dtype)
                                                          for c, t in CELL_MANIFEST_COLUMNS.items()}
    truth = sec.truth.set_index("cell_id")
    inside = truth.index[truth["painted_x"] < 300]
    assert man["cell_id"].tolist() == list(inside)  # the cells table's order, outside cells dropped
    assert (man["item_id"] == "s1/" + man["cell_id"]).all()
    assert set(man["section"]) == {"s1"} and set(man["organ"]) == {"breast"}
    assert set(man["slide"]) == {str(img_path)} and np.allclose(man["mpp"], 0.5)
    assert set(man["centre_source"]) == {"nucleus_boundaries"}
    t = truth.loc[man["cell_id"]]
    assert np.hypot(man["he_x"] - t["painted_x"].to_numpy(), man["he_y"] - t["painted_y"].to_numpy()).max() < 1.0
    # labels through the default taxonomy; Unassigned and unknown labels are NA
    fine = dict(zip(t["label"], man["label_fine_name"]))
    assert (fine["Fibroblast"] == "fibroblast" and fine["CD8+ T cell"] == "t_nk_cell"
            and fine["Invasive_Tumor"] == "tumour")
    assert pd.isna(fine["Unassigned"]) and pd.isna(fine["Mystery cell"])
    assert set(man["label_coarse"].dropna()) == {0, 1, 2}
    # provenance: hashes, the matrix, the counts dropped and by source
    prov = result.provenance
    assert prov["counts"]["cells_in_bundle"] == 40
    assert prov["counts"]["cells_outside_image_dropped"] == 40 - len(inside)
    assert prov["counts"]["centre_source"]["nucleus_boundaries"] == len(inside)
    assert prov["counts"]["unknown_labels"] == {"Mystery cell": sum(t["label"] == "Mystery cell")}
    assert prov["files"]["cells"]["sha256"] == sha256_file(sec.bundle / "cells.parquet")
    assert prov["files"]["alignment"]["sha256"] == sha256_file(sec.alignment)
    assert "sha256_first_16MiB" in prov["files"]["he_image"]
    np.testing.assert_allclose(prov["alignment_matrix"], sec.matrix)
    assert prov["eligible"] is True and (tmp_path / "qc.png").stat().st_size > 0
    assert "fall outside" in caplog.text and "Mystery cell" in caplog.text
    # written atomically as parquet with its provenance, and read back identical
    write_cell_manifest(tmp_path / "cells.parquet", result)
    back = read_table(tmp_path / "cells.parquet")
    pd.testing.assert_frame_equal(back.astype(CELL_MANIFEST_COLUMNS), man)
    assert read_provenance(tmp_path / "cells.parquet")["counts"] == prov["counts"]


def test_sections_with_fewer_than_two_valid_classes_are_marked_and_logged(tmp_path, caplog):
    sec = make_section(tmp_path, n=12, labels=["Fibroblast", "Myofibroblast"])  # both fine 'fibroblast'
    with caplog.at_level(logging.WARNING):
        result = prepare_section(_source(sec), min_cells_per_class=1)
    assert not result.eligible and "1 valid fine class" in result.exclusion_reason
    assert result.provenance["eligible"] is False and "excluded" in caplog.text
    unlabelled = prepare_section(_source(make_section(tmp_path / "u", n=6)), min_cells_per_class=1)
    assert not unlabelled.eligible and unlabelled.manifest["label_fine"].isna().all()


def test_errors_of_a_section_that_does_not_fit_together(tmp_path):
    sec = make_section(tmp_path / "a", n=8, labels=LABELS)
    other = make_section(tmp_path / "b", n=8, labels=LABELS, id_kind="integer", cells_format=("csv.gz",))
    with pytest.raises(FmauditInputError, match="match no cell of the bundle"):
        prepare_section(SectionSource("s", "o", sec.bundle, sec.he_image, sec.alignment, other.cell_types))
    far = affine(10.0, 2.35, 900000.0, 900000.0)
    (sec.folder / "far.csv").write_text("\n".join(",".join(repr(float(v)) for v in r) for r in far))
    with pytest.raises(FmauditInputError, match="all 8 cells fall outside"):
        prepare_section(SectionSource("s", "o", sec.bundle, sec.he_image, sec.folder / "far.csv"))
    shutil.rmtree(sec.bundle / "nucleus_boundaries.parquet", ignore_errors=True)
    (sec.bundle / "cells.parquet").unlink()
    with pytest.raises(FmauditInputError, match="no cells.parquet or cells.csv.gz"):
        prepare_section(SectionSource("s", "o", sec.bundle, sec.he_image, sec.alignment))


def test_resolve_section_finds_the_h_and_e_and_alignment_beside_the_bundle(tmp_path):
    sec = make_section(tmp_path / "root" / "sec", n=4)
    src = resolve_section("sec-1", {"organ": "lung", "bundle": "sec/outs"}, tmp_path / "root")
    assert (src.he_image, src.alignment) == (sec.he_image, sec.alignment)
    shutil.copy(sec.he_image, sec.folder / "other_he_image.ome.tif")
    with pytest.raises(FmauditInputError, match="several H&E image candidates"):
        resolve_section("sec-1", {"organ": "lung", "bundle": "sec/outs"}, tmp_path / "root")
    with pytest.raises(FmauditInputError, match="unknown key 'colour'"):
        resolve_section("sec-1", {"organ": "lung", "bundle": "sec/outs", "colour": 1}, tmp_path)
    with pytest.raises(FmauditInputError, match="'organ' is required"):
        resolve_section("sec-1", {"bundle": "sec/outs"}, tmp_path)
    with pytest.raises(FmauditInputError, match="filename-safe"):
        resolve_section("sec 1", {"organ": "lung", "bundle": "sec/outs"}, tmp_path)


def test_registry_preparer_and_workflow_step(tmp_path):
    root = tmp_path / "data"
    make_section(root / "xa", n=10, labels=LABELS[:3])
    make_section(root / "xb", n=10, labels=["B cell", "Fibroblast"], id_kind="integer", cells_format=("csv.gz",),
                 boundaries="csv.gz", label_id=False, seed=3)
    sections = {
        "sa": {"organ": "breast", "bundle": "xa/outs", "cell_types": "xa/cell_types.csv"},
        "sb": {"organ": "lung", "bundle": "xb/outs", "cell_types": "xb/cell_types.csv"},
    }
    man = prepare_dataset("xen", "xenium_cells", root, {"sections": sections, "min_cells_per_class": 1})
    assert len(man) == 20 and set(man["group"]) == {"sa", "sb"} and set(man["domain"]) == {"breast", "lung"}
    assert (man["source"] == man["slide"]).all() and (man["label"] == man["label_fine"]).fillna(True).all()
    assert set(CELL_MANIFEST_COLUMNS) <= set(man.columns) and man.attrs["provenance"]["sections"]["sb"]["eligible"]
    # a missing section says where it was expected and where to get it
    with pytest.raises(FmauditInputError, match=r"expected xc/outs/experiment.xenium under data_root .* get it from https://x.org"):
        prepare_dataset("xen", "xenium_cells", root, {"sections": {"sc": {"organ": "o", "bundle": "xc/outs", "url": "https://x.org"}}})
    with pytest.raises(FmauditInputError, match="unknown parameter 'section'"):
        prepare_dataset("xen", "xenium_cells", root, {"section": {}})
    # the workflow's per-section step writes the manifest, the QC overlay and the log
    out = tmp_path / "res" / "sa.parquet"
    result = register_section_step("sa", sections["sa"], root, out, qc_png=tmp_path / "res" / "sa.png",
                                   min_cells_per_class=1, log_path=tmp_path / "res" / "sa.log")
    assert read_table(out)["item_id"].tolist() == result.manifest["item_id"].tolist()
    assert (tmp_path / "res" / "sa.png").exists() and "wrote" in (tmp_path / "res" / "sa.log").read_text()
