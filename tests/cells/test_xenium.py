"""Reading Xenium bundles: both id kinds, parquet-only and csv.gz-only tables, nucleus polygons vs
cells.zarr.zip vs the cell-centroid fallback, and the errors of a broken bundle."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fmaudit.cells.xenium import (
    cell_id_prefix_suffix,
    cell_id_strings,
    polygon_centroids,
    read_bundle,
    read_nucleus_centres,
)
from fmaudit.io import FmauditInputError
from xenium_utils import disc_ring, make_section, write_cells_zarr, xenium_id


def test_cell_id_strings_follow_the_xenium_letter_code():
    # spatialdata-io's reference: hex digits of the prefix shifted 0-f -> a-p, left-padded with 'a' to 8
    prefix = np.array([0, 27, 0xFFFFFFFF, 1000], dtype=np.uint32)
    suffix = np.array([1, 1, 2, 3], dtype=np.uint32)
    assert list(cell_id_strings(prefix, suffix)) == ["aaaaaaaa-1", "aaaaaabl-1", "pppppppp-2", xenium_id(1000, 3)]
    back = cell_id_prefix_suffix(cell_id_strings(prefix, suffix))
    np.testing.assert_array_equal(back[0], prefix)
    np.testing.assert_array_equal(back[1], suffix)
    with pytest.raises(FmauditInputError, match="not of the Xenium form"):
        cell_id_prefix_suffix(["aaaazzzz-1"])


def _shoelace_reference(ring: np.ndarray) -> tuple[float, float, float]:
    """Textbook shoelace on an explicitly closed ring (a few lines, independent of the vectorised code)."""
    a = cx = cy = 0.0
    for (x0, y0), (x1, y1) in zip(ring[:-1], ring[1:]):
        c = x0 * y1 - x1 * y0
        a += c
        cx += (x0 + x1) * c
        cy += (y0 + y1) * c
    return a / 2, cx / (3 * a), cy / (3 * a)


def test_polygon_centroids_match_the_textbook_shoelace():
    rng = np.random.default_rng(0)
    rings = []
    for k in range(5):  # star-shaped random polygons far from the origin (µm-sized offsets)
        t = np.sort(rng.uniform(0, 2 * np.pi, 9))
        r = rng.uniform(2, 6, 9)
        ring = np.stack([3000 + 50 * k + r * np.cos(t), 7000 + r * np.sin(t)], axis=1)
        rings.append(np.vstack([ring, ring[:1]]))
    group = np.concatenate([np.full(len(r), i) for i, r in enumerate(rings)])
    xy = np.concatenate(rings)
    starts, area, gx, gy = polygon_centroids(group, xy[:, 0], xy[:, 1])
    for i, ring in enumerate(rings):
        a, cx, cy = _shoelace_reference(ring)
        assert area[i] == pytest.approx(a, rel=1e-9)
        assert (gx[i], gy[i]) == pytest.approx((cx, cy), abs=1e-5)  # the reference loses digits at 7000 µm
    # open rings (first vertex not repeated) and clockwise order give the same centroid
    open_ring = rings[0][:-1][::-1]
    _, area2, gx2, gy2 = polygon_centroids(np.zeros(len(open_ring)), open_ring[:, 0], open_ring[:, 1])
    assert area2[0] == pytest.approx(-area[0]) and (gx2[0], gy2[0]) == pytest.approx((gx[0], gy[0]))
    # a degenerate polygon (a line) has no centroid
    _, _, gx3, _ = polygon_centroids(np.zeros(3), np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.0]))
    assert np.isnan(gx3[0])


def _boundaries(tmp_path, rows, name="nucleus_boundaries.parquet"):
    df = pd.DataFrame(rows, columns=[c for c in ("cell_id", "vertex_x", "vertex_y", "label_id") if c in rows[0]])
    path = tmp_path / name
    df.to_parquet(path, index=False) if name.endswith(".parquet") else df.to_csv(path, index=False)
    return path


def _ring_rows(cell_id, ring, label_id=None):
    return [dict(cell_id=cell_id, vertex_x=x, vertex_y=y, **({"label_id": label_id} if label_id else {}))
            for x, y in ring]


def test_multinucleate_cells_take_their_largest_nucleus_and_merged_rings_their_union(tmp_path):
    small, large = disc_ring(100, 100, 2), disc_ring(120, 100, 4)
    path = _boundaries(tmp_path, _ring_rows("c1", small, 1) + _ring_rows("c1", large, 2) + _ring_rows("c2", small, 3))
    got = read_nucleus_centres(path).set_index("cell_id")
    assert (got.loc["c1", "x_um"], got.loc["c1", "y_um"]) == pytest.approx((120, 100))
    assert (got.loc["c2", "x_um"], got.loc["c2", "y_um"]) == pytest.approx((100, 100))
    # without label_id (early XOA 2.0) the two rings of c1 are one group: the area centroid of both nuclei
    rows = [{k: v for k, v in r.items() if k != "label_id"} for r in _ring_rows("c1", small) + _ring_rows("c1", large)]
    got = read_nucleus_centres(_boundaries(tmp_path, rows, "merged.parquet")).set_index("cell_id")
    a_small, a_large = np.pi * 4, np.pi * 16
    expected_x = (100 * a_small + 120 * a_large) / (a_small + a_large)
    assert got.loc["c1", "x_um"] == pytest.approx(expected_x, rel=1e-3)


def test_interleaved_polygon_rows_are_regrouped(tmp_path):
    a, b = disc_ring(10, 10, 3, k=8), disc_ring(50, 20, 3, k=8)
    ra, rb = _ring_rows("a", a), _ring_rows("b", b)
    rows = ra[:4] + rb[:4] + ra[4:] + rb[4:]  # each polygon's own vertex order kept
    got = read_nucleus_centres(_boundaries(tmp_path, rows, "x.csv")).set_index("cell_id")
    assert (got.loc["a", "x_um"], got.loc["b", "y_um"]) == pytest.approx((10, 20))


@pytest.mark.parametrize("id_kind, cells_format, boundaries", [
    ("string", ("parquet",), "parquet"),       # XOA >= 1.3, parquet only
    ("integer", ("csv.gz",), "csv.gz"),       # XOA 1.0, csv.gz only, integer ids
    ("string", ("parquet", "csv.gz"), "csv.gz"),
])
def test_nucleus_centres_from_polygons_for_both_id_kinds_and_formats(tmp_path, id_kind, cells_format, boundaries):
    sec = make_section(tmp_path, n=12, id_kind=id_kind, cells_format=cells_format, boundaries=boundaries,
                       label_id=id_kind == "string")
    cells = read_bundle(sec.bundle)
    assert cells.pixel_size == 0.2125
    got = cells.cells.set_index("cell_id")
    truth = sec.truth.set_index("cell_id")
    assert list(got.index) == list(truth.index)  # ids as strings, in the table's order
    assert all(isinstance(i, str) for i in got.index)
    assert set(got["centre_source"]) == {"nucleus_boundaries"}
    np.testing.assert_allclose(got["x_um"], truth["nucleus_x_um"], atol=1e-6)
    np.testing.assert_allclose(got["y_um"], truth["nucleus_y_um"], atol=1e-6)
    np.testing.assert_allclose(got["cell_x_um"], truth["cell_x_um"], atol=1e-9)


@pytest.mark.parametrize("id_kind", ["string", "integer"])
def test_zarr_nucleus_centroids_when_there_are_no_polygons(tmp_path, id_kind):
    sec = make_section(tmp_path, n=10, id_kind=id_kind, boundaries=None, zarr=True,
                       cells_format=("parquet",) if id_kind == "string" else ("csv.gz",))
    got = read_bundle(sec.bundle).cells.set_index("cell_id")
    truth = sec.truth.set_index("cell_id")
    assert set(got["centre_source"]) == {"nucleus_zarr"}
    np.testing.assert_allclose(got["x_um"], truth["nucleus_x_um"], atol=1e-9)
    np.testing.assert_allclose(got["y_um"], truth["nucleus_y_um"], atol=1e-9)


def test_fallback_to_the_cell_centroid_and_per_cell_sources(tmp_path):
    sec = make_section(tmp_path / "none", n=8, boundaries=None)
    got = read_bundle(sec.bundle).cells
    assert set(got["centre_source"]) == {"cell_centroid"}
    np.testing.assert_allclose(got["x_um"], sec.truth["cell_x_um"])

    # polygons for the first 3 cells, zarr nuclei for cells 3-5 (cell 5 without a nucleus: area 0), fallback for
    # the rest
    sec = make_section(tmp_path / "mixed", n=8, boundaries="parquet")
    b = sec.bundle / "nucleus_boundaries.parquet"
    poly = pd.read_parquet(b)
    poly[poly["cell_id"].isin(sec.truth["cell_id"][:3])].to_parquet(b, index=False)
    t = sec.truth
    area = np.array([20.0] * 8)
    area[5] = 0.0
    write_cells_zarr(sec.bundle / "cells.zarr.zip", list(t["cell_id"][:6]), {
        "cell_centroid_x": t["cell_x_um"][:6], "cell_centroid_y": t["cell_y_um"][:6],
        "nucleus_centroid_x": t["nucleus_x_um"][:6] + 0.25, "nucleus_centroid_y": t["nucleus_y_um"][:6],
        "nucleus_area": area[:6]})
    got = read_bundle(sec.bundle).cells
    assert got["centre_source"].tolist() == ["nucleus_boundaries"] * 3 + ["nucleus_zarr"] * 2 + ["cell_centroid"] * 3
    np.testing.assert_allclose(got["x_um"][:3], t["nucleus_x_um"][:3], atol=1e-6)
    np.testing.assert_allclose(got["x_um"][3:5], t["nucleus_x_um"][3:5] + 0.25)
    np.testing.assert_allclose(got["x_um"][5:], t["cell_x_um"][5:])


def test_bundle_errors_name_the_file_and_key(tmp_path):
    sec = make_section(tmp_path / "s", n=4)
    exp = sec.bundle / "experiment.xenium"
    spec = json.loads(exp.read_text())

    exp.write_text(json.dumps({k: v for k, v in spec.items() if k != "pixel_size"}))
    with pytest.raises(FmauditInputError, match=r"experiment.xenium: no 'pixel_size'"):
        read_bundle(sec.bundle)
    exp.write_text(json.dumps({**spec, "pixel_size": -1}))
    with pytest.raises(FmauditInputError, match="must be a positive number"):
        read_bundle(sec.bundle)
    exp.write_text("{not json")
    with pytest.raises(FmauditInputError, match="not a JSON"):
        read_bundle(sec.bundle)
    exp.unlink()
    with pytest.raises(FmauditInputError, match="missing file of the Xenium bundle"):
        read_bundle(sec.bundle)
    exp.write_text(json.dumps(spec))

    cells = pd.read_parquet(sec.bundle / "cells.parquet")
    (sec.bundle / "cells.parquet").unlink()
    with pytest.raises(FmauditInputError, match=r"no cells.parquet or cells.csv.gz"):
        read_bundle(sec.bundle)
    cells.drop(columns="y_centroid").to_parquet(sec.bundle / "cells.parquet")
    with pytest.raises(FmauditInputError, match=r"cells.parquet: missing column\(s\) \['y_centroid'\]"):
        read_bundle(sec.bundle)
    dup = cells.copy()
    dup.loc[2, "cell_id"] = dup.loc[0, "cell_id"]
    dup.to_parquet(sec.bundle / "cells.parquet")
    with pytest.raises(FmauditInputError, match="occurs more than once"):
        read_bundle(sec.bundle)
    nan = cells.copy()
    nan.loc[1, "x_centroid"] = np.nan
    nan.to_parquet(sec.bundle / "cells.parquet")
    with pytest.raises(FmauditInputError, match=r"row 1 .* x_centroid"):
        read_bundle(sec.bundle)
    (sec.bundle / "cells.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(FmauditInputError, match="unreadable table"):
        read_bundle(sec.bundle)
    with pytest.raises(FmauditInputError, match="bundle folder not found"):
        read_bundle(tmp_path / "nowhere")


def test_zarr_errors(tmp_path):
    sec = make_section(tmp_path, n=4, boundaries=None)
    t = sec.truth
    cols = {"nucleus_centroid_x": t["nucleus_x_um"], "nucleus_centroid_y": t["nucleus_y_um"]}
    write_cells_zarr(sec.bundle / "cells.zarr.zip", list(t["cell_id"]), cols, column_names=False)
    with pytest.raises(FmauditInputError, match="no 'column_names' attribute"):
        read_bundle(sec.bundle)
    write_cells_zarr(sec.bundle / "cells.zarr.zip", list(t["cell_id"]), cols, spatial_units="pixels")
    with pytest.raises(FmauditInputError, match="spatial_units is 'pixels'"):
        read_bundle(sec.bundle)
    write_cells_zarr(sec.bundle / "cells.zarr.zip", list(t["cell_id"]), {"cell_area": t["nucleus_x_um"]})
    with pytest.raises(FmauditInputError, match="no column 'nucleus_centroid_x'"):
        read_bundle(sec.bundle)
    (sec.bundle / "cells.zarr.zip").write_bytes(b"not a zip")
    with pytest.raises(FmauditInputError, match="unreadable Xenium zarr"):
        read_bundle(sec.bundle)
