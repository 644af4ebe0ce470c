"""Slide tiles: a slide sheet (one whole-slide image per row) becomes a manifest of tissue tiles.

The sheet is tab-separated with columns ``slide_id``, ``path``, ``group``, ``domain`` and optional
``label``, ``label_name``, ``mpp`` (see ``resources/schemas/slides.schema.yaml``, which the workflow also
validates it against). Paths, of the sheet and of the slides in it, are relative to the working directory
(the repository root for the workflow) or absolute; the manifest's ``source`` keeps the slide path as
written in the sheet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fmaudit.datasets import register_preparer
from fmaudit.io import FmauditInputError
from fmaudit.schema import SCHEMAS, load_yaml, schema_violations
from fmaudit.slides import tile_coordinates

SLIDE_SHEET_SCHEMA = SCHEMAS / "slides.schema.yaml"

SHEET_COLUMNS = ("slide_id", "path", "group", "domain", "label", "label_name", "mpp")

SLIDE_TILES_DEFAULTS: dict[str, Any] = {
    "target_mpp": 1.0,
    "tile_size": 224,
    "min_tissue_fraction": 0.5,
    "max_tiles_per_slide": None,
    "seed": 0,
}


def _typed_record(sheet_path: Path, i: int, raw: dict[str, str]) -> dict[str, Any]:
    """Non-empty cells of one sheet row, with ``label`` as int and ``mpp`` as float where they parse."""
    record: dict[str, Any] = {k: v.strip() for k, v in raw.items() if v.strip() != ""}
    for key, cast in (("label", int), ("mpp", float)):
        if key in record:
            try:
                record[key] = cast(record[key])
            except ValueError:
                raise FmauditInputError(
                    f"{sheet_path}: row {i} (slide {record.get('slide_id')!r}): {key} {record[key]!r} is not "
                    f"{'an integer' if cast is int else 'a number'}"
                ) from None
    return record


def read_slide_sheet(path: str | Path, schema_path: str | Path = SLIDE_SHEET_SCHEMA) -> pd.DataFrame:
    """Read and validate a slide sheet; return columns ``SHEET_COLUMNS`` (``label`` Int64, ``mpp`` Float64).

    Each row is checked against the JSON schema; errors name the sheet, the row (0-based, header excluded),
    the slide and the key. Slide ids must be unique and ``label_name`` needs a ``label``.

    Parameters
    ----------
    path : str or Path
        The tab-separated slide sheet.
    schema_path : str or Path
        JSON schema each row is checked against (default ``resources/schemas/slides.schema.yaml``).

    Returns
    -------
    DataFrame
        One row per slide, the columns of ``SHEET_COLUMNS`` (``slide_id``, ``path``, ``group``, ``domain``,
        ``label_name`` as string, ``label`` Int64, ``mpp`` Float64; NA where the cell is empty).

    Raises
    ------
    FileNotFoundError
        When the sheet does not exist.
    FmauditInputError
        On unknown columns, no rows, a cell that does not parse or violates the schema, a ``label_name`` without
        ``label``, or a duplicated ``slide_id``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: slide sheet not found")
    # all cells as text: ids such as "001" must not become numbers
    raw = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    raw.columns = [str(c).strip() for c in raw.columns]
    unknown = [c for c in raw.columns if c not in SHEET_COLUMNS]
    if unknown:
        raise FmauditInputError(f"{path}: unknown column(s) {unknown}; allowed: {list(SHEET_COLUMNS)}")
    if len(raw) == 0:
        raise FmauditInputError(f"{path}: the slide sheet has no rows")

    schema = load_yaml(schema_path)
    records = []
    for i, row in enumerate(raw.to_dict("records")):
        record = _typed_record(path, i, row)
        for key, message in schema_violations(record, schema):
            where = f"key {key[0]!r}: " if key else ""
            raise FmauditInputError(f"{path}: row {i} (slide {record.get('slide_id')!r}): {where}{message}")
        if "label_name" in record and "label" not in record:
            raise FmauditInputError(f"{path}: row {i} (slide {record['slide_id']!r}) has a label_name but no label")
        records.append(record)

    sheet = pd.DataFrame.from_records(records, columns=list(SHEET_COLUMNS))
    dup = sheet["slide_id"].duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise FmauditInputError(f"{path}: slide_id {sheet['slide_id'].iloc[i]!r} occurs more than once (row {i})")
    for col in ("slide_id", "path", "group", "domain", "label_name"):
        sheet[col] = sheet[col].astype("string")
    sheet["label"] = sheet["label"].astype("Int64")
    sheet["mpp"] = sheet["mpp"].astype("Float64")
    return sheet


