"""Snakemake adapter: prepare one data set's manifest."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.data import prepare_manifest_job  # noqa: E402

prepare_manifest_job(
    dataset=snakemake.wildcards.dataset,  # noqa: F821
    entry=snakemake.params.entry,  # noqa: F821
    data_root=snakemake.params.data_root,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
