"""The feature folder on disk: writing one atomically, and opening one for reading with readouts built on request.

The layout (``nuc.npy``, ``patch_mean.npy``, ``patch_cls.npy``, ``cells.parquet``, ``patches.parquet``,
``meta.json``) is :mod:`fmaudit.cells.features`'s module doc.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.cells.features.readouts import (
    BASE_READOUTS,
    available_readouts,
    base_readouts_of,
    fuse_readout,
    readout_width,
)
from fmaudit.io import FmauditInputError, PathLike, read_json, write_json, write_table

STORAGE_DTYPE = np.float16
_FLOAT16_MAX = float(np.finfo(np.float16).max)


@contextlib.contextmanager
def atomic_dir(path: PathLike, overwrite: bool = False):
    """Yield a temporary folder beside ``path``; rename it onto ``path`` only if the block succeeds.

    An existing ``path`` is replaced only with ``overwrite`` (it is removed just before the rename, so no
    moment shows a complete-looking mix of old and new files).

    Parameters
    ----------
    path : str or Path
        The folder to create; its parent is created if missing.
    overwrite : bool, default False
        Replace an existing ``path``; without it an existing ``path`` is an error once the block has run.

    Yields
    ------
    Path
        A fresh empty folder ``.<name>.<random>.tmp`` in ``path``'s parent, given the process's umask permissions
        before the rename; removed if the block raises.

    Raises
    ------
    FmauditInputError
        When ``path`` exists and ``overwrite`` is False.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if path.exists():
            if not overwrite:
                raise FmauditInputError(f"{path}: exists; not replaced (overwrite=False)")
            shutil.rmtree(path)
        os.rename(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_cell_features(out_dir: PathLike, item_ids: Sequence[str], cell_patch: np.ndarray, uv: np.ndarray,
                        nuc: np.ndarray, patch_mean: np.ndarray, patch_cls: np.ndarray | None,
                        patches: pd.DataFrame | None = None, meta: Mapping[str, Any] | None = None,
                        overwrite: bool = False) -> Path:
    """Write a feature folder (:mod:`fmaudit.cells.features`) from in-memory arrays, atomically.

    Used by :func:`~fmaudit.cells.features.extract_cell_features` for small sections and by tests and benchmarks to
    write simulated features in the real format. Arrays are cast to float16; a value outside float16's range is an
    error.

    Parameters
    ----------
    out_dir : str or Path
        The feature folder to write.
    item_ids : sequence of str
        The cells' manifest ``item_id``, in manifest order (n_cells).
    cell_patch : ndarray of shape (n_cells,)
        Each cell's row in the patch arrays, 0..n_patches-1.
    uv : ndarray of shape (n_cells, 2)
        Each cell's position in its patch, u along x and v along y, in [0, 1).
    nuc : ndarray of shape (n_cells, D)
        The Nuc readout per cell.
    patch_mean : ndarray of shape (n_patches, D)
        The token mean per patch.
    patch_cls : ndarray of shape (n_patches, D) or None
        The class token per patch; None for an encoder without one (no ``patch_cls.npy`` is written).
    patches : DataFrame, optional
        The ``patches.parquet`` table (``patch``, ``col``, ``row``, ``x0``, ``y0``); by default ``patch`` alone.
    meta : mapping, optional
        Provenance for ``meta.json``; ``n_cells``, ``n_patches``, ``embed_dim``, ``has_cls`` and ``dtype`` are set
        from the arrays.
    overwrite : bool, default False
        Replace an existing ``out_dir``.

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    FmauditInputError
        When the arrays' lengths disagree, ``cell_patch`` indexes outside the patches, ``patch_cls`` and
        ``patch_mean`` differ in shape, a value is non-finite or beyond float16's range, or ``out_dir`` exists
        without ``overwrite``.
    """
    n_cells = len(item_ids)
    nuc = np.asarray(nuc)
    cell_patch = np.asarray(cell_patch, dtype=np.int64)
    if nuc.shape[0] != n_cells or cell_patch.shape != (n_cells,) or np.asarray(uv).shape != (n_cells, 2):
        raise FmauditInputError(f"{out_dir}: {n_cells} cells but nuc {nuc.shape}, cell_patch {cell_patch.shape}, "
                                f"uv {np.asarray(uv).shape}")
    n_patches = len(patch_mean)
    if n_cells and (cell_patch.min() < 0 or cell_patch.max() >= n_patches):
        raise FmauditInputError(f"{out_dir}: cell_patch indexes outside the {n_patches} patches")
    if patch_cls is not None and np.asarray(patch_cls).shape != np.asarray(patch_mean).shape:
        raise FmauditInputError(f"{out_dir}: patch_cls {np.shape(patch_cls)} and "
                                f"patch_mean {np.shape(patch_mean)} differ")
    arrays = {"nuc": nuc, "patch_mean": patch_mean}
    if patch_cls is not None:
        arrays["patch_cls"] = patch_cls
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        for name, arr in arrays.items():
            target = np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=STORAGE_DTYPE, shape=arr.shape)
            for s in range(0, len(arr), 65536):
                target[s:s + 65536] = _to_float16(np.asarray(arr[s:s + 65536]), f"{out_dir}: {name}")
            target.flush()
            del target
        _write_tables(tmp, item_ids, cell_patch, np.asarray(uv, dtype=np.float32), patches, n_patches)
        write_json(tmp / "meta.json", dict(meta or {}) | {"n_cells": n_cells, "n_patches": n_patches,
                                                          "embed_dim": int(nuc.shape[1]) if nuc.ndim == 2 else 0,
                                                          "has_cls": patch_cls is not None,
                                                          "dtype": np.dtype(STORAGE_DTYPE).name})
    return Path(out_dir)


