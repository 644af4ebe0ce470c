"""Snakemake adapter: embed one data set with one encoder."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.embed import embed_job

embed_job(
    encoder=snakemake.wildcards.encoder,
    spec=snakemake.params.encoder,
    manifest=snakemake.input.manifest,
    out=snakemake.output[0],
    weights=snakemake.params.weights or None,
    batch_size=snakemake.params.batch_size,
    threads=snakemake.threads,
    log=snakemake.log[0],
    key=snakemake.wildcards.key,
)
