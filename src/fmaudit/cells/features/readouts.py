"""Cell readouts: which readouts exist, the Nuc sampling of a token grid, and the fusions built from the base arrays.

The conventions (where Nuc samples, what a fusion adds or concatenates) are :mod:`fmaudit.cells.features`'s module
doc; this module is arrays in, arrays out, with no file or encoder in sight.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fmaudit.io import FmauditInputError

BASE_READOUTS = ("nuc", "mean", "cls")
FUSIONS = {"nuc_add_mean": ("add", "mean"), "nuc_add_cls": ("add", "cls"),
           "nuc_cat_mean": ("cat", "mean"), "nuc_cat_cls": ("cat", "cls")}
CELL_READOUTS = ("nuc", "mean", "cls", "nuc_add_mean", "nuc_add_cls", "nuc_cat_mean", "nuc_cat_cls")
NUC_CONVENTION = ("grid_sample(bilinear, padding_mode=border, align_corners=False) at (2u-1, 2v-1); "
                  "u, v in [0,1) from the patch's top-left; token i centred at (i+0.5)/n")


def needs_cls(readout: str) -> bool:
    """Whether a cell readout needs a class token (Cls and its fusions).

    Parameters
    ----------
    readout : str
        A cell readout name, one of :data:`CELL_READOUTS` (``nuc``, ``mean``, ``cls``, ``nuc_add_mean``, ...);
        not checked here.

    Returns
    -------
    bool
        True for ``cls``, ``nuc_add_cls`` and ``nuc_cat_cls``.
    """
    return readout == "cls" or readout.endswith("_cls")


def available_readouts(has_cls: bool, readouts: Sequence[str] = CELL_READOUTS) -> list[str]:
    """The readouts of ``readouts`` an encoder supports: without a class token, Cls and its fusions go.

    Parameters
    ----------
    has_cls : bool
        Whether the encoder has a class token (a feature folder with ``patch_cls.npy``).
    readouts : sequence of str, default CELL_READOUTS
        The readouts asked for, each one of :data:`CELL_READOUTS`.

    Returns
    -------
    list of str
        ``readouts`` in their given order, less those that need a class token when ``has_cls`` is False.

    Raises
    ------
    FmauditInputError
        When a name of ``readouts`` is not a cell readout.
    """
    unknown = [r for r in readouts if r not in CELL_READOUTS]
    if unknown:
        raise FmauditInputError(f"unknown cell readout(s) {unknown}; known {list(CELL_READOUTS)}")
    return [r for r in readouts if has_cls or not needs_cls(r)]


def readout_width(readout: str, embed_dim: int) -> int:
    """Feature width of a cell readout: concatenations double the encoder's width.

    Parameters
    ----------
    readout : str
        A cell readout name (:data:`CELL_READOUTS`).
    embed_dim : int
        The encoder's feature width D (the registry's ``embed_dim``).

    Returns
    -------
    int
        ``2 * embed_dim`` for ``nuc_cat_mean`` and ``nuc_cat_cls``, ``embed_dim`` otherwise.
    """
    return 2 * int(embed_dim) if readout.startswith("nuc_cat_") else int(embed_dim)


def fuse_readout(readout: str, nuc: np.ndarray | None, mean: np.ndarray | None,
                 cls: np.ndarray | None) -> np.ndarray:
    """One cell readout from the per-cell base arrays (rows aligned): a base array itself, a sum or a
    concatenation, in float32 and without any rescaling.

    Parameters
    ----------
    readout : str
        The readout to build, one of :data:`CELL_READOUTS`.
    nuc : ndarray of shape (n_cells, D) or None
        The Nuc base array (token grid sampled at each nucleus centre); needed by ``nuc`` and every fusion.
    mean : ndarray of shape (n_cells, D) or None
        The token mean of each cell's patch, one row per cell (already gathered from the patch rows).
    cls : ndarray of shape (n_cells, D) or None
        The class token of each cell's patch, one row per cell; None for an encoder without one.

    Returns
    -------
    ndarray of shape (n_cells, D) or (n_cells, 2 * D), float32
        The base array itself, ``nuc + other`` (``nuc_add_*``) or ``[nuc, other]`` along axis 1 (``nuc_cat_*``).

    Raises
    ------
    FmauditInputError
        When ``readout`` is unknown, an array it needs is None, or ``nuc`` and the other array differ in shape.
    """
    if readout not in CELL_READOUTS:
        raise FmauditInputError(f"unknown cell readout {readout!r}; known {list(CELL_READOUTS)}")
    parts = {"nuc": nuc, "mean": mean, "cls": cls}
    if readout in BASE_READOUTS:
        base = parts[readout]
        if base is None:
            raise FmauditInputError(f"readout {readout!r}: its base array is missing")
        return np.asarray(base, dtype=np.float32)
    how, other_name = FUSIONS[readout]
    other = parts[other_name]
    if nuc is None or other is None:
        raise FmauditInputError(f"readout {readout!r} needs nuc and {other_name}")
    if nuc.shape != other.shape:
        raise FmauditInputError(f"readout {readout!r}: nuc {nuc.shape} and {other_name} {other.shape} differ")
    a = np.asarray(nuc, dtype=np.float32)
    b = np.asarray(other, dtype=np.float32)
    return a + b if how == "add" else np.concatenate([a, b], axis=1)


def sample_token_grid(grid: torch.Tensor, patch_index: torch.Tensor, uv: torch.Tensor) -> torch.Tensor:
    """Nuc readout: the token grid of each cell's patch sampled bilinearly at the cell's centre.

    Convention (:mod:`fmaudit.cells.features`): token i of n is centred at (i + 0.5) / n;
    ``grid_sample(align_corners=False, padding_mode="border")`` at 2u - 1, so a cell within half a token of the
    patch edge takes the border token's value, never a mix with zeros.

    Parameters
    ----------
    grid : Tensor of shape (B, D, h, w)
        Token grids (ViT patch tokens after the final norm) or CNN feature maps of B patches.
    patch_index : Tensor of shape (M,)
        The patch (0..B-1, a row of ``grid``) of each of M cells; any integer dtype, on any device.
    uv : Tensor of shape (M, 2)
        The cells' positions in their patch, u along x (columns) and v along y (rows), both in [0, 1], 0 being the
        patch's left / top edge.

    Returns
    -------
    Tensor of shape (M, D)
        One row per cell in the order of ``patch_index``, in ``grid``'s dtype and on its device; (0, D) for no cell.

    Raises
    ------
    FmauditInputError
        When ``grid`` is not 4-dimensional.
    """
    if grid.ndim != 4:
        raise FmauditInputError(f"token grid must be (B, D, h, w), got shape {tuple(grid.shape)}")
    m = int(patch_index.shape[0])
    b, d = int(grid.shape[0]), int(grid.shape[1])
    if m == 0:
        return grid.new_zeros((0, d))
    patch_index = patch_index.to(device=grid.device, dtype=torch.long)
    # cells of one patch share a row of the sampling grid: slot = rank of the cell within its patch
    order = torch.argsort(patch_index, stable=True)
    counts = torch.bincount(patch_index, minlength=b)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(patch_index)
    slot[order] = torch.arange(m, device=grid.device) - starts[patch_index[order]]
    coords = torch.zeros((b, int(counts.max()), 1, 2), dtype=grid.dtype, device=grid.device)
    coords[patch_index, slot, 0] = (uv.to(device=grid.device, dtype=grid.dtype) * 2.0 - 1.0)
    sampled = F.grid_sample(grid, coords, mode="bilinear", padding_mode="border", align_corners=False)
    return sampled[patch_index, :, slot, 0]


def base_readouts_of(readouts: Sequence[str]) -> list[str]:
    """The stored base arrays the given readouts need, in (nuc, mean, cls) order.

    Parameters
    ----------
    readouts : sequence of str
        Cell readouts (:data:`CELL_READOUTS`); a fusion needs ``nuc`` and its other base.

    Returns
    -------
    list of str
        The distinct base readouts needed, a subsequence of :data:`BASE_READOUTS`.

    Raises
    ------
    FmauditInputError
        When a name of ``readouts`` is not a cell readout.
    """
    need = set()
    for r in readouts:
        if r in BASE_READOUTS:
            need.add(r)
        elif r in FUSIONS:
            need.update(("nuc", FUSIONS[r][1]))
        else:
            raise FmauditInputError(f"unknown cell readout {r!r}; known {list(CELL_READOUTS)}")
    return [b for b in BASE_READOUTS if b in need]

