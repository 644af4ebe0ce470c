"""Snakemake adapter: every prior-shift run of one (encoder, source domain, target domain) shard."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.prior_shift import prior_shift_shard_job  # noqa: E402

prior_shift_shard_job(
    encoder=snakemake.wildcards.encoder,  # noqa: F821
    task=snakemake.wildcards.task,  # noqa: F821
    task_spec=snakemake.params.task,  # noqa: F821
    source_domain=snakemake.wildcards.source_domain,  # noqa: F821
    target_domain=snakemake.wildcards.target_domain,  # noqa: F821
    manifests=list(snakemake.input.manifests),  # noqa: F821
    embeddings=list(snakemake.input.embeddings),  # noqa: F821
    prior_shift=snakemake.params.prior_shift,  # noqa: F821
    calibration={"ece_bins": snakemake.params.ece_bins},  # noqa: F821
    readout=snakemake.params.readout,  # noqa: F821
    out_runs=snakemake.output.runs,  # noqa: F821
    out_pool=snakemake.output.pool,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
