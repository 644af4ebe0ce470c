"""Region annotations of a slide (GeoJSON as QuPath exports it) and the label each tile takes from them.

Conventions
- The file is a GeoJSON ``FeatureCollection``, a list of ``Feature`` objects (QuPath's older "Export as
  GeoJSON" writes a bare list) or one ``Feature``. Coordinates are level-0 pixels of the slide, x right, y down
  (QuPath's image coordinates).
- A region is a ``Polygon`` or ``MultiPolygon`` feature; its class is ``properties.classification.name``
  (QuPath), else ``properties.name``. Holes (inner rings) are not part of the region. Features of other
  geometry types (points, lines) and features without a class are left out and counted.
- A tile takes the class whose regions cover at least ``min_share`` of its area (the largest share where two
  classes do); a tile no class covers that far has no label. Shares are computed on a rasterised mask of each
  class, over the bounding box of its regions only, at a resolution where a tile spans at least 32 mask pixels a
  side, with the exact rectangle mean of :func:`fmaudit.slides.rect_fraction`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw

from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import unknown_name_error
from fmaudit.slides import rect_fraction

__all__ = ["Regions", "read_regions", "region_shares", "tile_labels"]

#: Mask pixels a tile spans per side, at least, when region shares are rasterised (a share is then exact to about
#: 1/32 of a tile side per region edge crossing it).
MASK_PIXELS_PER_TILE = 32


@dataclass
class Regions:
    """The class regions of one annotation file: ``polygons[class] = [(exterior ring, [holes])]`` in level-0 px.

    Parameters
    ----------
    path : str
        The annotation file the regions were read from.
    polygons : dict
        Class name -> list of ``(exterior, holes)``: the exterior ring an ndarray of shape (n_points, 2) of level-0 (x,
        y) pixels, the holes a list of such rings.
    skipped_geometry : int
        Features left out for a geometry other than Polygon/MultiPolygon.
    skipped_unclassified : int
        Polygon features left out for having no class.
    """

    path: str
    polygons: dict[str, list[tuple[np.ndarray, list[np.ndarray]]]] = field(default_factory=dict)
    skipped_geometry: int = 0
    skipped_unclassified: int = 0

    @property
    def classes(self) -> list[str]:
        """The class names that have at least one region, sorted.


        """
        return sorted(self.polygons)


def _features(data: Any, path: str) -> list[Mapping[str, Any]]:
    if isinstance(data, list):
        return data
    if isinstance(data, Mapping) and data.get("type") == "FeatureCollection":
        return list(data.get("features") or [])
    if isinstance(data, Mapping) and data.get("type") == "Feature":
        return [data]
    raise FmauditInputError(f"{path}: not GeoJSON annotations (a FeatureCollection, a list of features or a "
                            "Feature)")


def _class_name(props: Mapping[str, Any]) -> str | None:
    cls = props.get("classification")
    if isinstance(cls, Mapping) and cls.get("name"):
        return str(cls["name"])
    if isinstance(cls, str) and cls:
        return cls
    return str(props["name"]) if props.get("name") else None


def _ring(coords: Any, path: str, index: int) -> np.ndarray:
    ring = np.asarray(coords, dtype=np.float64)
    if ring.ndim != 2 or ring.shape[0] < 3 or ring.shape[1] < 2 or not np.isfinite(ring).all():
        raise FmauditInputError(f"{path}: feature {index}: a polygon ring needs at least 3 finite (x, y) points")
    return ring[:, :2]


def read_regions(path: PathLike, classes: Sequence[str] | None = None) -> Regions:
    """The class regions of a GeoJSON file; a class name outside ``classes`` is an error naming the file, the
    feature and the close spellings.

    Parameters
    ----------
    path : str or Path
        A GeoJSON file (UTF-8, with or without byte-order mark).
    classes : sequence of str, optional
        The data set's classes; None accepts any class name.

    Returns
    -------
    Regions
        The regions by class, with the counts of features left out.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When the file is not valid JSON or GeoJSON, a feature is not an object, a ring has fewer than 3 finite points,
        or regions have classes outside ``classes`` (all of them listed, up to 10).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: annotation file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FmauditInputError(f"{path}: not valid JSON ({e})") from e
    regions = Regions(str(path))
    unknown: list[str] = []
    for i, feature in enumerate(_features(data, str(path))):
        if not isinstance(feature, Mapping):
            raise FmauditInputError(f"{path}: feature {i} is not a GeoJSON object")
        geometry = feature.get("geometry") or {}
        kind = geometry.get("type")
        if kind not in ("Polygon", "MultiPolygon"):
            regions.skipped_geometry += 1
            continue
        name = _class_name(feature.get("properties") or {})
        if name is None:
            regions.skipped_unclassified += 1
            continue
        if classes is not None and name not in classes:
            unknown.append(f"feature {i}: " + str(unknown_name_error("class", name, list(classes)).args[0]))
            continue
        polys = [geometry.get("coordinates")] if kind == "Polygon" else list(geometry.get("coordinates") or [])
        for rings in polys:
            if not rings:
                continue
            exterior = _ring(rings[0], str(path), i)
            holes = [_ring(r, str(path), i) for r in rings[1:]]
            regions.polygons.setdefault(name, []).append((exterior, holes))
    if unknown:
        shown = "\n".join(f"  - {u}" for u in unknown[:10])
        raise FmauditInputError(f"{path}: {len(unknown)} region(s) of a class outside the data set's classes:\n"
                                f"{shown}")
    return regions


