"""Whole-slide images through openslide: level choice by µm/px, tissue detection, tile coordinates.

Conventions
- Coordinates ``x``, ``y`` are level-0 pixels of the tile's top-left corner (openslide's convention).
- ``size`` is the tile side in pixels *at the level it is read at*. Its physical field of view,
  ``size * level_mpp`` µm, equals ``tile_size * target_mpp``: the embedding transform resizes the read
  ``size``×``size`` tile to the encoder's input, so a level finer than the target is read larger and shrunk
  (e.g. a 0.5 µm/px slide tiled at 1.0 µm/px with ``tile_size`` 64 reads 128 px at level 0).
- µm/px comes from ``openslide.mpp-x`` (which openslide fills from vendor metadata or, for generic TIFF,
  from the resolution tags), else from ``tiff.XResolution`` with an inch or centimetre unit, else from an
  explicit override; without any of these, :class:`FmauditInputError`.
- Any openslide failure (unsupported, truncated or corrupt file) becomes :class:`FmauditInputError` naming
  the slide.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
from PIL import Image

from fmaudit.io import FmauditInputError

# columns of tile_coordinates, in order
TILE_COLUMNS = ("x", "y", "level", "size", "tissue_fraction", "mpp")


def open_slide(path: str | Path):
    """Open a slide with openslide; a truncated or unreadable file raises FmauditInputError naming it.

    Parameters
    ----------
    path : str or Path
        A slide file openslide reads (SVS, NDPI, MRXS, generic tiled TIFF, ...).

    Returns
    -------
    openslide.OpenSlide
        The caller closes it.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When openslide cannot open it.
    """
    import openslide

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: slide not found")
    try:
        return openslide.OpenSlide(str(path))
    except (openslide.OpenSlideError, openslide.OpenSlideUnsupportedFormatError) as e:
        raise FmauditInputError(f"{path}: unreadable slide, not a supported format or truncated ({e})") from e


def read_tile(slide_path: str | Path, x: int, y: int, level: int, size: int, slide=None) -> Image.Image:
    """RGB tile of ``size``×``size`` pixels at ``level`` whose top-left is (x, y) in level-0 pixels.

    Parameters
    ----------
    slide_path : str or Path
        The slide (named in errors; opened here unless ``slide`` is given).
    x, y : int
        Level-0 pixel coordinates of the tile's top-left corner.
    level : int
        Pyramid level to read.
    size : int
        Tile side in pixels at ``level``.
    slide : openslide.OpenSlide, optional
        An already open handle of ``slide_path`` to read from (not closed here).

    Returns
    -------
    PIL.Image.Image
        RGB, ``size`` x ``size``; transparent pixels (outside the scanned area) are white.

    Raises
    ------
    FmauditInputError
        When the slide cannot be opened or the region cannot be read.
    """
    import openslide

    own = slide is None
    slide = open_slide(slide_path) if own else slide
    try:
        region = slide.read_region((int(x), int(y)), int(level), (int(size), int(size)))
    except openslide.OpenSlideError as e:
        raise FmauditInputError(f"{slide_path}: cannot read tile at ({x}, {y}) level {level}: {e}") from e
    finally:
        if own:
            slide.close()
    # composite on white: transparent (outside-slide) pixels are background, not black
    bg = Image.new("RGB", region.size, (255, 255, 255))
    bg.paste(region, mask=region.split()[3])
    return bg


def _slide_name(slide) -> str:
    # openslide keeps the path it was opened with in a private attribute; fall back to repr for error messages
    return str(getattr(slide, "_filename", None) or slide)


@contextlib.contextmanager
def _opened(slide) -> Iterator:
    """An open slide from a path or an already open slide (closed on exit only if opened here)."""
    if isinstance(slide, (str, Path)):
        handle = open_slide(slide)
        try:
            yield handle
        finally:
            handle.close()
    else:
        yield slide


_TIFF_UNIT_TO_UM = {"inch": 25400.0, "centimeter": 10000.0}


def slide_mpp(slide, mpp_override: float | None = None) -> float:
    """Level-0 µm/px of a slide (an open slide or a path).

    ``mpp_override`` wins when given (slides whose metadata lack or misstate the resolution). Otherwise
    ``openslide.mpp-x``, then the TIFF ``XResolution`` / ``ResolutionUnit`` tags (inch or centimetre);
    a slide with neither raises :class:`FmauditInputError` naming it.

    Parameters
    ----------
    slide : openslide.OpenSlide or str or Path
        An open slide (left open) or a slide path (opened and closed here).
    mpp_override : float, optional
        Level-0 µm/px to use instead of the slide's metadata (a positive number).

    Returns
    -------
    float
        µm per level-0 pixel.

    Raises
    ------
    FmauditInputError
        When the override is not a positive number, or the slide states no resolution.
    """
    if mpp_override is not None:
        mpp = float(mpp_override)
        if not np.isfinite(mpp) or mpp <= 0:
            raise FmauditInputError(f"{_slide_name(slide)}: mpp override must be a positive number, "
                                    f"got {mpp_override!r}")
        return mpp
    import openslide

    with _opened(slide) as s:
        props = s.properties
        name = _slide_name(s)
        raw = props.get(openslide.PROPERTY_NAME_MPP_X)
        if raw is not None:
            try:
                mpp = float(raw)
            except ValueError:
                mpp = float("nan")
            if np.isfinite(mpp) and mpp > 0:
                return mpp
        unit = str(props.get("tiff.ResolutionUnit", "")).lower()
        xres = props.get("tiff.XResolution")
        if unit in _TIFF_UNIT_TO_UM and xres is not None:
            try:
                per_unit = float(xres)
            except ValueError:
                per_unit = 0.0
            if per_unit > 0:
                return _TIFF_UNIT_TO_UM[unit] / per_unit
    raise FmauditInputError(
        f"{name}: the slide states no resolution (no {openslide.PROPERTY_NAME_MPP_X}, no TIFF resolution in "
        "inch or centimetre); give its µm/px as an mpp override (slide sheet column 'mpp')"
    )


def level_mpps(slide, mpp_override: float | None = None) -> list[float]:
    """µm/px of every pyramid level: level-0 µm/px times openslide's level downsample.

    Parameters
    ----------
    slide : openslide.OpenSlide or str or Path
        An open slide (left open) or a slide path (opened and closed here).
    mpp_override : float, optional
        Level-0 µm/px to use instead of the slide's metadata (a positive number).

    Returns
    -------
    list of float
        One entry per level, level 0 first.

    Raises
    ------
    FmauditInputError
        When the level-0 µm/px cannot be known (:func:`slide_mpp`).
    """
    with _opened(slide) as s:
        base = slide_mpp(s, mpp_override)
        return [base * float(d) for d in s.level_downsamples]


def choose_level(
    slide, target_mpp: float, mpp_override: float | None = None, rel_tol: float = 0.05
) -> tuple[int, float]:
    """The pyramid level to read for ``target_mpp`` µm/px, and the downsample still needed after reading.

    Picks the coarsest level whose µm/px is at or below the target (closest from the fine side, so no
    detail is invented), counting a level within ``rel_tol`` above the target as "at" it (scanner metadata
    such as 0.2520 for a nominal 0.25). ``downsample_needed = target_mpp / level_mpp``: 1 means the level
    is at the target; 2 means the read pixels must be shrunk two-fold. If even level 0 is coarser than the
    target, level 0 is returned with ``downsample_needed < 1`` (the tile will be upsampled) and a warning.

    Parameters
    ----------
    slide : openslide.OpenSlide or str or Path
        An open slide (left open) or a slide path (opened and closed here).
    target_mpp : float
        The µm/px the tiles should have (a positive number).
    mpp_override : float, optional
        Level-0 µm/px to use instead of the slide's metadata (a positive number).
    rel_tol : float, default 0.05
        Relative tolerance above the target within which a level counts as at the target.

    Returns
    -------
    level : int
    downsample_needed : float
        ``target_mpp / level_mpp``.

    Raises
    ------
    FmauditInputError
        When ``target_mpp`` is not a positive number or the slide's µm/px cannot be known.
    """
    target = float(target_mpp)
    if not np.isfinite(target) or target <= 0:
        raise FmauditInputError(f"target_mpp must be a positive number, got {target_mpp!r}")
    with _opened(slide) as s:
        mpps = level_mpps(s, mpp_override)
        name = _slide_name(s)
    at_or_below = [i for i, m in enumerate(mpps) if m <= target * (1.0 + rel_tol)]
    if at_or_below:
        level = max(at_or_below, key=lambda i: mpps[i])
    else:
        level = int(np.argmin(mpps))
        warnings.warn(
            f"{name}: finest level is {mpps[level]:.4g} µm/px, coarser than the target {target:.4g} µm/px; "
            "tiles will be upsampled",
            stacklevel=2,
        )
    return int(level), target / mpps[level]


def _otsu_threshold(values: np.ndarray, bins: int = 256) -> float:
    """Otsu's threshold of values in [0, 1]: maximises the between-class variance of the histogram."""
    hist, edges = np.histogram(values, bins=bins, range=(0.0, 1.0))
    hist = hist.astype(np.float64)
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(hist)
    w1 = w0[-1] - w0
    m0 = np.cumsum(hist * centres)
    mean0 = np.divide(m0, w0, out=np.zeros_like(m0), where=w0 > 0)
    mean1 = np.divide(m0[-1] - m0, w1, out=np.zeros_like(m0), where=w1 > 0)
    between = w0 * w1 * (mean0 - mean1) ** 2
    # threshold between bin k and k+1: pixels > edges[k+1] are foreground
    return float(edges[int(np.argmax(between)) + 1])


