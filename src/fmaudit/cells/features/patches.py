"""Patch geometry: a magnification's µm/px, the pyramid level and read size of a patch, the patch of each cell,
and the dataset that reads the patches (the rules are :mod:`fmaudit.cells.features`'s module doc)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from fmaudit.io import FmauditInputError
from fmaudit.slides import open_slide, read_tile


def magnification_mpp(magnification: float) -> float:
    """µm/px of an objective magnification: 10 / m (40x 0.25, 20x 0.5, 10x 1.0).

    Parameters
    ----------
    magnification : float
        Objective magnification m (e.g. 40, 20, 10); a positive finite number.

    Returns
    -------
    float
        The target resolution in µm per pixel, ``10 / m``.

    Raises
    ------
    FmauditInputError
        When ``magnification`` is not a positive finite number.
    """
    m = float(magnification)
    if not np.isfinite(m) or m <= 0:
        raise FmauditInputError(f"magnification must be a positive number, got {magnification!r}")
    return 10.0 / m


@dataclass(frozen=True)
class PatchGeometry:
    """How patches of one slide are read at one magnification (see :mod:`fmaudit.cells.features`).

    Parameters
    ----------
    level : int
        The pyramid level the patches are read from (0 = full resolution).
    level_downsample : float
        The level's downsample: level pixels -> level-0 pixels.
    read_size : int
        Patch side in pixels of ``level``, ``round(input_size * target_mpp / level_mpp)``.
    input_size : int
        Patch side in pixels the encoder sees (its data config's input size).
    slide_mpp : float
        The slide's level-0 µm/px.
    target_mpp : float
        The magnification's µm/px (:func:`magnification_mpp`).
    """

    level: int
    level_downsample: float  # level pixels -> level-0 pixels
    read_size: int  # patch side in pixels of ``level``
    input_size: int  # patch side the encoder sees
    slide_mpp: float  # level-0 µm/px
    target_mpp: float

    @property
    def level_mpp(self) -> float:
        """µm/px of the level read, ``slide_mpp * level_downsample``.
        """
        return self.slide_mpp * self.level_downsample

    @property
    def effective_mpp(self) -> float:
        """µm/px the encoder sees after the resize, ``read_size * level_mpp / input_size``.
        """
        return self.read_size * self.level_mpp / self.input_size

    @property
    def resampling(self) -> str:
        """``none`` when ``read_size == input_size``, else ``downsample`` (read larger, shrunk) or ``upsample``.
        """
        if self.read_size == self.input_size:
            return "none"
        return "downsample" if self.read_size > self.input_size else "upsample"

    def as_dict(self) -> dict[str, Any]:
        """The geometry as provenance: the fields with the derived values, JSON-ready.

        Returns
        -------
        dict
            Keys ``level``, ``level_downsample``, ``read_size``, ``input_size``, ``slide_mpp``, ``target_mpp``,
            ``level_mpp``, ``effective_mpp``, ``resampling`` and ``patch_field_um`` (the patch side in µm).
        """
        return {"level": self.level, "level_downsample": self.level_downsample, "read_size": self.read_size,
                "input_size": self.input_size, "slide_mpp": self.slide_mpp, "target_mpp": self.target_mpp,
                "level_mpp": self.level_mpp, "effective_mpp": self.effective_mpp, "resampling": self.resampling,
                "patch_field_um": self.read_size * self.level_mpp}


def plan_geometry(slide_mpp: float, level_downsamples: Sequence[float], target_mpp: float,
                  input_size: int, rel_tol: float = 0.05, name: str = "slide") -> PatchGeometry:
    """Level and read size for ``target_mpp`` (arrays in: the slide's level-0 µm/px and level downsamples).

    Same level rule as :func:`fmaudit.slides.choose_level`: the coarsest level at or below the target
    (``rel_tol`` above counts as at), else level 0 with an upsampling warning.

    Parameters
    ----------
    slide_mpp : float
        The slide's level-0 µm/px (the cell manifest's ``mpp``, which the registration used).
    level_downsamples : sequence of float
        Downsample of each pyramid level relative to level 0 (openslide's ``level_downsamples``).
    target_mpp : float
        The µm/px to read at (:func:`magnification_mpp`).
    input_size : int
        Patch side in pixels the encoder sees.
    rel_tol : float, default 0.05
        Relative tolerance: a level up to ``target_mpp * (1 + rel_tol)`` counts as at the target.
    name : str, default "slide"
        The slide's name in the warning.

    Returns
    -------
    PatchGeometry
        The chosen level and the patch's read size in that level's pixels.

    Warns
    -----
    UserWarning
        When even the finest level is coarser than the target, so the patches are upsampled.
    """
    mpps = [float(slide_mpp) * float(d) for d in level_downsamples]
    at_or_below = [i for i, m in enumerate(mpps) if m <= target_mpp * (1.0 + rel_tol)]
    if at_or_below:
        level = max(at_or_below, key=lambda i: mpps[i])
    else:
        level = int(np.argmin(mpps))
        warnings.warn(f"{name}: finest level is {mpps[level]:.4g} µm/px, coarser than the target "
                      f"{target_mpp:.4g} µm/px; patches are upsampled", stacklevel=2)
    read_size = max(1, int(round(int(input_size) * target_mpp / mpps[level])))
    return PatchGeometry(level=int(level), level_downsample=float(level_downsamples[level]), read_size=read_size,
                         input_size=int(input_size), slide_mpp=float(slide_mpp), target_mpp=float(target_mpp))


def assign_cells_to_patches(he_x: np.ndarray, he_y: np.ndarray, geometry: PatchGeometry
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(col, row, u, v) of each cell: the patch holding its centre and its position in it.

    A centre exactly on a patch border belongs to the patch right of / below it (:mod:`fmaudit.cells.features`).

    Parameters
    ----------
    he_x, he_y : ndarray of shape (n_cells,)
        Nucleus centres in level-0 pixels of the H&E slide (the manifest's ``he_x``, ``he_y``).
    geometry : PatchGeometry
        The slide's patch geometry at the magnification (:func:`plan_geometry`).

    Returns
    -------
    col, row : ndarray of shape (n_cells,), int64
        The patch's column (along x) and row (along y) in the tiling from the level-0 origin.
    u, v : ndarray of shape (n_cells,), float64
        The cell's position in its patch, in [0, 1), from the patch's left / top edge.
    """
    x = np.asarray(he_x, dtype=np.float64) / geometry.level_downsample / geometry.read_size
    y = np.asarray(he_y, dtype=np.float64) / geometry.level_downsample / geometry.read_size
    col, row = np.floor(x), np.floor(y)
    return col.astype(np.int64), row.astype(np.int64), x - col, y - row


class PatchDataset(Dataset):
    """Patch origins -> ``(index, uint8 tensor (3, input_size, input_size))`` read with openslide.

    The slide is opened lazily in each worker process; a patch is read at ``geometry.level`` and resized to
    ``input_size`` only when ``read_size != input_size``. No crop: the encoder sees the whole patch.

    Parameters
    ----------
    slide_path : str
        The H&E slide, any format :func:`fmaudit.slides.open_slide` reads.
    x0, y0 : ndarray of shape (n_patches,)
        Each patch's read origin in level-0 pixels.
    geometry : PatchGeometry
        Level, read size and input size of the patches.
    interpolation : {"bicubic", "bilinear"}
        The encoder's resize interpolation (its data config's ``interpolation``).
    """

    def __init__(self, slide_path: str, x0: np.ndarray, y0: np.ndarray, geometry: PatchGeometry,
                 interpolation: str):
        self.slide_path = str(slide_path)
        self.x0 = np.asarray(x0, dtype=np.int64)
        self.y0 = np.asarray(y0, dtype=np.int64)
        self.geometry = geometry
        self.interpolation = interpolation
        self._slide = None

    def __len__(self) -> int:
        return len(self.x0)

    def __getitem__(self, i: int):
        from PIL import Image

        if self._slide is None:
            self._slide = open_slide(self.slide_path)
        g = self.geometry
        img = read_tile(self.slide_path, int(self.x0[i]), int(self.y0[i]), g.level, g.read_size, slide=self._slide)
        if g.read_size != g.input_size:
            resample = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR}[self.interpolation]
            img = img.resize((g.input_size, g.input_size), resample=resample)
        return i, torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()

    def close(self) -> None:
        """Close the slide, if this process opened it (a later item reopens it).
        """
        if self._slide is not None:
            self._slide.close()
            self._slide = None

