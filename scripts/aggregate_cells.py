"""Snakemake adapter: every cell shard's run rows in one table."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.cells import aggregate_cells_job  # noqa: E402

aggregate_cells_job(
    shards=list(snakemake.input.shards),  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
