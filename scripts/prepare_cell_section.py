"""Snakemake adapter: register (or read, for a cell_table), label and QC one section."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.cells import prepare_section_job

section = snakemake.params.section
prepare_section_job(
    section=section["section"],
    organ=section["organ"],
    dataset=section["dataset"],
    params=section["params"],
    kind=section.get("kind", "xenium_cells"),
    data_root=snakemake.params.data_root,
    out=snakemake.output.manifest,
    qc_png=snakemake.output.qc,
    log=snakemake.log[0],
)
