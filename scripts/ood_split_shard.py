"""Snakemake adapter: the audit paper's further train/test splits of one (encoder, task)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.ood import SPLIT_TABLES, ood_split_shard_job

ood_split_shard_job(
    encoder=snakemake.wildcards.encoder,
    task=snakemake.wildcards.task,
    task_spec=snakemake.params.task,
    plan=snakemake.params.plan,
    settings=snakemake.params.settings,
    bootstrap=snakemake.params.bootstrap,
    ece_bins=snakemake.params.ece_bins,
    manifests=list(snakemake.input.manifests),
    embeddings=list(snakemake.input.embeddings),
    out={name: getattr(snakemake.output, name) for name in SPLIT_TABLES},
    log=snakemake.log[0],
    threads=snakemake.threads,
)
