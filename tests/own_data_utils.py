"""A user's own data, generated: a folder of tiles from two scanners with a labels sheet, labelled pyramidal slides
with QuPath-style GeoJSON annotations, cells on slides, and features another tool computed (HDF5)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from fmaudit.datasets.demo import DOMAINS, _patient, render_tile
from slide_utils import GLASS_RGB, write_pyramid_tiff

TILE_CLASSES = ("tumour", "stroma", "lymphocytes")
SCANNERS = ("scanner1", "scanner2")


def write_tile_study(root: Path, n_patients: int = 10, size: int = 48, seed: int = 0) -> Path:
    """``root/tiles/<scanner>/<patient>_<class>.png`` (2 scanners x ``n_patients`` patients x 3 classes: 60 tiles
    by default; the scanners acquire like the demo's scanner-a and scanner-b) and ``root/labels.csv``
    (path,label,patient,domain, paths relative to the sheet); returns the sheet's path."""
    rows = []
    for d, scanner in enumerate(SCANNERS):
        domain = DOMAINS[d]
        for p in range(n_patients):
            patient = f"{scanner[0]}{scanner[-1]}-p{p:02d}"
            look = _patient(seed, d, p)
            for c, name in enumerate(TILE_CLASSES):
                rgb = render_tile(c, domain, look, np.random.default_rng([seed, d, p, c]), size)
                rel = Path("tiles") / scanner / f"{patient}_{name}.png"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rgb).save(root / rel)
                rows.append({"path": rel.as_posix(), "label": name, "patient": patient, "domain": scanner})
    sheet = root / "labels.csv"
    pd.DataFrame(rows).to_csv(sheet, index=False)
    return sheet


SLIDE_CLASSES = ("tumour", "stroma", "necrosis")
SITES = ("siteA", "siteB")
# colours of each class's tissue as each site's stain renders it (site B: a stronger, bluer hematoxylin)
_SLIDE_RGB = {"siteA": {"tumour": (150, 60, 150), "stroma": (230, 130, 180), "necrosis": (200, 170, 120)},
              "siteB": {"tumour": (120, 60, 170), "stroma": (210, 120, 200), "necrosis": (180, 160, 140)}}
SLIDE_PX = 384  # level-0 side of a generated slide
TILE_AT_MPP = (64, 1.0)  # tiles of 64 px at 1 µm/px: 128 level-0 px of these 0.5 µm/px slides


def _slide_image(rng: np.random.Generator, colour: tuple[int, int, int], region: tuple[int, int, int, int] | None,
                 region_colour: tuple[int, int, int] | None) -> np.ndarray:
    """Glass with a tissue block (all but a margin) of ``colour``, textured; ``region`` (x0, y0, x1, y1) painted
    in ``region_colour``."""
    img = np.empty((SLIDE_PX, SLIDE_PX, 3), np.float32)
    img[:] = GLASS_RGB
    img[16:-16, 16:-16] = colour
    if region is not None:
        x0, y0, x1, y1 = region
        img[y0:y1, x0:x1] = region_colour
    tissue = np.zeros(img.shape[:2], bool)
    tissue[16:-16, 16:-16] = True
    texture = rng.normal(0, 18, img.shape).astype(np.float32)
    img[tissue] += texture[tissue]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def qupath_geojson(regions: list[tuple[str, list[tuple[float, float]]]]) -> dict:
    """A FeatureCollection as QuPath's "Export objects as GeoJSON" writes it (classification.name)."""
    features = []
    for name, ring in regions:
        coords = [[float(x), float(y)] for x, y in ring] + [[float(ring[0][0]), float(ring[0][1])]]
        features.append({"type": "Feature", "id": f"id-{len(features)}",
                         "geometry": {"type": "Polygon", "coordinates": [coords]},
                         "properties": {"objectType": "annotation", "classification": {"name": name,
                                                                                       "color": [200, 0, 0]}}})
    return {"type": "FeatureCollection", "features": features}


