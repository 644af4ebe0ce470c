"""Pathology preparers on fake data laid out as each release ships it: labels, groups, official splits, errors."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fmaudit.datasets import get_preparer, prepare_dataset
from fmaudit.datasets.manifest import check_group_disjoint
from fmaudit.datasets.public import (
    parse_breakhis_name,
    select_panda_slides,
    sicap_primary_label,
)
from fmaudit.io import FmauditInputError

REPO = Path(__file__).resolve().parents[3]


SAFE_ID = re.compile(r"^[A-Za-z0-9._-]+$")


_counter = iter(range(10**6))


def img(path: Path, size: int = 8, fmt: str | None = None, seed: int | None = None) -> Path:
    """A distinct small RGB image (a fresh seed each call unless given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(next(_counter) if seed is None else seed)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path, format=fmt)
    return path


def check_manifest(df: pd.DataFrame, dataset: str) -> None:
    assert (df["dataset"] == dataset).all()
    assert df["item_id"].is_unique and df["item_id"].map(lambda s: bool(SAFE_ID.match(s))).all()
    assert df["split"].isin(["train", "val", "test"]).all()
    check_group_disjoint(df)
    labels = df.dropna(subset=["label"])
    assert (labels.groupby("label")["label_name"].nunique() == 1).all()
    assert all(Path(s).is_absolute() for s in df["source"])


def prep(dataset, preparer, root, **params):
    df = prepare_dataset(dataset, preparer, root, params)
    check_manifest(df, dataset)
    return df


NCT = ("ADI", "BACK", "DEB", "LYM", "MUC", "MUS", "NORM", "STR", "TUM")


def make_nct(root: Path) -> None:
    for cls in NCT:
        for i in range(3):
            img(root / "NCT-CRC-HE-100K-NONORM" / cls / f"{cls}-TRAIN{i:04d}.tif", fmt="TIFF")
        img(root / "CRC-VAL-HE-7K" / cls / f"{cls}-TCGA-VAL{cls}.tif", fmt="TIFF")
    # an exact copy inside the training set
    shutil.copy(root / "NCT-CRC-HE-100K-NONORM/TUM/TUM-TRAIN0000.tif",
                root / "NCT-CRC-HE-100K-NONORM/TUM/TUM-ZCOPY.tif")


def test_nct_official_test_set_labels_and_duplicates(tmp_path):
    make_nct(tmp_path)
    df = prep("nct-crc-he-100k", "nct_crc_he", tmp_path, seed=0)
    assert len(df) == 9 * 3 + 9  # the copy is gone
    assert not df["source"].str.endswith("TUM-ZCOPY.tif").any()
    assert df.groupby("split").size().to_dict() == {"test": 9, "train": 27}
    assert (df.loc[df["split"] == "test", "subset"] == "CRC-VAL-HE-7K").all()
    names = df.drop_duplicates("label").set_index("label")["label_name"].sort_index()
    assert list(names) == list(NCT)
    assert (df["group"] == df["item_id"]).all() and (df["domain"] == "nct-crc-he-100k").all()
    # with the registry's entry, the manifest says its groups are items (no patient ids are released)
    from fmaudit.datasets import dataset_group_unit
    from fmaudit.registry import load_dataset_registry

    entry = load_dataset_registry()["nct-crc-he-100k"]
    assert dataset_group_unit(entry) == "item"
    named = prepare_dataset("nct-crc-he-100k", "nct_crc_he", tmp_path, {"seed": 0},
                            group_unit=dataset_group_unit(entry))
    assert (named["group_unit"] == "item").all()


def test_nct_without_test_set_and_subsample(tmp_path):
    make_nct(tmp_path)
    fn = get_preparer("nct_crc_he")
    raw = fn("nct", tmp_path, {"test_set": False, "subsample": 18, "fractions": [0.5, 0.0, 0.5]})
    assert raw.attrs["provenance"]["duplicates_removed"] == 1
    assert raw.attrs["provenance"]["items"] == 18
    assert raw["label"].value_counts().eq(2).all()  # class-stratified sample of 9 classes
    assert set(raw["split"]) == {"train", "test"}


