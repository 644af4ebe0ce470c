"""Shared fixtures: the real demo slide and synthetic pyramidal TIFFs that openslide reads as generic TIFF."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

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


@pytest.fixture
def real_slide_path() -> Path:
    """The real one-level Aperio slide shipped in resources/data (0.499 µm/px, 2220×2967 px)."""
    assert REAL_SLIDE.exists(), f"missing test slide {REAL_SLIDE}"
    return REAL_SLIDE


@pytest.fixture
def make_pyramid(tmp_path) -> Callable[..., Path]:
    """Factory ``make_pyramid(name, level0, n_levels=3, mpp=0.25, tile=64) -> path`` writing a pyramid
    TIFF under tmp_path and checking that openslide sees every level."""
    import openslide

    def make(name: str, level0: np.ndarray, n_levels: int = 3, mpp: float | None = 0.25, tile: int = 64) -> Path:
        path = tmp_path / name
        write_pyramid_tiff(path, level0, n_levels=n_levels, mpp=mpp, tile=tile)
        with openslide.OpenSlide(str(path)) as slide:
            assert slide.level_count == n_levels, "openslide did not see the pyramid levels"
            assert slide.properties.get("openslide.vendor") == "generic-tiff"
        return path

    return make


# the blob of the synthetic tissue slide, in level-0 pixels: (x0, y0, x1, y1), aligned to a 64-px grid
BLOB_BOX = (256, 384, 768, 704)


@pytest.fixture
def blob_box() -> tuple[int, int, int, int]:
    """Where the tissue of ``blob_slide`` lies: (x0, y0, x1, y1) in level-0 pixels."""
    return BLOB_BOX


@pytest.fixture
def blob_slide(make_pyramid) -> Path:
    """1024×1024 px, 0.25 µm/px, 3-level slide: glass with one rectangular tissue blob at ``BLOB_BOX``."""
    img = glass(1024, 1024, seed=1).astype(np.int16)
    x0, y0, x1, y1 = BLOB_BOX
    rng = np.random.default_rng(2)
    blob = np.array(TISSUE_RGB, dtype=np.int16) + rng.integers(-20, 21, size=(y1 - y0, x1 - x0, 1))
    img[y0:y1, x0:x1] = blob
    return make_pyramid("blob.tif", np.clip(img, 0, 255).astype(np.uint8))


@pytest.fixture
def empty_slide(make_pyramid) -> Path:
    """A slide of bare glass: no tissue anywhere."""
    return make_pyramid("empty.tif", glass(512, 512, seed=3))