def tissue_mask_from_rgb(
    rgb: np.ndarray, min_saturation: float = 0.05, min_brightness: int = 30, min_object_fraction: float = 1e-4
) -> np.ndarray:
    """Boolean tissue mask of an RGB thumbnail: Otsu on HSV saturation, then a small morphological cleanup.

    Stained tissue is saturated and glass is grey, so saturation separates them whatever the stain
    intensity. The threshold is Otsu's, but never below ``min_saturation`` so that a blank slide (where
    Otsu would split noise) comes out empty. Near-black pixels (max channel < ``min_brightness``: scanner
    borders, dust) have meaningless saturation and are excluded. Cleanup: 3×3 median, opening (drops
    specks), closing and hole filling (keeps pale lumens inside tissue), then objects smaller than
    ``min_object_fraction`` of the thumbnail are removed.

    Parameters
    ----------
    rgb : ndarray of shape (H, W, 3 or 4)
        Thumbnail pixels, 0..255 (an alpha channel is ignored).
    min_saturation : float, default 0.05
        Lowest saturation threshold, in [0, 1].
    min_brightness : int, default 30
        Pixels whose brightest channel is below this (0..255) are never tissue.
    min_object_fraction : float, default 1e-4
        Smallest kept object as a share of the thumbnail's pixels (at least 4 pixels).

    Returns
    -------
    ndarray of bool, shape (H, W)

    Raises
    ------
    FmauditInputError
        When ``rgb`` is not an RGB(A) image array.
    """
    from scipy import ndimage

    arr = np.asarray(rgb, dtype=np.float32)
    if arr.ndim != 3 or arr.shape[2] < 3:
        raise FmauditInputError(f"tissue mask: expected an RGB image, got shape {arr.shape}")
    arr = arr[..., :3]
    vmax = arr.max(axis=2)
    vmin = arr.min(axis=2)
    sat = np.divide(vmax - vmin, vmax, out=np.zeros_like(vmax), where=vmax > 0)
    sat = ndimage.median_filter(sat, size=3, mode="nearest")
    usable = vmax >= min_brightness
    if not usable.any():
        return np.zeros(sat.shape, dtype=bool)
    threshold = max(_otsu_threshold(sat[usable]), float(min_saturation))
    mask = (sat > threshold) & usable

    structure = np.ones((3, 3), dtype=bool)
    pad = 3  # closing erodes at the border unless the mask is padded first
    mask = np.pad(mask, pad, mode="edge")
    mask = ndimage.binary_opening(mask, structure=structure)
    mask = ndimage.binary_closing(mask, structure=structure, iterations=2)
    mask = ndimage.binary_fill_holes(mask)[pad:-pad, pad:-pad]
    labels, n = ndimage.label(mask)
    if n:
        sizes = np.bincount(labels.ravel())
        min_size = max(4, int(np.ceil(min_object_fraction * mask.size)))
        keep = sizes >= min_size
        keep[0] = False
        mask = keep[labels]
    return mask


