"""Snakemake adapter: every OOD condition, scorer and gate setting of one (encoder, task), and its gate."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.ood import SHARD_TABLES, ood_shard_job

ood_shard_job(
    encoder=snakemake.wildcards.encoder,
    task=snakemake.wildcards.task,
    task_spec=snakemake.params.task,
    plan=snakemake.params.plan,
    settings=snakemake.params.settings,
    bootstrap=snakemake.params.bootstrap,
    ece_bins=snakemake.params.ece_bins,
    manifests=list(snakemake.input.manifests),
    embeddings=list(snakemake.input.embeddings),
    far_manifests=list(snakemake.input.far_manifests),
    far_embeddings=list(snakemake.input.far_embeddings),
    derived_embeddings=dict(snakemake.params.derived),
    out={name: getattr(snakemake.output, name) for name in SHARD_TABLES},
    gate_dir=snakemake.output.gate_model,
    log=snakemake.log[0],
    threads=snakemake.threads,
)
