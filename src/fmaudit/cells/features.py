"""Nucleus-anchored dense features of one section: (encoder, section, magnification) -> a feature folder.

What is computed (CellPath-Bench)
- **Magnification.** An objective magnification m is read at ``10 / m`` µm/px (40x -> 0.25, 20x -> 0.5,
  10x -> 1.0). The pyramid level is :func:`fmaudit.slides.choose_level`'s (the coarsest level at or finer
  than the target, 5 % tolerance); a patch is ``read_size = round(input_size * target_mpp / level_mpp)``
  pixels of that level, resized to the encoder's ``input_size`` with the encoder's interpolation when
  ``read_size != input_size`` (shrunk from a finer level, or enlarged, with a warning, when even level 0 is
  coarser than the target). ``effective_mpp = read_size * level_mpp / input_size`` is recorded.
- **Patches.** The slide is tiled, from its level-0 origin, into non-overlapping ``read_size`` squares of the
  chosen level: patch (col, row) covers level pixels ``[col * read_size, (col + 1) * read_size)`` in x and
  the same in y. A cell belongs to the patch holding its nucleus centre (``he_x / level_downsample``
  floor-divided by ``read_size``: a centre exactly on a border belongs to the patch right of / below it).
  Only patches holding at least one cell are embedded. The encoder sees exactly the patch: its tile
  transform's centre crop is not applied (a crop would move the cells), only the resize and normalisation.
- **Readouts.** One forward pass per patch gives the token grid (``patch_grid``: ViT patch tokens after the
  final norm, or the last feature map of a CNN), ``mean`` (token mean, prefix tokens excluded) and ``cls``
  (class token; encoders without one have no Cls readout and no Cls fusions).
  **Nuc** bilinearly samples the token grid at the nucleus centre with
  ``torch.nn.functional.grid_sample(mode="bilinear", padding_mode="border", align_corners=False)``. The
  convention: a cell's position in its patch is ``(u, v)`` in [0, 1) (u along x = columns, v along y =
  rows, 0 = the patch's left/top edge); a grid of n tokens along an axis has token i's centre at
  ``(i + 0.5) / n``; the sampling coordinate is ``2u - 1`` (align_corners=False: -1 and 1 are the outer
  edges of the border tokens). A centre between token centres is the bilinear mix of the 4 surrounding
  tokens; within half a token of the patch edge the border token's value is extended (``border``), never
  mixed with zeros.
- **Fusions** (computed on read, never stored): ``nuc_add_mean = nuc + mean``, ``nuc_add_cls = nuc + cls``
  (addition), ``nuc_cat_mean = [nuc, mean]``, ``nuc_cat_cls = [nuc, cls]`` (concatenation), without any
  normalisation or rescaling.

On disk (a folder, written under a temporary name and renamed into place when complete)
- ``nuc.npy``         float16 (n_cells, D), rows in manifest order
- ``patch_mean.npy``  float16 (n_patches, D)
- ``patch_cls.npy``   float16 (n_patches, D), only for encoders with a class token
- ``cells.parquet``   item_id, patch (row of the patch arrays, int32), u, v (position in the patch)
- ``patches.parquet`` patch, col, row, x0, y0 (level-0 pixels of the patch's read origin)
- ``meta.json``       provenance, written last: encoder, encoder_config_hash, weights, manifest_hash,
  section, magnification, target/slide/level/effective µm/px, level, level_downsample, read_size,
  input_size (the patch size the encoder sees), resampling, n_cells, n_patches, embed_dim, has_cls,
  readouts, dtype, nuc_convention, images_per_s, device, precision, fmaudit_version.
Per cell only Nuc is stored; Mean and Cls are stored per patch and reached through ``cells.parquet``'s
``patch``: seven readouts cost one cell-row and two patch-rows. :func:`open_cell_features` memory-maps the
arrays; :meth:`CellFeatures.readout` builds any readout for any rows in float32.

Resuming: the patches are processed in chunks of ``chunk_size`` patches; each finished chunk goes to
``<out>.chunks/chunk_NNNNN.npz`` (atomic) with a key hashing the encoder config, weights override, autocast
precision, patch geometry and the chunk's cells (ids and coordinates). A rerun reuses every chunk whose key
matches and recomputes the others; batches never straddle chunks. A killed run leaves no ``<out>`` folder.
An existing complete folder with the same provenance is kept; one with other provenance raises unless
``overwrite``. The encoder is built (:data:`fmaudit.encoders.ENCODER_CACHE`, once per process) only when a chunk
is to be computed.

The section job (:func:`extract_section_features`) writes one folder per magnification and keeps every
magnification's chunks until all its folders are written: Snakemake removes the outputs of a job it reruns, so a
job killed after some of its magnifications were written rebuilds those from their chunks, without the encoder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from fmaudit.embed import chunk_path, chunked_loader, resolve_device, reusable_chunk_arrays
from fmaudit.encoders import ENCODER_CACHE, check_against_hub_config, resolve_data_config
from fmaudit.io import (
    FmauditInputError,
    PathLike,
    dataframe_hash,
    provenance,
    read_json,
    read_npz,
    read_table,
    stable_hash,
    write_json,
    write_npz,
    write_table,
)
from fmaudit.registry import encoder_config_hash, get_encoder_spec
from fmaudit.slides import open_slide, read_tile, slide_mpp

log = logging.getLogger(__name__)

#: Columns of a cell manifest (one parquet per section) and the dtype family each must have.
CELL_MANIFEST_COLUMNS = ("item_id", "cell_id", "section", "organ", "slide", "mpp", "he_x", "he_y",
                         "centre_source", "label_fine", "label_coarse", "label_fine_name", "label_coarse_name")
#: The manifest columns that decide a cell's pixels: a chunk is reused only if these are unchanged.
GEOMETRY_COLUMNS = ["item_id", "slide", "mpp", "he_x", "he_y"]
BASE_READOUTS = ("nuc", "mean", "cls")
FUSIONS = {"nuc_add_mean": ("add", "mean"), "nuc_add_cls": ("add", "cls"),
           "nuc_cat_mean": ("cat", "mean"), "nuc_cat_cls": ("cat", "cls")}
CELL_READOUTS = ("nuc", "mean", "cls", "nuc_add_mean", "nuc_add_cls", "nuc_cat_mean", "nuc_cat_cls")
STORAGE_DTYPE = np.float16
NUC_CONVENTION = ("grid_sample(bilinear, padding_mode=border, align_corners=False) at (2u-1, 2v-1); "
                  "u, v in [0,1) from the patch's top-left; token i centred at (i+0.5)/n")
_FLOAT16_MAX = float(np.finfo(np.float16).max)


# --------------------------------------------------------------------------------------------------------
# readout algebra (arrays in, arrays out)
# --------------------------------------------------------------------------------------------------------

def needs_cls(readout: str) -> bool:
    """Whether a cell readout needs a class token (Cls and its fusions)."""
    return readout == "cls" or readout.endswith("_cls")


def available_readouts(has_cls: bool, readouts: Sequence[str] = CELL_READOUTS) -> list[str]:
    """The readouts of ``readouts`` an encoder supports: without a class token, Cls and its fusions go."""
    unknown = [r for r in readouts if r not in CELL_READOUTS]
    if unknown:
        raise FmauditInputError(f"unknown cell readout(s) {unknown}; known {list(CELL_READOUTS)}")
    return [r for r in readouts if has_cls or not needs_cls(r)]


def readout_width(readout: str, embed_dim: int) -> int:
    """Feature width of a cell readout: concatenations double the encoder's width."""
    return 2 * int(embed_dim) if readout.startswith("nuc_cat_") else int(embed_dim)