def test_nct_subsample_as_the_audit_paper_drew_it(tmp_path):
    from sklearn.model_selection import train_test_split

    make_nct(tmp_path)
    fn = get_preparer("nct_crc_he")
    raw = fn("nct", tmp_path, {"test_set": False, "subsample": 18, "subsample_method": "audit", "seed": 42,
                               "fractions": [0.5, 0.0, 0.5]})
    # the audit paper: files listed class by class (sorted folders), sorted within a class, duplicates removed, then
    # train_test_split(train_size=n, stratify=labels, random_state=42)
    listing = [p for cls in NCT for p in sorted((tmp_path / "NCT-CRC-HE-100K-NONORM" / cls).glob("*.tif"))
               if p.name != "TUM-ZCOPY.tif"]
    labels = [NCT.index(p.parent.name) for p in listing]
    kept, _ = train_test_split(listing, train_size=18, random_state=42, stratify=labels)
    assert sorted(raw["source"]) == sorted(str(p) for p in kept)
    with pytest.raises(FmauditInputError, match="subsample_method"):
        fn("nct", tmp_path, {"test_set": False, "subsample": 18, "subsample_method": "random"})
    with pytest.raises(FmauditInputError, match="'seed003' is now called 'audit'"):  # the old name, no alias
        fn("nct", tmp_path, {"test_set": False, "subsample": 18, "subsample_method": "seed003"})


def test_nct_variant_and_param_errors(tmp_path):
    make_nct(tmp_path)
    with pytest.raises(FmauditInputError, match="expected NCT-CRC-HE-100K under data_root"):
        prepare_dataset("nct", "nct_crc_he", tmp_path, {"variant": "NORM"})
    with pytest.raises(FmauditInputError, match="'variant' must be one of"):
        prepare_dataset("nct", "nct_crc_he", tmp_path, {"variant": "macenko"})
    with pytest.raises(FmauditInputError, match="unknown parameter 'seeds'"):
        prepare_dataset("nct", "nct_crc_he", tmp_path, {"seeds": 1})
    (tmp_path / "NCT-CRC-HE-100K-NONORM" / "EXTRA").mkdir()
    with pytest.raises(FmauditInputError, match="is not a class folder"):
        prepare_dataset("nct", "nct_crc_he", tmp_path, {})


def make_lc25000(root: Path) -> None:
    base = root / "lung_colon_image_set"
    for cls in ("lung_aca", "lung_n", "lung_scc"):
        for i in range(1, 6):
            img(base / "lung_image_sets" / cls / f"{cls.replace('_', '')}{i}.jpeg", fmt="JPEG")
    for cls in ("colon_aca", "colon_n"):
        for i in range(1, 6):
            img(base / "colon_image_sets" / cls / f"{cls.replace('_', '')}{i}.jpeg", fmt="JPEG")


@pytest.mark.parametrize("subset,classes", [("lung", ["lung_aca", "lung_n", "lung_scc"]),
                                            ("colon", ["colon_aca", "colon_n"])])
def test_lc25000_subsets_are_separate_tasks(tmp_path, subset, classes):
    make_lc25000(tmp_path)
    df = prep(f"lc25000-{subset}", "lc25000", tmp_path, subset=subset)
    assert sorted(df["label_name"].unique()) == classes
    assert len(df) == 5 * len(classes)
    assert pd.crosstab(df["label_name"], df["split"]).eq(pd.Series({"train": 3, "val": 1, "test": 1})).all().all()


def make_breakhis(root: Path) -> None:
    breast = root / "BreaKHis_v1" / "histology_slides" / "breast"
    cases = [("benign", "adenosis", "B", "A", "14-22549AB"), ("benign", "adenosis", "B", "A", "14-22549CD"),
             ("benign", "fibroadenoma", "B", "F", "14-9133"), ("malignant", "ductal_carcinoma", "M", "DC", "14-10926"),
             ("malignant", "mucinous_carcinoma", "M", "MC", "13-20629"),
             ("benign", "tubular_adenoma", "B", "TA", "14-3411F")]
    for top, sub, c, t, pid in cases:
        folder = breast / top / "SOB" / sub / f"SOB_{c}_{t}_{pid}"
        for mag in (40, 100):
            for k in (1, 2):
                img(folder / f"{mag}X" / f"SOB_{c}_{t}-{pid}-{mag}-{k:03d}.png")


