"""Reading a 10x Genomics Xenium output bundle ("outs" folder) as 10x ships it: where each cell's nucleus is.

What is read (file names as Xenium Onboard Analysis writes them; see 10x's "Understanding Xenium Outputs"):

- ``experiment.xenium``: JSON manifest; ``pixel_size`` is the µm size of a morphology-image pixel (0.2125)
  and ``analysis_sw_version`` the pipeline version.
- ``cells.parquet`` or ``cells.csv.gz``: one row per cell, ``cell_id``, ``x_centroid``, ``y_centroid`` in µm.
  Cell ids are integers before XOA 1.3 and strings such as ``aaabbbcc-1`` from 1.3 on; both are handled,
  and ids are strings from here on (``"17"``, ``"aaabbbcc-1"``).
- ``nucleus_boundaries.parquet`` or ``nucleus_boundaries.csv.gz``: polygon vertices ``vertex_x``,
  ``vertex_y`` in µm, rows of one polygon contiguous, with ``cell_id`` and (XOA >= 2.0) ``label_id`` naming
  the polygon.
- ``cells.zarr.zip``: the Xenium Explorer cell file; its ``cell_summary`` array (columns named by the
  array attribute ``column_names``: ``cell_centroid_x``, ``cell_centroid_y``, ``cell_area``,
  ``nucleus_centroid_x``, ``nucleus_centroid_y``, ``nucleus_area``, ``z_level`` [, ``nucleus_count``])
  holds a nucleus centroid per cell, in µm, rows in the order of the ``cell_id`` array. ``cell_id`` is an
  (N, 2) uint32 array of (prefix, dataset suffix) from XOA 1.3 on, turned into the string id by writing
  the prefix as 8 hex digits and shifting each digit 0-f to the letters a-p, then ``-<suffix>``; before 1.3
  it is a 1-D integer array. (Layout from 10x's "Overview of Xenium Zarr Output Files" and the reader of
  spatialdata-io, ``readers/xenium.py``.)

The nucleus centre of a cell (CellPath-Bench samples features at *nuclear* coordinates; ``x_centroid`` is the
whole cell's centroid) is taken, per cell, from the first source that has it:

1. ``nucleus_boundaries``: the area (shoelace) centroid of the cell's nucleus polygon. A cell with several
   nucleus polygons (multinucleate cells, XOA >= 2.0, told apart by ``label_id``) takes its largest one.
   Without ``label_id``, all vertices of a cell form one group; the shoelace sum over concatenated closed
   rings is the sum over the rings (the jumps between rings cancel), so such a group yields the area
   centroid of all of the cell's nuclei together.
2. ``nucleus_zarr``: the ``nucleus_centroid_x/y`` of ``cells.zarr.zip`` (finite, and with a positive
   ``nucleus_area`` where that column exists).
3. ``cell_centroid``: ``x_centroid``, ``y_centroid`` of the cells table.

Every cell of the cells table is kept; ``centre_source`` records which source gave its centre.
Errors (:class:`~fmaudit.io.FmauditInputError`) name the file and the key or row: a missing file of the
bundle, ``pixel_size`` missing or not positive, missing columns, duplicate or empty cell ids, non-finite
centroids.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError

log = logging.getLogger(__name__)

EXPERIMENT_FILE = "experiment.xenium"
CELLS_FILES = ("cells.parquet", "cells.csv.gz")
NUCLEUS_BOUNDARY_FILES = ("nucleus_boundaries.parquet", "nucleus_boundaries.csv.gz")
CELLS_ZARR_FILE = "cells.zarr.zip"

#: values of the ``centre_source`` column, in order of preference
CENTRE_SOURCES = ("nucleus_boundaries", "nucleus_zarr", "cell_centroid")

# a polygon smaller than this (µm²) is degenerate (a line or a point) and gives no centroid
_MIN_POLYGON_AREA_UM2 = 1e-6
_MICRON_UNITS = {"micron", "microns", "um", "µm", "micrometer", "micrometers", "micrometre", "micrometres"}


@dataclass
class XeniumCells:
    """The cells of one bundle with their nucleus centres in Xenium µm.

    Parameters
    ----------
    bundle : Path
        The Xenium output folder.
    pixel_size : float
        µm per morphology-image pixel (``experiment.xenium``).
    analysis_sw_version : str or None
        The pipeline version ``experiment.xenium`` names (None if absent).
    cells : DataFrame
        One row per cell of the cells table, in its order: ``cell_id`` (str), ``x_um``, ``y_um`` (the nucleus
        centre, float64), ``centre_source`` (one of :data:`CENTRE_SOURCES`), ``cell_x_um``, ``cell_y_um`` (the
        cell centroid of the table).
    files : dict of str to Path, default {}
        The files read: ``experiment``, ``cells`` and, when used, ``nucleus_boundaries`` and ``cells_zarr``.
    """

    bundle: Path
    pixel_size: float
    analysis_sw_version: str | None
    cells: pd.DataFrame
    files: dict[str, Path] = field(default_factory=dict)

    def counts_by_source(self) -> dict[str, int]:
        """How many cells took their centre from each source.

        Returns
        -------
        dict of str to int
            Each of :data:`CENTRE_SOURCES` (in preference order) -> its number of cells, zeros included.
        """
        counts = self.cells["centre_source"].value_counts()
        return {s: int(counts.get(s, 0)) for s in CENTRE_SOURCES}


# --------------------------------------------------------------------------- cell ids


def cell_id_strings(prefix: np.ndarray, suffix: np.ndarray) -> np.ndarray:
    """Xenium string cell ids from the (prefix, dataset suffix) uint32 pairs of ``cells.zarr.zip``.

    The prefix is written as 8 hexadecimal digits, most significant first, each digit 0..15 shifted to a
    letter a..p; the suffix follows after a hyphen: prefix 0x0000001b, suffix 1 -> ``"aaaaaabl-1"``.

    Parameters
    ----------
    prefix : ndarray of shape (n,)
        The ids' prefixes (uint32 values).
    suffix : ndarray of shape (n,)
        The dataset suffixes.

    Returns
    -------
    ndarray of shape (n,), object
        The string ids.

    Raises
    ------
    ValueError
        When ``prefix`` and ``suffix`` differ in shape.
    """
    prefix = np.asarray(prefix, dtype=np.uint64)
    suffix = np.asarray(suffix)
    if prefix.shape != suffix.shape:
        raise ValueError("cell id prefix and suffix differ in shape")
    shifts = np.arange(28, -1, -4, dtype=np.uint64)  # 8 nibbles, most significant first
    nibbles = ((prefix[:, None] >> shifts[None, :]) & np.uint64(15)).astype(np.uint8)
    letters = (nibbles + ord("a")).astype(np.uint8)
    heads = letters.view("S8").ravel().astype(str) if len(prefix) else np.array([], dtype=str)
    return np.array([f"{h}-{int(s)}" for h, s in zip(heads, suffix)], dtype=object)


def cell_id_prefix_suffix(cell_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`cell_id_strings`: (prefix, suffix) uint32 arrays of string ids ``'aaaaaabl-1'``.

    Parameters
    ----------
    cell_ids : iterable of str
        Xenium string ids (8 letters a-p, ``-``, a decimal suffix).

    Returns
    -------
    prefix, suffix : ndarray of shape (n,), uint32
        The ids' prefixes and suffixes, in order.

    Raises
    ------
    FmauditInputError
        When an id is not of that form.
    """
    prefixes, suffixes = [], []
    for cid in cell_ids:
        head, sep, tail = str(cid).partition("-")
        if not sep or len(head) != 8 or any(c < "a" or c > "p" for c in head) or not tail.isdigit():
            raise FmauditInputError(f"cell id {cid!r} is not of the Xenium form 'aaaaaaaa-1' "
                                    "(8 letters a-p, '-', suffix)")
        value = 0
        for c in head:
            value = value * 16 + (ord(c) - ord("a"))
        prefixes.append(value)
        suffixes.append(int(tail))
    return np.asarray(prefixes, dtype=np.uint32), np.asarray(suffixes, dtype=np.uint32)


