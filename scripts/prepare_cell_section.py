"""Snakemake adapter: register (or read, for a cell_table), label and QC one section."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.cells import prepare_section_job  # noqa: E402

section = snakemake.params.section  # noqa: F821
prepare_section_job(
    section=section["section"],
    organ=section["organ"],
    dataset=section["dataset"],
    params=section["params"],
    kind=section.get("kind", "xenium_cells"),
    data_root=snakemake.params.data_root,  # noqa: F821
    out=snakemake.output.manifest,  # noqa: F821
    qc_png=snakemake.output.qc,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