def test_parse_breakhis_name_example_of_the_release():
    info = parse_breakhis_name("SOB_B_A-14-22549AB-100-001.png")
    assert info == {"binary": "benign", "subtype": "adenosis", "patient_id": "14-22549AB",
                    "biopsy_id": "14-22549", "magnification": 100}
    assert parse_breakhis_name("SOB_M_DC-14-2523-400-013.png")["biopsy_id"] == "14-2523"
    with pytest.raises(FmauditInputError, match="does not follow"):
        parse_breakhis_name("image_001.png")


def test_breakhis_groups_magnification_and_labels(tmp_path):
    make_breakhis(tmp_path)
    df = prep("breakhis", "breakhis", tmp_path)
    assert len(df) == 6 * 2 * 2
    assert df["label_name"].value_counts().to_dict() == {"benign": 16, "malignant": 8}
    # the two slides of biopsy 14-22549 (AB and CD) form one group, on one side of the split
    assert set(df.loc[df["patient_id"].str.startswith("14-22549"), "group"]) == {"14-22549"}
    by_patient = prep("breakhis", "breakhis", tmp_path, group_by="patient")
    assert by_patient["group"].nunique() == 6
    mag100 = prep("breakhis", "breakhis", tmp_path, magnification=100, label="subtype")
    assert (mag100["magnification"] == 100).all() and len(mag100) == 12
    assert mag100.set_index("label_name")["label"].to_dict()["ductal_carcinoma"] == 4
    with pytest.raises(FmauditInputError, match="magnification must be"):
        prepare_dataset("breakhis", "breakhis", tmp_path, {"magnification": 50})


def test_breakhis_misnamed_file_is_an_error(tmp_path):
    make_breakhis(tmp_path)
    img(tmp_path / "BreaKHis_v1/histology_slides/breast/benign/SOB/adenosis/x/40X/photo.png")
    with pytest.raises(FmauditInputError, match="photo.png"):
        prepare_dataset("breakhis", "breakhis", tmp_path, {})


