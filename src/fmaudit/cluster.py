"""What a cluster is asked for: each job's memory and wall time, sized from a cost model of its encoder and its
item count (or from what an earlier run of the same rule and encoder measured), the GPU class it needs, and what a
whole plan asks for (``fmaudit grid --estimate``). The workflow's resource functions (rules/common.smk) and the
estimate call the same :class:`RequestPlanner`, so the estimate is what Snakemake submits.

The cost model (a GPU job; every constant below is a stated assumption, replaced by measurements once a run of the
same rule and encoder has left its benchmark files):

- **Work per image** (a tile, or a patch of a cell section): ``2 * params * tokens + 4 * depth * tokens**2 *
  width`` floating-point operations (the dense layers, then attention), with ``params`` the registry's
  ``params_m`` (the image tower of a vision-language model), ``tokens = (input_size / patch_size)**2 +
  num_prefix_tokens`` (a CNN counts as patch size 16), ``width = embed_dim`` and ``depth = params / (12 *
  width**2)`` (a transformer block holds about 12 width² weights). At :data:`GPU_TFLOPS` sustained for the
  entry's ``precision`` (autocast on the GPU), or :data:`CPU_GFLOPS_PER_THREAD` for an entry without ``gpu``.
  Reading images runs beside the model on ``threads - 1`` loader workers (:data:`TILE_READ_S`,
  :data:`PATCH_READ_S` per image and worker); a job takes the slower of the two.
- **Load**: :data:`LOAD_BASE_S` (interpreter, torch, CUDA) plus the fp32 checkpoint at :data:`LOAD_BYTES_PER_S`.
- **Wall time** = (load + images x seconds per image) x :data:`TIME_MARGIN`, at least :data:`MIN_RUNTIME_MIN`.
- **GPU memory**: fp32 weights (autocast keeps them fp32) + activations of one batch (``batch * tokens * width *
  ACTIVATION_FACTOR`` values of the precision's size, plus the attention scores of one layer, ``batch * heads *
  tokens**2``, heads = width / 64) + :data:`GPU_CONTEXT_MB`, x :data:`MEMORY_MARGIN`.
- **Host memory**: :data:`HOST_BASE_MB` + twice the fp32 weights (the network and the checkpoint's state dict
  both sit in memory while loading) + :data:`WORKER_MB` per loader worker + what the job holds at once (tiles:
  every readout of every item in float32, twice while the chunks are stacked; cells: the manifest and per-cell
  tables, :data:`CELL_ROW_BYTES` a cell, the features going chunk by chunk to memory maps), x
  :data:`MEMORY_MARGIN`.
- **Items**: a tile data set's manifest rows; a cell section's patches at each magnification, ``min(cells,
  ceil(W / side) * ceil(H / side))`` with W x H the bounding box of its nuclei and ``side = input_size * 10 / m``
  µm the patch's side at magnification m. Both read from the prepared manifest (parquet metadata: row count and
  column statistics, no rows read) when it exists at plan time; before it exists, :data:`DEFAULT_TILES` and
  :data:`DEFAULT_SECTION` (stated, and a job's request is evaluated again when it is submitted, once its
  manifest is there).

**Measured** (:func:`read_benchmarks`): when benchmark files of an earlier run of the same rule and encoder exist
(``results/<study>/benchmarks/<rule>/<encoder>/...tsv``), the wall time is the model's prediction times the
largest measured/predicted ratio among them (the model calibrated to this cluster's GPUs and file system) and the
host memory the largest measured peak (``max_rss``), each x :data:`MEASURED_MARGIN`. A shard (CPU) job has no
item model: its request is the rule's default, or its measured peak and time plus the margin.

Retries keep growing: memory and wall time are multiplied by the attempt, as before. The GPU class
(:func:`gpu_class`) is the smallest of the site's classes (``gpu_classes``, a resource of the Slurm profile's
default-resources) whose memory holds the job's estimated GPU memory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.config import dataset_params
from fmaudit.grid import (
    cell_plan,
    derived_datasets,
    embed_pairs,
    ood_shard_plan,
    ood_shards,
    ood_split_shards,
    parts_with,
    prior_shift_runs,
    scratch_reference_runs,
    shards,
)
from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import embedding_key

__all__ = ["ClusterSettings", "DEFAULT_SECTION", "DEFAULT_TILES", "ESTIMATE_COLUMNS", "EncoderCost", "FIXED_REQUESTS",
           "GROUP_PATTERNS", "GpuClass", "JobRequest", "Measured", "RequestPlanner", "SHARD_DEFAULTS", "SectionExtent",
           "encoder_cost", "estimate", "estimate_table", "gpu_class", "manifest_rows", "parse_gpu_classes",
           "planned_requests", "read_benchmarks", "scratch_request", "section_extent", "section_patches",
           "submissions"]

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
#: What a benchmark file's peak memory and wall time are read from (Snakemake's benchmark columns).
BENCHMARK_COLUMNS = ("s", "max_rss")
#: The rows of :func:`RequestPlanner.estimate` (one per rule and encoder, then one per rule and a total).
ESTIMATE_COLUMNS = ("rule", "encoder", "jobs", "submissions", "gpus", "cpus", "mem_mb_max", "gpu_mem_mb",
                    "gpu_class", "runtime_min_job_max", "runtime_min_submission_max", "gpu_hours", "cpu_hours",
                    "basis")


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


# ---- measurements of an earlier run ----------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """Benchmark rows of one rule and encoder: per job, its wall seconds, peak MB and wildcards-path.

    Parameters
    ----------
    jobs : tuple of (str, float, float)
        One entry per benchmark file: its path relative to ``benchmarks/<rule>/<encoder>`` without ``.tsv`` (the
        job's wildcards), wall seconds and peak resident memory in MB (NaN when not sampled).
    """

    jobs: tuple[tuple[str, float, float], ...]  # (path relative to the rule's encoder folder, s, max_rss MB)

    @property
    def peak_mb(self) -> float | None:
        """Largest peak resident memory in MB over the jobs, or None when none was sampled.
        """
        values = [m for _, _, m in self.jobs if np.isfinite(m)]
        return max(values) if values else None

    @property
    def max_s(self) -> float | None:
        """Longest wall time in seconds over the jobs, or None when none was sampled.
        """
        values = [s for _, s, _ in self.jobs if np.isfinite(s)]
        return max(values) if values else None


def read_benchmarks(folder: PathLike) -> Measured | None:
    """Every benchmark file under ``folder`` (``benchmarks/<rule>/<encoder>``): its wall time (``s``, summed
    over repeats) and peak resident memory (``max_rss``, MB, the largest); None when there is none. A value
    Snakemake could not sample (``NA``: a job too short) is NaN and ignored.

    Parameters
    ----------
    folder : str or Path
        ``results/<study>/benchmarks/<rule>/<encoder>``; read recursively for ``*.tsv`` files with columns
        ``s`` and ``max_rss`` (unreadable or other files are skipped).

    Returns
    -------
    Measured or None
    """
    root = Path(folder)
    if not root.is_dir():
        return None
    jobs = []
    for path in sorted(root.rglob("*.tsv")):
        try:
            table = pd.read_csv(path, sep="\t")
        except (OSError, ValueError, pd.errors.EmptyDataError):
            continue
        if not set(BENCHMARK_COLUMNS) <= set(table.columns) or table.empty:
            continue
        s = pd.to_numeric(table["s"], errors="coerce")
        rss = pd.to_numeric(table["max_rss"], errors="coerce")
        jobs.append((str(path.relative_to(root).with_suffix("")), float(s.sum(min_count=1)),
                     float(rss.max()) if rss.notna().any() else float("nan")))
    return Measured(tuple(jobs)) if jobs else None


# ---- GPU classes -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuClass:
    """GPUs of ``memory_gb`` and the Slurm constraint that asks for them ('' for none: any GPU).

    Parameters
    ----------
    memory_gb : float
        Memory of one GPU of the class, in GB (> 0).
    constraint : str
        The Slurm ``--constraint`` that selects it; ``""`` for any GPU.
    """

    memory_gb: float
    constraint: str


def parse_gpu_classes(text: str | None) -> tuple[GpuClass, ...]:
    """``"24:,48:gpu48g,80:a100_80g|h100"`` (GPU memory in GB: constraint, comma-separated) -> classes by
    memory. An empty text means no classes (no constraint is ever set).

    Parameters
    ----------
    text : str or None
        The profile's ``gpu_classes`` resource.

    Returns
    -------
    tuple of GpuClass
        Sorted by ascending memory; empty for an empty text.

    Raises
    ------
    FmauditInputError
        When an item is not ``<GB>:<constraint>`` with a positive number and a constraint of Slurm's characters.
    """
    if not text or not str(text).strip():
        return ()
    classes = []
    for item in str(text).split(","):
        if not item.strip():
            continue
        memory, sep, constraint = item.partition(":")
        try:
            gb = float(memory)
        except ValueError:
            gb = float("nan")
        if (not sep or not math.isfinite(gb) or gb <= 0
                or not re.fullmatch(r"[A-Za-z0-9_.|&\[\]*-]*", constraint.strip())):
            raise FmauditInputError(f"gpu_classes {text!r}: {item.strip()!r} is not '<GPU memory in GB>:<constraint>' "
                                    "(e.g. 80:a100_80g; an empty constraint means any GPU)")
        classes.append(GpuClass(gb, constraint.strip()))
    return tuple(sorted(classes, key=lambda c: c.memory_gb))


def gpu_class(gpu_memory_mb: float, classes: Sequence[GpuClass]) -> GpuClass | None:
    """The smallest class whose memory holds ``gpu_memory_mb``; the largest when none does; None without
    classes or for a job that needs no GPU.

    Parameters
    ----------
    gpu_memory_mb : float
        A job's estimated GPU memory in MB (0 for a CPU job).
    classes : sequence of GpuClass
        The site's classes, sorted by memory (as :func:`parse_gpu_classes` returns them).

    Returns
    -------
    GpuClass or None
    """
    if not classes or gpu_memory_mb <= 0:
        return None
    for c in classes:
        if gpu_memory_mb <= c.memory_gb * 1024:
            return c
    return classes[-1]


# ---- requests -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobRequest:
    """What one job asks for at attempt 1 (memory and wall time grow with the attempt: :meth:`at`).

    Parameters
    ----------
    mem_mb : int
        Host memory in MB.
    runtime_min : int
        Wall time in minutes.
    gpus : int
        GPUs (0 or 1).
    gpu_mem_mb : int, default 0
        Estimated GPU memory in MB (picks the GPU class).
    basis : str, default "model"
        Where the numbers come from: ``"model"`` (the cost model), ``"measured"`` (an earlier run's benchmarks)
        or ``"default"`` (stated defaults: no manifest or no measurements yet).
    items : int, default 0
        Images the job embeds (tiles or patches); 0 for a shard job.
    """

    mem_mb: int
    runtime_min: int
    gpus: int
    gpu_mem_mb: int = 0
    basis: str = "model"  # "model", "measured" or "default"
    items: int = 0

    def at(self, attempt: int) -> tuple[int, int]:
        """(mem_mb, runtime_min) at ``attempt``.

        Parameters
        ----------
        attempt : int
            Snakemake's attempt number, from 1.

        Returns
        -------
        tuple of (int, int)
            Memory in MB and wall minutes, both multiplied by ``attempt``.
        """
        return self.mem_mb * int(attempt), self.runtime_min * int(attempt)


def _minutes(seconds: float) -> int:
    return max(MIN_RUNTIME_MIN, int(math.ceil(seconds / 60.0)))


def _mb(value: float) -> int:
    """Memory rounded up to a whole GB, at least :data:`MIN_MEM_MB`."""
    return max(MIN_MEM_MB, int(math.ceil(value / 1000.0)) * 1000)


def submissions(jobs: int, per_submission: int) -> int:
    """Cluster submissions of ``jobs`` jobs of one group, ``per_submission`` to a submission
    (``--group-components``; Snakemake chunks a group's connected components in that size).

    Parameters
    ----------
    jobs : int
        Jobs of the group.
    per_submission : int
        Jobs per submission (values below 1 count as 1).

    Returns
    -------
    int
    """
    return int(math.ceil(jobs / max(1, int(per_submission)))) if jobs else 0


#: Requests of the CPU shard rules without measurements (memory MB, wall minutes, per attempt).
SHARD_DEFAULTS = {"probe_shard": (4000, 60), "ood_shard": (4000, 60), "ood_split_shard": (4000, 60),
                  "cell_shard": (4000, 60), "prior_shift_shard": (8000, 60)}
#: Requests of the data-preparation rules that run on the cluster (memory MB, wall minutes, per attempt).
FIXED_REQUESTS = {"prepare_manifest": (4000, 60), "derive_manifest": (2000, 30), "prepare_cell_section": (8000, 60)}
def scratch_request(gpu: bool) -> JobRequest:
    """The scratch reference's request (a ResNet-18 trained from scratch; on a GPU where the config says so).

    Parameters
    ----------
    gpu : bool
        Whether the prior-shift part's ``scratch_reference.gpu`` puts the training on a GPU.

    Returns
    -------
    JobRequest
        32 GB, 4 h and one GPU on a GPU; 4 GB and 1 h on the CPU (basis ``"default"``).
    """
    return JobRequest(32000, 240, 1, 0, "default") if gpu else JobRequest(4000, 60, 0, 0, "default")


#: The group of each grouped rule's jobs: one group per encoder, a few of its jobs to a cluster submission (the
#: profile's group-components, by these names; the rules' ``group:`` directives, tests/test_cluster.py keeps
#: them equal).
GROUP_PATTERNS = {rule: f"{rule}_{{encoder}}" for rule in ("embed", "cell_features", "probe_shard", "ood_shard",
                                                            "ood_split_shard", "prior_shift_shard", "cell_shard")}


@dataclass
class RequestPlanner:
    """Requests of a study's jobs, cached per encoder and item source (the dry run evaluates thousands).

    Parameters
    ----------
    encoders : Mapping of str to Mapping
        Registry entries by encoder name, as the config sees them.
    benchmarks : str or Path, optional
        The study's benchmark folder (``results/<study>/benchmarks``), whose earlier measurements calibrate the
        requests; None uses the cost model alone.
    batch_size : int, default 64
        The GPU rules' batch size (sets the GPU memory estimate).
    gpu_classes : tuple of GpuClass, default ()
        The site's GPU classes (:func:`parse_gpu_classes`).
    """

    encoders: Mapping[str, Mapping[str, Any]]
    benchmarks: PathLike | None = None
    batch_size: int = 64
    gpu_classes: tuple[GpuClass, ...] = ()
    _costs: dict = field(default_factory=dict, repr=False)
    _measured: dict = field(default_factory=dict, repr=False)
    _extents: dict = field(default_factory=dict, repr=False)
    _rows: dict = field(default_factory=dict, repr=False)
    _requests: dict = field(default_factory=dict, repr=False)

    # -- inputs, cached

    def cost(self, encoder: str) -> EncoderCost:
        """The cost model of ``encoder`` (:func:`encoder_cost`), cached.

        Parameters
        ----------
        encoder : str
            A name in ``encoders``.

        Returns
        -------
        EncoderCost
        """
        if encoder not in self._costs:
            self._costs[encoder] = encoder_cost(encoder, self.encoders[encoder])
        return self._costs[encoder]

    def measured(self, rule: str, encoder: str) -> Measured | None:
        """Benchmarks of an earlier run of ``rule`` for ``encoder`` (:func:`read_benchmarks`), cached.

        Parameters
        ----------
        rule : str
            The Snakemake rule, e.g. ``"embed"``.
        encoder : str
            The encoder's name.

        Returns
        -------
        Measured or None
        """
        key = (rule, encoder)
        if key not in self._measured:
            self._measured[key] = (read_benchmarks(Path(self.benchmarks) / rule / encoder)
                                   if self.benchmarks is not None else None)
        return self._measured[key]

    def extent(self, manifest: PathLike) -> SectionExtent:
        """A cell section's extent (:func:`section_extent`), :data:`DEFAULT_SECTION` before it is prepared.

        Parameters
        ----------
        manifest : str or Path
            The section's cell manifest.

        Returns
        -------
        SectionExtent
        """
        key = str(manifest)
        if key not in self._extents:
            self._extents[key] = section_extent(manifest) or DEFAULT_SECTION
        return self._extents[key]

    def rows(self, manifest: PathLike, fallback: PathLike | None = None) -> tuple[int, str]:
        """(items, where from) of a tile manifest: its rows; else ``fallback``'s (a derived copy's source
        data set, an upper bound); else :data:`DEFAULT_TILES`.

        Parameters
        ----------
        manifest : str or Path
            The data set's prepared manifest.
        fallback : str or Path, optional
            The source data set's manifest of a derived copy.

        Returns
        -------
        tuple of (int, str)
            The item count and ``"manifest"`` or ``"default"``.
        """
        key = (str(manifest), str(fallback))
        if key not in self._rows:
            n = manifest_rows(manifest)
            if n is None and fallback is not None:
                n = manifest_rows(fallback)
            self._rows[key] = (n, "manifest") if n is not None else (DEFAULT_TILES, "default")
        return self._rows[key]

    # -- the model's seconds and memory of one job

    def _cell_seconds(self, encoder: str, extent: SectionExtent, magnifications: Sequence[float],
                      threads: int) -> tuple[float, int]:
        cost = self.cost(encoder)
        patches = sum(section_patches(extent, m, cost.input_size) for m in magnifications)
        return cost.load_s + patches * cost.seconds_per_image(threads, PATCH_READ_S), patches

    def _tile_seconds(self, encoder: str, items: int, threads: int) -> float:
        cost = self.cost(encoder)
        return cost.load_s + items * cost.seconds_per_image(threads, TILE_READ_S)

    def _calibrated(self, rule: str, encoder: str, predicted_s: float, host_mb: float,
                    predict_measured) -> tuple[float, float, str]:
        """(wall seconds, host MB, basis): the model's, or scaled by an earlier run's measurements."""
        measured = self.measured(rule, encoder)
        if measured is None:
            return predicted_s * TIME_MARGIN, host_mb, "model"
        ratios = []
        for job, seconds, _ in measured.jobs:
            expected = predict_measured(job)
            if expected and np.isfinite(seconds) and expected > 0:
                ratios.append(seconds / expected)
        seconds = predicted_s * max(ratios) * MEASURED_MARGIN if ratios else predicted_s * TIME_MARGIN
        peak = measured.peak_mb
        memory = peak * MEASURED_MARGIN if peak is not None else host_mb
        return seconds, memory, "measured"

    # -- the requests

    def cell_features(self, encoder: str, manifest: PathLike, magnifications: Sequence[float],
                      threads: int) -> JobRequest:
        """One (encoder, section) feature job over ``magnifications``; ``manifest``: the section's cell manifest.
        Measured jobs of the rule are ``<key>/<section>`` benchmark files; their sections' manifests lie beside
        ``manifest``.

        Parameters
        ----------
        encoder : str
            The encoder's name.
        manifest : str or Path
            The section's cell manifest (``cells/sections/<section>.parquet``).
        magnifications : sequence of float
            The magnifications the job embeds; the patches of each add up.
        threads : int
            The job's threads.

        Returns
        -------
        JobRequest
            Memory, wall time, GPUs and GPU memory at attempt 1, with its ``basis`` (``"model"``, ``"measured"``, or
            ``"default"`` when the manifest is not prepared yet) and ``items``.
        """
        key = ("cell_features", encoder, str(manifest), tuple(magnifications), int(threads))
        if key not in self._requests:
            cost = self.cost(encoder)
            extent = self.extent(manifest)
            predicted, patches = self._cell_seconds(encoder, extent, magnifications, threads)
            # the manifest and the per-cell tables of one magnification (features go chunk by chunk to memory maps)
            tables_mb = extent.cells * CELL_ROW_BYTES / 1e6
            host = (HOST_BASE_MB + 2 * cost.weight_mb + WORKER_MB * max(0, threads - 1) + tables_mb) * MEMORY_MARGIN
            folder = Path(manifest).parent

            def predict(job: str) -> float | None:
                section = Path(job).name
                other = self.extent(folder / f"{section}.parquet")
                return self._cell_seconds(encoder, other, magnifications, threads)[0]

            seconds, memory, basis = self._calibrated("cell_features", encoder, predicted, host, predict)
            if basis == "model" and extent.source == "default":
                basis = "default"
            self._requests[key] = JobRequest(_mb(memory), _minutes(seconds), 1 if cost.on_gpu else 0,
                                             int(math.ceil(cost.gpu_memory_mb(self.batch_size))), basis, patches)
        return self._requests[key]

    def embed(self, encoder: str, manifest: PathLike, threads: int, fallback: PathLike | None = None,
              readout_width: int | None = None) -> JobRequest:
        """One (encoder, data set) embedding job; ``manifest``: the data set's manifest (``fallback``: the
        source data set's, for a derived copy not prepared yet). Measured jobs are ``<key>/<dataset>`` files;
        their manifests lie beside ``manifest``.

        Parameters
        ----------
        encoder : str
            The encoder's name.
        manifest : str or Path
            The data set's manifest (``manifests/<dataset>.parquet``).
        threads : int
            The job's threads.
        fallback : str or Path, optional
            The source data set's manifest, for a derived copy not prepared yet.
        readout_width : int, optional
            Total width of the readouts written per item; default three times ``embed_dim`` (cls, mean, a fusion).

        Returns
        -------
        JobRequest
            Memory, wall time, GPUs and GPU memory at attempt 1, with its ``basis`` (``"model"``, ``"measured"``, or
            ``"default"`` when the manifest is not prepared yet) and ``items``.
        """
        key = ("embed", encoder, str(manifest), str(fallback), int(threads))
        if key not in self._requests:
            cost = self.cost(encoder)
            items, source = self.rows(manifest, fallback)
            predicted = self._tile_seconds(encoder, items, threads)
            width = readout_width or 3 * cost.width  # cls, mean and a fusion: the usual readouts
            out_mb = items * width * 4 * 2 / 1e6  # the chunks read back and the stacked arrays
            host = (HOST_BASE_MB + 2 * cost.weight_mb + WORKER_MB * max(0, threads - 1) + out_mb) * MEMORY_MARGIN
            folder = Path(manifest).parent

            def predict(job: str) -> float | None:
                n, _ = self.rows(folder / f"{Path(job).name}.parquet")
                return self._tile_seconds(encoder, n, threads)

            seconds, memory, basis = self._calibrated("embed", encoder, predicted, host, predict)
            if basis == "model" and source == "default":
                basis = "default"
            self._requests[key] = JobRequest(_mb(memory), _minutes(seconds), 1 if cost.on_gpu else 0,
                                             int(math.ceil(cost.gpu_memory_mb(self.batch_size))), basis, items)
        return self._requests[key]

    def shard(self, rule: str, encoder: str, default: tuple[int, int] | None = None) -> JobRequest:
        """A CPU shard job of ``rule`` for ``encoder``: the rule's default (memory MB, wall minutes), or the
        largest measured peak and wall time of the rule's earlier jobs for this encoder plus the margin.

        Parameters
        ----------
        rule : str
            The shard rule, e.g. ``"probe_shard"``.
        encoder : str
            The encoder's name; ``""`` for no encoder (then nothing is measured).
        default : tuple of (int, int), optional
            (memory MB, wall minutes) without measurements; default :data:`SHARD_DEFAULTS`, else (4000, 60).

        Returns
        -------
        JobRequest
            No GPU; basis ``"measured"`` or ``"default"``.
        """
        key = (rule, encoder)
        if key not in self._requests:
            mem, minutes = default or SHARD_DEFAULTS.get(rule, (4000, 60))
            measured = self.measured(rule, encoder) if encoder else None
            if measured is not None and measured.max_s is not None:
                peak = measured.peak_mb
                self._requests[key] = JobRequest(_mb(peak * MEASURED_MARGIN) if peak is not None else mem,
                                                 _minutes(measured.max_s * MEASURED_MARGIN), 0, 0, "measured")
            else:
                self._requests[key] = JobRequest(mem, minutes, 0, 0, "default")
        return self._requests[key]

    def gpu_constraint(self, encoder: str) -> str | None:
        """The Slurm constraint of the encoder's GPU class (None: no classes, a CPU-only entry, or a class that
        takes any GPU).

        Parameters
        ----------
        encoder : str
            The encoder's name.

        Returns
        -------
        str or None
        """
        cost = self.cost(encoder)
        chosen = gpu_class(cost.gpu_memory_mb(self.batch_size), self.gpu_classes) if cost.on_gpu else None
        return chosen.constraint or None if chosen is not None else None


def estimate_table(jobs: Iterable[Mapping[str, Any]], components: Mapping[str, int],
                   gpu_classes: Sequence[GpuClass] = ()) -> pd.DataFrame:
    """What a plan asks of the cluster, per rule and encoder, then per rule, then in total.

    ``jobs``: one mapping per planned job: ``rule``, ``encoder`` (or ''), ``group`` (the job's group id, '' for
    an ungrouped job), ``request`` (:class:`JobRequest`) and ``threads``. ``components``: jobs per submission of
    each group pattern's groups (the profile's ``--group-components``, by the rule's group pattern). A group's
    jobs run one after another on the node (the Slurm plugin runs a group with one job at a time), so a
    submission asks for the sum of its jobs' wall times and the largest of their memory, CPUs and GPUs; its
    GPU- and CPU-hours are those times its GPUs and CPUs.

    Parameters
    ----------
    jobs : iterable of Mapping
        As described above (also ``pattern``, the group pattern, as :func:`planned_requests` gives it).
    components : Mapping of str to int
        Jobs per submission by group pattern.
    gpu_classes : sequence of GpuClass, default ()
        The site's GPU classes, for the ``gpu_class`` column.

    Returns
    -------
    DataFrame
        Columns :data:`ESTIMATE_COLUMNS`: one row per (rule, encoder), then one per rule with encoder
        ``"all encoders"``, then a ``rule="all"``, ``encoder="total (plan)"`` row. Memory in MB, run times in
        minutes, ``gpu_hours``/``cpu_hours`` in hours, ``basis`` the comma-joined bases.
    """
    frame = pd.DataFrame(list(jobs))
    if frame.empty:
        return pd.DataFrame(columns=list(ESTIMATE_COLUMNS))
    frame["mem_mb"] = [r.mem_mb for r in frame["request"]]
    frame["runtime_min"] = [r.runtime_min for r in frame["request"]]
    frame["gpus"] = [r.gpus for r in frame["request"]]
    frame["gpu_mem_mb"] = [r.gpu_mem_mb for r in frame["request"]]
    frame["basis"] = [r.basis for r in frame["request"]]
    rows = []
    for (rule, encoder), sub in frame.groupby(["rule", "encoder"], sort=False):
        size = int(components.get(str(sub["pattern"].iloc[0]), 1)) if sub["group"].iloc[0] else 1
        runtimes = sub["runtime_min"].to_numpy()
        n_sub = submissions(len(sub), size)
        # Snakemake fills submissions in DAG order; the longest a submission can be is its `size` longest jobs
        longest = float(np.sort(runtimes)[::-1][:size].sum())
        gpus, cpus = int(sub["gpus"].max()), int(sub["threads"].max())
        gpu_mem = int(sub["gpu_mem_mb"].max())
        chosen = gpu_class(gpu_mem, gpu_classes) if gpus else None
        rows.append({
            "rule": rule, "encoder": encoder, "jobs": len(sub), "submissions": n_sub, "gpus": gpus, "cpus": cpus,
            "mem_mb_max": int(sub["mem_mb"].max()), "gpu_mem_mb": gpu_mem,
            "gpu_class": (chosen.constraint or "any") if chosen is not None else "",
            "runtime_min_job_max": int(runtimes.max()), "runtime_min_submission_max": int(longest),
            "gpu_hours": gpus * runtimes.sum() / 60.0, "cpu_hours": cpus * runtimes.sum() / 60.0,
            "basis": ",".join(sorted(set(sub["basis"]))),
        })
    table = pd.DataFrame(rows, columns=list(ESTIMATE_COLUMNS))
    totals = []
    for rule, sub in table.groupby("rule", sort=False):
        totals.append(_total_row(sub, rule, "all encoders"))
    totals.append(_total_row(table, "all", "total (plan)"))
    return pd.concat([table, pd.DataFrame(totals, columns=list(ESTIMATE_COLUMNS))], ignore_index=True)


def _total_row(sub: pd.DataFrame, rule: str, encoder: str) -> dict[str, Any]:
    return {"rule": rule, "encoder": encoder, "jobs": int(sub["jobs"].sum()),
            "submissions": int(sub["submissions"].sum()), "gpus": int(sub["gpus"].max()),
            "cpus": int(sub["cpus"].max()), "mem_mb_max": int(sub["mem_mb_max"].max()),
            "gpu_mem_mb": int(sub["gpu_mem_mb"].max()), "gpu_class": "",
            "runtime_min_job_max": int(sub["runtime_min_job_max"].max()),
            "runtime_min_submission_max": int(sub["runtime_min_submission_max"].max()),
            "gpu_hours": float(sub["gpu_hours"].sum()), "cpu_hours": float(sub["cpu_hours"].sum()),
            "basis": ",".join(sorted({b for v in sub["basis"] for b in str(v).split(",") if b}))}


# ---- what a whole plan asks for (fmaudit grid --estimate) ---------------------------------------------------

@dataclass(frozen=True)
class ClusterSettings:
    """What of a Snakemake profile decides the requests: jobs per submission of each group pattern
    (``group-components``), threads per rule (``set-threads``), numeric per-rule overrides (``set-resources``)
    and the site's GPU classes (``default-resources: gpu_classes``). Read by :func:`fmaudit.profiles.read_profile`.

    Parameters
    ----------
    group_components : Mapping of str to int
        Jobs per submission by group pattern (:data:`GROUP_PATTERNS`).
    threads : Mapping of str to int
        Threads by rule.
    overrides : Mapping of str to Mapping of str to float
        Per-rule resources (``mem_mb``, ``runtime`` in minutes, ``gpu``) that replace the planned ones.
    gpu_classes : tuple of GpuClass
        The site's GPU classes.
    source : str, default "no profile"
        Where the settings were read (the profile's path), for the estimate's caption.
    """

    group_components: Mapping[str, int] = field(default_factory=dict)
    threads: Mapping[str, int] = field(default_factory=dict)
    overrides: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    gpu_classes: tuple[GpuClass, ...] = ()
    source: str = "no profile"


def _default_threads(rule: str, on_gpu: bool) -> int:
    """A rule's threads without set-threads (the rules': embed_threads in rules/common.smk, 2 for the scratch
    reference, 1 for everything else)."""
    if rule in ("embed", "cell_features"):
        return 2 if on_gpu else 1
    return 2 if rule == "scratch_reference" else 1


def _override(request: JobRequest, overrides: Mapping[str, float]) -> JobRequest:
    """A request with the profile's set-resources for its rule (memory, wall time, GPUs) applied."""
    if not overrides:
        return request
    return JobRequest(int(overrides.get("mem_mb", request.mem_mb)), int(overrides.get("runtime", request.runtime_min)),
                      int(overrides.get("gpu", request.gpus)), request.gpu_mem_mb, request.basis, request.items)


def planned_requests(config: Mapping[str, Any], encoders: Mapping[str, Mapping[str, Any]],
                     datasets: Mapping[str, Mapping[str, Any]], settings: ClusterSettings,
                     results: PathLike) -> pd.DataFrame:
    """One row per cluster job the workflow plans for ``config`` (its localrules left out), with what it asks for
    at attempt 1: ``rule``, ``encoder`` ('' for a job of no encoder), ``job`` (its wildcards), ``group`` (its
    group id, '' when not grouped), ``pattern`` (the group pattern), ``threads`` and ``request``. The same
    planner and the same job lists as the rules (rules/*_helpers.smk), read from ``results`` (the study's folder:
    its manifests and benchmark files).

    Parameters
    ----------
    config : Mapping
        The checked study config.
    encoders : Mapping of str to Mapping
        Registry entries of the config's encoders.
    datasets : Mapping of str to Mapping
        Registry entries of the config's data sets.
    settings : ClusterSettings
        The profile's groups, threads, overrides and GPU classes.
    results : str or Path
        The study's results folder.

    Returns
    -------
    DataFrame
        Columns ``rule``, ``encoder``, ``job``, ``group``, ``pattern``, ``threads`` and ``request`` (a
        :class:`JobRequest` with the profile's overrides applied).
    """
    results = Path(results)
    planner = RequestPlanner(encoders, benchmarks=results / "benchmarks", gpu_classes=settings.gpu_classes)
    rows: list[dict[str, Any]] = []

    def threads_of(rule: str, encoder: str = "") -> int:
        on_gpu = bool(encoders[encoder].get("gpu", False)) if encoder else False
        return int(settings.threads.get(rule, _default_threads(rule, on_gpu)))

    def add(rule: str, encoder: str, job: str, request: JobRequest, threads: int) -> None:
        pattern = GROUP_PATTERNS.get(rule, "")
        group = pattern.format(encoder=encoder) if pattern and encoder else ""
        rows.append({"rule": rule, "encoder": encoder, "job": job, "group": group, "pattern": pattern,
                     "threads": threads, "request": _override(request, settings.overrides.get(rule, {}))})

    def manifest(dataset: str) -> Path:
        return results / "manifests" / f"{dataset}.parquet"

    derived = derived_datasets(config)
    tile_datasets = list(dict.fromkeys(ds for _, ds in embed_pairs(config)))
    for ds in [*tile_datasets, *[d for d in derived if derived[d]["dataset"] in tile_datasets]]:
        if ds in derived:
            add("derive_manifest", "", ds, JobRequest(*FIXED_REQUESTS["derive_manifest"], 0), 1)
        elif datasets.get(ds, {}).get("kind") != "xenium_cells":
            add("prepare_manifest", "", ds, JobRequest(*FIXED_REQUESTS["prepare_manifest"], 0), 1)
    pairs = list(embed_pairs(config))
    for encoder, task in ood_shards(config):
        for cond in ood_shard_plan(config, task)["conditions"]:
            pairs += [(encoder, name) for name in cond.get("derived", [])]
    for encoder, ds in dict.fromkeys(pairs):
        source = manifest(derived[ds]["dataset"]) if ds in derived else None
        threads = threads_of("embed", encoder)
        add("embed", encoder, ds, planner.embed(encoder, manifest(ds), threads, fallback=source), threads)
    for shard in shards(config):
        add("probe_shard", shard.encoder, shard.task, planner.shard("probe_shard", shard.encoder), 1)
    for encoder, task in ood_shards(config):
        add("ood_shard", encoder, task, planner.shard("ood_shard", encoder), 1)
    for encoder, task in ood_split_shards(config):
        add("ood_split_shard", encoder, task, planner.shard("ood_split_shard", encoder), 1)
    prior = prior_shift_runs(config, datasets)
    if len(prior):
        for task, encoder, source, target in (prior[["task", "encoder", "source_domain", "target_domain"]]
                                              .astype(str).drop_duplicates().itertuples(index=False)):
            add("prior_shift_shard", encoder, f"{task}/{source}/{target}",
                planner.shard("prior_shift_shard", encoder), 1)
    scratch = scratch_reference_runs(config, datasets)
    if len(scratch):
        gpu_of = {ps["task"]: bool(ps["scratch_reference"]["gpu"]) for _, _, ps in parts_with(config, "prior_shift")}
        for task, source, seed in (scratch[["task", "source_domain", "seed"]].astype(str).drop_duplicates()
                                   .itertuples(index=False)):
            add("scratch_reference", "", f"{task}/{source}/seed{seed}", scratch_request(gpu_of[task]),
                threads_of("scratch_reference"))
    sections = {ds: list(dataset_params(config, datasets, ds).get("sections") or {})
                for ds in config["datasets"] if datasets.get(ds, {}).get("kind") == "xenium_cells"}
    plan = cell_plan(config, sections)
    if plan is not None:
        mags = [float(m) for m in plan.cells["magnifications"]]
        cells = results / "cells" / "sections"
        for section in plan.sections:
            add("prepare_cell_section", "", section, JobRequest(*FIXED_REQUESTS["prepare_cell_section"], 0), 1)
        for encoder, section in plan.feature_jobs:
            threads = threads_of("cell_features", encoder)
            add("cell_features", encoder, f"{embedding_key(encoders[encoder])}/{section}",
                planner.cell_features(encoder, cells / f"{section}.parquet", mags, threads), threads)
        for encoder, magnification, protocol in plan.shard_jobs:
            add("cell_shard", encoder, f"{protocol}/{magnification:g}x", planner.shard("cell_shard", encoder), 1)
    return pd.DataFrame(rows, columns=["rule", "encoder", "job", "group", "pattern", "threads", "request"])


def estimate(config: Mapping[str, Any], encoders: Mapping[str, Mapping[str, Any]],
             datasets: Mapping[str, Mapping[str, Any]], settings: ClusterSettings, results: PathLike) -> pd.DataFrame:
    """What ``config``'s plan asks of the cluster with a profile's ``settings`` (:func:`estimate_table` of
    :func:`planned_requests`): submissions, GPU- and CPU-hours, per rule and encoder, per rule, in total.

    Parameters
    ----------
    config : Mapping
        The checked study config.
    encoders : Mapping of str to Mapping
        Registry entries of the config's encoders.
    datasets : Mapping of str to Mapping
        Registry entries of the config's data sets.
    settings : ClusterSettings
        The profile's groups, threads, overrides and GPU classes.
    results : str or Path
        The study's results folder (manifests and benchmark files).

    Returns
    -------
    DataFrame
        As :func:`estimate_table`.
    """
    return estimate_table(planned_requests(config, encoders, datasets, settings, results).to_dict("records"),
                          settings.group_components, settings.gpu_classes)
