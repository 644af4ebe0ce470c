"""Snakemake adapter: every cell probe run of one (encoder, magnification, protocol) shard."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.cells import cell_shard_job

cell_shard_job(
    encoder=snakemake.wildcards.encoder,
    magnification=float(snakemake.wildcards.magnification),
    protocol=snakemake.wildcards.protocol,
    cells=snakemake.params.cells,
    taxonomy_tasks=list(snakemake.params.taxonomy_tasks),
    feature_set=snakemake.input.features,
    out=snakemake.output[0],
    log=snakemake.log[0],
    threads=snakemake.threads,
)