def make_pcam(root: Path, n: int = 24, gz_y: bool = True) -> np.ndarray:
    raw = root / "pcam"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)
    x[5] = x[2]  # a duplicate patch
    y = (np.arange(n) % 2).astype(np.uint8).reshape(n, 1, 1, 1)
    base = raw / "camelyonpatch_level_2_split_test"
    with h5py.File(f"{base}_x.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(4, 96, 96, 3))
    with h5py.File(f"{base}_y.h5", "w") as f:
        f.create_dataset("y", data=y)
    if gz_y:  # as downloaded; the preparer decompresses it
        Path(f"{base}_y.h5.gz").write_bytes(gzip.compress(Path(f"{base}_y.h5").read_bytes()))
        os.remove(f"{base}_y.h5")
    wsi = [f"test_{i // 4:03d}" for i in range(n)]
    meta = pd.DataFrame({"coord_y": np.arange(n) * 96, "coord_x": np.arange(n) * 32, "tumor_patch": y.ravel() > 0,
                         "center_tumor_patch": y.ravel() > 0, "wsi": wsi})
    meta.to_csv(f"{base}_meta.csv")  # with the unnamed index column of the release
    return x


def test_pcam_writes_png_per_slide_and_splits_by_slide(tmp_path):
    x = make_pcam(tmp_path)
    df = prep("pcam", "pcam", tmp_path, fractions=[0.5, 0.0, 0.5])
    assert len(df) == 23  # one duplicate patch dropped
    assert set(df["group"]) == {f"test_{k:03d}" for k in range(6)}
    assert (df.groupby("group")["split"].nunique() == 1).all()
    row = df[df["pcam_index"] == 7].iloc[0]
    assert Path(row["source"]).name == "test_001__000007.png"
    assert np.array_equal(np.asarray(Image.open(row["source"])), x[7])
    assert row["label_name"] == "tumor" and row["label"] == 1
    written = sorted(p.name for p in (tmp_path / "pcam" / "png" / "test").iterdir())
    assert len(written) == 23 and "test_001__000005.png" not in written
    assert (tmp_path / "pcam" / "camelyonpatch_level_2_split_test_y.h5").exists()


def test_pcam_official_and_errors(tmp_path):
    make_pcam(tmp_path, gz_y=False)
    df = prep("pcam", "pcam", tmp_path, split_mode="official", dedup="none")
    assert (df["split"] == "test").all() and len(df) == 24
    with pytest.raises(FmauditInputError, match="expected pcam/camelyonpatch_level_2_split_train_x.h5"):
        prepare_dataset("pcam", "pcam", tmp_path, {"source_splits": ["train"]})
    with pytest.raises(FmauditInputError, match="source_splits"):
        prepare_dataset("pcam", "pcam", tmp_path, {"source_splits": ["holdout"]})


def test_pcam_without_slide_names_uses_patches_as_groups(tmp_path):
    make_pcam(tmp_path)
    meta_path = tmp_path / "pcam" / "camelyonpatch_level_2_split_test_meta.csv"
    pd.read_csv(meta_path, index_col=0).drop(columns="wsi").to_csv(meta_path)
    df = prep("pcam", "pcam", tmp_path, png_dir="pcam/png_noslide")
    assert (df["group"] == df["item_id"]).all() and len(df) == 23
    assert (df["group_unit"] == "item").all()  # the preparer says so: the registry's "slide" does not apply
    assert (tmp_path / "pcam" / "png_noslide" / "test" / "test_000007.png").exists()


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


SICAP_SLIDES = {"16B0001851": 1, "16B0003388": 1, "17B0027432": 2, "18B0006169": 3, "18B0005478": 4, "16B0022608": 5}


def _sicap_rows(slides, grades):
    rows = []
    for s in slides:
        for k, g in enumerate(grades):
            name = f"{s}_Block_Region_{k}_0_0_xini_{100 * k}_yini_{50 * k}.jpg"
            rows.append({"image_name": name, **{c: int(c == g) for c in ("NC", "G3", "G4", "G5")}, "G4C": 0})
    return pd.DataFrame(rows)


def make_sicap(root: Path, csv: bool = False) -> None:
    base = root / "SICAPv2"
    train = _sicap_rows(["16B0001851", "16B0003388", "17B0027432", "18B0006169"], ["NC", "G3", "G4", "G5"])
    test = _sicap_rows(["18B0005478", "16B0022608"], ["NC", "G3", "G4", "G5"])
    test.loc[0, "G3"] = 1  # an ambiguous row: NC and G3 both set -> the higher grade
    fold_tr = train[train["image_name"].str.startswith(("16B", "17B"))]
    fold_va = train[train["image_name"].str.startswith("18B")]
    for df in (train, test):
        for name in df["image_name"]:
            img(base / "images" / name, fmt="JPEG")
    wsi = pd.DataFrame({"slide_id": list(SICAP_SLIDES), "patient_id": list(SICAP_SLIDES.values()),
                        "Gleason_primary": 3, "Gleason_secondary": 4})
    def write_csv(path: Path, df: pd.DataFrame) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path.with_suffix(".csv"), index=False)

    write = write_csv if csv else write_xlsx
    write(base / "partition" / "Test" / "Train.xlsx", train)
    write(base / "partition" / "Test" / "Test.xlsx", test)
    write(base / "partition" / "Validation" / "Val1" / "Train.xlsx", fold_tr)
    write(base / "partition" / "Validation" / "Val1" / "Test.xlsx", fold_va)
    write(base / "wsi_labels.xlsx", wsi)


@pytest.mark.parametrize("csv", [False, True])
def test_sicapv2_official_partition_patients_and_primary_label(tmp_path, csv):
    make_sicap(tmp_path, csv=csv)
    fn = get_preparer("sicapv2")
    raw = fn("sicapv2", tmp_path, {})
    assert raw.attrs["provenance"]["ambiguous_labels"] == 1
    df = prep("sicapv2", "sicapv2", tmp_path)
    assert len(df) == 6 * 4
    assert df.groupby("split").size().to_dict() == {"test": 8, "train": 16}
    # two slides of patient 1 form one group
    assert set(df.loc[df["slide_id"].isin(["16B0001851", "16B0003388"]), "group"]) == {"1"}
    first = df[df["item_id"] == "18B0005478_Block_Region_0_0_0_xini_0_yini_0"].iloc[0]
    assert first["label_name"] == "G3"
    assert df.set_index("label_name")["label"].to_dict() == {"NC": 0, "G3": 1, "G4": 2, "G5": 3}


