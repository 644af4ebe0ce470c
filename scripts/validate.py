"""Snakemake adapter: every data check of the pre-flight (fmaudit.preflight.check_data), before any embedding job."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.data import validate_job

validate_job(
    checks=snakemake.params.checks,
    out=snakemake.output[0],
    log=snakemake.log[0],
)
