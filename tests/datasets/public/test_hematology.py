"""Hematology preparers on fake data laid out as each release ships it, and the shared five-class WBC map."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from fmaudit.datasets import prepare_dataset
from fmaudit.datasets.manifest import check_group_disjoint
from fmaudit.datasets.public import (
    WBC5_CLASSES,
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


def make_bloodmnist(root: Path, compressed: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 16), ("val", 8), ("test", 8)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 12, 12, 3), dtype=np.uint8)
        arrays[f"{split}_labels"] = (np.arange(n) % 8).reshape(n, 1).astype(np.uint8)
    arrays["val_images"][3] = arrays["train_images"][3]  # an exact duplicate across splits
    (root / "medmnist").mkdir(parents=True)
    (np.savez_compressed if compressed else np.savez)(root / "medmnist" / "bloodmnist_224.npz", **arrays)
    return arrays


@pytest.mark.parametrize("compressed", [True, False])
def test_bloodmnist_writes_pngs_official_splits(tmp_path, compressed):
    arrays = make_bloodmnist(tmp_path, compressed)
    df = prep("bloodmnist-224", "bloodmnist", tmp_path)
    assert len(df) == 31 and df.groupby("split").size().to_dict() == {"test": 8, "train": 16, "val": 7}
    assert df.set_index("label_name")["label"].to_dict() == {
        "basophil": 0, "eosinophil": 1, "erythroblast": 2, "ig": 3, "lymphocyte": 4, "monocyte": 5,
        "neutrophil": 6, "platelet": 7}
    row = df[df["item_id"] == "val_00005"].iloc[0]
    assert np.array_equal(np.asarray(Image.open(row["source"])), arrays["val_images"][5])
    assert not (tmp_path / "medmnist" / "bloodmnist_224_png" / "val" / "val_00003.png").exists()


def test_bloodmnist_wbc5_drops_other_classes_and_writes_only_kept(tmp_path):
    make_bloodmnist(tmp_path)
    df = prep("bloodmnist-wbc5", "bloodmnist", tmp_path, label_map="wbc5")
    assert set(df["label_name"]) == set(WBC5_CLASSES)
    assert df.set_index("label_name")["label"].to_dict() == {c: i for i, c in enumerate(WBC5_CLASSES)}
    assert sum(1 for _ in (tmp_path / "medmnist" / "bloodmnist_224_png").rglob("*.png")) == len(df)
    with pytest.raises(FmauditInputError, match="unknown label_map 'wbc8'"):
        prepare_dataset("b", "bloodmnist", tmp_path, {"label_map": "wbc8"})


PBC = ("basophil", "eosinophil", "erythroblast", "ig", "lymphocyte", "monocyte", "neutrophil", "platelet")


def test_acevedo_raw_release_and_wbc5(tmp_path):
    for cls in PBC:
        for i in range(5):
            img(tmp_path / "PBC_dataset_normal_DIB" / cls / f"{cls[:2].upper()}_{i}.jpg", fmt="JPEG")
    native = prep("acevedo", "acevedo_pbc", tmp_path)
    assert len(native) == 40 and native["label"].nunique() == 8
    wbc = prep("acevedo-wbc5", "acevedo_pbc", tmp_path, label_map="wbc5")
    assert len(wbc) == 25 and wbc.set_index("label_name")["label"].to_dict()["neutrophil"] == 4


MATEK = ("BAS", "EBO", "EOS", "KSC", "LYA", "LYT", "MMZ", "MOB", "MON", "MYB", "MYO", "NGB", "NGS", "PMB", "PMO")


def test_matek19_nested_tcia_layout_and_wbc5_map(tmp_path):
    for cls in MATEK:
        for i in range(1, 4):
            img(tmp_path / "AML-Cytomorphology_LMU" / "AML-Cytomorphology_LMU" / cls / f"{cls}_{i:04d}.tiff",
                fmt="TIFF")
    native = prep("matek19", "matek19", tmp_path)
    assert native["label"].nunique() == 15 and native.set_index("label_name")["label"].to_dict()["NGS"] == 12
    wbc = prep("matek19-wbc5", "matek19", tmp_path, label_map="wbc5")
    assert wbc["label_name"].value_counts().to_dict() == {
        "lymphocyte": 6, "neutrophil": 6, "basophil": 3, "eosinophil": 3, "monocyte": 3}
    assert wbc.set_index("label_name")["label"].to_dict() == {c: i for i, c in enumerate(WBC5_CLASSES)}


def test_raabin_train_test_folders(tmp_path):
    for sub in ("Train", "TestA", "TestB"):
        for cls in ("Basophil", "Eosinophil", "Lymphocyte", "Monocyte", "Neutrophil"):
            for i in range(2 if sub != "Train" else 4):
                img(tmp_path / "Raabin-WBC" / sub / cls / f"{sub}_{cls}_{i}.jpg", fmt="JPEG")
    df = prep("raabin-wbc", "raabin_wbc", tmp_path, label_map="wbc5")
    assert df.groupby("split").size().to_dict() == {"test": 20, "train": 20}
    assert set(df.loc[df["split"] == "test", "raabin_subset"]) == {"TestA", "TestB"}
    only_a = prep("raabin-wbc", "raabin_wbc", tmp_path, subsets=["Train", "TestA"])
    assert set(only_a["raabin_subset"]) == {"Train", "TestA"}
    assert df.set_index("label_name")["label"].to_dict() == {c: i for i, c in enumerate(WBC5_CLASSES)}


MLL23 = ("basophil", "eosinophil", "hairy_cell", "lymphocyte", "lymphocyte_large_granular", "lymphocyte_neoplastic",
         "lymphocyte_reactive", "metamyelocyte", "monocyte", "myeloblast", "myelocyte", "neutrophil_band",
         "neutrophil_segmented", "normoblast", "plasma_cell", "promyelocyte", "promyelocyte_atypical", "smudge_cell")


def test_mll23_class_folders_and_wbc5(tmp_path):
    for cls in MLL23:
        for i in range(1, 3):
            img(tmp_path / "MLL23" / cls / f"{cls}_{i:04d}.TIF", fmt="TIFF")
    native = prep("mll23", "mll23", tmp_path)
    assert native["label"].nunique() == 18
    wbc = prep("mll23-wbc5", "mll23", tmp_path, label_map="wbc5")
    assert wbc["label_name"].value_counts().to_dict() == {
        "lymphocyte": 6, "neutrophil": 4, "basophil": 2, "eosinophil": 2, "monocyte": 2}


def registry():
    return yaml.safe_load((REPO / "resources" / "datasets.yaml").read_text())


def test_wbc5_label_indices_agree_across_hematology_entries():
    reg = registry()
    wbc = [k for k, v in reg.items() if (v.get("params") or {}).get("label_map") == "wbc5"]
    assert {"bloodmnist-wbc5", "matek19-wbc5", "raabin-wbc", "mll23-wbc5"} <= set(wbc)
