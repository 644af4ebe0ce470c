"""Snakemake adapter: concatenate the probe shards of every encoder and task."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.probe import aggregate_job  # noqa: E402

aggregate_job(list(snakemake.input.runs), snakemake.output[0], log=snakemake.log[0])  # noqa: F821