def region_shares(regions: Regions, width: int, height: int, x: np.ndarray, y: np.ndarray, extent: float
                  ) -> dict[str, np.ndarray]:
    """Share of each tile (level-0 top-left ``x``, ``y``, side ``extent`` level-0 px) covered by each class.

    Parameters
    ----------
    regions : Regions
        The slide's class regions (:func:`read_regions`).
    width, height : int
        The slide's level-0 size in pixels; masks are clipped to it.
    x, y : ndarray of shape (n_tiles,)
        Level-0 pixel coordinates of each tile's top-left corner.
    extent : float
        Tile side in level-0 pixels (the same for every tile).

    Returns
    -------
    dict of str to ndarray
        Class name -> ndarray of shape (n_tiles,), the share of each tile's area in [0, 1] covered by that class's
        regions (holes excluded).
    """
    scale = max(1.0, float(extent) / MASK_PIXELS_PER_TILE)  # level-0 px per mask pixel
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    shares = {}
    for name, polys in regions.polygons.items():
        # the class's bounding box, within the slide: the mask covers only it (a slide may be 100,000 px wide)
        points = np.concatenate([exterior for exterior, _ in polys])
        x0, y0 = np.clip(np.floor(points.min(axis=0)), 0, [width, height])
        x1, y1 = np.clip(np.ceil(points.max(axis=0)), 0, [width, height])
        mask_w, mask_h = max(1, int(np.ceil((x1 - x0) / scale))), max(1, int(np.ceil((y1 - y0) / scale)))
        canvas = Image.new("1", (mask_w, mask_h), 0)
        draw = ImageDraw.Draw(canvas)
        for exterior, holes in polys:
            draw.polygon([tuple(p) for p in (exterior - [x0, y0]) / scale], fill=1)
            for hole in holes:
                draw.polygon([tuple(p) for p in (hole - [x0, y0]) / scale], fill=0)
        mask = np.asarray(canvas, dtype=np.float32)
        u, v = (x - x0) / scale, (y - y0) / scale
        side = float(extent) / scale
        shares[name] = rect_fraction(mask, u, v, u + side, v + side)
    return shares


def tile_labels(regions: Regions, width: int, height: int, x: np.ndarray, y: np.ndarray, extent: float,
                min_share: float) -> tuple[np.ndarray, np.ndarray]:
    """``(class name or None, its share)`` of every tile (see the module doc).

    Parameters
    ----------
    regions : Regions
        The slide's class regions (:func:`read_regions`).
    width, height : int
        The slide's level-0 size in pixels; masks are clipped to it.
    x, y : ndarray of shape (n_tiles,)
        Level-0 pixel coordinates of each tile's top-left corner.
    extent : float
        Tile side in level-0 pixels (the same for every tile).
    min_share : float
        Share of a tile's area a class must cover for the tile to take it, in (0, 1].

    Returns
    -------
    tuple of (ndarray, ndarray)
        Object array of shape (n_tiles,) with the class name or None, and float array of shape (n_tiles,) with the
        largest class's share (0 where the slide has no regions).
    """
    shares = region_shares(regions, width, height, x, y, extent)
    n = len(np.asarray(x))
    if not shares:
        return np.full(n, None, dtype=object), np.zeros(n)
    names = list(shares)
    stack = np.stack([shares[k] for k in names])  # (classes, tiles)
    best = stack.argmax(axis=0)
    share = stack[best, np.arange(n)]
    labels = np.asarray(names, dtype=object)[best]
    labels[share < float(min_share)] = None
    return labels, share
