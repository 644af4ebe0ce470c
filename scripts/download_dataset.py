"""Snakemake adapter: fetch and unpack one data set into data_root (resumable, checksummed)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.data import download_job  # noqa: E402

download_job(
    dataset=snakemake.wildcards.dataset,  # noqa: F821
    entry=snakemake.params.entry,  # noqa: F821
    data_root=snakemake.params.data_root,  # noqa: F821
    done=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
