"""Snakemake adapter: prepare one data set's manifest."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.data import prepare_manifest_job

prepare_manifest_job(
    dataset=snakemake.wildcards.dataset,
    entry=snakemake.params.entry,
    data_root=snakemake.params.data_root,
    out=snakemake.output[0],
    log=snakemake.log[0],
)
