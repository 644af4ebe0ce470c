"""Preparers of the tile-level pathology data sets of PRISM and the audit paper.

Each preparer reads a release in its published layout under ``data_root`` (see ``resources/datasets.yaml``
for where each one is expected and how to get it) and returns a manifest; see ``_common`` for the
conventions they share.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fmaudit.datasets import register_preparer
from fmaudit.datasets.download import gunzip
from fmaudit.datasets.public._common import (
    COMMON_DEFAULTS,
    Source,
    array_digest,
    choice,
    class_folders,
    finish,
    first_missing,
    list_images,
    log,
    missing_data_error,
    png_write,
    require,
    resolve_params,
    safe_id,
)
from fmaudit.datasets.public._xlsx import read_table_any
from fmaudit.datasets.splits import balanced_subsample, grouped_split
from fmaudit.io import FmauditInputError

SOURCES = {
    "nct": Source(
        "NCT-CRC-HE-100K", "https://zenodo.org/records/1214456",
        "download NCT-CRC-HE-100K-NONORM.zip (md5 035777cf327776a71a05c95da6d6325f) and CRC-VAL-HE-7K.zip "
        "(md5 2fd1651b4f94ebd818ebf90ad2b6ce06)",
    ),
    "lc25000": Source(
        "LC25000", "https://github.com/tampapath/lung_colon_image_set",
        "download LC25000.zip from the link in the repository's README, or the Kaggle mirror "
        "andrewmvd/lung-and-colon-cancer-histopathological-images",
    ),
    "breakhis": Source(
        "BreaKHis", "https://web.inf.ufpr.br/vri/databases/breast-cancer-histopathological-database-breakhis/",
        "download BreaKHis_v1.tar.gz",
    ),
    "pcam": Source(
        "PatchCamelyon", "https://zenodo.org/records/2546921",
        "download camelyonpatch_level_2_split_test_x.h5.gz, ..._test_y.h5.gz and ..._test_meta.csv into pcam/; "
        "the .gz files are decompressed for you",
    ),
    "sicapv2": Source(
        "SICAPv2", "https://data.mendeley.com/datasets/9xxm58dvs3/1",
        "download the release archive from Mendeley Data",
    ),
    "panda": Source(
        "PANDA", "https://www.kaggle.com/competitions/prostate-cancer-grade-assessment",
        "accept the competition rules, then download train.csv and the selected train_images/<image_id>.tiff "
        "with the Kaggle API",
    ),
    "mhist": Source(
        "MHIST", "https://bmirds.github.io/MHIST/",
        "fill in the data-use form, then download images.zip and annotations.csv",
    ),
    "bracs": Source(
        "BRACS", "https://www.bracs.icar.cnr.it/",
        "register, then download BRACS_RoI/latest_version from the project's FTP server",
    ),
    "camelyon17": Source(
        "Camelyon17-WILDS",
        "https://worksheets.codalab.org/rest/bundles/0xe45e15f39fb54e9d9e919556af67aabe/contents/blob/",
        "download the WILDS v1.0 archive (a 10.7 GB tar.gz)",
    ),
}


def _folder_rows(root: Path, classes: tuple[str, ...], dataset: str, prefix: str | None = None,
                 split: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for cls, folder in class_folders(root, classes, dataset=dataset).items():
        for p in list_images(folder):
            item = safe_id(*((prefix,) if prefix else ()), cls, p.stem)
            row = {"item_id": item, "source": str(p.resolve()), "label_name": cls,
                   "label": classes.index(cls), "group": item}
            if split is not None:
                row["split"] = split
            rows.append(row)
    return rows


def _frame(rows: list[dict], dataset: str) -> pd.DataFrame:
    if not rows:
        raise FmauditInputError(f"{dataset}: no images found")
    df = pd.DataFrame(rows)
    if "domain" not in df.columns:
        df["domain"] = dataset
    return df


# --------------------------------------------------------------------------- NCT-CRC-HE-100K

NCT_CLASSES = ("ADI", "BACK", "DEB", "LYM", "MUC", "MUS", "NORM", "STR", "TUM")


@register_preparer("nct_crc_he")
def prepare_nct_crc_he(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """NCT-CRC-HE-100K (``variant`` NONORM: without stain normalisation, or NORM) as train, and CRC-VAL-HE-7K
    as the official test set when ``test_set`` is true; otherwise one grouped split of the 100K set (the audit paper
    used the NONORM 100K set alone, sampled to 9000 patches). No patient ids are released.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``NCT-CRC-HE-100K-NONORM/`` (or ``NCT-CRC-HE-100K/``) and ``CRC-VAL-HE-7K/``, one sub-folder per
        class (ADI, BACK, DEB, LYM, MUC, MUS, NORM, STR, TUM).
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``variant`` (``NONORM``
        default, or ``NORM``) and ``test_set`` (bool, default true: CRC-VAL-HE-7K is the test split and the 100K set is
        train).

    Returns
    -------
    DataFrame
        One row per tile after duplicate removal: ``item_id`` (``100k__<class>__<stem>`` or ``7k__...``), ``source``,
        ``label``/``label_name`` (index into the nine classes), ``group`` (the item: no patient ids), ``domain`` (the
        slug), ``split``, ``dataset`` and ``subset`` (the release folder); provenance in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value.
    """
    p = resolve_params("nct_crc_he", params, {**COMMON_DEFAULTS, "variant": "NONORM", "test_set": True})
    variant = choice("nct_crc_he", p, "variant", ["NONORM", "NORM"])
    train_dir = "NCT-CRC-HE-100K-NONORM" if variant == "NONORM" else "NCT-CRC-HE-100K"
    train_root = require(dataset, SOURCES["nct"], data_root, train_dir)
    rows = _folder_rows(train_root, NCT_CLASSES, dataset, "100k", "train" if p["test_set"] else None)
    if p["test_set"]:
        test_root = require(dataset, SOURCES["nct"], data_root, "CRC-VAL-HE-7K")
        rows += _folder_rows(test_root, NCT_CLASSES, dataset, "7k", "test")
    df = _frame(rows, dataset)
    df["subset"] = np.where(df["item_id"].str.startswith("100k"), train_dir, "CRC-VAL-HE-7K")
    return finish(df, dataset, p, official_split=bool(p["test_set"]), extra_provenance={"variant": variant})


# --------------------------------------------------------------------------- LC25000

LC25000_CLASSES = {"lung": ("lung_aca", "lung_n", "lung_scc"), "colon": ("colon_aca", "colon_n")}


@register_preparer("lc25000")
def prepare_lc25000(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """LC25000 ``lung_colon_image_set/{lung,colon}_image_sets/<class>/*.jpeg``: ``subset`` lung (3 classes) or
    colon (2 classes) are separate tasks. The release is augmented from 750 lung and 500 colon originals
    without source ids, so splits are image-level (exact duplicates are removed).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``lung_colon_image_set/``.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``subset`` (``lung``
        default: lung_aca, lung_n, lung_scc; or ``colon``: colon_aca, colon_n).

    Returns
    -------
    DataFrame
        One row per image after duplicate removal: ``item_id``, ``source``, ``label``/``label_name``, ``group`` (the
        item), ``domain`` (the slug), ``split`` (grouped, label-stratified), ``dataset``; provenance in
        ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value.
    """
    p = resolve_params("lc25000", params, {**COMMON_DEFAULTS, "subset": "lung"})
    subset = choice("lc25000", p, "subset", ["lung", "colon"])
    root = require(dataset, SOURCES["lc25000"], data_root, f"lung_colon_image_set/{subset}_image_sets")
    df = _frame(_folder_rows(root, LC25000_CLASSES[subset], dataset), dataset)
    return finish(df, dataset, p, official_split=False, extra_provenance={"subset": subset})


# --------------------------------------------------------------------------- BreaKHis

BREAKHIS_SUBTYPES = {
    "A": "adenosis", "F": "fibroadenoma", "PT": "phyllodes_tumor", "TA": "tubular_adenoma",
    "DC": "ductal_carcinoma", "LC": "lobular_carcinoma", "MC": "mucinous_carcinoma", "PC": "papillary_carcinoma",
}
BREAKHIS_BINARY = ("benign", "malignant")
_BREAKHIS_NAME = re.compile(
    r"^SOB_(?P<cls>[BM])_(?P<type>[A-Z]+)-(?P<year>\d+)-(?P<slide>[0-9A-Za-z]+)-(?P<mag>\d+)-(?P<seq>\d+)$"
)


def parse_breakhis_name(name: str) -> dict[str, Any]:
    """Fields of a BreaKHis file name, e.g. ``SOB_B_A-14-22549AB-100-001.png``: class B, subtype adenosis,
    patient ``14-22549AB``, biopsy ``14-22549`` (letter suffix dropped), magnification 100.

    Parameters
    ----------
    name : str
        A file name or path; only its stem is read.

    Returns
    -------
    dict
        ``binary`` (``benign``/``malignant``), ``subtype`` (one of ``BREAKHIS_SUBTYPES``' values), ``patient_id`` (str),
        ``biopsy_id`` (str) and ``magnification`` (int: 40, 100, 200 or 400).

    Raises
    ------
    FmauditInputError
        When the name does not follow ``SOB_<B|M>_<type>-<yy>-<id>-<mag>-<seq>`` or names an unknown subtype.
    """
    m = _BREAKHIS_NAME.match(Path(name).stem)
    if not m or m["type"] not in BREAKHIS_SUBTYPES:
        raise FmauditInputError(f"BreaKHis: file name {name!r} does not follow SOB_<B|M>_<type>-<yy>-<id>-<mag>-<seq>")
    return {
        "binary": "benign" if m["cls"] == "B" else "malignant",
        "subtype": BREAKHIS_SUBTYPES[m["type"]],
        "patient_id": f"{m['year']}-{m['slide']}",
        "biopsy_id": f"{m['year']}-{re.sub(r'[A-Za-z]+$', '', m['slide'])}",
        "magnification": int(m["mag"]),
    }


@register_preparer("breakhis")
def prepare_breakhis(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """BreaKHis ``BreaKHis_v1/histology_slides/breast/{benign,malignant}/SOB/<subtype>/<slide>/<mag>X/*.png``.
    ``magnification`` all / 40 / 100 / 200 / 400; ``label`` binary or subtype (8 classes); ``group_by``
    biopsy (ids differing only in a letter suffix form one group, as the audit paper did) or patient (the id as
    written).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``BreaKHis_v1/`` (the doubled ``BreaKHis_v1/BreaKHis_v1/`` of some unpackers is accepted).
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``magnification``
        (``all`` default, 40, 100, 200 or 400; a trailing ``X`` is allowed), ``label`` (``binary`` default, or
        ``subtype``) and ``group_by`` (``biopsy`` default, or ``patient``).

    Returns
    -------
    DataFrame
        One row per image: ``item_id``, ``source``, ``label``/``label_name``, ``group`` (biopsy or patient id),
        ``domain`` (the slug), ``split`` (grouped, label-stratified), ``dataset``, and ``patient_id``, ``biopsy_id``,
        ``magnification``, ``subtype``; provenance in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value, when a file name does not parse or a file lies under the other class's folder.
    """
    p = resolve_params("breakhis", params, {**COMMON_DEFAULTS, "magnification": "all", "label": "binary",
                                            "group_by": "biopsy"})
    mag = str(p["magnification"]).upper().rstrip("X")
    if mag not in ("ALL", "40", "100", "200", "400"):
        raise FmauditInputError(
            f"preparer 'breakhis': magnification must be all, 40, 100, 200 or 400, got {p['magnification']!r}"
        )
    label_kind = choice("breakhis", p, "label", ["binary", "subtype"])
    group_by = choice("breakhis", p, "group_by", ["biopsy", "patient"])
    breast = require(dataset, SOURCES["breakhis"], data_root, "BreaKHis_v1/histology_slides/breast",
                     "BreaKHis_v1/BreaKHis_v1/histology_slides/breast")
    classes = BREAKHIS_BINARY if label_kind == "binary" else tuple(BREAKHIS_SUBTYPES.values())
    rows = []
    for top in BREAKHIS_BINARY:
        folder = breast / top
        if not folder.is_dir():
            raise missing_data_error(dataset, SOURCES["breakhis"], folder, data_root)
        for f in list_images(folder, (".png",), recursive=True):
            info = parse_breakhis_name(f.name)
            if info["binary"] != top:
                raise FmauditInputError(f"{dataset}: {f} is named {info['binary']} but lies under {top}/")
            if mag != "ALL" and info["magnification"] != int(mag):
                continue
            name = info["binary"] if label_kind == "binary" else info["subtype"]
            rows.append({"item_id": safe_id(f.stem), "source": str(f.resolve()), "label_name": name,
                         "label": classes.index(name),
                         "group": info["biopsy_id"] if group_by == "biopsy" else info["patient_id"],
                         "patient_id": info["patient_id"], "biopsy_id": info["biopsy_id"],
                         "magnification": info["magnification"], "subtype": info["subtype"]})
    df = _frame(rows, dataset)
    return finish(df, dataset, p, official_split=False,
                  extra_provenance={"magnification": mag.lower(), "label": label_kind, "group_by": group_by})


# --------------------------------------------------------------------------- PatchCamelyon

PCAM_CLASSES = ("normal", "tumor")
_PCAM_SPLITS = {"train": "train", "valid": "val", "test": "test"}


def _pcam_file(raw: Path, name: str, dataset: str, data_root: Path) -> Path:
    path = raw / name
    if path.exists():
        return path
    gz = raw / f"{name}.gz"
    if gz.exists():
        log.info("%s: decompressing %s", dataset, gz)
        return gunzip(gz)
    raise missing_data_error(dataset, SOURCES["pcam"], path, data_root)


@register_preparer("pcam")
def prepare_pcam(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """PatchCamelyon from its HDF5 release: the patches of ``source_splits`` (default the test split, as
    the audit paper) are written as PNG files ``<png_dir>/<split>/<wsi>__<index>.png`` named after the slide in the
    meta csv; ``group`` is that slide. ``split_mode`` grouped (slide-disjoint split of the patches) or
    official (PCam's train/valid/test). Duplicates are found on the pixel arrays before anything is written;
    only the kept patches are written.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder under which ``raw_dir`` holds the HDF5 files and meta csv and ``png_dir`` receives the PNG files.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``source_splits`` (list
        of ``train``, ``valid``, ``test``; default ``["test"]``), ``split_mode`` (``grouped`` default, or ``official``),
        ``raw_dir`` (default ``pcam``) and ``png_dir`` (default ``pcam/png``), both relative to ``data_root``.

    Returns
    -------
    DataFrame
        One row per kept patch: ``item_id``, ``source`` (the PNG path, written by this call), ``label``/``label_name``
        (0 normal, 1 tumor), ``group`` (the slide, or the item without a ``wsi`` column), ``group_unit``, ``domain``
        (the slug), ``split``, ``dataset``, ``pcam_split``, ``pcam_index``, ``coord_x``, ``coord_y``; provenance in
        ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value, on labels other than 0/1, and when the patch, label and meta counts differ.
    """
    import h5py

    p = resolve_params("pcam", params, {**COMMON_DEFAULTS, "source_splits": ["test"], "split_mode": "grouped",
                                        "raw_dir": "pcam", "png_dir": "pcam/png"})
    split_mode = choice("pcam", p, "split_mode", ["grouped", "official"])
    sources = [s.lower() for s in p["source_splits"]]
    bad = [s for s in sources if s not in _PCAM_SPLITS]
    if bad or not sources:
        raise FmauditInputError(
            f"preparer 'pcam': source_splits must be some of {list(_PCAM_SPLITS)}, got {p['source_splits']!r}"
        )
    raw, png_root = data_root / p["raw_dir"], data_root / p["png_dir"]
    rows, digests = [], []
    for s in sources:
        base = f"camelyonpatch_level_2_split_{s}"
        x_path = _pcam_file(raw, f"{base}_x.h5", dataset, data_root)
        y_path = _pcam_file(raw, f"{base}_y.h5", dataset, data_root)
        meta_path = _pcam_file(raw, f"{base}_meta.csv", dataset, data_root)
        meta = pd.read_csv(meta_path)
        meta = meta.drop(columns=[c for c in meta.columns if c.startswith("Unnamed")])
        has_wsi = "wsi" in meta.columns
        if not has_wsi:  # without slide names the patches can only be split one by one
            log.warning("%s: %s has no 'wsi' column; patches are their own groups", dataset, meta_path)
        with h5py.File(y_path, "r") as fy:
            y = np.asarray(fy["y"]).reshape(-1).astype(int)
        if len(y) and not np.isin(y, (0, 1)).all():
            raise FmauditInputError(f"{y_path}: labels must be 0 or 1, found {sorted(set(y.tolist()))[:5]}")
        with h5py.File(x_path, "r") as fx:
            x = fx["x"]
            if not (len(x) == len(y) == len(meta)):
                raise FmauditInputError(
                    f"{x_path}: {len(x)} patches, {len(y)} labels and {len(meta)} meta rows; they must match"
                )
            for start in range(0, len(x), 2048):
                digests += [array_digest(arr) for arr in x[start : start + 2048]]
        slides = meta["wsi"].astype(str) if has_wsi else pd.Series([None] * len(meta))
        for i, (wsi, lab) in enumerate(zip(slides, y)):
            name = f"{safe_id(wsi)}__{i:06d}" if wsi is not None else f"{s}_{i:06d}"
            item = safe_id(s, name)
            rows.append({"item_id": item, "source": str((png_root / s / f"{name}.png").resolve()),
                         "label": int(lab), "label_name": PCAM_CLASSES[int(lab)], "group": wsi or item,
                         "group_unit": "slide" if wsi is not None else "item",
                         "split": _PCAM_SPLITS[s], "pcam_split": s, "pcam_index": i,
                         "coord_x": meta["coord_x"].iloc[i] if "coord_x" in meta else pd.NA,
                         "coord_y": meta["coord_y"].iloc[i] if "coord_y" in meta else pd.NA})
    df = _frame(rows, dataset)
    official = split_mode == "official"
    if not official:
        df = df.drop(columns=["split"])
    df = finish(df, dataset, p, official_split=official, dedup_digests=digests,
                extra_provenance={"source_splits": sources, "dedup_on": "pixel arrays"})
    for s in sources:  # write the kept patches, reading the HDF5 file block by block
        kept = df[df["pcam_split"] == s].sort_values("pcam_index")
        wanted = dict(zip(kept["pcam_index"].astype(int), kept["source"]))
        with h5py.File(raw / f"camelyonpatch_level_2_split_{s}_x.h5", "r") as fx:
            x, block_size = fx["x"], 2048
            for start in range(0, len(x), block_size):
                todo = [i for i in range(start, min(start + block_size, len(x))) if i in wanted]
                if todo:
                    block = x[start : start + block_size]
                    for i in todo:
                        png_write(block[i - start], Path(wanted[i]))
    return df


# --------------------------------------------------------------------------- SICAPv2

SICAP_CLASSES = ("NC", "G3", "G4", "G5")


def _sicap_table(folder: Path, stem: str, dataset: str, data_root: Path) -> pd.DataFrame:
    for ext in (".csv", ".xlsx"):  # csv first: readable without openpyxl
        path = folder / f"{stem}{ext}"
        if path.exists():
            return read_table_any(path)
    raise missing_data_error(dataset, SOURCES["sicapv2"], folder / f"{stem}.xlsx", data_root)


def sicap_primary_label(row: pd.Series) -> tuple[str, bool]:
    """Primary Gleason class of a partition row (one-hot NC/G3/G4/G5; G4C, cribriform, counts as G4) and
    whether the row was ambiguous (several classes set: the highest grade among the largest values wins).

    Parameters
    ----------
    row : Series
        One row of a SICAPv2 partition table: columns ``NC``, ``G3``, ``G4``, ``G5`` (one-hot or counts; NaN is 0),
        optionally ``G4C`` and ``image_name`` (used in the error).

    Returns
    -------
    tuple of (str, bool)
        The class (``NC``, ``G3``, ``G4`` or ``G5``) and whether several classes tied for the largest value.

    Raises
    ------
    FmauditInputError
        When no class is set.
    """
    values = np.nan_to_num(np.array([float(row.get(c, 0) or 0) for c in SICAP_CLASSES]))
    if values.max() <= 0 and np.nan_to_num(float(row.get("G4C", 0) or 0)) > 0:
        return "G4", False
    if values.max() <= 0:
        raise FmauditInputError(f"SICAPv2: patch {row.get('image_name')!r} has no class set in NC/G3/G4/G5/G4C")
    top = np.flatnonzero(values == values.max())
    return SICAP_CLASSES[int(top[-1])], len(top) > 1


@register_preparer("sicapv2")
def prepare_sicapv2(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """SICAPv2 ``SICAPv2/{images/, partition/, wsi_labels.xlsx}``: primary Gleason class NC/G3/G4/G5 per patch,
    ``group`` the patient of the patch's slide (``wsi_labels``). ``split_mode`` official: the release's
    patient-disjoint ``partition`` (``Test``: Train/Test; ``Val1``..``Val4``: that fold's Train/Test as
    train/val, plus the Test partition's test set); grouped: all labelled patches, split by patient.
    Partition tables are read as .csv when present, else .xlsx (openpyxl when installed, else a built-in
    reader).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``SICAPv2/``.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``split_mode``
        (``official`` default, or ``grouped``) and ``partition`` (``Test`` default, ``Val1`` .. ``Val4``).

    Returns
    -------
    DataFrame
        One row per labelled patch: ``item_id``, ``source``, ``label``/``label_name`` (NC, G3, G4, G5), ``group``
        (patient), ``domain`` (the slug), ``split``, ``dataset``, ``slide_id`` and ``g4c`` (1 where the patch is
        cribriform); provenance (with the count of ambiguous labels) in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value, when a patch is listed twice, a slide has no patient in ``wsi_labels``, or patch
        images are missing.
    """
    p = resolve_params("sicapv2", params, {**COMMON_DEFAULTS, "split_mode": "official", "partition": "Test"})
    split_mode = choice("sicapv2", p, "split_mode", ["official", "grouped"])
    partition = choice("sicapv2", p, "partition", ["Test", "Val1", "Val2", "Val3", "Val4"])
    root = require(dataset, SOURCES["sicapv2"], data_root, "SICAPv2")
    images = root / "images"
    if not images.is_dir():
        raise missing_data_error(dataset, SOURCES["sicapv2"], images, data_root)
    test_dir = root / "partition" / "Test"
    tables = [("train", _sicap_table(test_dir, "Train", dataset, data_root)),
              ("test", _sicap_table(test_dir, "Test", dataset, data_root))]
    if split_mode == "official" and partition != "Test":
        fold = root / "partition" / "Validation" / partition
        tables = [("train", _sicap_table(fold, "Train", dataset, data_root)),
                  ("val", _sicap_table(fold, "Test", dataset, data_root)), tables[1]]
    wsi = None
    for name in ("wsi_labels.csv", "wsi_labels.xlsx"):
        if (root / name).exists():
            wsi = read_table_any(root / name)
            break
    if wsi is None:
        raise missing_data_error(dataset, SOURCES["sicapv2"], root / "wsi_labels.xlsx", data_root)
    for col in ("slide_id", "patient_id"):
        if col not in wsi.columns:
            raise FmauditInputError(f"{root / 'wsi_labels'}: no {col!r} column (columns: {list(wsi.columns)})")
    patient_of = dict(zip(wsi["slide_id"].astype(str), wsi["patient_id"].astype(str)))
    rows, ambiguous, seen = [], 0, set()
    for split, table in tables:
        if "image_name" not in table.columns:
            raise FmauditInputError(f"{dataset}: partition table for {split} has no 'image_name' column")
        for _, r in table.iterrows():
            fname = str(r["image_name"])
            fname = fname if Path(fname).suffix else f"{fname}.jpg"
            if fname in seen:
                raise FmauditInputError(f"{dataset}: patch {fname} is listed in more than one partition table")
            seen.add(fname)
            cls, amb = sicap_primary_label(r)
            ambiguous += amb
            slide = fname.split("_Block_")[0]
            if slide not in patient_of:
                raise FmauditInputError(f"{dataset}: slide {slide!r} of patch {fname} is not in wsi_labels")
            rows.append({"item_id": safe_id(Path(fname).stem), "source": str((images / fname).resolve()),
                         "label_name": cls, "label": SICAP_CLASSES.index(cls), "group": patient_of[slide],
                         "slide_id": slide, "g4c": int(float(r.get("G4C", 0) or 0) > 0), "split": split})
    n_missing, first = first_missing(r["source"] for r in rows)
    if n_missing:
        raise FmauditInputError(f"{dataset}: {n_missing} patch image(s) listed in the partition are missing, "
                                f"e.g. {first}")
    df = _frame(rows, dataset)
    official = split_mode == "official"
    if not official:
        df = df.drop(columns=["split"])
    return finish(df, dataset, p, official_split=official,
                  extra_provenance={"partition": partition if official else "all", "ambiguous_labels": ambiguous})


# --------------------------------------------------------------------------- PANDA

PANDA_CLASSES = tuple(f"isup{g}" for g in range(6))
_PANDA_DEFAULTS = {
    "seed": 0, "fractions": [0.6, 0.2, 0.2],
    "n_per_cell": 60, "selection_seed": 42,
    "target_mpp": 2.0, "tile_size": 224, "min_tissue_fraction": 0.35, "max_tiles_per_slide": 100,
    "tile_seed": 0, "mpp_override": None, "skip_missing": False,
}


def select_panda_slides(table: pd.DataFrame, n_per_cell: int = 60, seed: int = 42) -> pd.DataFrame:
    """Draw ``n_per_cell`` slides from every (data_provider, isup_grade) cell (all of a smaller cell).

    Convention: rows sorted by image_id, cells visited in sorted order, one ``default_rng(seed)`` drawing
    without replacement in turn. Returns the chosen rows sorted by provider, grade and image_id.

    Parameters
    ----------
    table : DataFrame
        PANDA's ``train.csv``: at least ``image_id``, ``data_provider`` and ``isup_grade``.
    n_per_cell : int
        Slides drawn per (provider, grade) cell.
    seed : int
        Seed of the draw (the audit paper's 42 by default).

    Returns
    -------
    DataFrame
        The chosen rows of ``table``, all columns, sorted by provider, grade and image_id, index reset.

    Raises
    ------
    FmauditInputError
        When a needed column is missing.
    """
    need = ["image_id", "data_provider", "isup_grade"]
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise FmauditInputError(f"PANDA train.csv: missing column(s) {missing} (columns: {list(table.columns)})")
    t = table.sort_values("image_id", kind="stable").reset_index(drop=True)
    rng = np.random.default_rng(seed)
    chosen = []
    for _, cell in t.groupby(["data_provider", "isup_grade"], sort=True):
        k = min(int(n_per_cell), len(cell))
        chosen.append(cell.iloc[np.sort(rng.choice(len(cell), size=k, replace=False))])
    return (pd.concat(chosen).sort_values(["data_provider", "isup_grade", "image_id"], kind="stable")
            .reset_index(drop=True))


#: PANDA's split is stratified by grade and data provider jointly (audit paper); the provider is the manifest's domain.
PANDA_SPLIT_STRATA = ("label", "domain")


@register_preparer("panda", split_strata=PANDA_SPLIT_STRATA)
def prepare_panda(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """PANDA ``panda/train.csv`` + ``panda/train_images/<image_id>.tiff``: :func:`select_panda_slides` (seed 42,
    ``n_per_cell`` per provider x ISUP grade), then tissue tiles per slide with
    :func:`fmaudit.slides.tile_coordinates`. Every tile carries its slide's ISUP grade; ``group`` is the slide
    (PANDA has no patient ids), ``domain`` the data provider; the split is slide-disjoint and stratified by
    grade and provider jointly. The audit paper tiled at pyramid level 1 (about 2 µm/px, 4x the ~0.5 µm/px level 0);
    here ``target_mpp`` picks the level and the field of view.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``panda/train.csv`` and ``panda/train_images/``.
    params : dict
        Preparer parameters: ``seed`` and ``fractions`` (the split), ``n_per_cell`` (60) and ``selection_seed`` (42) of
        the slide draw, ``target_mpp`` (2.0 µm/px), ``tile_size`` (224 px), ``min_tissue_fraction`` (0.35),
        ``max_tiles_per_slide`` (100), ``tile_seed`` (0), ``mpp_override`` (None: read from the slide) and
        ``skip_missing`` (false: a selected slide that is missing raises).

    Returns
    -------
    DataFrame
        One row per tile: ``item_id``, ``source`` (the slide), ``x``, ``y``, ``level``, ``size``, ``label`` (the ISUP
        grade 0-5), ``label_name`` (``isup<g>``), ``group`` (the slide), ``domain`` (the provider), ``split``,
        ``dataset``, ``tissue_fraction``, ``gleason_score``; provenance (slides selected, tiled, without tissue) in
        ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value, and when some selected slides are missing without ``skip_missing``.
    """
    # imported here: PIL loads only when this runs
    from fmaudit import slides

    p = resolve_params("panda", params, _PANDA_DEFAULTS)
    csv = require(dataset, SOURCES["panda"], data_root, "panda/train.csv")
    images = data_root / "panda" / "train_images"
    table = pd.read_csv(csv)
    selected = select_panda_slides(table, p["n_per_cell"], p["selection_seed"])
    paths = [images / f"{i}.tiff" for i in selected["image_id"]]
    exists = np.array([q.exists() for q in paths])
    if not exists.all():
        first = paths[int(np.flatnonzero(~exists)[0])]
        if not p["skip_missing"]:
            if not exists.any():
                raise missing_data_error(dataset, SOURCES["panda"], first, data_root)
            raise FmauditInputError(
                f"{dataset}: {int((~exists).sum())} of {len(paths)} selected slides are missing under {images}, "
                f"e.g. {first.name}; download them (or set skip_missing: true)"
            )
        log.warning("%s: skipping %d selected slides that are missing", dataset, int((~exists).sum()))
    rows, no_tissue = [], []
    for slide, path, ok in zip(selected.itertuples(index=False), paths, exists):
        if not ok:
            continue
        try:
            tiles = slides.tile_coordinates(
                path, target_mpp=p["target_mpp"], tile_size=p["tile_size"],
                min_tissue_fraction=p["min_tissue_fraction"], max_tiles=p["max_tiles_per_slide"],
                seed=p["tile_seed"], mpp_override=p["mpp_override"],
            )
        except FmauditInputError as e:
            if "no tissue" not in str(e):
                raise
            no_tissue.append(slide.image_id)
            log.warning("%s: %s", dataset, e)
            continue
        grade = int(slide.isup_grade)
        for t in tiles.itertuples(index=False):
            rows.append({"item_id": safe_id(f"{slide.image_id}_{int(t.x)}_{int(t.y)}"), "source": str(path.resolve()),
                         "x": int(t.x), "y": int(t.y), "level": int(t.level), "size": int(t.size),
                         "label": grade, "label_name": PANDA_CLASSES[grade], "group": str(slide.image_id),
                         "domain": str(slide.data_provider), "tissue_fraction": float(t.tissue_fraction),
                         "gleason_score": str(getattr(slide, "gleason_score", ""))})
    df = _frame(rows, dataset)
    run = dict(p, dedup="none", subsample=None)  # tiles of slides: no files to deduplicate
    return finish(df, dataset, run, official_split=False, stratify_by=PANDA_SPLIT_STRATA,
                  extra_provenance={"slides_selected": len(selected), "slides_tiled": int(df["group"].nunique()),
                                    "slides_without_tissue": no_tissue})


# --------------------------------------------------------------------------- MHIST

MHIST_CLASSES = ("HP", "SSA")


@register_preparer("mhist")
def prepare_mhist(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """MHIST ``MHIST/images/*.png`` + ``MHIST/annotations.csv`` (Image Name, Majority Vote Label HP/SSA,
    Partition train/test: the official split). No patient ids are released.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``MHIST/``.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``).

    Returns
    -------
    DataFrame
        One row per image: ``item_id``, ``source``, ``label``/``label_name`` (HP 0, SSA 1), ``group`` (the item),
        ``domain`` (the slug), ``split`` (official), ``dataset``, ``ssa_votes`` (annotators voting SSA, NA where the
        column is absent); provenance in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value, on a missing column, an unknown label or partition, or missing images.
    """
    p = resolve_params("mhist", params, COMMON_DEFAULTS)
    root = require(dataset, SOURCES["mhist"], data_root, "MHIST")
    ann_path, images = root / "annotations.csv", root / "images"
    if not ann_path.exists():
        raise missing_data_error(dataset, SOURCES["mhist"], ann_path, data_root)
    ann = pd.read_csv(ann_path)
    need = ["Image Name", "Majority Vote Label", "Partition"]
    missing = [c for c in need if c not in ann.columns]
    if missing:
        raise FmauditInputError(f"{ann_path}: missing column(s) {missing} (columns: {list(ann.columns)})")
    votes = next((c for c in ann.columns if c.startswith("Number of Annotators")), None)
    rows = []
    for i, r in ann.iterrows():
        lab, part = str(r["Majority Vote Label"]).strip(), str(r["Partition"]).strip().lower()
        if lab not in MHIST_CLASSES:
            raise FmauditInputError(f"{ann_path}: row {i} has label {lab!r}; expected HP or SSA")
        if part not in ("train", "test"):
            raise FmauditInputError(f"{ann_path}: row {i} has partition {part!r}; expected train or test")
        item = safe_id(Path(str(r["Image Name"])).stem)
        rows.append({"item_id": item, "source": str((images / str(r["Image Name"])).resolve()), "label_name": lab,
                     "label": MHIST_CLASSES.index(lab), "group": item, "split": part,
                     "ssa_votes": int(r[votes]) if votes else pd.NA})
    n_missing, first = first_missing(r["source"] for r in rows)
    if n_missing:
        if n_missing == len(rows):
            raise missing_data_error(dataset, SOURCES["mhist"], images, data_root)
        raise FmauditInputError(f"{dataset}: {n_missing} image(s) named in annotations.csv are missing, e.g. {first}")
    return finish(_frame(rows, dataset), dataset, p, official_split=True)


# --------------------------------------------------------------------------- BRACS

BRACS_CLASSES = ("N", "PB", "UDH", "FEA", "ADH", "DCIS", "IC")
BRACS_COARSE = {"N": "benign", "PB": "benign", "UDH": "benign", "FEA": "atypical", "ADH": "atypical",
                "DCIS": "malignant", "IC": "malignant"}
_BRACS_NAME = re.compile(r"^BRACS_(?P<wsi>\d+)_(?P<cls>[A-Z]+)_(?P<n>\d+)$")


@register_preparer("bracs")
def prepare_bracs(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """BRACS regions of interest ``BRACS_RoI/latest_version/{train,val,test}/<k>_<CLASS>/BRACS_<wsi>_<CLASS>_<n>.png``
    with the official (patient-disjoint) split; ``group`` is the WSI in the file name. ``taxonomy`` fine
    (7 classes) or coarse (benign / atypical / malignant).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``BRACS_RoI/latest_version/``.
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``taxonomy`` (``fine``
        default, or ``coarse``).

    Returns
    -------
    DataFrame
        One row per region: ``item_id``, ``source``, ``label``/``label_name``, ``group`` (``BRACS_<wsi>``), ``domain``
        (the slug), ``split`` (official), ``dataset``, ``fine_class`` (the 7-class name under either taxonomy);
        provenance in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root`` (the message says where it was expected and where to get it), on an
        unknown parameter or value, when a file name does not parse or disagrees with its class folder.
    """
    p = resolve_params("bracs", params, {**COMMON_DEFAULTS, "taxonomy": "fine"})
    taxonomy = choice("bracs", p, "taxonomy", ["fine", "coarse"])
    root = require(dataset, SOURCES["bracs"], data_root, "BRACS_RoI/latest_version")
    classes = BRACS_CLASSES if taxonomy == "fine" else ("benign", "atypical", "malignant")
    folders = {f"{k}_{c}": c for k, c in enumerate(BRACS_CLASSES)}
    rows = []
    for split in ("train", "val", "test"):
        sdir = root / split
        if not sdir.is_dir():
            raise missing_data_error(dataset, SOURCES["bracs"], sdir, data_root)
        for folder_name, folder in class_folders(sdir, tuple(folders), dataset=dataset, case_insensitive=False).items():
            cls = folders[folder_name]
            for f in list_images(folder, (".png",)):
                m = _BRACS_NAME.match(f.stem)
                if not m:
                    raise FmauditInputError(f"{dataset}: file name {f.name!r} does not follow "
                                            "BRACS_<wsi>_<class>_<n>.png")
                if m["cls"] != cls:
                    raise FmauditInputError(f"{dataset}: {f} is named {m['cls']} but lies in {folder_name}/")
                name = cls if taxonomy == "fine" else BRACS_COARSE[cls]
                rows.append({"item_id": safe_id(split, f.stem), "source": str(f.resolve()), "label_name": name,
                             "label": classes.index(name), "group": f"BRACS_{m['wsi']}", "split": split,
                             "fine_class": cls})
    return finish(_frame(rows, dataset), dataset, p, official_split=True, extra_provenance={"taxonomy": taxonomy})


# --------------------------------------------------------------------------- Camelyon17-WILDS

CAMELYON_CLASSES = ("normal", "tumor")
_CAMELYON_DEFAULTS = {
    "seed": 0, "n_per_hospital": 20000, "split_mode": "grouped", "group_by": "patient",
    "fractions": [0.7, 0.15, 0.15], "dedup": "bytes", "val_fraction": 0.0,
}
_CAMELYON_OLD_MODES = {
    "slide": "split_mode 'slide' is now split_mode 'grouped' with group_by 'slide'",
    "patch": "PRISM's patch-level split is no longer a split_mode: every manifest of this data set carries it as "
             "the column split_patch, and a task uses it with `split: patch (leaky, as published)`",
}


@register_preparer("camelyon17_wilds")
def prepare_camelyon17_wilds(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Camelyon17-WILDS ``camelyon17_v1.0/{metadata.csv, patches/}``: ``domain`` the hospital
    (``hospital0``..``hospital4``, WILDS' 0-indexed centers); ``group`` the patient (``patient_XXX``;
    ``group_by: slide`` makes it the slide, ``patient_XXX_node_Y``), kept in ``patient`` and ``slide`` too.

    PRISM's sample: ``n_per_hospital`` patches per hospital, label-stratified 50/50 (all of a class that has
    fewer), drawn with ``seed``. ``split_mode``: grouped (the default: ``fractions`` 70/15/15 within each
    hospital, group-disjoint, so no patient, or slide, is on two sides) or official (WILDS: hospital 2 test,
    hospital 1 val, the rest train; WILDS' in-distribution val patches stay in train to keep slides on one
    side). Every manifest also carries ``split_patch``: PRISM's split of the same sample, patch by patch
    (label-stratified ``fractions`` per hospital, ``seed``), which puts one patient's patches in train,
    validation and test; a task uses it with ``split: patch (leaky, as published)``. Groups stay patients
    (or slides) there too, so its intervals resample patients.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``camelyon17_v1.0/metadata.csv`` and ``camelyon17_v1.0/patches/``.
    params : dict
        Preparer parameters: ``seed`` (0), ``n_per_hospital`` (20000; None keeps all), ``split_mode`` (``grouped``
        default, or ``official``), ``group_by`` (``patient`` default, or ``slide``), ``fractions`` (70/15/15), ``dedup``
        (``bytes``) and ``val_fraction`` (0).

    Returns
    -------
    DataFrame
        One row per sampled patch: ``item_id``, ``source``, ``label``/``label_name`` (normal, tumor), ``group``,
        ``group_unit``, ``domain`` (``hospital<k>``), ``split``, ``split_patch``, ``dataset``, ``patient``, ``slide``,
        ``center`` and ``wilds_split``; provenance in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root``, on an unknown parameter or value (the old split modes ``slide`` and
        ``patch`` say what replaced them), on a missing metadata column or missing patch files.
    """
    p = resolve_params("camelyon17_wilds", params, _CAMELYON_DEFAULTS)
    if str(p["split_mode"]).lower() in _CAMELYON_OLD_MODES:
        raise FmauditInputError(f"preparer 'camelyon17_wilds': {_CAMELYON_OLD_MODES[str(p['split_mode']).lower()]}")
    split_mode = choice("camelyon17_wilds", p, "split_mode", ["grouped", "official"])
    group_by = choice("camelyon17_wilds", p, "group_by", ["patient", "slide"])
    root = require(dataset, SOURCES["camelyon17"], data_root, "camelyon17_v1.0/metadata.csv").parent
    meta = pd.read_csv(root / "metadata.csv", dtype={"patient": str})
    meta = meta.drop(columns=[c for c in meta.columns if c.startswith("Unnamed")])
    need = ["patient", "node", "x_coord", "y_coord", "tumor", "center"]
    missing = [c for c in need if c not in meta.columns]
    if missing:
        raise FmauditInputError(f"{root / 'metadata.csv'}: missing column(s) {missing} (columns: {list(meta.columns)})")
    patient = meta["patient"].astype(str).str.zfill(3)
    node = meta["node"].astype(int).astype(str)
    slide = "patient_" + patient + "_node_" + node
    fname = ("patches/" + slide + "/patch_" + slide + "_x_" + meta["x_coord"].astype(int).astype(str)
             + "_y_" + meta["y_coord"].astype(int).astype(str) + ".png")
    df = pd.DataFrame({
        "item_id": fname.str.split("/").str[-1].str.removesuffix(".png").str.removeprefix("patch_"),
        "source": [str((root / f).resolve()) for f in fname],
        "label": meta["tumor"].astype(int), "patient": "patient_" + patient, "slide": slide,
        "domain": "hospital" + meta["center"].astype(int).astype(str), "center": meta["center"].astype(int),
        "wilds_split": meta["split"].astype(int) if "split" in meta.columns else pd.NA,
    })
    df["group"] = df[group_by]
    df["group_unit"] = group_by
    df["label_name"] = df["label"].map(dict(enumerate(CAMELYON_CLASSES)))
    if p["n_per_hospital"] is not None:
        parts = [balanced_subsample(d, int(p["n_per_hospital"]), int(p["seed"]))
                 for _, d in df.groupby("domain", sort=True)]
        df = pd.concat(parts).reset_index(drop=True)
    if not (root / "patches").is_dir():
        raise missing_data_error(dataset, SOURCES["camelyon17"], root / "patches", data_root)
    n_missing, first = first_missing(df["source"])
    if n_missing:
        raise FmauditInputError(f"{dataset}: {n_missing} patch file(s) listed in metadata.csv are missing, "
                                f"e.g. {first}")
    fractions, seed = p["fractions"], int(p["seed"])
    # PRISM's patch-level split (v0.3 resplit): every patch its own group, label-stratified per hospital
    df = pd.concat([grouped_split(d, fractions, seed, group_col="item_id", split_col="split_patch")
                    for _, d in df.groupby("domain", sort=True)])
    if split_mode == "official":
        df["split"] = np.where(df["center"] == 2, "test", np.where(df["center"] == 1, "val", "train"))
    else:
        df = pd.concat([grouped_split(d, fractions, seed) for _, d in df.groupby("domain", sort=True)])
    mode = "official (WILDS centers)" if split_mode == "official" else f"{group_by}-disjoint, per hospital"
    return finish(df, dataset, dict(p, subsample=None), official_split=True,
                  extra_provenance={"split_mode": mode, "group_by": group_by, "n_per_hospital": p["n_per_hospital"],
                                    "split_patch": "patch-level per hospital (PRISM; leaky)"})