def _write_tables(folder: Path, item_ids: Sequence[str], cell_patch: np.ndarray, uv: np.ndarray,
                  patches: pd.DataFrame | None, n_patches: int) -> None:
    write_table(folder / "cells.parquet", pd.DataFrame({
        "item_id": pd.Series(list(map(str, item_ids)), dtype="string"),
        "patch": cell_patch.astype(np.int32), "u": uv[:, 0], "v": uv[:, 1]}))
    if patches is None:
        patches = pd.DataFrame({"patch": np.arange(n_patches, dtype=np.int32)})
    write_table(folder / "patches.parquet", patches)


def _to_float16(arr: np.ndarray, where: str) -> np.ndarray:
    arr = np.asarray(arr)
    flat = arr.reshape(len(arr), -1) if arr.ndim > 1 else arr.reshape(-1, 1)
    bad = ~np.isfinite(flat).all(axis=1) | (np.abs(flat) > _FLOAT16_MAX).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FmauditInputError(f"{where}: {int(bad.sum())} row(s) non-finite or beyond float16's range "
                                f"(±{_FLOAT16_MAX:g}), first row {i}")
    return arr.astype(STORAGE_DTYPE)


class CellFeatures:
    """A feature folder opened for reading: arrays memory-mapped, readouts built on request.

    ``item_ids`` and ``uv`` are read from cells.parquet when asked for (a shard opening 25 sections of 280k cells
    keeps only the patch index in memory). ``len()`` is the number of cells.

    Parameters
    ----------
    path : str or Path
        A complete feature folder (written by :func:`~fmaudit.cells.features.extract_cell_features` or
        :func:`write_cell_features`; ``meta.json`` is written last).

    Attributes
    ----------
    path : Path
        The folder.
    meta : dict
        Its provenance (``meta.json``).
    cell_patch : ndarray of shape (n_cells,), int32
        Each cell's row in the patch arrays.
    nuc : memmap of shape (n_cells, D), float16
        The Nuc readout per cell, read-only.
    patch_mean : memmap of shape (n_patches, D), float16
        The token mean per patch, read-only.
    patch_cls : memmap of shape (n_patches, D), float16, or None
        The class token per patch; None without a class token.
    has_cls : bool
        Whether the encoder has a class token.
    embed_dim : int
        The feature width D.
    readouts : list of str
        The readouts this folder supports (:func:`~fmaudit.cells.features.available_readouts`).

    Raises
    ------
    FmauditInputError
        When the folder has no ``meta.json``, an array or table is unreadable, or the cell count of ``nuc.npy``,
        ``cells.parquet`` and the patch index disagree.
    """

    def __init__(self, path: PathLike):
        path = Path(path)
        self.path = path
        meta_path = path / "meta.json"
        if not meta_path.exists():
            raise FmauditInputError(f"{path}: not a complete cell-feature folder (no meta.json)")
        self.meta = read_json(meta_path)
        try:
            self.nuc = np.load(path / "nuc.npy", mmap_mode="r")
            self.patch_mean = np.load(path / "patch_mean.npy", mmap_mode="r")
            self.patch_cls = (np.load(path / "patch_cls.npy", mmap_mode="r")
                              if (path / "patch_cls.npy").exists() else None)
            self.cell_patch = pd.read_parquet(path / "cells.parquet", columns=["patch"])["patch"].to_numpy(np.int32)
        except (OSError, ValueError, KeyError) as e:
            raise FmauditInputError(f"{path}: unreadable cell-feature folder ({e})") from e
        self.has_cls = self.patch_cls is not None
        self.embed_dim = int(self.nuc.shape[1])
        self.readouts = available_readouts(self.has_cls)
        n = len(self.cell_patch)
        if self.nuc.shape[0] != n or len(self.cell_patch) != n or (n and self.cell_patch.max() >= len(self.patch_mean)):
            raise FmauditInputError(f"{path}: {n} cells in cells.parquet but nuc has {self.nuc.shape[0]} rows "
                                    f"and {len(self.patch_mean)} patches")

    def __len__(self) -> int:
        return len(self.cell_patch)

    @property
    def item_ids(self) -> np.ndarray:
        """The cells' ``item_id`` (str, manifest order), read from cells.parquet on each access.
        """
        return pd.read_parquet(self.path / "cells.parquet", columns=["item_id"])["item_id"].astype(str).to_numpy()

    @property
    def uv(self) -> np.ndarray:
        """The cells' (u, v) positions in their patch, float32 (n_cells, 2), read from cells.parquet on each access.
        """
        return pd.read_parquet(self.path / "cells.parquet", columns=["u", "v"]).to_numpy(dtype=np.float32)

    def base(self, rows: np.ndarray | slice | None = None, names: Sequence[str] = BASE_READOUTS
             ) -> dict[str, np.ndarray]:
        """float32 base arrays (``nuc``, ``mean``, ``cls`` per cell) of ``rows`` (sorted rows read fastest).

        Parameters
        ----------
        rows : ndarray of int or bool, slice, or None, default None
            The cells to read (positions in manifest order); None for all.
        names : sequence of str, default BASE_READOUTS
            The base arrays to read, of ``nuc``, ``mean`` and ``cls``; ``mean`` and ``cls`` are gathered from the patch
            arrays through ``cell_patch``.

        Returns
        -------
        dict of str to ndarray of shape (n_rows, D), float32
            One array per name of ``names``, rows aligned with ``rows``.

        Raises
        ------
        FmauditInputError
            When ``cls`` is asked of a folder without a class token, or a name is not a base readout.
        """
        rows = slice(None) if rows is None else rows
        out: dict[str, np.ndarray] = {}
        patch = self.cell_patch[rows]
        for name in names:
            if name == "nuc":
                out[name] = np.asarray(self.nuc[rows], dtype=np.float32)
            elif name == "mean":
                out[name] = np.asarray(self.patch_mean[patch], dtype=np.float32)
            elif name == "cls":
                if self.patch_cls is None:
                    raise FmauditInputError(f"{self.path}: the encoder has no class token (no Cls readout)")
                out[name] = np.asarray(self.patch_cls[patch], dtype=np.float32)
            else:
                raise FmauditInputError(f"unknown base readout {name!r}; known {list(BASE_READOUTS)}")
        return out

    def readout(self, readout: str, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """One readout (float32, (n_rows, width)) of ``rows`` (all cells by default).

        Parameters
        ----------
        readout : str
            One of this folder's ``readouts``: a base readout or a fusion (``nuc_add_mean``, ``nuc_cat_cls``, ...).
        rows : ndarray of int or bool, slice, or None, default None
            The cells to read (positions in manifest order); None for all.

        Returns
        -------
        ndarray of shape (n_rows, width), float32
            ``width`` is :meth:`width` of ``readout`` (D, or 2 D for a concatenation).

        Raises
        ------
        FmauditInputError
            When ``readout`` is not available in this folder.
        """
        if readout not in self.readouts:
            raise FmauditInputError(f"{self.path}: readout {readout!r} not available (has {self.readouts})")
        return fuse_readout(readout, **{k: None for k in BASE_READOUTS}
                            | self.base(rows, base_readouts_of([readout])))

    def width(self, readout: str) -> int:
        """Feature width of ``readout`` in this folder.

        Parameters
        ----------
        readout : str
            A cell readout name.

        Returns
        -------
        int
            ``2 * embed_dim`` for a concatenation (``nuc_cat_*``), ``embed_dim`` otherwise.
        """
        return readout_width(readout, self.embed_dim)



def open_cell_features(path: PathLike) -> CellFeatures:
    """Open a feature folder written by :func:`~fmaudit.cells.features.extract_cell_features` (memory-mapped).

    Parameters
    ----------
    path : str or Path
        The feature folder.

    Returns
    -------
    CellFeatures
        The folder opened for reading.

    Raises
    ------
    FmauditInputError
        When ``path`` is not a complete, readable feature folder.
    """
    return CellFeatures(path)

