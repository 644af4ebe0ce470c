"""Snakemake adapter: every check of the cell panel, before the first cell feature job."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.cells import validate_cells_job  # noqa: E402

validate_cells_job(
    manifests=dict(zip(snakemake.params.sections, snakemake.input.manifests)),  # noqa: F821
    cells=snakemake.params.cells,  # noqa: F821
    taxonomies=snakemake.params.taxonomies,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
