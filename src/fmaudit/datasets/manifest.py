"""The manifest: one table per data set, the only thing downstream rules read.

Columns (see ``MANIFEST_COLUMNS``):

- ``dataset``    data-set slug
- ``item_id``    unique, filename-safe id of the item within the data set
- ``source``     path of the image file, or of the slide for slide tiles
- ``x``, ``y``   level-0 pixel coordinates of the tile's top-left corner (slide tiles; NA for image files)
- ``level``      pyramid level the tile is read at (slide tiles; NA otherwise)
- ``size``       tile side in pixels at ``level`` (slide tiles; NA otherwise)
- ``label``      integer class index (NA = unlabelled)
- ``label_name`` class name
- ``group``      patient or slide: the unit of grouped splits and cluster bootstrap
- ``domain``     scanner / hospital / site: the unit of transfer
- ``split``      ``train``, ``val``, ``test`` or ``unassigned``

Optional columns with a meaning downstream:

- ``group_unit``  what ``group`` is: patient, slide, biopsy, section, or item where the release identifies
  none (then intervals are item-level); written by the workflow from the registry's ``group_unit``
  (:func:`fmaudit.datasets.dataset_group_unit`), or by a preparer where its data decide
- ``split_patch`` PRISM's patch-level split (Camelyon17), used by tasks with ``split: patch (leaky, as
  published)``; it puts a patient's items on several splits

Extra columns are kept (e.g. ``mpp``, ``sha256``). Rows are in a stable order, and embeddings store item ids in
that order.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError

#: What a manifest's ``group`` column can hold: the unit that grouped splits keep whole and that cluster-bootstrap
#: intervals resample. ``item``: the release identifies no patient, slide or biopsy, so each item is its own
#: group and its intervals are item-level.
GROUP_UNITS = ("patient", "slide", "biopsy", "section", "item")

MANIFEST_COLUMNS: dict[str, str] = {
    "dataset": "string",
    "item_id": "string",
    "source": "string",
    "x": "Int64",
    "y": "Int64",
    "level": "Int64",
    "size": "Int64",
    "label": "Int64",
    "label_name": "string",
    "group": "string",
    "domain": "string",
    "split": "string",
}
SPLITS = ("train", "val", "test", "unassigned")


def make_manifest(rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """Build a manifest with the canonical column order and dtypes; missing optional columns become NA.

    Parameters
    ----------
    rows : list of dict or DataFrame
        One row per item; needs ``dataset``, ``item_id``, ``source``, ``group`` and ``domain``. ``x``, ``y``, ``level``,
        ``size``, ``label`` and ``label_name`` missing become NA, a missing ``split`` becomes ``unassigned``.

    Returns
    -------
    DataFrame
        The :data:`MANIFEST_COLUMNS` in order with their dtypes, then the extra columns as given; index reset.

    Raises
    ------
    FmauditInputError
        When a required column is missing.
    """
    df = pd.DataFrame(rows).copy()
    for col, dtype in MANIFEST_COLUMNS.items():
        if col not in df.columns:
            if col in ("x", "y", "level", "size", "label", "label_name"):
                df[col] = pd.NA
            elif col == "split":
                df[col] = "unassigned"
            else:
                raise FmauditInputError(f"manifest: required column {col!r} is missing")
        df[col] = df[col].astype(dtype)
    extra = [c for c in df.columns if c not in MANIFEST_COLUMNS]
    return df[list(MANIFEST_COLUMNS) + extra].reset_index(drop=True)


def validate_manifest(df: pd.DataFrame, name: str = "manifest") -> pd.DataFrame:
    """Check a manifest; raise :class:`FmauditInputError` naming the column or the first bad row.

    Parameters
    ----------
    df : DataFrame
        A manifest as :func:`make_manifest` builds it.
    name : str
        What to call it in error messages, e.g. ``manifest of nct_crc_he``.

    Returns
    -------
    DataFrame
        ``df`` itself, unchanged, when it passes: required columns present, at least one row, no NA in dataset, item_id,
        source, group, domain or split, unique item ids, known split and group_unit values, slide tiles with
        y/level/size, non-negative labels, one label_name per label.

    Raises
    ------
    FmauditInputError
        On the first check that fails, naming the column or the row.
    """
    missing = [c for c in MANIFEST_COLUMNS if c not in df.columns]
    if missing:
        raise FmauditInputError(f"{name}: missing column(s) {missing}")
    if len(df) == 0:
        raise FmauditInputError(f"{name}: the manifest has no rows")
    for col in ("dataset", "item_id", "source", "group", "domain", "split"):
        bad = df[col].isna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise FmauditInputError(f"{name}: row {i} (item {df['item_id'].iloc[i]!r}) has no {col!r}")
    dup = df["item_id"].duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise FmauditInputError(f"{name}: item_id {df['item_id'].iloc[i]!r} occurs more than once (row {i})")
    if "group_unit" in df.columns:
        bad_unit = ~df["group_unit"].isin(GROUP_UNITS)
        if bad_unit.any():
            i = int(np.flatnonzero(bad_unit.to_numpy())[0])
            raise FmauditInputError(f"{name}: row {i} has group_unit {df['group_unit'].iloc[i]!r}; "
                                    f"expected one of {GROUP_UNITS}")
    bad_split = ~df["split"].isin(SPLITS)
    if bad_split.any():
        i = int(np.flatnonzero(bad_split.to_numpy())[0])
        raise FmauditInputError(f"{name}: row {i} has split {df['split'].iloc[i]!r}; expected one of {SPLITS}")
    tile = df["x"].notna()
    for col in ("y", "level", "size"):
        bad = tile & df[col].isna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise FmauditInputError(f"{name}: row {i} is a slide tile (has x) but no {col!r}")
    lab = df["label"].dropna()
    if (lab < 0).any():
        raise FmauditInputError(f"{name}: negative label in row {int(lab[lab < 0].index[0])}")
    # one label name per label
    named = df.dropna(subset=["label", "label_name"])
    if len(named):
        n_names = named.groupby("label")["label_name"].nunique()
        if (n_names > 1).any():
            raise FmauditInputError(f"{name}: label {int(n_names[n_names > 1].index[0])} has several label_names")
    return df


def check_group_disjoint(df: pd.DataFrame, name: str = "manifest") -> None:
    """Raise if one group (patient/slide) has items on more than one of train/val/test.

    Parameters
    ----------
    df : DataFrame
        A manifest with ``domain``, ``group`` and ``split``; rows on ``unassigned`` are ignored. A group is keyed by
        (domain, group).
    name : str
        What to call the table in the error message.

    Raises
    ------
    FmauditInputError
        Naming the first group found on two or more splits.
    """
    assigned = df[df["split"] != "unassigned"]
    per_group = assigned.groupby(["domain", "group"])["split"].nunique()
    leaky = per_group[per_group > 1]
    if len(leaky):
        dom, grp = leaky.index[0]
        raise FmauditInputError(
            f"{name}: group {grp!r} (domain {dom!r}) is on several splits; splits must be group-disjoint"
        )


def label_names(df: pd.DataFrame) -> list[str]:
    """Class names indexed by label (``'class_k'`` where a name is missing).

    Parameters
    ----------
    df : DataFrame
        A manifest with ``label`` and ``label_name``; unlabelled rows are ignored.

    Returns
    -------
    list of str
        Entry ``k`` is the name of label ``k``, for ``k`` from 0 to the largest label; an empty list when no row is
        labelled.
    """
    lab = df.dropna(subset=["label"])
    if len(lab) == 0:
        return []
    k = int(lab["label"].max()) + 1
    names = [f"class_{i}" for i in range(k)]
    for label, name in lab.groupby("label")["label_name"].first().items():
        if isinstance(name, str):
            names[int(label)] = name
    return names
