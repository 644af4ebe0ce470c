"""What a whole plan asks of the cluster (``fmaudit grid --estimate``): every job the workflow plans for a config
with its request, and their sum per rule and encoder, per rule and in total."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.cluster.gpu_classes import GpuClass, gpu_class
from fmaudit.cluster.requests import (
    FIXED_REQUESTS,
    GROUP_PATTERNS,
    JobRequest,
    RequestPlanner,
    scratch_request,
    submissions,
)
from fmaudit.config import dataset_params
from fmaudit.grid import (
    cell_plan,
    derived_datasets,
    embed_pairs,
    ood_shard_plan,
    ood_shards,
    ood_split_shards,
    parts_with,
    prior_shift_runs,
    scratch_reference_runs,
    shards,
)
from fmaudit.io import PathLike
from fmaudit.registry import embedding_key

#: The columns of :func:`estimate_table` (its rows: one per rule and encoder, then one per rule, then a total).
ESTIMATE_COLUMNS = ("rule", "encoder", "jobs", "submissions", "gpus", "cpus", "mem_mb_max", "gpu_mem_mb",
                    "gpu_class", "runtime_min_job_max", "runtime_min_submission_max", "gpu_hours", "cpu_hours",
                    "basis")



def estimate_table(jobs: Iterable[Mapping[str, Any]], components: Mapping[str, int],
                   gpu_classes: Sequence[GpuClass] = ()) -> pd.DataFrame:
    """What a plan asks of the cluster, per rule and encoder, then per rule, then in total.

    ``jobs``: one mapping per planned job: ``rule``, ``encoder`` (or ''), ``group`` (the job's group id, '' for
    an ungrouped job), ``request`` (:class:`JobRequest`) and ``threads``. ``components``: jobs per submission of
    each group pattern's groups (the profile's ``--group-components``, by the rule's group pattern). A group's
    jobs run one after another on the node (the Slurm plugin runs a group with one job at a time), so a
    submission asks for the sum of its jobs' wall times and the largest of their memory, CPUs and GPUs; its
    GPU- and CPU-hours are those times its GPUs and CPUs.

    Parameters
    ----------
    jobs : iterable of Mapping
        As described above (also ``pattern``, the group pattern, as :func:`planned_requests` gives it).
    components : Mapping of str to int
        Jobs per submission by group pattern.
    gpu_classes : sequence of GpuClass, default ()
        The site's GPU classes, for the ``gpu_class`` column.

    Returns
    -------
    DataFrame
        Columns :data:`ESTIMATE_COLUMNS`: one row per (rule, encoder), then one per rule with encoder
        ``"all encoders"``, then a ``rule="all"``, ``encoder="total (plan)"`` row. Memory in MB, run times in
        minutes, ``gpu_hours``/``cpu_hours`` in hours, ``basis`` the comma-joined bases.
    """
    frame = pd.DataFrame(list(jobs))
    if frame.empty:
        return pd.DataFrame(columns=list(ESTIMATE_COLUMNS))
    frame["mem_mb"] = [r.mem_mb for r in frame["request"]]
    frame["runtime_min"] = [r.runtime_min for r in frame["request"]]
    frame["gpus"] = [r.gpus for r in frame["request"]]
    frame["gpu_mem_mb"] = [r.gpu_mem_mb for r in frame["request"]]
    frame["basis"] = [r.basis for r in frame["request"]]
    rows = []
    for (rule, encoder), sub in frame.groupby(["rule", "encoder"], sort=False):
        size = int(components.get(str(sub["pattern"].iloc[0]), 1)) if sub["group"].iloc[0] else 1
        runtimes = sub["runtime_min"].to_numpy()
        n_sub = submissions(len(sub), size)
        # Snakemake fills submissions in DAG order; the longest a submission can be is its `size` longest jobs
        longest = float(np.sort(runtimes)[::-1][:size].sum())
        gpus, cpus = int(sub["gpus"].max()), int(sub["threads"].max())
        gpu_mem = int(sub["gpu_mem_mb"].max())
        chosen = gpu_class(gpu_mem, gpu_classes) if gpus else None
        rows.append({
            "rule": rule, "encoder": encoder, "jobs": len(sub), "submissions": n_sub, "gpus": gpus, "cpus": cpus,
            "mem_mb_max": int(sub["mem_mb"].max()), "gpu_mem_mb": gpu_mem,
            "gpu_class": (chosen.constraint or "any") if chosen is not None else "",
            "runtime_min_job_max": int(runtimes.max()), "runtime_min_submission_max": int(longest),
            "gpu_hours": gpus * runtimes.sum() / 60.0, "cpu_hours": cpus * runtimes.sum() / 60.0,
            "basis": ",".join(sorted(set(sub["basis"]))),
        })
    table = pd.DataFrame(rows, columns=list(ESTIMATE_COLUMNS))
    totals = []
    for rule, sub in table.groupby("rule", sort=False):
        totals.append(_total_row(sub, rule, "all encoders"))
    totals.append(_total_row(table, "all", "total (plan)"))
    return pd.concat([table, pd.DataFrame(totals, columns=list(ESTIMATE_COLUMNS))], ignore_index=True)


def _total_row(sub: pd.DataFrame, rule: str, encoder: str) -> dict[str, Any]:
    return {"rule": rule, "encoder": encoder, "jobs": int(sub["jobs"].sum()),
            "submissions": int(sub["submissions"].sum()), "gpus": int(sub["gpus"].max()),
            "cpus": int(sub["cpus"].max()), "mem_mb_max": int(sub["mem_mb_max"].max()),
            "gpu_mem_mb": int(sub["gpu_mem_mb"].max()), "gpu_class": "",
            "runtime_min_job_max": int(sub["runtime_min_job_max"].max()),
            "runtime_min_submission_max": int(sub["runtime_min_submission_max"].max()),
            "gpu_hours": float(sub["gpu_hours"].sum()), "cpu_hours": float(sub["cpu_hours"].sum()),
            "basis": ",".join(sorted({b for v in sub["basis"] for b in str(v).split(",") if b}))}


# ---- what a whole plan asks for (fmaudit grid --estimate) ---------------------------------------------------

@dataclass(frozen=True)
class ClusterSettings:
    """What of a Snakemake profile decides the requests: jobs per submission of each group pattern
    (``group-components``), threads per rule (``set-threads``), numeric per-rule overrides (``set-resources``)
    and the site's GPU classes (``default-resources: gpu_classes``). Read by :func:`fmaudit.profiles.read_profile`.

    Parameters
    ----------
    group_components : Mapping of str to int
        Jobs per submission by group pattern (:data:`GROUP_PATTERNS`).
    threads : Mapping of str to int
        Threads by rule.
    overrides : Mapping of str to Mapping of str to float
        Per-rule resources (``mem_mb``, ``runtime`` in minutes, ``gpu``) that replace the planned ones.
    gpu_classes : tuple of GpuClass
        The site's GPU classes.
    source : str, default "no profile"
        Where the settings were read (the profile's path), for the estimate's caption.
    """

    group_components: Mapping[str, int] = field(default_factory=dict)
    threads: Mapping[str, int] = field(default_factory=dict)
    overrides: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    gpu_classes: tuple[GpuClass, ...] = ()
    source: str = "no profile"


def _default_threads(rule: str, on_gpu: bool) -> int:
    """A rule's threads without set-threads (the rules': embed_threads in rules/common.smk, 2 for the scratch
    reference, 1 for everything else)."""
    if rule in ("embed", "cell_features"):
        return 2 if on_gpu else 1
    return 2 if rule == "scratch_reference" else 1


def _override(request: JobRequest, overrides: Mapping[str, float]) -> JobRequest:
    """A request with the profile's set-resources for its rule (memory, wall time, GPUs) applied."""
    if not overrides:
        return request
    return JobRequest(int(overrides.get("mem_mb", request.mem_mb)), int(overrides.get("runtime", request.runtime_min)),
                      int(overrides.get("gpu", request.gpus)), request.gpu_mem_mb, request.basis, request.items)


