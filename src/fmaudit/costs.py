"""What a study cost: CPU-hours, GPU-hours, peak memory and wall time of its jobs, read from the benchmark files
Snakemake writes for every heavy job (``results/<study>/benchmarks/<rule>/<wildcards>.tsv``), and what a config
would cost, predicted from measured per-unit costs before anything runs.

A benchmark file holds one row per repeat with ``s`` (wall seconds), ``max_rss`` (MB) and ``cpu_time`` (CPU
seconds of the job's process tree, user + system), among other columns; a job's cost is the sum over its rows
(its peak memory the maximum). ``NA`` (a job too short for Snakemake to sample) counts as unknown, not 0.

GPU-hours are a job's wall time times its GPUs. Snakemake's benchmark files do not say how many GPUs a job had,
so the count is the one the workflow *requests* for the job: its ``gpu`` resource, which the rules take from
:func:`gpu_plan` (an encoder's registry entry ``gpu`` for ``embed`` and ``cell_features``, the config's
``prior_shift.scratch_reference.gpu`` for ``scratch_reference``; every other rule requests none). That is what a
cluster charges a job for, whether or not its code used the device; the embedding files' provenance records the
device a job actually ran on, and :func:`job_costs` marks a job whose recorded device disagrees with its request.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

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
    "BENCHMARK_PATHS",
    "COST_COLUMNS",
    "ESTIMATE_COLUMNS",
    "GPU_RULES",
    "benchmark_path",
    "benchmark_root",
    "cost_by",
    "embedding_devices",
    "estimate_cost",
    "find_benchmarks",
    "gpu_plan",
    "job_costs",
    "job_gpus",
    "measured_units",
    "parse_benchmark_path",
    "planned_jobs",
    "planned_units",
    "read_benchmark",
    "read_unit_costs",
    "unit_costs",
]

#: Rule -> the wildcards of its benchmark file under ``benchmarks/<rule>/`` (the rules' ``benchmark:``
#: directives; tests/test_costs.py checks every rule file against this table). A rule missing here is still
#: counted (rule and study totals), without wildcards and so without an encoder.
BENCHMARK_PATHS: dict[str, str] = {
    "prepare_manifest": "{dataset}",
    "embed": "{encoder}/{key}/{dataset}",
    "probe_shard": "{task}/{encoder}",
    "ood_shard": "{task}/{encoder}",
    "ood_split_shard": "{task}/{encoder}",
    "prior_shift_shard": "{task}/{encoder}/{source_domain}/{target_domain}",
    "scratch_reference": "{task}/{source_domain}/seed{seed}",
    "prepare_cell_section": "{section}",
    "cell_features": "{encoder}/{key}/{section}",
    "cell_shard": "{protocol}/{encoder}/{magnification}x",
}
#: Rules whose ``gpu`` resource :func:`gpu_plan` decides, and the wildcard it is decided by.
GPU_RULES = {"embed": "encoder", "cell_features": "encoder", "scratch_reference": "task"}
#: Columns of :func:`job_costs`, one row per benchmark file (wildcard columns follow them).
COST_COLUMNS = (
    "rule",
    "job",
    "encoder",
    "wall_s",
    "cpu_s",
    "max_rss_mb",
    "gpus",
    "cpu_hours",
    "gpu_hours",
    "repeats",
    "file",
)
_REQUIRED = ("s", "max_rss", "cpu_time")


def _template_regex(template: str) -> re.Pattern:
    parts = re.split(r"(\{[a-z_]+\})", template)
    out = "".join(f"(?P<{p[1:-1]}>[^/]+?)" if p.startswith("{") else re.escape(p) for p in parts if p)
    return re.compile(f"^{out}$")


_PATTERNS = {rule: _template_regex(t) for rule, t in BENCHMARK_PATHS.items()}


def parse_benchmark_path(path: PathLike, root: PathLike) -> tuple[str, str, dict[str, str]]:
    """(rule, job, wildcards) of a benchmark file below ``root`` (the study's ``benchmarks/`` folder): the rule
    is the first folder, the job the rest of the path without ``.tsv``; wildcards as :data:`BENCHMARK_PATHS`
    names them (empty for a rule it does not list, or a path that does not match its template)."""
    rel = Path(path).resolve().relative_to(Path(root).resolve())
    if len(rel.parts) < 2:
        raise FmauditInputError(f"{path}: a benchmark file lies in benchmarks/<rule>/, not directly in {root}")
    rule = rel.parts[0]
    job = str(Path(*rel.parts[1:]).with_suffix(""))
    match = _PATTERNS[rule].match(job) if rule in _PATTERNS else None
    return rule, job, (match.groupdict() if match else {})


def read_benchmark(path: PathLike) -> dict[str, float]:
    """One benchmark file as a job's totals: ``wall_s`` and ``cpu_s`` summed over its rows (repeats),
    ``max_rss_mb`` their maximum, ``repeats``; NaN where Snakemake wrote ``NA``."""
    path = Path(path)
    try:
        table = pd.read_csv(path, sep="\t", na_values=["NA", "-"])
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as err:
        raise FmauditInputError(f"{path}: not a Snakemake benchmark file ({err})") from err
    missing = [c for c in _REQUIRED if c not in table.columns]
    if missing or len(table) == 0:
        raise FmauditInputError(
            f"{path}: a Snakemake benchmark file needs the columns {', '.join(_REQUIRED)} and "
            f"a row; it has columns {', '.join(map(str, table.columns)) or 'none'} and "
            f"{len(table)} rows"
        )
    values = table[list(_REQUIRED)].apply(pd.to_numeric, errors="coerce")

    def total(col: str) -> float:
        return float(values[col].sum()) if values[col].notna().all() else math.nan

    return {
        "wall_s": total("s"),
        "cpu_s": total("cpu_time"),
        "max_rss_mb": float(values["max_rss"].max()) if values["max_rss"].notna().any() else math.nan,
        "repeats": int(len(table)),
    }


def gpu_plan(
    config: Mapping[str, Any],
    encoders: Mapping[str, Mapping[str, Any]],
    prior_shift: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, int]]:
    """GPUs each GPU-capable job requests: ``{"embed": {encoder: n}, "cell_features": {encoder: n},
    "scratch_reference": {task: n}}``. ``encoders``: the registry as the config sees it (an entry's ``gpu``);
    ``prior_shift``: task -> its ``prior_shift`` block (``scratch_reference.gpu``). The workflow's ``gpu``
    resources read this, and :func:`job_costs` charges GPU-hours by it."""
    names = list(dict.fromkeys([*config.get("encoders", []), *config.get("variants", {})]))
    per_encoder = {enc: int(bool((encoders.get(enc) or {}).get("gpu", False))) for enc in names}
    scratch = {
        task: int(bool((block.get("scratch_reference") or {}).get("gpu", False)))
        for task, block in (prior_shift or {}).items()
    }
    return {"embed": dict(per_encoder), "cell_features": dict(per_encoder), "scratch_reference": scratch}


def job_gpus(plan: Mapping[str, Mapping[str, int]], rule: str, wildcards: Mapping[str, Any]) -> int:
    """GPUs the job of ``rule`` with ``wildcards`` requests under ``plan`` (:func:`gpu_plan`); 0 for a rule that
    requests none, or a wildcard value the plan does not know."""
    if rule not in GPU_RULES or rule not in plan:
        return 0
    value = wildcards.get(GPU_RULES[rule]) if hasattr(wildcards, "get") else getattr(wildcards, GPU_RULES[rule], None)
    return int(plan[rule].get(str(value), 0))


def find_benchmarks(results: PathLike) -> list[Path]:
    """Every benchmark file of a study folder (``<results>/benchmarks/**/*.tsv``), sorted."""
    root = Path(results) / "benchmarks"
    if not root.is_dir():
        raise FmauditInputError(
            f"{root}: no benchmark folder (is {results} a study's results folder, and has the workflow run there?)"
        )
    return sorted(root.rglob("*.tsv"))


def job_costs(
    files: Sequence[PathLike],
    plan: Mapping[str, Mapping[str, int]] | None = None,
    devices: Mapping[tuple[str, str], str] | None = None,
) -> pd.DataFrame:
    """One row per benchmark file (:data:`COST_COLUMNS`, then the wildcards; each file lies under a
    ``benchmarks/<rule>/`` folder): wall and CPU seconds, peak memory,
    GPUs (:func:`job_gpus` under ``plan``; unknown, NaN, without one), CPU-hours (``cpu_s / 3600``) and GPU-hours
    (``wall_s * gpus / 3600``). ``devices``: (rule, job) -> the device its provenance records (embedding
    files): a job that requested a GPU but ran on the CPU gets ``device_mismatch``."""
    rows = []
    for f in files:
        rule, job, wildcards = parse_benchmark_path(f, benchmark_root(f))
        cost = read_benchmark(f)
        gpus = job_gpus(plan, rule, wildcards) if plan is not None else math.nan
        row = {
            "rule": rule,
            "job": job,
            "encoder": wildcards.get("encoder", ""),
            **cost,
            "gpus": gpus,
            "cpu_hours": cost["cpu_s"] / 3600.0,
            "gpu_hours": cost["wall_s"] * gpus / 3600.0,
            "file": str(f),
            **{k: v for k, v in wildcards.items() if k != "encoder"},
        }
        if devices is not None and (rule, job) in devices:
            row["device"] = devices[(rule, job)]
            row["device_mismatch"] = bool(gpus > 0) and not str(devices[(rule, job)]).startswith("cuda")
        rows.append(row)
    out = pd.DataFrame(rows)
    if len(out) == 0:
        return pd.DataFrame(columns=list(COST_COLUMNS))
    first = list(COST_COLUMNS)
    return out[first + [c for c in out.columns if c not in first]]


def cost_by(costs: pd.DataFrame, key: str) -> pd.DataFrame:
    """Costs summed per ``key`` (``rule`` or ``encoder``; jobs without an encoder under ``(no encoder)``), with a
    ``total`` row: jobs, CPU-hours, GPU-hours, wall hours (summed: the compute, not the elapsed time), the
    longest job's wall time and the largest peak memory. A sum with an unknown (NA) part is NaN."""
    columns = [key, "jobs", "cpu_hours", "gpu_hours", "wall_hours", "longest_job_s", "peak_rss_mb"]
    if len(costs) == 0:
        return pd.DataFrame(columns=columns)
    frame = costs.assign(
        **{
            key: costs[key].replace("", "(no encoder)") if key == "encoder" else costs[key],
            "wall_hours": costs["wall_s"] / 3600.0,
        }
    )

    def summarise(part: pd.DataFrame, name: str) -> dict[str, Any]:
        return {
            key: name,
            "jobs": int(len(part)),
            "cpu_hours": part["cpu_hours"].sum(min_count=1) if part["cpu_hours"].notna().all() else math.nan,
            "gpu_hours": part["gpu_hours"].sum(min_count=1) if part["gpu_hours"].notna().all() else math.nan,
            "wall_hours": part["wall_hours"].sum(min_count=1) if part["wall_hours"].notna().all() else math.nan,
            "longest_job_s": float(part["wall_s"].max()),
            "peak_rss_mb": float(part["max_rss_mb"].max()),
        }

    rows = [summarise(part, str(name)) for name, part in frame.groupby(key, sort=True)]
    rows.append(summarise(frame, "total"))
    return pd.DataFrame(rows, columns=columns)


def unit_costs(costs: pd.DataFrame, units: Mapping[tuple[str, str], float], source: str) -> pd.DataFrame:
    """Measured cost per unit of work, per (rule, encoder) and per rule over every encoder (``encoder`` ``*``):
    wall, CPU and GPU seconds per unit, where ``units[(rule, job)]`` is how many units (runs, or images for
    ``embed``) the job did. A job's start-up is spread over its units, so a grid with many more units per job
    than the measured one is predicted high. ``source`` says where the measurements come from."""
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


def benchmark_root(path: PathLike) -> Path:
    """The ``benchmarks`` folder a benchmark file lies under (its nearest ancestor of that name)."""
    path = Path(path)
    for parent in path.parents:
        if parent.name == "benchmarks":
            return parent
    raise FmauditInputError(f"{path}: not under a benchmarks/ folder (results/<study>/benchmarks/<rule>/...)")


def embedding_devices(inventory: pd.DataFrame | None) -> dict[tuple[str, str], str]:
    """(``embed``, job) -> the device an embedding file's provenance records (:func:`fmaudit.embed.embedding_inventory`
    rows: ``encoder``, ``embedding_key``, ``dataset``, ``device``)."""
    if (
        inventory is None
        or not len(inventory)
        or not {"encoder", "embedding_key", "dataset", "device"} <= set(inventory)
    ):
        return {}
    return {
        ("embed", f"{r.encoder}/{r.embedding_key}/{r.dataset}"): str(r.device)
        for r in inventory.itertuples(index=False)
        if isinstance(r.device, str) and r.device
    }


# -------------------------------------------------------------------------------------------- the estimate
def benchmark_path(rule: str, wildcards: Mapping[str, Any]) -> str:
    """The path of a job's benchmark file below ``benchmarks/`` (:data:`BENCHMARK_PATHS`; a magnification is
    written as the rules write it, ``10`` for 10.0)."""
    values = {k: (f"{float(v):g}" if k == "magnification" else str(v)) for k, v in wildcards.items()}
    return f"{rule}/{BENCHMARK_PATHS[rule].format(**values)}.tsv"


def _wildcards(rule: str) -> list[str]:
    return re.findall(r"\{([a-z_]+)\}", BENCHMARK_PATHS[rule])


def planned_jobs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any], cells: bool = True) -> pd.DataFrame:
    """Every job of the config that writes a benchmark file: ``rule``, ``encoder`` ('' for none) and its
    wildcards (those of :data:`BENCHMARK_PATHS` but the embedding ``key``), from the grid (the same functions
    the workflow plans with). ``cells=False`` leaves the cell branch out (the workflow has its own plan of it,
    built without the cell run table)."""
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
    cell-feature job embeds its section at; 1 job otherwise)."""
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
    :func:`planned_units` on the rule's wildcards (the embedding key aside)."""
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
    closes the table."""
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
    """A table of measured per-unit costs (:func:`unit_costs`, as CSV or TSV), checked for its columns."""
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
