"""Snakemake adapter: run every probe run of one (encoder, task) shard."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.probe import probe_shard_job

probe_shard_job(
    encoder=snakemake.wildcards.encoder,
    task=snakemake.wildcards.task,
    task_spec=snakemake.params.task,
    manifests=list(snakemake.input.manifests),
    embeddings=list(snakemake.input.embeddings),
    probe=snakemake.params.probe,
    calibration=snakemake.params.calibration,
    bootstrap=snakemake.params.bootstrap,
    out_runs=snakemake.output.runs,
    out_predictions=snakemake.output.predictions,
    log=snakemake.log[0],
    threads=snakemake.threads,
)
