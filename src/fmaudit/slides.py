"""Whole-slide images through openslide: level choice by µm/px, tissue detection, tile coordinates."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from fmaudit.io import FmauditInputError


def open_slide(path: str | Path):
    """Open a slide with openslide; a truncated or unreadable file raises FmauditInputError naming it."""
    import openslide

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: slide not found")
    try:
        return openslide.OpenSlide(str(path))
    except (openslide.OpenSlideError, openslide.OpenSlideUnsupportedFormatError) as e:
        raise FmauditInputError(f"{path}: unreadable slide ({e})") from e


def read_tile(slide_path: str | Path, x: int, y: int, level: int, size: int, slide=None) -> Image.Image:
    """RGB tile of ``size``×``size`` pixels at ``level`` whose top-left is (x, y) in level-0 pixels."""
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
