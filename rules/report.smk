# Report: tidy tables (CSV, Markdown, LaTeX), figures, and the captions of `snakemake --report`.
# The outputs are every table and figure of the report's sections (fmaudit.report); captions state the
# calibration and bootstrap settings in use, from this rule's params.


rule report:
    input:
        unpack(report_inputs),
    output:
        index=f"{REPORT}/index.md",
        tables=report_tables(),
        table_formats=report_table_formats(),
        figures=report_figures(),
    log:
        f"{RESULTS}/logs/report.log",
    params:
        calibration=report_settings("calibration"),
        bootstrap=report_settings("bootstrap"),
        units=report_units(),
        ood=report_ood_settings(),
        prior_shift=report_prior_shift(),
        variants=report_variants(),
        exposure=report_exposure(),
        cells=cell_report_settings(),
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report.py"
