# Report: tidy tables (CSV, Markdown, LaTeX), figures, and the captions of `snakemake --report`.
# Built from the report's sections alone (fmaudit.report): its inputs are what the sections read, its params what
# they state (each branch's files and settings, registered in rules/common.smk), its outputs every table and
# figure they write; captions state the settings in use, from this rule's params. The cost chapter reads every
# planned job's benchmark file; the cards are one per encoder of the config.

REPORT_INPUTS["benchmarks"] = planned_benchmarks()
REPORT_SETTINGS["cost"] = {"gpu_plan": GPU_PLAN}
REPORT_SETTINGS["cards"] = {"study": config["study"], "encoders": list(config["encoders"])}


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
