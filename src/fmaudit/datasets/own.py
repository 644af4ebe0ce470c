"""A user's own data sets, declared in YAML only: image files, labelled slides and precomputed features.

Each kind is a registry entry without Python (``dataset_entries`` of a config, or a registry file of the user's
own); its ``params`` are described, with their defaults, in ``resources/schemas/datasets.schema.yaml`` and the
sheets follow :mod:`fmaudit.datasets.sheets`:

- ``image_table``: a sheet of image files (``path``, ``label``, ``patient``, ``domain``, optional ``slide``,
  ``split``, ``item_id``).
- ``slide_table``: a sheet of whole-slide images (``path``, ``patient``, ``domain``, optional ``slide``,
  ``label``, ``annotations``, ``split``, ``mpp``), tiled into tissue tiles; a tile takes its slide's label, or the
  class of the annotated region covering enough of it (:mod:`fmaudit.datasets.annotations`).
- ``features``: embeddings another tool computed (HDF5 ``features`` + ids, or ``.npz``) for named encoders,
  with a labels sheet (``item_id``, ``label``, ``patient``, ``domain``, optional ``slide``, ``split``); they enter
  the workflow at the analysis stage (:func:`read_feature_file`, :func:`precomputed_encoders`).
- ``cell_table`` (cells on the user's slides, for the cell branch) lives in :mod:`fmaudit.cells.table`.

Two faces per kind: ``read_<kind>`` validates the sheet without reading an image (the plan stage of the
pre-flight calls it on every dry run: every bad line named), and the registered preparer turns it into a
manifest. Splits: the sheet's ``split`` column, else :func:`automatic_split`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.datasets import register_preparer
from fmaudit.datasets.annotations import Regions, read_regions, tile_labels
from fmaudit.datasets.sheets import (
    LINE_COLUMN,
    SheetProblems,
    check_splits_per_group,
    item_ids_from_paths,
    labels_from_names,
    read_sheet,
    resolve_paths,
)
from fmaudit.datasets.splits import grouped_split
from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import unknown_name_error
from fmaudit.slides import open_slide, tile_coordinates

log = logging.getLogger(__name__)

__all__ = ["FEATURE_ID_KEYS", "OWN_KINDS", "automatic_split", "feature_encoders", "precomputed_encoders",
           "prepare_features", "prepare_image_table", "prepare_slide_table", "read_feature_file", "read_feature_ids",
           "read_feature_table", "read_image_table", "read_slide_table"]

#: The kinds a user declares without Python (``cell_table`` is read by :mod:`fmaudit.cells.table`).
OWN_KINDS = ("image_table", "slide_table", "cell_table", "features")
#: Arrays that hold item ids in the feature files other tools write, in the order they are looked for.
FEATURE_ID_KEYS = ("item_id", "ids", "filenames", "names", "barcodes")
#: Where a manifest row of a features data set comes from (its ``source``): not a file, an id in the files.
FEATURE_SOURCE_PREFIX = "features:"


# --------------------------------------------------------------------------------------------------- splits


def automatic_split(df: pd.DataFrame, fractions: Sequence[float], seed: int, where: str = "") -> pd.DataFrame:
    """``df`` with a ``split`` column: grouped by ``group`` (patient or slide), stratified by ``label`` within
    each ``domain``, seeded, with ``fractions`` (train, val, test).

    Each domain is split on its own (every domain then has train, val and test groups where it has enough),
    unless a group has items in several domains (the same patient scanned twice): then the groups are split
    once over all domains, stratified by domain and label, so that a patient is on one split everywhere.

    Parameters
    ----------
    df : DataFrame
        Manifest rows with ``group``, ``domain`` and ``label``.
    fractions : sequence of float
        Train, val and test shares, summing to 1 (the entry's ``fractions``).
    seed : int
        Seed of the grouped split (the entry's ``seed``).
    where : str
        Prefix of error messages, e.g. ``"data set 'mine': "``.

    Returns
    -------
    DataFrame
        ``df`` (same index and row order) with a ``split`` column of train/val/test.

    Raises
    ------
    FmauditInputError
        When ``fractions`` does not sum to 1, or as :func:`~fmaudit.datasets.splits.grouped_split` does.
    """
    frac = [float(f) for f in fractions]
    if abs(sum(frac) - 1.0) > 1e-6:
        raise FmauditInputError(f"{where}fractions {list(fractions)} must sum to 1")
    shared = df.groupby("group")["domain"].nunique()
    if (shared > 1).any():
        out = grouped_split(df, frac, seed, stratify_by=("domain", "label"))
        return out
    parts = [grouped_split(part, frac, seed, stratify_by=("label",)) for _, part in df.groupby("domain", sort=True)]
    return pd.concat(parts).loc[df.index]


def _splits(df: pd.DataFrame, sheet: pd.DataFrame, params: Mapping[str, Any], where: str) -> pd.DataFrame:
    if "split" in sheet.columns:
        out = df.copy()
        out["split"] = sheet["split"].to_numpy()
        return out
    return automatic_split(df, params["fractions"], int(params["seed"]), where)


def _groups(sheet: pd.DataFrame, group_by: str, problems: SheetProblems) -> pd.Series:
    if group_by not in sheet.columns:
        problems.add(None, f"group_by: {group_by} needs a {group_by!r} column")
        return pd.Series(pd.NA, index=sheet.index, dtype="string")
    for line in sheet.loc[sheet[group_by].isna(), LINE_COLUMN]:
        problems.add(int(line), f"empty {group_by!r} (group_by: {group_by})")
    return sheet[group_by]


def _missing_files(paths: Sequence[str], lines: Sequence[int], column: str, problems: SheetProblems,
                   exists=Path.is_file) -> None:
    for path, line in zip(paths, lines):
        if not exists(Path(path)):
            problems.add(int(line), f"{column} {path} does not exist (relative to {Path.cwd()})")


# ------------------------------------------------------------------------------------------------ image_table

IMAGE_COLUMNS = ("path", "label", "patient", "domain")
IMAGE_OPTIONAL = ("slide", "split")


def read_image_table(dataset: str, params: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of an ``image_table`` sheet as manifest columns (``item_id``, ``source``, ``label``,
    ``label_name``, ``group``, ``domain``, ``patient``, ``slide``, ``split`` where given, ``sheet``,
    :data:`~fmaudit.datasets.sheets.LINE_COLUMN`); every bad line of the sheet is named, no image is read
    (their existence is checked: a stat per file).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    params : mapping
        The entry's ``params`` with the schema's defaults filled in (``resources/schemas/datasets.schema.yaml``,
        ``image_table``): ``sheet``, ``classes``, ``labels_required``, ``fractions``, ``seed``, ``group_by``.

    Returns
    -------
    DataFrame
        One row per sheet line: ``dataset``, ``item_id``, ``source``, ``label`` (index into ``classes``, NA where
        empty), ``label_name``, ``group`` (the ``group_by`` column), ``domain``, ``patient``, ``slide`` (NA where not
        given), ``sheet``, the sheet line, and ``split`` when the sheet has one. ``source`` is the image path resolved
        against the sheet's folder.

    Raises
    ------
    FmauditInputError
        Listing every bad line at once: missing columns or values, unknown classes, a group on several splits, duplicate
        item ids, image files that do not exist.
    """
    sheet_path = str(params["sheet"])
    sheet = read_sheet(sheet_path, IMAGE_COLUMNS, IMAGE_OPTIONAL, non_empty=("path", "patient", "domain"),
                       what="image sheet")
    problems = SheetProblems(sheet_path, "image sheet")
    classes = list(params["classes"])
    labels = labels_from_names(sheet, classes, problems, required=bool(params["labels_required"]), dataset=dataset)
    group = _groups(sheet, str(params["group_by"]), problems)
    check_splits_per_group(sheet.assign(**{str(params["group_by"]): group}), str(params["group_by"]), problems)
    items = item_ids_from_paths(sheet.assign(path=sheet["path"].fillna("")), "path", problems)
    sources = resolve_paths(sheet_path, sheet["path"].fillna(""))
    _missing_files(sources, sheet[LINE_COLUMN], "path", problems)
    problems.raise_if_any()
    return _sheet_manifest(dataset, sheet, sheet_path, items, sources, labels, classes, group)


def _sheet_manifest(dataset: str, sheet: pd.DataFrame, sheet_path: Any, items: Any, sources: Any, labels: Any,
                    classes: Sequence[str], group: Any) -> pd.DataFrame:
    """The manifest rows of a checked sheet (image_table, features): its items, sources and labels with the sheet's
    domain, patient, optional slide and split, and the sheet line each row came from."""
    rows = pd.DataFrame({
        "dataset": dataset, "item_id": items, "source": sources, "label": labels,
        "label_name": pd.array([classes[int(v)] if pd.notna(v) else pd.NA for v in labels], dtype="string"),
        "group": group, "domain": sheet["domain"], "patient": sheet["patient"],
        "slide": sheet["slide"] if "slide" in sheet.columns else pd.NA,
        "sheet": sheet_path, LINE_COLUMN: sheet[LINE_COLUMN],
    })
    if "split" in sheet.columns:
        rows["split"] = sheet["split"]
    return rows


@register_preparer("image_table")
def prepare_image_table(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Preparer of ``image_table`` entries (``data_root`` unused: the sheet lists its files).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Unused: the sheet names its files (the preparer signature is shared by every kind).
    params : mapping
        The entry's ``params`` with the schema's defaults filled in (``resources/schemas/datasets.schema.yaml``,
        ``image_table``): ``sheet``, ``classes``, ``labels_required``, ``fractions``, ``seed``, ``group_by``.

    Returns
    -------
    DataFrame
        The rows of :func:`read_image_table` with ``split`` (the sheet's, else :func:`automatic_split`), and the split's
        provenance (mode, fractions, seed, groups per domain and split) in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        As :func:`read_image_table` and :func:`automatic_split`.
    """
    rows = read_image_table(dataset, params)
    split_given = "split" in rows.columns
    out = rows if split_given else automatic_split(rows, params["fractions"], int(params["seed"]),
                                                  f"data set {dataset!r}: ")
    out.attrs["provenance"] = _split_provenance(out, params, split_given)
    return out


def _split_provenance(df: pd.DataFrame, params: Mapping[str, Any], split_given: bool) -> dict[str, Any]:
    counts = df.groupby(["domain", "split"])["group"].nunique()
    return {"sheet": str(params.get("sheet") or params.get("slides")), "items": int(len(df)),
            "split_mode": "sheet" if split_given else "automatic",
            "fractions": None if split_given else list(params["fractions"]),
            "seed": None if split_given else int(params["seed"]),
            "groups_per_split": {f"{d}/{s}": int(n) for (d, s), n in counts.items()}}


# ------------------------------------------------------------------------------------------------ slide_table

SLIDE_COLUMNS = ("path", "patient", "domain")
SLIDE_OPTIONAL = ("slide", "label", "annotations", "split", "mpp")


def read_slide_table(dataset: str, params: Mapping[str, Any], read_annotations: bool = True) -> pd.DataFrame:
    """The rows of a ``slide_table`` sheet, one per slide: ``slide``, ``path``, ``patient``, ``domain``,
    ``group``, ``label`` (class name or NA), ``annotations`` (path or NA), ``split`` where given, ``mpp``
    (Float64) and the sheet line. Every bad line is named: missing files, a class outside ``classes``, a slide
    with neither label nor annotations where labels are required (or with both), and with
    ``read_annotations`` every annotated region of a class outside ``classes``.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    params : mapping
        The entry's ``params`` with the schema's defaults filled in (``slide_table``): ``sheet``, ``classes``,
        ``labels_required``, ``min_region_share``, ``keep_unannotated_tiles``, ``target_mpp``, ``tile_size``,
        ``min_tissue_fraction``, ``max_tiles_per_slide``, ``fractions``, ``seed``, ``group_by``.
    read_annotations : bool
        Also parse every annotation file and check its region classes (default true); false checks only that the files
        exist.

    Returns
    -------
    DataFrame
        One row per slide: ``slide``, ``path`` (resolved), ``patient``, ``domain``, ``group``, ``label`` (class name; NA
        for annotated slides), ``annotations`` (path or NA), ``mpp`` (Float64, NA: read from the slide), the sheet line,
        and ``split`` where the sheet has one.

    Raises
    ------
    FmauditInputError
        Listing every bad line at once.
    """
    sheet_path = str(params["sheet"])
    sheet = read_sheet(sheet_path, SLIDE_COLUMNS, SLIDE_OPTIONAL, non_empty=SLIDE_COLUMNS, what="slide sheet")
    problems = SheetProblems(sheet_path, "slide sheet")
    classes = list(params["classes"])
    paths = resolve_paths(sheet_path, sheet["path"].fillna(""))
    _missing_files(paths, sheet[LINE_COLUMN], "path", problems)
    slides = sheet["slide"] if "slide" in sheet.columns else pd.Series(pd.NA, index=sheet.index, dtype="string")
    slides = slides.fillna(pd.Series([Path(p).stem for p in paths], index=sheet.index, dtype="string"))
    ids = item_ids_from_paths(sheet.assign(slide=slides), "slide", problems)
    annotations = pd.Series(pd.NA, index=sheet.index, dtype="string")
    if "annotations" in sheet.columns:
        given = sheet["annotations"].notna()
        annotations[given] = resolve_paths(sheet_path, sheet.loc[given, "annotations"])
    has_regions = annotations.notna()
    index = set(classes)
    for name, regions, line in zip(sheet["label"] if "label" in sheet.columns else [pd.NA] * len(sheet),
                                   has_regions, sheet[LINE_COLUMN]):
        if pd.notna(name) and regions:
            problems.add(int(line), "give a slide's class either as its label or by its annotations, not both")
        elif pd.notna(name) and name not in index:
            problems.add(int(line), str(unknown_name_error("class", str(name), classes).args[0])
                         + f" of data set {dataset!r}")
        elif pd.isna(name) and not regions and params["labels_required"]:
            problems.add(int(line), f"no label and no annotations; every slide needs a class of data set {dataset!r} "
                                    f"({', '.join(classes)}) or a GeoJSON of class regions (or set labels_required: "
                                    "false to keep its tiles unlabelled)")
    for path, line in zip(annotations, sheet[LINE_COLUMN]):
        if pd.isna(path):
            continue
        if not Path(path).is_file():
            problems.add(int(line), f"annotations {path} does not exist")
        elif read_annotations:
            try:
                read_regions(path, classes)
            except FmauditInputError as e:
                problems.add(int(line), str(e))
    mpp = pd.Series(pd.NA, index=sheet.index, dtype="Float64")
    if "mpp" in sheet.columns:
        for i, (value, line) in enumerate(zip(sheet["mpp"], sheet[LINE_COLUMN])):
            if pd.isna(value):
                continue
            try:
                mpp.iloc[i] = float(value)
                if not float(value) > 0:
                    raise ValueError
            except ValueError:
                problems.add(int(line), f"mpp {value!r} is not a positive number (level-0 µm/px)")
    group = _groups(sheet.assign(slide=ids), str(params["group_by"]), problems)
    check_splits_per_group(sheet.assign(**{str(params["group_by"]): group}), str(params["group_by"]), problems)
    problems.raise_if_any()
    out = pd.DataFrame({"slide": ids, "path": paths, "patient": sheet["patient"], "domain": sheet["domain"],
                        "group": group,
                        "label": sheet["label"] if "label" in sheet.columns else pd.NA,
                        "annotations": annotations, "mpp": mpp, LINE_COLUMN: sheet[LINE_COLUMN]})
    out["label"] = out["label"].astype("string").where(~has_regions)
    if "split" in sheet.columns:
        out["split"] = sheet["split"]
    return out


def _slide_tiles(row: Any, params: Mapping[str, Any], classes: Sequence[str], where: str) -> tuple[pd.DataFrame, str]:
    """The tiles of one slide with their class names, and a line for the log."""
    mpp = None if pd.isna(row.mpp) else float(row.mpp)
    annotated = pd.notna(row.annotations)
    cap = params["max_tiles_per_slide"]
    try:
        tiles = tile_coordinates(row.path, target_mpp=float(params["target_mpp"]), tile_size=int(params["tile_size"]),
                                 min_tissue_fraction=float(params["min_tissue_fraction"]),
                                 max_tiles=None if annotated or cap is None else int(cap), seed=int(params["seed"]),
                                 mpp_override=mpp)
    except FmauditInputError as e:
        raise FmauditInputError(f"{where}: {e}") from e
    if not annotated:
        tiles["label_name"] = row.label if pd.notna(row.label) else None
        tiles["region_share"] = np.nan
        return tiles, f"{len(tiles)} tiles, slide label {row.label if pd.notna(row.label) else 'none'}"
    regions: Regions = read_regions(row.annotations, classes)
    with open_slide(row.path) as slide:
        width, height = slide.dimensions
        downsamples = list(slide.level_downsamples)
    extent = tiles["size"].to_numpy(np.float64) * np.asarray([downsamples[int(lv)] for lv in tiles["level"]])
    names, share = tile_labels(regions, width, height, tiles["x"].to_numpy(), tiles["y"].to_numpy(),
                               float(extent[0]) if len(extent) else 1.0, float(params["min_region_share"]))
    tiles["label_name"] = names
    tiles["region_share"] = share
    n_tissue = len(tiles)
    if not params["keep_unannotated_tiles"]:
        tiles = tiles[pd.notna(tiles["label_name"]).to_numpy()]
    if cap is not None and len(tiles) > int(cap):
        rng = np.random.default_rng(int(params["seed"]))
        tiles = tiles.iloc[np.sort(rng.choice(len(tiles), size=int(cap), replace=False))]
    counts = pd.Series(tiles["label_name"]).value_counts().to_dict()
    note = (f"{n_tissue} tissue tiles, {int(pd.notna(tiles['label_name']).sum())} labelled by regions "
            f"({min(float(params['min_region_share']), 1):g} of a tile at least) {counts}; "
            f"{regions.skipped_unclassified} unclassified and {regions.skipped_geometry} non-polygon features left out")
    if pd.notna(tiles["label_name"]).sum() == 0 and not params["keep_unannotated_tiles"]:
        raise FmauditInputError(f"{where}: no tissue tile is covered to {params['min_region_share']:g} of its area by "
                                f"an annotated region of {row.annotations}")
    return tiles.reset_index(drop=True), note


@register_preparer("slide_table")
def prepare_slide_table(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Preparer of ``slide_table`` entries: every slide's tissue tiles, labelled by their slide or their regions,
    split by the sheet or automatically (``data_root`` unused).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Unused: the sheet names its files (the preparer signature is shared by every kind).
    params : mapping
        The entry's ``params`` with the schema's defaults filled in (``slide_table``): ``sheet``, ``classes``,
        ``labels_required``, ``min_region_share``, ``keep_unannotated_tiles``, ``target_mpp``, ``tile_size``,
        ``min_tissue_fraction``, ``max_tiles_per_slide``, ``fractions``, ``seed``, ``group_by``.

    Returns
    -------
    DataFrame
        One row per kept tile: ``item_id`` (``<slide>_x<x>_y<y>``), the tile columns of
        :func:`fmaudit.slides.tile_coordinates` (``x``, ``y``, ``level``, ``size``, ``tissue_fraction``,
        ``mpp``),
        ``label_name``/``label`` (NA for unlabelled tiles), ``region_share`` (NaN for slide-labelled tiles),
        ``dataset``, ``source`` (the slide), ``group``, ``domain``, ``patient``, ``slide``, ``sheet``, the sheet line,
        ``split``; the split's provenance in ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        As :func:`read_slide_table`, when a slide cannot be tiled (the message names its sheet line), or when no tile of
        an annotated slide is covered enough by a region.
    """
    sheet = read_slide_table(dataset, params)
    classes = list(params["classes"])
    index = {c: i for i, c in enumerate(classes)}
    parts = []
    for row in sheet.itertuples(index=False):
        where = f"{params['sheet']}: line {getattr(row, LINE_COLUMN)} (slide {row.slide!r})"
        tiles, note = _slide_tiles(row, params, classes, where)
        log.info("%s: %s", where, note)
        tiles.insert(0, "item_id", [f"{row.slide}_x{x}_y{y}" for x, y in zip(tiles["x"], tiles["y"])])
        tiles["dataset"] = dataset
        tiles["source"] = str(row.path)
        tiles["group"] = str(row.group)
        tiles["domain"] = str(row.domain)
        tiles["patient"] = str(row.patient)
        tiles["slide"] = str(row.slide)
        tiles["sheet"] = str(params["sheet"])
        tiles[LINE_COLUMN] = int(getattr(row, LINE_COLUMN))
        if "split" in sheet.columns:
            tiles["split"] = str(row.split)
        parts.append(tiles)
    manifest = pd.concat(parts, ignore_index=True)
    manifest["label_name"] = manifest["label_name"].astype("string")
    manifest["label"] = pd.array([index[n] if pd.notna(n) else pd.NA for n in manifest["label_name"]], dtype="Int64")
    split_given = "split" in sheet.columns
    if not split_given:
        manifest = automatic_split(manifest, params["fractions"], int(params["seed"]), f"data set {dataset!r}: ")
    manifest.attrs["provenance"] = _split_provenance(manifest, params, split_given)
    return manifest


# ------------------------------------------------------------------------------------------------ features

FEATURE_COLUMNS = ("item_id", "label", "patient", "domain")
FEATURE_OPTIONAL = ("slide", "split")


def read_feature_ids(path: PathLike, ids_key: str | None = None, features_key: str = "features"
                     ) -> tuple[np.ndarray, tuple[int, ...]]:
    """``(item ids, shape of the feature array)`` of a feature file, without reading the features.

    Parameters
    ----------
    path : str or Path
        An .h5/.hdf5 or .npz feature file.
    ids_key : str, optional
        Name of the item-id array; None takes the first of :data:`FEATURE_ID_KEYS` the file holds.
    features_key : str
        Name of the (items x dims) feature array (default ``features``).

    Returns
    -------
    tuple of (ndarray, tuple of int)
        The ids (object array of str) and the feature array's shape ``(N, D)`` (a leading axis of 1 dropped).

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        On a suffix other than .h5/.hdf5/.npz, a missing array, or a feature array whose shape does not match the ids.
    """
    arrays = _open_feature_file(path, ids_key, features_key, read_features=False)
    return arrays[0], arrays[2]


def read_feature_file(path: PathLike, ids_key: str | None = None, features_key: str = "features"
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``(item ids, features (N, D) float32)`` of an HDF5 (``.h5``/``.hdf5``) or ``.npz`` feature file; the ids
    are ``ids_key`` or the first of :data:`FEATURE_ID_KEYS` the file holds; a leading axis of 1 (one bag, as
    CLAM and TRIDENT write) is dropped.

    Parameters
    ----------
    path : str or Path
        An .h5/.hdf5 or .npz feature file.
    ids_key : str, optional
        Name of the item-id array; None takes the first of :data:`FEATURE_ID_KEYS` the file holds.
    features_key : str
        Name of the (items x dims) feature array (default ``features``).

    Returns
    -------
    tuple of (ndarray, ndarray)
        The ids (object array of str, length N) and the features, float32 of shape ``(N, D)``.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        On a suffix other than .h5/.hdf5/.npz, a missing array, or a feature array whose shape does not match the ids.
    """
    ids, feats, _ = _open_feature_file(path, ids_key, features_key, read_features=True)
    return ids, feats


def _open_feature_file(path: PathLike, ids_key: str | None, features_key: str, read_features: bool):
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: feature file not found")
    suffix = path.suffix.lower()
    if suffix in (".h5", ".hdf5"):
        handle = h5py.File(path, "r")
        names = list(handle.keys())
    elif suffix == ".npz":
        handle = np.load(path, allow_pickle=False)
        names = [n for n in handle.files if n != "provenance"]
    else:
        raise FmauditInputError(f"{path}: a feature file is .h5, .hdf5 or .npz, not {suffix!r}")
    with handle:
        if features_key not in names:
            raise FmauditInputError(f"{path}: no array {features_key!r} (it holds {names}); set features_key")
        key = ids_key or next((k for k in FEATURE_ID_KEYS if k in names), None)
        if key is None or key not in names:
            raise FmauditInputError(f"{path}: no item-id array ({ids_key or ' / '.join(FEATURE_ID_KEYS)}; it holds "
                                    f"{names}); set ids_key")
        ids = np.asarray(handle[key][()]).reshape(-1)
        shape = tuple(int(n) for n in handle[features_key].shape)
        feats = np.asarray(handle[features_key][()], dtype=np.float32) if read_features else None
    ids = np.asarray([v.decode() if isinstance(v, bytes) else str(v) for v in ids], dtype=object)
    if len(shape) == 3 and shape[0] == 1:
        shape = shape[1:]
        feats = feats[0] if feats is not None else None
    if len(shape) != 2 or shape[0] != len(ids):
        raise FmauditInputError(f"{path}: {features_key!r} has shape {shape}, expected ({len(ids)} items, dims) "
                                f"for the {len(ids)} ids of {key!r}")
    return ids, feats, shape


def read_feature_table(dataset: str, params: Mapping[str, Any]) -> pd.DataFrame:
    """The labels sheet of a ``features`` entry as manifest columns; every item must be in every feature file
    (its ids are read, not its features), and every file must exist: errors name the line or the file.

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    params : mapping
        The entry's ``params`` with the schema's defaults filled in (``features``): ``sheet``, ``files`` (encoder ->
        file), ``features_key``, ``ids_key``, ``readout``, ``classes``, ``labels_required``, ``fractions``, ``seed``,
        ``group_by``.

    Returns
    -------
    DataFrame
        One row per sheet line: ``dataset``, ``item_id``, ``source``, ``label`` (index into ``classes``, NA where
        empty), ``label_name``, ``group`` (the ``group_by`` column), ``domain``, ``patient``, ``slide`` (NA where not
        given), ``sheet``, the sheet line, and ``split`` when the sheet has one. ``source`` is ``features:<item_id>``.

    Raises
    ------
    FmauditInputError
        Listing every bad line of the sheet at once (including an item id on two lines), then naming the first feature
        file that lacks some of the sheet's items.
    """
    sheet_path = str(params["sheet"])
    sheet = read_sheet(sheet_path, FEATURE_COLUMNS, FEATURE_OPTIONAL, non_empty=("item_id", "patient", "domain"),
                       what="features sheet")
    problems = SheetProblems(sheet_path, "features sheet")
    classes = list(params["classes"])
    labels = labels_from_names(sheet, classes, problems, required=bool(params["labels_required"]), dataset=dataset)
    group = _groups(sheet, str(params["group_by"]), problems)
    check_splits_per_group(sheet.assign(**{str(params["group_by"]): group}), str(params["group_by"]), problems)
    seen: dict[str, int] = {}
    for item, line in zip(sheet["item_id"], sheet[LINE_COLUMN]):
        if pd.notna(item) and item in seen:
            problems.add(int(line), f"item_id {item!r} is also on line {seen[item]}")
        seen.setdefault(item, int(line))
    problems.raise_if_any()
    for encoder, file in feature_files(params).items():
        ids, _ = read_feature_ids(file, params["ids_key"], params["features_key"])
        missing = sorted(set(sheet["item_id"].astype(str)) - set(ids))
        if missing:
            lines = sheet.loc[sheet["item_id"].isin(missing[:5]), LINE_COLUMN].tolist()
            raise FmauditInputError(
                f"{file} (features of encoder {encoder!r}): {len(missing)} item(s) of {sheet_path} are not in the "
                f"file, e.g. {', '.join(repr(m) for m in missing[:5])} (lines {', '.join(map(str, lines))})")
    return _sheet_manifest(dataset, sheet, sheet_path, sheet["item_id"], FEATURE_SOURCE_PREFIX + sheet["item_id"],
                           labels, classes, group)


@register_preparer("features")
def prepare_features(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Preparer of ``features`` entries: the labels sheet as a manifest (the features are imported per encoder
    by the workflow's ``import_features`` rule, in this manifest's items).

    Parameters
    ----------
    dataset : str
        Slug of the data set: the manifest's ``dataset`` column and the name in error messages.
    data_root : Path
        Unused: the sheet names its files (the preparer signature is shared by every kind).
    params : mapping
        The entry's ``params`` with the schema's defaults filled in (``features``): ``sheet``, ``files`` (encoder ->
        file), ``features_key``, ``ids_key``, ``readout``, ``classes``, ``labels_required``, ``fractions``, ``seed``,
        ``group_by``.

    Returns
    -------
    DataFrame
        The rows of :func:`read_feature_table` with ``split``; provenance (the split and the files per encoder) in
        ``attrs['provenance']``.

    Raises
    ------
    FmauditInputError
        As :func:`read_feature_table` and :func:`automatic_split`.
    """
    rows = read_feature_table(dataset, params)
    split_given = "split" in rows.columns
    out = rows if split_given else automatic_split(rows, params["fractions"], int(params["seed"]),
                                                  f"data set {dataset!r}: ")
    out.attrs["provenance"] = {**_split_provenance(out, params, split_given), "files": feature_files(params)}
    return out


def feature_files(params: Mapping[str, Any]) -> dict[str, str]:
    """Encoder -> feature file of a ``features`` entry's params, paths taken relative to its sheet.

    Parameters
    ----------
    params : mapping
        A ``features`` entry's params: ``files`` (encoder -> path) and ``sheet``.

    Returns
    -------
    dict of str to str
        Encoder slug -> feature file path, relative paths resolved against the sheet's folder.
    """
    files = dict(params["files"])
    return dict(zip(files, resolve_paths(params["sheet"], files.values())))


def feature_encoders(config_datasets: Sequence[str], registry: Mapping[str, Mapping[str, Any]],
                     params_of: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(encoder, data set): what its import reads}`` (file, features_key, ids_key, readout or None) of every
    ``features`` data set of ``config_datasets``; ``params_of`` gives each data set's parameters.

    Parameters
    ----------
    config_datasets : sequence of str
        The data sets of the config.
    registry : mapping
        Data-set registry: slug -> entry (its ``kind`` is read).
    params_of : mapping
        Slug -> the data set's resolved params.

    Returns
    -------
    dict
        ``(encoder, data set)`` -> ``{"file", "features_key", "ids_key", "readout"}``, for ``features`` data sets only.
    """
    out = {}
    for ds in config_datasets:
        if registry[ds]["kind"] != "features":
            continue
        params = params_of[ds]
        for encoder, file in feature_files(params).items():
            out[(encoder, ds)] = {"file": file, "features_key": params["features_key"], "ids_key": params["ids_key"],
                                  "readout": params["readout"]}
    return out


def precomputed_encoders(imports: Mapping[tuple[str, str], Mapping[str, Any]],
                         encoder_registry: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Encoder entries for the names of :func:`feature_encoders` that no registry defines: ``loader:
    precomputed`` (nothing to build: no embedding job may run for them), one readout (the imports' ``readout``,
    else ``cls``) of the files' width (their headers are read). Two files of one name must agree in width and
    readout.

    Parameters
    ----------
    imports : mapping
        What :func:`feature_encoders` returns.
    encoder_registry : mapping
        Encoder slug -> registry entry; names found here are left out.

    Returns
    -------
    dict
        Encoder name -> entry with ``description``, ``loader`` (``precomputed``), ``weights``, ``readouts``,
        ``default_readout``, ``embed_dim`` (the files' width), ``gpu`` (false) and ``precision`` (float32).

    Raises
    ------
    FmauditInputError
        When two files of one name disagree in width or readout, or as :func:`read_feature_ids` does.
    """
    out: dict[str, dict[str, Any]] = {}
    for (encoder, _), spec in sorted(imports.items()):
        if encoder in encoder_registry:
            continue
        _, shape = read_feature_ids(spec["file"], spec["ids_key"], spec["features_key"])
        readout = spec["readout"] or "cls"
        entry = {"description": f"embeddings computed elsewhere ({spec['file']})", "loader": "precomputed",
                 "weights": {"source": "precomputed"}, "readouts": [readout], "default_readout": readout,
                 "embed_dim": int(shape[1]), "gpu": False, "precision": "float32"}
        known = out.get(encoder)
        if known is not None and (known["embed_dim"], known["readouts"]) != (entry["embed_dim"], entry["readouts"]):
            raise FmauditInputError(f"encoder {encoder!r}: its feature files disagree in width or readout "
                                    f"({known['description']}: {known['embed_dim']}, {spec['file']}: {shape[1]})")
        out.setdefault(encoder, entry)
    return out