def test_sicapv2_validation_fold_and_grouped_mode(tmp_path):
    make_sicap(tmp_path)
    fold = prep("sicapv2", "sicapv2", tmp_path, partition="Val1")
    assert fold.groupby("split").size().to_dict() == {"test": 8, "train": 12, "val": 4}
    grouped = prep("sicapv2", "sicapv2", tmp_path, split_mode="grouped", fractions=[0.6, 0.2, 0.2])
    assert grouped["group"].nunique() == 5 and len(grouped) == 24


def test_sicapv2_label_rules_and_missing_slide(tmp_path):
    assert sicap_primary_label(pd.Series({"NC": 0, "G3": 0, "G4": 0, "G5": 0, "G4C": 1})) == ("G4", False)
    assert sicap_primary_label(pd.Series({"NC": float("nan"), "G3": 1, "G4": 0, "G5": 0})) == ("G3", False)
    assert sicap_primary_label(pd.Series({"NC": 1, "G3": 0, "G4": 1, "G5": 0})) == ("G4", True)
    with pytest.raises(FmauditInputError, match="no class set"):
        sicap_primary_label(pd.Series({"image_name": "x.jpg", "NC": 0, "G3": 0, "G4": 0, "G5": 0, "G4C": 0}))
    make_sicap(tmp_path)
    write_xlsx(tmp_path / "SICAPv2" / "wsi_labels.xlsx", pd.DataFrame({"slide_id": ["16B0001851"], "patient_id": [1]}))
    with pytest.raises(FmauditInputError, match="not in wsi_labels"):
        prepare_dataset("sicapv2", "sicapv2", tmp_path, {})


def make_panda(root: Path) -> pd.DataFrame:
    rows = []
    for prov in ("karolinska", "radboud"):
        for grade in (0, 3):
            for k in range(3):
                rows.append({"image_id": f"{prov[:3]}{grade}{k}aa", "data_provider": prov, "isup_grade": grade,
                             "gleason_score": "0+0" if grade == 0 else "4+3"})
    table = pd.DataFrame(rows)
    (root / "panda" / "train_images").mkdir(parents=True)
    table.to_csv(root / "panda" / "train.csv", index=False)
    return table


def link_slides(root: Path, ids) -> None:
    # the real (CC0) CMU-1-Small-Region slide stands in for every PANDA slide
    svs = REPO / "resources" / "data" / "CMU-1-Small-Region.svs"
    for i in ids:
        os.symlink(svs, root / "panda" / "train_images" / f"{i}.tiff")


def test_select_panda_slides_per_provider_and_grade():
    table = pd.DataFrame({"image_id": [f"s{i:02d}" for i in range(40)], "data_provider": ["a", "b"] * 20,
                          "isup_grade": [0] * 20 + [5] * 20})
    sel = select_panda_slides(table, n_per_cell=3, seed=42)
    assert sel.groupby(["data_provider", "isup_grade"]).size().eq(3).all()
    assert sel.equals(select_panda_slides(table.sample(frac=1, random_state=1), 3, 42))  # row order does not matter
    assert len(select_panda_slides(table, n_per_cell=100, seed=42)) == 40
    with pytest.raises(FmauditInputError, match="isup_grade"):
        select_panda_slides(table.drop(columns="isup_grade"))