def write_slide_study(root: Path, seed: int = 0) -> Path:
    """18 labelled slides (2 sites x 3 classes x 3 patients, one slide each) under ``root/slides/``: small pyramidal
    TIFFs at 0.5 µm/px. The first patient of each site and class is labelled per slide (``label``); the others by
    QuPath-style GeoJSON annotations (``annotations``): one region of the slide's class over its left part and a
    smaller region of another class, below the share a tile needs, in a corner. Returns ``root/slides.csv``."""
    rows = []
    rng = np.random.default_rng(seed)
    (root / "slides").mkdir(parents=True, exist_ok=True)
    for site in SITES:
        for c, name in enumerate(SLIDE_CLASSES):
            for p in range(3):
                slide = f"{site}-{name}-{p}"
                patient = f"{site}-p{c}{p}"
                other = SLIDE_CLASSES[(c + 1) % 3]
                image = _slide_image(rng, _SLIDE_RGB[site][name], (16, 16, 80, 80), _SLIDE_RGB[site][other])
                path = root / "slides" / f"{slide}.tiff"
                write_pyramid_tiff(path, image, n_levels=2, mpp=0.5, tile=64)
                row = {"path": f"slides/{slide}.tiff", "patient": patient, "domain": site, "slide": slide,
                       "label": "", "annotations": ""}
                if p == 0:
                    row["label"] = name
                else:
                    # the slide's class over x < 300 (whole tiles at 0..256), a 64-px square of another class
                    # in a corner: it covers at most a quarter of a 128-px tile, below min_region_share 0.5
                    geo = qupath_geojson([(name, [(0, 0), (300, 0), (300, SLIDE_PX), (0, SLIDE_PX)]),
                                          (other, [(16, 16), (80, 16), (80, 80), (16, 80)])])
                    (root / "slides" / f"{slide}.geojson").write_text(json.dumps(geo))
                    row["annotations"] = f"slides/{slide}.geojson"
                rows.append(row)
    sheet = root / "slides.csv"
    pd.DataFrame(rows).to_csv(sheet, index=False)
    return sheet


CELL_CLASSES = ("tumour cell", "lymphocyte", "fibroblast")


def write_cell_study(root: Path, seed: int = 0, per_class: int = 24, per_organ: int = 2) -> tuple[Path, Path]:
    """``per_organ`` slides of each of two organs with cells of three classes painted as discs of their class's
    colour, and
    a cell table of their centres in µm (units: um; the slides are 0.5 µm/px); returns (slides sheet, cells
    table)."""
    rng = np.random.default_rng(seed)
    colours = {"tumour cell": (90, 40, 140), "lymphocyte": (40, 40, 90), "fibroblast": (200, 110, 160)}
    (root / "cells").mkdir(parents=True, exist_ok=True)
    slide_rows, cell_rows = [], []
    for organ in ("lung", "colon"):
        for k in range(per_organ):
            slide = f"{organ}-{k}"
            side = 512
            img = np.full((side, side, 3), (235, 225, 235), np.float32)
            yy, xx = np.mgrid[0:side, 0:side]
            n = 0
            for name in CELL_CLASSES:
                for _ in range(per_class):
                    x, y = rng.uniform(24, side - 24, size=2)
                    disc = (xx - x) ** 2 + (yy - y) ** 2 <= 5.0 ** 2
                    img[disc] = colours[name]
                    # in µm: these slides are 0.5 µm/px
                    cell_rows.append({"slide": slide, "cell_id": f"c{n}", "x": round(x * 0.5, 3),
                                      "y": round(y * 0.5, 3), "label": name})
                    n += 1
            img += rng.normal(0, 4, img.shape)
            path = root / "cells" / f"{slide}.tiff"
            write_pyramid_tiff(path, np.clip(np.rint(img), 0, 255).astype(np.uint8), n_levels=2, mpp=0.5, tile=64)
            slide_rows.append({"slide": slide, "path": f"cells/{slide}.tiff", "domain": organ,
                               "patient": f"{organ}-p{k}"})
    slides = root / "cell_slides.csv"
    pd.DataFrame(slide_rows).to_csv(slides, index=False)
    table = root / "cells.csv"
    pd.DataFrame(cell_rows).to_csv(table, index=False)
    return slides, table


def write_feature_study(root: Path, encoder_dims: int = 24, seed: int = 0, n_patients: int = 8) -> tuple[Path, Path]:
    """Features another tool computed: ``root/features.h5`` (``features`` (N, D) float32 and ``item_id`` bytes, as
    WSI tools write them) for tiles of 2 domains x ``n_patients`` patients x 3 classes x 2 tiles, class-separable
    with a domain shift, and ``root/feature_labels.csv`` (item_id,label,patient,domain). Returns both paths."""
    import h5py

    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.5, size=(3, encoder_dims))
    rows, feats = [], []
    for d, domain in enumerate(("hospital1", "hospital2")):
        shift = rng.normal(0, 0.7, size=encoder_dims) * d
        for p in range(n_patients):
            patient = f"h{d + 1}-p{p:02d}"
            for c, name in enumerate(TILE_CLASSES):
                for k in range(2):
                    item = f"{patient}_{name}_{k}"
                    feats.append(centres[c] + shift + rng.normal(0, 1.0, size=encoder_dims))
                    rows.append({"item_id": item, "label": name, "patient": patient, "domain": domain})
    order = rng.permutation(len(rows))  # the file's order is not the sheet's
    path = root / "features.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=np.asarray(feats, np.float32)[order])
        f.create_dataset("item_id", data=np.asarray([rows[i]["item_id"] for i in order], dtype="S"))
        f.create_dataset("coords", data=np.zeros((len(rows), 2), np.int64))
    sheet = root / "feature_labels.csv"
    pd.DataFrame(rows).to_csv(sheet, index=False)
    return path, sheet