def fuse_readout(readout: str, nuc: np.ndarray | None, mean: np.ndarray | None,
                 cls: np.ndarray | None) -> np.ndarray:
    """One cell readout from the per-cell base arrays (rows aligned): a base array itself, a sum or a
    concatenation, in float32 and without any rescaling."""
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

    ``grid`` (B, D, h, w) token grids (or CNN feature maps) of B patches; ``patch_index`` (M,) the patch of
    each of M cells (0..B-1); ``uv`` (M, 2) the cells' positions in their patch, u along x (columns) and v
    along y (rows), both in [0, 1]. Returns (M, D) in ``grid``'s dtype. Convention (module doc): token i of n
    is centred at (i + 0.5) / n; ``grid_sample(align_corners=False, padding_mode="border")`` at 2u - 1.
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


# --------------------------------------------------------------------------------------------------------
# geometry
# --------------------------------------------------------------------------------------------------------

def magnification_mpp(magnification: float) -> float:
    """µm/px of an objective magnification: 10 / m (40x 0.25, 20x 0.5, 10x 1.0)."""
    m = float(magnification)
    if not np.isfinite(m) or m <= 0:
        raise FmauditInputError(f"magnification must be a positive number, got {magnification!r}")
    return 10.0 / m


@dataclass(frozen=True)
class PatchGeometry:
    """How patches of one slide are read at one magnification (see the module doc)."""

    level: int
    level_downsample: float  # level pixels -> level-0 pixels
    read_size: int  # patch side in pixels of ``level``
    input_size: int  # patch side the encoder sees
    slide_mpp: float  # level-0 µm/px
    target_mpp: float

    @property
    def level_mpp(self) -> float:
        return self.slide_mpp * self.level_downsample

    @property
    def effective_mpp(self) -> float:
        return self.read_size * self.level_mpp / self.input_size

    @property
    def resampling(self) -> str:
        if self.read_size == self.input_size:
            return "none"
        return "downsample" if self.read_size > self.input_size else "upsample"

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "level_downsample": self.level_downsample, "read_size": self.read_size,
                "input_size": self.input_size, "slide_mpp": self.slide_mpp, "target_mpp": self.target_mpp,
                "level_mpp": self.level_mpp, "effective_mpp": self.effective_mpp, "resampling": self.resampling,
                "patch_field_um": self.read_size * self.level_mpp}


