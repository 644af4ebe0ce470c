"""Snakemake adapter: the prior-shift shards, their pool rows and the scratch references, across encoders."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.prior_shift import aggregate_prior_shift_job  # noqa: E402

aggregate_prior_shift_job(
    runs=list(snakemake.input.runs),  # noqa: F821
    pools=list(snakemake.input.pools),  # noqa: F821
    scratch=list(snakemake.input.scratch),  # noqa: F821
    out_runs=snakemake.output.runs,  # noqa: F821
    out_pool=snakemake.output.pool,  # noqa: F821
    out_scratch=snakemake.output.scratch,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