def _id_strings(values: pd.Series | np.ndarray) -> np.ndarray:
    """Cell ids as Python strings: bytes are decoded, integers (old XOA) written in decimal."""
    arr = np.asarray(values, dtype=object)
    out = np.empty(len(arr), dtype=object)
    for i, v in enumerate(arr):
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        elif isinstance(v, (float, np.floating)):
            if not np.isfinite(v) or float(v) != int(v):
                out[i] = None
                continue
            v = int(v)
        out[i] = None if v is None or v is pd.NA else str(v)
    return out


# --------------------------------------------------------------------------- the files


def bundle_file(bundle: Path, *names: str, required: bool = True) -> Path | None:
    """The first of ``names`` present in the bundle folder; a missing required file raises naming all.

    Parameters
    ----------
    bundle : Path
        The Xenium output folder.
    *names : str
        Candidate file names, in order of preference (e.g. ``cells.parquet``, ``cells.csv.gz``).
    required : bool, default True
        Raise when none is present; otherwise return None (keyword-only).

    Returns
    -------
    Path or None
        The first present file; None when none is and ``required`` is False.

    Raises
    ------
    FmauditInputError
        When none is present and ``required`` is True.
    """
    for name in names:
        p = bundle / name
        if p.exists():
            return p
    if required:
        listed = " or ".join(names)
        raise FmauditInputError(f"{bundle}: the Xenium bundle has no {listed} (a 10x Xenium output folder holds it)")
    return None


