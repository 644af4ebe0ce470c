"""Snakemake adapter: nucleus-anchored features of one (encoder, section) at every magnification of the config."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.cells import cell_features_job  # noqa: E402

cell_features_job(
    encoder=snakemake.wildcards.encoder,  # noqa: F821
    spec=snakemake.params.encoder,  # noqa: F821
    manifest=snakemake.input.manifest,  # noqa: F821
    magnifications=snakemake.params.magnifications,  # noqa: F821
    outs=list(snakemake.output),  # noqa: F821
    weights=snakemake.params.weights or None,  # noqa: F821
    batch_size=snakemake.params.batch_size,  # noqa: F821
    chunk_size=snakemake.params.chunk_size,  # noqa: F821
    threads=snakemake.threads,  # noqa: F821
    logs=list(snakemake.log),  # noqa: F821
)
