"""LungHist700 and SPIDER-breast preparers on tiny copies of the releases' real layouts built in tmp_path, the
registry entries of the added data sets, and the pending cell-level preparer.

Images are 8x8 random pictures (distinct unless a test copies one on purpose, to check duplicate removal).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from fmaudit.datasets import PREPARERS, get_preparer, prepare_dataset
from fmaudit.datasets.manifest import check_group_disjoint
from fmaudit.datasets.public.extra import (
    LUNGHIST_CLASSES,
    LUNGHIST_OFFICIAL_SPLIT,
    SPIDER_BREAST_CLASSES,
    parse_lunghist_name,
)
from fmaudit.io import FmauditInputError

REPO = Path(__file__).resolve().parents[3]


SAFE_ID = re.compile(r"^[A-Za-z0-9._-]+$")


_counter = iter(range(10**6))


def img(path: Path, fmt: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(next(_counter))
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path, format=fmt)
    return path


def prep(dataset, preparer, root, **params):
    df = prepare_dataset(dataset, preparer, root, params)
    assert (df["dataset"] == dataset).all()
    assert df["item_id"].is_unique and df["item_id"].map(lambda s: bool(SAFE_ID.match(s))).all()
    assert df["split"].isin(["train", "val", "test"]).all()
    check_group_disjoint(df)
    assert (df.groupby("label")["label_name"].nunique() == 1).all()
    assert all(Path(s).is_absolute() for s in df["source"])
    return df


# (class, resolution, image id, patient): every class at both resolutions, 10 patients; patients 2 and 9 are
# on the authors' 20x train and test lists, 6 on the 20x val list
LUNG_ROWS = [
    (cls, res, 900 + 10 * k + j, patient)
    for k, cls in enumerate(LUNGHIST_CLASSES)
    for res in ("20x", "40x")
    for j, patient in enumerate((2, 9, 6) if res == "20x" else (2, 11, 4))
]


def make_lunghist(root: Path, csv_name: str = "data.csv", rows=LUNG_ROWS) -> Path:
    base = root / "LungHist700"
    for cls, res, image_id, _ in rows:
        img(base / "images" / cls / f"{cls}_{res}_{image_id}.jpg", fmt="JPEG")
    table = pd.DataFrame(
        [{"superclass": c[:3], "subclass": c[4:] or None, "resolution": r, "image_id": i, "patient_id": p}
         for c, r, i, p in rows])
    table.to_csv(base / csv_name, index=False)
    return base


def test_parse_lunghist_name_of_the_release():
    assert parse_lunghist_name("aca_bd_20x_901.jpg") == {"fine_class": "aca_bd", "resolution": "20x", "image_id": 901}
    assert parse_lunghist_name("nor_40x_7.jpg")["fine_class"] == "nor"
    with pytest.raises(FmauditInputError, match="does not follow"):
        parse_lunghist_name("aca_xx_20x_1.jpg")


def test_lunghist_fine_classes_patient_groups_both_resolutions(tmp_path):
    make_lunghist(tmp_path)
    df = prep("lunghist700", "lunghist700", tmp_path, seed=0)
    assert len(df) == len(LUNG_ROWS) == 42
    assert list(pd.Series(df.groupby("label")["label_name"].first())) == list(LUNGHIST_CLASSES)
    assert set(df["group"]) == {f"patient_{p}" for p in (2, 9, 6, 11, 4)}
    assert set(df["resolution"]) == {"20x", "40x"}
    row = df[df["source"].str.endswith("nor_40x_931.jpg")].iloc[0]
    assert (row["label_name"], row["patient_id"], row["group"]) == ("nor", 11, "patient_11")
    assert df.attrs["provenance"]["split_mode"] == "grouped"


def test_lunghist_resolution_coarse_taxonomy_and_image_groups(tmp_path):
    make_lunghist(tmp_path, csv_name="LungHist700.csv")  # the csv's other name is found too
    df = prep("lunghist700", "lunghist700", tmp_path, resolution="40x", taxonomy="coarse", group_by="image")
    assert len(df) == 21 and set(df["resolution"]) == {"40x"}
    assert dict(df.groupby("label_name")["label"].first()) == {"aca": 0, "nor": 1, "scc": 2}
    assert (df.groupby("label_name").size() == pd.Series({"aca": 9, "nor": 3, "scc": 9})).all()
    assert (df["group"] == df["item_id"]).all()


def test_lunghist_official_split_is_the_authors_patient_lists(tmp_path):
    make_lunghist(tmp_path)
    df = prep("lunghist700", "lunghist700", tmp_path, resolution="20x", split_mode="official")
    lists = LUNGHIST_OFFICIAL_SPLIT["20x"]
    expected = {2: "train", 9: "test", 6: "val"}
    assert all(p in lists[s] for p, s in expected.items())
    assert dict(zip(df["patient_id"], df["split"])) == expected
    with pytest.raises(FmauditInputError, match="one resolution"):
        prepare_dataset("lunghist700", "lunghist700", tmp_path, {"split_mode": "official"})


def test_lunghist_image_level_split_needs_no_table_but_patient_groups_do(tmp_path):
    base = make_lunghist(tmp_path)
    (base / "data.csv").unlink()
    df = prep("lunghist700", "lunghist700", tmp_path, group_by="image", fractions=[0.7, 0.15, 0.15])
    assert len(df) == 42 and "patient_id" not in df.columns
    with pytest.raises(FmauditInputError, match="group_by patient needs the release's metadata table"):
        prepare_dataset("lunghist700", "lunghist700", tmp_path, {})


def test_lunghist_duplicates_nested_folder_and_table_mismatches(tmp_path):
    nested = tmp_path / "nested"
    base = make_lunghist(nested)
    shutil.move(str(base), str(nested / "inner"))
    (nested / "LungHist700").mkdir()
    shutil.move(str(nested / "inner"), str(nested / "LungHist700" / "LungHist700"))
    # an exact copy, listed in the table under its own id: removed as a duplicate
    copy_dir = nested / "LungHist700" / "LungHist700"
    shutil.copy(copy_dir / "images/nor/nor_20x_930.jpg", copy_dir / "images/nor/nor_20x_999.jpg")
    with open(copy_dir / "data.csv", "a") as fh:
        fh.write("nor,,20x,999,2\n")
    df = prep("lunghist700", "lunghist700", nested)
    assert len(df) == 42 and df.attrs["provenance"]["duplicates_removed"] == 1

    base = make_lunghist(tmp_path / "extra_image")
    img(base / "images/aca_bd/aca_bd_20x_5.jpg", fmt="JPEG")
    with pytest.raises(FmauditInputError, match=r"1 image\(s\) have no row in the metadata table"):
        prepare_dataset("x", "lunghist700", tmp_path / "extra_image", {})
    base = make_lunghist(tmp_path / "missing_image")
    (base / "images/scc_pd/scc_pd_40x_962.jpg").unlink()
    with pytest.raises(FmauditInputError, match=r"listed in the metadata table are missing, e.g. .*scc_pd_40x_962"):
        prepare_dataset("x", "lunghist700", tmp_path / "missing_image", {})
    base = make_lunghist(tmp_path / "misplaced")
    shutil.move(str(base / "images/aca_bd/aca_bd_20x_900.jpg"), str(base / "images/aca_md/aca_bd_20x_900.jpg"))
    with pytest.raises(FmauditInputError, match="is named aca_bd but lies in aca_md/"):
        prepare_dataset("x", "lunghist700", tmp_path / "misplaced", {})


def test_lunghist_bad_parameters(tmp_path):
    make_lunghist(tmp_path)
    with pytest.raises(FmauditInputError, match="'resolution' must be one of"):
        prepare_dataset("x", "lunghist700", tmp_path, {"resolution": "10x"})
    with pytest.raises(FmauditInputError, match="unknown parameter 'magnification'"):
        prepare_dataset("x", "lunghist700", tmp_path, {"magnification": "20x"})


def make_spider(root: Path, records: list[dict] | None = None) -> Path:
    base = root / "SPIDER-breast"
    if records is None:
        records = []
        for k, cls in enumerate(SPIDER_BREAST_CLASSES[:4]):
            for slide in range(6):
                split = "test" if slide >= 4 else "train"
                for j in range(2):
                    name = f"slide{slide}_{k}_{j}.png"
                    records.append({"slide_id": f"S{slide}", "image_name": name, "class": cls, "split": split,
                                    "context_info": {"0_0": f"ctx_{name}"}})
    for r in records:
        img(base / "images" / r["image_name"], fmt="PNG")
    (base / "metadata.json").write_text(json.dumps(records))
    return base


def test_spider_official_split_slide_groups_and_val_carving(tmp_path):
    make_spider(tmp_path)
    df = prep("spider-breast", "spider_breast", tmp_path)
    assert len(df) == 4 * 6 * 2
    assert (df["split"] == df["release_split"]).all() and set(df["split"]) == {"train", "test"}
    assert set(df.loc[df["split"] == "test", "slide_id"]) == {"S4", "S5"}
    assert dict(df.groupby("label")["label_name"].first()) == dict(enumerate(SPIDER_BREAST_CLASSES[:4]))
    assert (df["group"] == "slide_" + df["slide_id"]).all()
    carved = prep("spider-breast", "spider_breast", tmp_path, val_fraction=0.25)
    assert set(carved["split"]) == {"train", "val", "test"}
    assert (carved.loc[carved["split"] == "test", "item_id"].sort_values().to_numpy()
            == df.loc[df["split"] == "test", "item_id"].sort_values().to_numpy()).all()


def test_spider_labels_index_the_fixed_18_class_list_whatever_is_present(tmp_path):
    # the release's 18 classes in name order (PRISM's label order); indices do not depend on the classes present
    assert len(SPIDER_BREAST_CLASSES) == 18 and list(SPIDER_BREAST_CLASSES) == sorted(SPIDER_BREAST_CLASSES)
    records = [{"slide_id": f"S{i}", "image_name": f"p{i}.png", "class": c, "split": "train" if i < 2 else "test"}
               for i, c in enumerate(["Vessels", "Fat", "Vessels", "Fat"])]
    make_spider(tmp_path, records)
    df = prep("x", "spider_breast", tmp_path)
    assert dict(df.groupby("label_name")["label"].first()) == {"Fat": 4, "Vessels": 17}


def test_spider_grouped_mode_ignores_the_release_split(tmp_path):
    make_spider(tmp_path)
    df = prep("spider-breast", "spider_breast", tmp_path, split_mode="grouped", fractions=[0.5, 0.0, 0.5], seed=1)
    assert set(df["split"]) == {"train", "test"}
    assert df.groupby("slide_id")["split"].nunique().max() == 1
    assert df.attrs["provenance"]["split_mode"] == "grouped"


def test_spider_slide_on_both_release_splits_is_refused_in_official_mode(tmp_path):
    records = [{"slide_id": "A", "image_name": f"a{i}.png", "class": "Fat", "split": s}
               for i, s in enumerate(["train", "train", "test"])]
    records += [{"slide_id": "B", "image_name": f"b{i}.png", "class": "Fibrosis", "split": "train"} for i in range(2)]
    make_spider(tmp_path, records)
    with pytest.raises(FmauditInputError, match="1 slide\\(s\\) have patches in both .* use split_mode grouped"):
        prepare_dataset("x", "spider_breast", tmp_path, {})
    df = prep("x", "spider_breast", tmp_path, split_mode="grouped", fractions=[0.5, 0.0, 0.5])
    assert df.groupby("slide_id")["split"].nunique().max() == 1


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update({"class": "Tumour"}), "has class 'Tumour'"),
    (lambda r: r.update({"split": "holdout"}), "has split 'holdout'"),
    (lambda r: r.pop("slide_id"), r"lacks \['slide_id'\]"),
])
def test_spider_bad_records_name_the_record(tmp_path, change, message):
    base = make_spider(tmp_path)
    records = json.loads((base / "metadata.json").read_text())
    change(records[3])
    (base / "metadata.json").write_text(json.dumps(records))
    with pytest.raises(FmauditInputError, match=f"record 3 {message}"):
        prepare_dataset("x", "spider_breast", tmp_path, {})


def test_spider_missing_images(tmp_path):
    base = make_spider(tmp_path)
    (base / "images" / "slide0_0_0.png").unlink()
    with pytest.raises(FmauditInputError, match=r"1 image\(s\) named in metadata.json are missing"):
        prepare_dataset("x", "spider_breast", tmp_path, {})
    shutil.rmtree(base / "images")
    with pytest.raises(FmauditInputError, match="expected SPIDER-breast/images under data_root"):
        prepare_dataset("x", "spider_breast", tmp_path, {})


@pytest.mark.parametrize("preparer, expected, url", [
    ("lunghist700", "LungHist700/images", "https://figshare.com/articles/dataset/LungHist700/25459174"),
    ("spider_breast", "SPIDER-breast/metadata.json", "https://huggingface.co/datasets/histai/SPIDER-breast"),
])
def test_missing_data_set_says_where_and_how(tmp_path, preparer, expected, url):
    with pytest.raises(FmauditInputError) as e:
        prepare_dataset("x", preparer, tmp_path, {})
    msg = str(e.value)
    assert f"expected {expected} under data_root {tmp_path}; get it from {url}" in msg
    assert msg.endswith("and unpack it there")


def registry() -> dict:
    return yaml.safe_load((REPO / "resources" / "datasets.yaml").read_text())


@pytest.mark.parametrize("slug, preparer", [("lunghist700", "lunghist700"), ("spider-breast", "spider_breast")])
def test_registry_entries_are_complete_and_their_params_are_accepted(tmp_path, slug, preparer):
    entry = registry()[slug]
    assert entry["preparer"] == preparer and preparer in PREPARERS and entry["kind"] == "tiles"
    for key in ("description", "licence", "params", "citation", "expected_under", "how_to_get", "url", "size"):
        assert entry.get(key) not in (None, ""), f"{slug}: {key} missing"
    for f in entry.get("files") or []:
        assert f["url"].startswith("https://") and f["sha256"] is None and f.get("md5") is None
    with pytest.raises(FmauditInputError, match="under data_root"):
        prepare_dataset(slug, preparer, tmp_path, entry["params"])


def test_cell_level_panel_is_pending_on_its_section_list(tmp_path):
    # the preparer exists (fmaudit.cells.prepare); the panel is pending because the seed names no section
    entry = registry()["cellpath-xenium"]
    assert (entry["preparer"], entry["kind"], entry["status"]) == ("xenium_cells", "xenium_cells", "pending")
    assert get_preparer("xenium_cells") is PREPARERS["xenium_cells"]
    with pytest.raises(FmauditInputError, match="cellpath-xenium: params.sections lists no Xenium sections"):
        prepare_dataset("cellpath-xenium", entry["preparer"], tmp_path, entry["params"])


def test_unknown_preparer_is_still_unknown():
    with pytest.raises(FmauditInputError, match="unknown preparer 'xenium_cellz'; known: .*'lunghist700'"):
        get_preparer("xenium_cellz")
