"""Shared fixtures: the real demo slide and synthetic pyramidal TIFFs that openslide reads as generic TIFF."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from slide_utils import GLASS_RGB, REAL_SLIDE, REPO_ROOT, TISSUE_RGB, glass, halve, write_pyramid_tiff  # noqa: F401


@pytest.fixture(autouse=True)
def _fresh_encoder_cache():
    """Each test builds its own encoders: the process's encoder cache (fmaudit.encoders.ENCODER_CACHE, which a
    job uses to load its encoder once for all its outputs) is emptied before it, when something imported it."""
    cache = sys.modules.get("fmaudit.encoders.cache")
    if cache is not None:
        cache.ENCODER_CACHE.clear()
    yield


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
