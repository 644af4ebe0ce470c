"""Snakemake adapter: every check of the cell panel, before the first cell feature job."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.cells import validate_cells_job

validate_cells_job(
    manifests=dict(zip(snakemake.params.sections, snakemake.input.manifests)),
    cells=snakemake.params.cells,
    taxonomies=snakemake.params.taxonomies,
    out=snakemake.output[0],
    log=snakemake.log[0],
)
