"""Snakemake adapter: tables, figures and the index of the report."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.report import report_job  # noqa: E402

report_job(
    inputs={name: [files] if isinstance(files, str) else list(files) for name, files in snakemake.input.items()},  # noqa: F821
    settings=dict(snakemake.params.items()),  # noqa: F821
    out_dir=str(Path(snakemake.output.index).parent),  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
