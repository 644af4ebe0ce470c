"""The one table of analyses: name, run enumerator, job keys, the rule that runs its jobs, and whether the cluster
profile resubmits them.

An analysis is *declared* when its config block is validated and its runs are counted (``fmaudit grid``) ahead of
its Snakemake rule (``rule=None``); *ruled* once the workflow plans its jobs (``rule`` names the rule). Everything
else reads this table: ``enumerate_runs``, ``jobs``, ``check_grid``, the ``planned`` column of the summary, the
names :mod:`fmaudit.grid` exports (every module that holds an analysis's enumerator, :func:`analysis_modules`) and
the rules a cluster profile retries (:func:`retried_rules`: ``preemptible-rules`` of ``profiles/slurm/config.yaml``,
which ``fmaudit profile install`` writes from this table and a test checks against it).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Mapping

import pandas as pd

from fmaudit.grid.cells import cell_feature_runs, cell_run_counts, cell_runs, check_cell_protocols
from fmaudit.grid.ood import ood_blur_runs, ood_gate_runs, ood_image_artefact_runs, ood_runs, ood_split_runs
from fmaudit.grid.prior_shift import prior_shift_runs, scratch_reference_runs
from fmaudit.grid.probe import cross_dataset_runs, embed_runs, head_sweep_runs, probe_runs
from fmaudit.grid.studies import check_studies
from fmaudit.io import FmauditInputError

Enumerator = Callable[[Mapping[str, Any], Mapping[str, Any] | None], pd.DataFrame]

__all__ = ["ANALYSES", "Analysis", "JOB_KEYS", "RULED_ANALYSES", "analysis_modules", "check_grid", "count_runs",
           "enumerate_runs", "jobs", "retried_rules", "ruled"]


@dataclass(frozen=True)
class Analysis:
    """One analysis of the grid.

    Parameters
    ----------
    name : str
        The analysis's name (the key of :data:`ANALYSES`, the ``analysis`` column of its runs).
    enumerate : callable
        ``enumerate(config, dataset_registry)`` returns its run table (one row per run; ``embed``: per
        (encoder, data set) pair), raising :class:`~fmaudit.io.FmauditInputError` on a bad config block.
    job_keys : tuple of str
        The columns that name the job a run is batched into.
    rule : str or None
        The workflow rule that runs those jobs (None while the analysis is declared only; several analyses may
        share one: the OOD gate runs in the OOD shard, the blurred copies are embedding jobs).
    retried : bool
        A job of it can fail for lack of memory or time, or on a lost node, so the cluster profile resubmits it
        (:func:`retried_rules`).
    check : callable, optional
        ``check(config, dataset_registry)``, run by :func:`check_grid` on every dry-run instead of the
        enumerator, where the run table is large.
    checked : bool
        False where another analysis's check covers this one (:func:`check_grid` skips it).
    count : callable, optional
        ``count(config, dataset_registry)``, where the run table is large: its jobs (the job keys) and how many
        runs each has (``runs``), without building the table (:func:`count_runs`; tested equal to the
        enumerator's).
    """

    name: str
    enumerate: Enumerator
    job_keys: tuple[str, ...]
    rule: str | None = None
    retried: bool = True
    check: Callable[[Mapping[str, Any], Mapping[str, Any] | None], Any] | None = dataclasses.field(default=None)
    checked: bool = True
    count: Callable[[Mapping[str, Any], Mapping[str, Any] | None], pd.DataFrame] | None = dataclasses.field(
        default=None)

    @property
    def ruled(self) -> bool:
        """Whether the workflow has a rule for it (the summary's ``planned``)."""
        return self.rule is not None

    def run_check(self, config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None) -> None:
        """Run the analysis's check on ``config`` (``check``, else its enumerator), unless another analysis covers it.

        Parameters
        ----------
        config : Mapping
            The filled config.
        dataset_registry : Mapping or None
            Data-set slug -> registry entry, for the tasks' domains.

        Raises
        ------
        FmauditInputError
            Naming the config key of the first bad reference.
        """
        if self.checked:
            (self.check or self.enumerate)(config, dataset_registry)


def ruled(analysis: Analysis, rule: str) -> Analysis:
    """The same analysis, now planned by the workflow's rule ``rule``.

    Parameters
    ----------
    analysis : Analysis
        A declared (or ruled) analysis.
    rule : str
        The name of the rule that runs its jobs.

    Returns
    -------
    Analysis
        A copy with ``rule`` set; ``analysis`` itself is unchanged (frozen).
    """
    return dataclasses.replace(analysis, rule=rule)


def _cells_check(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None) -> None:
    check_cell_protocols(config)


#: Every analysis, in summary order (``rule``: the workflow rule that runs its jobs; none: declared only).
ANALYSES: dict[str, Analysis] = {a.name: a for a in (
    Analysis("embed", embed_runs, ("encoder", "dataset"), rule="embed"),
    Analysis("probe", probe_runs, ("encoder", "task"), rule="probe_shard"),
    Analysis("head_sweep", head_sweep_runs, ("encoder", "task")),
    Analysis("cross_dataset", cross_dataset_runs, ("encoder", "source_task", "target_task")),
    Analysis("ood", ood_runs, ("encoder", "task"), rule="ood_shard"),
    Analysis("ood_gate", ood_gate_runs, ("encoder", "task"), rule="ood_shard"),  # in the task's OOD shard
    Analysis("ood_blur", ood_blur_runs, ("encoder", "dataset", "sigma"), rule="embed"),  # embed jobs of copies
    Analysis("ood_image_artefact", ood_image_artefact_runs, ("encoder", "dataset", "condition"), rule="embed"),
    Analysis("ood_splits", ood_split_runs, ("encoder", "task"), rule="ood_split_shard"),  # audit paper: further splits
    Analysis("prior_shift", prior_shift_runs, ("encoder", "source_domain", "target_domain"),
             rule="prior_shift_shard"),
    Analysis("scratch_reference", scratch_reference_runs, ("task", "source_domain", "seed"),
             rule="scratch_reference", checked=False),  # checked with prior_shift
    # one job per (encoder, section): every magnification of the section with the encoder loaded once
    Analysis("cell_features", cell_feature_runs, ("encoder", "section"), rule="cell_features",
             checked=False),  # checked with cells
    Analysis("cells", cell_runs, ("encoder", "magnification", "protocol"), rule="cell_shard", check=_cells_check,
             count=cell_run_counts),
)}

#: Analyses the workflow plans today (their rules exist).
RULED_ANALYSES = frozenset(name for name, a in ANALYSES.items() if a.ruled)
#: Columns of a run table that name the job it runs in.
JOB_KEYS: dict[str, tuple[str, ...]] = {name: a.job_keys for name, a in ANALYSES.items()}


def retried_rules(analyses: Mapping[str, Analysis] | None = None) -> list[str]:
    """The rules whose jobs a cluster profile resubmits (``preemptible-rules``): each ruled analysis's rule where
    it is ``retried``, once, in table order.

    Parameters
    ----------
    analyses : Mapping of str to Analysis, optional
        A table of analyses; None: :data:`ANALYSES`.

    Returns
    -------
    list of str
        Rule names, each once.
    """
    table = ANALYSES if analyses is None else analyses
    return list(dict.fromkeys(a.rule for a in table.values() if a.rule is not None and a.retried))


def analysis_modules(analyses: Mapping[str, Analysis] | None = None) -> list[ModuleType]:
    """The modules that hold the analyses' enumerators, once, in table order: :mod:`fmaudit.grid` re-exports their
    public names (``__all__``), so a new analysis's module is exported by its line in :data:`ANALYSES`.

    Parameters
    ----------
    analyses : Mapping of str to Analysis, optional
        A table of analyses; None: :data:`ANALYSES`.

    Returns
    -------
    list of ModuleType
        The imported modules, each once.
    """
    table = ANALYSES if analyses is None else analyses
    return [sys.modules[name] for name in dict.fromkeys(a.enumerate.__module__ for a in table.values())]


def enumerate_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None,
                   analysis: str | None = None) -> pd.DataFrame | dict[str, pd.DataFrame]:
    """The run table of one analysis (see :data:`ANALYSES`), or all of them by name.

    ``embed`` rows are (encoder, data set) pairs; the other tables have one row per run and the columns of
    :data:`JOB_KEYS` say which job runs it.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the tasks' domains.
    analysis : str, optional
        A key of :data:`ANALYSES`; None: every analysis.

    Returns
    -------
    DataFrame or dict of str to DataFrame
        The analysis's run table, or analysis name -> run table in table order.

    Raises
    ------
    FmauditInputError
        When ``analysis`` is unknown, or a block of the config fails its checks (naming the key).
    """
    if analysis is None:
        return {name: a.enumerate(config, dataset_registry) for name, a in ANALYSES.items()}
    if analysis not in ANALYSES:
        raise FmauditInputError(f"unknown analysis {analysis!r}; analyses: {', '.join(ANALYSES)}")
    return ANALYSES[analysis].enumerate(config, dataset_registry)


def jobs(runs: pd.DataFrame, analysis: str) -> pd.DataFrame:
    """The jobs a run table of ``analysis`` is batched into: its distinct :data:`JOB_KEYS`, in run order.

    Parameters
    ----------
    runs : DataFrame
        A run table of ``analysis`` (:func:`enumerate_runs`).
    analysis : str
        A key of :data:`ANALYSES`.

    Returns
    -------
    DataFrame
        One row per job, the job-key columns only (as object dtype); empty with those columns when ``runs`` is.
    """
    keys = list(JOB_KEYS[analysis])
    if runs.empty:
        return pd.DataFrame(columns=keys)
    return runs[keys].drop_duplicates().reset_index(drop=True).astype(object)


def count_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None, analysis: str,
               by: tuple[str, ...] = ()) -> pd.DataFrame:
    """The jobs of one analysis (its :data:`JOB_KEYS`, and the columns ``by``, in run order) with ``runs``,
    how many runs each has: from the analysis's ``count`` where it has one (its run table is never built),
    else from its run table.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping or None
        Data-set slug -> registry entry, for the tasks' domains.
    analysis : str
        A key of :data:`ANALYSES`.
    by : tuple of str
        Further run-table columns to split the counts by (e.g. ``("protocol",)``), placed first.

    Returns
    -------
    DataFrame
        One row per job, columns ``by`` then the job keys, then ``runs`` (int).
    """
    entry = ANALYSES[analysis]
    keys = list(dict.fromkeys([*by, *entry.job_keys]))
    if entry.count is not None:
        return entry.count(config, dataset_registry)[[*keys, "runs"]].reset_index(drop=True)
    table = entry.enumerate(config, dataset_registry)
    if table.empty:
        return pd.DataFrame(columns=[*keys, "runs"])
    counted = table.groupby(keys, sort=False, observed=True).size().rename("runs").reset_index()
    return counted.astype({k: object for k in keys})


def check_grid(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`FmauditInputError` naming the key of the first bad reference in any analysis section.

    Cheap enough for every dry-run: the cell grid is checked without building its run table.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the tasks' domains.

    Raises
    ------
    FmauditInputError
        Naming the config key of the first bad reference (studies first, then each analysis in table order).
    """
    check_studies(config)
    for analysis in ANALYSES.values():
        analysis.run_check(config, dataset_registry)
