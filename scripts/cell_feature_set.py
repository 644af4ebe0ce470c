"""Snakemake adapter: merge one encoder's feature folders at one magnification into the list the shards read."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.cells import cell_feature_set_job

sections = list(snakemake.params.sections)
cell_feature_set_job(
    features=dict(zip(sections, snakemake.input.features)),
    manifests=dict(zip(sections, snakemake.input.manifests)),
    out=snakemake.output[0],
    log=snakemake.log[0],
)
