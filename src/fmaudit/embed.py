"""The embedding engine: manifest items -> encoder readouts, resumable in chunks, written once atomically.

Output of :func:`embed_manifest`, an ``.npz`` written by :func:`fmaudit.io.write_npz` (or, for an ``.h5`` /
``.hdf5`` path, an HDF5 file written by :func:`fmaudit.io.write_h5`, see below):

- ``item_id``: str array, the manifest's item ids in manifest order;
- ``feat__<readout>``: float32, ``(n_items, D)`` per readout (``patch_grid``: ``(n_items, D, H/p, W/p)``);
- provenance: encoder, encoder_config_hash (of the entry's number-deciding keys only,
  :func:`fmaudit.registry.encoder_config_hash`), embedding_key (:func:`fmaudit.registry.embedding_key`),
  manifest_hash, fmaudit_version, n_items, readouts, embed_dim (per readout), images_per_s (of the items
  computed in this run; null if all were reused), device, precision, weights (what the weights are, path-free:
  source and seed, or the sha256 of every file and, for hub weights, the repo, requested revision and resolved
  snapshot commit; :class:`fmaudit.encoders.weights.ResolvedWeights`), weight_files (each file's path and
  sha256), weights_sha256_checked (whether a sha256 of the registry was checked), hub_config (the hub config
  files the entry was compared with, :func:`fmaudit.encoders.hub.check_against_hub_config`, or null), and
  chunk_size and chunk_keys (the key of every chunk, below).

The HDF5 layout is the one WSI feature tools write and ``fmaudit probe`` reads: ``features`` (the
``features_readout`` readout, by default the entry's ``default_readout``), ``item_id``, every readout under
``readouts/<readout>``, and the provenance (with ``features_readout``) as a JSON string in the file's
``provenance`` attribute.

Before anything is computed, the entry is compared with its hub repo's cached config: a field that differs
without a declared departure stops the job naming it.

Resuming: items are processed in chunks of ``chunk_size`` manifest rows. Each finished chunk is written
atomically to ``<out_path>.chunks/chunk_NNNNN.npz`` with its item ids and a chunk key (a hash of the encoder
config hash, the weights' identity above, the readouts, the autocast precision and the chunk's pixel-defining
manifest columns): what decides its numbers, and nothing else. A rerun reuses every chunk whose key and ids
match and recomputes the rest; the final file is assembled and written atomically. Batches never straddle
chunks, so a resumed run computes every item in the same batch as an uninterrupted one. A job killed at any
point leaves no final file; its temporary files are removed by the next write of the same file
(:func:`fmaudit.io.write_npz`).

The finished file survives the deletion of the output itself: once it is written, the chunk folder keeps a
second name of it, ``<out_path>.chunks/finished<suffix>`` (a hard link: no extra disk space while the output
exists), and the chunk files are removed. Snakemake deletes the output of a job it considers incomplete before
rerunning it (``--rerun-incomplete`` after its own process was killed, even when the job went on and finished);
the rerun then takes every chunk whose key matches from the finished copy (its provenance lists the chunk
keys), computing nothing that was done. Where the file system has no hard links, the chunk files are kept
instead. Delete the ``.chunks`` folder with an embedding you remove by hand.

An existing final file whose provenance matches (encoder config, manifest, readouts, weights) is kept and
returned as is; one that does not match raises unless ``overwrite=True``: embeddings are never silently
replaced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from fmaudit.datasets.manifest import make_manifest, validate_manifest
from fmaudit.devices import resolve_device
from fmaudit.encoders import ENCODER_CACHE, READOUTS, ResolvedWeights, check_against_hub_config, resolve_weights
from fmaudit.encoders.transforms import DecodeOnly, DevicePreprocess, collate_pixels, resolve_data_config
from fmaudit.io import (
    H5_SUFFIXES,
    FmauditInputError,
    PathLike,
    dataframe_hash,
    provenance,
    read_h5,
    read_h5_provenance,
    read_npz,
    read_npz_provenance,
    read_table,
    remove_stale_temps,
    stable_hash,
    write_h5,
    write_npz,
)
from fmaudit.logs import file_handler
from fmaudit.ood.perturb import apply_perturbation, parse_perturbation
from fmaudit.registry import embedding_key, encoder_config_hash, get_encoder_spec, readout_dims
from fmaudit.slides import open_slide, read_tile

# the manifest columns that decide an item's pixels: a chunk is reused only if these are unchanged
PIXEL_COLUMNS = ["item_id", "source", "x", "y", "level", "size"]
# optional column of derived manifests (fmaudit.ood.perturb): an image-space perturbation spec per row
PERTURBATION_COLUMN = "perturbation"
FEATURE_PREFIX = "feat__"
_AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------------------------------------
# reading items
# --------------------------------------------------------------------------------------------------------

def _optional_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


class ItemDataset(Dataset):
    """Manifest rows -> ``(row_index, transform(image))``.

    A row with ``x`` set is a slide tile read with :func:`fmaudit.slides.read_tile` (one open slide handle per
    source, kept per DataLoader worker); otherwise ``source`` is an image file: a JPEG is decoded by
    torchvision's ``decode_jpeg`` into a uint8 tensor (the same pixels as PIL's decode, measured faster:
    benchmarks/bench_loader.py), anything else (PNG, where PIL is faster) read with PIL. The transform takes
    either (:class:`fmaudit.encoders.transforms.PixelTransform`). Unreadable items raise
    :class:`FmauditInputError` naming the item id and the file. A row with a ``perturbation`` spec (derived
    manifests, :mod:`fmaudit.ood.perturb`) is read with PIL and perturbed, before the transform.

    Parameters
    ----------
    manifest : DataFrame
        A validated manifest: ``item_id``, ``source`` (image file or slide path), ``x``, ``y``, ``level``, ``size``
        (the tile's level-0 corner, pyramid level and side in pixels; NA for an image file) and optionally
        ``perturbation``.
    transform : callable
        Pixels (a PIL image or a uint8 tensor (3, H, W)) to what the loader batches, e.g. the encoder's
        ``pixel_transform`` or :class:`fmaudit.encoders.transforms.DecodeOnly`.

    Raises
    ------
    FmauditInputError
        When a row's ``perturbation`` spec does not parse (the message names the item).
    """

    def __init__(self, manifest: pd.DataFrame, transform):
        self.item_ids = manifest["item_id"].astype(str).tolist()
        self.sources = manifest["source"].astype(str).tolist()
        self.xs = [_optional_int(v) for v in manifest["x"]]
        self.ys = [_optional_int(v) for v in manifest["y"]]
        self.levels = [_optional_int(v) for v in manifest["level"]]
        self.sizes = [_optional_int(v) for v in manifest["size"]]
        self.transform = transform
        self._slides: dict[str, Any] = {}
        self.perturbations = [None] * len(self.item_ids)
        if PERTURBATION_COLUMN in manifest.columns:
            self.perturbations = [None if pd.isna(v) else str(v) for v in manifest[PERTURBATION_COLUMN]]
            for item, spec in zip(self.item_ids, self.perturbations):
                if spec is not None:
                    try:
                        parse_perturbation(spec)
                    except FmauditInputError as e:
                        raise FmauditInputError(f"item {item!r}: {e}") from e

    def __len__(self) -> int:
        return len(self.item_ids)

    def load_image(self, i: int):
        """The item's RGB PIL image (before the encoder's transform), perturbed when its row says so.

        Parameters
        ----------
        i : int
            Row position in the manifest.

        Returns
        -------
        PIL.Image.Image
            RGB.

        Raises
        ------
        FmauditInputError
            When the file or tile cannot be read (the message names the item and the file).
        """
        image = self._read_image(i)
        if self.perturbations[i] is None:
            return image

        return apply_perturbation(image, self.perturbations[i], item_key=self.item_ids[i])

    def _read_image(self, i: int):
        item, source = self.item_ids[i], self.sources[i]
        if self.xs[i] is not None:
            return self._read_tile(i)
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(source) as im:
                im.load()
                return im.convert("RGB")
        except FileNotFoundError as e:
            raise FmauditInputError(f"item {item!r}: image file {source} does not exist") from e
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
            raise FmauditInputError(f"item {item!r}: cannot read image {source} ({e})") from e

    def _read_tile(self, i: int):
        item, source = self.item_ids[i], self.sources[i]
        try:
            slide = self._slides.get(source)
            if slide is None:
                slide = self._slides[source] = open_slide(source)
            return read_tile(source, self.xs[i], self.ys[i], self.levels[i], self.sizes[i], slide=slide)
        except (FmauditInputError, FileNotFoundError) as e:
            raise FmauditInputError(f"item {item!r}: {e}") from e

    def load_pixels(self, i: int):
        """What the transform gets: a plain JPEG file as a uint8 tensor (3, H, W), else :meth:`load_image`.

        Parameters
        ----------
        i : int
            Row position in the manifest.

        Returns
        -------
        Tensor or PIL.Image.Image
            A uint8 tensor (3, H, W) for a plain JPEG torchvision decodes, else the RGB PIL image.
        """
        source = self.sources[i]
        if self.xs[i] is None and self.perturbations[i] is None and source.lower().endswith(_JPEG_SUFFIXES):
            pixels = _decode_jpeg_rgb(source)
            if pixels is not None:
                return pixels
        return self.load_image(i)

    def __getitem__(self, i: int):
        return i, self.transform(self.load_pixels(i))

    def close(self) -> None:
        """Close the slide handles this dataset (or this worker's copy of it) opened.
        """
        for slide in self._slides.values():
            slide.close()
        self._slides.clear()


_JPEG_SUFFIXES = (".jpg", ".jpeg")


def _decode_jpeg_rgb(path: str) -> torch.Tensor | None:
    """A JPEG file as a uint8 RGB tensor (3, H, W) by torchvision, or None where PIL should read it (CMYK, a
    file torchvision cannot decode: PIL then gives the error naming the item)."""
    # imported here, not with the module: the jobs that only read embeddings back import this module, and
    # torchvision's import was about a quarter of their start-up (fmaudit.encoders.transforms)
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    try:
        pixels = decode_jpeg(read_file(path), mode=ImageReadMode.UNCHANGED)
    except (RuntimeError, OSError, ValueError):
        return None
    if pixels.shape[0] == 1:  # greyscale, replicated as PIL's convert("RGB") does
        return pixels.expand(3, -1, -1).contiguous()
    return pixels if pixels.shape[0] == 3 else None


def _worker_init(_worker_id: int) -> None:
    # workers only decode and transform; one thread each avoids oversubscribing the cores
    torch.set_num_threads(1)


def chunked_loader(dataset, bounds, pending, batch_size: int, num_workers: int, device: torch.device,
                   precision: str, collate_fn=None):
    """(DataLoader over the ``pending`` chunks' items, autocast context) as every chunked embedding job uses them.

    Batches never straddle chunks (``bounds[c]`` = (start, end) of chunk c): the same items share a batch
    whether or not the run was resumed. Autocast only on CUDA, in the precision's dtype.

    Parameters
    ----------
    dataset : torch Dataset
        Yields ``(row_index, pixels)`` per manifest row (:class:`ItemDataset` or the cells' patch dataset).
    bounds : sequence of (int, int)
        Row range [start, end) of every chunk.
    pending : sequence of int
        The chunks to compute, in order.
    batch_size : int
        Largest batch; a chunk's last batch may be smaller.
    num_workers : int
        DataLoader worker processes (0: load in this process); each runs one torch thread.
    device : torch.device
        Where the model runs; pinned memory and autocast only on CUDA.
    precision : str
        The entry's precision: ``"float16"`` or ``"bfloat16"`` autocast on CUDA, anything else none.
    collate_fn : callable, optional
        The DataLoader's collate function (default torch's stacking).

    Returns
    -------
    loader : DataLoader
    autocast : context manager
        ``torch.autocast`` or a null context.
    """
    batches = [list(range(b, min(b + batch_size, e))) for c in pending for s, e in [bounds[c]]
               for b in range(s, e, batch_size)]
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=num_workers, pin_memory=device.type == "cuda",
                        worker_init_fn=_worker_init if num_workers > 0 else None, collate_fn=collate_fn)
    dtype = _AUTOCAST_DTYPES.get(precision)
    autocast = (torch.autocast(device_type="cuda", dtype=dtype) if device.type == "cuda" and dtype
                else contextlib.nullcontext())
    return loader, autocast


# --------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------

def _logger(log: logging.Logger | PathLike | None) -> tuple[logging.Logger, logging.Handler | None]:
    if isinstance(log, logging.Logger):
        return log, None
    logger = logging.getLogger("fmaudit.embed")
    if log is None:
        return logger, None
    handler = file_handler(log)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, handler


def chunk_path(chunk_dir: Path, index: int) -> Path:
    """Where a resumable embedding job keeps chunk ``index`` (tile embeddings and cell features alike).

    Parameters
    ----------
    chunk_dir : Path
        The job's chunk folder, ``<out_path>.chunks``.
    index : int
        Chunk number from 0.

    Returns
    -------
    Path
        ``chunk_dir / "chunk_NNNNN.npz"``.
    """
    return chunk_dir / f"chunk_{index:05d}.npz"


def reusable_chunk_arrays(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """The arrays of a chunk written under ``key`` (its ``chunk_key`` provenance), or None when the chunk is
    missing, unreadable (a killed write) or was written for other settings: then it is computed again.

    Parameters
    ----------
    path : Path
        The chunk file (:func:`chunk_path`).
    key : str
        The chunk key the current settings give this chunk.

    Returns
    -------
    dict of str to ndarray or None
    """
    if not path.exists():
        return None
    try:
        arrays, prov = read_npz(path)
    except (FmauditInputError, FileNotFoundError):
        return None
    return arrays if prov.get("chunk_key") == key else None


def _reusable_chunk(path: Path, key: str, ids: Sequence[str], readouts: Sequence[str]) -> bool:
    arrays = reusable_chunk_arrays(path, key)
    return (arrays is not None
            and "item_id" in arrays and arrays["item_id"].astype(str).tolist() == list(ids)
            and all(FEATURE_PREFIX + r in arrays for r in readouts))


def _write_chunk(path: Path, ids: Sequence[str], feats: Mapping[str, np.ndarray], key: str, index: int) -> None:
    arrays = {"item_id": np.asarray(ids, dtype=str)}
    arrays.update({FEATURE_PREFIX + r: v for r, v in feats.items()})
    write_npz(path, arrays, {"chunk_key": key, "chunk_index": index})


def _check_finite(feats: Mapping[str, np.ndarray], ids: Sequence[str], encoder: str, precision: str) -> None:
    for r, v in feats.items():
        ok = np.isfinite(v.reshape(len(v), -1)).all(axis=1)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            hint = f" (precision {precision}: try float32)" if precision != "float32" else ""
            raise FmauditInputError(
                f"encoder {encoder!r} produced non-finite {r!r} features for {int((~ok).sum())} item(s), "
                f"first {str(ids[i])!r}{hint}")


def _is_h5(path: Path) -> bool:
    return path.suffix.lower() in H5_SUFFIXES


def _read_provenance(path: Path) -> dict[str, Any]:
    return read_h5_provenance(path) if _is_h5(path) else read_npz_provenance(path)


def _read_features(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``{"item_id": ..., "feat__<readout>": ...}`` and the provenance of an output in either layout."""
    if not _is_h5(path):
        return read_npz(path)
    arrays, prov = read_h5(path)
    feats = {FEATURE_PREFIX + k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("readouts/")}
    return {"item_id": arrays["item_id"], **feats}, prov


def _write_output(out: Path, arrays: Mapping[str, np.ndarray], prov: Mapping[str, Any],
                  features_readout: str) -> None:
    if not _is_h5(out):
        write_npz(out, arrays, prov)
        return
    h5 = {"features": arrays[FEATURE_PREFIX + features_readout], "item_id": arrays["item_id"]}
    h5.update({f"readouts/{k[len(FEATURE_PREFIX):]}": v for k, v in arrays.items() if k.startswith(FEATURE_PREFIX)})
    write_h5(out, h5, prov)


def finished_copy_path(out: Path) -> Path:
    """Where the chunk folder keeps the second name of a finished output (module doc).

    Parameters
    ----------
    out : Path
        The embedding job's output.

    Returns
    -------
    Path
        ``<out>.chunks/finished<suffix>``.
    """
    return Path(f"{out}.chunks") / f"finished{out.suffix}"


def _keep_finished(out: Path, chunk_dir: Path, n_chunks: int, logger: logging.Logger) -> None:
    """Give the finished output a second name in its chunk folder and drop the chunk files (module doc); where
    hard links are impossible, keep the chunk files instead."""
    finished = finished_copy_path(out)
    tmp = chunk_dir / f".{finished.name}.{os.getpid()}.tmp"
    try:
        chunk_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            tmp.unlink()
        os.link(out, tmp)
        os.replace(tmp, finished)
    except OSError as e:
        logger.info("no hard link of %s in %s (%s): its %d chunk file(s) are kept instead", out, chunk_dir, e, n_chunks)
        return
    for c in range(n_chunks):
        chunk_path(chunk_dir, c).unlink(missing_ok=True)
        remove_stale_temps(chunk_path(chunk_dir, c))  # half-written chunks of killed runs
    logger.info("kept %s (a second name of %s, for a rerun that finds the output deleted)", finished, out)


def _finished_chunks(out: Path, keys: Sequence[str], chunk_size: int) -> list[int]:
    """The chunks the finished copy of an earlier run holds under the same key (and chunk layout)."""
    finished = finished_copy_path(out)
    if not finished.exists():
        return []
    try:
        prov = _read_provenance(finished)
    except (FmauditInputError, FileNotFoundError):
        return []
    old = prov.get("chunk_keys") or []
    if prov.get("chunk_size") != chunk_size:
        return []
    return [c for c, key in enumerate(keys) if c < len(old) and old[c] == key]


def _existing_output(out: Path, expected: Mapping[str, Any], overwrite: bool) -> dict[str, Any] | None:
    if not out.exists():
        return None
    try:
        prov = _read_provenance(out)
    except FmauditInputError:
        prov = {}
    if all(prov.get(k) == v for k, v in expected.items()):
        return prov
    if overwrite:
        return None
    differs = sorted(k for k, v in expected.items() if prov.get(k) != v)
    raise FmauditInputError(
        f"{out}: exists with other provenance ({', '.join(differs)} differ); delete it or pass overwrite=True")


# --------------------------------------------------------------------------------------------------------
# the engine
# --------------------------------------------------------------------------------------------------------

def embed_manifest(
    manifest_df: pd.DataFrame | PathLike,
    spec: Mapping[str, Any] | str,
    out_path: PathLike,
    batch_size: int = 64,
    num_workers: int = 0,
    device: str | torch.device = "auto",
    chunk_size: int = 256,
    weights_path: PathLike | None = None,
    log: logging.Logger | PathLike | None = None,
    readouts: Sequence[str] | None = None,
    num_threads: int | None = None,
    overwrite: bool = False,
    log_every: int = 20,
    features_readout: str | None = None,
    pixels_on_device: bool | None = None,
) -> dict[str, Any]:
    """Embed every manifest item with one encoder and write ``out_path`` (see the module doc); returns its
    provenance.

    Parameters
    ----------
    manifest_df : DataFrame or str or Path
        The items (a manifest, validated here) or the path of a manifest table.
    spec : Mapping or str
        A registry entry (with ``name``) or an encoder slug looked up in the registry.
    out_path : str or Path
        The output, ``.npz``, or ``.h5``/``.hdf5`` for the HDF5 layout.
    batch_size : int, default 64
        Images per forward pass (>= 1).
    num_workers : int, default 0
        DataLoader worker processes that read and transform the images.
    device : str or torch.device, default "auto"
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (an unavailable CUDA falls back to the CPU
        with a warning; :func:`fmaudit.devices.resolve_device`).
    chunk_size : int, default 256
        Manifest rows per resumable chunk (>= 1); part of the chunk layout an earlier run's chunks are matched on.
    weights_path : str or Path, optional
        A local weights file that overrides the entry's weights.
    log : Logger or str or Path, optional
        A Logger, a log file path, or None for the ``fmaudit.embed`` logger.
    readouts : sequence of str, optional
        Readouts to write (:data:`fmaudit.encoders.READOUTS`); default the entry's ``readouts``.
    num_threads : int, optional
        Torch intra-op threads for this call (restored afterwards); None leaves them.
    overwrite : bool, default False
        Replace an existing output whose provenance differs, instead of raising.
    log_every : int, default 20
        Log progress every this many batches.
    features_readout : str, optional
        The readout an HDF5 output holds as ``features``; default the entry's ``default_readout`` when among the
        readouts, else the first readout.
    pixels_on_device : bool, optional
        The DataLoader workers only decode and the model's device resizes, crops and normalises whole uint8
        batches, straight to the autocast dtype (:class:`fmaudit.encoders.transforms.DevicePreprocess`; its resize
        is torch's, within a few grey levels of the workers' PIL resize). None (default): on a GPU, so its workers
        keep up. It is part of the chunk key (its numbers differ) and recorded as ``pixels_on_device``.

    Returns
    -------
    dict
        The output's provenance (keys listed in the module doc); the existing file's when it was up to date.

    Raises
    ------
    FmauditInputError
        On an invalid manifest, an unknown readout, ``batch_size`` or ``chunk_size`` below 1, a
        ``features_readout`` not among the readouts, an entry that departs from its hub config, weights that fail
        their check, non-finite features, feature widths that differ from the registry's, or an existing output
        with other provenance (without ``overwrite``).
    """
    logger, handler = _logger(log)
    previous_threads = torch.get_num_threads()
    try:
        if num_threads:
            torch.set_num_threads(int(num_threads))
        if isinstance(spec, str):
            spec = get_encoder_spec(spec)
        spec = dict(spec)
        name = spec.get("name", "?")
        if isinstance(manifest_df, (str, os.PathLike)):
            manifest_name = str(manifest_df)
            manifest_df = read_table(manifest_df)
        else:
            manifest_name = "manifest"
        manifest = validate_manifest(manifest_df.reset_index(drop=True), name=manifest_name)
        readouts = list(readouts or spec["readouts"])
        unknown = [r for r in readouts if r not in READOUTS]
        if unknown:
            raise FmauditInputError(f"encoder {name!r}: unknown readout(s) {unknown}; known {list(READOUTS)}")
        if batch_size < 1 or chunk_size < 1:
            raise FmauditInputError(f"batch_size and chunk_size must be >= 1 (got {batch_size}, {chunk_size})")

        features_readout = features_readout or (spec.get("default_readout") if spec.get("default_readout") in readouts
                                                else readouts[0])
        if features_readout not in readouts:
            raise FmauditInputError(f"encoder {name!r}: features_readout {features_readout!r} is not among the "
                                    f"readouts {readouts}")

        dev = resolve_device(device, logger)
        precision = spec.get("precision", "float32") if dev.type == "cuda" else "float32"
        on_device = dev.type == "cuda" if pixels_on_device is None else bool(pixels_on_device)
        out = Path(out_path)
        config_hash = encoder_config_hash(spec)
        hub = check_against_hub_config(spec, source=f"encoder {name!r}")  # before anything is computed
        if hub is not None:
            logger.info("%s matches the config of %s at %s (%s)", name, hub.repo_id, hub.commit,
                        ", ".join(p.name for p in hub.files))
        # the weights are located, checked and hashed once, before anything else: their identity keys the chunks
        resolved = resolve_weights(spec, weights_path)
        weights_id = resolved.identity
        expected = {"encoder": name, "encoder_config_hash": config_hash, "manifest_hash": dataframe_hash(manifest),
                    "readouts": readouts, "weights": weights_id}
        for f in resolved.files:
            how = "checked against the registry" if resolved.sha256_checked else "recorded"
            logger.info("weights of %s: %s, sha256 %s (%s)", name, f["path"], f["sha256"], how)
        if weights_id.get("resolved_commit"):
            logger.info("weights of %s: %s at commit %s", name, weights_id["hf_hub_id"], weights_id["resolved_commit"])
        existing = _existing_output(out, expected, overwrite)
        if existing is not None:
            logger.info("%s is up to date (same encoder config, manifest and readouts): kept", out)
            return existing

        ids = manifest["item_id"].astype(str).tolist()
        bounds = [(s, min(s + chunk_size, len(ids))) for s in range(0, len(ids), chunk_size)]
        pixels = manifest[PIXEL_COLUMNS + [c for c in (PERTURBATION_COLUMN,) if c in manifest.columns]]
        # pixels prepared on the device are not the workers' PIL pixels: they key other chunks
        device_key = {"pixels_on_device": True} if on_device else {}
        keys = [stable_hash({"encoder_config_hash": config_hash, "weights": weights_id, "readouts": readouts,
                             "precision": precision, "items": dataframe_hash(pixels.iloc[s:e]), **device_key})
                for s, e in bounds]
        chunk_dir = Path(f"{out}.chunks")
        in_chunks = {c for c, (s, e) in enumerate(bounds)
                     if _reusable_chunk(chunk_path(chunk_dir, c), keys[c], ids[s:e], readouts)}
        in_finished = set(_finished_chunks(out, keys, chunk_size)) - in_chunks
        pending = [c for c in range(len(bounds)) if c not in in_chunks | in_finished]
        logger.info("%s on %s: %d items in %d chunk(s) of %d; %d to compute, %d reused from %s",
                    name, dev, len(ids), len(bounds), chunk_size, len(pending), len(bounds) - len(pending), chunk_dir)
        for c in range(len(bounds)):
            if c in in_chunks:
                logger.info("chunk %05d: reused", c)
            elif c in in_finished:
                logger.info("chunk %05d: reused from %s", c, finished_copy_path(out).name)

        images_per_s = None
        if pending:
            images_per_s = _compute_chunks(manifest, spec, readouts, bounds, keys, pending, chunk_dir, ids,
                                           batch_size=batch_size, num_workers=num_workers, device=dev,
                                           precision=precision, weights_path=weights_path, resolved=resolved,
                                           logger=logger, log_every=log_every, on_device=on_device)

        finished_arrays = _read_features(finished_copy_path(out))[0] if in_finished else {}
        arrays: dict[str, Any] = {"item_id": np.asarray(ids, dtype=str)}
        parts: dict[str, list[np.ndarray]] = {r: [] for r in readouts}
        for c, (s, e) in enumerate(bounds):
            if c in in_finished:
                chunk = {k: v[s:e] for k, v in finished_arrays.items()}
                where = finished_copy_path(out)
            else:
                chunk, _ = read_npz(chunk_path(chunk_dir, c))
                where = chunk_path(chunk_dir, c)
            if chunk["item_id"].astype(str).tolist() != ids[s:e]:
                raise FmauditInputError(f"{where}: item ids do not match the manifest rows {s}-{e}")
            for r in readouts:
                parts[r].append(chunk[FEATURE_PREFIX + r])
        for r in readouts:
            arrays[FEATURE_PREFIX + r] = np.concatenate(parts[r]).astype(np.float32, copy=False)
        dims = {r: int(arrays[FEATURE_PREFIX + r].shape[1]) for r in readouts}
        declared = readout_dims(spec, readouts)
        if dims != declared:
            raise FmauditInputError(f"encoder {name!r}: feature widths {dims} differ from the registry's {declared}")
        key = embedding_key(spec, str(weights_path) if weights_path else None)
        prov = provenance(**expected, embedding_key=key, weight_files=resolved.files,
                          weights_sha256_checked=resolved.sha256_checked, n_items=len(ids), embed_dim=dims,
                          images_per_s=images_per_s, device=str(dev), precision=precision, chunk_size=chunk_size,
                          chunk_keys=keys, hub_config=[str(p) for p in hub.files] if hub is not None else None,
                          pixels_on_device=on_device)
        if _is_h5(out):
            prov["features_readout"] = features_readout
        _write_output(out, arrays, prov, features_readout)
        _keep_finished(out, chunk_dir, len(bounds), logger)
        logger.info("wrote %s (%d items; readouts %s)", out, len(ids), dims)
        return prov
    finally:
        torch.set_num_threads(previous_threads)
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()


def _compute_chunks(manifest: pd.DataFrame, spec: Mapping[str, Any], readouts: list[str],
                    bounds: list[tuple[int, int]], keys: list[str], pending: list[int], chunk_dir: Path,
                    ids: list[str], *, batch_size: int, num_workers: int, device: torch.device, precision: str,
                    weights_path: PathLike | None, resolved: ResolvedWeights, logger: logging.Logger,
                    log_every: int, on_device: bool = False) -> float:
    """Embed the pending chunks, writing each as it completes; returns images/s of the full path."""
    name = spec.get("name", "?")
    # built once per process (logged there with the process's load count), reused by a later call of the process
    encoder = ENCODER_CACHE.get(spec, weights_path=weights_path, device=device, resolved=resolved, logger=logger)
    if on_device:
        # workers only decode; the device resizes, crops and normalises uint8 batches into the autocast dtype
        dataset = ItemDataset(manifest, DecodeOnly())
        prepare = DevicePreprocess(resolve_data_config(encoder.spec), _AUTOCAST_DTYPES.get(precision, torch.float32))
        collate = collate_pixels
    else:
        # workers decode, resize and crop to uint8; scaling and normalisation run batched on the model's device
        dataset = ItemDataset(manifest, encoder.pixel_transform)
        prepare, collate = encoder.normalize, None
    loader, autocast = chunked_loader(dataset, bounds, pending, batch_size, num_workers, device, precision,
                                      collate_fn=collate)
    todo = {c: bounds[c] for c in pending}
    collected: dict[int, dict[str, list[np.ndarray]]] = {c: {r: [] for r in readouts} for c in pending}
    filled = {c: 0 for c in pending}
    chunk_of = {}
    for c in pending:
        s, e = bounds[c]
        chunk_of.update(dict.fromkeys(range(s, e), c))
    n_total = sum(e - s for s, e in todo.values())
    n_done = 0
    t0 = time.perf_counter()
    try:
        with torch.inference_mode(), autocast:
            for b, (index, images) in enumerate(loader, start=1):
                images = (images.to(device, non_blocking=True) if isinstance(images, torch.Tensor)
                          else [img.to(device, non_blocking=True) for img in images])
                feats = encoder(prepare(images), readouts)
                c = chunk_of[int(index[0])]
                for r in readouts:
                    collected[c][r].append(feats[r].float().cpu().numpy())
                filled[c] += len(index)
                n_done += len(index)
                s, e = bounds[c]
                if filled[c] == e - s:
                    chunk_feats = {r: np.concatenate(v) for r, v in collected.pop(c).items()}
                    _check_finite(chunk_feats, ids[s:e], name, precision)
                    _write_chunk(chunk_path(chunk_dir, c), ids[s:e], chunk_feats, keys[c], c)
                    logger.info("chunk %05d: computed (%d items)", c, e - s)
                if b % log_every == 0 or n_done == n_total:
                    elapsed = time.perf_counter() - t0
                    logger.info("%d/%d items, %.1f images/s", n_done, n_total, n_done / max(elapsed, 1e-9))
    finally:
        dataset.close()
    elapsed = time.perf_counter() - t0
    rate = n_done / max(elapsed, 1e-9)
    logger.info("embedded %d items in %.1f s (%.1f images/s, dataset + loader + model)", n_done, elapsed, rate)
    return round(rate, 2)


# --------------------------------------------------------------------------------------------------------
# images a user brings (fmaudit embed)
# --------------------------------------------------------------------------------------------------------

#: Image files a folder given to :func:`image_manifest` contributes (by suffix, any case).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")


def image_manifest(source: PathLike, dataset: str = "images") -> pd.DataFrame:
    """A manifest of image files, to embed outside the workflow: a sheet (``.csv`` or ``.tsv``) with a ``path``
    column, paths relative to the sheet, and an optional ``item_id`` column (default: the path as written), or
    a folder, every image file below it (:data:`IMAGE_SUFFIXES`) in sorted order, its item id the path relative
    to the folder. A missing file is an error naming the sheet row; so is a repeated item id.

    Parameters
    ----------
    source : str or Path
        A folder of images, or a ``.csv``/``.tsv`` sheet.
    dataset : str, default "images"
        The manifest's ``dataset`` and ``domain`` value; each item is its own ``group``.

    Returns
    -------
    DataFrame
        A validated manifest, ``source`` the absolute path of each image.

    Raises
    ------
    FmauditInputError
        On a folder without images, a sheet without ``path``, a row without a path or with a missing file, or a
        repeated item id.
    """
    source = Path(source)
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise FmauditInputError(f"{source}: no image files ({', '.join(IMAGE_SUFFIXES)}) in this folder")
        rows = [{"item_id": p.relative_to(source).as_posix(), "source": str(p.resolve())} for p in files]
    else:
        sheet = read_table(source)
        if "path" not in sheet.columns:
            raise FmauditInputError(f"{source}: an image sheet needs a 'path' column (it has {list(sheet.columns)})")
        rows = []
        for i, row in enumerate(sheet.itertuples(index=False)):
            written = row.path
            if pd.isna(written) or not str(written).strip():
                raise FmauditInputError(f"{source}: row {i + 1} has no path")
            path = Path(str(written))
            path = path if path.is_absolute() else source.parent / path
            if not path.is_file():
                raise FmauditInputError(f"{source}: row {i + 1}: image file {path} does not exist")
            item = getattr(row, "item_id", None) if "item_id" in sheet.columns else None
            rows.append({"item_id": str(written) if item is None or pd.isna(item) else str(item),
                         "source": str(path.resolve())})
    manifest = make_manifest([{**r, "dataset": dataset, "group": r["item_id"], "domain": dataset} for r in rows])
    return validate_manifest(manifest, name=str(source))


# --------------------------------------------------------------------------------------------------------
# reading embeddings back
# --------------------------------------------------------------------------------------------------------

def read_embeddings(path: PathLike, readout: str) -> tuple[np.ndarray, np.ndarray]:
    """``(item_ids, features)`` of one readout of an embeddings file; non-finite features are an error.

    Parameters
    ----------
    path : str or Path
        An ``.npz`` written by :func:`embed_manifest`.
    readout : str
        The readout to read, e.g. ``"cls"``.

    Returns
    -------
    item_ids : ndarray of str, shape (n_items,)
    features : ndarray of float32, shape (n_items, D)
        (``patch_grid``: (n_items, D, h, w)).

    Raises
    ------
    FmauditInputError
        When the file has no ``item_id`` or no such readout, the lengths differ, or a row holds NaN/inf.
    """
    arrays, _ = read_npz(path)
    if "item_id" not in arrays:
        raise FmauditInputError(f"{path}: no 'item_id' array; not an fmaudit embeddings file")
    key = FEATURE_PREFIX + readout
    if key not in arrays:
        have = sorted(k[len(FEATURE_PREFIX):] for k in arrays if k.startswith(FEATURE_PREFIX))
        raise FmauditInputError(f"{path}: no readout {readout!r} (it has {have})")
    ids = arrays["item_id"].astype(str)
    feats = arrays[key]
    if len(feats) != len(ids):
        raise FmauditInputError(f"{path}: {len(feats)} rows of {readout!r} for {len(ids)} item ids")
    ok = np.isfinite(feats.reshape(len(feats), -1)).all(axis=1)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise FmauditInputError(
            f"{path}: readout {readout!r} has NaN/inf features for {int((~ok).sum())} item(s), first {str(ids[i])!r} "
            f"(row {i})")
    return ids, feats


def align_to_manifest(features: np.ndarray, ids: Sequence[str], manifest: pd.DataFrame | Sequence[str],
                      source: str = "embeddings") -> np.ndarray:
    """Rows of ``features`` (labelled by ``ids``) reordered to the manifest's item order.

    Extra embedded items are ignored; a manifest item without an embedding, duplicate ids or a length
    mismatch raise :class:`FmauditInputError` naming the items.

    Parameters
    ----------
    features : ndarray of shape (n, ...)
        One row per embedded item.
    ids : sequence of str
        The item id of each row of ``features``.
    manifest : DataFrame or sequence of str
        A manifest (its ``item_id`` column) or the wanted item ids, in the wanted order.
    source : str, default "embeddings"
        What ``features`` came from, quoted in errors (e.g. the file's path).

    Returns
    -------
    ndarray of shape (n_manifest, ...)
        ``features`` rows in manifest order.
    """
    ids = [str(i) for i in ids]
    if len(ids) != len(features):
        raise FmauditInputError(f"{source}: {len(features)} feature rows for {len(ids)} item ids")
    position: dict[str, int] = {}
    for i, item in enumerate(ids):
        if item in position:
            raise FmauditInputError(f"{source}: item id {item!r} occurs more than once (rows {position[item]}, {i})")
        position[item] = i
    wanted = (manifest["item_id"] if isinstance(manifest, pd.DataFrame) else pd.Series(manifest)).astype(str)
    missing = [item for item in wanted if item not in position]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise FmauditInputError(
            f"{source}: {len(missing)} manifest item(s) have no embedding, e.g. {shown}; re-embed with this manifest")
    return np.asarray(features)[[position[item] for item in wanted]]


def _weights_text(identity: Mapping[str, Any] | None) -> str | None:
    """One line saying what the weights of an embedding were (see ``ResolvedWeights.identity``)."""
    if not identity:
        return None
    source = identity.get("source")
    if source == "random":
        return f"random init (seed {identity.get('seed', 0)})"
    if source == "hf_hub":
        commit = identity.get("resolved_commit") or "unknown commit"
        asked = identity.get("revision")
        pinned = "" if asked and asked == commit else f" (revision asked: {asked or 'default branch'})"
        return f"{identity.get('hf_hub_id')} @ {commit}{pinned}"
    return {"file": "local file (weights.path)", "override": "local file (encoder_weights)"}.get(source, str(source))


def embedding_inventory(paths: Sequence[PathLike]) -> pd.DataFrame:
    """One row per embedding file (``<encoder>/<key>/<dataset>.npz``), from its provenance alone (the feature
    arrays are not read): items, readouts with their widths, speed, device, the weights it was made with (the
    hub commit they resolved to, every file's sha256) and the hashes that identify it.

    Parameters
    ----------
    paths : sequence of str or Path
        Embedding files (``.npz``).

    Returns
    -------
    DataFrame
        Columns ``encoder``, ``dataset``, ``n_items``, ``readouts`` (``"cls (768), mean (768)"``),
        ``images_per_s``, ``device``, ``weights`` (one line), ``weights_sha256`` (``; ``-joined),
        ``weights_sha256_checked``, ``embedding_key``, ``encoder_config_hash``, ``manifest_hash``,
        ``fmaudit_version``.
    """
    rows = []
    for p in map(Path, paths):
        prov = read_npz_provenance(p)
        dims = prov.get("embed_dim") or {}
        identity = prov.get("weights") or {}
        rows.append({
            "encoder": prov.get("encoder") or p.parent.name, "dataset": p.stem, "n_items": prov.get("n_items"),
            "readouts": ", ".join(f"{r} ({dims[r]})" for r in prov.get("readouts") or dims),
            "images_per_s": prov.get("images_per_s"), "device": prov.get("device"),
            "weights": _weights_text(identity),
            "weights_sha256": "; ".join(identity.get("sha256") or []) or None,
            "weights_sha256_checked": prov.get("weights_sha256_checked"),
            "embedding_key": prov.get("embedding_key"),
            "encoder_config_hash": prov.get("encoder_config_hash"), "manifest_hash": prov.get("manifest_hash"),
            "fmaudit_version": prov.get("fmaudit_version"),
        })
    return pd.DataFrame(rows)