def plan_geometry(slide_mpp: float, level_downsamples: Sequence[float], target_mpp: float,
                  input_size: int, rel_tol: float = 0.05, name: str = "slide") -> PatchGeometry:
    """Level and read size for ``target_mpp`` (arrays in: the slide's level-0 µm/px and level downsamples).

    Same level rule as :func:`fmaudit.slides.choose_level`: the coarsest level at or below the target
    (``rel_tol`` above counts as at), else level 0 with an upsampling warning.
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
    """(col, row, u, v) of each cell: the patch holding its centre and its position in it (module doc)."""
    x = np.asarray(he_x, dtype=np.float64) / geometry.level_downsample / geometry.read_size
    y = np.asarray(he_y, dtype=np.float64) / geometry.level_downsample / geometry.read_size
    col, row = np.floor(x), np.floor(y)
    return col.astype(np.int64), row.astype(np.int64), x - col, y - row


# --------------------------------------------------------------------------------------------------------
# the manifest
# --------------------------------------------------------------------------------------------------------

def validate_cell_manifest(manifest: pd.DataFrame, name: str = "cell manifest") -> pd.DataFrame:
    """Check a one-section cell manifest (columns, one section/slide/µm/px, finite unique cells)."""
    missing = [c for c in CELL_MANIFEST_COLUMNS if c not in manifest.columns]
    if missing:
        raise FmauditInputError(f"{name}: missing column(s) {missing}; "
                                f"a cell manifest has {list(CELL_MANIFEST_COLUMNS)}")
    if len(manifest) == 0:
        raise FmauditInputError(f"{name}: no cells")
    for col in ("section", "slide", "mpp"):
        values = manifest[col].dropna().unique()
        if len(values) != 1 or manifest[col].isna().any():
            raise FmauditInputError(f"{name}: column {col!r} must hold one value for the whole section, "
                                    f"found {list(values[:5])}"
                                    f"{' and missing values' if manifest[col].isna().any() else ''}")
    mpp = float(manifest["mpp"].iloc[0])
    if not np.isfinite(mpp) or mpp <= 0:
        raise FmauditInputError(f"{name}: mpp must be a positive number, got {manifest['mpp'].iloc[0]!r}")
    ids = manifest["item_id"].astype(str)
    dup = ids[ids.duplicated()]
    if len(dup):
        raise FmauditInputError(f"{name}: item_id {dup.iloc[0]!r} occurs more than once ({len(dup)} duplicates)")
    for col in ("he_x", "he_y"):
        values = pd.to_numeric(manifest[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(values)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FmauditInputError(f"{name}: {col} of cell {ids.iloc[i]!r} (row {i}) is not a finite number")
    return manifest.reset_index(drop=True)


# --------------------------------------------------------------------------------------------------------
# reading patches
# --------------------------------------------------------------------------------------------------------

class PatchDataset(Dataset):
    """Patch origins -> ``(index, uint8 tensor (3, input_size, input_size))`` read with openslide."""

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
        if self._slide is not None:
            self._slide.close()
            self._slide = None


# --------------------------------------------------------------------------------------------------------
# writing and reading the feature folder
# --------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def atomic_dir(path: PathLike, overwrite: bool = False):
    """Yield a temporary folder beside ``path``; rename it onto ``path`` only if the block succeeds.

    An existing ``path`` is replaced only with ``overwrite`` (it is removed just before the rename, so no
    moment shows a complete-looking mix of old and new files).
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
    """Write a feature folder (module doc) from in-memory arrays, atomically.

    Used by :func:`extract_cell_features` for small sections and by tests and benchmarks to write simulated
    features in the real format. Arrays are cast to float16; a value outside float16's range is an error.
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

    Attributes: ``path``, ``meta`` (provenance), ``cell_patch`` (n_cells,) int32, ``nuc`` / ``patch_mean`` /
    ``patch_cls`` (read-only memmaps; ``patch_cls`` None without a class token), ``has_cls``, ``embed_dim``,
    ``readouts`` (those this folder supports); ``item_ids`` and ``uv`` are read from cells.parquet when
    asked for (a shard opening 25 sections of 280k cells keeps only the patch index in memory).
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
        return pd.read_parquet(self.path / "cells.parquet", columns=["item_id"])["item_id"].astype(str).to_numpy()

    @property
    def uv(self) -> np.ndarray:
        return pd.read_parquet(self.path / "cells.parquet", columns=["u", "v"]).to_numpy(dtype=np.float32)

    def base(self, rows: np.ndarray | slice | None = None, names: Sequence[str] = BASE_READOUTS
             ) -> dict[str, np.ndarray]:
        """float32 base arrays (``nuc``, ``mean``, ``cls`` per cell) of ``rows`` (sorted rows read fastest)."""
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
        """One readout (float32, (n_rows, width)) of ``rows`` (all cells by default)."""
        if readout not in self.readouts:
            raise FmauditInputError(f"{self.path}: readout {readout!r} not available (has {self.readouts})")
        return fuse_readout(readout, **{k: None for k in BASE_READOUTS}
                            | self.base(rows, base_readouts_of([readout])))

    def width(self, readout: str) -> int:
        return readout_width(readout, self.embed_dim)


def base_readouts_of(readouts: Sequence[str]) -> list[str]:
    """The stored base arrays the given readouts need, in (nuc, mean, cls) order."""
    need = set()
    for r in readouts:
        if r in BASE_READOUTS:
            need.add(r)
        elif r in FUSIONS:
            need.update(("nuc", FUSIONS[r][1]))
        else:
            raise FmauditInputError(f"unknown cell readout {r!r}; known {list(CELL_READOUTS)}")
    return [b for b in BASE_READOUTS if b in need]


def open_cell_features(path: PathLike) -> CellFeatures:
    """Open a feature folder written by :func:`extract_cell_features` (memory-mapped)."""
    return CellFeatures(path)


# --------------------------------------------------------------------------------------------------------
# the extraction job
# --------------------------------------------------------------------------------------------------------

def _reusable_chunk(path: Path, key: str) -> bool:
    arrays = reusable_chunk_arrays(path, key)
    return arrays is not None and {"nuc", "patch_mean", "cell_rows", "patch_rows"} <= set(arrays)


def _existing_output(out: Path, expected: Mapping[str, Any], overwrite: bool) -> dict[str, Any] | None:
    if not out.exists():
        return None
    meta_path = out / "meta.json"
    meta = read_json(meta_path) if meta_path.exists() else {}
    if meta and all(meta.get(k) == v for k, v in expected.items()):
        return meta
    if overwrite:
        return None
    differs = sorted(k for k, v in expected.items() if meta.get(k) != v)
    raise FmauditInputError(f"{out}: exists with other provenance ({', '.join(differs) or 'no meta.json'} differ); "
                            f"delete it or pass overwrite=True")


def extract_cell_features(
    manifest: pd.DataFrame | PathLike,
    spec: Mapping[str, Any] | str,
    magnification: float,
    out_dir: PathLike,
    *,
    batch_size: int = 32,
    chunk_size: int = 256,
    num_workers: int = 0,
    device: str | torch.device = "auto",
    weights_path: PathLike | None = None,
    num_threads: int | None = None,
    overwrite: bool = False,
    logger: logging.Logger | None = None,
    encoder: Any = None,
    keep_chunks: bool = False,
) -> dict[str, Any]:
    """Nucleus-anchored features of one section at one magnification (module doc); returns the provenance.

    ``manifest``: the section's cell manifest (a frame or a parquet path). ``spec``: an encoder registry entry
    or slug. ``chunk_size``: patches per resumable chunk. ``device``: ``auto`` uses CUDA when present.
    ``encoder``: an already built :class:`fmaudit.encoders.Encoder` of ``spec`` on ``device`` to reuse; when
    None it comes from the process's cache (:data:`fmaudit.encoders.ENCODER_CACHE`), and only if a chunk is to
    be computed. ``keep_chunks``: leave ``<out>.chunks`` in place once the folder is written (the section job
    removes them when all its magnifications are done).
    """
    logger = logger or log
    previous_threads = torch.get_num_threads()
    try:
        if num_threads:
            torch.set_num_threads(int(num_threads))
        name_of_manifest = str(manifest) if isinstance(manifest, (str, os.PathLike)) else "cell manifest"
        if isinstance(manifest, (str, os.PathLike)):
            manifest = read_table(manifest)
        manifest = validate_cell_manifest(manifest, name_of_manifest)
        if isinstance(spec, str):
            spec = get_encoder_spec(spec)
        spec = dict(spec)
        encoder_name = spec.get("name", "?")
        # the entry against its hub repo's cached config, before any patch is read (fmaudit.encoders.hub)
        check_against_hub_config(spec, source=f"encoder {encoder_name!r}")
        if batch_size < 1 or chunk_size < 1:
            raise FmauditInputError(f"batch_size and chunk_size must be >= 1 (got {batch_size}, {chunk_size})")
        data_config = resolve_data_config(spec)
        input_size = int(data_config["input_size"])
        section = str(manifest["section"].iloc[0])
        slide_path = str(manifest["slide"].iloc[0])
        mpp = float(manifest["mpp"].iloc[0])
        target = magnification_mpp(magnification)

        with contextlib.closing(open_slide(slide_path)) as slide:
            width, height = slide.dimensions
            downsamples = [float(d) for d in slide.level_downsamples]
            try:
                metadata_mpp = slide_mpp(slide)
            except FmauditInputError:
                metadata_mpp = None
        if metadata_mpp is not None and abs(metadata_mpp - mpp) > 0.01 * mpp:
            logger.warning("%s: the manifest's mpp %.4g differs from the slide's metadata %.4g; using the "
                           "manifest's (the registration was made with it)", slide_path, mpp, metadata_mpp)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            geometry = plan_geometry(mpp, downsamples, target, input_size, name=slide_path)
        for w in caught:
            logger.warning("%s", w.message)

        he_x = manifest["he_x"].to_numpy(dtype=np.float64)
        he_y = manifest["he_y"].to_numpy(dtype=np.float64)
        outside = (he_x < 0) | (he_y < 0) | (he_x >= width) | (he_y >= height)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise FmauditInputError(
                f"{name_of_manifest}: {int(outside.sum())} cell(s) lie outside the slide {slide_path} "
                f"({width}x{height} px), first {manifest['item_id'].iloc[i]!r} at ({he_x[i]:g}, {he_y[i]:g})")
        col, row, u, v = assign_cells_to_patches(he_x, he_y, geometry)
        patch_keys, cell_patch = np.unique(np.stack([row, col], axis=1), axis=0, return_inverse=True)
        cell_patch = cell_patch.reshape(-1)
        n_patches = len(patch_keys)
        patch_row, patch_col = patch_keys[:, 0], patch_keys[:, 1]
        step = geometry.read_size * geometry.level_downsample
        x0 = np.rint(patch_col * step).astype(np.int64)
        y0 = np.rint(patch_row * step).astype(np.int64)
        patches = pd.DataFrame({"patch": np.arange(n_patches, dtype=np.int32), "col": patch_col, "row": patch_row,
                                "x0": x0, "y0": y0})

        out = Path(out_dir)
        config_hash = encoder_config_hash(spec)
        weights_id = _weights_identity(weights_path)
        expected = {"encoder": encoder_name, "encoder_config_hash": config_hash, "weights": weights_id,
                    "manifest_hash": dataframe_hash(manifest), "magnification": float(magnification),
                    "section": section}
        existing = _existing_output(out, expected, overwrite)
        if existing is not None:
            logger.info("%s is up to date (same encoder config, manifest and magnification): kept", out)
            return existing

        dev = resolve_device(device, logger)
        precision = spec.get("precision", "float32") if dev.type == "cuda" else "float32"
        uv = np.stack([u, v], axis=1).astype(np.float32)
        bounds = [(s, min(s + chunk_size, n_patches)) for s in range(0, n_patches, chunk_size)]
        # cells of each chunk, in manifest order within the chunk
        chunk_of_cell = cell_patch // chunk_size
        cells_of_chunk = [np.flatnonzero(chunk_of_cell == c) for c in range(len(bounds))]
        geometry_columns = manifest[GEOMETRY_COLUMNS]
        keys = [stable_hash({"encoder_config_hash": config_hash, "weights": weights_id, "precision": precision,
                             "geometry": geometry.as_dict(), "patches": [int(s), int(e)],
                             "cells": dataframe_hash(geometry_columns.iloc[cells_of_chunk[c]])})
                for c, (s, e) in enumerate(bounds)]
        chunk_dir = Path(f"{out}.chunks")
        pending = [c for c in range(len(bounds)) if not _reusable_chunk(chunk_path(chunk_dir, c), keys[c])]
        logger.info("%s / %s at %gx: %d cells in %d patches (%s), %d chunk(s) of %d patches; %d to compute, "
                    "%d reused", encoder_name, section, magnification, len(manifest), n_patches,
                    json.dumps(geometry.as_dict()), len(bounds), chunk_size, len(pending), len(bounds) - len(pending))
        images_per_s = None
        if pending:
            if encoder is None:
                encoder = ENCODER_CACHE.get(spec, weights_path=weights_path, device=dev, logger=logger)
            images_per_s = _compute_chunks(
                encoder, slide_path, data_config["interpolation"], geometry, x0, y0, cell_patch, uv, bounds,
                cells_of_chunk, keys, pending, chunk_dir, chunk_size=chunk_size, batch_size=batch_size,
                num_workers=num_workers, device=dev, precision=precision, logger=logger, section=section)
        # a chunk's key pins the encoder config, so every chunk agrees on the class token
        with np.load(chunk_path(chunk_dir, 0), allow_pickle=False) as first_chunk:
            has_cls = "patch_cls" in first_chunk.files
        embed_dim = int(spec["embed_dim"])
        meta = provenance(**expected, **geometry.as_dict(), slide=slide_path, slide_metadata_mpp=metadata_mpp,
                          n_cells=len(manifest), n_patches=n_patches, embed_dim=embed_dim, has_cls=has_cls,
                          readouts=available_readouts(has_cls), dtype=np.dtype(STORAGE_DTYPE).name,
                          nuc_convention=NUC_CONVENTION, images_per_s=images_per_s, device=str(dev),
                          precision=precision, chunk_size=chunk_size)
        _assemble(out, chunk_dir, bounds, manifest["item_id"].astype(str).tolist(), cell_patch, uv, patches,
                  n_patches, embed_dim, has_cls, meta, overwrite)
        if not keep_chunks:
            shutil.rmtree(chunk_dir, ignore_errors=True)
        logger.info("wrote %s (%d cells, %d patches, width %d, class token %s)", out, len(manifest), n_patches,
                    embed_dim, has_cls)
        return meta
    finally:
        torch.set_num_threads(previous_threads)


def extract_section_features(
    manifest: pd.DataFrame | PathLike,
    spec: Mapping[str, Any] | str,
    out_dirs: Mapping[float, PathLike],
    *,
    device: str | torch.device = "auto",
    weights_path: PathLike | None = None,
    logger: logging.Logger | None = None,
    on_output: Any = None,
    **kwargs: Any,
) -> dict[float, dict[str, Any]]:
    """The (encoder, section) job of :func:`fmaudit.grid.cell_feature_runs`: every magnification of
    ``out_dirs`` (magnification -> feature folder), with the encoder built at most once (by the process's cache,
    when a chunk is to be computed); returns the provenance per magnification. Every magnification's chunks are
    kept until all its folders are written (see the module doc). ``on_output(magnification)``: called before each
    magnification's records (the job switches its log file there); each magnification's records end with how many
    times this process loaded the encoder for the section. ``kwargs`` go to :func:`extract_cell_features`
    (chunk_size, batch_size, overwrite, ...)."""
    if isinstance(spec, str):
        spec = get_encoder_spec(spec)
    if isinstance(manifest, (str, os.PathLike)):
        manifest = validate_cell_manifest(read_table(manifest), str(manifest))
    logger = logger or log
    dev = resolve_device(device, logger)
    name = spec.get("name", "?")
    before = ENCODER_CACHE.loads[name]
    out: dict[float, dict[str, Any]] = {}
    for magnification, folder in out_dirs.items():
        if on_output is not None:
            on_output(magnification)
        out[magnification] = extract_cell_features(manifest, spec, magnification, folder, device=dev,
                                                   weights_path=weights_path, logger=logger, keep_chunks=True,
                                                   **kwargs)
    for folder in out_dirs.values():
        shutil.rmtree(f"{folder}.chunks", ignore_errors=True)
    loads = ENCODER_CACHE.loads[name] - before
    for magnification in out_dirs:
        if on_output is not None:
            on_output(magnification)
        logger.info("encoder loads in process %d: %s %d time(s) for the %d magnification(s) of this section (%s)",
                    os.getpid(), name, loads, len(out_dirs), ", ".join(f"{float(m):g}x" for m in out_dirs))
    return out


def _weights_identity(weights_path: PathLike | None) -> dict[str, Any] | None:
    if not weights_path:
        return None
    path = Path(weights_path)
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _compute_chunks(encoder, slide_path: str, interpolation: str, geometry: PatchGeometry, x0: np.ndarray,
                    y0: np.ndarray, cell_patch: np.ndarray, uv: np.ndarray, bounds: list[tuple[int, int]],
                    cells_of_chunk: list[np.ndarray], keys: list[str], pending: list[int], chunk_dir: Path, *,
                    chunk_size: int, batch_size: int, num_workers: int, device: torch.device, precision: str,
                    logger: logging.Logger, section: str) -> float:
    """Embed the pending chunks' patches and sample their cells, writing each chunk as it completes."""
    has_cls = encoder.num_prefix_tokens >= 1
    readouts = ["patch_grid", "mean"] + (["cls"] if has_cls else [])
    dataset = PatchDataset(slide_path, x0, y0, geometry, interpolation)
    loader, autocast = chunked_loader(dataset, bounds, pending, batch_size, num_workers, device, precision)
    # cells of every pending patch, grouped by patch (stable: manifest order within a patch)
    order = np.argsort(cell_patch, kind="stable")
    starts = np.searchsorted(cell_patch[order], np.arange(len(x0) + 1))
    collected: dict[int, dict[str, list[np.ndarray]]] = {}
    n_done, n_total = 0, sum(bounds[c][1] - bounds[c][0] for c in pending)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode(), autocast:
            for index, images in loader:
                first, last = int(index[0]), int(index[-1]) + 1
                c = first // chunk_size
                feats = encoder(encoder.normalize(images.to(device, non_blocking=True)), readouts)
                cells = order[starts[first]:starts[last]]
                grid = feats["patch_grid"].float()
                nuc = sample_token_grid(grid, torch.as_tensor(cell_patch[cells] - first, device=device),
                                        torch.as_tensor(uv[cells], device=device))
                part = collected.setdefault(c, {"nuc": [], "patch_mean": [], "patch_cls": [], "cell_rows": []})
                part["nuc"].append(nuc.cpu().numpy())
                part["cell_rows"].append(cells)
                part["patch_mean"].append(feats["mean"].float().cpu().numpy())
                if has_cls:
                    part["patch_cls"].append(feats["cls"].float().cpu().numpy())
                n_done += len(index)
                s, e = bounds[c]
                if last == e:
                    done = collected.pop(c)
                    where = f"encoder {encoder.name!r}, section {section!r}, chunk {c}"
                    arrays = {"nuc": _to_float16(np.concatenate(done["nuc"]), f"{where}: nuc"),
                              "patch_mean": _to_float16(np.concatenate(done["patch_mean"]), f"{where}: mean"),
                              "cell_rows": np.concatenate(done["cell_rows"]).astype(np.int64),
                              "patch_rows": np.arange(s, e, dtype=np.int64)}
                    if has_cls:
                        arrays["patch_cls"] = _to_float16(np.concatenate(done["patch_cls"]), f"{where}: cls")
                    if not np.array_equal(np.sort(arrays["cell_rows"]), cells_of_chunk[c]):
                        raise FmauditInputError(f"{where}: cells do not match the chunk's patches")
                    write_npz(chunk_path(chunk_dir, c), arrays, {"chunk_key": keys[c], "chunk_index": c})
                    logger.info("chunk %05d: computed (%d patches, %d cells; %d/%d patches, %.1f patches/s)", c,
                                e - s, len(arrays["cell_rows"]), n_done, n_total,
                                n_done / max(time.perf_counter() - t0, 1e-9))
    finally:
        dataset.close()
    rate = n_done / max(time.perf_counter() - t0, 1e-9)
    logger.info("embedded %d patches in %.1f s (%.1f patches/s, read + resize + model + sampling)", n_done,
                time.perf_counter() - t0, rate)
    return round(rate, 2)


