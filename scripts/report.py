"""Snakemake adapter: tables, figures and the index of the report."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.report import report_job  # noqa: E402

report_job(
    runs=snakemake.input.runs,  # noqa: F821
    predictions=list(snakemake.input.predictions),  # noqa: F821
    embeddings=list(snakemake.input.embeddings),  # noqa: F821
    out_dir=str(Path(snakemake.output.index).parent),  # noqa: F821
    calibration=snakemake.params.calibration,  # noqa: F821
    bootstrap=snakemake.params.bootstrap,  # noqa: F821
    ood=list(snakemake.input.ood),  # noqa: F821
    ood_settings=snakemake.params.ood,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
    prior_shift_runs=getattr(snakemake.input, "prior_shift_runs", None),  # noqa: F821
    prior_shift_pool=getattr(snakemake.input, "prior_shift_pool", None),  # noqa: F821
    scratch=getattr(snakemake.input, "scratch", None),  # noqa: F821
    prior_shift=snakemake.params.prior_shift,  # noqa: F821
    variants=snakemake.params.variants,  # noqa: F821
    exposure=snakemake.params.exposure,  # noqa: F821
    cell_runs=snakemake.input.cell_runs[0] if snakemake.input.cell_runs else None,  # noqa: F821
    cell_qc={Path(p).stem: p for p in snakemake.input.cell_qc},  # noqa: F821
    cells=snakemake.params.cells,  # noqa: F821
    cell_subset_scores=next(iter(snakemake.input.cell_subset_scores), None),  # noqa: F821
    claims=list(snakemake.input.claims),  # noqa: F821
)
