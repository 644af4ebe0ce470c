# fmaudit: reliability audit of frozen pathology and hematology foundation-model encoders.
# This file is a table of contents; the rules live in rules/, their helpers in rules/common.smk.

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "resources/schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/embed.smk"
include: "rules/probe.smk"
include: "rules/report.smk"


localrules:
    all,
    download,
    aggregate_probe,
    report,


rule all:
    input:
        all_targets(),
    default_target: True