def _assemble(out: Path, chunk_dir: Path, bounds: list[tuple[int, int]], item_ids: list[str],
              cell_patch: np.ndarray, uv: np.ndarray, patches: pd.DataFrame, n_patches: int, embed_dim: int,
              has_cls: bool, meta: Mapping[str, Any], overwrite: bool) -> None:
    """Gather the chunks into the final folder, one chunk in memory at a time."""
    names = ["nuc", "patch_mean"] + (["patch_cls"] if has_cls else [])
    with atomic_dir(out, overwrite=overwrite) as tmp:
        targets = {
            name: np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=STORAGE_DTYPE,
                                            shape=(len(item_ids) if name == "nuc" else n_patches, embed_dim))
            for name in names}
        for c in range(len(bounds)):
            arrays, _ = read_npz(chunk_path(chunk_dir, c))
            for name in names:
                if arrays[name].shape[1] != embed_dim:
                    raise FmauditInputError(f"{chunk_path(chunk_dir, c)}: {name} has width {arrays[name].shape[1]}, "
                                            f"the registry's embed_dim is {embed_dim}")
            targets["nuc"][arrays["cell_rows"]] = arrays["nuc"]
            for name in names[1:]:
                targets[name][arrays["patch_rows"]] = arrays[name]
        for arr in targets.values():
            arr.flush()
        del targets
        _write_tables(tmp, item_ids, cell_patch, uv, patches, n_patches)
        write_json(tmp / "meta.json", meta)
