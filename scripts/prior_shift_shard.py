"""Snakemake adapter: every prior-shift run of one (encoder, source domain, target domain) shard."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.prior_shift import prior_shift_shard_job

prior_shift_shard_job(
    encoder=snakemake.wildcards.encoder,
    task=snakemake.wildcards.task,
    task_spec=snakemake.params.task,
    source_domain=snakemake.wildcards.source_domain,
    target_domain=snakemake.wildcards.target_domain,
    manifests=list(snakemake.input.manifests),
    embeddings=list(snakemake.input.embeddings),
    prior_shift=snakemake.params.prior_shift,
    calibration={"ece_bins": snakemake.params.ece_bins},
    readout=snakemake.params.readout,
    out_runs=snakemake.output.runs,
    out_pool=snakemake.output.pool,
    log=snakemake.log[0],
)
