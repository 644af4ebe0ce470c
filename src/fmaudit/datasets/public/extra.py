"""Preparers of the two PRISM tile data sets added after the first batch: LungHist700 and
SPIDER-breast.

Both read the release in its published layout under ``data_root`` (see ``resources/datasets.yaml`` for
where each is expected and how to get it) and return a manifest following the conventions of ``_common``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from fmaudit.datasets import register_preparer
from fmaudit.datasets.public._common import (
    COMMON_DEFAULTS,
    Source,
    choice,
    class_folders,
    finish,
    first_missing,
    list_images,
    log,
    missing_data_error,
    require,
    resolve_params,
    safe_id,
)
from fmaudit.io import FmauditInputError

SOURCES = {
    "lunghist700": Source(
        "LungHist700", "https://figshare.com/articles/dataset/LungHist700/25459174",
        "download LungHist700.rar (figshare file 45206104, about 670 MB) and extract it with unrar or 7z into "
        "LungHist700/ so that LungHist700/images/<class>/ and the metadata table data.csv lie there",
    ),
    "spider_breast": Source(
        "SPIDER-breast", "https://huggingface.co/datasets/histai/SPIDER-breast",
        "accept the dataset's conditions on Hugging Face, download the repository's archive parts "
        "(huggingface-cli download histai/SPIDER-breast --repo-type dataset) and extract them as the dataset "
        "card describes, giving SPIDER-breast/metadata.json and SPIDER-breast/images/",
    ),
}


# --------------------------------------------------------------------------- LungHist700

# Folder names of the release: superclass (aca adenocarcinoma, scc squamous cell carcinoma, nor normal) and
# differentiation (bd well, md moderately, pd poorly differentiated; Spanish abbreviations).
LUNGHIST_CLASSES = ("aca_bd", "aca_md", "aca_pd", "nor", "scc_bd", "scc_md", "scc_pd")
LUNGHIST_COARSE = ("aca", "nor", "scc")
_LUNGHIST_NAME = re.compile(r"^(?P<cls>aca_bd|aca_md|aca_pd|nor|scc_bd|scc_md|scc_pd)_(?P<res>20x|40x)_(?P<id>\d+)$")
_LUNGHIST_COLUMNS = ("superclass", "subclass", "resolution", "image_id", "patient_id")

# The authors' patient-level split per resolution (HistoLib.generator.get_reproducible_ids of
# github.com/jorgediosdado/LungHist700); the two resolutions have different splits.
LUNGHIST_OFFICIAL_SPLIT = {
    "20x": {
        "train": (2, 3, 4, 5, 7, 8, 12, 14, 15, 16, 17, 18, 20, 21, 23, 24, 25, 26, 28, 29, 30, 33, 36, 37, 38, 39,
                  41, 42, 45),
        "val": (1, 6, 27, 32, 44),
        "test": (9, 13, 31, 40),
    },
    "40x": {
        "train": (2, 6, 8, 9, 10, 12, 13, 14, 16, 18, 19, 21, 22, 24, 28, 29, 31, 33, 34, 35, 36, 38, 40, 44),
        "val": (1, 4, 17, 26, 30, 37, 45),
        "test": (11, 15, 20, 25, 32, 43),
    },
}


def parse_lunghist_name(name: str) -> dict[str, Any]:
    """Fields of a LungHist700 file name, e.g. ``aca_bd_20x_901.jpg``: class aca_bd, resolution 20x, image 901.

    Parameters
    ----------
    name : str
        A file name or path; only its stem is read.

    Returns
    -------
    dict
        ``fine_class`` (one of ``LUNGHIST_CLASSES``), ``resolution`` (``20x`` or ``40x``) and ``image_id`` (int).

    Raises
    ------
    FmauditInputError
        When the name does not follow ``<class>_<20x|40x>_<image id>``.
    """
    m = _LUNGHIST_NAME.match(Path(name).stem)
    if not m:
        raise FmauditInputError(
            f"LungHist700: file name {name!r} does not follow <class>_<20x|40x>_<image id>.jpg "
            f"(class one of {list(LUNGHIST_CLASSES)})"
        )
    return {"fine_class": m["cls"], "resolution": m["res"], "image_id": int(m["id"])}


def _lunghist_metadata(root: Path, dataset: str) -> pd.DataFrame | None:
    """The release's metadata table (one row per image, with its patient), or None when there is none.

    The authors' code reads ``data.csv``; some copies name it ``LungHist700.csv``: any csv in the release
    folder with the five columns is taken, data.csv first.
    """
    candidates = sorted(root.glob("*.csv"), key=lambda p: (p.name != "data.csv", p.name))
    for path in candidates:
        table = pd.read_csv(path)
        table.columns = [str(c).strip().lower() for c in table.columns]
        if not set(_LUNGHIST_COLUMNS) <= set(table.columns):
            continue
        sub = table["subclass"].astype("string").str.strip().str.lower().fillna("")
        sup = table["superclass"].astype(str).str.strip().str.lower()
        table = pd.DataFrame({
            "fine_class": sup.where(sub == "", sup + "_" + sub),
            "resolution": table["resolution"].astype(str).str.strip().str.lower(),
            "image_id": pd.to_numeric(table["image_id"], errors="coerce"),
            "patient_id": pd.to_numeric(table["patient_id"], errors="coerce"),
        })
        bad = table[~table["fine_class"].isin(LUNGHIST_CLASSES) | ~table["resolution"].isin(["20x", "40x"])
                    | table["image_id"].isna() | table["patient_id"].isna()]
        if len(bad):
            raise FmauditInputError(
                f"{path}: row {int(bad.index[0])} is not a valid image record "
                f"(class {bad['fine_class'].iloc[0]!r}, resolution {bad['resolution'].iloc[0]!r})"
            )
        table = table.astype({"image_id": int, "patient_id": int})
        dup = table.duplicated(["fine_class", "resolution", "image_id"])
        if dup.any():
            r = table[dup].iloc[0]
            raise FmauditInputError(
                f"{path}: image {r['fine_class']}_{r['resolution']}_{r['image_id']} is listed twice")
        log.info("%s: metadata from %s (%d rows)", dataset, path, len(table))
        return table
    return None


@register_preparer("lunghist700")
def prepare_lunghist700(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """LungHist700 ``LungHist700/images/<class>/<class>_<20x|40x>_<id>.jpg`` with the metadata table
    (superclass, subclass, resolution, image_id, patient_id) beside ``images/``.

    ``resolution`` all / 20x / 40x; ``taxonomy`` fine (7 classes: adenocarcinoma and squamous cell carcinoma
    at three differentiation grades, and normal) or coarse (aca / nor / scc); ``group_by`` patient (needs the
    metadata table) or image (PRISM split the 691 images at image level); ``split_mode`` grouped (a grouped,
    stratified split by ``fractions``) or official (the authors' patient split, one resolution only).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``LungHist700/`` (``LungHist700/LungHist700/`` and ``LungHist700/data/`` are accepted).
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``resolution`` (``all``
        default, ``20x``, ``40x``), ``taxonomy`` (``fine`` default, or ``coarse``), ``group_by`` (``patient`` default,
        or ``image``) and ``split_mode`` (``grouped`` default, or ``official``: needs one resolution and ``group_by:
        patient``).

    Returns
    -------
    DataFrame
        One row per image: ``item_id``, ``source``, ``label``/``label_name``, ``group`` (``patient_<id>`` or the item),
        ``domain`` (the slug), ``split``, ``dataset``, ``fine_class``, ``resolution``, ``image_id`` and, with the
        metadata table, ``patient_id``; provenance in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root``, on an unknown parameter or value or an impossible combination, when
        file names do not parse or disagree with their folder, when images and metadata rows do not match one to one, or
        a patient is in none of the authors' split lists.
    """
    p = resolve_params("lunghist700", params, {**COMMON_DEFAULTS, "resolution": "all", "taxonomy": "fine",
                                               "group_by": "patient", "split_mode": "grouped"})
    resolution = choice("lunghist700", p, "resolution", ["all", "20x", "40x"])
    taxonomy = choice("lunghist700", p, "taxonomy", ["fine", "coarse"])
    group_by = choice("lunghist700", p, "group_by", ["patient", "image"])
    split_mode = choice("lunghist700", p, "split_mode", ["grouped", "official"])
    if split_mode == "official" and (resolution == "all" or group_by != "patient"):
        raise FmauditInputError(
            "preparer 'lunghist700': split_mode official is the authors' patient split of one resolution; "
            f"set resolution to 20x or 40x and group_by patient (got resolution {resolution!r}, group_by {group_by!r})"
        )
    root = require(dataset, SOURCES["lunghist700"], data_root, "LungHist700/images",
                   "LungHist700/LungHist700/images", "LungHist700/data/images").parent
    rows = []
    folders = class_folders(root / "images", LUNGHIST_CLASSES, dataset=dataset, case_insensitive=False)
    for cls, folder in folders.items():
        for f in list_images(folder, (".jpg", ".jpeg", ".png", ".tif", ".tiff")):
            info = parse_lunghist_name(f.name)
            if info["fine_class"] != cls:
                raise FmauditInputError(f"{dataset}: {f} is named {info['fine_class']} but lies in {cls}/")
            rows.append({**info, "item_id": safe_id(f.stem), "source": str(f.resolve())})
    if not rows:
        raise FmauditInputError(f"{dataset}: no images found in {root / 'images'}")
    df = pd.DataFrame(rows)

    meta = _lunghist_metadata(root, dataset)
    if meta is None and group_by == "patient":
        raise FmauditInputError(
            f"{dataset}: group_by patient needs the release's metadata table (data.csv with columns "
            f"{', '.join(_LUNGHIST_COLUMNS)}) in {root}; none found (group_by image splits without it)"
        )
    if meta is not None:
        key = ["fine_class", "resolution", "image_id"]
        merged = df.merge(meta, on=key, how="outer", indicator=True)
        no_row = merged[merged["_merge"] == "left_only"]
        if len(no_row):
            raise FmauditInputError(
                f"{dataset}: {len(no_row)} image(s) have no row in the metadata table, e.g. {no_row['source'].iloc[0]}")
        no_file = merged[merged["_merge"] == "right_only"]
        if len(no_file):
            r = no_file.iloc[0]
            raise FmauditInputError(
                f"{dataset}: {len(no_file)} image(s) listed in the metadata table are missing, e.g. "
                f"{root / 'images' / r['fine_class']}/{r['fine_class']}_{r['resolution']}_{r['image_id']}.jpg")
        df = merged.drop(columns="_merge")
        df["patient_id"] = df["patient_id"].astype(int)
    if resolution != "all":
        df = df[df["resolution"] == resolution].reset_index(drop=True)

    df["label_name"] = df["fine_class"] if taxonomy == "fine" else df["fine_class"].str[:3]
    classes = LUNGHIST_CLASSES if taxonomy == "fine" else LUNGHIST_COARSE
    df["label"] = df["label_name"].map({c: i for i, c in enumerate(classes)})
    df["group"] = ("patient_" + df["patient_id"].astype(str)) if group_by == "patient" else df["item_id"]
    df["domain"] = dataset
    if split_mode == "official":
        lists = LUNGHIST_OFFICIAL_SPLIT[resolution]
        split_of = {pid: split for split, ids in lists.items() for pid in ids}
        unlisted = sorted(set(df["patient_id"]) - set(split_of))
        if unlisted:
            raise FmauditInputError(
                f"{dataset}: patient(s) {unlisted[:5]} at {resolution} are in none of the authors' split lists")
        df["split"] = df["patient_id"].map(split_of)
    extra = {"resolution": resolution, "taxonomy": taxonomy, "group_by": group_by}
    return finish(df, dataset, p, official_split=split_mode == "official", extra_provenance=extra)


# --------------------------------------------------------------------------- SPIDER-breast

# The 18 classes of the release (as listed in PRISM's SPIDER-breast notebooks, sorted by name).
SPIDER_BREAST_CLASSES = (
    "Adenosis", "Benign phyllodes tumor", "Ductal carcinoma in situ (high-grade)",
    "Ductal carcinoma in situ (low-grade)", "Fat", "Fibroadenoma", "Fibrocystic changes", "Fibrosis",
    "Invasive non-special type carcinoma", "Lipogranuloma", "Lobular invasive carcinoma",
    "Malignant phyllodes tumor", "Necrosis", "Normal ducts", "Normal lobules", "Sclerosing adenosis",
    "Typical ductal hyperplasia", "Vessels",
)
_SPIDER_KEYS = ("slide_id", "image_name", "class", "split")


@register_preparer("spider_breast")
def prepare_spider_breast(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """SPIDER-breast ``SPIDER-breast/{metadata.json, images/}``: one record per labelled 224-px central patch
    (20x) with its ``slide_id``, ``image_name``, ``class`` (18 classes) and release ``split`` (train / test);
    the 24 context patches of each record are not used. ``group`` is the slide.

    ``split_mode`` official (the release's slide-level train/test split, val carved from train by
    ``val_fraction``) or grouped (a slide-grouped, stratified split by ``fractions``, ignoring the release's).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Folder holding ``SPIDER-breast/`` (nested once more is accepted).
    params : dict
        Preparer parameters: the common ones (``seed``, ``fractions``, ``val_fraction``, ``dedup``, ``subsample``,
        ``subsample_method``: ``COMMON_DEFAULTS`` of ``fmaudit.datasets.public._common``), plus ``split_mode``
        (``official`` default, or ``grouped``).

    Returns
    -------
    DataFrame
        One row per record: ``item_id``, ``source``, ``label``/``label_name`` (18 classes), ``group`` (``slide_<id>``),
        ``domain`` (the slug), ``split``, ``dataset``, ``slide_id``, ``image_name`` and ``release_split``; provenance in
        ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        When the release is not under ``data_root``, on an unknown parameter, invalid JSON, a record lacking a key or
        with an unknown class or split, an image listed twice, missing images, or (official split) a slide on both the
        release's train and test sides.
    """
    p = resolve_params("spider_breast", params, {**COMMON_DEFAULTS, "split_mode": "official"})
    split_mode = choice("spider_breast", p, "split_mode", ["official", "grouped"])
    meta_path = require(dataset, SOURCES["spider_breast"], data_root, "SPIDER-breast/metadata.json",
                        "SPIDER-breast/SPIDER-breast/metadata.json")
    root = meta_path.parent
    try:
        records = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise FmauditInputError(f"{meta_path}: not valid JSON ({e})") from e
    if not isinstance(records, list) or not records:
        raise FmauditInputError(f"{meta_path}: expected a non-empty list of patch records")
    rows = []
    for i, r in enumerate(records):
        missing = [k for k in _SPIDER_KEYS if not isinstance(r, dict) or r.get(k) in (None, "")]
        if missing:
            raise FmauditInputError(f"{meta_path}: record {i} lacks {missing} (expected keys {list(_SPIDER_KEYS)})")
        cls, split = str(r["class"]), str(r["split"]).strip().lower()
        if cls not in SPIDER_BREAST_CLASSES:
            raise FmauditInputError(
                f"{meta_path}: record {i} has class {cls!r}; expected one of {list(SPIDER_BREAST_CLASSES)}")
        if split not in ("train", "test"):
            raise FmauditInputError(f"{meta_path}: record {i} has split {split!r}; expected train or test")
        name = str(r["image_name"])
        rows.append({"item_id": safe_id(Path(name).stem), "source": str((root / "images" / name).resolve()),
                     "label_name": cls, "label": SPIDER_BREAST_CLASSES.index(cls), "group": f"slide_{r['slide_id']}",
                     "slide_id": str(r["slide_id"]), "image_name": name, "release_split": split})
    df = pd.DataFrame(rows)
    if not df["item_id"].is_unique:
        dup = df.loc[df["item_id"].duplicated(), "image_name"].iloc[0]
        raise FmauditInputError(f"{meta_path}: image {dup!r} is listed in more than one record")
    n_missing, first = first_missing(df["source"])
    if n_missing:
        if n_missing == len(df):
            raise missing_data_error(dataset, SOURCES["spider_breast"], root / "images", data_root)
        raise FmauditInputError(f"{dataset}: {n_missing} image(s) named in metadata.json are missing, e.g. {first}")
    df["domain"] = dataset
    if split_mode == "official":
        straddling = df.groupby("group")["release_split"].nunique()
        straddling = straddling[straddling > 1]
        if len(straddling):
            raise FmauditInputError(
                f"{dataset}: {len(straddling)} slide(s) have patches in both the release's train and test splits "
                f"(e.g. {straddling.index[0]}), so the official split is not slide-disjoint; use split_mode grouped"
            )
        df["split"] = df["release_split"]
    return finish(df, dataset, p, official_split=split_mode == "official")
