"""``cell_table``: cell coordinates and labels on the user's own whole-slide images, for the cell branch.

Cells from any source (a nucleus segmentation, an annotation tool, another spatial platform) enter the same
branch as registered Xenium cells (:mod:`fmaudit.cells.prepare`): each slide of the data set is one *section*
of ``cells.sections`` (its organ is the sheet's ``domain``), and its cell manifest has the columns
:data:`fmaudit.cells.prepare.CELL_MANIFEST_COLUMNS`, so feature extraction, checks and probes are unchanged.

Inputs (the ``params`` of a ``cell_table`` entry, ``resources/schemas/datasets.schema.yaml``):

- ``slides``: a sheet (:mod:`fmaudit.datasets.sheets`) with ``slide`` (the section id), ``path`` (relative to
  the sheet), ``domain`` (organ), optional ``patient`` and ``mpp`` (level-0 µm/px overriding the slide's
  metadata);
- ``cells``: a table with ``slide``, ``x``, ``y`` and ``label`` (a fine class name of ``classes``), optional
  ``cell_id`` (default: the cell's line); ``x``, ``y`` are the nucleus centre in level-0 pixels of the slide
  (x right, y down, origin at the top-left corner), or in µm with ``units: um`` (divided by the slide's µm/px);
- ``coarse``: fine class -> coarse class (the coarse taxonomy; the fine one when empty).

An empty label is an unlabelled cell (features are extracted for it; no probe uses it). A class outside
``classes``, a slide the sheet does not list, a coordinate that is not a number or lies outside its slide are
errors naming the file and line.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.cells.prepare import CELL_MANIFEST_COLUMNS, SectionResult
from fmaudit.cells.qc import overlay_png, section_eligibility
from fmaudit.cells.registration import he_image
from fmaudit.cells.taxonomy import Taxonomy
from fmaudit.config import dataset_params
from fmaudit.datasets import register_preparer
from fmaudit.datasets.sheets import LINE_COLUMN, SheetProblems, read_sheet, resolve_paths
from fmaudit.io import FmauditInputError, provenance, write_table
from fmaudit.registry import unknown_name_error

log = logging.getLogger(__name__)

__all__ = ["CENTRE_SOURCE", "cell_table_sections", "cell_table_taxonomy", "check_cell_table", "prepare_cell_table",
           "prepare_table_section", "read_cell_slides", "read_cell_table", "section_lists", "table_section"]

#: ``centre_source`` of every cell of a cell table: the user's coordinates, taken as they are.
CENTRE_SOURCE = "cell_table"
SLIDE_COLUMNS = ("slide", "path", "domain")
SLIDE_OPTIONAL = ("patient", "mpp")
CELL_COLUMNS = ("slide", "x", "y", "label")
CELL_OPTIONAL = ("cell_id",)
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def cell_table_taxonomy(params: Mapping[str, Any], where: str = "") -> Taxonomy:
    """The fine (``classes``) and coarse (``coarse``, or the fine classes again) taxonomy of a cell table.

    Parameters
    ----------
    params : mapping
        The entry's ``params``: ``classes`` (fine class names) and optionally ``coarse`` (fine -> coarse class).
    where : str, default ""
        A prefix for the error messages (e.g. ``"data set 'x': "``).

    Returns
    -------
    Taxonomy
        Fine classes in ``classes`` order, each its own annotation label; coarse classes in order of first use.

    Raises
    ------
    FmauditInputError
        When ``coarse`` is given but misses a fine class or names one not among ``classes``.
    """
    fine = list(params["classes"])
    coarse_of = dict(params.get("coarse") or {})
    if coarse_of:
        missing = [c for c in fine if c not in coarse_of]
        extra = [c for c in coarse_of if c not in fine]
        if missing or extra:
            raise FmauditInputError(f"{where}coarse: give a coarse class for every fine class"
                                    + (f"; missing: {missing}" if missing else "")
                                    + (f"; not among classes: {extra}" if extra else ""))
    else:
        coarse_of = {c: c for c in fine}
    return Taxonomy(fine_classes=fine, coarse_classes=list(dict.fromkeys(coarse_of[c] for c in fine)),
                    label_to_fine={c: c for c in fine}, fine_to_coarse=coarse_of,
                    sources={"fine_table": f"{where}classes", "coarse_table": f"{where}coarse"})


def read_cell_slides(params: Mapping[str, Any]) -> pd.DataFrame:
    """The slide sheet of a cell table: ``slide``, ``path`` (resolved), ``domain``, ``patient``, ``mpp``.

    Parameters
    ----------
    params : mapping
        The ``cell_table`` entry's ``params`` with the schema's defaults applied (``slides``, ``cells``, ``classes``,
        ``coarse``, ``units``, ``min_cells_per_class``; module doc).

    Returns
    -------
    DataFrame
        One row per slide: ``slide`` (the section id), ``path`` (resolved against the sheet's folder), ``domain``
        (organ), ``patient`` (NA when absent), ``mpp`` (float, NaN when not given) and the sheet's line column.

    Raises
    ------
    FmauditInputError
        Naming the sheet and every bad line: a missing column or value, a slide id that is not a filename-safe slug
        or is repeated, a path that does not exist, an ``mpp`` that is not a number.
    """
    sheet_path = str(params["slides"])
    sheet = read_sheet(sheet_path, SLIDE_COLUMNS, SLIDE_OPTIONAL, non_empty=SLIDE_COLUMNS, what="slide sheet")
    problems = SheetProblems(sheet_path, "slide sheet")
    paths = resolve_paths(sheet_path, sheet["path"].fillna(""))
    seen: dict[str, int] = {}
    for slide, path, line in zip(sheet["slide"], paths, sheet[LINE_COLUMN]):
        if pd.isna(slide):
            continue
        if not _SLUG.match(str(slide)):
            problems.add(int(line), f"slide {slide!r} is not a filename-safe id (letters, digits, '.', '_', '-'); it "
                                    "names the section")
        if slide in seen:
            problems.add(int(line), f"slide {slide!r} is also on line {seen[slide]}")
        seen.setdefault(str(slide), int(line))
        if not Path(path).is_file():
            problems.add(int(line), f"path {path} does not exist")
    mpp = pd.Series(np.nan, index=sheet.index)
    if "mpp" in sheet.columns:
        for i, (value, line) in enumerate(zip(sheet["mpp"], sheet[LINE_COLUMN])):
            if pd.isna(value):
                continue
            try:
                mpp.iloc[i] = float(value)
            except ValueError:
                problems.add(int(line), f"mpp {value!r} is not a number (level-0 µm/px)")
    problems.raise_if_any()
    return pd.DataFrame({"slide": sheet["slide"].astype(str), "path": paths, "domain": sheet["domain"].astype(str),
                         "patient": sheet["patient"] if "patient" in sheet.columns else pd.NA, "mpp": mpp,
                         LINE_COLUMN: sheet[LINE_COLUMN]})


def read_cell_table(dataset: str, params: Mapping[str, Any], slides: pd.DataFrame | None = None) -> pd.DataFrame:
    """The cell table: ``slide``, ``cell_id``, ``x``, ``y`` (float, in the table's ``units``), ``label`` (class
    name or NA) and the line; every bad line named (see the module doc).

    Parameters
    ----------
    dataset : str
        The data set's name (in the messages).
    params : mapping
        The ``cell_table`` entry's ``params`` with the schema's defaults applied (``slides``, ``cells``, ``classes``,
        ``coarse``, ``units``, ``min_cells_per_class``; module doc).
    slides : DataFrame, optional
        The slide sheet as :func:`read_cell_slides` returns it; read again when None.

    Returns
    -------
    DataFrame
        One row per cell in table order: ``slide``, ``cell_id`` (str; the cell's line when not given), ``x``, ``y``
        (float64, pixels or µm as ``units`` says), ``label`` and the table's line column.

    Raises
    ------
    FmauditInputError
        Naming the table and every bad line: a slide the sheet does not list, a coordinate that is not a number, a
        class outside ``classes``, a ``cell_id`` repeated on a slide.
    """
    slides = read_cell_slides(params) if slides is None else slides
    table_path = str(params["cells"])
    cells = read_sheet(table_path, CELL_COLUMNS, CELL_OPTIONAL, non_empty=("slide", "x", "y"), what="cell table")
    problems = SheetProblems(table_path, "cell table")
    known = set(slides["slide"])
    classes = list(params["classes"])
    for slide, line in zip(cells["slide"], cells[LINE_COLUMN]):
        if pd.notna(slide) and slide not in known:
            problems.add(int(line), str(unknown_name_error("slide", str(slide), sorted(known),
                                                           f"slide sheet {params['slides']}").args[0]))
    coords = {}
    for col in ("x", "y"):
        values = pd.to_numeric(cells[col], errors="coerce")
        for value, line in zip(cells.loc[values.isna() & cells[col].notna(), col],
                               cells.loc[values.isna() & cells[col].notna(), LINE_COLUMN]):
            problems.add(int(line), f"{col} {value!r} is not a number")
        coords[col] = values.to_numpy(np.float64)
    for name, line in zip(cells["label"], cells[LINE_COLUMN]):
        if pd.notna(name) and name not in classes:
            problems.add(int(line), str(unknown_name_error("class", str(name), classes).args[0])
                         + f" of data set {dataset!r}")
    ids = cells["cell_id"].fillna(cells[LINE_COLUMN].astype(str)) if "cell_id" in cells.columns else \
        cells[LINE_COLUMN].astype(str)
    dup = pd.DataFrame({"slide": cells["slide"], "cell_id": ids}).duplicated()
    for line in cells.loc[dup.to_numpy(), LINE_COLUMN]:
        problems.add(int(line), "cell_id occurs twice on this slide")
    problems.raise_if_any()
    return pd.DataFrame({"slide": cells["slide"].astype(str), "cell_id": ids.astype(str), "x": coords["x"],
                         "y": coords["y"], "label": cells["label"], LINE_COLUMN: cells[LINE_COLUMN]})


def cell_table_sections(params: Mapping[str, Any]) -> dict[str, str]:
    """Section (slide id) -> organ (its domain) of a cell table's slide sheet.

    Parameters
    ----------
    params : mapping
        The ``cell_table`` entry's ``params`` with the schema's defaults applied (``slides``, ``cells``, ``classes``,
        ``coarse``, ``units``, ``min_cells_per_class``; module doc).

    Returns
    -------
    dict of str to str
        Slide id -> domain, in sheet order.

    Raises
    ------
    FmauditInputError
        As :func:`read_cell_slides`.
    """
    slides = read_cell_slides(params)
    return dict(zip(slides["slide"], slides["domain"]))


def section_lists(config: Mapping[str, Any], registry: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Data set -> the section ids it lists, for every cell-level data set of the config (``xenium_cells``: its
    ``sections`` parameter; ``cell_table``: the slides of its sheet), as :func:`fmaudit.grid.cell_plan` takes them.

    Parameters
    ----------
    config : mapping
        The run config (its ``datasets`` and their parameter overrides).
    registry : mapping of str to mapping
        The data-set registry (``resources/datasets.yaml``): name -> entry with ``kind`` and ``params``.

    Returns
    -------
    dict of str to list of str
        Cell-level data set -> its section ids; other data sets are not listed.
    """
    out = {}
    for ds in config["datasets"]:
        kind = registry[ds].get("kind")
        if kind == "xenium_cells":
            out[ds] = list(dataset_params(config, registry, ds).get("sections") or {})
        elif kind == "cell_table":
            out[ds] = list(cell_table_sections(dataset_params(config, registry, ds)))
    return out


def check_cell_table(dataset: str, params: Mapping[str, Any], organ_of: Mapping[str, str] | None = None,
                     where: str = "") -> None:
    """The plan-stage checks of a cell table: both sheets, the taxonomy, and (with ``organ_of``, the config's
    ``cells.sections`` as section -> organ) that each listed section of this data set is under its domain.

    Parameters
    ----------
    dataset : str
        The data set's name.
    params : mapping
        The ``cell_table`` entry's ``params`` with the schema's defaults applied (``slides``, ``cells``, ``classes``,
        ``coarse``, ``units``, ``min_cells_per_class``; module doc).
    organ_of : mapping of str to str, optional
        The config's section -> organ; None skips the organ check.
    where : str, default ""
        A prefix for the taxonomy's error messages.

    Raises
    ------
    FmauditInputError
        As :func:`cell_table_taxonomy`, :func:`read_cell_slides` and :func:`read_cell_table`, or when a section is
        under another organ in the config than its domain in the sheet.
    """
    cell_table_taxonomy(params, where)
    slides = read_cell_slides(params)
    read_cell_table(dataset, params, slides)
    for slide, domain in zip(slides["slide"], slides["domain"]):
        if organ_of and slide in organ_of and organ_of[slide] != domain:
            raise FmauditInputError(f"config 'cells.sections': section {slide!r} is under organ {organ_of[slide]!r}, "
                                    f"but {params['slides']} gives its domain as {domain!r}")


def table_section(section: str, organ: str, dataset: str, params: Mapping[str, Any],
                  qc_png: str | Path | None = None) -> SectionResult:
    """One slide of a cell table as a section: its cells in level-0 pixels, labelled by the entry's taxonomy,
    with its eligibility, provenance and (``qc_png``) a QC overlay.

    Parameters
    ----------
    section : str
        The slide id (the section).
    organ : str
        Its organ in the config's ``cells.sections``; must equal the sheet's domain.
    dataset : str
        The data set's name.
    params : mapping
        The ``cell_table`` entry's ``params`` with the schema's defaults applied (``slides``, ``cells``, ``classes``,
        ``coarse``, ``units``, ``min_cells_per_class``; module doc).
    qc_png : str or Path, optional
        Where to write the QC overlay (:func:`fmaudit.cells.qc.overlay_png`); None writes none.

    Returns
    -------
    SectionResult
        The section's cell manifest (:data:`fmaudit.cells.prepare.CELL_MANIFEST_COLUMNS`, ``centre_source``
        ``cell_table``), raw labels, provenance, eligibility and H&E image.

    Raises
    ------
    FmauditInputError
        When the sheet does not list the slide, its domain is not ``organ``, the slide has no cell, a cell lies
        outside the slide's level 0, or a sheet is bad (:func:`read_cell_table`).
    """
    where = f"data set {dataset!r}, section {section!r}"
    taxonomy = cell_table_taxonomy(params, f"data set {dataset!r}: ")
    slides = read_cell_slides(params)
    row = slides[slides["slide"] == section]
    if row.empty:
        raise unknown_name_error("section", section, list(slides["slide"]), f"slide sheet {params['slides']}")
    row = row.iloc[0]
    if str(row["domain"]) != str(organ):
        raise FmauditInputError(f"{where}: cells.sections puts it under organ {organ!r}, {params['slides']} gives "
                                f"domain {row['domain']!r}")
    image = he_image(row["path"], mpp_override=None if pd.isna(row["mpp"]) else float(row["mpp"]))
    table = read_cell_table(dataset, params, slides)
    cells = table[table["slide"] == section].reset_index(drop=True)
    if cells.empty:
        raise FmauditInputError(f"{params['cells']}: no cells of slide {section!r}")
    scale = 1.0 / image.mpp if params["units"] == "um" else 1.0
    he_x, he_y = cells["x"].to_numpy() * scale, cells["y"].to_numpy() * scale
    outside = (he_x < 0) | (he_y < 0) | (he_x >= image.width) | (he_y >= image.height)
    if outside.any():
        lines = cells.loc[outside, LINE_COLUMN].head(5).tolist()
        raise FmauditInputError(
            f"{params['cells']}: {int(outside.sum())} cell(s) of slide {section!r} lie outside its "
            f"{image.width}x{image.height}-px level 0 (lines {', '.join(map(str, lines))}; units: {params['units']}"
            f"{f', {image.mpp:g} µm/px' if params['units'] == 'um' else ''})")
    mapped = taxonomy.map_labels(cells["label"])
    n = len(cells)
    manifest = pd.DataFrame({
        "item_id": [f"{section}/{c}" for c in cells["cell_id"]], "cell_id": cells["cell_id"].to_numpy(),
        "section": [section] * n, "organ": [organ] * n, "slide": [str(row["path"])] * n,
        "mpp": np.full(n, image.mpp), "he_x": he_x, "he_y": he_y, "centre_source": [CENTRE_SOURCE] * n,
        **{c: mapped[c].to_numpy() for c in ("label_fine", "label_coarse", "label_fine_name", "label_coarse_name")},
    }).astype(CELL_MANIFEST_COLUMNS)
    eligible, reason, class_counts = section_eligibility(manifest, int(params["min_cells_per_class"]))
    prov = provenance(
        section=section, organ=organ, dataset=dataset, slides=str(params["slides"]), cells=str(params["cells"]),
        units=params["units"], he_image={"width": image.width, "height": image.height, "mpp": image.mpp,
                                         "mpp_source": image.mpp_source, "reader": image.reader},
        he_coordinates="level-0 px, x right, y down, origin at the image's top-left corner",
        counts={"cells": n, "labelled_fine": int(manifest["label_fine"].notna().sum())},
        taxonomy={**taxonomy.sources, "fine_classes": taxonomy.fine_classes, "coarse_classes": taxonomy.coarse_classes},
        class_counts=class_counts, min_cells_per_class=int(params["min_cells_per_class"]), eligible=eligible,
        exclusion_reason=reason)
    if qc_png is not None:
        overlay_png(manifest, row["path"], qc_png, mpp=image.mpp, reader=image.reader, seed=0,
                    coarse_classes=taxonomy.coarse_classes,
                    title=f"{section} ({organ}): {n} cells, colour = coarse class")
        prov["qc_overlay"] = str(qc_png)
    return SectionResult(manifest=manifest, raw_labels=cells["label"], provenance=prov, eligible=eligible,
                         exclusion_reason=reason, image=image)


def prepare_table_section(section: str, organ: str, dataset: str, params: Mapping[str, Any], out: str | Path,
                          qc_png: str | Path | None = None) -> SectionResult:
    """The workflow's section step for a cell table: :func:`table_section`, written to ``out`` (parquet with
    provenance).

    Parameters
    ----------
    section : str
        The slide id (the section).
    organ : str
        Its organ in the config's ``cells.sections``.
    dataset : str
        The data set's name.
    params : mapping
        The ``cell_table`` entry's ``params`` with the schema's defaults applied (``slides``, ``cells``, ``classes``,
        ``coarse``, ``units``, ``min_cells_per_class``; module doc).
    out : str or Path
        The cell manifest parquet to write (atomically).
    qc_png : str or Path, optional
        Where to write the QC overlay; None writes none.

    Returns
    -------
    SectionResult
        The section, as written.

    Raises
    ------
    FmauditInputError
        As :func:`table_section`.
    """
    result = table_section(section, organ, dataset, params, qc_png)
    write_table(out, result.manifest, provenance=result.provenance)
    return result


@register_preparer("cell_table")
def prepare_cell_table(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Every slide of a cell table as one data-set manifest (the generic manifest columns plus the cell-manifest
    columns), as ``xenium_cells`` gives its sections; the cell branch prepares one section per job instead.

    Parameters
    ----------
    dataset : str
        The data set's name.
    data_root : Path
        The data folder; not used here (a sheet's ``path`` column is resolved against the sheet's own folder).
    params : dict
        The entry's ``params`` with the schema's defaults applied.

    Returns
    -------
    DataFrame
        One row per cell: ``dataset``, ``item_id``, ``source`` (the slide's path), ``label`` (fine class code),
        ``label_name``, ``group`` (the section), ``domain`` (the organ), ``split`` (``unassigned``), then the
        cell-manifest columns.

    Raises
    ------
    FmauditInputError
        As :func:`table_section`.
    """
    frames = [table_section(section, organ, dataset, params).manifest
              for section, organ in cell_table_sections(params).items()]
    cells = pd.concat(frames, ignore_index=True)
    manifest = pd.DataFrame({
        "dataset": dataset, "item_id": cells["item_id"], "source": cells["slide"], "label": cells["label_fine"],
        "label_name": cells["label_fine_name"], "group": cells["section"], "domain": cells["organ"],
        "split": "unassigned"})
    return pd.concat([manifest, cells.drop(columns=["item_id"])], axis=1)
