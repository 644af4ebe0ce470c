"""Snakemake adapter: the prior-shift shards, their pool rows and the scratch references, across encoders."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))

from fmaudit.jobs.prior_shift import aggregate_prior_shift_job

aggregate_prior_shift_job(
    runs=list(snakemake.input.runs),
    pools=list(snakemake.input.pools),
    scratch=list(snakemake.input.scratch),
    out_runs=snakemake.output.runs,
    out_pool=snakemake.output.pool,
    out_scratch=snakemake.output.scratch,
    log=snakemake.log[0],
)
