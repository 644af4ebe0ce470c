"""Snakemake adapter: the ResNet-18 trained from scratch on one source domain with one seed."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.prior_shift import scratch_reference_job  # noqa: E402

scratch_reference_job(
    task=snakemake.wildcards.task,  # noqa: F821
    task_spec=snakemake.params.task,  # noqa: F821
    source_domain=snakemake.wildcards.source_domain,  # noqa: F821
    target_domains=list(snakemake.params.targets),  # noqa: F821
    seed=int(snakemake.wildcards.seed),  # noqa: F821
    manifests=list(snakemake.input.manifests),  # noqa: F821
    target_pool=snakemake.params.pools["target_pool"],  # noqa: F821
    val_fraction=snakemake.params.pools["val_fraction"],  # noqa: F821
    settings=snakemake.params.settings,  # noqa: F821
    ece_bins=snakemake.params.ece_bins,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    threads=snakemake.threads,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
