"""Snakemake adapter: merge one encoder's feature folders at one magnification into the list the shards read."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.cells import cell_feature_set_job  # noqa: E402

sections = list(snakemake.params.sections)  # noqa: F821
cell_feature_set_job(
    features=dict(zip(sections, snakemake.input.features)),  # noqa: F821
    manifests=dict(zip(sections, snakemake.input.manifests)),  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