def test_panda_tiles_selected_slides_with_tile_coordinates(tmp_path):
    table = make_panda(tmp_path)
    params = dict(n_per_cell=2, target_mpp=2.0, tile_size=64, min_tissue_fraction=0.2, max_tiles_per_slide=3,
                  fractions=[0.5, 0.0, 0.5])
    with pytest.raises(FmauditInputError, match=r"expected panda/train_images/.*\.tiff under data_root"):
        prepare_dataset("panda", "panda", tmp_path, params)
    chosen = select_panda_slides(table, 2, 42)
    link_slides(tmp_path, chosen["image_id"][:5])
    with pytest.raises(FmauditInputError, match="3 of 8 selected slides are missing"):
        prepare_dataset("panda", "panda", tmp_path, params)
    link_slides(tmp_path, chosen["image_id"][5:])
    df = prep("panda", "panda", tmp_path, **params)
    assert set(df["group"]) == set(chosen["image_id"])
    assert df.groupby("group").size().eq(3).all()
    assert df[["x", "y", "level", "size"]].notna().all().all()
    assert set(df["domain"]) == {"karolinska", "radboud"}
    assert set(df["label_name"]) == {"isup0", "isup3"} and set(df["label"]) == {0, 3}
    # slide-disjoint and stratified by grade x provider: every cell has a slide on each side
    cells = df.drop_duplicates("group").groupby(["domain", "label", "split"]).size()
    assert cells.eq(1).all() and len(cells) == 8


def make_mhist(root: Path) -> None:
    rows = []
    for i in range(12):
        name = f"MHIST_{'abcdefghijkl'[i]}{i:02d}.png"
        img(root / "MHIST" / "images" / name)
        rows.append({"Image Name": name, "Majority Vote Label": "SSA" if i % 3 == 0 else "HP",
                     "Number of Annotators who Selected SSA (Out of 7)": 5 if i % 3 == 0 else 1,
                     "Partition": "test" if i >= 9 else "train"})
    pd.DataFrame(rows).to_csv(root / "MHIST" / "annotations.csv", index=False)


def test_mhist_official_partition_and_val_carving(tmp_path):
    make_mhist(tmp_path)
    df = prep("mhist", "mhist", tmp_path)
    assert df.groupby("split").size().to_dict() == {"test": 3, "train": 9}
    assert df.set_index("label_name")["label"].to_dict() == {"HP": 0, "SSA": 1}
    carved = prep("mhist", "mhist", tmp_path, val_fraction=1 / 3)
    assert carved.groupby("split").size().to_dict() == {"test": 3, "train": 6, "val": 3}
    ann = pd.read_csv(tmp_path / "MHIST" / "annotations.csv")
    ann.loc[0, "Majority Vote Label"] = "TA"
    ann.to_csv(tmp_path / "MHIST" / "annotations.csv", index=False)
    with pytest.raises(FmauditInputError, match="row 0 has label 'TA'"):
        prepare_dataset("mhist", "mhist", tmp_path, {})


BRACS = ("N", "PB", "UDH", "FEA", "ADH", "DCIS", "IC")


def make_bracs(root: Path) -> None:
    base = root / "BRACS_RoI" / "latest_version"
    wsi = {"train": [264, 265], "val": [300], "test": [400]}
    for split, ids in wsi.items():
        for k, cls in enumerate(BRACS):
            for w in ids:
                img(base / split / f"{k}_{cls}" / f"BRACS_{w}_{cls}_{k + 1}.png")


def test_bracs_official_split_wsi_groups_and_taxonomies(tmp_path):
    make_bracs(tmp_path)
    df = prep("bracs", "bracs", tmp_path)
    assert df.groupby("split").size().to_dict() == {"test": 7, "train": 14, "val": 7}
    assert set(df["group"]) == {"BRACS_264", "BRACS_265", "BRACS_300", "BRACS_400"}
    assert df.set_index("label_name")["label"].to_dict() == {c: i for i, c in enumerate(BRACS)}
    coarse = prep("bracs", "bracs", tmp_path, taxonomy="coarse")
    assert coarse.set_index("fine_class")["label_name"].to_dict()["FEA"] == "atypical"
    assert sorted(coarse["label"].unique()) == [0, 1, 2]
    img(tmp_path / "BRACS_RoI/latest_version/test/0_N/roi.png")
    with pytest.raises(FmauditInputError, match="roi.png"):
        prepare_dataset("bracs", "bracs", tmp_path, {})


