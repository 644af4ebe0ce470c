"""Snakemake adapter: concatenate the probe shards of every encoder and task."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.probe import aggregate_job

aggregate_job(list(snakemake.input.runs), snakemake.output[0], log=snakemake.log[0])
