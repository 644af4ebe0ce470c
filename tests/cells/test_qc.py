"""QC: overlays draw the registered centres where the nuclei are; eligibility needs two valid classes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fmaudit.cells.qc import overlay_png, read_he_region, section_eligibility
from xenium_utils import BACKGROUND_RGB, NUCLEUS_RGB, paint_image, write_ome_tiff


def _manifest(fine, coarse):
    return pd.DataFrame({"label_fine_name": pd.array(fine, dtype="string"),
                         "label_coarse_name": pd.array(coarse, dtype="string")})


def test_eligibility_needs_two_valid_classes_in_each_taxonomy():
    ok, reason, counts = section_eligibility(_manifest(["a"] * 3 + ["b"] * 3, ["x"] * 3 + ["y"] * 3), 3)
    assert ok and reason is None and counts["fine"] == {"a": 3, "b": 3}
    ok, reason, _ = section_eligibility(_manifest(["a"] * 3 + ["b"] * 2, ["x"] * 5), 3)
    assert not ok and "1 valid fine class" in reason and "1 valid coarse class" in reason
    ok, reason, _ = section_eligibility(_manifest([None] * 4, [None] * 4), 1)
    assert not ok and "none" in reason


@pytest.mark.parametrize("tiled", [True, False])
def test_region_reads_agree_between_openslide_and_tifffile(tmp_path, tiled):
    rgb = paint_image(100, 80, np.array([[30.0, 40.0]]), 6)
    path = tmp_path / "he.ome.tif"
    write_ome_tiff(path, rgb, 0.5, tiled=tiled, subifds=tiled)
    readers = ["openslide", "tifffile"] if tiled else ["tifffile"]
    for reader in readers:
        region = read_he_region(path, 20, 30, 30, 30, reader)
        np.testing.assert_array_equal(region, rgb[30:60, 20:50])
        edge = read_he_region(path, 90, 70, 20, 20, reader)  # half outside: white there
        np.testing.assert_array_equal(edge[:10, :10], rgb[70:80, 90:100])
        assert (edge[15:, 15:] == 255).all()


def test_overlay_draws_centres_on_the_crops(tmp_path):
    centres = np.array([[40.0, 40.0], [120.0, 90.0]])
    rgb = paint_image(200, 150, centres, 5)
    path = tmp_path / "he.ome.tif"
    write_ome_tiff(path, rgb, 0.5)
    cells = pd.DataFrame({"he_x": centres[:, 0], "he_y": centres[:, 1],
                          "label_coarse": pd.array([0, None], dtype="Int64")})
    out = overlay_png(cells, path, tmp_path / "qc.png", mpp=0.5, n_regions=2, region_um=40, tile_px=80, title="t",
                      coarse_classes=["a", "b"])
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape == (18 + 80, 2 * 80, 3)
    tiles = [img[18:, :80], img[18:, 80:]]
    # each crop is centred on a cell: the centre dot (red for class 0, grey unlabelled) sits in the middle
    centre_colours = {tuple(t[40, 40]) for t in tiles}
    assert centre_colours == {(230, 25, 75), (128, 128, 128)}
    # and the crop around it shows the painted nucleus and the background
    assert any((t == NUCLEUS_RGB).all(axis=2).any() for t in tiles)
    assert any((t == BACKGROUND_RGB).all(axis=2).any() for t in tiles)