def read_experiment(path: str | Path) -> dict[str, Any]:
    """``experiment.xenium`` as a dict; ``pixel_size`` (µm per morphology pixel) must be a positive number.

    Parameters
    ----------
    path : str or Path
        The bundle's ``experiment.xenium``.

    Returns
    -------
    dict
        The JSON manifest, ``pixel_size`` converted to float.

    Raises
    ------
    FmauditInputError
        When the file is missing, not a JSON object, or its ``pixel_size`` is missing, not a number or not positive.
    """
    path = Path(path)
    if not path.exists():
        raise FmauditInputError(f"{path}: missing file of the Xenium bundle (experiment.xenium)")
    try:
        spec = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FmauditInputError(f"{path}: not a JSON experiment manifest ({e})") from e
    if not isinstance(spec, dict):
        raise FmauditInputError(f"{path}: expected a JSON object, got {type(spec).__name__}")
    raw = spec.get("pixel_size")
    if raw is None:
        raise FmauditInputError(f"{path}: no 'pixel_size' (µm per morphology pixel); cannot convert µm and pixels")
    try:
        pixel_size = float(raw)
    except (TypeError, ValueError):
        raise FmauditInputError(f"{path}: 'pixel_size' {raw!r} is not a number") from None
    if not np.isfinite(pixel_size) or pixel_size <= 0:
        raise FmauditInputError(f"{path}: 'pixel_size' must be a positive number of µm, got {raw!r}")
    spec["pixel_size"] = pixel_size
    return spec


