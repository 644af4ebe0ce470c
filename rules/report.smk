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
        cross_domain=report(
            f"{RESULTS}/report/tables/cross_domain_leaderboard.csv",
            caption="../resources/report/cross_domain_leaderboard.rst",
            category="Accuracy under shift",
        ),
        paired=report(
            f"{RESULTS}/report/tables/paired_differences.csv",
            caption="../resources/report/paired_differences.rst",
            category="Accuracy under shift",
        ),
        cri=report(
            f"{RESULTS}/report/tables/cri.csv",
            caption="../resources/report/cri.rst",
            category="Composite reliability",
        ),
        rank_transfer=report(
            f"{RESULTS}/report/tables/rank_transfer.csv",
            caption="../resources/report/rank_transfer.rst",
            category="Rank transfer",
        ),
        decoupling=report(
            f"{RESULTS}/report/tables/decoupling.csv",
            caption="../resources/report/decoupling.rst",
            category="Rank transfer",
        ),
        ece_slopes=report(
            f"{RESULTS}/report/tables/ece_slope_by_auroc_bin.csv",
            caption="../resources/report/ece_slopes.rst",
            category="Calibration",
        ),
        rank_heatmap=report(
            f"{RESULTS}/report/figures/rank_transfer.png",
            caption="../resources/report/rank_transfer_heatmap.rst",
            category="Rank transfer",
        ),
        ece_vs_fraction=report(
            f"{RESULTS}/report/figures/ece_vs_fraction.png",
            caption="../resources/report/ece_vs_fraction.rst",
            category="Calibration",
        ),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report.py"