def slide_tiles_manifest(
    dataset: str,
    sheet: pd.DataFrame,
    target_mpp: float,
    tile_size: int,
    min_tissue_fraction: float = 0.5,
    max_tiles_per_slide: int | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Manifest rows of every slide's tissue tiles (see :func:`fmaudit.slides.tile_coordinates`).

    ``item_id`` is ``f"{slide_id}_x{x}_y{y}"``; each tile takes its slide's label, group and domain;
    ``split`` is ``unassigned`` (splits are made downstream, by group); ``tissue_fraction`` and ``mpp``
    (µm/px of the pixels read) are extra columns. Every slide samples with the same ``seed``.

    Parameters
    ----------
    dataset : str
        The data set's slug (the manifest's ``dataset`` column).
    sheet : DataFrame
        A slide sheet from :func:`read_slide_sheet`; a slide's ``mpp`` overrides the µm/px its file states.
    target_mpp : float
        µm/px of the tiles read.
    tile_size : int
        Tile side in pixels at ``target_mpp``.
    min_tissue_fraction : float
        Share of tissue a tile needs, in [0, 1] (default 0.5).
    max_tiles_per_slide : int, optional
        Tiles kept per slide at most, a seeded sample (None: all).
    seed : int
        Seed of the per-slide sample (default 0).

    Returns
    -------
    DataFrame
        One row per tile: ``dataset``, ``item_id``, ``source`` (the slide path as written), ``x``, ``y``, ``level``,
        ``size``, ``label`` (Int64), ``label_name``, ``group``, ``domain``, ``split`` (``unassigned``),
        ``tissue_fraction``, ``mpp``.

    Raises
    ------
    FmauditInputError
        As :func:`fmaudit.slides.tile_coordinates` does for a slide it cannot read or that has no tissue.
    """
    parts = []
    for slide in sheet.itertuples(index=False):
        mpp_override = None if pd.isna(slide.mpp) else float(slide.mpp)
        tiles = tile_coordinates(
            slide.path,
            target_mpp=target_mpp,
            tile_size=tile_size,
            min_tissue_fraction=min_tissue_fraction,
            max_tiles=max_tiles_per_slide,
            seed=seed,
            mpp_override=mpp_override,
        )
        tiles.insert(0, "item_id", [f"{slide.slide_id}_x{x}_y{y}" for x, y in zip(tiles["x"], tiles["y"])])
        tiles["dataset"] = dataset
        tiles["source"] = str(slide.path)
        tiles["label"] = slide.label
        tiles["label_name"] = slide.label_name
        tiles["group"] = str(slide.group)
        tiles["domain"] = str(slide.domain)
        tiles["split"] = "unassigned"
        parts.append(tiles)
    manifest = pd.concat(parts, ignore_index=True)
    front = ["dataset", "item_id", "source", "x", "y", "level", "size", "label", "label_name", "group", "domain",
             "split"]
    manifest["label"] = manifest["label"].astype("Int64")
    manifest["label_name"] = manifest["label_name"].astype("string")
    return manifest[front + ["tissue_fraction", "mpp"]]


@register_preparer("slide_tiles")
def prepare_slide_tiles(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Preparer: ``params`` are ``slides`` (sheet path, required), ``target_mpp``, ``tile_size``,
    ``min_tissue_fraction``, ``max_tiles_per_slide`` and ``seed`` (defaults in ``SLIDE_TILES_DEFAULTS``).
    ``data_root`` is not used: the sheet lists the slides' paths.

    Parameters
    ----------
    dataset : str
        The data set's slug.
    data_root : Path
        Unused (the preparer signature is shared).
    params : dict
        ``slides`` (the sheet, required) and any of ``SLIDE_TILES_DEFAULTS``' keys.

    Returns
    -------
    DataFrame
        What :func:`slide_tiles_manifest` returns for the sheet.

    Raises
    ------
    FmauditInputError
        On an unknown parameter or a missing ``slides``, and as :func:`read_slide_sheet` and
        :func:`slide_tiles_manifest` do.
    """
    unknown = sorted(set(params) - set(SLIDE_TILES_DEFAULTS) - {"slides"})
    if unknown:
        raise FmauditInputError(
            f"dataset {dataset!r}: unknown slide_tiles parameter(s) {unknown}; "
            f"known: {sorted(SLIDE_TILES_DEFAULTS) + ['slides']}"
        )
    if not params.get("slides"):
        raise FmauditInputError(f"dataset {dataset!r}: slide_tiles needs parameter 'slides' (the slide sheet)")
    p = {**SLIDE_TILES_DEFAULTS, **params}
    sheet = read_slide_sheet(p["slides"])
    return slide_tiles_manifest(
        dataset,
        sheet,
        target_mpp=float(p["target_mpp"]),
        tile_size=int(p["tile_size"]),
        min_tissue_fraction=float(p["min_tissue_fraction"]),
        max_tiles_per_slide=None if p["max_tiles_per_slide"] is None else int(p["max_tiles_per_slide"]),
        seed=int(p["seed"]),
    )
