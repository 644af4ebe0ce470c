"""Snakemake adapter: one encoder's embeddings computed elsewhere (a features data set) as its embeddings file."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.features import import_features_job

import_features_job(
    encoder=snakemake.wildcards.encoder,
    spec=snakemake.params.encoder,
    manifest=snakemake.input.manifest,
    features=snakemake.input.features,
    out=snakemake.output[0],
    source=snakemake.params.source,
    log=snakemake.log[0],
    key=snakemake.wildcards.key,
)
