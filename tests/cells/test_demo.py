"""The demo sections: nuclei found on the real CC0 slide, a real Xenium bundle with a non-trivial affine that
registers back onto the painted nuclei, and planted labels readable at the nucleus but not in a patch mean."""

from __future__ import annotations

import json

import numpy as np
import openslide
import pandas as pd
import pytest
import tifffile

from fmaudit.cells.demo import (
    CLASS_SIGNATURES,
    DEMO_SLIDE,
    demo_section_specs,
    detect_nuclei,
    hematoxylin_density,
    write_demo_section,
    write_demo_sections,
)
from fmaudit.cells.prepare import prepare_section, resolve_section
from fmaudit.cells.registration import read_alignment
from fmaudit.cells.xenium import read_bundle
from fmaudit.io import FmauditInputError


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    sections = write_demo_sections(out, n_sections=3, organs=("organ-a", "organ-b"), window_px=512, max_cells=150)
    return out, sections


def test_hematoxylin_channel_separates_the_stains():
    # pure stains rendered by Beer-Lambert: hematoxylin is high on the hematoxylin colour only
    od_h = np.array([0.65, 0.70, 0.29]) / np.linalg.norm([0.65, 0.70, 0.29])
    od_e = np.array([0.07, 0.99, 0.11]) / np.linalg.norm([0.07, 0.99, 0.11])
    rgb = np.stack([255 * 10 ** (-0.8 * od_h), 255 * 10 ** (-0.8 * od_e), [255, 255, 255]])[None].astype(np.uint8)
    h = hematoxylin_density(rgb)[0]
    assert h[0] == pytest.approx(0.8, abs=0.05) and abs(h[1]) < 0.05 and abs(h[2]) < 1e-6


def test_detect_nuclei_on_the_real_slide():
    with openslide.OpenSlide(str(DEMO_SLIDE)) as s:
        rgb = np.asarray(s.read_region((1100, 1500), 0, (512, 512)).convert("RGB"))
    labels, ids = detect_nuclei(rgb, 0.499)
    assert 40 < len(ids) < 400
    areas = np.bincount(labels.ravel())[ids] * 0.499 ** 2
    assert areas.min() >= 8 and areas.max() <= 120
    # nuclei are hematoxylin-rich: darker than the window's median
    nuclear = np.isin(labels, ids)
    assert rgb[nuclear].mean() < np.median(rgb) - 30
    with pytest.raises(FmauditInputError, match="no stained tissue"):
        detect_nuclei(np.full((64, 64, 3), 250, np.uint8), 0.5)


def test_demo_sections_are_real_bundles_with_a_non_trivial_affine(demo):
    out, sections = demo
    assert list(sections) == ["organ-a-1", "organ-b-1", "organ-a-2"]
    assert json.loads((out / "sections.json").read_text()) == sections
    for spec in sections.values():
        bundle = read_bundle(spec["bundle"])
        assert bundle.pixel_size == 0.2125 and set(bundle.cells["centre_source"]) == {"nucleus_boundaries"}
        assert bundle.cells["cell_id"].str.fullmatch(r"[a-p]{8}-1").all()
        m = read_alignment(spec["alignment"])
        angle = np.degrees(np.arctan2(m[1, 0], m[0, 0]))
        assert abs(angle % 90) > 1 and abs(angle % 90) < 89  # a rotation, not a flip or transpose
        assert np.linalg.det(m[:2, :2]) ** 0.5 == pytest.approx(0.499 / 0.2125, rel=0.04) and min(m[:2, 2]) > 100
        with openslide.OpenSlide(spec["he_image"]) as s:
            assert s.dimensions == (512, 512) and float(s.properties["openslide.mpp-x"]) == pytest.approx(0.499)
        with tifffile.TiffFile(spec["he_image"]) as tf:
            assert tf.is_ome and len(tf.series[0].levels) >= 2 and 'PhysicalSizeX="0.499"' in tf.ome_metadata
        types = pd.read_csv(spec["cell_types"], dtype=str)
        assert list(types.columns) == ["cell_id", "label"] and len(types) < len(bundle.cells)


def test_demo_registers_onto_the_painted_nuclei_with_planted_labels(demo):
    out, sections = demo
    for sid, spec in sections.items():
        result = prepare_section(resolve_section(sid, spec, out))
        truth = pd.read_parquet(out / sid / "truth.parquet").set_index("cell_id")
        man = result.manifest.set_index("cell_id")
        t = truth.loc[man.index]
        err = np.hypot(man["he_x"] - t["painted_x"], man["he_y"] - t["painted_y"])
        assert len(man) == len(truth) and err.max() < 1.0
        labelled = t["annotated"] & (t["annotation"] != "Unassigned")
        assert (man["label_fine"][labelled.to_numpy()].astype(int).to_numpy() == t["fine_class"][labelled]).all()
        assert man["label_fine"][~labelled.to_numpy()].isna().all()
        assert result.eligible


