"""Preparers of the single-cell hematology data sets of the hema paper (WBC cross-scanner transfer).

Domains: Acevedo / PBC (CellaVision DM96; as BloodMNIST@224 or the raw release), Matek-19 / AML-Cytomorphology_LMU
(M8 scanner), Raabin-WBC (smartphone + Olympus microscope) and MLL23 (Metafer). None of these releases
identifies patients consistently, so groups are items and splits are image-level (as in the hema paper).
``label_map: wbc5`` maps every data set onto the fixed five-class WBC intersection (:data:`WBC5_CLASSES`,
same label indices everywhere) and drops the other classes; ``label_map: none`` keeps the native classes.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from fmaudit.datasets import register_preparer
from fmaudit.datasets.public._common import (
    COMMON_DEFAULTS,
    Source,
    apply_labels,
    array_digest,
    class_folders,
    finish,
    list_images,
    log,
    missing_data_error,
    png_write,
    require,
    resolve_params,
    safe_id,
)
from fmaudit.io import FmauditInputError

# --------------------------------------------------------------------------- class lists and WBC maps

# Acevedo / PBC folder names; BloodMNIST's labels 0..7 are these classes in this order.
PBC_CLASSES = ("basophil", "eosinophil", "erythroblast", "ig", "lymphocyte", "monocyte", "neutrophil", "platelet")

# Matek-19 (AML-Cytomorphology_LMU) morphological classes, by folder abbreviation.
MATEK_CLASSES = ("BAS", "EBO", "EOS", "KSC", "LYA", "LYT", "MMZ", "MOB", "MON", "MYB", "MYO", "NGB", "NGS", "PMB",
                 "PMO")

RAABIN_CLASSES = ("basophil", "eosinophil", "lymphocyte", "monocyte", "neutrophil")

# MLL23 class folders (labels_MLL23.csv of the release's companion repository marrlab/MLL23).
MLL23_CLASSES = (
    "basophil", "eosinophil", "hairy_cell", "lymphocyte", "lymphocyte_large_granular", "lymphocyte_neoplastic",
    "lymphocyte_reactive", "metamyelocyte", "monocyte", "myeloblast", "myelocyte", "neutrophil_band",
    "neutrophil_segmented", "normoblast", "plasma_cell", "promyelocyte", "promyelocyte_atypical", "smudge_cell",
)

_PBC_WBC5 = {c: c for c in ("basophil", "eosinophil", "lymphocyte", "monocyte", "neutrophil")}
WBC5_MAPS: dict[str, dict[str, str]] = {
    "pbc": _PBC_WBC5,  # immature granulocytes, erythroblasts and platelets are outside the intersection
    # typical and atypical (reactive) lymphocytes are lymphocytes; segmented and band forms are neutrophils
    "matek": {"BAS": "basophil", "EOS": "eosinophil", "LYT": "lymphocyte", "LYA": "lymphocyte", "MON": "monocyte",
              "NGS": "neutrophil", "NGB": "neutrophil"},
    "raabin": {c: c for c in RAABIN_CLASSES},
    # Assumption (the hema paper does not list its MLL23 mapping): reactive and large granular lymphocytes are
    # lymphocytes, as Matek's atypical (reactive) LYA is; neoplastic lymphocytes, hairy cells and plasma
    # cells are disease-specific and dropped.
    "mll23": {"basophil": "basophil", "eosinophil": "eosinophil", "lymphocyte": "lymphocyte",
              "lymphocyte_reactive": "lymphocyte", "lymphocyte_large_granular": "lymphocyte", "monocyte": "monocyte",
              "neutrophil_segmented": "neutrophil", "neutrophil_band": "neutrophil"},
}

SOURCES = {
    "bloodmnist": Source(
        "BloodMNIST@224", "https://zenodo.org/records/10519652",
        "download bloodmnist_224.npz from the MedMNIST+ Zenodo record, md5 b718ff6835fcbdb22ba9eacccd7b2601",
    ),
    "acevedo": Source(
        "Acevedo PBC", "https://data.mendeley.com/datasets/snkd93bnjr/1",
        "download PBC_dataset_normal_DIB.zip from Mendeley Data",
    ),
    "matek": Source(
        "Matek-19 AML-Cytomorphology_LMU", "https://doi.org/10.7937/tcia.2019.36f5o9ld",
        "download the image collection from The Cancer Imaging Archive with its downloader",
    ),
    "raabin": Source(
        "Raabin-WBC", "https://raabindata.com/free-data/",
        "download the cropped-cell archives Train, TestA and TestB",
    ),
    "mll23": Source(
        "MLL23", "https://zenodo.org/records/14277609",
        "download the 18 per-class zip archives from Zenodo and unzip each into the folder",
    ),
}

_WBC_DEFAULTS = {**COMMON_DEFAULTS, "label_map": "none"}


def _rows_from_class_folders(root: Path, classes: tuple[str, ...], dataset: str, *, prefix: str = "",
                             split: str | None = None, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rows = []
    for cls, folder in class_folders(root, classes, dataset=dataset).items():
        for p in list_images(folder):
            item = safe_id(*([prefix] if prefix else []), cls, p.stem)
            row = {"item_id": item, "source": str(p.resolve()), "native_class": cls, "group": item}
            if split is not None:
                row["split"] = split
            row.update(extra or {})
            rows.append(row)
    return rows


def _finish_wbc(rows: list[dict], dataset: str, params: dict, native: tuple[str, ...], map_key: str,
                scanner: str, *, official_split: bool, digests: list[str] | None = None) -> pd.DataFrame:
    if not rows:
        raise FmauditInputError(f"{dataset}: no images found")
    df = pd.DataFrame(rows)
    df["domain"] = dataset
    df["scanner"] = scanner
    if digests is not None:
        df["_digest"] = digests
    df = apply_labels(df, native, params["label_map"], {"wbc5": WBC5_MAPS[map_key]}, dataset=dataset)
    kept_digests = df.pop("_digest").tolist() if digests is not None else None
    return finish(df, dataset, params, official_split=official_split, dedup_digests=kept_digests,
                  extra_provenance={"label_map": params["label_map"]})


# --------------------------------------------------------------------------- BloodMNIST@224 (Acevedo)

def _npz_rows(path: Path, key: str, chunk: int = 256) -> Iterator[tuple[int, np.ndarray]]:
    """(index, array) of each row of one array in an .npz, streamed so the 224-px images are never all in memory."""
    with zipfile.ZipFile(path) as zf:
        name = f"{key}.npy"
        if name not in zf.namelist():
            raise FmauditInputError(f"{path}: no array {key!r} (has {[n[:-4] for n in zf.namelist()]})")
        with zf.open(name) as fh:
            version = np.lib.format.read_magic(fh)
            fmt = np.lib.format
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
            if fortran:
                raise FmauditInputError(f"{path}: array {key!r} is Fortran-ordered; expected C order")
            row_items = int(np.prod(shape[1:], dtype=np.int64))
            row_bytes = row_items * dtype.itemsize
            for start in range(0, shape[0], chunk):
                n = min(chunk, shape[0] - start)
                buf = fh.read(n * row_bytes)
                if len(buf) != n * row_bytes:
                    raise FmauditInputError(f"{path}: array {key!r} is truncated")
                block = np.frombuffer(buf, dtype=dtype).reshape((n, *shape[1:]))
                for j in range(n):
                    yield start + j, block[j]


def _npz_labels(path: Path, key: str) -> np.ndarray:
    with np.load(path, allow_pickle=False) as z:
        if key not in z.files:
            raise FmauditInputError(f"{path}: no array {key!r} (has {z.files})")
        return np.asarray(z[key]).reshape(-1).astype(int)


@register_preparer("bloodmnist")
def prepare_bloodmnist(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """BloodMNIST@224 (Acevedo PBC, 8 classes, official train/val/test): the npz images are written as PNG
    files under ``png_dir`` (only the items kept after the label map, duplicate removal and any subsample).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder under which ``npz`` lies and ``png_dir`` is written.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``) and ``label_map`` (``none``
        default: the native classes; ``wbc5``: the five-class WBC intersection, other classes dropped), plus ``npz``
        (default ``medmnist/bloodmnist_224.npz``) and ``png_dir`` (default ``medmnist/bloodmnist_224_png``), both
        relative to ``data_root``.

    Returns
    -------
    DataFrame
        One row per kept cell image: ``item_id``, ``source``, ``label``/``label_name`` (native or ``wbc5`` classes),
        ``native_class``, ``group`` (the item: the release has no patient ids), ``domain`` (the slug), ``scanner``,
        ``split``, ``dataset``, ``npz_index`` (the row in the npz split; ``source`` is the PNG written by this call);
        provenance (with the label map) in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter, label map or class folder, when labels lie outside the 8 classes or images and labels
        disagree in number, or the npz is truncated.
    """
    p = resolve_params("bloodmnist", params, {**_WBC_DEFAULTS, "npz": "medmnist/bloodmnist_224.npz",
                                              "png_dir": "medmnist/bloodmnist_224_png"})
    npz = data_root / p["npz"]
    if not npz.exists():
        raise missing_data_error(dataset, SOURCES["bloodmnist"], npz, data_root)
    png_root = data_root / p["png_dir"]
    rows, digests = [], []
    for split in ("train", "val", "test"):
        labels = _npz_labels(npz, f"{split}_labels")
        if labels.size and (labels.min() < 0 or labels.max() >= len(PBC_CLASSES)):
            raise FmauditInputError(f"{npz}: {split}_labels outside 0..{len(PBC_CLASSES) - 1}")
        for i, img in _npz_rows(npz, f"{split}_images"):
            if i >= len(labels):
                raise FmauditInputError(f"{npz}: more {split}_images than {split}_labels")
            item = f"{split}_{i:05d}"
            rows.append({"item_id": item, "source": str((png_root / split / f"{item}.png").resolve()),
                         "native_class": PBC_CLASSES[labels[i]], "group": item, "split": split,
                         "npz_index": i})
            digests.append(array_digest(img))
        n_images = sum(1 for r in rows if r["split"] == split)
        if n_images != len(labels):
            raise FmauditInputError(f"{npz}: {n_images} {split}_images but {len(labels)} {split}_labels")
    df = _finish_wbc(rows, dataset, p, PBC_CLASSES, "pbc", "CellaVision DM96", official_split=True, digests=digests)
    # write only what the manifest keeps; existing PNGs are reused
    keep = {(s, int(i)) for s, i in zip(df["item_id"].str.split("_").str[0], df["npz_index"])}
    for split in ("train", "val", "test"):
        for i, img in _npz_rows(npz, f"{split}_images"):
            if (split, i) in keep:
                png_write(img, png_root / split / f"{split}_{i:05d}.png")
    log.info("%s: PNG files under %s", dataset, png_root)
    return df


# --------------------------------------------------------------------------- Acevedo raw release

@register_preparer("acevedo_pbc")
def prepare_acevedo_pbc(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Acevedo et al. PBC release ``PBC_dataset_normal_DIB/<class>/*.jpg`` (8 classes, no official split).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``PBC_dataset_normal_DIB/`` (nested once more is accepted).
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``) and ``label_map`` (``none``
        default: the native classes; ``wbc5``: the five-class WBC intersection, other classes dropped).

    Returns
    -------
    DataFrame
        One row per kept cell image: ``item_id``, ``source``, ``label``/``label_name`` (native or ``wbc5`` classes),
        ``native_class``, ``group`` (the item: the release has no patient ids), ``domain`` (the slug), ``scanner``,
        ``split`` (grouped, label-stratified), ``dataset``; provenance (with the label map) in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter, label map or class folder.
    """
    p = resolve_params("acevedo_pbc", params, _WBC_DEFAULTS)
    root = require(dataset, SOURCES["acevedo"], data_root, "PBC_dataset_normal_DIB")
    nested = root / "PBC_dataset_normal_DIB"  # some re-packagings nest the folder once more
    root = nested if nested.is_dir() else root
    rows = _rows_from_class_folders(root, PBC_CLASSES, dataset)
    return _finish_wbc(rows, dataset, p, PBC_CLASSES, "pbc", "CellaVision DM96", official_split=False)


