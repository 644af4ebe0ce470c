"""Registration of Xenium cells onto the post-Xenium H&E image with the provider's image-alignment file.

Convention (from 10x Genomics' knowledge-base article "How can I convert coordinates between H&E image and
Xenium data" and the reference reader spatialdata-io, ``readers/xenium.py``, ``xenium_aligned_image``):

- The alignment file (``*_he_imagealignment.csv``, exported by Xenium Explorer) is a 3×3 affine matrix
  ``A`` written as three comma-separated rows without a header; its last row is ``0, 0, 1``.
- ``A`` maps **H&E image pixel coordinates to Xenium morphology-image pixel coordinates**:
  ``[x_xe, y_xe, 1]ᵀ = A · [x_he, y_he, 1]ᵀ`` (10x: "can be used to convert coordinates in H&E image to
  Xenium data"; spatialdata-io attaches ``Affine(A, input_axes=(x, y), output_axes=(x, y))`` to the H&E
  image, mapping it into the ``global`` frame of the morphology image's pixels).
- Xenium coordinates in the cell tables are µm; morphology pixels are ``pixel_size`` µm
  (``experiment.xenium``, 0.2125), so ``x_xe = x_µm / pixel_size`` (spatialdata-io scales the µm
  elements by ``1 / pixel_size`` into the same frame).

Hence a cell at (x_µm, y_µm) lies at ``[x_he, y_he, 1]ᵀ = A⁻¹ · [x_µm / pixel_size, y_µm / pixel_size, 1]ᵀ``
in H&E level-0 pixels, x to the right and y down. The half-pixel convention of the file is not documented;
we read its pixel coordinates as continuous with the origin at the top-left corner of the image (10x's
example maps "the top-left corner [0, 0]"), so pixel (c, r) spans [c, c+1) × [r, r+1) and a point is inside
an image of W × H pixels when 0 <= x < W and 0 <= y < H.

The H&E µm/px: from the image's metadata (openslide's ``mpp-x``, TIFF resolution tags, or the OME-XML
``PhysicalSizeX``), else implied by the alignment, ``pixel_size · sqrt(|det A[:2, :2]|)``; both are
recorded, and a disagreement beyond 10 % is logged.
"""

from __future__ import annotations

import csv
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError

log = logging.getLogger(__name__)

# |det| of the linear part below this, or a condition number above _MAX_CONDITION, is a singular alignment
_MIN_ABS_DET = 1e-12
_MAX_CONDITION = 1e8
_LAST_ROW_TOL = 1e-6
_MPP_DISAGREEMENT = 0.10
_OME_UNITS_TO_UM = {"µm": 1.0, "um": 1.0, "micrometer": 1.0, "micron": 1.0, "nm": 1e-3, "mm": 1e3, "cm": 1e4,
                    "m": 1e6}


