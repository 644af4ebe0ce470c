"""The extraction job: a section's cell manifest checked, its patches embedded in resumable chunks, and the chunks
gathered into one feature folder per magnification (:mod:`fmaudit.cells.features`'s module doc)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch

from fmaudit.cells.features.folder import STORAGE_DTYPE, _to_float16, _write_tables, atomic_dir
from fmaudit.cells.features.patches import (
    PatchDataset,
    PatchGeometry,
    assign_cells_to_patches,
    magnification_mpp,
    plan_geometry,
)
from fmaudit.cells.features.readouts import NUC_CONVENTION, available_readouts, sample_token_grid
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
)
from fmaudit.registry import encoder_config_hash, get_encoder_spec
from fmaudit.slides import open_slide, slide_mpp

log = logging.getLogger(__name__)

#: Columns of a cell manifest (one parquet per section) and the dtype family each must have.
CELL_MANIFEST_COLUMNS = ("item_id", "cell_id", "section", "organ", "slide", "mpp", "he_x", "he_y",
                         "centre_source", "label_fine", "label_coarse", "label_fine_name", "label_coarse_name")
#: The manifest columns that decide a cell's pixels: a chunk is reused only if these are unchanged.
GEOMETRY_COLUMNS = ["item_id", "slide", "mpp", "he_x", "he_y"]


def validate_cell_manifest(manifest: pd.DataFrame, name: str = "cell manifest") -> pd.DataFrame:
    """Check a one-section cell manifest (columns, one section/slide/µm/px, finite unique cells).

    Parameters
    ----------
    manifest : DataFrame
        One section's cells, with every column of :data:`CELL_MANIFEST_COLUMNS` (``item_id``, ``he_x``, ``he_y`` in
        level-0 pixels of ``slide``, ``mpp`` its µm/px, labels ...).
    name : str, default "cell manifest"
        What the errors call the manifest (its path, when read from one).

    Returns
    -------
    DataFrame
        ``manifest`` with a fresh 0..n-1 index (rows in their given order).

    Raises
    ------
    FmauditInputError
        When a column is missing, there is no cell, ``section``, ``slide`` or ``mpp`` has more than one value or a
        missing one, ``mpp`` is not positive, an ``item_id`` repeats, or a centre coordinate is not finite.
    """
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
    """Nucleus-anchored features of one section at one magnification (:mod:`fmaudit.cells.features`); returns
    the provenance.

    An existing complete folder with the same provenance is kept (and its provenance returned); finished chunks
    of an earlier, killed run are reused when their key matches.

    Parameters
    ----------
    manifest : DataFrame or str or Path
        The section's cell manifest (a frame or a parquet path), checked by :func:`validate_cell_manifest`.
    spec : mapping or str
        An encoder registry entry or its slug.
    magnification : float
        Objective magnification to read at (40, 20, 10 ...; :func:`~fmaudit.cells.features.magnification_mpp`).
    out_dir : str or Path
        The feature folder to write; its chunks go to ``<out_dir>.chunks``.
    batch_size : int, default 32
        Patches per forward pass (keyword-only, as are all that follow).
    chunk_size : int, default 256
        Patches per resumable chunk.
    num_workers : int, default 0
        DataLoader worker processes reading patches (0: in this process).
    device : str or torch.device, default "auto"
        ``auto`` uses CUDA when present, else the CPU.
    weights_path : str or Path, optional
        A checkpoint overriding the registry's weights; its path, size and mtime enter the provenance.
    num_threads : int, optional
        torch's intra-op threads for the call (restored afterwards); None leaves them.
    overwrite : bool, default False
        Replace an existing folder of other provenance instead of raising.
    logger : logging.Logger, optional
        Where progress goes; this module's logger by default.
    encoder : Encoder, optional
        An already built :class:`fmaudit.encoders.Encoder` of ``spec`` on ``device`` to reuse; when None it comes
        from the process's cache (:data:`fmaudit.encoders.ENCODER_CACHE`), and only if a chunk is to be computed.
    keep_chunks : bool, default False
        Leave ``<out>.chunks`` in place once the folder is written (the section job removes them when all its
        magnifications are done).

    Returns
    -------
    dict
        The folder's provenance (``meta.json``): encoder, encoder_config_hash, weights, manifest_hash, section,
        magnification, the patch geometry (:meth:`~fmaudit.cells.features.PatchGeometry.as_dict`), slide, n_cells,
        n_patches, embed_dim, has_cls, readouts, dtype, nuc_convention, images_per_s (None when every chunk was
        reused), device, precision, chunk_size and fmaudit_version.

    Raises
    ------
    FmauditInputError
        On a bad manifest, a registry entry that disagrees with its hub config, ``batch_size`` or ``chunk_size``
        below 1, a cell outside the slide, features beyond float16's range, or an existing ``out_dir`` of other
        provenance without ``overwrite``.
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
    ``out_dirs``, with the encoder built at most once.

    The encoder comes from the process's cache, and only when a chunk is to be computed. Every magnification's
    chunks are kept until all its folders are written (:mod:`fmaudit.cells.features`), so a job killed after some
    magnifications rebuilds those from their chunks. Each magnification's records end with how many times this
    process loaded the encoder for the section.

    Parameters
    ----------
    manifest : DataFrame or str or Path
        The section's cell manifest (a frame or a parquet path).
    spec : mapping or str
        An encoder registry entry or its slug.
    out_dirs : mapping of float to str or Path
        Magnification -> the feature folder to write for it.
    device : str or torch.device, default "auto"
        ``auto`` uses CUDA when present (keyword-only, as are all that follow).
    weights_path : str or Path, optional
        A checkpoint overriding the registry's weights.
    logger : logging.Logger, optional
        Where progress goes; this module's logger by default.
    on_output : callable, optional
        ``on_output(magnification)`` is called before each magnification's records (the job switches its log file
        there).
    **kwargs
        Passed to :func:`extract_cell_features` (``chunk_size``, ``batch_size``, ``overwrite``, ...).

    Returns
    -------
    dict of float to dict
        Magnification -> the provenance :func:`extract_cell_features` returned for it.

    Raises
    ------
    FmauditInputError
        As :func:`extract_cell_features`.
    """
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
