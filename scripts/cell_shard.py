"""Snakemake adapter: every cell probe run of one (encoder, magnification, protocol) shard."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.cells import cell_shard_job  # noqa: E402

cell_shard_job(
    encoder=snakemake.wildcards.encoder,  # noqa: F821
    magnification=float(snakemake.wildcards.magnification),  # noqa: F821
    protocol=snakemake.wildcards.protocol,  # noqa: F821
    cells=snakemake.params.cells,  # noqa: F821
    taxonomy_tasks=list(snakemake.params.taxonomy_tasks),  # noqa: F821
    feature_set=snakemake.input.features,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
