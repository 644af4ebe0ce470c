"""Snakemake adapter: the ResNet-18 trained from scratch on one source domain with one seed."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.prior_shift import scratch_reference_job

scratch_reference_job(
    task=snakemake.wildcards.task,
    task_spec=snakemake.params.task,
    source_domain=snakemake.wildcards.source_domain,
    target_domains=list(snakemake.params.targets),
    seed=int(snakemake.wildcards.seed),
    manifests=list(snakemake.input.manifests),
    target_pool=snakemake.params.pools["target_pool"],
    val_fraction=snakemake.params.pools["val_fraction"],
    settings=snakemake.params.settings,
    ece_bins=snakemake.params.ece_bins,
    out=snakemake.output[0],
    threads=snakemake.threads,
    log=snakemake.log[0],
)
