"""Snakemake adapter: tables, figures and the index of the report."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.report import report_job

report_job(
    inputs={name: [files] if isinstance(files, str) else list(files) for name, files in snakemake.input.items()},
    settings=dict(snakemake.params.items()),
    out_dir=str(Path(snakemake.output.index).parent),
    log=snakemake.log[0],
)