# --------------------------------------------------------------------------- Matek-19

@register_preparer("matek19")
def prepare_matek19(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Matek-19 ``AML-Cytomorphology_LMU/<CLASS>/*.tiff`` (15 classes; the TCIA download may nest the folder
    once more). No official split, no patient ids.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``AML-Cytomorphology_LMU/`` (nested once more is accepted).
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``) and ``label_map`` (``none``
        default: the native classes; ``wbc5``: the five-class WBC intersection, other classes dropped).

    Returns
    -------
    DataFrame
        One row per kept cell image: ``item_id``, ``source``, ``label``/``label_name`` (native or ``wbc5`` classes),
        ``native_class``, ``group`` (the item: the release has no patient ids), ``domain`` (the slug), ``scanner``,
        ``split`` (grouped, label-stratified), ``dataset``; provenance (with the label map) in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter, label map or class folder.
    """
    p = resolve_params("matek19", params, _WBC_DEFAULTS)
    root = require(dataset, SOURCES["matek"], data_root, "AML-Cytomorphology_LMU")
    nested = root / "AML-Cytomorphology_LMU"
    root = nested if nested.is_dir() else root
    rows = _rows_from_class_folders(root, MATEK_CLASSES, dataset)
    return _finish_wbc(rows, dataset, p, MATEK_CLASSES, "matek", "M8 (Precipoint)", official_split=False)


# --------------------------------------------------------------------------- Raabin-WBC

@register_preparer("raabin_wbc")
def prepare_raabin_wbc(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Raabin-WBC ``Raabin-WBC/{Train,TestA,TestB}/<Class>/*.jpg``: Train is the official train split, every
    ``Test*`` folder the test split (its name kept in ``raabin_subset``).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``Raabin-WBC/``.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``) and ``label_map`` (``none``
        default: the native classes; ``wbc5``: the five-class WBC intersection, other classes dropped), plus ``subsets``
        (list of sub-folder names such as ``Train``, ``TestA``, case-insensitive; None default: every
        ``Train``/``Test*`` folder). Without both a train and a test folder the split is a grouped one.

    Returns
    -------
    DataFrame
        One row per kept cell image: ``item_id``, ``source``, ``label``/``label_name`` (native or ``wbc5`` classes),
        ``native_class``, ``group`` (the item: the release has no patient ids), ``domain`` (the slug), ``scanner``,
        ``split``, ``dataset``, ``raabin_subset`` (the release folder); provenance (with the label map) in
        ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter, label map or class folder, or when none of the wanted sub-folders exists.
    """
    p = resolve_params("raabin_wbc", params, {**_WBC_DEFAULTS, "subsets": None})
    root = require(dataset, SOURCES["raabin"], data_root, "Raabin-WBC")
    subsets = sorted(d for d in root.iterdir()
                     if d.is_dir() and (d.name.lower() == "train" or d.name.lower().startswith("test")))
    if p["subsets"] is not None:
        wanted = {s.lower() for s in p["subsets"]}
        subsets = [d for d in subsets if d.name.lower() in wanted]
    if not subsets:
        raise missing_data_error(dataset, SOURCES["raabin"], root / "Train", data_root)
    rows = []
    for d in subsets:
        split = "train" if d.name.lower() == "train" else "test"
        rows += _rows_from_class_folders(d, RAABIN_CLASSES, dataset, prefix=d.name, split=split,
                                         extra={"raabin_subset": d.name})
    official = any(r["split"] == "train" for r in rows) and any(r["split"] == "test" for r in rows)
    if not official:
        for r in rows:
            r.pop("split")
    return _finish_wbc(rows, dataset, p, RAABIN_CLASSES, "raabin", "smartphone camera on light microscopes",
                       official_split=official)


# --------------------------------------------------------------------------- MLL23

@register_preparer("mll23")
def prepare_mll23(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """MLL23 ``MLL23/<class>/<class>_NNNN.TIF`` (18 classes, one Zenodo zip per class). No official split,
    no patient ids in the release.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``MLL23/``.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``) and ``label_map`` (``none``
        default: the native classes; ``wbc5``: the five-class WBC intersection, other classes dropped).

    Returns
    -------
    DataFrame
        One row per kept cell image: ``item_id``, ``source``, ``label``/``label_name`` (native or ``wbc5`` classes),
        ``native_class``, ``group`` (the item: the release has no patient ids), ``domain`` (the slug), ``scanner``,
        ``split`` (grouped, label-stratified), ``dataset``; provenance (with the label map) in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter, label map or class folder.
    """
    p = resolve_params("mll23", params, _WBC_DEFAULTS)
    root = require(dataset, SOURCES["mll23"], data_root, "MLL23")
    rows = _rows_from_class_folders(root, MLL23_CLASSES, dataset)
    return _finish_wbc(rows, dataset, p, MLL23_CLASSES, "mll23", "Metafer (MetaSystems)", official_split=False)