def read_alignment(path: str | Path) -> np.ndarray:
    """The 3×3 affine of a 10x image-alignment CSV (H&E pixels -> Xenium morphology pixels), validated.

    Parameters
    ----------
    path : str or Path
        The ``*_he_imagealignment.csv``: three comma-separated rows of three numbers, no header.

    Returns
    -------
    ndarray of shape (3, 3), float64
        ``A`` with ``[x_xe, y_xe, 1]ᵀ = A · [x_he, y_he, 1]ᵀ`` (module doc); last row ``0, 0, 1``.

    Raises
    ------
    FmauditInputError
        Naming the file, for: a missing file, a header or keypoints table (``fixedX,fixedY,alignmentX,alignmentY``
        is the landmark export, not the matrix), a shape other than 3×3, non-numeric or non-finite entries, a last
        row other than ``0,0,1``, and a singular or near-singular linear part.
    """
    path = Path(path)
    if not path.exists():
        raise FmauditInputError(f"{path}: image-alignment file not found")
    try:
        with open(path, newline="") as fh:
            rows = [[c.strip() for c in row] for row in csv.reader(fh) if any(c.strip() for c in row)]
    except UnicodeDecodeError as e:
        raise FmauditInputError(f"{path}: not a text CSV alignment file ({e})") from e
    if rows and any(re.search(r"[A-Za-z_]", c) and not _is_number(c) for c in rows[0]):
        kind = "a keypoints (landmark) table" if any("fixed" in c.lower() for c in rows[0]) else "a header"
        raise FmauditInputError(
            f"{path}: starts with {kind} ({','.join(rows[0])}); expected the 3x3 alignment matrix "
            "(*_he_imagealignment.csv: three rows of three numbers, no header)"
        )
    if len(rows) != 3 or any(len(r) != 3 for r in rows):
        shape = f"{len(rows)} rows of {sorted({len(r) for r in rows})} values" if rows else "no rows"
        raise FmauditInputError(f"{path}: expected a 3x3 alignment matrix, got {shape}")
    try:
        matrix = np.array([[float(c) for c in r] for r in rows], dtype=np.float64)
    except ValueError as e:
        raise FmauditInputError(f"{path}: non-numeric entry in the alignment matrix ({e})") from e
    if not np.isfinite(matrix).all():
        raise FmauditInputError(f"{path}: the alignment matrix has a non-finite entry")
    if not np.allclose(matrix[2], [0.0, 0.0, 1.0], atol=_LAST_ROW_TOL):
        raise FmauditInputError(f"{path}: last row of the alignment matrix is {matrix[2].tolist()}, expected [0, 0, 1] "
                                "(an affine, not a projective transform)")
    check_affine(matrix, str(path))
    return matrix


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_affine(matrix: np.ndarray, where: str = "alignment") -> None:
    """Raise if the linear part of a 3×3 affine is singular or so ill-conditioned that inverting it is unsafe.

    Parameters
    ----------
    matrix : ndarray of shape (3, 3)
        The alignment matrix.
    where : str, default "alignment"
        What the error calls it (the file or the section).

    Raises
    ------
    FmauditInputError
        When ``|det|`` of the 2×2 linear part is below 1e-12 or its condition number above 1e8.
    """
    linear = np.asarray(matrix, dtype=np.float64)[:2, :2]
    det = float(np.linalg.det(linear))
    cond = float(np.linalg.cond(linear)) if abs(det) > 0 else np.inf
    if abs(det) < _MIN_ABS_DET or not np.isfinite(cond) or cond > _MAX_CONDITION:
        raise FmauditInputError(
            f"{where}: the alignment matrix is singular (det of its linear part {det:.3g}, condition number "
            f"{cond:.3g}); it cannot map Xenium coordinates back onto the H&E image"
        )


def alignment_scale(matrix: np.ndarray) -> float:
    """Xenium morphology pixels per H&E pixel (the geometric mean of the affine's two scales).

    Parameters
    ----------
    matrix : ndarray of shape (3, 3)
        The alignment matrix.

    Returns
    -------
    float
        ``sqrt(|det A[:2, :2]|)``; times ``pixel_size`` it is the H&E µm/px the alignment implies.
    """
    return float(np.sqrt(abs(np.linalg.det(np.asarray(matrix, dtype=np.float64)[:2, :2]))))


def _points(x, y) -> tuple[np.ndarray, tuple[int, ...]]:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    shape = np.broadcast_shapes(x.shape, y.shape)
    return np.stack([np.broadcast_to(x, shape).ravel(), np.broadcast_to(y, shape).ravel()]), shape