def planned_requests(config: Mapping[str, Any], encoders: Mapping[str, Mapping[str, Any]],
                     datasets: Mapping[str, Mapping[str, Any]], settings: ClusterSettings,
                     results: PathLike) -> pd.DataFrame:
    """One row per cluster job the workflow plans for ``config`` (its localrules left out), with what it asks for
    at attempt 1: ``rule``, ``encoder`` ('' for a job of no encoder), ``job`` (its wildcards), ``group`` (its
    group id, '' when not grouped), ``pattern`` (the group pattern), ``threads`` and ``request``. The same
    planner and the same job lists as the rules (rules/*_helpers.smk), read from ``results`` (the study's folder:
    its manifests and benchmark files).

    Parameters
    ----------
    config : Mapping
        The checked study config.
    encoders : Mapping of str to Mapping
        Registry entries of the config's encoders.
    datasets : Mapping of str to Mapping
        Registry entries of the config's data sets.
    settings : ClusterSettings
        The profile's groups, threads, overrides and GPU classes.
    results : str or Path
        The study's results folder.

    Returns
    -------
    DataFrame
        Columns ``rule``, ``encoder``, ``job``, ``group``, ``pattern``, ``threads`` and ``request`` (a
        :class:`JobRequest` with the profile's overrides applied).
    """
    results = Path(results)
    planner = RequestPlanner(encoders, benchmarks=results / "benchmarks", gpu_classes=settings.gpu_classes)
    rows: list[dict[str, Any]] = []

    def threads_of(rule: str, encoder: str = "") -> int:
        on_gpu = bool(encoders[encoder].get("gpu", False)) if encoder else False
        return int(settings.threads.get(rule, _default_threads(rule, on_gpu)))

    def add(rule: str, encoder: str, job: str, request: JobRequest, threads: int) -> None:
        pattern = GROUP_PATTERNS.get(rule, "")
        group = pattern.format(encoder=encoder) if pattern and encoder else ""
        rows.append({"rule": rule, "encoder": encoder, "job": job, "group": group, "pattern": pattern,
                     "threads": threads, "request": _override(request, settings.overrides.get(rule, {}))})

    def manifest(dataset: str) -> Path:
        return results / "manifests" / f"{dataset}.parquet"

    derived = derived_datasets(config)
    tile_datasets = list(dict.fromkeys(ds for _, ds in embed_pairs(config)))
    for ds in [*tile_datasets, *[d for d in derived if derived[d]["dataset"] in tile_datasets]]:
        if ds in derived:
            add("derive_manifest", "", ds, JobRequest(*FIXED_REQUESTS["derive_manifest"], 0), 1)
        elif datasets.get(ds, {}).get("kind") != "xenium_cells":
            add("prepare_manifest", "", ds, JobRequest(*FIXED_REQUESTS["prepare_manifest"], 0), 1)
    pairs = list(embed_pairs(config))
    for encoder, task in ood_shards(config):
        for cond in ood_shard_plan(config, task)["conditions"]:
            pairs += [(encoder, name) for name in cond.get("derived", [])]
    for encoder, ds in dict.fromkeys(pairs):
        source = manifest(derived[ds]["dataset"]) if ds in derived else None
        threads = threads_of("embed", encoder)
        add("embed", encoder, ds, planner.embed(encoder, manifest(ds), threads, fallback=source), threads)
    for shard in shards(config):
        add("probe_shard", shard.encoder, shard.task, planner.shard("probe_shard", shard.encoder), 1)
    for encoder, task in ood_shards(config):
        add("ood_shard", encoder, task, planner.shard("ood_shard", encoder), 1)
    for encoder, task in ood_split_shards(config):
        add("ood_split_shard", encoder, task, planner.shard("ood_split_shard", encoder), 1)
    prior = prior_shift_runs(config, datasets)
    if len(prior):
        for task, encoder, source, target in (prior[["task", "encoder", "source_domain", "target_domain"]]
                                              .astype(str).drop_duplicates().itertuples(index=False)):
            add("prior_shift_shard", encoder, f"{task}/{source}/{target}",
                planner.shard("prior_shift_shard", encoder), 1)
    scratch = scratch_reference_runs(config, datasets)
    if len(scratch):
        gpu_of = {ps["task"]: bool(ps["scratch_reference"]["gpu"]) for _, _, ps in parts_with(config, "prior_shift")}
        for task, source, seed in (scratch[["task", "source_domain", "seed"]].astype(str).drop_duplicates()
                                   .itertuples(index=False)):
            add("scratch_reference", "", f"{task}/{source}/seed{seed}", scratch_request(gpu_of[task]),
                threads_of("scratch_reference"))
    sections = {ds: list(dataset_params(config, datasets, ds).get("sections") or {})
                for ds in config["datasets"] if datasets.get(ds, {}).get("kind") == "xenium_cells"}
    plan = cell_plan(config, sections)
    if plan is not None:
        mags = [float(m) for m in plan.cells["magnifications"]]
        cells = results / "cells" / "sections"
        for section in plan.sections:
            add("prepare_cell_section", "", section, JobRequest(*FIXED_REQUESTS["prepare_cell_section"], 0), 1)
        for encoder, section in plan.feature_jobs:
            threads = threads_of("cell_features", encoder)
            add("cell_features", encoder, f"{embedding_key(encoders[encoder])}/{section}",
                planner.cell_features(encoder, cells / f"{section}.parquet", mags, threads), threads)
        for encoder, magnification, protocol in plan.shard_jobs:
            add("cell_shard", encoder, f"{protocol}/{magnification:g}x", planner.shard("cell_shard", encoder), 1)
    return pd.DataFrame(rows, columns=["rule", "encoder", "job", "group", "pattern", "threads", "request"])


def estimate(config: Mapping[str, Any], encoders: Mapping[str, Mapping[str, Any]],
             datasets: Mapping[str, Mapping[str, Any]], settings: ClusterSettings, results: PathLike) -> pd.DataFrame:
    """What ``config``'s plan asks of the cluster with a profile's ``settings`` (:func:`estimate_table` of
    :func:`planned_requests`): submissions, GPU- and CPU-hours, per rule and encoder, per rule, in total.

    Parameters
    ----------
    config : Mapping
        The checked study config.
    encoders : Mapping of str to Mapping
        Registry entries of the config's encoders.
    datasets : Mapping of str to Mapping
        Registry entries of the config's data sets.
    settings : ClusterSettings
        The profile's groups, threads, overrides and GPU classes.
    results : str or Path
        The study's results folder (manifests and benchmark files).

    Returns
    -------
    DataFrame
        As :func:`estimate_table`.
    """
    return estimate_table(planned_requests(config, encoders, datasets, settings, results).to_dict("records"),
                          settings.group_components, settings.gpu_classes)
