"""Data sets: manifests (the one table downstream rules read), the demo generator, slide tiling, preparers.

A *preparer* turns a data set as it lies under ``data_root`` (its real layout) into a manifest. Preparers
register themselves by name; ``resources/datasets.yaml`` names the preparer of every known data set. A user's
own data need no preparer of their own: the kinds ``image_table``, ``slide_table``, ``features``
(:mod:`fmaudit.datasets.own`) and ``cell_table`` (:mod:`fmaudit.cells.table`) are preparers named after their
kind, declared in YAML (``docs/own-data.md``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from fmaudit.datasets.manifest import GROUP_UNITS, make_manifest, validate_manifest
from fmaudit.io import FmauditInputError

# a preparer's ``group_by`` parameter names its unit (``image`` and ``patch`` are items)
_GROUP_BY_UNITS = {"patient": "patient", "slide": "slide", "biopsy": "biopsy", "section": "section",
                   "image": "item", "patch": "item", "item": "item"}

Preparer = Callable[[str, Path, dict[str, Any]], pd.DataFrame]
PREPARERS: dict[str, Preparer] = {}
#: The manifest columns a preparer's train/val/test split is stratified by, jointly (``label`` unless it says
#: otherwise: PANDA's split is stratified by grade and data provider, ``("label", "domain")``). Analyses that
#: divide or redraw a split "in the same way" read them (:func:`preparer_split_strata`).
DEFAULT_SPLIT_STRATA = ("label",)
PREPARER_SPLIT_STRATA: dict[str, tuple[str, ...]] = {}

# modules whose import registers preparers
_PREPARER_MODULES = ("fmaudit.datasets.demo", "fmaudit.datasets.slide_tiles", "fmaudit.datasets.public",
                     "fmaudit.datasets.own", "fmaudit.cells.prepare", "fmaudit.cells.table")


def register_preparer(name: str, split_strata: tuple[str, ...] = DEFAULT_SPLIT_STRATA
                      ) -> Callable[[Preparer], Preparer]:
    """Decorator: ``@register_preparer("nct_crc_he_100k")`` on ``fn(dataset, data_root, params) -> manifest``.

    ``split_strata``: the manifest columns the preparer stratifies its split by (see
    :data:`PREPARER_SPLIT_STRATA`).

    Parameters
    ----------
    name : str
        The preparer's name, as ``preparer:`` in ``resources/datasets.yaml`` or a user's data-set entry names it.
    split_strata : tuple of str
        Manifest columns the preparer's split is stratified by, jointly (default ``("label",)``).

    Returns
    -------
    callable
        The decorator; it registers ``fn`` under ``name`` and returns it unchanged. Registering another function under a
        taken name raises ``ValueError``.
    """

    def deco(fn: Preparer) -> Preparer:
        if name in PREPARERS and PREPARERS[name] is not fn:
            raise ValueError(f"preparer {name!r} registered twice")
        PREPARERS[name] = fn
        PREPARER_SPLIT_STRATA[name] = tuple(split_strata)
        return fn

    return deco


def preparer_split_strata(name: str) -> tuple[str, ...]:
    """The manifest columns the split of preparer ``name`` is stratified by, jointly (``("label",)`` unless the
    preparer registered others; an unknown preparer raises like :func:`get_preparer`).

    Parameters
    ----------
    name : str
        A registered preparer's name.

    Returns
    -------
    tuple of str
        The stratification columns, e.g. ``("label", "domain")`` for PANDA.

    Raises
    ------
    FmauditInputError
        When no preparer of that name is registered.
    """
    get_preparer(name)
    return PREPARER_SPLIT_STRATA.get(name, DEFAULT_SPLIT_STRATA)


def _load_preparers() -> None:
    for mod in _PREPARER_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a real missing dependency inside the module
                raise


def preparer_names() -> list[str]:
    """Every registered preparer's name.

    Returns
    -------
    list of str
        Sorted names, after importing every module that registers preparers (a registering module absent from
        this installation is skipped; one whose own imports fail raises).
    """
    _load_preparers()
    return sorted(PREPARERS)


def get_preparer(name: str) -> Preparer:
    """The preparer registered under ``name``, importing the modules that register preparers first.

    Parameters
    ----------
    name : str
        The preparer's name (``preparer:`` of a data-set entry).

    Returns
    -------
    callable
        ``fn(dataset, data_root, params) -> DataFrame``, the raw manifest before :func:`make_manifest`.

    Raises
    ------
    FmauditInputError
        When no preparer of that name is registered (the message lists the known ones).
    """
    # Preparers the data-set registry already names (entries with status: pending) whose code arrives with a
    # later piece of work: asking for one says why it is missing rather than calling it unknown.
    pending: dict[str, str] = {}
    _load_preparers()
    if name in PREPARERS:
        return PREPARERS[name]
    if name in pending:
        raise FmauditInputError(f"preparer {name!r} is not implemented yet: {pending[name]}")
    raise FmauditInputError(f"unknown preparer {name!r}; known: {sorted(PREPARERS)}")


def dataset_group_unit(entry: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> str:
    """The unit of a data set's ``group`` column (one of :data:`GROUP_UNITS`) under preparer ``params``: the
    preparer's ``group_by`` parameter where it has one (``group_by: image`` is ``item``), else the registry
    entry's ``group_unit``.

    Parameters
    ----------
    entry : mapping
        The data set's registry entry (``resources/datasets.yaml`` or the config's own data set): its ``params`` and
        ``group_unit`` are read.
    params : mapping, optional
        The run's preparer parameters, overriding ``entry['params']`` key by key.

    Returns
    -------
    str
        One of :data:`GROUP_UNITS`: patient, slide, biopsy, section or item.

    Raises
    ------
    FmauditInputError
        On a ``group_by`` value that names no known unit, or an entry without ``group_unit`` and no ``group_by``.
    """
    params = dict(entry.get("params") or {}, **dict(params or {}))
    by = params.get("group_by")
    if by is not None:
        unit = _GROUP_BY_UNITS.get(str(by).lower())
        if unit is None:
            raise FmauditInputError(f"group_by {by!r}: not a known group unit (known: {sorted(_GROUP_BY_UNITS)})")
        return unit
    if "group_unit" not in entry:
        raise FmauditInputError("data-set registry entry without group_unit: say what its group column is "
                                f"({', '.join(GROUP_UNITS)})")
    return str(entry["group_unit"])


def prepare_dataset(dataset: str, preparer: str, data_root: str | Path, params: dict[str, Any] | None = None,
                    group_unit: str | None = None) -> pd.DataFrame:
    """Run a data set's preparer and return its validated manifest.

    ``group_unit`` (see :func:`dataset_group_unit`) fills the manifest's ``group_unit`` column where the
    preparer left it empty (a preparer sets it itself where its data decide, e.g. PCam without slide names).

    Parameters
    ----------
    dataset : str
        The data set's slug (the manifest's ``dataset`` column).
    preparer : str
        Name of the registered preparer to run.
    data_root : str or Path
        Folder the preparer reads the release from (and may write converted files under).
    params : dict, optional
        Preparer parameters (None: the preparer's defaults); an unknown key raises.
    group_unit : str, optional
        Fills ``group_unit`` where the preparer left it empty; one of :data:`GROUP_UNITS`.

    Returns
    -------
    DataFrame
        The manifest (columns of :data:`MANIFEST_COLUMNS` first, with their dtypes, then the preparer's extra columns),
        validated; the preparer's provenance in ``attrs``.

    Raises
    ------
    FmauditInputError
        On an unknown preparer or ``group_unit``, whatever the preparer raises on its data, and on a manifest that fails
        :func:`validate_manifest`.
    """
    fn = get_preparer(preparer)
    raw = fn(dataset, Path(data_root), dict(params or {}))
    df = make_manifest(raw)
    df.attrs = dict(raw.attrs)  # preparer provenance (duplicates removed, split mode) travels to the parquet
    if group_unit is not None:
        if group_unit not in GROUP_UNITS:
            raise FmauditInputError(f"{dataset}: group_unit {group_unit!r} is not one of {GROUP_UNITS}")
        given = df["group_unit"] if "group_unit" in df.columns else pd.Series(pd.NA, index=df.index)
        df["group_unit"] = given.astype("string").fillna(group_unit)
    return validate_manifest(df, name=f"manifest of {dataset}")
