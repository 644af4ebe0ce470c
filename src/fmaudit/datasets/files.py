"""Whether a manifest's files can be read, checked before the first embedding: image headers, decoded pixels, slides.

Three checks, each returning its problems (one line per unreadable file, naming the file, the item and, for a
user's sheet, its line) and a line saying what it read:

- :func:`check_image_headers`: every image file of the manifest opened and its header parsed (PIL reads no
  pixels for it): a missing, empty, truncated-header or non-image file fails here, cheaply.
- :func:`check_image_decode`: a seeded sample of the image files fully decoded to RGB: a file whose header is
  fine but whose pixel data are truncated or corrupt fails here (one outside the sample fails in its embedding
  job, naming the file).
- :func:`check_slides`: every slide of the manifest's tiles opened with openslide and its first listed tile
  read at its level.

Image files are the rows without ``x``; slide tiles have ``x``, ``y``, ``level`` and ``size``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from fmaudit.datasets.sheets import LINE_COLUMN
from fmaudit.io import FmauditInputError
from fmaudit.slides import open_slide, read_tile

__all__ = ["check_image_decode", "check_image_headers", "check_slides", "image_files", "slide_files"]

_READ_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, FmauditInputError,
                Image.DecompressionBombError)


def image_files(manifest: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct image file of the manifest (rows without ``x``), the first item naming it.

    Parameters
    ----------
    manifest : DataFrame
        A manifest; rows with ``x`` (slide tiles) are left out.

    Returns
    -------
    DataFrame
        The first row of each distinct ``source``, index reset.
    """
    rows = manifest[manifest["x"].isna()] if "x" in manifest.columns else manifest
    return rows.drop_duplicates("source").reset_index(drop=True)


def slide_files(manifest: pd.DataFrame) -> pd.DataFrame:
    """One row per slide of the manifest's tiles, with its first tile.

    Parameters
    ----------
    manifest : DataFrame
        A manifest; only rows with ``x`` (slide tiles) count.

    Returns
    -------
    DataFrame
        The first tile row of each distinct ``source``, index reset (no rows when the manifest has no tiles).
    """
    if "x" not in manifest.columns:
        return manifest.iloc[0:0]
    return manifest[manifest["x"].notna()].drop_duplicates("source").reset_index(drop=True)


def _where(row: pd.Series) -> str:
    parts = [f"item {row['item_id']!r}"]
    if LINE_COLUMN in row.index and pd.notna(row.get(LINE_COLUMN)):
        sheet = f" of {row['sheet']}" if "sheet" in row.index and pd.notna(row.get("sheet")) else ""
        parts.append(f"line {int(row[LINE_COLUMN])}{sheet}")
    return ", ".join(parts)


def _run(files: pd.DataFrame, read: Callable[[pd.Series], None], what: str, workers: int) -> list[str]:
    def one(i: int) -> str | None:
        row = files.iloc[i]
        try:
            read(row)
        except FileNotFoundError:
            return f"{row['source']}: no such file ({_where(row)})"
        except _READ_ERRORS as e:
            return f"{row['source']}: {what} ({type(e).__name__}: {e}) ({_where(row)})"
        return None

    if workers <= 1 or len(files) < 64:
        found = [one(i) for i in range(len(files))]
    else:  # opening files is I/O bound: threads overlap the waits
        with ThreadPoolExecutor(max_workers=workers) as pool:
            found = list(pool.map(one, range(len(files)), chunksize=64))
    return [p for p in found if p is not None]


def _header(row: pd.Series) -> None:
    path = Path(str(row["source"]))
    if not path.is_file():
        raise FileNotFoundError(path)
    with Image.open(path) as im:
        if im.size[0] <= 0 or im.size[1] <= 0:
            raise ValueError(f"image size {im.size}")


def _decode(row: pd.Series) -> None:
    path = Path(str(row["source"]))
    if not path.is_file():
        raise FileNotFoundError(path)
    with Image.open(path) as im:
        im.convert("RGB").load()


def check_image_headers(manifest: pd.DataFrame, workers: int = 4) -> tuple[list[str], str]:
    """Every image file's header (see the module doc): ``(problems, what was checked)``.

    Parameters
    ----------
    manifest : DataFrame
        A data set's manifest (``source``, ``item_id``, and ``x`` for slide tiles; ``sheet`` and the sheet line, where
        present, are named in the problems).
    workers : int
        Threads that open files at once (default 4); 1 or fewer, or fewer than 64 files, reads in this thread.

    Returns
    -------
    tuple of (list of str, str)
        The problems, one line per unreadable file (``<source>: <what> (<error>) (item ..., line ... of <sheet>)``),
        empty when all read; and a line saying what was checked, for the log.
    """
    files = image_files(manifest)
    problems = _run(files, _header, "not a readable image", workers)
    return problems, f"{len(files)} image file header(s) read"


def check_image_decode(manifest: pd.DataFrame, sample: int, seed: int, workers: int = 4) -> tuple[list[str], str]:
    """A seeded sample of ``sample`` image files fully decoded (all of them when fewer): ``(problems, what)``.

    Parameters
    ----------
    manifest : DataFrame
        A data set's manifest (``source``, ``item_id``, and ``x`` for slide tiles; ``sheet`` and the sheet line, where
        present, are named in the problems).
    sample : int
        Number of distinct image files to decode.
    seed : int
        Seed of ``np.random.default_rng`` that picks them.
    workers : int
        Threads that open files at once (default 4); 1 or fewer, or fewer than 64 files, reads in this thread.

    Returns
    -------
    tuple of (list of str, str)
        The problems, one line per unreadable file (``<source>: <what> (<error>) (item ..., line ... of <sheet>)``),
        empty when all read; and a line saying what was checked, for the log.
    """
    files = image_files(manifest)
    n = min(int(sample), len(files))
    rng = np.random.default_rng(int(seed))
    picked = files.iloc[np.sort(rng.choice(len(files), size=n, replace=False))] if n else files.iloc[0:0]
    problems = _run(picked.reset_index(drop=True), _decode, "its pixels cannot be decoded", workers)
    return problems, f"{n} of {len(files)} image file(s) fully decoded (seeded sample, seed {int(seed)})"


def _slide(row: pd.Series) -> None:
    with open_slide(str(row["source"])) as slide:
        read_tile(str(row["source"]), int(row["x"]), int(row["y"]), int(row["level"]), int(row["size"]), slide=slide)


def check_slides(manifest: pd.DataFrame, workers: int = 2) -> tuple[list[str], str]:
    """Every slide of the manifest opened with openslide and its first tile read: ``(problems, what)``.

    Parameters
    ----------
    manifest : DataFrame
        A data set's manifest (``source``, ``item_id``, and ``x`` for slide tiles; ``sheet`` and the sheet line, where
        present, are named in the problems).
    workers : int
        Threads that open files at once (default 2); 1 or fewer, or fewer than 64 files, reads in this thread.

    Returns
    -------
    tuple of (list of str, str)
        The problems, one line per unreadable file (``<source>: <what> (<error>) (item ..., line ... of <sheet>)``),
        empty when all read; and a line saying what was checked, for the log.
    """
    files = slide_files(manifest)
    problems = _run(files, _slide, "openslide cannot read it", workers)
    return problems, f"{len(files)} slide(s) opened with openslide, one tile of each read"

