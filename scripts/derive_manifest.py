"""Snakemake adapter: the perturbed copy of one data set's test split (a derived manifest)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.ood import derive_manifest_job  # noqa: E402

derive_manifest_job(
    dataset=snakemake.wildcards.dataset,  # noqa: F821
    tag=snakemake.wildcards.tag,  # noqa: F821
    spec=snakemake.params.spec,  # noqa: F821
    manifest=snakemake.input.manifest,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
