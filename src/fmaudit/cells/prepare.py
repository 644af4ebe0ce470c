"""Xenium sections -> cell manifests: the preparer of the cell-level analyses.

A *section* is one registered H&E-Xenium tissue section: a 10x Xenium output folder (``bundle``), the
provider's post-Xenium H&E image (``he_image``, pyramidal OME-TIFF), its image-alignment CSV
(``alignment``) and, optionally, a cell-type annotation table (``cell_types``: ``cell_id,label``). Its
**cell manifest** (one parquet per section, :func:`write_cell_manifest`) has exactly the columns
:data:`CELL_MANIFEST_COLUMNS`, one row per registered cell, in the order of the bundle's cells table:

- ``item_id`` ``"<section>/<cell_id>"``; ``cell_id``; ``section``; ``organ``
- ``slide``: path of the H&E image (level 0 is what ``he_x``/``he_y`` refer to); ``mpp``: its µm/px
- ``he_x``, ``he_y``: the nucleus centre in H&E level-0 pixels, x right, y down, continuous coordinates with
  the origin at the image's top-left corner (pixel (c, r) spans [c, c+1) × [r, r+1); its centre is
  (c + 0.5, r + 0.5)); see :mod:`fmaudit.cells.registration`
- ``centre_source``: ``nucleus_boundaries``, ``nucleus_zarr`` or ``cell_centroid`` (see
  :mod:`fmaudit.cells.xenium`)
- ``label_fine``, ``label_coarse``: Int64 class codes in the taxonomy tables' order (NA: unlabelled,
  excluded or unknown label); ``label_fine_name``, ``label_coarse_name``

The parquet's provenance (``fmaudit.io.read_provenance``) holds the hashes of the files read, the
alignment matrix, pixel sizes, the counts of cells dropped outside the image and by centre source, the
taxonomy, and the section's eligibility (``eligible``, ``exclusion_reason``): a section with fewer than two
valid classes in a taxonomy is written but marked ineligible, and the reason is logged.

The registry preparer ``xenium_cells`` (``resources/datasets.yaml``) prepares every section a data set
lists under ``params.sections`` and returns their cells as one data-set manifest (the generic manifest
columns plus the cell-manifest columns).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.cells.demo import write_demo_sections
from fmaudit.cells.qc import overlay_png, section_eligibility
from fmaudit.cells.registration import HEImage, he_image, read_alignment, register_cells
from fmaudit.cells.taxonomy import Taxonomy, attach_labels, load_taxonomy, read_cell_types
from fmaudit.cells.xenium import CENTRE_SOURCES, EXPERIMENT_FILE, read_bundle
from fmaudit.datasets import register_preparer
from fmaudit.io import FmauditInputError, provenance, sha256_file, write_table
from fmaudit.logs import setup_logging

log = logging.getLogger(__name__)

#: the columns of a cell manifest, in order, with their pandas dtypes
CELL_MANIFEST_COLUMNS: dict[str, str] = {
    "item_id": "string",
    "cell_id": "string",
    "section": "string",
    "organ": "string",
    "slide": "string",
    "mpp": "float64",
    "he_x": "float64",
    "he_y": "float64",
    "centre_source": "string",
    "label_fine": "Int64",
    "label_coarse": "Int64",
    "label_fine_name": "string",
    "label_coarse_name": "string",
}

#: keys of one section's specification (paths relative to data_root, or absolute)
SECTION_KEYS = ("organ", "bundle", "he_image", "alignment", "cell_types", "cell_id_column", "label_column", "he_mpp",
                "url")
XENIUM_CELLS_DEFAULTS: dict[str, Any] = {
    "sections": {},  # section id -> {organ, bundle, he_image, alignment, cell_types, ... (SECTION_KEYS)}
    "taxonomy_fine": None,  # annotation label -> fine class table (None: resources/cells/taxonomy_fine.tsv)
    "taxonomy_coarse": None,  # fine -> coarse class table (None: resources/cells/taxonomy_coarse.tsv)
    "min_cells_per_class": 10,  # a class is valid in a section with at least this many labelled cells
    # demo data sets only: keyword arguments of fmaudit.cells.demo.demo_section_specs; the sections are then
    # generated under data_root/<dataset>/ from the real CC0 slide instead of being listed under `sections`
    "demo": None,
}
TENX_DATASETS_URL = "https://www.10xgenomics.com/datasets"
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HE_SUFFIXES = ("he_image.ome.tif", "he_image.ome.tiff")
_ALIGNMENT_SUFFIX = "he_imagealignment.csv"
# the H&E image can be GBs: its identity is its size and the hash of its first 16 MiB
_IMAGE_HEAD_BYTES = 16 << 20


@dataclass(frozen=True)
class SectionSource:
    """Where one section's files are (absolute paths once resolved).

    Parameters
    ----------
    section : str
        The section id (a filename-safe slug).
    organ : str
        The section's organ (the unit of organ-balanced summaries and of LOOO).
    bundle : Path
        The Xenium output folder (with ``experiment.xenium``).
    he_image : Path or None, default None
        The post-Xenium H&E image (pyramidal OME-TIFF); required by :func:`prepare_section`.
    alignment : Path or None, default None
        The H&E image-alignment CSV (3 x 3 affine, H&E px -> Xenium px); required by :func:`prepare_section`.
    cell_types : Path or None, default None
        The cell-type annotation table (``cell_id,label``); None: the section's cells are unlabelled.
    cell_id_column, label_column : str, default "cell_id", "label"
        The annotation table's id and label columns.
    he_mpp : float or None, default None
        The H&E image's µm/px, overriding its metadata (:func:`fmaudit.cells.registration.he_image`).
    url : str or None, default None
        Where the section can be downloaded (named in the missing-data error).
    """

    section: str
    organ: str
    bundle: Path
    he_image: Path | None = None
    alignment: Path | None = None
    cell_types: Path | None = None
    cell_id_column: str = "cell_id"  # the annotation table's id and label columns
    label_column: str = "label"
    he_mpp: float | None = None
    url: str | None = None


@dataclass
class SectionResult:
    """A prepared section: its cell manifest, the raw labels, its provenance and eligibility.

    Parameters
    ----------
    manifest : DataFrame
        The cell manifest, columns :data:`CELL_MANIFEST_COLUMNS` with their dtypes, one row per registered cell.
    raw_labels : Series
        The annotation label of each manifest row (NA: unannotated), before the taxonomy maps it.
    provenance : dict
        What the manifest's parquet records: files and their hashes, alignment, pixel sizes, counts, taxonomy,
        class counts and eligibility (module doc).
    eligible : bool
        Whether the section has at least two valid classes in each taxonomy
        (:func:`fmaudit.cells.qc.section_eligibility`).
    exclusion_reason : str or None
        Why it is not eligible; None when it is.
    image : HEImage
        The H&E image's size, µm/px and reader.
    messages : list of str, default []
        The notes logged while preparing (cells dropped, unknown labels, exclusion).
    """

    manifest: pd.DataFrame
    raw_labels: pd.Series  # the annotation label of each manifest row (NA: unannotated)
    provenance: dict[str, Any]
    eligible: bool
    exclusion_reason: str | None
    image: HEImage
    messages: list[str] = field(default_factory=list)


def _discover(folder_candidates: list[Path], suffixes: tuple[str, ...], what: str, where: str) -> Path:
    found: list[Path] = []
    for folder in folder_candidates:
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(suffixes))
        if found:
            break
    if len(found) == 1:
        return found[0]
    if not found:
        raise FmauditInputError(f"{where}: no {what} (*{suffixes[0]}) found in "
                                f"{', '.join(str(f) for f in folder_candidates)}; "
                                "give its path explicitly")
    raise FmauditInputError(f"{where}: several {what} candidates ({', '.join(p.name for p in found)}); "
                            "give one explicitly")


def resolve_section(section: str, spec: Mapping[str, Any], data_root: str | Path) -> SectionSource:
    """A section's specification (paths relative to ``data_root`` or absolute) as a :class:`SectionSource`.

    ``he_image`` and ``alignment`` default to the single ``*he_image.ome.tif`` and
    ``*he_imagealignment.csv`` in the bundle folder or beside it (where 10x's downloads put them).

    Parameters
    ----------
    section : str
        The section id; must be a filename-safe slug.
    spec : mapping
        The section's entry of ``params.sections``: keys of :data:`SECTION_KEYS`, ``organ`` and ``bundle`` required.
    data_root : str or Path
        The folder relative paths are resolved against.

    Returns
    -------
    SectionSource
        The section with absolute paths (``he_image`` / ``alignment`` None when the bundle folder does not exist
        and they were not given).

    Raises
    ------
    FmauditInputError
        When the id is not a slug, a key is unknown, ``organ`` or ``bundle`` is missing, or no or several H&E images
        or alignment files are found.
    """
    where = f"section {section!r}"
    if not _SLUG.match(str(section)):
        raise FmauditInputError(f"{where}: section ids must be filename-safe slugs")
    unknown = sorted(set(spec) - set(SECTION_KEYS))
    if unknown:
        raise FmauditInputError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(SECTION_KEYS)})")
    for key in ("organ", "bundle"):
        if not spec.get(key):
            raise FmauditInputError(f"{where}: {key!r} is required")
    root = Path(data_root)

    def path(key: str) -> Path | None:
        value = spec.get(key)
        return None if value in (None, "") else (root / str(value) if not Path(str(value)).is_absolute()
                                                 else Path(str(value)))

    bundle = path("bundle")
    assert bundle is not None
    he_path, alignment = path("he_image"), path("alignment")
    folders = [bundle, bundle.parent]
    if bundle.is_dir():
        if he_path is None:
            he_path = _discover(folders, _HE_SUFFIXES, "H&E image", where)
        if alignment is None:
            alignment = _discover(folders, (_ALIGNMENT_SUFFIX,), "image-alignment file", where)
    mpp = spec.get("he_mpp")
    return SectionSource(section=str(section), organ=str(spec["organ"]), bundle=bundle, he_image=he_path,
                         alignment=alignment, cell_types=path("cell_types"),
                         cell_id_column=str(spec.get("cell_id_column") or "cell_id"),
                         label_column=str(spec.get("label_column") or "label"),
                         he_mpp=float(mpp) if mpp is not None else None, url=spec.get("url"))


def _file_record(path: Path, whole: bool = True) -> dict[str, Any]:
    rec: dict[str, Any] = {"path": str(path), "size": path.stat().st_size}
    if whole:
        rec["sha256"] = sha256_file(path)
    else:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            h.update(fh.read(_IMAGE_HEAD_BYTES))
        rec["sha256_first_16MiB"] = h.hexdigest()
    return rec


def prepare_section(source: SectionSource, taxonomy: Taxonomy | None = None, min_cells_per_class: int = 10,
                    qc_png: str | Path | None = None, qc_regions: int = 20, qc_seed: int = 0,
                    hash_files: bool = True) -> SectionResult:
    """Read, register and label one section; returns its cell manifest with provenance and eligibility.

    Cells outside the H&E image are dropped (and counted); labels the taxonomy does not list are left unlabelled;
    a section with fewer than two valid classes in a taxonomy is still returned, marked ineligible.

    Parameters
    ----------
    source : SectionSource
        Where the section's files are (:func:`resolve_section`).
    taxonomy : Taxonomy, optional
        The label -> fine -> coarse taxonomy; by default the project's tables (:func:`load_taxonomy`).
    min_cells_per_class : int, default 10
        A class is valid in the section with at least this many labelled cells.
    qc_png : str or Path, optional
        Where to write the QC overlay (:func:`fmaudit.cells.qc.overlay_png`); None writes none.
    qc_regions : int, default 20
        Number of H&E regions in the overlay.
    qc_seed : int, default 0
        Random seed of the overlay's choice of regions.
    hash_files : bool, default True
        Hash the bundle's files, the alignment and the annotation table whole (sha256); False records their sizes
        and the hash of their first 16 MiB, as for the H&E image always.

    Returns
    -------
    SectionResult
        The manifest, raw labels, provenance, eligibility, the H&E image's description and the notes.

    Raises
    ------
    FmauditInputError
        When the H&E image or alignment is not given, or a file of the section is missing or malformed (the
        bundle, alignment, image or annotation table; the readers name the file).
    """
    where = f"section {source.section!r}"
    taxonomy = taxonomy or load_taxonomy()
    messages: list[str] = []

    def note(msg: str, *args: Any, level: int = logging.INFO) -> None:
        text = msg % args if args else msg
        messages.append(text)
        log.log(level, "%s: %s", where, text)

    if source.he_image is None or source.alignment is None:
        raise FmauditInputError(f"{where}: the H&E image and the alignment file are required")
    bundle = read_bundle(source.bundle)
    matrix = read_alignment(source.alignment)
    image = he_image(source.he_image, mpp_override=source.he_mpp, matrix=matrix, pixel_size=bundle.pixel_size)
    cells = bundle.cells.copy()
    if source.cell_types is not None:
        annotations = read_cell_types(source.cell_types, source.cell_id_column, source.label_column)
        cells["label"] = attach_labels(cells["cell_id"], annotations, where=str(source.cell_types)).to_numpy()
    else:
        cells["label"] = pd.NA
    reg = register_cells(cells, matrix, bundle.pixel_size, image.width, image.height, where=where)
    if reg.n_outside:
        note("%d of %d cells fall outside the %dx%d-px H&E image and are dropped", reg.n_outside, reg.n_total,
             image.width, image.height, level=logging.WARNING)
    kept = reg.cells
    mapped = taxonomy.map_labels(kept["label"].reset_index(drop=True))
    unknown = taxonomy.unknown_labels(kept["label"])
    if unknown:
        note("%d cells carry label(s) the taxonomy does not list, left unlabelled: %s", sum(unknown.values()),
             unknown, level=logging.WARNING)
    n = len(kept)
    manifest = pd.DataFrame({
        "item_id": [f"{source.section}/{c}" for c in kept["cell_id"]],
        "cell_id": kept["cell_id"].to_numpy(),
        "section": [source.section] * n,
        "organ": [source.organ] * n,
        "slide": [str(source.he_image)] * n,
        "mpp": np.full(n, image.mpp, dtype=np.float64),
        "he_x": kept["he_x"].to_numpy(np.float64),
        "he_y": kept["he_y"].to_numpy(np.float64),
        "centre_source": kept["centre_source"].to_numpy(),
        **{c: mapped[c].to_numpy() for c in ("label_fine", "label_coarse", "label_fine_name", "label_coarse_name")},
    })
    manifest = manifest.astype(CELL_MANIFEST_COLUMNS)
    eligible, reason, class_counts = section_eligibility(manifest, min_cells_per_class)
    if not eligible:
        note("excluded from the cell-level analyses: %s", reason, level=logging.WARNING)
    by_source = manifest["centre_source"].value_counts()
    n_annotated = int(kept["label"].notna().sum())
    counts = {
        "cells_in_bundle": reg.n_total,
        "cells_outside_image_dropped": reg.n_outside,
        "cells_registered": n,
        "centre_source": {s: int(by_source.get(s, 0)) for s in CENTRE_SOURCES},
        "annotated": n_annotated,
        "labelled_fine": int(manifest["label_fine"].notna().sum()),
        "labelled_coarse": int(manifest["label_coarse"].notna().sum()),
        "unknown_labels": unknown,
    }
    note("%d cells registered (%d dropped outside the image); centres from %s; %d annotated, %d with a fine class",
         n, reg.n_outside, counts["centre_source"], n_annotated, counts["labelled_fine"])
    files = {k: _file_record(p, hash_files) for k, p in bundle.files.items()}
    files["alignment"] = _file_record(source.alignment, hash_files)
    files["he_image"] = _file_record(source.he_image, whole=False)
    if source.cell_types is not None:
        files["cell_types"] = _file_record(source.cell_types, hash_files)
    prov = provenance(
        section=source.section, organ=source.organ, bundle=str(source.bundle), url=source.url, files=files,
        pixel_size_um=bundle.pixel_size, analysis_sw_version=bundle.analysis_sw_version,
        alignment_matrix=matrix.tolist(),
        alignment_convention="H&E level-0 px -> Xenium morphology px; cells: he = inv(A) @ [um / pixel_size, 1]",
        he_image={"width": image.width, "height": image.height, "mpp": image.mpp, "mpp_source": image.mpp_source,
                  "metadata_mpp": image.metadata_mpp, "alignment_mpp": image.alignment_mpp, "reader": image.reader},
        he_coordinates="level-0 px, x right, y down, origin at the image's top-left corner; "
                       "pixel (c, r) spans [c, c+1)",
        counts=counts, outside_cell_ids=reg.outside_ids[:100],
        taxonomy={**taxonomy.sources, "fine_classes": taxonomy.fine_classes, "coarse_classes": taxonomy.coarse_classes},
        class_counts=class_counts, min_cells_per_class=int(min_cells_per_class),
        eligible=eligible, exclusion_reason=reason,
    )
    if qc_png is not None:
        overlay_png(manifest, source.he_image, qc_png, mpp=image.mpp, reader=image.reader, n_regions=qc_regions,
                    seed=qc_seed, coarse_classes=taxonomy.coarse_classes,
                    title=f"{source.section} ({source.organ}): {n} cells, colour = coarse class")
        prov["qc_overlay"] = str(qc_png)
    return SectionResult(manifest=manifest, raw_labels=kept["label"].reset_index(drop=True), provenance=prov,
                         eligible=eligible, exclusion_reason=reason, image=image, messages=messages)


def write_cell_manifest(path: str | Path, result: SectionResult) -> None:
    """Write a section's cell manifest (parquet, atomically) with its provenance.

    Parameters
    ----------
    path : str or Path
        The parquet to write.
    result : SectionResult
        The prepared section (:func:`prepare_section`).
    """
    write_table(path, result.manifest, provenance=result.provenance)


def registered_cells_table(result: SectionResult, with_label: bool) -> pd.DataFrame:
    """The ``fmaudit cells register`` output: ``cell_id``, ``he_x``, ``he_y``, ``centre_source`` [, ``label``].

    Parameters
    ----------
    result : SectionResult
        The prepared section.
    with_label : bool
        Add the raw annotation ``label`` column (string, NA when unannotated).

    Returns
    -------
    DataFrame
        One row per registered cell, in manifest order; ``he_x``, ``he_y`` in H&E level-0 pixels.
    """
    out = result.manifest[["cell_id", "he_x", "he_y", "centre_source"]].copy()
    if with_label:
        out["label"] = pd.array(result.raw_labels.to_numpy(dtype=object), dtype="string")
    return out


def register_section_step(section: str, spec: Mapping[str, Any], data_root: str | Path, out: str | Path,
                          qc_png: str | Path | None = None, taxonomy_fine: str | Path | None = None,
                          taxonomy_coarse: str | Path | None = None, min_cells_per_class: int = 10,
                          log_path: str | Path | None = None) -> SectionResult:
    """The workflow's per-section step: prepare one section and write its cell manifest (and QC overlay).

    Parameters
    ----------
    section : str
        The section id.
    spec : mapping
        The section's entry of the data set's ``params.sections`` (:func:`resolve_section`).
    data_root : str or Path
        The folder relative paths are resolved against.
    out : str or Path
        The cell manifest parquet to write.
    qc_png : str or Path, optional
        Where to write the QC overlay; None writes none.
    taxonomy_fine, taxonomy_coarse : str or Path, optional
        The taxonomy tables (label -> fine, fine -> coarse); None: the project's defaults.
    min_cells_per_class : int, default 10
        A class is valid in the section with at least this many labelled cells.
    log_path : str or Path, optional
        The step's log file (:func:`fmaudit.logs.setup_logging`).

    Returns
    -------
    SectionResult
        The prepared section, as written.

    Raises
    ------
    FmauditInputError
        As :func:`resolve_section` and :func:`prepare_section`.
    """
    logger = setup_logging(log_path)
    source = resolve_section(section, spec, data_root)
    result = prepare_section(source, load_taxonomy(taxonomy_fine, taxonomy_coarse), min_cells_per_class, qc_png=qc_png)
    write_cell_manifest(out, result)
    logger.info("section %s: wrote %s (%d cells, eligible=%s%s)", section, out, len(result.manifest), result.eligible,
                f": {result.exclusion_reason}" if result.exclusion_reason else "")
    return result


# --------------------------------------------------------------------------- the registry preparer


def _missing(dataset: str, source: SectionSource, path: Path, data_root: Path) -> FmauditInputError:
    # imported here: scikit-learn and scipy load only when this runs
    from fmaudit.datasets.public._common import Source, missing_data_error

    how = ("download the section's Xenium output bundle (*_outs.zip) and unzip it so that "
           f"{source.bundle.relative_to(data_root) if source.bundle.is_relative_to(data_root) else source.bundle}/"
           "experiment.xenium exists, with the post-Xenium H&E image (*_he_image.ome.tif) and its alignment "
           "(*_he_imagealignment.csv) beside it or inside it")
    return missing_data_error(dataset, Source(f"Xenium section {source.section}", source.url or TENX_DATASETS_URL, how),
                              path, data_root)


@register_preparer("xenium_cells")
def prepare_xenium_cells(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Every section listed under ``params.sections``, registered and labelled, as one data-set manifest.

    The registry preparer ``xenium_cells``. With ``params.demo`` the sections are first generated under
    ``data_root/<dataset>/`` (:func:`fmaudit.cells.demo.write_demo_sections`) instead of being listed.

    Parameters
    ----------
    dataset : str
        The data set's name (its registry key).
    data_root : Path
        The data folder relative section paths are resolved against.
    params : dict
        The data set's ``params`` (:data:`XENIUM_CELLS_DEFAULTS`: ``sections``, ``taxonomy_fine``,
        ``taxonomy_coarse``, ``min_cells_per_class``, ``demo``).

    Returns
    -------
    DataFrame
        One row per registered cell of every section: the generic manifest columns (``dataset``, ``item_id``,
        ``source`` = the H&E image, ``label`` = the fine class, ``label_name``, ``group`` = the section, ``domain`` =
        the organ, ``split`` = ``unassigned``) followed by the cell-manifest columns; ``attrs["provenance"]`` holds
        each section's counts, eligibility and H&E description.

    Raises
    ------
    FmauditInputError
        When no section is listed, a section's entry is not a mapping, a bundle is missing (with how to download
        it), or a section cannot be prepared.
    """
    # imported here: scikit-learn and scipy load only when this runs
    from fmaudit.datasets.public._common import resolve_params

    p = resolve_params("xenium_cells", params, XENIUM_CELLS_DEFAULTS)
    sections = p["sections"] or {}
    if p["demo"]:
        sections = write_demo_sections(Path(data_root) / dataset, **dict(p["demo"]))
    if not isinstance(sections, Mapping) or not sections:
        raise FmauditInputError(f"{dataset}: params.sections lists no Xenium sections (section id -> organ, bundle, "
                                "he_image, alignment, cell_types)")
    data_root = Path(data_root)
    sources = []
    for section, spec in sections.items():
        if not isinstance(spec, Mapping):
            raise FmauditInputError(f"{dataset}: params.sections.{section} must be a mapping of "
                                    f"{', '.join(SECTION_KEYS)}")
        bundle = Path(str(spec.get("bundle") or ""))
        bundle = bundle if bundle.is_absolute() else data_root / bundle
        if not (bundle / EXPERIMENT_FILE).exists():
            src = SectionSource(section=str(section), organ=str(spec.get("organ")), bundle=bundle, url=spec.get("url"))
            raise _missing(dataset, src, bundle / EXPERIMENT_FILE, data_root)
        sources.append(resolve_section(section, spec, data_root))
    taxonomy = load_taxonomy(p["taxonomy_fine"], p["taxonomy_coarse"])
    frames, prov = [], {}
    for source in sources:
        result = prepare_section(source, taxonomy, int(p["min_cells_per_class"]))
        frames.append(result.manifest)
        prov[source.section] = {k: result.provenance[k] for k in ("counts", "eligible", "exclusion_reason", "he_image")}
    cells = pd.concat(frames, ignore_index=True)
    manifest = pd.DataFrame({
        "dataset": dataset, "item_id": cells["item_id"], "source": cells["slide"],
        "label": cells["label_fine"], "label_name": cells["label_fine_name"],
        "group": cells["section"], "domain": cells["organ"], "split": "unassigned",
    })
    manifest = pd.concat([manifest, cells.drop(columns=["item_id"])], axis=1)
    manifest.attrs["provenance"] = {"sections": prov}
    return manifest