def tissue_mask(slide, thumb_max: int = 1024) -> np.ndarray:
    """Boolean tissue mask of a slide (open slide or path), computed on a thumbnail of at most
    ``thumb_max`` px a side (see :func:`tissue_mask_from_rgb`).

    The mask covers the whole level-0 image: mask pixel (r, c) spans level-0 x in
    ``[c * W0 / mask_w, (c + 1) * W0 / mask_w)`` and likewise in y.

    Parameters
    ----------
    slide : openslide.OpenSlide or str or Path
        An open slide (left open) or a slide path (opened and closed here).
    thumb_max : int, default 1024
        Largest side of the thumbnail in pixels.

    Returns
    -------
    ndarray of bool, shape (mask_h, mask_w)

    Raises
    ------
    FmauditInputError
        When the slide's thumbnail cannot be read.
    """
    import openslide

    with _opened(slide) as s:
        try:
            thumb = s.get_thumbnail((int(thumb_max), int(thumb_max))).convert("RGB")
        except openslide.OpenSlideError as e:
            raise FmauditInputError(f"{_slide_name(s)}: cannot read the slide, corrupt or truncated ({e})") from e
    return tissue_mask_from_rgb(np.asarray(thumb))


def rect_fraction(mask: np.ndarray, x0, y0, x1, y1) -> np.ndarray:
    """Exact mean of a piecewise-constant mask over rectangles with fractional mask-pixel corners.

    The integral of a piecewise-constant image up to (u, v) is the bilinear interpolation of its summed-area
    table, so corners need not fall on mask pixels (tiles may be smaller or larger than one mask pixel).

    Parameters
    ----------
    mask : ndarray of shape (h, w)
        Boolean or numeric mask, constant over each pixel.
    x0, y0, x1, y1 : float or ndarray
        Rectangle corners in mask-pixel units (x: columns, y: rows), broadcast together; x1 > x0, y1 > y0.
        Parts outside the mask count as 0.

    Returns
    -------
    ndarray of float64
        Mean of the mask over each rectangle, in [0, 1].
    """
    h, w = mask.shape
    sat = np.zeros((h + 1, w + 1), dtype=np.float64)
    sat[1:, 1:] = mask.astype(np.float64).cumsum(0).cumsum(1)

    def integral(u, v):
        u = np.clip(u, 0, w)
        v = np.clip(v, 0, h)
        i0 = np.minimum(np.floor(u).astype(np.int64), w - 1)
        j0 = np.minimum(np.floor(v).astype(np.int64), h - 1)
        fu, fv = u - i0, v - j0
        return (
            sat[j0, i0] * (1 - fu) * (1 - fv)
            + sat[j0, i0 + 1] * fu * (1 - fv)
            + sat[j0 + 1, i0] * (1 - fu) * fv
            + sat[j0 + 1, i0 + 1] * fu * fv
        )

    area = (x1 - x0) * (y1 - y0)
    total = integral(x1, y1) - integral(x0, y1) - integral(x1, y0) + integral(x0, y0)
    return np.clip(total / area, 0.0, 1.0)