def make_camelyon(root: Path) -> pd.DataFrame:
    """Two patients per hospital, two slides (nodes) each, eight patches per slide (three tumour)."""
    base = root / "camelyon17_v1.0"
    rows = []
    slide = 0
    for center in range(5):
        for p in range(2):
            patient = f"{center * 20 + p + 4:03d}"
            for node in (p + 1, p + 3):
                for k in range(8):
                    x, y = 1000 + 96 * k, 2000 + 32 * k
                    rows.append({"patient": patient, "node": node, "x_coord": x, "y_coord": y, "tumor": int(k < 3),
                                 "slide": slide, "center": center, "split": 0})
                    img(base / "patches" / f"patient_{patient}_node_{node}"
                        / f"patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png")
                slide += 1
    meta = pd.DataFrame(rows)
    meta.to_csv(base / "metadata.csv")  # WILDS writes an index column; patient keeps its zeros as text
    return meta


def test_camelyon17_balanced_per_hospital_patient_disjoint(tmp_path):
    make_camelyon(tmp_path)
    df = prep("camelyon17-wilds", "camelyon17_wilds", tmp_path, n_per_hospital=12, fractions=[0.5, 0.0, 0.5])
    assert sorted(df["domain"].unique()) == [f"hospital{c}" for c in range(5)]
    counts = df.groupby(["domain", "label"]).size()
    assert counts.eq(6).all()  # 50/50 per hospital
    assert df.loc[df["domain"] == "hospital0", "group"].isin(["patient_004", "patient_005"]).all()
    assert (df["group"] == df["patient"]).all() and (df["group_unit"] == "patient").all()
    assert df["slide"].str.match(r"patient_\d{3}_node_\d").all()
    per_hospital = df.groupby(["domain", "split"])["group"].nunique()
    assert per_hospital.eq(1).all()  # each hospital: one patient train, one test (both of its slides)
    assert Path(df["source"].iloc[0]).exists()
    assert df.equals(prep("camelyon17-wilds", "camelyon17_wilds", tmp_path, n_per_hospital=12,
                          fractions=[0.5, 0.0, 0.5]))
    by_slide = prep("camelyon17-wilds", "camelyon17_wilds", tmp_path, n_per_hospital=None, group_by="slide",
                    fractions=[0.5, 0.0, 0.5])
    assert (by_slide["group"] == by_slide["slide"]).all() and (by_slide["group_unit"] == "slide").all()
    assert by_slide.groupby("domain")["group"].nunique().eq(4).all()


def test_camelyon17_carries_prisms_leaky_patch_split_and_official_mode(tmp_path):
    make_camelyon(tmp_path)
    df = prep("camelyon17-wilds", "camelyon17_wilds", tmp_path, n_per_hospital=None)
    # PRISM's split, patch by patch: label-stratified 70/15/15 per hospital, patients on several sides
    assert set(df["split_patch"]) == {"train", "val", "test"}
    assert (df.groupby(["domain", "group"])["split_patch"].nunique() > 1).any()
    assert (df.groupby(["domain", "split_patch"])["label"].mean().between(0.25, 0.5)).all()
    assert df.attrs["provenance"]["split_patch"].startswith("patch-level")
    official = prep("camelyon17-wilds", "camelyon17_wilds", tmp_path, n_per_hospital=None, split_mode="official")
    assert official.groupby("domain")["split"].first().to_dict() == {
        "hospital0": "train", "hospital1": "val", "hospital2": "test", "hospital3": "train", "hospital4": "train"}
    assert "split_patch" in official.columns
    with pytest.raises(FmauditInputError, match="split_patch"):
        prepare_dataset("c17", "camelyon17_wilds", tmp_path, {"split_mode": "patch"})
    with pytest.raises(FmauditInputError, match="group_by 'slide'"):
        prepare_dataset("c17", "camelyon17_wilds", tmp_path, {"split_mode": "slide"})
    with pytest.raises(FmauditInputError, match="'group_by' must be one of"):
        prepare_dataset("c17", "camelyon17_wilds", tmp_path, {"group_by": "hospital"})
    next((tmp_path / "camelyon17_v1.0" / "patches").rglob("*.png")).unlink()
    with pytest.raises(FmauditInputError, match="1 patch file"):
        prepare_dataset("c17", "camelyon17_wilds", tmp_path, {"n_per_hospital": None})
