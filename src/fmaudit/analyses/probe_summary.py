"""Every table of the probe suite's report chapter, computed from the aggregated runs and the predictions.

The report formats what this returns and computes nothing itself. Settings come per task (a combined config
may give each study its own ``calibration`` and ``bootstrap``), so tasks that share their settings are
summarised together and the tables of the groups are stacked; each row's ECE column and interval convention
name the settings it was made with.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.analyses import leaderboard as lb
from fmaudit.analyses import transfer
from fmaudit.io import FmauditInputError

#: Tables of the probe suite, in the order the report shows them.
TABLES = ("leaderboard", "calibration", "shift_summary", "cross_domain_leaderboard", "paired_differences", "cri",
          "cri_by_split", "rank_transfer", "decoupling_units", "decoupling", "ece_slopes", "ece_slope_by_auroc_bin")
#: Data behind the figures (not written as tables).
FIGURE_DATA = ("reliability_curves", "ece_by_fraction")

__all__ = ["FIGURE_DATA", "TABLES", "settings_groups", "summarize_probe_suite"]


def settings_groups(tasks: list[str], calibration: Mapping[str, Mapping[str, Any]],
                    bootstrap: Mapping[str, Mapping[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """(settings, tasks) for each distinct combination of the settings the summary uses, in task order.

    settings: ``ece_bins``, ``include_bound_temperatures``, ``n_boot``, ``seed`` and ``paired_n_boot``.

    Parameters
    ----------
    tasks : list of str
        The tasks that have runs, in the order the groups should follow.
    calibration : mapping of str to mapping
        Task -> its filled ``calibration`` block (``ece_bins``, ``include_bound_temperatures``).
    bootstrap : mapping of str to mapping
        Task -> its filled ``bootstrap`` block (``n_boot``, ``seed``, ``paired_n_boot``).

    Returns
    -------
    list of (dict, list of str)
        One pair per distinct settings combination: the settings by name and the tasks that share them.

    Raises
    ------
    FmauditInputError
        A task has no calibration or bootstrap block.
    """
    names = ("ece_bins", "include_bound_temperatures", "n_boot", "seed", "paired_n_boot")
    groups: dict[tuple, list[str]] = {}
    for task in tasks:
        if task not in calibration or task not in bootstrap:
            raise FmauditInputError(f"task {task!r} has runs but no calibration/bootstrap settings were given for it")
        key = (int(calibration[task]["ece_bins"]), bool(calibration[task]["include_bound_temperatures"]),
               int(bootstrap[task]["n_boot"]), int(bootstrap[task]["seed"]), int(bootstrap[task]["paired_n_boot"]))
        groups.setdefault(key, []).append(task)
    return [(dict(zip(names, key)), tasks_) for key, tasks_ in groups.items()]


def _rank_transfer(runs: pd.DataFrame, preds: pd.DataFrame, s: Mapping[str, Any]) -> pd.DataFrame:
    """Rank transfer with the bootstrap interval of ρ (test patients resampled; see
    :func:`fmaudit.analyses.transfer.rank_transfer_intervals`)."""
    table = transfer.rank_transfer_table(runs, s["ece_bins"])
    if len(table) == 0:
        return table
    keys = ["task", "head", "fraction", "source_domain", "target_domain"]
    intervals = transfer.rank_transfer_intervals(preds, n_boot=s["n_boot"], seed=s["seed"])
    return table.merge(intervals, on=keys, how="left") if len(intervals) else table


def _group_tables(runs: pd.DataFrame, preds: pd.DataFrame, s: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    bins, bound = s["ece_bins"], s["include_bound_temperatures"]
    board = lb.leaderboard(runs, preds, n_boot=s["n_boot"], seed=s["seed"], ece_bins=bins)
    slopes = transfer.ece_slopes(runs, bins)
    per_unit, pooled = transfer.decoupling_table(runs, bins, include_bound_temperatures=bound)
    cri = transfer.cri_table(runs, bins, include_bound_temperatures=bound)
    return {
        "leaderboard": board,
        "calibration": lb.calibration_table(runs, ece_bins=bins, include_bound_temperatures=bound),
        "shift_summary": lb.shift_summary(board, ece_bins=bins),
        "cross_domain_leaderboard": transfer.cross_dataset_leaderboard(board),
        "paired_differences": lb.paired_differences(board, preds, n_boot=s["paired_n_boot"], seed=s["seed"]),
        "cri": cri,
        "cri_by_split": transfer.cri_by_split(cri),
        "rank_transfer": _rank_transfer(runs, preds, s),
        "decoupling_units": per_unit,
        "decoupling": pooled,
        "ece_slopes": slopes,
        "ece_slope_by_auroc_bin": transfer.ece_slope_by_auroc_bin(slopes),
        "reliability_curves": lb.reliability_curves(preds, n_bins=bins),
        "ece_by_fraction": lb.ece_by_fraction(runs, preds, ece_bins=bins, n_boot=s["n_boot"], seed=s["seed"]),
    }


def summarize_probe_suite(runs: pd.DataFrame, preds: pd.DataFrame, calibration: Mapping[str, Mapping[str, Any]],
                          bootstrap: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The tables of :data:`TABLES` and :data:`FIGURE_DATA` by name, plus ``settings``: the list of
    (settings, tasks) groups they were computed with. ``calibration`` and ``bootstrap`` map each task to its
    config block. None when there are no runs (a config whose analyses have no rules yet).

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows of every shard (:func:`fmaudit.analyses.probe_suite.run_probe_suite`).
    preds : DataFrame
        The shards' predictions, a row per run and target item.
    calibration : mapping of str to mapping
        Task -> its filled ``calibration`` block.
    bootstrap : mapping of str to mapping
        Task -> its filled ``bootstrap`` block.

    Returns
    -------
    dict or None
        Table name -> DataFrame for every name of :data:`TABLES` and :data:`FIGURE_DATA` (the groups' tables
        stacked; with several groups the figure data get a ``tasks`` column), and ``settings``:
        :func:`settings_groups`.

    Raises
    ------
    FmauditInputError
        A task of ``runs`` has no calibration or bootstrap block.
    """
    if len(runs) == 0:
        return None
    groups = settings_groups(list(dict.fromkeys(runs["task"])), calibration, bootstrap)
    parts = []
    for settings, tasks in groups:
        sub_runs = runs[runs["task"].isin(tasks)]
        sub_preds = preds[preds["task"].isin(tasks)]
        tables = _group_tables(sub_runs, sub_preds, settings)
        if len(groups) > 1:  # the figures draw one panel set per group
            for name in FIGURE_DATA:
                tables[name] = tables[name].assign(tasks=", ".join(tasks))
        parts.append(tables)
    out: dict[str, Any] = {name: pd.concat([p[name] for p in parts], ignore_index=True) if len(parts) > 1
                           else parts[0][name] for name in (*TABLES, *FIGURE_DATA)}
    out["settings"] = groups
    return out
