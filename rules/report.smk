# Report: tidy tables (CSV, Markdown, LaTeX), figures, and the captions of `snakemake --report`.


rule report:
    input:
        runs=f"{RESULTS}/aggregate/probe_runs.parquet",
        predictions=all_probe_shards("predictions"),
        embeddings=all_embeddings(),
    output:
        index=f"{RESULTS}/report/index.md",
        leaderboard=report(
            f"{RESULTS}/report/tables/leaderboard.csv",
            caption="../resources/report/leaderboard.rst",
            category="Accuracy under shift",
        ),
        calibration=report(
            f"{RESULTS}/report/tables/calibration.csv",
            caption="../resources/report/calibration.rst",
            category="Calibration",
        ),
        reliability=report(
            f"{RESULTS}/report/figures/reliability.png",
            caption="../resources/report/reliability.rst",
            category="Calibration",
        ),
        inventory=report(
            f"{RESULTS}/report/tables/embeddings.csv",
            caption="../resources/report/embeddings.rst",
            category="Provenance",
        ),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report.py"
