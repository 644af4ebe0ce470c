"""Snakemake adapter: run every probe run of one (encoder, task) shard."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.probe import probe_shard_job  # noqa: E402

probe_shard_job(
    encoder=snakemake.wildcards.encoder,  # noqa: F821
    task=snakemake.wildcards.task,  # noqa: F821
    task_spec=snakemake.params.task,  # noqa: F821
    manifests=list(snakemake.input.manifests),  # noqa: F821
    embeddings=list(snakemake.input.embeddings),  # noqa: F821
    probe=snakemake.params.probe,  # noqa: F821
    calibration=snakemake.params.calibration,  # noqa: F821
    bootstrap=snakemake.params.bootstrap,  # noqa: F821
    out_runs=snakemake.output.runs,  # noqa: F821
    out_predictions=snakemake.output.predictions,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
