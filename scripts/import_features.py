"""Snakemake adapter: one encoder's embeddings computed elsewhere (a features data set) as its embeddings file."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.features import import_features_job  # noqa: E402

import_features_job(
    encoder=snakemake.wildcards.encoder,  # noqa: F821
    spec=snakemake.params.encoder,  # noqa: F821
    manifest=snakemake.input.manifest,  # noqa: F821
    features=snakemake.input.features,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    source=snakemake.params.source,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
    key=snakemake.wildcards.key,  # noqa: F821
)
