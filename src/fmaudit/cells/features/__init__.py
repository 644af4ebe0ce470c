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

The package's modules: :mod:`~fmaudit.cells.features.readouts` (the readouts, Nuc sampling and fusions: arrays in,
arrays out), :mod:`~fmaudit.cells.features.patches` (magnification, patch geometry, the patch reader),
:mod:`~fmaudit.cells.features.folder` (the folder on disk: written atomically, opened memory-mapped) and
:mod:`~fmaudit.cells.features.extraction` (the manifest check and the resumable extraction job). Their public names
are importable from here.
"""

from fmaudit.cells.features.extraction import (
    CELL_MANIFEST_COLUMNS,
    GEOMETRY_COLUMNS,
    extract_cell_features,
    extract_section_features,
    validate_cell_manifest,
)
from fmaudit.cells.features.folder import (
    STORAGE_DTYPE,
    CellFeatures,
    atomic_dir,
    open_cell_features,
    write_cell_features,
)
from fmaudit.cells.features.patches import (
    PatchDataset,
    PatchGeometry,
    assign_cells_to_patches,
    magnification_mpp,
    plan_geometry,
)
from fmaudit.cells.features.readouts import (
    BASE_READOUTS,
    CELL_READOUTS,
    FUSIONS,
    NUC_CONVENTION,
    available_readouts,
    base_readouts_of,
    fuse_readout,
    needs_cls,
    readout_width,
    sample_token_grid,
)

__all__ = [
    "BASE_READOUTS", "CELL_MANIFEST_COLUMNS", "CELL_READOUTS", "FUSIONS", "GEOMETRY_COLUMNS", "NUC_CONVENTION",
    "STORAGE_DTYPE", "CellFeatures", "PatchDataset", "PatchGeometry", "assign_cells_to_patches", "atomic_dir",
    "available_readouts", "base_readouts_of", "extract_cell_features", "extract_section_features", "fuse_readout",
    "magnification_mpp", "needs_cls", "open_cell_features", "plan_geometry", "readout_width", "sample_token_grid",
    "validate_cell_manifest", "write_cell_features",
]