def _read_table(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    try:
        if path.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
            if columns is not None:
                missing = [c for c in columns if c not in names]
                if missing:
                    raise FmauditInputError(f"{path}: missing column(s) {missing}; has {names}")
            return pd.read_parquet(path, columns=columns)
        # ids stay text: an old-version integer id and a new string id must compare as strings alike
        df = pd.read_csv(path, dtype={"cell_id": str})
    except FmauditInputError:
        raise
    except Exception as e:  # pyarrow / gzip / csv errors of a corrupt file
        raise FmauditInputError(f"{path}: unreadable table ({type(e).__name__}: {e})") from e
    if columns is not None:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise FmauditInputError(f"{path}: missing column(s) {missing}; has {list(df.columns)}")
        df = df[columns]
    return df


def read_cells_table(path: str | Path) -> pd.DataFrame:
    """``cell_id`` (str), ``cell_x_um``, ``cell_y_um`` (float64) of ``cells.parquet`` / ``cells.csv.gz``.

    Parameters
    ----------
    path : str or Path
        The bundle's cells table (columns ``cell_id``, ``x_centroid``, ``y_centroid`` in µm).

    Returns
    -------
    DataFrame
        One row per cell in table order: ``cell_id`` (integer ids of old bundles written in decimal), ``cell_x_um``,
        ``cell_y_um``.

    Raises
    ------
    FmauditInputError
        Naming the file and row: unreadable, a missing column, no rows, an empty id, a missing or non-numeric
        centroid, an id that occurs twice.
    """
    path = Path(path)
    df = _read_table(path, ["cell_id", "x_centroid", "y_centroid"])
    if len(df) == 0:
        raise FmauditInputError(f"{path}: the cells table has no rows")
    ids = _id_strings(df["cell_id"])
    empty = np.array([i is None or i == "" for i in ids])
    if empty.any():
        raise FmauditInputError(f"{path}: row {int(np.flatnonzero(empty)[0])} has no cell_id")
    xy = df[["x_centroid", "y_centroid"]].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(xy).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FmauditInputError(f"{path}: row {i} (cell {ids[i]!r}) has a missing or non-numeric x_centroid/y_centroid")
    out = pd.DataFrame({"cell_id": ids, "cell_x_um": xy[:, 0], "cell_y_um": xy[:, 1]})
    dup = out["cell_id"].duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise FmauditInputError(f"{path}: cell_id {out['cell_id'].iloc[i]!r} occurs more than once (row {i})")
    return out


def polygon_centroids(group: np.ndarray, x: np.ndarray,
                      y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Area (shoelace) centroids of polygons given as contiguous runs of vertices.

    Each polygon is closed implicitly (last vertex back to the first; an explicitly repeated first vertex
    adds a zero-length edge).

    Parameters
    ----------
    group : ndarray of shape (n_vertices,)
        Each vertex's polygon label; vertices of one polygon are contiguous and in ring order.
    x, y : ndarray of shape (n_vertices,), float64
        The vertices' coordinates (µm).

    Returns
    -------
    starts : ndarray of shape (n_polygons,), int64
        Index of each polygon's first vertex.
    area : ndarray of shape (n_polygons,)
        Signed area (positive for counter-clockwise rings in x-right, y-up axes).
    cx, cy : ndarray of shape (n_polygons,)
        The area centroid; NaN where ``|area|`` is below ``1e-6`` (degenerate polygons).
    """
    n = len(group)
    if n == 0:
        empty = np.array([], dtype=np.float64)
        return np.array([], dtype=np.int64), empty, empty, empty
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    ends = np.r_[starts[1:], n]
    # the next vertex of every vertex, wrapping to the start of its own polygon
    nxt = np.arange(1, n + 1)
    nxt[ends - 1] = starts
    # shift to each polygon's first vertex: same area, and no precision lost to large µm offsets
    origin = np.repeat(starts, ends - starts)
    x0, y0 = x - x[origin], y - y[origin]
    cross = x0 * y0[nxt] - x0[nxt] * y0
    area2 = np.add.reduceat(cross, starts)  # twice the signed area
    cx = np.add.reduceat((x0 + x0[nxt]) * cross, starts)
    cy = np.add.reduceat((y0 + y0[nxt]) * cross, starts)
    area = area2 / 2.0
    ok = np.abs(area) > _MIN_POLYGON_AREA_UM2
    with np.errstate(invalid="ignore", divide="ignore"):
        gx = np.where(ok, cx / (3.0 * area2), np.nan) + x[starts]
        gy = np.where(ok, cy / (3.0 * area2), np.nan) + y[starts]
    return starts, area, gx, gy


def read_nucleus_centres(path: str | Path) -> pd.DataFrame:
    """Nucleus centre per cell from a nucleus-boundaries table: ``cell_id``, ``x_um``, ``y_um``, ``area_um2``.

    Polygons are the runs of rows with the same ``label_id`` (XOA >= 2.0) or, without it, the same
    ``cell_id``; a cell with several polygons keeps the largest. Rows of one polygon must be contiguous
    (as 10x writes them); if a cell's rows are interleaved with another's, they are regrouped in file
    order. Degenerate polygons (zero area) are dropped.

    Parameters
    ----------
    path : str or Path
        ``nucleus_boundaries.parquet`` or ``nucleus_boundaries.csv.gz`` (``cell_id``, ``vertex_x``, ``vertex_y`` in
        µm, optionally ``label_id``).

    Returns
    -------
    DataFrame
        One row per cell with a non-degenerate nucleus, sorted by ``cell_id``: ``cell_id`` (str), ``x_um``, ``y_um``
        (the area centroid) and ``area_um2``.

    Raises
    ------
    FmauditInputError
        Naming the file: unreadable, a missing column, or a missing or non-numeric vertex (with its row).
    """
    path = Path(path)
    if path.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
        except Exception as e:
            raise FmauditInputError(f"{path}: unreadable table ({type(e).__name__}: {e})") from e
    else:
        try:
            names = list(pd.read_csv(path, nrows=0).columns)
        except Exception as e:
            raise FmauditInputError(f"{path}: unreadable table ({type(e).__name__}: {e})") from e
    cols = ["cell_id", "vertex_x", "vertex_y"] + (["label_id"] if "label_id" in names else [])
    df = _read_table(path, cols)
    if len(df) == 0:
        return pd.DataFrame({"cell_id": pd.Series([], dtype=object), "x_um": [], "y_um": [], "area_um2": []})
    ids = _id_strings(df["cell_id"])
    x = pd.to_numeric(df["vertex_x"], errors="coerce").to_numpy(np.float64)
    y = pd.to_numeric(df["vertex_y"], errors="coerce").to_numpy(np.float64)
    bad = ~(np.isfinite(x) & np.isfinite(y))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FmauditInputError(f"{path}: row {i} (cell {ids[i]!r}) has a missing or non-numeric vertex_x/vertex_y")
    key_values = df["label_id"].to_numpy() if "label_id" in df.columns else ids
    codes, uniques = pd.factorize(pd.Series(key_values, dtype=object))
    runs = 1 + int(np.count_nonzero(codes[1:] != codes[:-1]))
    if runs != len(uniques):
        # interleaved polygons: regroup keeping each polygon's vertex order
        order = np.argsort(codes, kind="stable")
        codes, ids, x, y = codes[order], ids[order], x[order], y[order]
        log.warning("%s: rows of one polygon were not contiguous; regrouped them in file order", path)
    starts, area, gx, gy = polygon_centroids(codes, x, y)
    poly = pd.DataFrame({"cell_id": ids[starts], "x_um": gx, "y_um": gy, "area_um2": np.abs(area)})
    poly = poly[np.isfinite(poly["x_um"]) & np.isfinite(poly["y_um"])]
    # the largest nucleus of each cell
    poly = poly.sort_values(["cell_id", "area_um2"], ascending=[True, False], kind="stable")
    return poly.drop_duplicates("cell_id", keep="first").reset_index(drop=True)


def _open_zarr_group(path: Path):
    import zarr

    try:
        store = zarr.storage.ZipStore(str(path), mode="r")
        return zarr.open_group(store=store, mode="r"), store
    except Exception as e:  # zipfile / zarr metadata errors
        raise FmauditInputError(f"{path}: unreadable Xenium zarr file ({type(e).__name__}: {e})") from e


def read_zarr_nucleus_centres(path: str | Path) -> pd.DataFrame:
    """Nucleus centroids of ``cells.zarr.zip``: ``cell_id`` (str), ``x_um``, ``y_um`` for cells with a nucleus.

    Parameters
    ----------
    path : str or Path
        The bundle's ``cells.zarr.zip``.

    Returns
    -------
    DataFrame
        Columns ``cell_id``, ``x_um``, ``y_um``, in the zarr's row order, for the cells with a finite nucleus centroid
        (and a positive ``nucleus_area`` where that column exists).

    Raises
    ------
    FmauditInputError
        Naming the file: unreadable, spatial units other than microns, no ``cell_id`` or ``cell_summary`` array, no
        ``column_names`` or nucleus-centroid columns, a ``cell_id`` array of another shape, or ids and rows that
        disagree in number.
    """
    path = Path(path)
    group, store = _open_zarr_group(path)
    try:
        units = group.attrs.get("spatial_units")
        if units is not None and str(units).strip().lower() not in _MICRON_UNITS:
            raise FmauditInputError(f"{path}: spatial_units is {units!r}; expected microns")
        for key in ("cell_id", "cell_summary"):
            if key not in group:
                raise FmauditInputError(f"{path}: no {key!r} array in the Xenium cells zarr file")
        raw_ids = np.asarray(group["cell_id"][...])
        summary = group["cell_summary"]
        names = summary.attrs.get("column_names")
        values = np.asarray(summary[...], dtype=np.float64)
    finally:
        store.close()
    if names is None:
        raise FmauditInputError(f"{path}: cell_summary has no 'column_names' attribute; "
                                "cannot find the nucleus centroid")
    names = [str(n) for n in names]
    if values.ndim != 2 or values.shape[1] != len(names):
        raise FmauditInputError(f"{path}: cell_summary has shape {values.shape} but {len(names)} column_names")
    for col in ("nucleus_centroid_x", "nucleus_centroid_y"):
        if col not in names:
            raise FmauditInputError(f"{path}: cell_summary has no column {col!r} (has {names})")
    if raw_ids.ndim == 2 and raw_ids.shape[1] == 2:
        ids = cell_id_strings(raw_ids[:, 0], raw_ids[:, 1])
    elif raw_ids.ndim == 1:
        ids = _id_strings(raw_ids)  # before XOA 1.3: plain integer ids
    else:
        raise FmauditInputError(f"{path}: cell_id array has shape {raw_ids.shape}; expected (N,) or (N, 2)")
    if len(ids) != len(values):
        raise FmauditInputError(f"{path}: {len(ids)} cell ids but {len(values)} cell_summary rows")
    x = values[:, names.index("nucleus_centroid_x")]
    y = values[:, names.index("nucleus_centroid_y")]
    has = np.isfinite(x) & np.isfinite(y)
    if "nucleus_area" in names:
        has &= values[:, names.index("nucleus_area")] > 0
    return pd.DataFrame({"cell_id": ids[has], "x_um": x[has], "y_um": y[has]}).reset_index(drop=True)


def read_bundle(bundle: str | Path) -> XeniumCells:
    """Read a Xenium output folder: every cell of its cells table with its nucleus centre in µm.

    The centre comes from the first source that has it: nucleus boundaries, then ``cells.zarr.zip``, then the
    cell centroid (module doc); nucleus records naming no cell of the cells table are logged and ignored.

    Parameters
    ----------
    bundle : str or Path
        The Xenium output folder (``outs/``).

    Returns
    -------
    XeniumCells
        The cells, their centres and sources, the pixel size and the files read.

    Raises
    ------
    FmauditInputError
        When the folder or a required file (``experiment.xenium``, the cells table) is missing, or a file is
        malformed (naming it).
    """
    bundle = Path(bundle)
    if not bundle.is_dir():
        raise FmauditInputError(f"{bundle}: Xenium bundle folder not found")
    experiment = read_experiment(bundle / EXPERIMENT_FILE)
    files: dict[str, Path] = {"experiment": bundle / EXPERIMENT_FILE}
    cells_path = bundle_file(bundle, *CELLS_FILES)
    files["cells"] = cells_path
    cells = read_cells_table(cells_path)
    n = len(cells)
    x = np.full(n, np.nan)
    y = np.full(n, np.nan)
    source = np.full(n, "cell_centroid", dtype=object)
    index = pd.Index(cells["cell_id"])

    def fill(found: pd.DataFrame, name: str, path: Path) -> None:
        pos = index.get_indexer(found["cell_id"])
        unknown = pos < 0
        if unknown.any():
            log.warning("%s: %d nucleus record(s) name cells missing from %s (e.g. %r); ignored",
                        path, int(unknown.sum()), cells_path.name,
                        found["cell_id"].iloc[int(np.flatnonzero(unknown)[0])])
        pos = pos[~unknown]
        xs, ys = found["x_um"].to_numpy()[~unknown], found["y_um"].to_numpy()[~unknown]
        todo = np.isnan(x[pos])
        x[pos[todo]], y[pos[todo]] = xs[todo], ys[todo]
        source[pos[todo]] = name

    boundaries = bundle_file(bundle, *NUCLEUS_BOUNDARY_FILES, required=False)
    if boundaries is not None:
        files["nucleus_boundaries"] = boundaries
        fill(read_nucleus_centres(boundaries), "nucleus_boundaries", boundaries)
    zarr_path = bundle_file(bundle, CELLS_ZARR_FILE, required=False)
    if zarr_path is not None and np.isnan(x).any():
        files["cells_zarr"] = zarr_path
        fill(read_zarr_nucleus_centres(zarr_path), "nucleus_zarr", zarr_path)
    rest = np.isnan(x)
    x[rest] = cells["cell_x_um"].to_numpy()[rest]
    y[rest] = cells["cell_y_um"].to_numpy()[rest]
    table = pd.DataFrame({
        "cell_id": cells["cell_id"].astype(object), "x_um": x, "y_um": y, "centre_source": source,
        "cell_x_um": cells["cell_x_um"], "cell_y_um": cells["cell_y_um"],
    })
    result = XeniumCells(bundle=bundle, pixel_size=float(experiment["pixel_size"]),
                         analysis_sw_version=experiment.get("analysis_sw_version"), cells=table, files=files)
    log.info("%s: %d cells; nucleus centres from %s", bundle, n, result.counts_by_source())
    return result
