"""Every table of the prior-shift report chapter, from the aggregated shard rows (the hema paper's shapes).

Inputs: the per-draw x method rows of every prior-shift shard (:func:`fmaudit.analyses.prior_shift.
run_prior_shift_job`, concatenated over encoders), their pool rows (the unadapted probe on the whole target
pool and the source hold-out, per source seed), and the rows of the ResNet-18 trained from scratch
(:func:`fmaudit.adapt.scratch.evaluate_scratch`), when enabled. Everything is computed per (task, source
domain): a *scenario* is a target x prior of one source, a *cell* an encoder x scenario (definitions:
:mod:`fmaudit.adapt.summary`).

The report formats what this returns and computes nothing itself.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.adapt import summary as ps
from fmaudit.adapt.selection import regret_table, selection_regret
from fmaudit.io import FmauditInputError

#: Tables of the section, in the order the report shows them.
TABLES = ("prior_shift_summary", "prior_shift_gains", "prior_shift_scenarios", "prior_shift_negative_cells",
          "prior_shift_negative_cells_by_prior", "prior_shift_regret", "prior_shift_calibration",
          "prior_shift_recall", "transfer_reference")
ORACLE = "oracle_restandardization"
GROUP = ("task", "source_domain")

__all__ = ["SHARES_ASSUMED", "SHARES_GIVEN", "TABLES", "summarize_prior_shift", "transfer_reference"]


def _by_group(rows: pd.DataFrame, compute) -> pd.DataFrame:
    """``compute(part)`` for each (task, source domain) of ``rows``, stacked with those two columns first."""
    parts = []
    for key, part in rows.groupby(list(GROUP), sort=False, observed=True):
        table = compute(part.dropna(axis=1, how="all").reset_index(drop=True))
        for col in reversed(GROUP):
            if col in table.columns:
                table = table.drop(columns=col)
        for col, value in zip(reversed(GROUP), reversed(key)):
            table.insert(0, col, value)
        parts.append(table)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _cells(part: pd.DataFrame) -> pd.DataFrame:
    return ps.negative_cells(part, cell=("encoder", "target_domain", "prior"))


def _summary(part: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    """One row per method: the mean gain with its hierarchical-bootstrap interval, positive scenario means,
    negative cells ("29/270"), and the share of the oracle's gain it recovers."""
    gains = ps.gain_intervals(part, by=["method"], n_boot=n_boot, random_state=seed)
    counts = ps.negative_cell_counts(_cells(part), by=["method"])
    out = gains.merge(counts, on="method", how="left")
    out.insert(1, "deployable", [m != ORACLE for m in out["method"]])
    oracle = out.loc[out["method"] == ORACLE, "mean"]
    out["share_of_oracle_gain"] = out["mean"] / float(oracle.iloc[0]) if len(oracle) and oracle.iloc[0] > 0 else np.nan
    out.loc[out["method"] == "none", ["share_of_oracle_gain"]] = np.nan
    out["n_seeds"] = int(part["seed"].nunique())
    out["n_draws"] = int(part["draw"].nunique())
    return out