def _od(path):
    with openslide.OpenSlide(str(path)) as s:
        img = np.asarray(s.read_region((0, 0), 0, s.dimensions).convert("RGB"), dtype=np.float64)
    return -np.log10(np.maximum(img, 1.0) / 255.0)


def test_planted_class_is_local_to_the_nucleus(demo):
    """Decodable from a 3x3-px window at the nucleus, near chance from the mean of the 64-px patch holding it."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    out, sections = demo
    at_nucleus, patch_mean, y = [], [], []
    for sid in sections:
        truth = pd.read_parquet(out / sid / "truth.parquet")
        od = _od(out / sid / f"{sid}_he_image.ome.tif")
        for x, yy, k in zip(truth["painted_x"], truth["painted_y"], truth["fine_class"]):
            xi, yi = int(x), int(yy)
            at_nucleus.append(od[yi - 1:yi + 2, xi - 1:xi + 2].reshape(-1, 3).mean(0))
            px, py = xi // 64 * 64, yi // 64 * 64
            patch_mean.append(od[py:py + 64, px:px + 64].reshape(-1, 3).mean(0))
            y.append(k)
    y = np.array(y)
    majority = np.bincount(y).max() / len(y)
    probe = LogisticRegression(max_iter=3000, C=10.0)
    acc_nucleus = cross_val_score(probe, np.array(at_nucleus), y, cv=5).mean()
    acc_patch = cross_val_score(probe, np.array(patch_mean), y, cv=5).mean()
    assert acc_nucleus > majority + 0.15
    assert acc_nucleus > acc_patch + 0.15
    assert acc_patch < majority + 0.1


def test_pixels_away_from_nuclei_are_the_slides(demo):
    out, sections = demo
    sid = next(iter(sections))
    marker = json.loads((out / sid / "demo_section.json").read_text())["spec"]
    with openslide.OpenSlide(str(DEMO_SLIDE)) as s:
        original = np.asarray(s.read_region((marker["x0"], marker["y0"]), 0, (512, 512)).convert("RGB"))
    with openslide.OpenSlide(str(out / sid / f"{sid}_he_image.ome.tif")) as s:
        painted = np.asarray(s.read_region((0, 0), 0, (512, 512)).convert("RGB"))
    changed = (original != painted).any(axis=2)
    assert 0.01 < changed.mean() < 0.3  # only nuclei (and a rim) are touched
    truth = pd.read_parquet(out / sid / "truth.parquet")
    yy, xx = np.mgrid[0:512, 0:512]
    near = np.zeros((512, 512), bool)
    for x, y in zip(truth["painted_x"], truth["painted_y"]):
        near |= (xx - x) ** 2 + (yy - y) ** 2 < 35 ** 2  # the longest nuclei (120 µm²) reach ~30 px
    assert not changed[~near].any()
    assert len(CLASS_SIGNATURES) == 9


def test_old_bundle_format_zarr_and_determinism(tmp_path):
    spec = demo_section_specs(n_sections=1, window_px=384, max_cells=60, bundle_format="v1", write_zarr=True)[0]
    a = write_demo_section(spec, tmp_path / "a")
    b = write_demo_section(spec, tmp_path / "b")
    bundle = read_bundle(a["bundle"])
    assert bundle.cells["cell_id"].tolist() == [str(i + 1) for i in range(len(bundle.cells))]
    assert sorted(p.name for p in (tmp_path / "a" / spec.section / "outs").iterdir()) == [
        "cells.csv.gz", "cells.zarr.zip", "experiment.xenium", "nucleus_boundaries.csv.gz"]
    # the zarr's nucleus centroids agree with the polygons' area centroids
    (tmp_path / "a" / spec.section / "outs" / "nucleus_boundaries.csv.gz").unlink()
    from_zarr = read_bundle(a["bundle"]).cells
    assert set(from_zarr["centre_source"]) == {"nucleus_zarr"}
    np.testing.assert_allclose(from_zarr["x_um"], bundle.cells["x_um"], atol=0.05)
    # same specification, same pixels and tables
    np.testing.assert_array_equal(_od(a["he_image"]), _od(b["he_image"]))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / spec.section / "truth.parquet"),
                                  pd.read_parquet(tmp_path / "b" / spec.section / "truth.parquet"))
    assert read_alignment(a["alignment"]).tolist() == read_alignment(b["alignment"]).tolist()
    # asking for more windows than the slide holds says so
    with pytest.raises(FmauditInputError, match="windows"):
        demo_section_specs(n_sections=40, window_px=1024)
