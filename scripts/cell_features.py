"""Snakemake adapter: nucleus-anchored features of one (encoder, section) at every magnification of the config."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.cells import cell_features_job

cell_features_job(
    encoder=snakemake.wildcards.encoder,
    spec=snakemake.params.encoder,
    manifest=snakemake.input.manifest,
    magnifications=snakemake.params.magnifications,
    outs=list(snakemake.output),
    weights=snakemake.params.weights or None,
    batch_size=snakemake.params.batch_size,
    chunk_size=snakemake.params.chunk_size,
    threads=snakemake.threads,
    logs=list(snakemake.log),
)
