"""Registration: the alignment's direction and units, the H&E image's size and µm/px, the round trip, and
the errors (singular or malformed alignment, cells outside the image)."""

from __future__ import annotations

import numpy as np
import openslide
import pandas as pd
import pytest

from fmaudit.cells.registration import (
    alignment_scale,
    he_image,
    he_px_to_xenium_um,
    read_alignment,
    register_cells,
    xenium_um_to_he_px,
)
from fmaudit.cells.xenium import read_bundle
from fmaudit.io import FmauditInputError
from xenium_utils import NUCLEUS_RGB, PIXEL_SIZE, affine, forward_um, make_section, paint_image, write_ome_tiff

# the matrix of 10x's knowledge-base article on converting coordinates between H&E and Xenium data
KB_MATRIX = np.array([[0.011071028838929093, 1.2895790134339569, 807.9788953065927],
                      [-1.2895790134339569, 0.011071028838929093, 73097.655174759],
                      [0.0, 0.0, 1.0]])


def _write(tmp_path, text, name="a.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_read_alignment_and_the_10x_example(tmp_path):
    text = "\n".join(",".join(repr(float(v)) for v in row) for row in KB_MATRIX) + "\n"
    m = read_alignment(_write(tmp_path, text))
    np.testing.assert_array_equal(m, KB_MATRIX)
    # 10x: the H&E top-left corner [0, 0] lands at Xenium pixel (807.98, 73097.66)
    x, y = he_px_to_xenium_um(0.0, 0.0, m, pixel_size=1.0)
    assert (float(x), float(y)) == pytest.approx((807.9788953065927, 73097.655174759))
    # ... which is that many µm times pixel_size; and the inverse brings the µm back to the corner
    xu, yu = he_px_to_xenium_um(0.0, 0.0, m, PIXEL_SIZE)
    assert float(xu) == pytest.approx(807.9788953065927 * PIXEL_SIZE)
    hx, hy = xenium_um_to_he_px(xu, yu, m, PIXEL_SIZE)
    assert (float(hx), float(hy)) == pytest.approx((0.0, 0.0), abs=1e-6)
    assert alignment_scale(m) == pytest.approx(np.hypot(0.011071028838929093, 1.2895790134339569))


@pytest.mark.parametrize("flip", [False, True])
def test_round_trip_against_an_independent_forward_map(flip):
    m = affine(-71.3, 1.7, 5123.0, 811.0, flip=flip)
    rng = np.random.default_rng(1)
    px = rng.uniform(0, 5000, (2, 200))
    xu, yu = forward_um(px[0], px[1], m)
    np.testing.assert_allclose(he_px_to_xenium_um(px[0], px[1], m, PIXEL_SIZE), (xu, yu), rtol=1e-12)
    hx, hy = xenium_um_to_he_px(xu, yu, m, PIXEL_SIZE)
    np.testing.assert_allclose(hx, px[0], atol=1e-8)
    np.testing.assert_allclose(hy, px[1], atol=1e-8)


@pytest.mark.parametrize("text, message", [
    ("fixedX,fixedY,alignmentX,alignmentY\n1,2,3,4\n", "keypoints"),
    ("a,b,c\n1,0,0\n0,1,0\n0,0,1\n", "header"),
    ("1,0,0\n0,1,0\n", "3x3"),
    ("1,0,0,0\n0,1,0,0\n0,0,1,0\n", "3x3"),
    ("1,0,0\n0,1,zero\n0,0,1\n", "non-numeric"),
    ("1,0,nan\n0,1,0\n0,0,1\n", "non-finite"),
    ("1,0,0\n0,1,0\n0.1,0,1\n", "last row"),
    ("1,2,0\n2,4,0\n0,0,1\n", "singular"),
    ("1,0,0\n0,1e-13,0\n0,0,1\n", "singular"),
    ("", "3x3"),
])
def test_malformed_or_singular_alignment(tmp_path, text, message):
    with pytest.raises(FmauditInputError, match=message) as e:
        read_alignment(_write(tmp_path, text))
    assert "a.csv" in str(e.value)


def test_missing_alignment_file(tmp_path):
    with pytest.raises(FmauditInputError, match="not found"):
        read_alignment(tmp_path / "none.csv")


def _cells(x_um, y_um):
    return pd.DataFrame({"cell_id": [f"c{i}" for i in range(len(x_um))], "x_um": x_um, "y_um": y_um})


def test_cells_outside_the_image_are_counted_dropped_and_all_outside_is_an_error():
    m = affine(20.0, 2.0, 1000.0, 500.0)
    px = np.array([[10.0, 50.0, -3.0, 99.9, 100.5, 40.0], [10.0, 79.0, 5.0, 5.0, 5.0, 80.2]])
    xu, yu = forward_um(px[0], px[1], m)
    reg = register_cells(_cells(xu, yu), m, PIXEL_SIZE, width=100, height=80)
    assert (reg.n_total, reg.n_outside) == (6, 3)
    assert reg.outside_ids == ["c2", "c4", "c5"]
    assert reg.cells["cell_id"].tolist() == ["c0", "c1", "c3"]
    np.testing.assert_allclose(reg.cells["he_x"], [10.0, 50.0, 99.9], atol=1e-9)
    with pytest.raises(FmauditInputError, match="all 6 cells fall outside"):
        register_cells(_cells(xu, yu), m, PIXEL_SIZE, width=2, height=2)
    # an inverted file (Xenium -> H&E) is recognised in the message
    inv = np.linalg.inv(m)
    he = np.array([[10.0, 20, 30], [15.0, 25, 35]])
    xu2, yu2 = forward_um(he[0], he[1], m)
    with pytest.raises(FmauditInputError, match="other way round would fit"):
        register_cells(_cells(xu2, yu2), inv, PIXEL_SIZE, width=100, height=80)


def test_he_image_size_and_mpp_sources(tmp_path):
    rgb = paint_image(128, 96, np.array([[20.0, 20.0]]), 4)
    tiled = tmp_path / "tiled.ome.tif"
    write_ome_tiff(tiled, rgb, mpp=0.3)
    with openslide.OpenSlide(str(tiled)) as s:  # openslide reads the OME-TIFF's level 0 as generic TIFF
        assert s.dimensions == (128, 96)
    img = he_image(tiled)
    assert (img.width, img.height, img.reader) == (128, 96, "openslide")
    assert img.mpp == pytest.approx(0.3, rel=1e-6) and img.mpp_source in ("ome_xml", "openslide", "tiff_resolution")

    stripped = tmp_path / "stripped.ome.tif"  # not tiled: openslide refuses it, tifffile reads it
    write_ome_tiff(stripped, rgb, mpp=0.3, tiled=False, subifds=False)
    img = he_image(stripped)
    assert (img.width, img.height, img.reader, img.mpp_source) == (128, 96, "tifffile", "ome_xml")
    assert img.mpp == pytest.approx(0.3)

    bare = tmp_path / "bare.ome.tif"
    write_ome_tiff(bare, rgb, mpp=None, tiled=False, subifds=False)
    m = affine(10.0, 0.5 / PIXEL_SIZE, 0.0, 0.0)
    img = he_image(bare, matrix=m, pixel_size=PIXEL_SIZE)
    assert img.mpp_source == "alignment" and img.mpp == pytest.approx(0.5)
    assert he_image(bare, mpp_override=0.25).mpp == 0.25
    with pytest.raises(FmauditInputError, match="states no µm/px"):
        he_image(bare)
    with pytest.raises(FmauditInputError, match="positive number"):
        he_image(bare, mpp_override=-1)
    (tmp_path / "junk.tif").write_bytes(b"II*\x00junk")
    with pytest.raises(FmauditInputError, match="unreadable H&E image"):
        he_image(tmp_path / "junk.tif")
    with pytest.raises(FmauditInputError, match="not found"):
        he_image(tmp_path / "none.tif")


@pytest.mark.parametrize("matrix", [
    affine(33.0, 0.5 / PIXEL_SIZE, 4000.0, 2500.0),              # rotation + scale + translation
    affine(-121.0, 0.5 / PIXEL_SIZE * 1.03, 9000.0, 300.0, flip=True),  # and a mirrored section
    affine(90.0, 0.5 / PIXEL_SIZE, 3000.0, 100.0),
])
def test_every_cell_registers_within_one_pixel_of_its_painted_nucleus(tmp_path, matrix):
    """The issue's acceptance test: a bundle laid out as 10x ships it, with a known affine."""
    sec = make_section(tmp_path, n=30, matrix=matrix)
    cells = read_bundle(sec.bundle)
    m = read_alignment(sec.alignment)
    img = he_image(sec.he_image, matrix=m, pixel_size=cells.pixel_size)
    reg = register_cells(cells.cells, m, cells.pixel_size, img.width, img.height)
    assert reg.n_outside == 0 and len(reg.cells) == 30
    truth = sec.truth.set_index("cell_id").loc[reg.cells["cell_id"]]
    err = np.hypot(reg.cells["he_x"].to_numpy() - truth["painted_x"], reg.cells["he_y"].to_numpy() - truth["painted_y"])
    assert err.max() < 1.0
    # and the pixel under every registered centre, read back with openslide, is the painted nucleus colour
    with openslide.OpenSlide(str(sec.he_image)) as slide:
        for x, y in zip(reg.cells["he_x"], reg.cells["he_y"]):
            px = slide.read_region((int(np.floor(x)), int(np.floor(y))), 0, (1, 1)).convert("RGB").getpixel((0, 0))
            assert px == NUCLEUS_RGB
    # the cell centroid (the fallback) misses the nucleus centre by more than a pixel: the choice matters
    cx, cy = xenium_um_to_he_px(truth["cell_x_um"], truth["cell_y_um"], m, PIXEL_SIZE)
    assert np.hypot(cx - truth["painted_x"], cy - truth["painted_y"]).min() > 1.0
