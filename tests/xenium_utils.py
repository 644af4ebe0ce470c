"""Small Xenium sections for the tests, written without fmaudit's code: a painted H&E image, a known affine,
and a bundle laid out as 10x ships it (experiment.xenium, cells table, nucleus polygons, cells.zarr.zip).

The references here are independent re-implementations (forward affine, disc polygons, the cell-id letters),
so the tests compare fmaudit's readers against them rather than against themselves.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

PIXEL_SIZE = 0.2125
BACKGROUND_RGB = (236, 226, 236)
NUCLEUS_RGB = (70, 40, 120)


def affine(rotation_deg: float, scale: float, tx: float, ty: float, flip: bool = False) -> np.ndarray:
    """H&E px -> Xenium px: optional mirror of x, then scale and rotation, then translation."""
    t = math.radians(rotation_deg)
    rot = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]]) * scale
    if flip:
        rot = rot @ np.array([[-1.0, 0.0], [0.0, 1.0]])
    return np.array([[rot[0, 0], rot[0, 1], tx], [rot[1, 0], rot[1, 1], ty], [0.0, 0.0, 1.0]])


def forward_um(x_px, y_px, matrix: np.ndarray, pixel_size: float = PIXEL_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Xenium µm of H&E pixel coordinates, written out element by element (the reference forward map)."""
    x_px, y_px = np.asarray(x_px, float), np.asarray(y_px, float)
    xe = matrix[0, 0] * x_px + matrix[0, 1] * y_px + matrix[0, 2]
    ye = matrix[1, 0] * x_px + matrix[1, 1] * y_px + matrix[1, 2]
    return xe * pixel_size, ye * pixel_size


def xenium_id(i: int, suffix: int = 1) -> str:
    """The i-th Xenium string id: 8 hex digits of i written with the letters a-p, then -suffix."""
    digits = f"{i:08x}"
    return "".join(chr(ord("a") + int(d, 16)) for d in digits) + f"-{suffix}"


def disc_ring(cx: float, cy: float, r: float, k: int = 32, clockwise: bool = False) -> np.ndarray:
    """Closed regular k-gon (first vertex repeated) around (cx, cy): its area centroid is (cx, cy)."""
    t = np.linspace(0, 2 * np.pi, k, endpoint=False)
    if clockwise:
        t = -t
    ring = np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=1)
    return np.vstack([ring, ring[:1]])


@dataclass
class Section:
    folder: Path
    bundle: Path
    he_image: Path
    alignment: Path
    matrix: np.ndarray
    # cell_id, painted_x, painted_y (H&E px), nucleus_x_um, nucleus_y_um, cell_x_um, cell_y_um, label
    truth: pd.DataFrame
    cell_types: Path | None = None
    extra: dict = field(default_factory=dict)


def paint_image(width: int, height: int, centres: np.ndarray, radius: float) -> np.ndarray:
    """Background with filled discs (pixel (c, r) is painted when its centre (c+0.5, r+0.5) is in a disc)."""
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[:] = BACKGROUND_RGB
    yy, xx = np.mgrid[0:height, 0:width]
    for cx, cy in centres:
        img[(xx + 0.5 - cx) ** 2 + (yy + 0.5 - cy) ** 2 <= radius ** 2] = NUCLEUS_RGB
    return img


def write_ome_tiff(path: Path, rgb: np.ndarray, mpp: float | None, tiled: bool = True, subifds: bool = True) -> None:
    """An OME-TIFF as 10x ships post-Xenium H&E images (tiled, SubIFD pyramid, OME PhysicalSizeX)."""
    import tifffile

    levels = [rgb, rgb[::2, ::2].copy()] if subifds else [rgb]
    kwargs = {"tile": (64, 64)} if tiled else {"rowsperstrip": 16}
    meta = {"axes": "YXS"}
    if mpp is not None:
        meta.update(PhysicalSizeX=mpp, PhysicalSizeXUnit="µm", PhysicalSizeY=mpp, PhysicalSizeYUnit="µm")
    with tifffile.TiffWriter(str(path), ome=True) as tw:
        tw.write(levels[0], subifds=len(levels) - 1 or None, photometric="rgb", compression="zlib", metadata=meta,
                 **kwargs)
        for level in levels[1:]:
            tw.write(level, subfiletype=1, photometric="rgb", compression="zlib", **kwargs)


def write_cells_zarr(path: Path, ids: list[str], columns: dict[str, np.ndarray], string_ids: bool = True,
                     column_names: bool = True, spatial_units: str | None = "microns") -> None:
    """cells.zarr.zip with ``cell_id`` and ``cell_summary`` as XOA writes them (zarr format 2, in a zip)."""
    import zarr

    store = zarr.storage.ZipStore(str(path), mode="w")
    attrs = {"spatial_units": spatial_units} if spatial_units is not None else {}
    root = zarr.open_group(store=store, mode="w", zarr_format=2, attributes=attrs)
    if string_ids:
        arr = np.array([[int("".join(format(ord(c) - ord("a"), "x") for c in cid.split("-")[0]), 16),
                         int(cid.split("-")[1])] for cid in ids], dtype=np.uint32)
    else:
        arr = np.array([int(c) for c in ids], dtype=np.uint32)
    root.create_array("cell_id", data=arr)
    values = np.stack(list(columns.values()), axis=1).astype(np.float64)
    root.create_array("cell_summary", data=values, attributes={"column_names": list(columns)} if column_names else {})
    store.close()


