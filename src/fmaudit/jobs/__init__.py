"""Job-level functions: one per kind of workflow job, reading its input files, calling the library and writing
its outputs atomically, with its log. The Snakemake script adapters (``scripts/*.py``) are a few lines that
unpack ``snakemake.*`` into these calls; the command line calls the same library functions, so the two faces
give the same numbers. Nothing here imports snakemake.

One module per family of rules: :mod:`~fmaudit.jobs.data` (manifests, downloads), :mod:`~fmaudit.jobs.embed`,
:mod:`~fmaudit.jobs.probe` (probe shards and their aggregation), :mod:`~fmaudit.jobs.report`. A new family of
rules adds its own module (``jobs/cells.py``, ``jobs/ood.py``, ``jobs/prior_shift.py``).

Settings reach a job as explicit arguments: the rule's ``params`` are blocks of the config, which was filled
from ``resources/schemas/config.schema.yaml`` once when the workflow loaded it (:func:`fmaudit.config.fill_config`);
a job never completes a setting with a default of its own.
"""