def xenium_um_to_he_px(x_um, y_um, matrix: np.ndarray, pixel_size: float) -> tuple[np.ndarray, np.ndarray]:
    """H&E level-0 pixel coordinates (x right, y down) of Xenium µm coordinates: ``A⁻¹ · [µm / pixel_size, 1]``.

    Parameters
    ----------
    x_um, y_um : array-like
        Xenium coordinates in µm (broadcast against each other).
    matrix : ndarray of shape (3, 3)
        The alignment matrix (H&E px -> Xenium px).
    pixel_size : float
        µm per Xenium morphology pixel (``experiment.xenium``'s ``pixel_size``).

    Returns
    -------
    x_px, y_px : ndarray
        H&E level-0 pixel coordinates, continuous with the origin at the image's top-left corner, in the
        broadcast shape of the inputs.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    xe, shape = _points(x_um, y_um)
    he = np.linalg.solve(matrix[:2, :2], xe / float(pixel_size) - matrix[:2, 2:3])
    return he[0].reshape(shape), he[1].reshape(shape)


def he_px_to_xenium_um(x_px, y_px, matrix: np.ndarray, pixel_size: float) -> tuple[np.ndarray, np.ndarray]:
    """Xenium µm coordinates of H&E level-0 pixel coordinates: ``pixel_size · A · [x, y, 1]`` (the forward map).

    Parameters
    ----------
    x_px, y_px : array-like
        H&E level-0 pixel coordinates (broadcast against each other).
    matrix : ndarray of shape (3, 3)
        The alignment matrix (H&E px -> Xenium px).
    pixel_size : float
        µm per Xenium morphology pixel.

    Returns
    -------
    x_um, y_um : ndarray
        Xenium coordinates in µm, in the broadcast shape of the inputs.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    he, shape = _points(x_px, y_px)
    xe = (matrix[:2, :2] @ he + matrix[:2, 2:3]) * float(pixel_size)
    return xe[0].reshape(shape), xe[1].reshape(shape)


# --------------------------------------------------------------------------- the H&E image


@dataclass(frozen=True)
class HEImage:
    """Size, µm/px and reader of an H&E image's level 0.

    Parameters
    ----------
    path : Path
        The image.
    width, height : int
        Level-0 size in pixels.
    mpp : float
        The µm/px used (the first of override, metadata, alignment).
    mpp_source : str
        Where ``mpp`` came from: ``override``, ``openslide``, ``tiff_resolution``, ``ome_xml`` or ``alignment``.
    metadata_mpp : float or None
        What the file states (None if nothing).
    alignment_mpp : float or None
        The µm/px implied by the alignment and ``pixel_size`` (None without them).
    reader : str
        The library that reads the image: ``openslide`` or ``tifffile`` (when openslide cannot open it).
    """

    path: Path
    width: int
    height: int
    mpp: float
    mpp_source: str  # "override", "openslide", "tiff_resolution", "ome_xml" or "alignment"
    metadata_mpp: float | None  # what the file states (None if nothing)
    alignment_mpp: float | None  # implied by the alignment and pixel_size
    reader: str  # "openslide" or "tifffile"


def _ome_mpp(tf) -> float | None:
    meta = tf.ome_metadata
    if not meta:
        return None
    m = re.search(r'PhysicalSizeX="([0-9.eE+-]+)"', meta)
    if not m:
        return None
    unit = re.search(r'PhysicalSizeXUnit="([^"]+)"', meta)
    factor = _OME_UNITS_TO_UM.get(unit.group(1) if unit else "µm")
    try:
        value = float(m.group(1)) * factor if factor is not None else None
    except ValueError:
        return None
    return value if value is not None and np.isfinite(value) and value > 0 else None


def _tiff_resolution_mpp(page) -> float | None:
    tags = page.tags
    if "XResolution" not in tags or "ResolutionUnit" not in tags:
        return None
    num, den = tags["XResolution"].value
    unit = int(tags["ResolutionUnit"].value)
    per_unit = num / den if den else 0
    um = {2: 25400.0, 3: 10000.0}.get(unit)
    return um / per_unit if um and per_unit > 0 else None


