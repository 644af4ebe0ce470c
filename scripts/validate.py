"""Snakemake adapter: every split check of every task, before any embedding job."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.data import validate_job  # noqa: E402

validate_job(
    manifests=dict(snakemake.params.manifests),  # noqa: F821
    tasks=snakemake.params.tasks,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
