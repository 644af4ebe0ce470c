"""Snakemake adapter: the audit paper's further train/test splits of one (encoder, task)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.ood import SPLIT_TABLES, ood_split_shard_job  # noqa: E402

ood_split_shard_job(
    encoder=snakemake.wildcards.encoder,  # noqa: F821
    task=snakemake.wildcards.task,  # noqa: F821
    task_spec=snakemake.params.task,  # noqa: F821
    plan=snakemake.params.plan,  # noqa: F821
    settings=snakemake.params.settings,  # noqa: F821
    bootstrap=snakemake.params.bootstrap,  # noqa: F821
    ece_bins=snakemake.params.calibration["ece_bins"],  # noqa: F821
    manifests=list(snakemake.input.manifests),  # noqa: F821
    embeddings=list(snakemake.input.embeddings),  # noqa: F821
    out={name: getattr(snakemake.output, name) for name in SPLIT_TABLES},  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