def he_image(path: str | Path, mpp_override: float | None = None, matrix: np.ndarray | None = None,
             pixel_size: float | None = None) -> HEImage:
    """Level-0 size and µm/px of the H&E image, read with openslide (falling back to tifffile).

    µm/px: ``mpp_override`` if given, else the file's metadata, else the value implied by the alignment
    ``matrix`` and ``pixel_size``. A metadata value more than 10 % from the alignment's is logged.

    Parameters
    ----------
    path : str or Path
        The H&E image (pyramidal OME-TIFF or any openslide format).
    mpp_override : float, optional
        The µm/px to use whatever the file states (a data set's ``he_mpp``, ``--he-mpp``).
    matrix : ndarray of shape (3, 3), optional
        The alignment matrix, to imply and cross-check the µm/px.
    pixel_size : float, optional
        µm per Xenium morphology pixel; used with ``matrix``.

    Returns
    -------
    HEImage
        The image's size, µm/px (with its source and both candidate values) and reader.

    Raises
    ------
    FmauditInputError
        When the file is missing or unreadable by both libraries, the override is not a positive number, or no
        µm/px can be found (none in the metadata and no alignment given).
    """
    path = Path(path)
    if not path.exists():
        raise FmauditInputError(f"{path}: H&E image not found")
    width = height = None
    metadata_mpp: float | None = None
    meta_source = None
    reader = "openslide"
    import openslide

    try:
        slide = openslide.OpenSlide(str(path))
    except (openslide.OpenSlideError, openslide.OpenSlideUnsupportedFormatError):
        slide = None
    if slide is not None:
        with slide:
            width, height = slide.dimensions
            raw = slide.properties.get(openslide.PROPERTY_NAME_MPP_X)
            try:
                value = float(raw) if raw is not None else None
            except ValueError:
                value = None
            if value is not None and np.isfinite(value) and value > 0:
                metadata_mpp, meta_source = value, "openslide"
    if metadata_mpp is None or width is None:
        import tifffile

        try:
            with tifffile.TiffFile(str(path)) as tf:
                if width is None:
                    reader = "tifffile"
                    level0 = tf.series[0].levels[0]
                    axes = level0.axes
                    width, height = int(level0.shape[axes.index("X")]), int(level0.shape[axes.index("Y")])
                value = _ome_mpp(tf)
                if value is not None:
                    metadata_mpp, meta_source = value, "ome_xml"
                else:
                    value = _tiff_resolution_mpp(tf.series[0].levels[0].pages[0])
                    if value is not None:
                        metadata_mpp, meta_source = value, "tiff_resolution"
        except Exception as e:  # tifffile raises many kinds on corrupt files
            if width is None:
                raise FmauditInputError(f"{path}: unreadable H&E image, neither openslide nor tifffile "
                                        f"can open it ({e})") from e
    alignment_mpp = None
    if matrix is not None and pixel_size is not None:
        alignment_mpp = float(pixel_size) * alignment_scale(matrix)
    if mpp_override is not None:
        mpp, source = float(mpp_override), "override"
        if not np.isfinite(mpp) or mpp <= 0:
            raise FmauditInputError(f"{path}: the H&E µm/px override must be a positive number, got {mpp_override!r}")
    elif metadata_mpp is not None:
        mpp, source = metadata_mpp, meta_source
    elif alignment_mpp is not None:
        mpp, source = alignment_mpp, "alignment"
    else:
        raise FmauditInputError(f"{path}: the H&E image states no µm/px and no alignment was given to imply it; "
                                "give it explicitly (--he-mpp / he_mpp)")
    if metadata_mpp is not None and alignment_mpp is not None:
        rel = abs(metadata_mpp - alignment_mpp) / alignment_mpp
        if rel > _MPP_DISAGREEMENT:
            log.warning("%s: the image states %.4f µm/px but the alignment implies %.4f µm/px (%.0f%% apart); using %s",
                        path, metadata_mpp, alignment_mpp, 100 * rel, source)
    return HEImage(path=path, width=int(width), height=int(height), mpp=float(mpp), mpp_source=source,
                   metadata_mpp=metadata_mpp, alignment_mpp=alignment_mpp, reader=reader)


