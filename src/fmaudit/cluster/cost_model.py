"""The cost model of a job (its assumptions are the module's constants; the model itself is described in
:mod:`fmaudit.cluster`): an encoder's work per image, its load time and GPU memory, and the items of a job read
from its prepared manifest."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fmaudit.io import FmauditInputError, PathLike

# ---- the cost model's assumptions (see the module doc) ---------------------------------------------------

#: Sustained TFLOP/s of one GPU by autocast precision: a conservative fraction of a data-centre card's peak
#: (A100: 312 dense fp16/bf16, 19.5 fp32); measurements of a pilot replace them.
GPU_TFLOPS = {"float16": 60.0, "bfloat16": 60.0, "float32": 12.0}
#: Sustained GFLOP/s of one CPU thread (an encoder without ``gpu``: the demo's tiny networks).
CPU_GFLOPS_PER_THREAD = 20.0
#: Seconds to read, decode and resize one tile, and to read and resize one patch of a slide, per loader worker.
TILE_READ_S = 0.004
PATCH_READ_S = 0.008
#: Seconds to start a job's interpreter, import torch and start CUDA; checkpoint bytes read per second.
LOAD_BASE_S = 30.0
LOAD_BYTES_PER_S = 200e6
#: Values of one token's activations alive at once in a forward pass, in units of the width (qkv, MLP, residual).
ACTIVATION_FACTOR = 12
GPU_CONTEXT_MB = 1000.0
HOST_BASE_MB = 3000.0
WORKER_MB = 300.0
#: Host bytes per cell of a section job: the manifest's row and the per-cell arrays of one magnification.
CELL_ROW_BYTES = 400
TIME_MARGIN = 1.5
MEMORY_MARGIN = 1.25
MEASURED_MARGIN = 1.3
MIN_RUNTIME_MIN = 10
MIN_MEM_MB = 1000
#: Items of a tile data set whose manifest is not prepared yet.
DEFAULT_TILES = 100_000
#: Bytes per value of an autocast precision.
PRECISION_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class SectionExtent:
    """What a cell section's patch count is estimated from: its nuclei and their bounding box in µm.

    Parameters
    ----------
    cells : int
        Number of cells (rows of the cell manifest).
    width_um, height_um : float
        Width and height of the nuclei's bounding box, in µm.
    source : str
        The manifest the extent was read from, or ``"default"`` for :data:`DEFAULT_SECTION`.
    """

    cells: int
    width_um: float
    height_um: float
    source: str  # the manifest read, or "default"


#: A section whose manifest is not prepared yet: 400,000 cells over 12 x 12 mm (a large Xenium section).
DEFAULT_SECTION = SectionExtent(400_000, 12_000.0, 12_000.0, "default")


@dataclass(frozen=True)
class EncoderCost:
    """An encoder as the cost model sees it (see the module doc); built by :func:`encoder_cost`.

    Parameters
    ----------
    name : str
        The registry name of the encoder.
    params : float
        Parameters of the image tower (``params_m * 1e6``).
    input_size : int
        Side of the square input image, in pixels.
    tokens : int
        Tokens per image: ``ceil(input_size / patch_size)**2 + num_prefix_tokens``.
    width : int
        Embedding width (``embed_dim``).
    precision : str
        Autocast precision on the GPU: ``"float16"``, ``"bfloat16"`` or ``"float32"``.
    on_gpu : bool
        Whether the entry runs on a GPU (registry key ``gpu``).
    """

    name: str
    params: float
    input_size: int
    tokens: int
    width: int
    precision: str
    on_gpu: bool

    @property
    def depth(self) -> float:
        """Estimated number of transformer blocks, ``params / (12 * width**2)``, at least 1.
        """
        return max(1.0, self.params / (12.0 * self.width**2))

    @property
    def heads(self) -> float:
        """Estimated attention heads, ``width / 64``, at least 1.
        """
        return max(1.0, self.width / 64.0)

    @property
    def flops_per_image(self) -> float:
        """Floating-point operations of one forward pass of one image (dense layers plus attention).
        """
        return 2.0 * self.params * self.tokens + 4.0 * self.depth * self.tokens**2 * self.width

    @property
    def weight_mb(self) -> float:
        """Size of the fp32 weights, in MB.
        """
        return self.params * 4 / 1e6

    @property
    def load_s(self) -> float:
        """Seconds to start the job and load the fp32 checkpoint.
        """
        return LOAD_BASE_S + self.params * 4 / LOAD_BYTES_PER_S

    def seconds_per_image(self, threads: int, read_s: float) -> float:
        """The slower of the model and the loader workers, per image.

        Parameters
        ----------
        threads : int
            Threads of the job; on a GPU, ``threads - 1`` of them are loader workers.
        read_s : float
            Seconds one worker takes to read and transform one image (:data:`TILE_READ_S`, :data:`PATCH_READ_S`).

        Returns
        -------
        float
            Wall seconds per image.
        """
        if self.on_gpu:
            model = self.flops_per_image / (GPU_TFLOPS.get(self.precision, GPU_TFLOPS["float32"]) * 1e12)
            workers = max(1, threads - 1)
        else:  # the CPU runs the model and reads the images on the same threads
            model = self.flops_per_image / (CPU_GFLOPS_PER_THREAD * 1e9 * max(1, threads))
            return model + read_s / max(1, threads)
        return max(model, read_s / workers)

    def gpu_memory_mb(self, batch_size: int) -> float:
        """Peak GPU memory of a forward pass of ``batch_size`` images (0 for a CPU-only entry).

        Parameters
        ----------
        batch_size : int
            Images per forward pass.

        Returns
        -------
        float
            GPU memory in MB, including :data:`GPU_CONTEXT_MB` and :data:`MEMORY_MARGIN`.
        """
        if not self.on_gpu:
            return 0.0
        value = PRECISION_BYTES.get(self.precision, 4)
        activations = batch_size * self.tokens * self.width * ACTIVATION_FACTOR * value
        attention = batch_size * self.heads * self.tokens**2 * value
        return (self.weight_mb + (activations + attention) / 1e6 + GPU_CONTEXT_MB) * MEMORY_MARGIN


def encoder_cost(name: str, spec: Mapping[str, Any]) -> EncoderCost:
    """The cost model's view of a registry entry: ``params_m``, ``preprocessing.input_size``, ``patch_size``,
    ``num_prefix_tokens``, ``embed_dim``, ``precision`` and ``gpu``.

    Parameters
    ----------
    name : str
        The encoder's registry name (quoted in errors).
    spec : Mapping
        Its registry entry; ``patch_size`` defaults to 16, ``num_prefix_tokens`` to 0, ``precision`` to
        ``"float32"``, ``gpu`` to False.

    Returns
    -------
    EncoderCost

    Raises
    ------
    FmauditInputError
        When the entry has no ``params_m``.
    """
    if spec.get("params_m") is None:
        raise FmauditInputError(f"encoder {name!r}: the registry entry has no params_m (parameters in millions of "
                                "its image tower), which the cluster requests are sized from; add it")
    size = int(spec["preprocessing"]["input_size"])
    patch = int(spec.get("patch_size") or 16)
    tokens = math.ceil(size / patch) ** 2 + int(spec.get("num_prefix_tokens") or 0)
    return EncoderCost(name=name, params=float(spec["params_m"]) * 1e6, input_size=size, tokens=tokens,
                       width=int(spec["embed_dim"]), precision=str(spec.get("precision", "float32")),
                       on_gpu=bool(spec.get("gpu", False)))


# ---- items of a job ------------------------------------------------------------------------------------

def _parquet(path: PathLike):
    import pyarrow.parquet as pq

    return pq.ParquetFile(str(path))


def manifest_rows(path: PathLike) -> int | None:
    """Rows of a prepared manifest (parquet metadata, nothing read), or None when it does not exist.

    Parameters
    ----------
    path : str or Path
        A prepared manifest (parquet).

    Returns
    -------
    int or None
    """
    if not Path(path).is_file():
        return None
    return int(_parquet(path).metadata.num_rows)


def _column_range(pf, column: str) -> tuple[float, float] | None:
    """(min, max) of a column from the row groups' statistics, or None when a row group has none."""
    names = pf.schema_arrow.names
    if column not in names:
        raise FmauditInputError(f"{pf.metadata}: no column {column!r}")
    index = names.index(column)
    lows, highs = [], []
    for g in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        lows.append(float(stats.min))
        highs.append(float(stats.max))
    return (min(lows), max(highs)) if lows else (0.0, 0.0)


