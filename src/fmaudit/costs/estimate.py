"""What a config would cost, predicted before anything runs: the jobs and units of work the grid plans
(:func:`planned_units`), the per-unit costs measured on a study that ran (:func:`unit_costs`), and their product
(:func:`estimate_cost`).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.costs.benchmarks import BENCHMARK_PATHS, job_gpus
from fmaudit.grid import (
    embed_pairs,
    enumerate_runs,
    ood_shard_plan,
    ood_shards,
    ood_split_shards,
    prior_shift_runs,
    scratch_reference_runs,
    shards,
)
from fmaudit.io import FmauditInputError, PathLike, read_table

__all__ = [
    "ESTIMATE_COLUMNS",
    "estimate_cost",
    "measured_units",
    "planned_jobs",
    "planned_units",
    "read_unit_costs",
    "unit_costs",
]

def unit_costs(costs: pd.DataFrame, units: Mapping[tuple[str, str], float], source: str) -> pd.DataFrame:
    """Measured cost per unit of work, per (rule, encoder) and per rule over every encoder (``encoder`` ``*``):
    wall, CPU and GPU seconds per unit, where ``units[(rule, job)]`` is how many units (runs, or images for
    ``embed``) the job did. A job's start-up is spread over its units, so a grid with many more units per job
    than the measured one is predicted high. ``source`` says where the measurements come from.

    Parameters
    ----------
    costs : DataFrame
        Measured job costs (:func:`fmaudit.costs.job_costs`).
    units : Mapping of (str, str) to float
        (rule, job) -> units of work the job did (:func:`measured_units`); jobs absent, or with no units, are left
        out.
    source : str
        Where the measurements come from (a study folder, a file), copied into every row.

    Returns
    -------
    DataFrame
        One row per (rule, encoder) measured and one per rule with ``encoder`` ``*``; columns ``rule``,
        ``encoder``, ``measured_jobs``, ``measured_units``, ``wall_s_per_unit``, ``cpu_s_per_unit``,
        ``gpu_s_per_unit`` (seconds per unit), ``peak_rss_mb`` and ``source``.
    """
    frame = costs.assign(units=[units.get((r, j), np.nan) for r, j in zip(costs["rule"], costs["job"])])
    frame = frame[frame["units"].notna() & (frame["units"] > 0)]
    rows = []
    for (rule, enc), part in [
        *frame.groupby(["rule", "encoder"], sort=True),
        *(((r, "*"), p) for r, p in frame.groupby("rule", sort=True)),
    ]:
        n = float(part["units"].sum())
        rows.append(
            {
                "rule": rule,
                "encoder": enc,
                "measured_jobs": int(len(part)),
                "measured_units": n,
                "wall_s_per_unit": float(part["wall_s"].sum()) / n,
                "cpu_s_per_unit": float(part["cpu_s"].sum()) / n,
                "gpu_s_per_unit": float((part["wall_s"] * part["gpus"]).sum()) / n,
                "peak_rss_mb": float(part["max_rss_mb"].max()),
                "source": source,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "rule",
            "encoder",
            "measured_jobs",
            "measured_units",
            "wall_s_per_unit",
            "cpu_s_per_unit",
            "gpu_s_per_unit",
            "peak_rss_mb",
            "source",
        ],
    )


def _wildcards(rule: str) -> list[str]:
    return re.findall(r"\{([a-z_]+)\}", BENCHMARK_PATHS[rule])


def planned_jobs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any], cells: bool = True) -> pd.DataFrame:
    """Every job of the config that writes a benchmark file: ``rule``, ``encoder`` ('' for none) and its
    wildcards (those of :data:`BENCHMARK_PATHS` but the embedding ``key``), from the grid (the same functions
    the workflow plans with). ``cells=False`` leaves the cell branch out (the workflow has its own plan of it,
    built without the cell run table).

    Parameters
    ----------
    config : Mapping
        A filled config.
    dataset_registry : Mapping
        Data-set name -> registry entry, as the config sees it (``kind`` decides which data sets are prepared,
        embedded or imported).
    cells : bool
        Whether to plan the cell branch's jobs (``prepare_cell_section``, ``cell_features``, ``cell_shard``).

    Returns
    -------
    DataFrame
        One row per job: ``rule``, ``encoder`` ('' for a job without one) and the rule's wildcards (``dataset``,
        ``task``, ``source_domain``, ``section``, ``magnification``...; NaN where a rule has no such wildcard).
    """
    rows: list[dict[str, Any]] = []
    rows += [
        {"rule": "prepare_manifest", "dataset": ds}
        for ds in config["datasets"]
        if (dataset_registry.get(ds) or {}).get("kind") != "xenium_cells"
    ]
    embedded = list(embed_pairs(config))
    for encoder, task in ood_shards(config):
        plan = ood_shard_plan(config, task)
        donors = [ds for c in plan["conditions"] if c["tier"] == "far" for ds in c["donor"]["datasets"]]
        derived = [name for c in plan["conditions"] for name in c.get("derived", [])]
        embedded += [(encoder, ds) for ds in [*config["tasks"][task]["datasets"], *donors, *derived]]
    # a data set of kind `features` is imported (import_features), not embedded: no job to charge
    rows += [{"rule": "embed", "encoder": e, "dataset": d} for e, d in dict.fromkeys(embedded)
             if (dataset_registry.get(d) or {}).get("kind") != "features"]
    rows += [{"rule": "probe_shard", "encoder": s.encoder, "task": s.task} for s in shards(config)]
    rows += [{"rule": "ood_shard", "encoder": e, "task": t} for e, t in ood_shards(config)]
    rows += [{"rule": "ood_split_shard", "encoder": e, "task": t} for e, t in ood_split_shards(config)]
    ps = prior_shift_runs(config, dataset_registry)
    if len(ps):
        keys = ["task", "encoder", "source_domain", "target_domain"]
        rows += [{"rule": "prior_shift_shard", **r} for r in ps[keys].astype(str).drop_duplicates().to_dict("records")]
    scratch = scratch_reference_runs(config, dataset_registry)
    if len(scratch):
        rows += [
            {"rule": "scratch_reference", **r}
            for r in scratch[["task", "source_domain", "seed"]].astype(str).drop_duplicates().to_dict("records")
        ]
    if cells:
        features = enumerate_runs(config, dataset_registry, "cell_features")
        if len(features):
            rows += [{"rule": "prepare_cell_section", "section": s} for s in dict.fromkeys(features["section"])]
            rows += [
                {"rule": "cell_features", **r}
                for r in features[["encoder", "section"]].drop_duplicates().to_dict("records")
            ]
            runs = enumerate_runs(config, dataset_registry, "cells")
            rows += [
                {"rule": "cell_shard", **r}
                for r in runs[["encoder", "magnification", "protocol"]].drop_duplicates().to_dict("records")
            ]
    out = pd.DataFrame(rows)
    out["encoder"] = out["encoder"].fillna("") if "encoder" in out.columns else ""
    return out


def planned_units(
    config: Mapping[str, Any], dataset_registry: Mapping[str, Any], n_items: Mapping[str, int] | None = None
) -> pd.DataFrame:
    """:func:`planned_jobs` with the work of each job: ``units`` and ``unit`` (images for ``embed``, from
    ``n_items``: data set -> items, NaN where unknown; runs for the shards, from the grid; the magnifications a
    cell-feature job embeds its section at; 1 job otherwise).

    Parameters
    ----------
    config : Mapping
        A filled config.
    dataset_registry : Mapping
        Data-set name -> registry entry, as the config sees it.
    n_items : Mapping of str to int, optional
        Data set -> number of items (images or tiles) of its manifest; None, or a data set absent, leaves its
        embedding jobs' units NaN.

    Returns
    -------
    DataFrame
        The rows of :func:`planned_jobs` with ``units`` (float) and ``unit`` (``image``, ``run``,
        ``magnification`` or ``job``).
    """
    jobs = planned_jobs(config, dataset_registry)
    tables = enumerate_runs(config, dataset_registry)
    counts: dict[str, pd.Series] = {}

    def per_job(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
        return frame.astype({k: str for k in keys}).groupby(keys).size() if len(frame) else pd.Series(dtype=float)

    counts["probe_shard"] = per_job(tables["probe"], ["encoder", "task"])
    counts["ood_shard"] = per_job(
        pd.concat([tables["ood"][["encoder", "task"]], tables["ood_gate"][["encoder", "task"]]]), ["encoder", "task"]
    )
    if "ood_splits" in tables:
        counts["ood_split_shard"] = per_job(tables["ood_splits"], ["encoder", "task"])
    counts["prior_shift_shard"] = per_job(tables["prior_shift"], ["task", "encoder", "source_domain", "target_domain"])
    cells = tables["cells"]
    if len(cells):
        cells = cells.assign(magnification=[f"{float(m):g}" for m in cells["magnification"]])
    counts["cell_shard"] = per_job(cells, ["encoder", "magnification", "protocol"])
    # a cell-feature job embeds its section at every magnification: its work is its magnifications
    counts["cell_features"] = per_job(tables["cell_features"], ["encoder", "section"])
    keys = {
        "probe_shard": ["encoder", "task"],
        "ood_shard": ["encoder", "task"],
        "ood_split_shard": ["encoder", "task"],
        "prior_shift_shard": ["task", "encoder", "source_domain", "target_domain"],
        "cell_shard": ["encoder", "magnification", "protocol"],
        "cell_features": ["encoder", "section"],
    }
    units, unit = [], []
    for r in jobs.to_dict("records"):
        rule = r["rule"]
        if rule == "embed":
            units.append(float((n_items or {}).get(r["dataset"], math.nan)))
            unit.append("image")
        elif rule in counts:
            key = tuple(f"{float(r[k]):g}" if k == "magnification" else str(r[k]) for k in keys[rule])
            units.append(float(counts[rule].get(key if len(key) > 1 else key[0], 0)))
            unit.append("magnification" if rule == "cell_features" else "run")
        else:
            units.append(1.0)
            unit.append("job")
    return jobs.assign(units=units, unit=unit)


def measured_units(jobs: pd.DataFrame, planned: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(rule, job) -> units of each measured job (:func:`job_costs` rows), matched to the measured study's
    :func:`planned_units` on the rule's wildcards (the embedding key aside).

    Parameters
    ----------
    jobs : DataFrame
        Measured job costs (:func:`fmaudit.costs.job_costs`) with the rules' wildcard columns.
    planned : DataFrame
        The measured study's planned units (:func:`planned_units`).

    Returns
    -------
    dict of (str, str) to float
        (rule, job) -> units, for the measured jobs found in the plan; a job the plan does not know has no entry.
    """
    out = {}
    for rule, part in jobs.groupby("rule"):
        if rule not in BENCHMARK_PATHS:
            continue
        keys = [w for w in _wildcards(rule) if w != "key"]
        plan = planned[planned["rule"] == rule]
        if not len(plan) or any(k not in plan.columns for k in keys):
            continue
        index = {
            tuple(f"{float(v):g}" if k == "magnification" else str(v) for k, v in zip(keys, vals)): u
            for vals, u in zip(plan[keys].itertuples(index=False, name=None), plan["units"])
        }
        for r in part.to_dict("records"):
            wild = {**r, "encoder": r.get("encoder")}
            key = tuple(str(wild.get(k)) for k in keys)
            if key in index:
                out[(rule, r["job"])] = index[key]
    return out


