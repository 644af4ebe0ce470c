"""Snakemake adapter: concatenate each table of every OOD shard."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.ood import AGGREGATE_TABLES, aggregate_ood_job

aggregate_ood_job(
    shards={name: list(getattr(snakemake.input, name)) for name in AGGREGATE_TABLES},
    out={name: getattr(snakemake.output, name) for name in AGGREGATE_TABLES},
    log=snakemake.log[0],
)
