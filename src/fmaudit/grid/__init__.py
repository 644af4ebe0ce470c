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
  (encoder, task). The config's declared ``variants`` (a second preprocessing of an encoder) join the embed
  and probe grids beside their base, and no other analysis.
- ``head_sweep``: one fit of an extra source-only head or logistic C; a job per (encoder, task).
- ``cross_dataset``: one probe fit of a source task evaluated on a target task; a job per (encoder, source
  task, target task).
- ``ood``: one novelty scorer on one OOD condition (far, blur, near, artefact or image-artefact tier); a job
  per (encoder, task), which also runs ``ood_gate``, the two-threshold abstention gate on one task setting.
- ``ood_blur``: a data set's test split under one blur sigma, a derived data set embedded by the embedding
  rule; a job per (encoder, data set, sigma).
- ``ood_image_artefact``: a data set's test split with one synthetic image artefact, likewise; a job per
  (encoder, data set, artefact).
- ``ood_splits``: one of the audit paper's further train/test splits (``ood.extra_splits``) of one part (the probe
  metrics, slide aggregation, label coarsening, the task without some classes); a job per (encoder, task).
- ``prior_shift``: one target draw resampled to one class prior, every adaptation method evaluated on it; a
  job per (encoder, source domain, target domain).
- ``scratch_reference``: the hema paper's ResNet-18 trained from scratch on one source domain with one seed (a
  non-frozen reference row); a job per (task, source domain, seed), when enabled.
- ``cell_features``: one encoder's feature field of one section at one magnification, sampled at the
  nuclei; a job per (encoder, section) reads every magnification.
- ``cells``: one cell-level probe (unit x seed x readout x taxonomy at one magnification and protocol); a
  job per (encoder, magnification, protocol).

``head_sweep`` and ``cross_dataset`` are *declared*: their config blocks are validated and counted now, and their
rules plan exactly these jobs when they land; the others have rules. The one table of analyses (name, enumerator,
job keys, the rule that runs its jobs, whether a cluster retries them) is :data:`fmaudit.grid.analyses.ANALYSES`.

Tasks named by ``cells.taxonomies`` are label spaces of cells, not of tiles: they leave the tile probe grid,
and a data set used only by them is not embedded tile-wise.

Combined configs (``studies:``): each study runs its own encoders on its own tasks with its own blocks
(``probe``, ``calibration`` ... ``cells``), so a combined config plans exactly the union of its studies' runs
instead of every encoder on every task. Without ``studies`` the whole config is one study.

Modules: :mod:`~fmaudit.grid.studies` (studies, settings blocks, task domains), :mod:`~fmaudit.grid.probe` (the probe
grid, its shards and embeddings, head sweep, cross-data-set pairs), :mod:`~fmaudit.grid.ood`,
:mod:`~fmaudit.grid.prior_shift`, :mod:`~fmaudit.grid.cells` (declared analyses), :mod:`~fmaudit.grid.analyses`
(the declaration of every analysis, ``enumerate_runs``, ``jobs``, ``check_grid``), :mod:`~fmaudit.grid.summary`
(``fmaudit grid``). Every function takes a config filled from its schema (:func:`fmaudit.config.fill_config`).
"""

# The package re-exports the public names (each module's __all__) of every module that holds an analysis's run
# enumerator (fmaudit.grid.analyses.analysis_modules, from the table of analyses), of the table itself, of the
# studies and of the summary: a new analysis's module is exported by its line in ANALYSES, with no edit here.
from fmaudit.grid import analyses, studies, summary
from fmaudit.grid.analyses import analysis_modules

_EXPORTED = list(dict.fromkeys([analyses, *analysis_modules(), studies, summary]))
for _module in _EXPORTED:
    globals().update({_name: getattr(_module, _name) for _name in _module.__all__})

__all__ = sorted({name for module in _EXPORTED for name in module.__all__})
del _module
