"""What a study cost: CPU-hours, GPU-hours, peak memory and wall time of its jobs, read from the benchmark files
Snakemake writes for every heavy job (``results/<study>/benchmarks/<rule>/<wildcards>.tsv``), and what a config
would cost, predicted from measured per-unit costs before anything runs.

A benchmark file holds one row per repeat with ``s`` (wall seconds), ``max_rss`` (MB) and ``cpu_time`` (CPU
seconds of the job's process tree, user + system), among other columns; a job's cost is the sum over its rows
(its peak memory the maximum). ``NA`` (a job too short for Snakemake to sample) counts as unknown, not 0.

GPU-hours are a job's wall time times its GPUs. Snakemake's benchmark files do not say how many GPUs a job had,
so the count is the one the workflow *requests* for the job: its ``gpu`` resource, which the rules take from
:func:`gpu_plan` (an encoder's registry entry ``gpu`` for ``embed`` and ``cell_features``, the config's
``prior_shift.scratch_reference.gpu`` for ``scratch_reference``; every other rule requests none). That is what a
cluster charges a job for, whether or not its code used the device; the embedding files' provenance records the
device a job actually ran on, and :func:`job_costs` marks a job whose recorded device disagrees with its request.
"""


from fmaudit.costs.benchmarks import (
    BENCHMARK_PATHS,
    COST_COLUMNS,
    GPU_RULES,
    benchmark_path,
    benchmark_root,
    cost_by,
    embedding_devices,
    find_benchmarks,
    gpu_plan,
    job_costs,
    job_gpus,
    parse_benchmark_path,
    read_benchmark,
)
from fmaudit.costs.estimate import (
    ESTIMATE_COLUMNS,
    estimate_cost,
    measured_units,
    planned_jobs,
    planned_units,
    read_unit_costs,
    unit_costs,
)

__all__ = [
    "BENCHMARK_PATHS",
    "COST_COLUMNS",
    "ESTIMATE_COLUMNS",
    "GPU_RULES",
    "benchmark_path",
    "benchmark_root",
    "cost_by",
    "embedding_devices",
    "estimate_cost",
    "find_benchmarks",
    "gpu_plan",
    "job_costs",
    "job_gpus",
    "measured_units",
    "parse_benchmark_path",
    "planned_jobs",
    "planned_units",
    "read_benchmark",
    "read_unit_costs",
    "unit_costs",
]

