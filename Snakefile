# fmaudit: reliability audit of frozen pathology and hematology foundation-model encoders.
# This file is a table of contents. rules/common.smk loads the config (the demo's config.yaml unless --configfile
# names another), validates it against resources/schemas/config.schema.yaml, fills in its defaults (the schema is
# their one home) and runs every check of `fmaudit check-config`, before any rule is planned. Each rules/<branch>.smk
# holds a branch's rules; its plan and input functions are in rules/<branch>_helpers.smk beside it.


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


rule all:
    input:
        all_targets(),
    default_target: True