def tile_coordinates(
    slide_path: str | Path,
    target_mpp: float,
    tile_size: int,
    min_tissue_fraction: float = 0.5,
    max_tiles: int | None = None,
    seed: int = 0,
    mpp_override: float | None = None,
    thumb_max: int = 1024,
) -> pd.DataFrame:
    """Tissue tiles of a slide on a non-overlapping grid at the level chosen for ``target_mpp``.

    Returns one row per tile with columns ``x``, ``y`` (level-0 top-left), ``level``, ``size`` (pixels read
    at ``level``: ``round(tile_size * target_mpp / level_mpp)``, so the field of view is ``tile_size`` px at
    ``target_mpp``), ``tissue_fraction`` (share of the tile covered by the tissue mask) and ``mpp`` (µm/px of
    the read pixels). Only whole tiles inside the slide are listed, in row-major order (y, then x). Tiles
    with ``tissue_fraction >= min_tissue_fraction`` are kept; if ``max_tiles`` is set and more remain,
    ``max_tiles`` of them are drawn without replacement with ``np.random.default_rng(seed)`` and put back
    in row-major order. A slide without a single kept tile raises :class:`FmauditInputError`.

    Parameters
    ----------
    slide_path : str or Path
        The slide.
    target_mpp : float
        µm/px of the tiles' field of view.
    tile_size : int
        Tile side in pixels at ``target_mpp`` (positive).
    min_tissue_fraction : float, default 0.5
        Smallest share of tissue a kept tile has, in [0, 1].
    max_tiles : int, optional
        Largest number of tiles kept (positive); None keeps all.
    seed : int, default 0
        Seed of the draw of ``max_tiles`` tiles.
    mpp_override : float, optional
        Level-0 µm/px to use instead of the slide's metadata (a positive number).
    thumb_max : int, default 1024
        Largest side of the tissue-mask thumbnail in pixels.

    Returns
    -------
    DataFrame
        Columns :data:`TILE_COLUMNS` as above.

    Raises
    ------
    FmauditInputError
        On an invalid ``tile_size``, ``min_tissue_fraction`` or ``max_tiles``, an unreadable slide or unknown
        resolution, a level smaller than one tile, or no tile with enough tissue.
    """
    tile_size = int(tile_size)
    if tile_size <= 0:
        raise FmauditInputError(f"{slide_path}: tile_size must be positive, got {tile_size}")
    if not 0.0 <= float(min_tissue_fraction) <= 1.0:
        raise FmauditInputError(f"{slide_path}: min_tissue_fraction must be in [0, 1], got {min_tissue_fraction}")
    if max_tiles is not None and int(max_tiles) <= 0:
        raise FmauditInputError(f"{slide_path}: max_tiles must be positive or None, got {max_tiles}")

    with _opened(slide_path) as s:
        level, _ = choose_level(s, target_mpp, mpp_override=mpp_override)
        mpp = level_mpps(s, mpp_override)[level]
        width0, height0 = s.dimensions
        level_w, level_h = s.level_dimensions[level]
        downsample = float(s.level_downsamples[level])
        mask = tissue_mask(s, thumb_max=thumb_max)

    size = max(1, int(round(tile_size * float(target_mpp) / mpp)))
    nx, ny = level_w // size, level_h // size
    if nx == 0 or ny == 0:
        raise FmauditInputError(
            f"{slide_path}: level {level} is {level_w}×{level_h} px, smaller than one {size}-px tile "
            f"({tile_size} px at {target_mpp} µm/px)"
        )
    gy, gx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    x = np.rint(gx.ravel() * size * downsample).astype(np.int64)
    y = np.rint(gy.ravel() * size * downsample).astype(np.int64)
    footprint = size * downsample  # tile side in level-0 pixels

    mask_h, mask_w = mask.shape
    sx, sy = width0 / mask_w, height0 / mask_h
    fraction = rect_fraction(mask, x / sx, y / sy, (x + footprint) / sx, (y + footprint) / sy)

    keep = fraction >= float(min_tissue_fraction)
    if not keep.any():
        raise FmauditInputError(
            f"{slide_path}: no tissue found: no {tile_size}-px tile at {target_mpp} µm/px has tissue fraction "
            f">= {min_tissue_fraction} (tissue covers {mask.mean():.1%} of the thumbnail)"
        )
    idx = np.flatnonzero(keep)
    if max_tiles is not None and len(idx) > int(max_tiles):
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(idx, size=int(max_tiles), replace=False))
    tiles = pd.DataFrame(
        {
            "x": x[idx],
            "y": y[idx],
            "level": np.full(len(idx), level, dtype=np.int64),
            "size": np.full(len(idx), size, dtype=np.int64),
            "tissue_fraction": fraction[idx],
            "mpp": np.full(len(idx), mpp, dtype=np.float64),
        }
    )
    return tiles[list(TILE_COLUMNS)]
