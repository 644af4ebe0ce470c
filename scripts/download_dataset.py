"""Snakemake adapter: fetch and unpack one data set into data_root (resumable, checksummed)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.data import download_job

download_job(
    dataset=snakemake.wildcards.dataset,
    entry=snakemake.params.entry,
    data_root=snakemake.params.data_root,
    done=snakemake.output[0],
    log=snakemake.log[0],
)