def _gains(part: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    """Per method x prior: the bar (mean over the targets' scenario means), how many targets gain, and the
    hierarchical-bootstrap interval of the mean gain."""
    bars, _ = ps.scenario_gains(part)
    intervals = ps.gain_intervals(part, by=["method", "prior"], n_boot=n_boot, random_state=seed)
    return bars.merge(intervals.drop(columns=["n_scenarios", "n_positive_scenarios"]), on=["method", "prior"],
                      how="left")


def _regret(part: pd.DataFrame, rules: Sequence[str]) -> pd.DataFrame:
    regret = selection_regret(part, rules)
    table = regret_table(regret, by=("rule", "method", "prior"))
    table["n_encoders"] = int(part["encoder"].nunique())
    table["unit"] = "selection problem = target x prior x source seed x draw"
    return table


def transfer_reference(pool: pd.DataFrame, scratch: pd.DataFrame | None = None) -> pd.DataFrame:
    """The hema paper's transfer table with its reference row: per (task, source, target) and model, the in-domain
    (source hold-out) and target-pool macro-F1 of the unadapted probe (means over source seeds), the relative
    gap and the effective robustness (:func:`fmaudit.adapt.summary.robustness_table`; the line is fitted on
    the frozen encoders only, the scratch ResNet-18 is scored against it), and the frozen encoders' rank on
    the target (the reference is not ranked).

    Parameters
    ----------
    pool : DataFrame
        The shards' pool rows (:attr:`fmaudit.analyses.prior_shift.PriorShiftShard.pool`, every encoder).
    scratch : DataFrame or None
        The scratch ResNet-18's rows (:func:`fmaudit.adapt.scratch.evaluate_scratch`: ``model``, ``task``,
        ``source_domain``, ``target_domain``, ``seed``, ``in_domain``, ``macro_f1``); None or empty: no
        reference row.

    Returns
    -------
    DataFrame
        One row per task, source, target and model: ``frozen`` (False for the reference), ``n_seeds``,
        ``in_domain_macro_f1``, ``macro_f1``, ``rank_on_target`` (frozen encoders only), ``relative_gap``,
        ``effective_robustness`` and ``effective_robustness_fit``. Empty without pool rows.
    """
    if pool is None or pool.empty:
        return pd.DataFrame()
    frozen = pool.assign(model=pool["encoder"], frozen=True)
    ref = None
    if scratch is not None and len(scratch):
        targets = scratch[~scratch["in_domain"]]
        in_dom = scratch[scratch["in_domain"]][["task", "source_domain", "seed", "macro_f1"]].rename(
            columns={"macro_f1": "in_domain_macro_f1"})
        ref = targets.merge(in_dom, on=["task", "source_domain", "seed"], how="left")
        ref = ref.assign(encoder=ref["model"], frozen=False)
    keys = ["task", "source_domain", "target_domain"]
    table = ps.robustness_table(frozen, by=keys, reference_rows=ref)
    table = table.rename(columns={"encoder": "model"})
    seeds = pd.concat([frozen, ref] if ref is not None else [frozen])
    n_seeds = seeds.groupby([*keys, "encoder"], observed=True)["seed"].nunique().rename("n_seeds").reset_index()
    table = table.merge(n_seeds.rename(columns={"encoder": "model"}), on=[*keys, "model"], how="left")
    table["rank_on_target"] = (table[table["frozen"]].groupby(keys, observed=True)["macro_f1"]
                               .rank(ascending=False, method="min")).astype("Int64")
    table = table.sort_values([*keys, "frozen", "macro_f1"], ascending=[True, True, True, False, False],
                              kind="stable").reset_index(drop=True)
    cols = [*keys, "model", "frozen", "n_seeds", "in_domain_macro_f1", "macro_f1", "rank_on_target", "relative_gap",
            "effective_robustness", "effective_robustness_fit"]
    return table[cols]


#: What a prior's ``prior_shares`` column says: its shares were given by the config as numbers a paper or the user
#: publishes, or they are an assumption (``prior_shift.assumed_priors``).
SHARES_GIVEN, SHARES_ASSUMED = "as configured", "assumed"


def summarize_prior_shift(rows: pd.DataFrame, pool: pd.DataFrame | None, scratch: pd.DataFrame | None,
                          bootstrap: Mapping[str, Mapping[str, Any]],
                          selection: Mapping[str, Sequence[str]],
                          assumed_priors: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any] | None:
    """The tables of :data:`TABLES` by name (None without prior-shift rows).

    ``bootstrap``: task -> its bootstrap section (``n_boot`` and ``seed`` of the hierarchical intervals);
    ``selection``: task -> its ``prior_shift.model_selection`` rules (the first is the headline rule);
    ``assumed_priors``: task -> the priors whose shares are assumptions (``prior_shift.assumed_priors``): every
    table with a ``prior`` column says so in ``prior_shares`` (:data:`SHARES_ASSUMED`).

    Parameters
    ----------
    rows : DataFrame
        The shards' run x method rows (:attr:`fmaudit.analyses.prior_shift.PriorShiftShard.rows`, every
        encoder).
    pool : DataFrame or None
        The shards' pool rows, for :func:`transfer_reference`.
    scratch : DataFrame or None
        The scratch ResNet-18's rows, when enabled.
    bootstrap : mapping of str to mapping
        Task -> its ``bootstrap`` block (``n_boot``, ``seed``).
    selection : mapping of str to sequence of str
        Task -> its ``prior_shift.model_selection`` rules.
    assumed_priors : mapping of str to sequence of str, or None
        Task -> the priors whose shares are assumed.

    Returns
    -------
    dict or None
        Each name of :data:`TABLES` -> DataFrame (per task and source domain, those two columns first; a
        ``prior_shares`` column after ``prior``), ``headline_rules`` (task -> its first selection rule) and
        ``assumed_priors`` (task -> list of prior names).

    Raises
    ------
    FmauditInputError
        A task of ``rows`` has no bootstrap or selection settings.
    """
    if rows is None or len(rows) == 0:
        return None
    tasks = list(dict.fromkeys(rows["task"].astype(str)))
    for task in tasks:
        if task not in bootstrap or task not in selection:
            raise FmauditInputError(f"prior-shift rows of task {task!r} but no bootstrap/model_selection "
                                    "settings for it")
    rows = rows.copy()
    for col in ("task", "encoder", "source_domain", "target_domain", "prior", "method"):
        rows[col] = rows[col].astype(str)

    def per_task(fn):
        return lambda part: fn(part, bootstrap[str(part["task"].iloc[0])])

    out: dict[str, Any] = {
        "prior_shift_summary": _by_group(rows, per_task(lambda p, b: _summary(p, int(b["n_boot"]), int(b["seed"])))),
        "prior_shift_gains": _by_group(rows, per_task(lambda p, b: _gains(p, int(b["n_boot"]), int(b["seed"])))),
        "prior_shift_scenarios": _by_group(rows, lambda p: ps.scenario_gains(p)[1]),
        "prior_shift_negative_cells": _by_group(
            rows, lambda p: ps.negative_cell_counts(_cells(p), by=["method", "encoder"])),
        "prior_shift_negative_cells_by_prior": _by_group(
            rows, lambda p: ps.negative_cell_counts(_cells(p), by=["method", "prior"])),
        "prior_shift_regret": _by_group(rows, lambda p: _regret(p, selection[str(p["task"].iloc[0])])),
        "prior_shift_calibration": _by_group(
            rows, lambda p: ps.calibration_under_adaptation(p, by=["method", "prior"])),
        "prior_shift_recall": _by_group(rows, lambda p: ps.per_class_recall(p, by=["method", "prior"])),
        "transfer_reference": transfer_reference(pool, scratch),
    }
    out["headline_rules"] = {task: list(selection[task])[0] for task in tasks}
    assumed = {task: [str(p) for p in (assumed_priors or {}).get(task) or []] for task in tasks}
    for name in TABLES:
        table = out[name]
        if len(table) and "prior" in table.columns and "task" in table.columns:
            shares = [SHARES_ASSUMED if str(p) in assumed.get(str(t), []) else SHARES_GIVEN
                      for t, p in zip(table["task"], table["prior"])]
            table.insert(int(table.columns.get_loc("prior")) + 1, "prior_shares", shares)
    out["assumed_priors"] = assumed
    return out
