"""Snakemake adapter: every cell shard's run rows in one table."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.cells import aggregate_cells_job

aggregate_cells_job(
    shards=list(snakemake.input.shards),
    out=snakemake.output[0],
    log=snakemake.log[0],
)
