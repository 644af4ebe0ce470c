"""The run grid: a pure function of the config.

A *run* is one probe fit and its evaluation; a *shard* is one Snakemake job that loops over a whole sub-grid
of runs in-process. The same enumeration serves the dry-run summary (``fmaudit grid``), the shard jobs and
the tests, so the counts a user sees before submitting are the runs the jobs execute.

Domains of a task come from the config (``tasks.<t>.domains``), else from the data-set registry
(``domains:`` of each data set), else the task is a single pooled domain ``"all"``: the grid never reads data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import pandas as pd

from fmaudit.io import FmauditInputError

POOLED_DOMAIN = "all"
PROBE_DEFAULTS: dict[str, Any] = {
    "heads": ["logistic"],
    "C": 1.0,
    "fractions": [1.0],
    "seeds": [0],
    "val_fraction": 0.2,
    "readout": "cls",
}
CALIBRATION_DEFAULTS: dict[str, Any] = {"ece_bins": 15, "kshot_k": [4, 8, 16, 32, 64], "kshot_draws": 25}
BOOTSTRAP_DEFAULTS: dict[str, Any] = {"n_boot": 1000, "seed": 0}


@dataclass(frozen=True)
class Shard:
    """One analysis job: everything an (analysis, encoder, task) cell needs, and nothing about other encoders."""

    analysis: str
    encoder: str
    task: str


def section(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A config section with its defaults filled in."""
    defaults = {"probe": PROBE_DEFAULTS, "calibration": CALIBRATION_DEFAULTS, "bootstrap": BOOTSTRAP_DEFAULTS}[name]
    return {**defaults, **dict(config.get(name) or {})}


def task_domains(config: Mapping[str, Any], task: str, dataset_registry: Mapping[str, Any] | None = None) -> list[str]:
    """Domains transfer runs go between, from the config or the data-set registry (see module doc)."""
    tasks = config.get("tasks") or {}
    if task not in tasks:
        raise FmauditInputError(f"unknown task {task!r}; tasks in the config: {sorted(tasks)}")
    spec = tasks[task]
    if spec.get("domains"):
        return list(spec["domains"])
    domains: list[str] = []
    for ds in spec["datasets"]:
        entry = (dataset_registry or {}).get(ds) or {}
        for d in entry.get("domains") or []:
            if d not in domains:
                domains.append(d)
    return domains or [POOLED_DOMAIN]


def probe_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None,
               encoders: Iterable[str] | None = None, tasks: Iterable[str] | None = None) -> pd.DataFrame:
    """Every probe fit of the tile-level suite: encoder × task × source domain × head × fraction × seed.

    Each fit is evaluated in-domain and, when the task has ``transfer``, on every other domain; the
    ``n_targets`` column says on how many.
    """
    probe = section(config, "probe")
    encoders = list(encoders if encoders is not None else config["encoders"])
    tasks = list(tasks if tasks is not None else config["tasks"])
    rows = []
    for task in tasks:
        domains = task_domains(config, task, dataset_registry)
        transfer = (config["tasks"][task].get("transfer", True)) and len(domains) > 1
        n_targets = len(domains) if transfer else 1
        for enc, src, head, frac, seed in itertools.product(
            encoders, domains, probe["heads"], probe["fractions"], probe["seeds"]
        ):
            rows.append({
                "analysis": "probe", "encoder": enc, "task": task, "source_domain": src, "head": head,
                "C": float(probe["C"]) if head == "logistic" else float("nan"),
                "fraction": float(frac), "seed": int(seed), "n_targets": n_targets,
            })
    df = pd.DataFrame(rows, columns=["analysis", "encoder", "task", "source_domain", "head", "C", "fraction",
                                     "seed", "n_targets"])
    df["run_id"] = [run_id(r) for r in df.itertuples(index=False)]
    return df


def run_id(row: Any) -> str:
    """A readable, unique id of a probe run within its shard."""
    c = "" if pd.isna(row.C) else f"_C{row.C:g}"
    return f"{row.source_domain}__{row.head}{c}__f{row.fraction:g}__s{row.seed}"


def shards(config: Mapping[str, Any]) -> list[Shard]:
    """The analysis jobs the workflow plans: one per (analysis, encoder, task)."""
    return [Shard("probe", enc, task) for task in config["tasks"] for enc in config["encoders"]]


def summarize(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Runs and jobs by analysis: what ``fmaudit grid`` prints."""
    runs = probe_runs(config, dataset_registry)
    n_embed = len(config["encoders"]) * len(config["datasets"])
    rows = [
        {"analysis": "embed", "protocol": "encoder x dataset", "runs": n_embed, "jobs": n_embed},
        {"analysis": "probe", "protocol": "fits (in-domain)", "runs": len(runs),
         "jobs": len(shards(config))},
        {"analysis": "probe", "protocol": "evaluations (source x target)", "runs": int(runs["n_targets"].sum()),
         "jobs": 0},
    ]
    return pd.DataFrame(rows)
