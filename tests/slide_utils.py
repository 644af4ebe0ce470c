"""Synthetic pyramidal TIFFs that openslide reads as generic TIFF, and the real demo slide's path."""

from __future__ import annotations

from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_SLIDE = REPO_ROOT / "resources" / "data" / "CMU-1-Small-Region.svs"

# H&E-like colours for synthetic slides: glass is near-white and grey, tissue is saturated pink-purple
GLASS_RGB = (238, 236, 240)
TISSUE_RGB = (196, 110, 172)


def halve(image: np.ndarray) -> np.ndarray:
    """2×2 block mean (one pyramid step); odd trailing rows/columns are dropped."""
    h, w = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
    blocks = image[:h, :w].reshape(h // 2, 2, w // 2, 2, -1).astype(np.float32)
    return np.rint(blocks.mean(axis=(1, 3))).astype(np.uint8)


def write_pyramid_tiff(
    path: str | Path,
    level0: np.ndarray,
    n_levels: int = 3,
    mpp: float | None = 0.25,
    tile: int = 64,
) -> list[np.ndarray]:
    """Write a tiled, zlib-compressed RGB pyramid that openslide opens with its generic-TIFF driver.

    Level 0 and then each 2× reduction are consecutive pages of the main IFD chain (openslide's generic
    TIFF layout; SubIFD pyramids are not seen). Resolution tags in pixels per centimetre give openslide an
    ``mpp-x``; ``mpp=None`` writes unit NONE, so the slide has no resolution. Returns the level arrays.
    """
    import tifffile

    levels = [np.ascontiguousarray(level0, dtype=np.uint8)]
    for _ in range(n_levels - 1):
        levels.append(halve(levels[-1]))
    with tifffile.TiffWriter(str(path)) as tw:
        for i, img in enumerate(levels):
            if mpp is None:
                res, unit = (1.0, 1.0), "NONE"
            else:
                per_cm = 1e4 / (mpp * 2**i)
                res, unit = (per_cm, per_cm), "CENTIMETER"
            tw.write(
                img,
                tile=(tile, tile),
                photometric="rgb",
                compression="zlib",
                resolution=res,
                resolutionunit=unit,
                subfiletype=0 if i == 0 else 1,
            )
    return levels


def glass(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Blank glass with mild sensor noise (no tissue)."""
    rng = np.random.default_rng(seed)
    img = np.empty((height, width, 3), dtype=np.float32)
    img[:] = GLASS_RGB
    img += rng.normal(0, 2.0, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)
