"""The demo sections: real Xenium bundles built from the real CC0 slide, with cell types planted at nuclei.

How a demo section is made (:func:`write_demo_section`):

1. **Nuclei.** A window of the real Aperio slide ``resources/data/CMU-1-Small-Region.svs`` (CC0, 0.499 µm/px)
   is read with openslide. Its hematoxylin channel comes from colour deconvolution with the Ruifrok-Johnston
   H&E(-DAB) stain matrix (optical density ``-log10(I / 255)`` projected on the inverse of the normalised
   stain vectors); it is smoothed (Gaussian, ``sigma_px``), thresholded by Otsu's method over stained pixels,
   opened, hole-filled and split into 4-connected components with ``scipy.ndimage``; components of
   ``min_area_um2``..``max_area_um2`` are the nuclei.
2. **Planted cell types.** Each nucleus draws a fine class from a section-specific class mix (independent of
   its position, so neighbours of different classes share a patch) and an annotation label of that class from
   the taxonomy table. Its pixels are then recoloured subtly in optical-density space by class
   (:data:`CLASS_SIGNATURES`: a hematoxylin gain and a small stain tint, applied through a soft mask of the
   nucleus): the class is readable at the nucleus, while a patch mean mixes several nuclei and the unchanged
   tissue around them. About 4 % of cells are annotated ``Unassigned`` and 3 % have no annotation row.
3. **A real bundle.** The H&E window is written as a pyramidal OME-TIFF (tiled, deflate, levels /1 /2 /4 in
   SubIFDs, ``PhysicalSizeX/Y`` in the OME-XML and the TIFF resolution tags; openslide reads its level 0 and
   µm/px, tifffile its pyramid). A non-trivial affine ``A`` (rotation, scale ``he_mpp / pixel_size`` with a
   small jitter, translation) maps H&E pixels to Xenium morphology pixels, as 10x's alignment files do; the
   nucleus polygons (``contourpy`` iso-lines at 0.5 of each nucleus mask) and centroids are mapped through it
   to Xenium µm. ``experiment.xenium`` (``pixel_size`` 0.2125), ``cells.parquet`` / ``cells.csv.gz``
   (the cell centroid is the nucleus centroid displaced by 0.5-2 µm, as a cell's centroid differs from its
   nucleus's), ``nucleus_boundaries.parquet`` / ``.csv.gz``, optionally ``cells.zarr.zip``, the alignment
   CSV and the annotation table ``<section>_cell_types.csv`` complete the section.

Layout of a section folder: ``<section>/outs/`` (the bundle), ``<section>/<section>_he_image.ome.tif``,
``<section>/<section>_he_imagealignment.csv``, ``<section>/<section>_cell_types.csv``; as 10x's downloads lie
after unzipping ``*_outs.zip`` into ``outs/``. ``truth.parquet`` beside them holds, per cell, the painted
nucleus centre in H&E pixels (the mask's pixel-centre centroid) and the planted class: the tests'
reference. Same seed, same pixels and tables.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from fmaudit.cells.registration import he_px_to_xenium_um
from fmaudit.cells.taxonomy import DEFAULT_FINE_TABLE, load_taxonomy, normalise_label
from fmaudit.cells.xenium import cell_id_prefix_suffix, cell_id_strings
from fmaudit.io import FmauditInputError, atomic_path, write_json, write_table, write_text

log = logging.getLogger(__name__)

DEMO_SLIDE = Path(__file__).resolve().parents[3] / "resources" / "data" / "CMU-1-Small-Region.svs"
XENIUM_PIXEL_SIZE = 0.2125  # µm per morphology pixel, as in every Xenium experiment.xenium

# Ruifrok & Johnston (2001) optical-density vectors of hematoxylin, eosin and DAB (RGB)
RUIFROK_JOHNSTON_HED = np.array([[0.65, 0.70, 0.29], [0.07, 0.99, 0.11], [0.27, 0.57, 0.78]])

#: per fine class (in taxonomy order): hematoxylin gain on the nucleus's optical density, and an added
#: optical-density tint (R, G, B). Subtle: an OD change of 0.15 is about a 30 % change of transmitted light
#: in one channel, on a nucleus a few µm wide.
CLASS_SIGNATURES: tuple[tuple[float, tuple[float, float, float]], ...] = (
    (1.40, (0.00, 0.00, 0.00)),   # tumour: dark
    (1.25, (0.15, 0.03, 0.00)),   # normal epithelium: dark, cyan-shifted
    (0.70, (0.00, 0.00, 0.00)),   # fibroblast: pale
    (0.70, (0.00, 0.15, 0.03)),   # endothelial: pale, magenta-shifted
    (0.75, (0.03, 0.00, 0.18)),   # smooth muscle / pericyte: pale, yellow-shifted
    (0.85, (0.15, 0.15, 0.00)),   # other stromal: pale, blue-shifted
    (1.05, (0.00, 0.18, 0.00)),   # T/NK: medium, magenta
    (1.05, (0.00, 0.00, 0.20)),   # B/plasma: medium, yellow-brown
    (1.05, (0.18, 0.00, 0.00)),   # myeloid: medium, cyan
)

@dataclass(frozen=True)
class DemoSectionSpec:
    """Everything that determines one demo section.

    Parameters
    ----------
    section : str
        The section's name (its folder name and the Xenium ``region_name``).
    organ : str
        The organ the section is given.
    x0, y0 : int
        Top-left corner of the section's window on the source slide, level-0 pixels.
    window_px : int
        Side of the window, level-0 pixels.
    seed : int
        Random seed of the section (class mix, planted classes, cell ids, alignment translation, annotations).
    rotation_deg : float
        Rotation of the H&E -> Xenium alignment, degrees counter-clockwise.
    scale_jitter : float
        Relative jitter of the alignment's scale around ``he_mpp / pixel_size`` (e.g. 0.02 = 2 % larger).
    max_cells : int, default 400
        At most this many nuclei (a random subset when more are found).
    bundle_format : {"v2", "v1"}, default "v2"
        ``v2``: string ids, parquet + csv.gz, ``label_id``; ``v1``: integer ids, csv.gz only.
    write_zarr : bool, default False
        Also write ``cells.zarr.zip``.
    min_area_um2, max_area_um2 : float, default 8.0, 120.0
        Nucleus area range in µm²; components outside it are not nuclei.
    sigma_px : float, default 1.0
        Gaussian smoothing of the hematoxylin channel before thresholding, pixels.
    """

    section: str
    organ: str
    x0: int  # window on the source slide, level-0 px
    y0: int
    window_px: int
    seed: int
    rotation_deg: float
    scale_jitter: float
    max_cells: int = 400
    bundle_format: str = "v2"  # "v2": string ids, parquet + csv.gz, label_id; "v1": integer ids, csv.gz only
    write_zarr: bool = False
    min_area_um2: float = 8.0
    max_area_um2: float = 120.0
    sigma_px: float = 1.0


# --------------------------------------------------------------------------- nuclei


def hematoxylin_density(rgb: np.ndarray) -> np.ndarray:
    """Hematoxylin concentration of every pixel by Ruifrok-Johnston colour deconvolution (float32, H × W).

    Parameters
    ----------
    rgb : ndarray of shape (H, W, 3) or (H, W, 4)
        An RGB(A) image, uint8 values 0-255 (alpha ignored).

    Returns
    -------
    ndarray of shape (H, W), float32
        The hematoxylin component of each pixel's optical density (0 for white, highest in nuclei).
    """
    stains = RUIFROK_JOHNSTON_HED / np.linalg.norm(RUIFROK_JOHNSTON_HED, axis=1, keepdims=True)
    od = -np.log10(np.maximum(np.asarray(rgb, dtype=np.float32)[..., :3], 1.0) / 255.0)
    conc = od.reshape(-1, 3) @ np.linalg.inv(stains).astype(np.float32)
    return conc[:, 0].reshape(od.shape[:2])


def detect_nuclei(rgb: np.ndarray, mpp: float, min_area_um2: float = 8.0, max_area_um2: float = 120.0,
                  sigma_px: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Nucleus label image (0 background, 1..n nuclei, 4-connected) and the kept component ids.

    Otsu's threshold of the smoothed hematoxylin channel over stained pixels; opening; hole filling;
    components outside ``min_area_um2``..``max_area_um2`` and those touching the image's edge are dropped.

    Parameters
    ----------
    rgb : ndarray of shape (H, W, 3)
        The H&E window, uint8.
    mpp : float
        Its µm/px (areas are converted to µm²).
    min_area_um2, max_area_um2 : float, default 8.0, 120.0
        Nucleus area range in µm².
    sigma_px : float, default 1.0
        Gaussian smoothing of the hematoxylin channel, pixels.

    Returns
    -------
    labels : ndarray of shape (H, W), int
        Connected components of the nucleus mask (0 background); dropped components keep their label.
    keep : ndarray of int
        The labels of the kept nuclei, ascending.

    Raises
    ------
    FmauditInputError
        When the window holds fewer than 100 stained pixels.
    """
    from scipy import ndimage as ndi

    # imported here: PIL loads only when this runs
    from fmaudit.slides import _otsu_threshold

    h = ndi.gaussian_filter(hematoxylin_density(rgb), sigma_px)
    stained = h > 0.05
    if stained.sum() < 100:
        raise FmauditInputError("demo: the window holds no stained tissue")
    top = float(np.quantile(h[stained], 0.995))
    threshold = _otsu_threshold(np.clip(h[stained] / top, 0.0, 1.0)) * top
    mask = ndi.binary_fill_holes(ndi.binary_opening(h > threshold))
    labels, n = ndi.label(mask)
    areas = np.bincount(labels.ravel(), minlength=n + 1) * mpp * mpp
    keep = np.flatnonzero((areas >= min_area_um2) & (areas <= max_area_um2))
    keep = keep[keep > 0]
    # drop nuclei touching the window's edge: their polygons would be cut
    edge = np.unique(np.r_[labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    keep = np.setdiff1d(keep, edge)
    return labels, keep


def nucleus_polygon(mask: np.ndarray) -> np.ndarray:
    """Closed outline (K × 2, x y; first vertex repeated) of a binary nucleus mask, in continuous pixel
    coordinates whose origin is the mask's top-left corner (pixel (c, r) spans [c, c+1) × [r, r+1)).

    The iso-line at 0.5 of the mask sampled at pixel centres (contourpy); its area centroid is within a
    fraction of a pixel of the mask's pixel-centre centroid.

    Parameters
    ----------
    mask : ndarray of shape (h, w), bool
        One nucleus's pixels (the longest outline is kept when the mask has several pieces).

    Returns
    -------
    ndarray of shape (K, 2), float64
        The outline's vertices (x, y), the first repeated last.

    Raises
    ------
    ValueError
        When the mask is empty.
    """
    import contourpy

    padded = np.pad(mask.astype(np.float64), 1)
    gen = contourpy.contour_generator(z=padded, line_type=contourpy.LineType.Separate)
    lines = gen.lines(0.5)
    if not lines:
        raise ValueError("empty nucleus mask")
    ring = max(lines, key=len)
    # contourpy's x, y index pixel centres of the padded array: shift by the pad, then to corner coordinates
    ring = np.asarray(ring, dtype=np.float64) - 1.0 + 0.5
    if not np.allclose(ring[0], ring[-1]):
        ring = np.vstack([ring, ring[:1]])
    return ring


# --------------------------------------------------------------------------- planting


def plant_classes(rgb: np.ndarray, labels: np.ndarray, nucleus_ids: np.ndarray, classes: np.ndarray,
                  signatures: Sequence[tuple[float, tuple[float, float, float]]] = CLASS_SIGNATURES) -> np.ndarray:
    """Recolour each nucleus by its class in optical density: ``OD + w · (OD · (gain - 1) + tint)``, with ``w``
    a soft (Gaussian-blurred) mask of the labelled nuclei and the class of the nearest labelled pixel;
    pixels away from labelled nuclei stay as they were.

    Parameters
    ----------
    rgb : ndarray of shape (H, W, 3)
        The H&E window, uint8 (not changed).
    labels : ndarray of shape (H, W), int
        The nucleus label image (:func:`detect_nuclei`).
    nucleus_ids : ndarray of shape (n,)
        The labels of the nuclei to recolour.
    classes : ndarray of shape (n,)
        The fine class (index into ``signatures``) of each nucleus of ``nucleus_ids``.
    signatures : sequence of (float, (float, float, float)), default CLASS_SIGNATURES
        Per class: the hematoxylin gain and the optical-density tint (R, G, B).

    Returns
    -------
    ndarray of shape (H, W, 3), uint8
        The recoloured window.
    """
    from scipy import ndimage as ndi

    lookup = np.full(int(labels.max()) + 1, -1, dtype=np.int64)
    lookup[nucleus_ids] = classes
    class_map = lookup[labels]
    hit = class_map >= 0
    w = np.clip(ndi.gaussian_filter(hit.astype(np.float32), 0.6) * 1.2, 0.0, 1.0)
    touched = w > 1e-3
    # the class of the nearest labelled pixel, for the soft rim just outside a nucleus
    _, (iy, ix) = ndi.distance_transform_edt(~hit, return_indices=True)
    cls = class_map[iy[touched], ix[touched]]
    gains = np.array([g for g, _ in signatures], dtype=np.float64)
    tints = np.array([t for _, t in signatures], dtype=np.float64)
    out = np.array(rgb[..., :3], dtype=np.uint8, copy=True)
    od = -np.log10(np.maximum(out[touched].astype(np.float64), 1.0) / 255.0)
    od += w[touched][:, None] * (od * (gains[cls] - 1.0)[:, None] + tints[cls])
    out[touched] = np.clip(np.rint(255.0 * np.power(10.0, -np.clip(od, 0.0, None))), 0, 255).astype(np.uint8)
    return out


# --------------------------------------------------------------------------- writing


def write_ome_tiff(path: Path, rgb: np.ndarray, mpp: float, tile: int = 256, min_level_px: int = 256) -> None:
    """A tiled, deflate-compressed pyramidal OME-TIFF (levels in SubIFDs, each half the previous) with the
    µm/px in the OME-XML (``PhysicalSizeX/Y``) and in the TIFF resolution tags (pixels per centimetre).

    Written atomically.

    Parameters
    ----------
    path : Path
        The ``.ome.tif`` to write.
    rgb : ndarray of shape (H, W, 3), uint8
        Level 0.
    mpp : float
        Level 0's µm/px.
    tile : int, default 256
        Tile side in pixels.
    min_level_px : int, default 256
        Levels are added (2x2 mean) while the next one's shorter side is at least this many pixels.
    """
    import tifffile

    levels = [rgb]
    while min(levels[-1].shape[:2]) // 2 >= min_level_px:
        a = levels[-1]
        h, w = a.shape[0] // 2 * 2, a.shape[1] // 2 * 2
        levels.append(a[:h, :w].reshape(h // 2, 2, w // 2, 2, 3).mean(axis=(1, 3)).round().astype(np.uint8))
    per_cm = 1e4 / mpp
    with atomic_path(path, suffix=".tif") as tmp:
        with tifffile.TiffWriter(tmp, ome=True, bigtiff=False) as tw:
            tw.write(levels[0], subifds=len(levels) - 1, tile=(tile, tile), photometric="rgb", compression="zlib",
                     resolution=(per_cm, per_cm), resolutionunit="CENTIMETER",
                     metadata={"axes": "YXS", "PhysicalSizeX": mpp, "PhysicalSizeXUnit": "µm",
                               "PhysicalSizeY": mpp, "PhysicalSizeYUnit": "µm", "Name": path.name})
            for i, level in enumerate(levels[1:], start=1):
                f = per_cm / 2 ** i
                tw.write(level, subfiletype=1, tile=(tile, tile), photometric="rgb", compression="zlib",
                         resolution=(f, f), resolutionunit="CENTIMETER")


def alignment_matrix(rotation_deg: float, scale: float, tx: float, ty: float) -> np.ndarray:
    """H&E px -> Xenium px affine: scale and rotate (counter-clockwise in x-right, y-down axes), then translate.

    Parameters
    ----------
    rotation_deg : float
        Rotation, degrees.
    scale : float
        Xenium morphology pixels per H&E pixel.
    tx, ty : float
        Translation, Xenium pixels.

    Returns
    -------
    ndarray of shape (3, 3)
        The homogeneous matrix, as in 10x's ``*_imagealignment.csv``.
    """
    t = math.radians(rotation_deg)
    c, s = math.cos(t) * scale, math.sin(t) * scale
    return np.array([[c, -s, tx], [s, c, ty], [0.0, 0.0, 1.0]])


def _write_csv_gz(path: Path, df: pd.DataFrame) -> None:
    with atomic_path(path, suffix=".gz") as tmp:
        df.to_csv(tmp, index=False, compression={"method": "gzip", "mtime": 0})


def write_cells_zarr(path: Path, cell_ids: Sequence[str], summary: pd.DataFrame, string_ids: bool) -> None:
    """A ``cells.zarr.zip`` with the arrays the readers use: ``cell_id`` ((N, 2) uint32 prefix/suffix, or
    1-D integers for old bundles) and ``cell_summary`` (float64, ``column_names`` attribute), zarr format 2.

    Written atomically.

    Parameters
    ----------
    path : Path
        The ``cells.zarr.zip`` to write.
    cell_ids : sequence of str
        The cells' ids (Xenium strings such as ``aaaabcde-1``, or integer strings).
    summary : DataFrame
        One row per cell, numeric columns (``cell_centroid_x``, ``nucleus_centroid_x`` ..., µm) stored as
        ``cell_summary``.
    string_ids : bool
        Whether ``cell_ids`` are Xenium strings (stored as prefix/suffix pairs) or integers.
    """
    import zarr

    with atomic_path(path, suffix=".zip") as tmp:
        tmp.unlink()
        store = zarr.storage.ZipStore(str(tmp), mode="w")
        root = zarr.open_group(store=store, mode="w", zarr_format=2, attributes={
            "major_version": 5, "minor_version": 0, "spatial_units": "microns", "name": "CellSegmentationDataset"})
        if string_ids:
            prefix, suffix = cell_id_prefix_suffix(cell_ids)
            ids = np.stack([prefix, suffix], axis=1).astype(np.uint32)
        else:
            ids = np.asarray([int(c) for c in cell_ids], dtype=np.uint32)
        root.create_array("cell_id", data=ids)
        root.create_array("cell_summary", data=summary.to_numpy(np.float64),
                          attributes={"column_names": list(summary.columns)})
        store.close()


def _choose_windows(slide_rgb_small: np.ndarray, factor: int, window_px: int, n: int,
                    max_iou: float = 0.35) -> list[tuple[int, int]]:
    """Top-left corners (level-0 px) of ``n`` windows with the most hematoxylin, overlapping at most ``max_iou``."""
    from scipy import ndimage as ndi

    h = hematoxylin_density(slide_rgb_small) > 0.45
    w_small = window_px // factor
    score = ndi.uniform_filter(h.astype(np.float64), size=w_small, mode="constant")
    H, W = h.shape
    step = max(1, w_small // 8)
    cands = [(score[y + w_small // 2, x + w_small // 2], x, y)
             for y in range(0, H - w_small + 1, step) for x in range(0, W - w_small + 1, step)]
    cands.sort(key=lambda t: (-t[0], t[2], t[1]))
    picked: list[tuple[int, int]] = []
    for _, x, y in cands:
        ok = True
        for px, py in picked:
            ix = max(0, min(x, px) + w_small - max(x, px))
            iy = max(0, min(y, py) + w_small - max(y, py))
            inter = ix * iy
            if inter / (2 * w_small * w_small - inter) > max_iou:
                ok = False
                break
        if ok:
            picked.append((x, y))
        if len(picked) == n:
            break
    if len(picked) < n:
        raise FmauditInputError(f"demo: only {len(picked)} windows of {window_px} px fit on the slide with overlap "
                                f"<= {max_iou}; ask for fewer sections or a smaller window")
    return [(x * factor, y * factor) for x, y in picked]


def _class_labels() -> list[list[str]]:
    """Annotation labels of each fine class of the default taxonomy, in table order (the 68 types first)."""
    tax = load_taxonomy()
    table = pd.read_csv(DEFAULT_FINE_TABLE, sep="\t", comment="#", dtype=str, keep_default_na=False)
    out: list[list[str]] = [[] for _ in tax.fine_classes]
    for label, cls in zip(table["label"], table["fine"]):
        if cls in tax.fine_classes and tax.label_to_fine.get(normalise_label(label)) == cls:
            out[tax.fine_classes.index(cls)].append(label)
    return out


def write_demo_section(spec: DemoSectionSpec, out_dir: str | Path, slide: str | Path = DEMO_SLIDE) -> dict[str, Any]:
    """Write one demo section under ``out_dir/<section>/`` and return its section specification
    (``organ``, ``bundle``, ``he_image``, ``alignment``, ``cell_types``; absolute paths).

    A section already written with the same specification (its ``demo_section.json``, written last) is kept.

    Parameters
    ----------
    spec : DemoSectionSpec
        What determines the section.
    out_dir : str or Path
        The folder the section's folder goes in.
    slide : str or Path, default DEMO_SLIDE
        The source H&E slide.

    Returns
    -------
    dict
        ``organ`` and the paths ``bundle`` (the ``outs/`` folder), ``he_image``, ``alignment`` and ``cell_types``, as
        a data set's ``sections`` entry names them.

    Raises
    ------
    FmauditInputError
        When the window holds no stained tissue or fewer than 20 nuclei.
    """
    import openslide

    folder = Path(out_dir) / spec.section
    bundle = folder / "outs"
    paths = {
        "organ": spec.organ,
        "bundle": str(bundle),
        "he_image": str(folder / f"{spec.section}_he_image.ome.tif"),
        "alignment": str(folder / f"{spec.section}_he_imagealignment.csv"),
        "cell_types": str(folder / f"{spec.section}_cell_types.csv"),
    }
    marker = folder / "demo_section.json"
    written = [Path(paths[k]) for k in ("he_image", "alignment", "cell_types")] + [bundle / "experiment.xenium"]
    if (marker.exists() and json.loads(marker.read_text()).get("spec") == asdict(spec)
            and all(p.exists() for p in written)):
        return paths  # already written with the same specification (the marker is written last)
    rng = np.random.default_rng(spec.seed)
    with openslide.OpenSlide(str(slide)) as s:
        mpp = float(s.properties[openslide.PROPERTY_NAME_MPP_X])
        region = s.read_region((spec.x0, spec.y0), 0, (spec.window_px, spec.window_px))
    rgb = np.asarray(region.convert("RGB"))
    labels, ids = detect_nuclei(rgb, mpp, spec.min_area_um2, spec.max_area_um2, spec.sigma_px)
    if len(ids) > spec.max_cells:
        ids = np.sort(rng.choice(ids, size=spec.max_cells, replace=False))
    if len(ids) < 20:
        raise FmauditInputError(f"demo section {spec.section}: only {len(ids)} nuclei found in its window")
    n_classes = len(CLASS_SIGNATURES)
    mix = rng.dirichlet(np.full(n_classes, 4.0))
    classes = rng.choice(n_classes, size=len(ids), p=mix)
    painted = plant_classes(rgb, labels, ids, classes)

    from scipy import ndimage as ndi

    centre_rc = np.asarray(ndi.center_of_mass(np.ones_like(labels), labels, ids), dtype=np.float64).reshape(-1, 2)
    # pixel-centre centroid in corner coordinates: pixel (c, r) has its centre at (c + 0.5, r + 0.5)
    painted_x, painted_y = centre_rc[:, 1] + 0.5, centre_rc[:, 0] + 0.5
    areas_px = np.bincount(labels.ravel(), minlength=int(labels.max()) + 1)[ids]
    objects = ndi.find_objects(labels)
    rings = []
    for lab in ids:
        sl = objects[lab - 1]
        ring = nucleus_polygon(labels[sl] == lab)
        rings.append(ring + np.array([sl[1].start, sl[0].start], dtype=np.float64))

    # the alignment: H&E px -> Xenium px, with the H&E window landing at positive Xenium coordinates
    scale = mpp / XENIUM_PIXEL_SIZE * (1.0 + spec.scale_jitter)
    a = alignment_matrix(spec.rotation_deg, scale, 0.0, 0.0)
    corners = np.array([[0, 0], [spec.window_px, 0], [0, spec.window_px], [spec.window_px, spec.window_px]], float).T
    mapped = a[:2, :2] @ corners
    margin_px = 150.0 / XENIUM_PIXEL_SIZE + rng.uniform(0, 400)
    a[0, 2] = margin_px - mapped[0].min()
    a[1, 2] = margin_px + rng.uniform(0, 300) - mapped[1].min()

    n = len(ids)
    nx_um, ny_um = he_px_to_xenium_um(painted_x, painted_y, a, XENIUM_PIXEL_SIZE)
    theta = rng.uniform(0, 2 * np.pi, n)
    shift = rng.uniform(0.5, 2.0, n)
    cell_x, cell_y = nx_um + shift * np.cos(theta), ny_um + shift * np.sin(theta)
    nucleus_area = areas_px * mpp * mpp
    string_ids = spec.bundle_format == "v2"
    if string_ids:
        prefixes = np.sort(rng.choice(2 ** 31, size=n, replace=False)).astype(np.uint32)
        cell_ids = list(cell_id_strings(prefixes, np.ones(n, dtype=np.uint32)))
    else:
        cell_ids = [str(i + 1) for i in range(n)]
    class_labels = _class_labels()
    ann = [class_labels[k][int(rng.integers(len(class_labels[k])))] for k in classes]
    fate = rng.uniform(size=n)
    ann = ["Unassigned" if f < 0.04 else lab for f, lab in zip(fate, ann)]
    annotated = ~((fate >= 0.04) & (fate < 0.07))  # 3 % of cells have no annotation row

    folder.mkdir(parents=True, exist_ok=True)
    bundle.mkdir(parents=True, exist_ok=True)
    write_ome_tiff(Path(paths["he_image"]), painted, mpp)
    write_text(paths["alignment"], "\n".join(",".join(repr(float(v)) for v in row) for row in a) + "\n")
    experiment = {
        "major_version": 5 if string_ids else 1, "minor_version": 0, "run_name": "fmaudit-demo",
        "region_name": spec.section, "preservation_method": "FFPE", "num_cells": n,
        "panel_organism": "Human", "pixel_size": XENIUM_PIXEL_SIZE,
        "analysis_sw_version": "xenium-2.0.0.10" if string_ids else "xenium-1.0.2",
        "images": {"morphology_focus_filepath": "morphology_focus/morphology_focus_0000.ome.tif"},
        "xenium_explorer_files": {"cells_zarr_filepath": "cells.zarr.zip"},
        "fmaudit_demo": {"source_slide": Path(slide).name, "window": [spec.x0, spec.y0, spec.window_px],
                          "note": "generated by fmaudit.cells.demo; the H&E is a CC0 Aperio window "
                                  "with planted cell types"},
    }
    write_json(bundle / "experiment.xenium", experiment)
    cells = pd.DataFrame({
        "cell_id": cell_ids if string_ids else [int(c) for c in cell_ids],
        "x_centroid": cell_x, "y_centroid": cell_y,
        "transcript_counts": rng.poisson(120, n), "control_probe_counts": rng.poisson(0.3, n),
        "control_codeword_counts": np.zeros(n, dtype=np.int64), "total_counts": rng.poisson(121, n),
        "cell_area": nucleus_area * rng.uniform(2.0, 4.0, n), "nucleus_area": nucleus_area,
    })
    if string_ids:
        write_table(bundle / "cells.parquet", cells)
    _write_csv_gz(bundle / "cells.csv.gz", cells)
    owner = np.repeat(np.arange(n), [len(r) for r in rings])
    ring_xy = np.concatenate(rings)
    vx, vy = he_px_to_xenium_um(ring_xy[:, 0], ring_xy[:, 1], a, XENIUM_PIXEL_SIZE)
    boundaries = pd.DataFrame({"cell_id": cells["cell_id"].to_numpy()[owner], "vertex_x": vx.astype(np.float32),
                               "vertex_y": vy.astype(np.float32)})
    if string_ids:
        boundaries["label_id"] = owner + 1  # XOA >= 2.0 names each nucleus polygon
        write_table(bundle / "nucleus_boundaries.parquet", boundaries)
    else:
        _write_csv_gz(bundle / "nucleus_boundaries.csv.gz", boundaries)
    if spec.write_zarr:
        summary = pd.DataFrame({"cell_centroid_x": cell_x, "cell_centroid_y": cell_y, "cell_area": cells["cell_area"],
                                "nucleus_centroid_x": nx_um, "nucleus_centroid_y": ny_um, "nucleus_area": nucleus_area,
                                "z_level": np.zeros(n), **({"nucleus_count": np.ones(n)} if string_ids else {})})
        write_cells_zarr(bundle / "cells.zarr.zip", cell_ids, summary, string_ids)
    table = pd.DataFrame({"cell_id": cell_ids, "label": ann})[annotated]
    with atomic_path(paths["cell_types"]) as tmp:
        table.to_csv(tmp, index=False)
    truth = pd.DataFrame({"cell_id": cell_ids, "painted_x": painted_x, "painted_y": painted_y,
                          "fine_class": classes.astype(np.int64), "annotation": ann, "annotated": annotated,
                          "nucleus_x_um": nx_um, "nucleus_y_um": ny_um})
    write_table(folder / "truth.parquet", truth)
    write_json(marker, {"spec": asdict(spec), "n_cells": n, "alignment": a.tolist(), "he_mpp": mpp,
                        "class_mix": mix.tolist()})
    log.info("demo section %s (%s): %d nuclei, rotation %.1f°, scale %.4f", spec.section, spec.organ, n,
             spec.rotation_deg, scale)
    return paths


def demo_section_specs(n_sections: int = 6, organs: Sequence[str] = ("organ-a", "organ-b", "organ-c"), seed: int = 0,
                       window_px: int = 1024, max_cells: int = 400, bundle_format: str = "v2",
                       write_zarr: bool = False, slide: str | Path = DEMO_SLIDE) -> list[DemoSectionSpec]:
    """Specifications of ``n_sections`` demo sections on distinct windows of the slide, organs in turn.

    Parameters
    ----------
    n_sections : int, default 6
        Number of sections, each on its own window of the slide (windows overlap by at most 35 % IoU).
    organs : sequence of str, default ("organ-a", "organ-b", "organ-c")
        Organ names given to the sections in turn; section names are ``<organ>-<k>``.
    seed : int, default 0
        Random seed of the specifications (each section's own seed, rotation and scale jitter are drawn from it).
    window_px : int, default 1024
        Side of each section's window in level-0 pixels of the slide.
    max_cells : int, default 400
        At most this many nuclei per section (a random subset when more are found).
    bundle_format : {"v2", "v1"}, default "v2"
        ``v2``: string cell ids, parquet and csv.gz tables, ``label_id`` in the boundaries (Xenium Onboard Analysis
        >= 2.0); ``v1``: integer ids, csv.gz only.
    write_zarr : bool, default False
        Also write ``cells.zarr.zip``.
    slide : str or Path, default DEMO_SLIDE
        The source H&E slide (the CC0 ``CMU-1-Small-Region.svs``).

    Returns
    -------
    list of DemoSectionSpec
        One per section, windows chosen by hematoxylin content (most first).

    Raises
    ------
    FmauditInputError
        When ``n_sections`` is below 1, ``organs`` is empty, ``bundle_format`` is unknown, or the slide has room for
        fewer windows.
    """
    import openslide

    if n_sections < 1 or not organs:
        raise FmauditInputError("demo: need at least one section and one organ")
    if bundle_format not in ("v1", "v2"):
        raise FmauditInputError(f"demo: bundle_format must be 'v1' or 'v2', got {bundle_format!r}")
    factor = 8
    with openslide.OpenSlide(str(slide)) as s:
        w, h = s.dimensions
        small = np.asarray(s.get_thumbnail((w // factor, h // factor)).convert("RGB"))
    factor = w / small.shape[1]
    windows = _choose_windows(small, int(round(factor)), window_px, n_sections)
    rng = np.random.default_rng(seed)
    specs = []
    for i, (x, y) in enumerate(windows):
        x = int(min(max(0, x), w - window_px))
        y = int(min(max(0, y), h - window_px))
        organ = organs[i % len(organs)]
        specs.append(DemoSectionSpec(
            section=f"{organ}-{i // len(organs) + 1}",
            organ=organ, x0=x, y0=y, window_px=window_px, seed=int(rng.integers(2 ** 31)),
            rotation_deg=float(rng.uniform(-180, 180)), scale_jitter=float(rng.uniform(-0.03, 0.03)),
            max_cells=max_cells, bundle_format=bundle_format, write_zarr=write_zarr))
    return specs


def write_demo_sections(out_dir: str | Path, n_sections: int = 6,
                        organs: Sequence[str] = ("organ-a", "organ-b", "organ-c"),
                        seed: int = 0, window_px: int = 1024, max_cells: int = 400, bundle_format: str = "v2",
                        write_zarr: bool = False, slide: str | Path = DEMO_SLIDE) -> dict[str, dict[str, Any]]:
    """Write the demo sections under ``out_dir`` and a ``sections.json`` listing them; returns
    ``{section: {organ, bundle, he_image, alignment, cell_types}}`` (absolute paths).

    Parameters
    ----------
    out_dir : str or Path
        The folder the sections are written under (one subfolder per section).
    n_sections : int, default 6
        Number of sections, each on its own window of the slide (windows overlap by at most 35 % IoU).
    organs : sequence of str, default ("organ-a", "organ-b", "organ-c")
        Organ names given to the sections in turn; section names are ``<organ>-<k>``.
    seed : int, default 0
        Random seed of the specifications (each section's own seed, rotation and scale jitter are drawn from it).
    window_px : int, default 1024
        Side of each section's window in level-0 pixels of the slide.
    max_cells : int, default 400
        At most this many nuclei per section (a random subset when more are found).
    bundle_format : {"v2", "v1"}, default "v2"
        ``v2``: string cell ids, parquet and csv.gz tables, ``label_id`` in the boundaries (Xenium Onboard Analysis
        >= 2.0); ``v1``: integer ids, csv.gz only.
    write_zarr : bool, default False
        Also write ``cells.zarr.zip``.
    slide : str or Path, default DEMO_SLIDE
        The source H&E slide (the CC0 ``CMU-1-Small-Region.svs``).

    Returns
    -------
    dict of str to dict
        Section name -> :func:`write_demo_section`'s specification of it (also written to ``sections.json``).

    Raises
    ------
    FmauditInputError
        As :func:`demo_section_specs` and :func:`write_demo_section`.
    """
    specs = demo_section_specs(n_sections, organs, seed, window_px, max_cells, bundle_format, write_zarr, slide)
    sections = {spec.section: write_demo_section(spec, out_dir, slide) for spec in specs}
    write_json(Path(out_dir) / "sections.json", sections)
    return sections
