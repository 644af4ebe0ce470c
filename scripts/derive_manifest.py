"""Snakemake adapter: the perturbed copy of one data set's test split (a derived manifest)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.ood import derive_manifest_job

derive_manifest_job(
    dataset=snakemake.wildcards.dataset,
    tag=snakemake.wildcards.tag,
    spec=snakemake.params.spec,
    manifest=snakemake.input.manifest,
    out=snakemake.output[0],
    log=snakemake.log[0],
)
