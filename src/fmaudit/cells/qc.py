"""Quality control of registered sections: overlay images of sampled regions and section eligibility.

- :func:`overlay_png`: like CellPath-Bench's inspection of the provider alignment ("overlaying Xenium cell
  coordinates on 20 sampled H&E regions per section"), draws the registered nucleus centres on crops of the
  H&E image around randomly drawn cells (a seeded draw) and tiles the crops into one PNG per section. Dots
  are coloured by coarse class (grey: unlabelled), with a ring whose radius is 3 µm, so a misregistration
  of a nucleus diameter is visible at a glance.
- :func:`section_eligibility`: a section needs at least two valid classes in each taxonomy (a class is valid
  with at least ``min_cells_per_class`` labelled cells); otherwise it is excluded with the reason.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from fmaudit.io import FmauditInputError, atomic_path

# coarse class colours (epithelial, stromal, immune, ...) and unlabelled
_PALETTE = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240)]
_UNLABELLED = (128, 128, 128)


@contextlib.contextmanager
def he_region_reader(path: str | Path,
                     reader: str = "openslide") -> Iterator[Callable[[int, int, int, int], np.ndarray]]:
    """Open the H&E image once; yield ``read(x0, y0, width, height)`` returning RGB uint8 level-0 regions
    (white outside the image), through openslide or tifffile (the reader :func:`he_image` chose).

    Parameters
    ----------
    path : str or Path
        The H&E image.
    reader : {"openslide", "tifffile"}, default "openslide"
        The library that reads it (:attr:`fmaudit.cells.registration.HEImage.reader`).

    Yields
    ------
    callable
        ``read(x0, y0, width, height) -> ndarray of shape (height, width, 3)``, uint8, coordinates in level-0 pixels;
        the image stays open until the block ends.

    Raises
    ------
    FmauditInputError
        When ``reader`` is neither.
    """
    path = Path(path)
    if reader == "openslide":
        import openslide

        with openslide.OpenSlide(str(path)) as slide:
            def read(x0: int, y0: int, width: int, height: int) -> np.ndarray:
                region = slide.read_region((int(x0), int(y0)), 0, (int(width), int(height)))
                bg = Image.new("RGB", region.size, (255, 255, 255))
                bg.paste(region, mask=region.split()[3])
                return np.asarray(bg)

            yield read
        return
    if reader != "tifffile":
        raise FmauditInputError(f"unknown H&E reader {reader!r} (openslide or tifffile)")
    import tifffile
    import zarr

    with tifffile.TiffFile(str(path)) as tf:
        level0 = tf.series[0].levels[0]
        axes = level0.axes
        node = zarr.open(tf.series[0].aszarr(level=0), mode="r")
        arr = node["0"] if isinstance(node, zarr.Group) else node  # a pyramid opens as a group of levels
        img_h, img_w = level0.shape[axes.index("Y")], level0.shape[axes.index("X")]
        order = [axes.index("Y"), axes.index("X")] + [i for i, a in enumerate(axes) if a not in "YX"]

        def read(x0: int, y0: int, width: int, height: int) -> np.ndarray:
            out = np.full((int(height), int(width), 3), 255, dtype=np.uint8)
            xa, ya = max(0, int(x0)), max(0, int(y0))
            xb, yb = min(img_w, int(x0) + int(width)), min(img_h, int(y0) + int(height))
            if xb > xa and yb > ya:
                index = tuple(slice(ya, yb) if ax == "Y" else slice(xa, xb) if ax == "X" else slice(None)
                              for ax in axes)
                block = np.transpose(np.asarray(arr[index]), order).reshape(yb - ya, xb - xa, -1)[..., :3]
                out[ya - int(y0):yb - int(y0), xa - int(x0):xb - int(x0)] = block
            return out

        yield read


def read_he_region(path: str | Path, x0: int, y0: int, width: int, height: int,
                   reader: str = "openslide") -> np.ndarray:
    """RGB uint8 array of one level-0 region (outside the image: white), read with openslide or tifffile.

    Parameters
    ----------
    path : str or Path
        The H&E image.
    x0, y0 : int
        Top-left corner of the region, level-0 pixels (may lie outside the image).
    width, height : int
        The region's size in pixels.
    reader : {"openslide", "tifffile"}, default "openslide"
        The library that reads the image.

    Returns
    -------
    ndarray of shape (height, width, 3), uint8
        The region.
    """
    with he_region_reader(path, reader) as read:
        return read(x0, y0, width, height)


def overlay_png(cells: pd.DataFrame, slide: str | Path, out: str | Path, mpp: float, reader: str = "openslide",
                n_regions: int = 20, region_um: float = 80.0, tile_px: int = 192, seed: int = 0,
                coarse_classes: Sequence[str] | None = None, title: str | None = None) -> Path:
    """Write a PNG grid of ``n_regions`` H&E crops (``region_um`` wide, centred on randomly drawn cells)
    with every registered nucleus centre (``he_x``, ``he_y``) drawn on it; returns the path.

    Dots are coloured by coarse class (grey: unlabelled), each with a 3-µm ring; five crops per row.

    Parameters
    ----------
    cells : DataFrame
        Registered cells with ``he_x``, ``he_y`` (level-0 pixels) and optionally ``label_coarse`` (class code).
    slide : str or Path
        The H&E image.
    out : str or Path
        The PNG to write (atomically).
    mpp : float
        The image's µm/px.
    reader : {"openslide", "tifffile"}, default "openslide"
        The library that reads the image.
    n_regions : int, default 20
        Number of crops (at most one per cell).
    region_um : float, default 80.0
        Side of each crop in µm.
    tile_px : int, default 192
        Side of each crop in the PNG, pixels.
    seed : int, default 0
        Random seed of the draw of the crops' cells.
    coarse_classes : sequence of str, optional
        The coarse class names, in code order, for the legend (drawn only with a ``title``).
    title : str, optional
        A header line above the grid.

    Returns
    -------
    Path
        ``out``.

    Raises
    ------
    FmauditInputError
        When ``cells`` is empty.
    """
    if len(cells) == 0:
        raise FmauditInputError(f"{out}: no registered cells to draw")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(cells), size=min(int(n_regions), len(cells)), replace=False)
    side = max(8, int(round(region_um / mpp)))
    scale = tile_px / side
    cols = min(5, len(picks))
    rows = math.ceil(len(picks) / cols)
    header = 18 if title else 0
    sheet = Image.new("RGB", (cols * tile_px, rows * tile_px + header), (255, 255, 255))
    draw_sheet = ImageDraw.Draw(sheet)
    if title:
        draw_sheet.text((4, 3), title, fill=(0, 0, 0))
    hx, hy = cells["he_x"].to_numpy(), cells["he_y"].to_numpy()
    coarse = (cells["label_coarse"].to_numpy(dtype=object, na_value=None) if "label_coarse" in cells
              else [None] * len(cells))
    ring = max(2.0, 3.0 / mpp * scale)
    with he_region_reader(slide, reader) as read:
        crops = []
        for i in picks:
            x0, y0 = int(math.floor(hx[i] - side / 2)), int(math.floor(hy[i] - side / 2))
            crops.append((x0, y0, read(x0, y0, side, side)))
    for k, (x0, y0, pixels) in enumerate(crops):
        crop = Image.fromarray(pixels).resize((tile_px, tile_px), Image.BILINEAR)
        draw = ImageDraw.Draw(crop)
        near = np.flatnonzero((hx >= x0) & (hx < x0 + side) & (hy >= y0) & (hy < y0 + side))
        for j in near:
            # a pixel-centre-free continuous coordinate: the crop pixel u covers [x0 + u, x0 + u + 1)
            u, v = (hx[j] - x0) * scale, (hy[j] - y0) * scale
            c = _PALETTE[int(coarse[j]) % len(_PALETTE)] if coarse[j] is not None else _UNLABELLED
            draw.ellipse((u - ring, v - ring, u + ring, v + ring), outline=c, width=1)
            draw.ellipse((u - 1.5, v - 1.5, u + 1.5, v + 1.5), fill=c)
        sheet.paste(crop, ((k % cols) * tile_px, header + (k // cols) * tile_px))
    if coarse_classes and title:
        # legend right-aligned in the header: each coarse class name in its colour, then "unlabelled"
        entries = [(str(name), _PALETTE[i % len(_PALETTE)]) for i, name in enumerate(coarse_classes)]
        entries.append(("unlabelled", _UNLABELLED))
        x = cols * tile_px - 4
        for name, colour in reversed(entries):
            x -= int(draw_sheet.textlength(name)) + 10
            draw_sheet.text((x, 3), name, fill=colour)
    out = Path(out)
    with atomic_path(out, suffix=".png") as tmp:
        sheet.save(tmp, format="PNG", compress_level=3)
    return out


def section_eligibility(manifest: pd.DataFrame,
                        min_cells_per_class: int = 10) -> tuple[bool, str | None, dict[str, dict[str, int]]]:
    """(eligible, reason, counts): a section is eligible with >= 2 valid classes in each taxonomy.

    ``counts`` holds the labelled cells per class name of each taxonomy (``fine``, ``coarse``).

    Parameters
    ----------
    manifest : DataFrame
        A cell manifest with ``label_fine_name`` and ``label_coarse_name`` (NA: unlabelled).
    min_cells_per_class : int, default 10
        A class is valid with at least this many labelled cells.

    Returns
    -------
    eligible : bool
        Whether both taxonomies have at least two valid classes.
    reason : str or None
        Why not (the valid classes and the counts per class of each failing taxonomy); None when eligible.
    counts : dict of str to dict of str to int
        ``{"fine": {class name: n}, "coarse": {...}}``, labelled cells per class.
    """
    counts: dict[str, dict[str, int]] = {}
    reasons = []
    for tax in ("fine", "coarse"):
        names = manifest[f"label_{tax}_name"].dropna()
        per = {str(k): int(v) for k, v in names.value_counts().sort_index().items()}
        counts[tax] = per
        valid = [k for k, v in per.items() if v >= int(min_cells_per_class)]
        if len(valid) < 2:
            reasons.append(f"{len(valid)} valid {tax} class(es) (>= {min_cells_per_class} labelled cells each; "
                           f"labelled cells per class: {per or 'none'})")
    if reasons:
        return False, "fewer than two valid classes: " + "; ".join(reasons), counts
    return True, None, counts