# --------------------------------------------------------------------------- registration


@dataclass
class Registration:
    """Cells mapped onto the H&E image: ``cells`` gains ``he_x``, ``he_y``; cells outside are dropped.

    Parameters
    ----------
    cells : DataFrame
        The cells inside the image, in their input order with a fresh index; ``he_x``, ``he_y`` in H&E level-0 pixels.
    n_total : int
        Cells given.
    n_outside : int
        Cells dropped outside the image.
    outside_ids : list of str
        The dropped cells' ``cell_id``.
    """

    cells: pd.DataFrame
    n_total: int
    n_outside: int
    outside_ids: list[str]


def register_cells(cells: pd.DataFrame, matrix: np.ndarray, pixel_size: float, width: int, height: int,
                   where: str = "section") -> Registration:
    """Map nucleus centres (``x_um``, ``y_um``) onto the H&E image and drop the cells that fall outside it.

    Cells outside ``[0, width) × [0, height)`` are counted, dropped and logged.

    Parameters
    ----------
    cells : DataFrame
        The cells with ``cell_id``, ``x_um`` and ``y_um`` (Xenium µm; :func:`fmaudit.cells.xenium.read_bundle`).
    matrix : ndarray of shape (3, 3)
        The alignment matrix (H&E px -> Xenium px).
    pixel_size : float
        µm per Xenium morphology pixel.
    width, height : int
        The H&E image's level-0 size in pixels.
    where : str, default "section"
        What the messages call the section.

    Returns
    -------
    Registration
        The cells inside, with ``he_x`` and ``he_y``, and the counts of those dropped.

    Raises
    ------
    FmauditInputError
        When the matrix is singular, or every cell is outside (with a hint when the inverted matrix would have
        fitted: an alignment file of the opposite direction).
    """
    check_affine(matrix, where)
    he_x, he_y = xenium_um_to_he_px(cells["x_um"].to_numpy(), cells["y_um"].to_numpy(), matrix, pixel_size)
    inside = (he_x >= 0) & (he_x < width) & (he_y >= 0) & (he_y < height)
    n_total, n_inside = len(cells), int(inside.sum())
    if n_inside == 0:
        hint = ""
        xe = np.stack([cells["x_um"].to_numpy(), cells["y_um"].to_numpy()]) / float(pixel_size)
        fx, fy = np.asarray(matrix)[:2, :2] @ xe + np.asarray(matrix)[:2, 2:3]
        if np.mean((fx >= 0) & (fx < width) & (fy >= 0) & (fy < height)) > 0.5:
            hint = ("; the matrix applied the other way round would fit: 10x's file maps H&E -> Xenium, "
                    "is this one inverted?")
        raise FmauditInputError(
            f"{where}: all {n_total} cells fall outside the {width}x{height}-px H&E image after alignment "
            f"(H&E x in [{np.nanmin(he_x):.0f}, {np.nanmax(he_x):.0f}], y in [{np.nanmin(he_y):.0f}, "
            f"{np.nanmax(he_y):.0f}]): wrong alignment file, image, or µm/pixel_size{hint}"
        )
    outside_ids = cells["cell_id"].to_numpy()[~inside].tolist()
    if outside_ids:
        log.warning("%s: %d of %d cells fall outside the H&E image and are dropped (e.g. %s)",
                    where, len(outside_ids), n_total, outside_ids[:5])
    out = cells.loc[inside].copy()
    out["he_x"] = he_x[inside].astype(np.float64)
    out["he_y"] = he_y[inside].astype(np.float64)
    return Registration(cells=out.reset_index(drop=True), n_total=n_total, n_outside=n_total - n_inside,
                        outside_ids=[str(i) for i in outside_ids])
