"""The run grid: a pure function of the config.

A *run* is one probe fit and its evaluation; a *shard* is one Snakemake job that loops over a whole sub-grid
of runs in-process. The same enumeration serves the dry-run summary (``fmaudit grid``), the shard jobs and
the tests, so the counts a user sees before submitting are the runs the jobs execute.

Domains of a task come from the config (``tasks.<t>.domains``), else from the data-set registry
(``domains:`` of each data set), else the task is a single pooled domain ``"all"``: the grid never reads data.

Analyses, what one run is, and the jobs the runs are batched into (a job loops over its runs in-process, so
a paper-scale grid of ~300,000 runs stays a DAG of a few thousand jobs):

- ``embed``: the embedding of one data set by one encoder; a job per (encoder, data set).
- ``probe``: one probe fit, evaluated in-domain and on the task's other domains; a job (``Shard``) per
  (encoder, task).
- ``head_sweep``: one fit of an extra source-only head or logistic C; a job per (encoder, task).
- ``cross_dataset``: one probe fit of a source task evaluated on a target task; a job per (encoder, source
  task, target task).
- ``ood``: one novelty scorer on one OOD condition (far, blur, near or artefact tier); a job per (encoder,
  task), which also runs ``ood_gate``, the two-threshold abstention gate on one task setting.
- ``ood_blur``: the embedding of a task's test split under one blur sigma; a job per (encoder, task).
- ``prior_shift``: one target draw resampled to one class prior, every adaptation method evaluated on it; a
  job per (encoder, source domain, target domain).
- ``cell_features``: one encoder's feature field of one section at one magnification, sampled at the
  nuclei; a job per (encoder, section) reads every magnification.
- ``cells``: one cell-level probe (unit x seed x readout x taxonomy at one magnification and protocol); a
  job per (encoder, magnification, protocol).

Only ``embed`` and ``probe`` have rules today; the others are *declared*: their config sections are validated
and counted now, and their rules plan exactly these jobs when they land. The one table of analyses (name,
enumerator, job keys, ruled or declared) is :data:`fmaudit.grid.analyses.ANALYSES`.

Tasks named by ``cells.taxonomies`` are label spaces of cells, not of tiles: they leave the tile probe grid,
and a data set used only by them is not embedded tile-wise.

Combined configs (``studies:``): each study runs its own encoders on its own tasks with its own sections
(``probe``, ``calibration`` ... ``cells``), so a combined config plans exactly the union of its studies' runs
instead of every encoder on every task. Without ``studies`` the whole config is one study.

Modules: :mod:`~fmaudit.grid.studies` (studies, sections, task domains), :mod:`~fmaudit.grid.probe` (the probe
grid, its shards and embeddings, head sweep, cross-data-set pairs), :mod:`~fmaudit.grid.ood`,
:mod:`~fmaudit.grid.prior_shift`, :mod:`~fmaudit.grid.cells` (declared analyses), :mod:`~fmaudit.grid.analyses`
(the declaration of every analysis, ``enumerate_runs``, ``jobs``, ``check_grid``), :mod:`~fmaudit.grid.summary`
(``fmaudit grid``). Every function takes a config filled from its schema (:func:`fmaudit.config.fill_config`).
"""

from fmaudit.grid.analyses import ANALYSES, JOB_KEYS, RULED_ANALYSES, Analysis, check_grid, enumerate_runs, jobs, ruled
from fmaudit.grid.cells import CELL_PROTOCOLS, CellPlan, cell_feature_runs, cell_plan, cell_runs, protocol_sections
from fmaudit.grid.ood import ood_blur_runs, ood_gate_runs, ood_runs
from fmaudit.grid.prior_shift import check_priors, prior_shift_runs
from fmaudit.grid.probe import (
    C_HEADS,
    PROBE_COLUMNS,
    Shard,
    cross_dataset_runs,
    embed_pairs,
    embed_runs,
    head_sweep_runs,
    probe_runs,
    probe_variants,
    run_id,
    shards,
)
from fmaudit.grid.studies import (
    DECLARED_SECTIONS,
    POOLED_DOMAIN,
    SETTINGS_SECTIONS,
    cell_tasks,
    check_studies,
    parts_with,
    resolved_tile_tasks,
    section,
    settings_by_task,
    study_of,
    study_parts,
    task_domains,
)
from fmaudit.grid.summary import summarize

__all__ = [
    "ANALYSES",
    "Analysis",
    "CELL_PROTOCOLS",
    "C_HEADS",
    "DECLARED_SECTIONS",
    "JOB_KEYS",
    "POOLED_DOMAIN",
    "PROBE_COLUMNS",
    "RULED_ANALYSES",
    "SETTINGS_SECTIONS",
    "CellPlan",
    "Shard",
    "cell_feature_runs",
    "cell_plan",
    "cell_runs",
    "cell_tasks",
    "check_grid",
    "check_priors",
    "check_studies",
    "cross_dataset_runs",
    "embed_pairs",
    "embed_runs",
    "enumerate_runs",
    "head_sweep_runs",
    "jobs",
    "ood_blur_runs",
    "ood_gate_runs",
    "ood_runs",
    "parts_with",
    "prior_shift_runs",
    "probe_runs",
    "probe_variants",
    "protocol_sections",
    "ruled",
    "run_id",
    "resolved_tile_tasks",
    "section",
    "settings_by_task",
    "shards",
    "study_of",
    "study_parts",
    "summarize",
    "task_domains",
]
