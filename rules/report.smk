# Report: tidy tables (CSV, Markdown, LaTeX), figures, and the captions of `snakemake --report`.
# Built from the report's chapters alone (fmaudit.report): its inputs are what the chapters read, its params what
# they state (each branch's files and settings, registered by its rules/<branch>_helpers.smk), its outputs every
# table and figure they write; captions state the settings in use, from this rule's params. The cost chapter reads
# every planned job's benchmark file; the cards are one per encoder of the config.


include: "report_helpers.smk"


rule report:
    input:
        **report_inputs(),
    output:
        index=f"{REPORT}/index.md",
        home=f"{REPORT}/index.html",
        cards=report_cards(),
        tables=report_tables(),
        table_formats=report_table_formats(),
        figures=report_figures(),
    log:
        f"{RESULTS}/logs/report.log",
    params:
        **report_params(),
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report.py"
