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

from fmaudit.cluster.cost_model import (
    ACTIVATION_FACTOR,
    CELL_ROW_BYTES,
    CPU_GFLOPS_PER_THREAD,
    DEFAULT_SECTION,
    DEFAULT_TILES,
    GPU_CONTEXT_MB,
    GPU_TFLOPS,
    HOST_BASE_MB,
    LOAD_BASE_S,
    LOAD_BYTES_PER_S,
    MEASURED_MARGIN,
    MEMORY_MARGIN,
    MIN_MEM_MB,
    MIN_RUNTIME_MIN,
    PATCH_READ_S,
    PRECISION_BYTES,
    TILE_READ_S,
    TIME_MARGIN,
    WORKER_MB,
    EncoderCost,
    SectionExtent,
    encoder_cost,
    manifest_rows,
    section_extent,
    section_patches,
)
from fmaudit.cluster.gpu_classes import (
    GpuClass,
    gpu_class,
    parse_gpu_classes,
)
from fmaudit.cluster.measured import (
    BENCHMARK_COLUMNS,
    Measured,
    read_benchmarks,
)
from fmaudit.cluster.plan import (
    ESTIMATE_COLUMNS,
    ClusterSettings,
    estimate,
    estimate_table,
    planned_requests,
)
from fmaudit.cluster.requests import (
    FIXED_REQUESTS,
    GROUP_PATTERNS,
    SHARD_DEFAULTS,
    JobRequest,
    RequestPlanner,
    scratch_request,
    submissions,
)

__all__ = [
    "ACTIVATION_FACTOR",
    "BENCHMARK_COLUMNS",
    "CELL_ROW_BYTES",
    "CPU_GFLOPS_PER_THREAD",
    "ClusterSettings",
    "DEFAULT_SECTION",
    "DEFAULT_TILES",
    "ESTIMATE_COLUMNS",
    "EncoderCost",
    "FIXED_REQUESTS",
    "GPU_CONTEXT_MB",
    "GPU_TFLOPS",
    "GROUP_PATTERNS",
    "GpuClass",
    "HOST_BASE_MB",
    "JobRequest",
    "LOAD_BASE_S",
    "LOAD_BYTES_PER_S",
    "MEASURED_MARGIN",
    "MEMORY_MARGIN",
    "MIN_MEM_MB",
    "MIN_RUNTIME_MIN",
    "Measured",
    "PATCH_READ_S",
    "PRECISION_BYTES",
    "RequestPlanner",
    "SHARD_DEFAULTS",
    "SectionExtent",
    "TILE_READ_S",
    "TIME_MARGIN",
    "WORKER_MB",
    "encoder_cost",
    "estimate",
    "estimate_table",
    "gpu_class",
    "manifest_rows",
    "parse_gpu_classes",
    "planned_requests",
    "read_benchmarks",
    "scratch_request",
    "section_extent",
    "section_patches",
    "submissions",
]
