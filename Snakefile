# fmaudit: reliability audit of frozen pathology and hematology foundation-model encoders.
# This file is a table of contents; the rules live in rules/, their helpers in rules/common.smk.

from snakemake.utils import min_version

min_version("9.0")


# The built-in demo is the default config. A config given with --configfile (a preset, your own) replaces it
# instead of being merged into it, so no demo data set or task leaks into a real run.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# rules/common.smk validates the config against resources/schemas/config.schema.yaml and fills in its defaults
# (the schema is their one home), then runs every check of `fmaudit check-config`, before any rule is planned.
include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/embed.smk"
include: "rules/probe.smk"
include: "rules/ood.smk"
include: "rules/prior_shift.smk"
include: "rules/cells.smk"
include: "rules/report.smk"


# The first screen of `snakemake --report`: links to the front page and the reliability cards.
report: "resources/report/pages/workflow.rst"


# Jobs that run where Snakemake runs (the login node on a cluster): the cheap ones, and the downloads, since
# compute nodes usually have no internet.
localrules:
    all,
    download,
    download_dataset,
    validate,
    import_features,
    aggregate_probe,
    aggregate_ood,
    aggregate_prior_shift,
    validate_cells,
    cell_feature_set,
    aggregate_cells,
    report,


# Before the first job of a run (not on dry runs): stop if a planned job would build an encoder that cannot be
# built as configured (remote code without a pinned commit: set encoder_revisions.<encoder>).
onstart:
    check_before_first_job()


rule all:
    input:
        all_targets(),
    default_target: True


# Snakemake reads a callable's signature (inspect.signature) every time it evaluates it: for each job's input,
# params, threads and resources, several times per job. On the CellPath preset (2,730 jobs, most of them
# feature jobs with five callables) that was seconds of the dry run. Record each helper's parameters once,
# through the hook Snakemake's own path helpers use (snakemake.common.overwrite_function_params).
record_signatures(globals())