def section_extent(path: PathLike) -> SectionExtent | None:
    """A prepared cell manifest's cells and the µm bounding box of their nuclei (``he_x``, ``he_y`` in slide
    pixels of ``mpp`` µm), from the parquet metadata; the columns are read only where a file has no statistics.
    None when the manifest does not exist.

    Parameters
    ----------
    path : str or Path
        A prepared cell manifest (parquet with columns ``he_x``, ``he_y``, ``mpp``).

    Returns
    -------
    SectionExtent or None

    Raises
    ------
    FmauditInputError
        When the manifest lacks one of those columns.
    """
    if not Path(path).is_file():
        return None
    pf = _parquet(path)
    cells = int(pf.metadata.num_rows)
    ranges = {c: _column_range(pf, c) for c in ("he_x", "he_y", "mpp")}
    if any(r is None for r in ranges.values()):
        table = pf.read(columns=["he_x", "he_y", "mpp"]).to_pandas()
        ranges = {c: (float(table[c].min()), float(table[c].max())) if len(table) else (0.0, 0.0) for c in ranges}
    mpp = ranges["mpp"][1]
    width = (ranges["he_x"][1] - ranges["he_x"][0]) * mpp
    height = (ranges["he_y"][1] - ranges["he_y"][0]) * mpp
    return SectionExtent(cells, width, height, str(path))


def section_patches(extent: SectionExtent, magnification: float, input_size: int) -> int:
    """Patches of a section an encoder of ``input_size`` embeds at ``magnification`` (see the module doc).

    Parameters
    ----------
    extent : SectionExtent
        The section's cells and bounding box.
    magnification : float
        Magnification of the patches (a patch covers ``input_size * 10 / magnification`` µm).
    input_size : int
        The encoder's input side in pixels.

    Returns
    -------
    int
        ``min(cells, ceil(W / side) * ceil(H / side))`` with ``side = input_size * 10 / magnification`` µm.
    """
    side = input_size * 10.0 / float(magnification)
    grid = math.ceil(max(extent.width_um, side) / side) * math.ceil(max(extent.height_um, side) / side)
    return int(min(extent.cells, grid))
