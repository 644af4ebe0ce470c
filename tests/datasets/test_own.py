"""A user's own data sets in YAML only: sheets read line by line, automatic splits, slide tiles labelled by QuPath
regions, features computed elsewhere. Every bad line is an error naming the file and the line."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pandas as pd
import pytest

from fmaudit.datasets import prepare_dataset
from fmaudit.datasets.annotations import read_regions, tile_labels
from fmaudit.datasets.own import (
    automatic_split,
    precomputed_encoders,
    read_feature_file,
    read_feature_table,
    read_image_table,
    read_slide_table,
)
from fmaudit.io import FmauditInputError
from fmaudit.registry import load_dataset_registries
from own_data_utils import qupath_geojson, write_feature_study, write_slide_study, write_tile_study

CLASSES = ["tumour", "stroma", "lymphocytes"]


def _params(kind: str, **params) -> dict:
    """The entry's params with their kind's schema defaults, as the registry loader fills them."""
    return load_dataset_registries(entries={"mine": {"kind": kind, "params": params}})["mine"]["params"]


@pytest.fixture(scope="module")
def tiles(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiles")
    return write_tile_study(root, n_patients=10, size=16)


def test_an_image_sheet_becomes_a_manifest_split_by_patient_and_stratified_in_each_domain(tiles):
    man = prepare_dataset("mine", "image_table", "unused", _params("image_table", sheet=str(tiles), classes=CLASSES),
                          group_unit="patient")
    assert len(man) == 60 and set(man["domain"]) == {"scanner1", "scanner2"}
    assert man["label_name"].tolist() == [CLASSES[int(v)] for v in man["label"]]
    assert (man["group_unit"] == "patient").all() and man["source"].map(lambda p: p.startswith(str(tiles.parent))).all()
    # a patient is on one split; every domain has 6 / 2 / 2 of its 10 patients, and each split every class
    assert (man.groupby("group")["split"].nunique() == 1).all()
    counts = man.groupby(["domain", "split"])["group"].nunique().unstack()
    assert (counts[["train", "val", "test"]].to_numpy() == [[6, 2, 2], [6, 2, 2]]).all()
    assert (man.groupby(["domain", "split"])["label"].nunique() == 3).all()
    again = prepare_dataset("mine", "image_table", "unused", _params("image_table", sheet=str(tiles), classes=CLASSES))
    assert again["split"].tolist() == man["split"].tolist()  # seeded
    other = prepare_dataset("mine", "image_table", "unused", _params("image_table", sheet=str(tiles), classes=CLASSES,
                                                                      seed=3))
    assert other["split"].tolist() != man["split"].tolist()


def _edit(sheet, tmp_path, edit, name="labels.csv", sep=","):
    df = pd.read_csv(sheet, dtype=str, keep_default_na=False)
    edit(df)
    out = tmp_path / name
    df.to_csv(out, index=False, sep=sep)
    # the sheet's paths are relative to it: keep the tiles where they are
    (tmp_path / "tiles").symlink_to(sheet.parent / "tiles") if not (tmp_path / "tiles").exists() else None
    return out


@pytest.mark.parametrize("edit, message", [
    (lambda df: df.__setitem__("label", df["label"].where(df.index != 4, "")),
     r"line 6: empty 'label'; every item needs a class of data set 'mine' \(tumour, stroma, lymphocytes\)"),
    (lambda df: df.__setitem__("label", df["label"].where(df.index != 7, "tumor")),
     r"line 9: unknown class 'tumor'; did you mean 'tumour'\?"),
    (lambda df: df.__setitem__("path", df["path"].where(df.index != 2, "tiles/scanner1/nowhere.png")),
     r"line 4: path .*tiles/scanner1/nowhere.png does not exist"),
    (lambda df: df.__setitem__("patient", df["patient"].where(df.index != 0, "")), r"line 2: empty 'patient'"),
    (lambda df: df.insert(4, "split", ["test" if i == 1 else "train" for i in range(len(df))]),
     r"patient 's1-p00' is on several splits \(line 2: train, line 3: test, line 4: train\); its items must share"),
    (lambda df: df.insert(4, "split", ["training"] * len(df)),
     r"line 2: split 'training' is not one of train, val, test"),
    (lambda df: df.insert(1, "scanner", "x"), r"unknown column\(s\) \['scanner'\]"),
])
def test_every_bad_line_of_an_image_sheet_is_named(tiles, tmp_path, edit, message):
    sheet = _edit(tiles, tmp_path, edit)
    with pytest.raises(FmauditInputError, match=message) as e:
        read_image_table("mine", _params("image_table", sheet=str(sheet), classes=CLASSES))
    assert str(sheet) in str(e.value)


def test_unlabelled_items_only_where_the_entry_allows_them_and_a_tsv_sheet(tiles, tmp_path):
    sheet = _edit(tiles, tmp_path, lambda df: df.__setitem__("label", df["label"].where(df.index > 2, "")),
                  name="labels.tsv", sep="\t")
    rows = read_image_table("mine", _params("image_table", sheet=str(sheet), classes=CLASSES, labels_required=False))
    assert rows["label"].isna().sum() == 3 and rows.loc[rows["label"].isna(), "sheet_line"].tolist() == [2, 3, 4]


def test_a_patient_scanned_on_two_scanners_is_on_one_split_everywhere():
    rng = np.random.default_rng(0)
    rows = [{"group": f"p{p}", "domain": d, "label": c, "item_id": f"p{p}-{d}-{c}"}
            for p in range(10) for d in ("a", "b") for c in range(3)]
    df = pd.DataFrame(rows).sample(frac=1, random_state=1).reset_index(drop=True)
    out = automatic_split(df, [0.6, 0.2, 0.2], int(rng.integers(10)))
    assert (out.groupby("group")["split"].nunique() == 1).all()
    assert set(out["split"]) == {"train", "val", "test"}
    with pytest.raises(FmauditInputError, match="must sum to 1"):
        automatic_split(df, [0.6, 0.2, 0.3], 0)


# ---------------------------------------------------------------------------------------------- slides


@pytest.fixture(scope="module")
def slides(tmp_path_factory):
    return write_slide_study(tmp_path_factory.mktemp("slides"))


SLIDE_CLASSES = ["tumour", "stroma", "necrosis"]


def _slide_params(sheet, **extra):
    return _params("slide_table", sheet=str(sheet), classes=SLIDE_CLASSES, tile_size=64, target_mpp=1.0, **extra)


def test_labelled_slides_give_tiles_of_their_label_or_of_the_regions_covering_them(slides):
    man = prepare_dataset("mine", "slide_table", "unused", _slide_params(slides), group_unit="patient")
    per_slide = man.groupby("slide").agg(n=("item_id", "size"), classes=("label_name", "nunique"),
                                         name=("label_name", "first"))
    # per-slide labels: all 9 tissue tiles (3 x 3 of 128 level-0 px); regions: the 6 tiles the slide's class
    # covers at least half of (x < 300 px), never the corner region of another class (a quarter of a tile)
    assert per_slide.loc["siteA-tumour-0", "n"] == 9 and per_slide.loc["siteA-tumour-1", "n"] == 6
    assert (per_slide["classes"] == 1).all()
    assert all(per_slide.loc[s, "name"] == s.split("-")[1] for s in per_slide.index)
    assert man.loc[man["region_share"].notna(), "region_share"].min() >= 0.5
    assert (man.groupby("group")["split"].nunique() == 1).all()
    assert (man.groupby(["domain", "split"])["group"].nunique() == 3).all()  # 9 patients a site: 3 per split


def test_a_region_of_a_class_outside_the_entry_names_the_file_and_the_feature(slides, tmp_path):
    geo = qupath_geojson([("tumour", [(0, 0), (100, 0), (100, 100)]), ("Tumor", [(0, 0), (10, 0), (10, 10)])])
    bad = tmp_path / "bad.geojson"
    bad.write_text(json.dumps(geo))
    with pytest.raises(FmauditInputError, match=r"(?s)bad.geojson: 1 region\(s\).*feature 1: unknown class 'Tumor'; "
                                                r"did you mean 'tumour'\?"):
        read_regions(bad, SLIDE_CLASSES)
    sheet = pd.read_csv(slides, dtype=str, keep_default_na=False)
    sheet.loc[1, "annotations"] = str(bad)
    edited = slides.parent / "bad-slides.csv"
    sheet.to_csv(edited, index=False)
    with pytest.raises(FmauditInputError, match=r"(?s)bad-slides.csv: 1 problem.*line 3: .*feature 1: unknown class"):
        read_slide_table("mine", _slide_params(edited))


def test_regions_cover_tiles_by_area_with_holes_left_out():
    from fmaudit.datasets.annotations import Regions

    ring = np.array([[0, 0], [100, 0], [100, 100], [0, 100]], float)
    hole = np.array([[0, 0], [60, 0], [60, 100], [0, 100]], float)
    regions = Regions("x", {"a": [(ring, [])], "b": [(ring + [100, 0], [hole + [100, 0]])]})
    names, share = tile_labels(regions, 200, 100, np.array([0, 100, 50]), np.array([0, 0, 0]), 100, 0.5)
    assert names.tolist() == ["a", None, "a"]
    np.testing.assert_allclose(share, [1.0, 0.4, 0.5], atol=0.04)  # rasterised: 32 mask pixels a tile


@pytest.mark.parametrize("edit, message", [
    (lambda df: df.__setitem__("label", df["label"].where(df.index != 0, "tumor")),
     r"line 2: unknown class 'tumor'; did you mean 'tumour'\?"),
    (lambda df: df.__setitem__("label", df["label"].where(df.index != 1, "stroma")),
     r"line 3: give a slide's class either as its label or by its annotations, not both"),
    (lambda df: df.__setitem__("label", df["label"].where(df.index != 0, "")),
     r"line 2: no label and no annotations"),
    (lambda df: df.__setitem__("path", df["path"].where(df.index != 4, "slides/gone.tiff")),
     r"line 6: path .*slides/gone.tiff does not exist"),
])
def test_every_bad_line_of_a_slide_sheet_is_named(slides, edit, message):
    sheet = pd.read_csv(slides, dtype=str, keep_default_na=False)
    edit(sheet)
    edited = slides.parent / "edited.csv"
    sheet.to_csv(edited, index=False)
    with pytest.raises(FmauditInputError, match=message):
        read_slide_table("mine", _slide_params(edited))


def test_a_slide_openslide_cannot_read_fails_its_preparation_naming_the_line(slides):
    sheet = pd.read_csv(slides, dtype=str, keep_default_na=False)
    broken = slides.parent / "slides" / "broken.tiff"
    broken.write_bytes(b"II*\x00" + b"\x00" * 64)  # a TIFF header and nothing else
    sheet.loc[2, "path"] = "slides/broken.tiff"
    edited = slides.parent / "broken.csv"
    sheet.to_csv(edited, index=False)
    with pytest.raises(FmauditInputError, match=r"broken.csv: line 4 \(slide 'siteA-tumour-2'\): .*broken.tiff"):
        prepare_dataset("mine", "slide_table", "unused", _slide_params(edited))


# ---------------------------------------------------------------------------------------------- features


def test_features_computed_elsewhere_are_read_by_id_and_named_as_an_encoder(tmp_path):
    path, sheet = write_feature_study(tmp_path, encoder_dims=12)
    params = _params("features", sheet=str(sheet), files={"their-uni": path.name}, classes=CLASSES)
    rows = read_feature_table("mine", params)
    ids, feats = read_feature_file(path)
    assert feats.shape == (len(rows), 12) and set(ids) == set(rows["item_id"])
    assert rows["source"].str.startswith("features:").all()
    entry = precomputed_encoders({("their-uni", "mine"): {"file": str(path), "features_key": "features",
                                                          "ids_key": None, "readout": None}}, {})["their-uni"]
    assert entry["loader"] == "precomputed" and entry["embed_dim"] == 12 and entry["readouts"] == ["cls"]
    # an item of the sheet missing from the file is named with its line
    with h5py.File(tmp_path / "fewer.h5", "w") as f:
        f["features"] = feats[1:]
        f["item_id"] = np.asarray(ids[1:], dtype="S")
    fewer = _params("features", sheet=str(sheet), files={"their-uni": "fewer.h5"}, classes=CLASSES)
    line = int(rows.loc[rows["item_id"] == ids[0], "sheet_line"].iloc[0])
    with pytest.raises(FmauditInputError, match=rf"fewer.h5 \(features of encoder 'their-uni'\): 1 item\(s\) of .*"
                                                rf"{ids[0]!r} \(lines {line}\)"):
        read_feature_table("mine", fewer)
    with pytest.raises(FmauditInputError, match=r"no item-id array .* it holds \['features', 'other'\]"):
        with h5py.File(tmp_path / "noids.h5", "w") as f:
            f["features"] = feats
            f["other"] = np.zeros(3)
        read_feature_file(tmp_path / "noids.h5")