#: Columns of :func:`estimate_cost` (a table other estimates, e.g. of cluster submissions, can extend).
ESTIMATE_COLUMNS = (
    "rule",
    "encoder",
    "jobs",
    "units",
    "unit",
    "wall_hours",
    "cpu_hours",
    "gpu_hours",
    "rate_from",
    "note",
)


def estimate_cost(
    planned: pd.DataFrame, rates: pd.DataFrame, plan: Mapping[str, Mapping[str, int]] | None = None
) -> pd.DataFrame:
    """A config's predicted cost before anything runs: per (rule, encoder) of ``planned`` (:func:`planned_units`),
    its units times the measured per-unit cost in ``rates`` (:func:`unit_costs`: the encoder's own rate where
    measured, else the rule's rate over the measured encoders, ``rate_from`` says which and ``source`` where it
    was measured). GPU-hours: the predicted wall time times the GPUs the job requests under ``plan``
    (:func:`gpu_plan`). A row whose units or rate are unknown has NaN hours and a ``note``; a ``total`` row
    closes the table.

    Parameters
    ----------
    planned : DataFrame
        The planned jobs and their units (:func:`planned_units`) of the config to estimate.
    rates : DataFrame
        Measured per-unit costs (:func:`unit_costs` or :func:`read_unit_costs`).
    plan : Mapping, optional
        The config's GPU plan (:func:`fmaudit.costs.gpu_plan`); None: no job requests a GPU.

    Returns
    -------
    DataFrame
        One row per (rule, encoder) with :data:`ESTIMATE_COLUMNS` (``encoder`` ``(no encoder)`` for a job without
        one; hours in ``wall_hours``, ``cpu_hours``, ``gpu_hours``), then a ``total`` row (whose hours sum the known
        rows when some are unknown, with a note saying so).
    """
    rows = []
    by_rule_enc = {(r.rule, r.encoder): r for r in rates.itertuples(index=False)} if len(rates) else {}
    for (rule, enc), part in planned.groupby(["rule", "encoder"], sort=True):
        rate = by_rule_enc.get((rule, enc)) or by_rule_enc.get((rule, "*"))
        units = float(part["units"].sum(min_count=len(part))) if part["units"].notna().all() else math.nan
        gpus = np.array([job_gpus(plan or {}, rule, r) for r in part.to_dict("records")], dtype=float)
        note = ""
        if rate is None:
            note = "no measured job of this rule"
        elif not np.isfinite(units):
            note = f"{int(part['units'].isna().sum())} jobs of unknown size (prepare the manifests to count images)"
        wall = units * rate.wall_s_per_unit / 3600.0 if rate is not None else math.nan
        cpu = units * rate.cpu_s_per_unit / 3600.0 if rate is not None else math.nan
        if rate is not None and np.isfinite(units):
            per_job = part["units"].to_numpy(dtype=float) * rate.wall_s_per_unit / 3600.0
            gpu = float((per_job * gpus).sum())
        else:
            gpu = math.nan if gpus.any() else 0.0
        rate_from = (
            ""
            if rate is None
            else f"the rule's mean over the measured encoders ({rate.source})"
            if rate.encoder == "*"
            else f"measured on this {'encoder' if enc else 'rule'} ({rate.source})"
        )
        rows.append(
            {
                "rule": rule,
                "encoder": enc or "(no encoder)",
                "jobs": int(len(part)),
                "units": units,
                "unit": str(part["unit"].iloc[0]),
                "wall_hours": wall,
                "cpu_hours": cpu,
                "gpu_hours": gpu,
                "rate_from": rate_from,
                "note": note,
            }
        )
    out = pd.DataFrame(rows, columns=list(ESTIMATE_COLUMNS))
    total = {
        "rule": "total",
        "encoder": "",
        "jobs": int(out["jobs"].sum()),
        "units": math.nan,
        "unit": "",
        **{
            c: float(out[c].sum(min_count=len(out))) if out[c].notna().all() else math.nan
            for c in ("wall_hours", "cpu_hours", "gpu_hours")
        },
        "rate_from": "",
        "note": ""
        if out[["wall_hours", "cpu_hours"]].notna().all().all()
        else "some rows unknown: the total counts only what is known",
    }
    if not np.isfinite(total["wall_hours"]):
        for c in ("wall_hours", "cpu_hours", "gpu_hours"):
            total[c] = float(out[c].sum())
    return pd.concat([out, pd.DataFrame([total])], ignore_index=True)


def read_unit_costs(path: PathLike) -> pd.DataFrame:
    """A table of measured per-unit costs (:func:`unit_costs`, as CSV or TSV), checked for its columns.

    Parameters
    ----------
    path : path-like
        A CSV or TSV written from :func:`unit_costs`.

    Returns
    -------
    DataFrame
        The table, ``encoder`` as strings ('' where empty).

    Raises
    ------
    FmauditInputError
        When a column of ``rule``, ``encoder``, ``wall_s_per_unit``, ``cpu_s_per_unit``, ``source`` is missing.
    """
    table = read_table(path)
    need = ["rule", "encoder", "wall_s_per_unit", "cpu_s_per_unit", "source"]
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise FmauditInputError(
            f"{path}: a table of measured per-unit costs needs the columns {', '.join(need)}; "
            f"missing {', '.join(missing)}"
        )
    table["encoder"] = table["encoder"].fillna("").astype(str)
    return table
