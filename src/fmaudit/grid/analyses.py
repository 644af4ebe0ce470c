"""The one place that declares the analyses: name, run enumerator, job keys, and whether a rule runs it yet.

An analysis is *declared* when its config section is validated and its runs are counted (``fmaudit grid``)
ahead of its Snakemake rule; *ruled* once the workflow plans its jobs. A branch that lands a rule replaces the
declared entry with a ruled one in one line, e.g. ``"ood": ruled(declared["ood"])``, or by setting ``ruled=True``
below. Everything else (``enumerate_runs``, ``jobs``, ``check_grid``, the ``planned`` column of the summary) reads
this table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pandas as pd

from fmaudit.grid.cells import cell_feature_runs, cell_runs, check_cell_protocols
from fmaudit.grid.ood import ood_blur_runs, ood_gate_runs, ood_image_artefact_runs, ood_runs, ood_split_runs
from fmaudit.grid.prior_shift import prior_shift_runs, scratch_reference_runs
from fmaudit.grid.probe import cross_dataset_runs, embed_runs, head_sweep_runs, probe_runs
from fmaudit.grid.studies import check_studies
from fmaudit.io import FmauditInputError

Enumerator = Callable[[Mapping[str, Any], Mapping[str, Any] | None], pd.DataFrame]

__all__ = ["ANALYSES", "Analysis", "JOB_KEYS", "RULED_ANALYSES", "check_grid", "enumerate_runs", "jobs", "ruled"]


@dataclass(frozen=True)
class Analysis:
    """One analysis of the grid.

    ``enumerate(config, dataset_registry)`` returns its run table (one row per run; ``embed``: per pair);
    ``job_keys`` are the columns that name the job a run is batched into; ``ruled`` says whether the workflow
    has a rule for it (the summary's ``planned``). :func:`check_grid` runs the enumerator on every dry-run,
    or ``check`` instead where the run table is large; ``checked=False`` where another analysis's check
    covers this one."""

    name: str
    enumerate: Enumerator
    job_keys: tuple[str, ...]
    ruled: bool = False
    check: Callable[[Mapping[str, Any], Mapping[str, Any] | None], Any] | None = dataclasses.field(default=None)
    checked: bool = True

    def run_check(self, config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None) -> None:
        if self.checked:
            (self.check or self.enumerate)(config, dataset_registry)


def ruled(analysis: Analysis) -> Analysis:
    """The same analysis, now planned by a rule of the workflow."""
    return dataclasses.replace(analysis, ruled=True)


def _cells_check(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None) -> None:
    check_cell_protocols(config)


#: Every analysis, in summary order (``ruled``: the workflow has its rules).
ANALYSES: dict[str, Analysis] = {a.name: a for a in (
    Analysis("embed", embed_runs, ("encoder", "dataset"), ruled=True),
    Analysis("probe", probe_runs, ("encoder", "task"), ruled=True),
    Analysis("head_sweep", head_sweep_runs, ("encoder", "task")),
    Analysis("cross_dataset", cross_dataset_runs, ("encoder", "source_task", "target_task")),
    Analysis("ood", ood_runs, ("encoder", "task"), ruled=True),
    Analysis("ood_gate", ood_gate_runs, ("encoder", "task"), ruled=True),  # in the task's OOD shard
    Analysis("ood_blur", ood_blur_runs, ("encoder", "dataset", "sigma"), ruled=True),  # embed jobs of copies
    Analysis("ood_image_artefact", ood_image_artefact_runs, ("encoder", "dataset", "condition"), ruled=True),
    Analysis("ood_splits", ood_split_runs, ("encoder", "task"), ruled=True),  # seed 003's further splits
    Analysis("prior_shift", prior_shift_runs, ("encoder", "source_domain", "target_domain"), ruled=True),
    Analysis("scratch_reference", scratch_reference_runs, ("task", "source_domain", "seed"), ruled=True,
             checked=False),  # checked with prior_shift
    Analysis("cell_features", cell_feature_runs, ("encoder", "section", "magnification"), ruled=True,
             checked=False),  # checked with cells
    Analysis("cells", cell_runs, ("encoder", "magnification", "protocol"), ruled=True, check=_cells_check),
)}

#: Analyses the workflow plans today (their rules exist).
RULED_ANALYSES = frozenset(name for name, a in ANALYSES.items() if a.ruled)
#: Columns of a run table that name the job it runs in.
JOB_KEYS: dict[str, tuple[str, ...]] = {name: a.job_keys for name, a in ANALYSES.items()}


def enumerate_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None,
                   analysis: str | None = None) -> pd.DataFrame | dict[str, pd.DataFrame]:
    """The run table of one analysis (see :data:`ANALYSES`), or all of them by name.

    ``embed`` rows are (encoder, data set) pairs; the other tables have one row per run and the columns of
    :data:`JOB_KEYS` say which job runs it.
    """
    if analysis is None:
        return {name: a.enumerate(config, dataset_registry) for name, a in ANALYSES.items()}
    if analysis not in ANALYSES:
        raise FmauditInputError(f"unknown analysis {analysis!r}; analyses: {', '.join(ANALYSES)}")
    return ANALYSES[analysis].enumerate(config, dataset_registry)


def jobs(runs: pd.DataFrame, analysis: str) -> pd.DataFrame:
    """The jobs a run table of ``analysis`` is batched into: its distinct :data:`JOB_KEYS`, in run order."""
    keys = list(JOB_KEYS[analysis])
    if runs.empty:
        return pd.DataFrame(columns=keys)
    return runs[keys].drop_duplicates().reset_index(drop=True).astype(object)


def check_grid(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`FmauditInputError` naming the key of the first bad reference in any analysis section.

    Cheap enough for every dry-run: the cell grid is checked without building its run table."""
    check_studies(config)
    for analysis in ANALYSES.values():
        analysis.run_check(config, dataset_registry)