def make_section(folder: Path, n: int = 24, he_size: tuple[int, int] = (480, 360), mpp: float = 0.5,
                 matrix: np.ndarray | None = None, id_kind: str = "string",
                 cells_format: tuple[str, ...] = ("parquet",),
                 boundaries: str | None = "parquet", label_id: bool = True, zarr: bool = False,
                 labels: list[str] | None = None, radius: float = 5.0, seed: int = 0,
                 tiled: bool = True) -> Section:
    """A section of ``n`` painted nuclei on a grid with jitter, with a known affine (default: rotation 33°,
    scale mpp / pixel_size, translation) and the bundle files asked for."""
    rng = np.random.default_rng(seed)
    width, height = he_size
    cols = int(math.ceil(math.sqrt(n * width / height)))
    rows = int(math.ceil(n / cols))
    gx = (np.arange(cols) + 0.5) * width / cols
    gy = (np.arange(rows) + 0.5) * height / rows
    centres = np.array([(x, y) for y in gy for x in gx])[:n] + rng.uniform(-3, 3, (n, 2))
    if matrix is None:
        matrix = affine(33.0, mpp / PIXEL_SIZE, 4000.0, 2500.0)
    folder.mkdir(parents=True, exist_ok=True)
    bundle = folder / "outs"
    bundle.mkdir(exist_ok=True)
    he = folder / "section_he_image.ome.tif"
    write_ome_tiff(he, paint_image(width, height, centres, radius), mpp, tiled=tiled)
    alignment = folder / "section_he_imagealignment.csv"
    alignment.write_text("\n".join(",".join(f"{v:.17g}" for v in row) for row in matrix) + "\n")
    ids = [xenium_id(1000 + 7 * i) for i in range(n)] if id_kind == "string" else [str(i + 1) for i in range(n)]
    nx, ny = forward_um(centres[:, 0], centres[:, 1], matrix)
    # the cell centroid is off the nucleus centre, as in real data
    cx, cy = nx + rng.uniform(1.0, 2.0, n), ny - rng.uniform(1.0, 2.0, n)
    (bundle / "experiment.xenium").write_text(json.dumps({
        "major_version": 5, "pixel_size": PIXEL_SIZE,
        "analysis_sw_version": "xenium-2.0.0.10" if id_kind == "string" else "xenium-1.0.2"}))
    cells = pd.DataFrame({"cell_id": ids if id_kind == "string" else [int(c) for c in ids],
                          "x_centroid": cx, "y_centroid": cy, "transcript_counts": rng.integers(0, 50, n),
                          "cell_area": 90.0, "nucleus_area": 20.0})
    if "parquet" in cells_format:
        cells.to_parquet(bundle / "cells.parquet", index=False)
    if "csv.gz" in cells_format:
        cells.to_csv(bundle / "cells.csv.gz", index=False)
    if boundaries is not None:
        rows_ = []
        for i, (x, y) in enumerate(centres):
            ring = disc_ring(x, y, radius, clockwise=bool(i % 2))
            vx, vy = forward_um(ring[:, 0], ring[:, 1], matrix)
            part = pd.DataFrame({"cell_id": cells["cell_id"].iloc[i], "vertex_x": vx, "vertex_y": vy})
            if label_id:
                part["label_id"] = i + 1
            rows_.append(part)
        table = pd.concat(rows_, ignore_index=True)
        if boundaries == "parquet":
            table.to_parquet(bundle / "nucleus_boundaries.parquet", index=False)
        else:
            with gzip.open(bundle / "nucleus_boundaries.csv.gz", "wt") as fh:
                table.to_csv(fh, index=False)
    if zarr:
        write_cells_zarr(bundle / "cells.zarr.zip", ids, {
            "cell_centroid_x": cx, "cell_centroid_y": cy, "cell_area": np.full(n, 90.0),
            "nucleus_centroid_x": nx, "nucleus_centroid_y": ny, "nucleus_area": np.full(n, 20.0),
            "z_level": np.zeros(n)}, string_ids=id_kind == "string")
    truth = pd.DataFrame({"cell_id": ids, "painted_x": centres[:, 0], "painted_y": centres[:, 1],
                          "nucleus_x_um": nx, "nucleus_y_um": ny, "cell_x_um": cx, "cell_y_um": cy})
    cell_types = None
    if labels is not None:
        truth["label"] = [labels[i % len(labels)] for i in range(n)]
        cell_types = folder / "cell_types.csv"
        truth[["cell_id", "label"]].to_csv(cell_types, index=False)
    return Section(folder=folder, bundle=bundle, he_image=he, alignment=alignment, matrix=matrix, truth=truth,
                   cell_types=cell_types)
